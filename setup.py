"""Build hooks: cffi's setuptools integration compiles the binding layer, eglcuda._bind._native,
from build_ffi.py; Cython compiles the per-frame path (eglcuda/frames/_core.pyx and
eglcuda/streams/cuda.pyx, a topic's messages in eglcuda/topics/_wire.pyx, and the resource base
eglcuda/_resource.pyx) against the same declarations in csrc/.

What the sdist carries besides the package (build_ffi.py, csrc/, the .pyx and .pxd sources, the
stubs) is listed in MANIFEST.in; `python -m build` makes the sdist and a wheel from it."""
import glob

import setuptools

if int(setuptools.__version__.split(".")[0]) < 77:  # pyproject.toml's SPDX license needs it
    raise SystemExit(f"eglcuda builds with setuptools >= 77 (this is {setuptools.__version__}): "
                     "pip install -U 'setuptools>=77'")

from Cython.Build import cythonize  # noqa: E402
from setuptools import Extension, setup  # noqa: E402

# The C declarations and the helper table's contract: a change rebuilds the extensions that
# include them (an incremental build would otherwise keep an old table layout in one of them).
HEADERS = sorted(glob.glob("csrc/*.h"))

COMPILED = [
    Extension("eglcuda._resource", ["eglcuda/_resource.pyx"], extra_compile_args=["-O2"]),
    Extension("eglcuda.frames._core", ["eglcuda/frames/_core.pyx"], include_dirs=["csrc"], depends=HEADERS,
              extra_compile_args=["-O2"]),
    Extension("eglcuda.streams.cuda", ["eglcuda/streams/cuda.pyx"], include_dirs=["csrc"], depends=HEADERS,
              extra_compile_args=["-O2"]),
    Extension("eglcuda.topics._wire", ["eglcuda/topics/_wire.pyx"], include_dirs=["csrc"], depends=HEADERS,
              extra_compile_args=["-O2"]),
    Extension("eglcuda.topics._ring", ["eglcuda/topics/_ring.pyx"], extra_compile_args=["-O2"]),
    Extension("eglcuda.topics._delivery", ["eglcuda/topics/_delivery.pyx"], extra_compile_args=["-O2"]),
]

setup(
    cffi_modules=["build_ffi.py:ffibuilder"],
    ext_modules=cythonize(COMPILED, compiler_directives={"language_level": 3, "embedsignature": True},
                          quiet=True),
)
