"""Running tests against the fake driver (tests/fakes/) in fresh interpreters.

eglcuda opens libEGL and libcuda once per process, and the test session may already have Mesa's
libEGL loaded for the EGL tier. So each test of this tier runs in a child interpreter started with
``EGLCUDA_LIBEGL`` and ``EGLCUDA_LIBCUDA`` pointing at the fake libraries:

- :func:`fake_driver_test` turns an ordinary test function into one that, in the pytest process,
  runs itself in a child (with its parametrized arguments, pickled) and fails with the child's
  traceback; in the child it is the plain function. The function must take only parametrized
  arguments (no fixtures: they would live in the wrong process).
- after the function returns, the child checks that the fake saw no driver misuse (a bad handle,
  a double free, a copy out of bounds, a frame the driver would refuse: see fake_cuda.c) unless
  the test says ``misuse_ok=True``;
- :func:`run_fake` runs a code string the same way and returns its output;
- :data:`fake` (in a child) is the fake's control panel: fault injection, call counts, live
  allocations, misuse.

Start-up: a child interpreter that imports numpy, pytest and eglcuda takes about half a second,
which over this tier's tests is most of its time. So the tests' children are forked from a
*fork server* (one interpreter per session that imported all of that, and the test modules, but
never touched a driver: eglcuda opens libEGL and libcuda at first use, so each forked child loads
the fake afresh, with its own state and its own FAKE_* settings). EGLCUDA_FAKE_FORKSERVER=0 runs
every test in a fresh interpreter instead. A child that runs past its time limit has its threads'
stacks dumped (faulthandler) and is killed.
"""
from __future__ import annotations

import base64
import ctypes
import functools
import importlib
import json
import os
import pathlib
import pickle
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from typing import Any, Callable

import eglcuda

ROOT = pathlib.Path(__file__).resolve().parents[2]
EGLCUDA_TREE = str(pathlib.Path(eglcuda.__file__).resolve().parents[1])  # where this eglcuda is imported from, for children
CHILD_FLAG = "EGLCUDA_FAKE_CHILD"
IN_CHILD = os.environ.get(CHILD_FLAG) == "1"

# Set by tests/fake/conftest.py once the libraries are built: (libfake_egl.so, libfake_cuda.so).
LIBRARIES: tuple[str, str] | None = None

