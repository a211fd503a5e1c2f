"""Build hooks: cffi's setuptools integration compiles eglcuda._native from build_ffi.py; the
per-frame stream calls are a small CPython extension, eglcuda._hotpath (csrc/hotpath.c)."""
from setuptools import Extension, setup

setup(
    cffi_modules=["build_ffi.py:ffibuilder"],
    ext_modules=[Extension("eglcuda._hotpath", ["csrc/hotpath.c"], extra_compile_args=["-O2", "-Wall"])],
)
