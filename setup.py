"""Build hook: cffi's setuptools integration compiles eglcuda._native from build_ffi.py."""
from setuptools import setup

setup(cffi_modules=["build_ffi.py:ffibuilder"])
