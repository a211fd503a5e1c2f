"""Build the C fakes of driver/ (see tests/fakes/README.md): the one fake libcuda, fake_cuda.c,
over one of the two EGL-side libraries that hold the lock, the faults and the stream model.

    python3 tests/fakes/build.py OUT_DIR [--asan]

prints the two paths of :func:`build` (libfake_egl.so, libfake_cuda.so); point eglcuda at them
with EGLCUDA_LIBEGL and EGLCUDA_LIBCUDA (see eglcuda/_bind/loader.py). libfake_cuda.so needs
libfake_egl.so and finds it next to itself (rpath $ORIGIN), so one process always has one copy of
the fake's state, whichever library eglcuda opens first. :func:`build_libcuda` adds the name
libcuda.so.1 for tests that put the folder on LD_LIBRARY_PATH; :func:`build_cross_process` builds
the same fake_cuda.c over fake_egl_shared.c for bench/c/cross_gpu.c.
"""
from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
DRIVER = HERE / "driver"
SOURCES = ("fake_common.h", "fake_egl.c", "fake_cuda.c")
FLAGS = ["-std=gnu11", "-O1", "-g", "-fPIC", "-shared", "-pthread", "-Wall", "-Wextra", "-Werror",
         "-fvisibility=hidden", "-Wl,-Bsymbolic", "-Wl,-z,defs"]


class BuildError(RuntimeError):
    pass


def compiler() -> str | None:
    return shutil.which("gcc") or shutil.which("cc")


def build(out_dir: str | pathlib.Path, asan: bool = False) -> tuple[pathlib.Path, pathlib.Path]:
    """Compile both libraries into ``out_dir``; returns (libfake_egl.so, libfake_cuda.so)."""
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler (gcc or cc) on PATH")
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    flags = FLAGS + (["-fsanitize=address", "-fno-omit-frame-pointer"] if asan else [])
    egl, cuda = out / "libfake_egl.so", out / "libfake_cuda.so"
    steps = [
        [cc, *flags, "-Wl,-soname,libfake_egl.so", "-o", str(egl), str(DRIVER / "fake_egl.c")],
        [cc, *flags, "-Wl,-soname,libfake_cuda.so", "-o", str(cuda), str(DRIVER / "fake_cuda.c"),
         f"-L{out}", "-lfake_egl", "-Wl,-rpath,$ORIGIN"],
    ]
    for step in steps:
        result = subprocess.run(step, capture_output=True, text=True)
        if result.returncode:
            raise BuildError(f"{' '.join(step)}\n{result.stdout}{result.stderr}")
    return egl, cuda


def build_libcuda(out_dir: str | pathlib.Path, asan: bool = False) -> pathlib.Path:
    """:func:`build`, plus ``out_dir``/libcuda.so.1 (a link to libfake_cuda.so) for the tests that
    load the fake as the system's libcuda: put ``out_dir`` on LD_LIBRARY_PATH (their children then
    load it too, by its usual name). Returns the libcuda.so.1 path."""
    _, cuda = build(out_dir, asan=asan)
    link = cuda.parent / "libcuda.so.1"
    if not link.is_symlink():
        link.symlink_to(cuda.name)
    return link


def build_cross_process(out_dir: str | pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """The fake for bench/c/cross_gpu.c: ``out_dir``/libEGL.so.1 from driver/fake_egl_shared.c
    (EGLStreams and device memory shared by the processes of one fork tree) and
    ``out_dir``/libcuda.so.1, the same fake_cuda.c built against it. Put ``out_dir`` on
    LD_LIBRARY_PATH. Returns (libEGL.so.1, libcuda.so.1)."""
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler (gcc or cc) on PATH")
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    egl, cuda = out / "libEGL.so.1", out / "libcuda.so.1"
    steps = [
        [cc, *FLAGS, "-Wl,-soname,libEGL.so.1", "-o", str(egl), str(DRIVER / "fake_egl_shared.c")],
        [cc, *FLAGS, "-Wl,-soname,libcuda.so.1", "-o", str(cuda), str(DRIVER / "fake_cuda.c"),
         f"-L{out}", "-l:libEGL.so.1", "-Wl,-rpath,$ORIGIN"],
    ]
    for step in steps:
        result = subprocess.run(step, capture_output=True, text=True)
        if result.returncode:
            raise BuildError(f"{' '.join(step)}\n{result.stdout}{result.stderr}")
    return egl, cuda


def build_resolver(out_dir: str | pathlib.Path) -> pathlib.Path:
    """``out_dir``/libfake_resolver.so from resolver/resolver.c: a getaddrinfo that answers two
    made-up names (a slow one, one with an IPv6 address first), for LD_PRELOAD. Returns its path."""
    cc = compiler()
    if cc is None:
        raise BuildError("no C compiler (gcc or cc) on PATH")
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    library = out / "libfake_resolver.so"
    step = [cc, "-std=gnu11", "-O1", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror", "-o", str(library),
            str(HERE / "resolver" / "resolver.c"), "-ldl"]
    result = subprocess.run(step, capture_output=True, text=True)
    if result.returncode:
        raise BuildError(f"{' '.join(step)}\n{result.stdout}{result.stderr}")
    return library


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for path in build(sys.argv[1], asan="--asan" in sys.argv[2:]):
        print(path)
