"""The per-frame helper table (csrc/hot_api.h) for the Cython stream endpoints."""
from __future__ import annotations

from ._native import ffi, lib


def table_address() -> int:
    """The address of the table of per-frame helpers compiled into the cffi module."""
    return int(ffi.cast("uintptr_t", lib.eglcuda_hot_api()))