# CUresult codes the tests inject.
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_INVALID_HANDLE = 400
CUDA_ERROR_ILLEGAL_ADDRESS = 700
CUDA_ERROR_LAUNCH_TIMEOUT = 702
CUDA_ERROR_UNKNOWN = 999
EGL_BAD_ALLOC = 0x3003
EGL_BAD_STREAM_KHR = 0x321B


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    if LIBRARIES is None:
        raise RuntimeError("the fake driver is not built (tests/fake/conftest.py builds it)")
    env = dict(os.environ)
    # The child imports the eglcuda this process imports (installed or the checkout's), then this
    # checkout's tests.
    env["PYTHONPATH"] = os.pathsep.join([EGLCUDA_TREE, str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.update({"EGLCUDA_LIBEGL": LIBRARIES[0], "EGLCUDA_LIBCUDA": LIBRARIES[1],
                "EGLCUDA_LIBVULKAN": "/nonexistent/libvulkan.so.1", CHILD_FLAG: "1",
                "PYTHONFAULTHANDLER": "1", "PYTHONDONTWRITEBYTECODE": "1"})
    for name in [n for n in env if n.startswith("FAKE_")]:
        del env[name]  # the fake's own settings come from the test only
    env.update(extra or {})
    return env


def _run(args: list[str], env: dict[str, str], timeout_s: float, what: str) -> str:
    try:
        result = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                                timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"{what}: the child did not finish in {timeout_s} s (a hang?)\n"
                             f"{(exc.stdout or '')[-4000:]}\n{(exc.stderr or '')[-8000:]}") from None
    if result.returncode != 0:
        raise AssertionError(f"{what} failed in the fake-driver child (exit {result.returncode}):\n"
                             f"{result.stdout[-4000:]}\n{result.stderr[-12000:]}")
    return result.stdout


def run_fake(code: str, env: dict[str, str] | None = None, timeout_s: float = 60) -> str:
    """Run ``code`` in a fresh interpreter against the fake driver; return its stdout. Fails
    (AssertionError with the child's output) on a non-zero exit or a timeout."""
    return _run(["-c", textwrap.dedent(code)], child_env(env), timeout_s, "run_fake")


def fake_driver_test(func: Callable | None = None, *, env: dict[str, str] | None = None, timeout_s: float = 60,
                     misuse_ok: bool = False):
    """Decorator: run the test in a child interpreter against the fake driver (see the module notes).
    ``env``: extra environment for the child (FAKE_* settings of the fake, see fake_egl.c)."""
    def decorate(test: Callable) -> Callable:
        test.__fake_misuse_ok__ = misuse_ok
        if IN_CHILD:
            return test

        @functools.wraps(test)
        def in_child(**kwargs: Any) -> None:
            what = f"{test.__name__}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
            payload = base64.b64encode(pickle.dumps(kwargs)).decode()
            extra = dict(env or {})
            extra.update({"EGLCUDA_FAKE_CASE": f"{test.__module__}:{test.__name__}", "EGLCUDA_FAKE_ARGS": payload})
            if os.environ.get("EGLCUDA_FAKE_FORKSERVER", "1") != "0":
                rc, out, err = _fork_server().run(extra, timeout_s)
                if rc != 0:
                    raise AssertionError(f"{what} failed in the fake-driver child (exit {rc}):\n{out[-4000:]}\n"
                                         f"{err[-12000:]}")
                return
            _run(["-c", "from tests.fake.harness import child_main; child_main()"], child_env(extra), timeout_s, what)

        return in_child

    return decorate(func) if func is not None else decorate


def child_main() -> None:
    """Entry point of a test's child: run the test, then check the fake saw no misuse."""
    module_name, name = os.environ["EGLCUDA_FAKE_CASE"].split(":")
    kwargs = pickle.loads(base64.b64decode(os.environ["EGLCUDA_FAKE_ARGS"]))
    test = getattr(importlib.import_module(module_name), name)
    test(**kwargs)
    if not getattr(test, "__fake_misuse_ok__", False):
        count, first, last = fake.misuse()
        assert count == 0, f"the fake driver saw {count} misuse(s) by eglcuda: first {first!r}, last {last!r}"


# ---- the fork server ------------------------------------------------------------------------------

class ForkServer:
    """The pytest process's end: one request (a test's environment) per line to the server's stdin,
    one answer (exit status, output) per line back."""

    def __init__(self) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", "from tests.fake.harness import serve; serve()"],
                                        cwd=ROOT, env=child_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)

    def run(self, extra: dict[str, str], timeout_s: float) -> tuple[int, str, str]:
        if self.process.poll() is not None:
            raise AssertionError(f"the fork server exited ({self.process.returncode})")
        self.process.stdin.write(json.dumps({"env": extra, "timeout_s": timeout_s}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise AssertionError(f"the fork server died (exit {self.process.wait()})")
        answer = json.loads(line)
        return answer["rc"], answer["out"], answer["err"]

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                self.process.kill()


_server: ForkServer | None = None


def _fork_server() -> ForkServer:
    global _server
    if _server is None:
        _server = ForkServer()
    return _server


def stop_fork_server() -> None:
    global _server
    if _server is not None:
        _server.close()
        _server = None


def serve() -> None:
    """The fork server: import what every test needs (never opening a driver), then fork a child per
    request. The child runs :func:`child_main` with its output in files, under a time limit."""
    import faulthandler

    import numpy  # noqa: F401
    import pytest  # noqa: F401

    import eglcuda  # noqa: F401
    from eglcuda._bind import loader

    for path in sorted(pathlib.Path(__file__).parent.glob("test_*.py")):
        importlib.import_module(f"tests.fake.{path.stem}")
    assert loader._egl.handle is None and loader._cuda.handle is None, "the fork server opened a driver"
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints of the server go to stderr, not into the replies
    for line in sys.stdin:
        request = json.loads(line)
        with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    os.dup2(out.fileno(), 1)
                    os.dup2(err.fileno(), 2)
                    os.environ.update(request["env"])
                    faulthandler.enable()
                    faulthandler.dump_traceback_later(request["timeout_s"], exit=True)
                    child_main()
                    code = 0
                except BaseException:
                    import traceback

                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            deadline = time.monotonic() + request["timeout_s"] + 10
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    rc = os.waitstatus_to_exitcode(status)
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    rc = -9
                    break
                time.sleep(0.002)
            out.seek(0)
            err.seek(0)
            replies.write(json.dumps({"rc": rc, "out": out.read(), "err": err.read()}) + "\n")
            replies.flush()


class FakeDriver:
    """The fake's test controls (exported C functions, see fake_egl.c and fake_cuda.c), reached with
    ctypes in a child. Loading the same files eglcuda loads gives the same instance."""

    def __init__(self) -> None:
        self._egl = self._cuda = None

    def _libs(self):
        if self._egl is None:
            egl = ctypes.CDLL(os.environ["EGLCUDA_LIBEGL"])
            cuda = ctypes.CDLL(os.environ["EGLCUDA_LIBCUDA"])
            egl.fake_fail.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
            egl.fake_calls.argtypes = [ctypes.c_char_p]
            egl.fake_calls.restype = ctypes.c_ulonglong
            egl.fake_misuse_first.restype = egl.fake_misuse_last.restype = ctypes.c_char_p
            egl.fake_egl_count.argtypes = cuda.fake_cuda_count.argtypes = [ctypes.c_char_p]
            egl.fake_egl_count.restype = cuda.fake_cuda_count.restype = ctypes.c_long
            cuda.fake_live_allocations.restype = ctypes.c_long
            self._egl, self._cuda = egl, cuda
        return self._egl, self._cuda

    def fail(self, name: str, code: int, nth: int = 1) -> None:
        """The ``nth`` next call of ``name`` fails with ``code`` (nth 0: every call until reset)."""
        assert self._libs()[0].fake_fail(name.encode(), nth, code) == 0, name

    def disarm(self, name: str) -> None:
        self._libs()[0].fake_fail(name.encode(), -1, 0)

    def calls(self, name: str) -> int:
        return int(self._libs()[0].fake_calls(name.encode()))

    def reset(self) -> None:
        """Disarm every fault, zero the call counts and the misuse log."""
        self._libs()[0].fake_reset()

    def misuse(self) -> tuple[int, str, str]:
        egl = self._libs()[0]
        return (egl.fake_misuse_count(), (egl.fake_misuse_first() or b"").decode(),
                (egl.fake_misuse_last() or b"").decode())

    def live_allocations(self) -> int:
        """Device, pinned and managed allocations and CUDA arrays not freed."""
        return int(self._libs()[1].fake_live_allocations())

    def count(self, what: str) -> int:
        """A count of live driver objects: EGL side "streams", "stream_handles", "connections",
        "frames", "held", "terminated_handles"; CUDA side "device_allocations",
        "host_allocations", "managed_allocations", "arrays", "cuda_streams", "events",
        "retained", "used_bytes"."""
        egl, cuda = self._libs()
        value = egl.fake_egl_count(what.encode())
        if value < 0:
            value = cuda.fake_cuda_count(what.encode())
        assert value >= 0, f"the fake counts no {what!r}"
        return int(value)

    def objects(self) -> dict[str, int]:
        """Every count at once (for leak checks)."""
        names = ["streams", "stream_handles", "connections", "frames", "held", "device_allocations",
                 "host_allocations", "managed_allocations", "arrays", "cuda_streams", "events"]
        return {name: self.count(name) for name in names}


fake = FakeDriver()
