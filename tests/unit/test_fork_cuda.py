"""A child forked after its parent initialized CUDA cannot use the driver: eglcuda says so, with
what to do instead, before any driver call (and names it in any CUDA error such a child still
meets); a child forked before the parent touched CUDA uses it as usual. Under the fake libcuda
(tests/fakes/driver/), which would not refuse the child on its own, so the refusal is eglcuda's."""
from __future__ import annotations

import pathlib
import subprocess
import sys


ROOT = pathlib.Path(__file__).resolve().parents[2]


def python(env, code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.splitlines()


CHILD = """
import os, sys
import eglcuda
from eglcuda import Frame, UsageError
from eglcuda._bind import cuda

def in_child(body):
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        try:
            body()
        except BaseException as exc:
            print("child raised", type(exc).__name__, exc)
        sys.stdout.flush()
        os._exit(0)
    os.waitpid(pid, 0)
"""


def test_a_child_forked_after_cuda_was_used_is_told_why_and_what_to_do(fake_env):
    out = python(fake_env, CHILD + """
frame = Frame.allocate(64, 48)
def body():
    for name, call in (("get_device", lambda: eglcuda.get_device(0)),
                       ("allocate", lambda: Frame.allocate(64, 48)),
                       ("driver_version", eglcuda.driver_version)):
        try:
            call()
            print(name, "worked")
        except UsageError as exc:
            print(name, "UsageError", "forked" in str(exc) and "'spawn'" in str(exc))
    print("frame closed", frame.closed)
    print("a driver error names it", "forked" in str(cuda.cuda_error(999, "cuCtxSynchronize")))
in_child(body)
again = Frame.allocate(64, 48)
print("parent allocates", not again.closed, "and names nothing", "forked" not in str(cuda.cuda_error(999, "cuX")))
""")
    assert out == ["get_device UsageError True", "allocate UsageError True", "driver_version UsageError True",
                   "frame closed True", "a driver error names it True",
                   "parent allocates True and names nothing True"]


def test_a_child_forked_before_cuda_was_used_uses_it(fake_env):
    out = python(fake_env, CHILD + """
def body():
    frame = Frame.allocate(64, 48)
    print("child allocates", frame.width, frame.height, not frame.closed)
in_child(body)
print("parent initialized", cuda.initialized())
""")
    assert out == ["child allocates 64 48 True", "parent initialized False"]
