"""Status: runs against the current package, on a machine without a GPU (the stand-in libcuda).

Does compiling the receive path's Python with Cython, unchanged (pure-Python mode), lower what
32 topics at 30 frames/s through one WaitSet cost the subscriber? The modules a frame goes
through on the subscriber's side (subscriber, waitset, connection, message, readiness,
transports/cuda_ipc, transports/views) are compiled into a copy of the package; bench/sources.py's
32-topic wait-set row then runs in alternate rounds with the package as it is and with the copy
first on PYTHONPATH (every process of the bench imports it), every library the stand-in of
tests/fakes/. Needs Cython and a C compiler.

    python research/probes/compiled_receive_probe.py [--rounds 3] [--seconds 10]
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULES = ["topics/subscriber", "topics/waitset", "topics/connection", "topics/message", "topics/readiness",
           "topics/transports/cuda_ipc", "topics/transports/views"]
_SETUP = """
from setuptools import Extension, setup
from Cython.Build import cythonize
mods = {mods!r}
setup(ext_modules=cythonize([Extension("eglcuda." + m.replace("/", "."), ["eglcuda/" + m + ".py"]) for m in mods],
                            language_level=3, quiet=True), script_args=["build_ext", "--inplace"])
"""


def compiled_copy(folder: str) -> str:
    copy = os.path.join(folder, "pkg")
    shutil.copytree(os.path.join(ROOT, "eglcuda"), os.path.join(copy, "eglcuda"),
                    ignore=shutil.ignore_patterns("__pycache__"))
    with open(os.path.join(copy, "setup_probe.py"), "w") as out:
        out.write(_SETUP.format(mods=MODULES))
    subprocess.run([sys.executable, "setup_probe.py"], cwd=copy, check=True, capture_output=True)
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    missing = [m for m in MODULES if not os.path.exists(os.path.join(copy, "eglcuda", m + suffix))]
    if missing:
        raise SystemExit(f"not compiled: {missing}")
    return copy


def fake_env(folder: str) -> dict[str, str]:
    sys.path.insert(0, os.path.join(ROOT, "tests", "fakes"))
    import build  # noqa: E402  (tests/fakes/build.py)

    egl, cuda = build.build(os.path.join(folder, "fakes"))
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "PYTHONPATH")}
    env.update(EGLCUDA_LIBEGL=str(egl), EGLCUDA_LIBCUDA=str(cuda), EGLCUDA_LIBVULKAN="/nonexistent")
    return env


def row(env: dict[str, str], seconds: float) -> float:
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "sources.py"), "--sources", "32", "--rates", "30",
                          "--variants", "waitset", "--size", "320x240:NV12", "--seconds", str(seconds), "--warmup", "2"],
                         env=env, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    line = next(line for line in out.splitlines() if line.startswith("| 32 x 30"))
    return float(re.split(r"\s*\|\s*", line)[4])  # (the waiting thread's us a frame)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[2])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="eglcuda-compiled-receive-") as folder:
        env = fake_env(folder)
        compiled = {**env, "PYTHONPATH": compiled_copy(folder)}
        for index in range(args.rounds):
            print(f"round {index + 1}: as it is {row(env, args.seconds):.1f} us a frame of the waiting thread, "
                  f"compiled {row(compiled, args.seconds):.1f}", flush=True)


if __name__ == "__main__":
    main()
