"""Shared EGL plumbing: error checks, attribute lists, handle conversion."""
from __future__ import annotations

from typing import Iterable

from ._errors import EGLError
from ._native import ffi, lib

EGL_FOREVER = 0xFFFFFFFFFFFFFFFF  # EGL_FOREVER_KHR (see csrc/egl_sync.h)
NO_DISPLAY = ffi.NULL


def egl_error(call: str, doing: str = "") -> EGLError:
    """The :class:`EGLError` for a call that just failed (reads ``eglGetError`` now)."""
    return EGLError(lib.eglGetError(), call, doing)


def address(handle) -> int:
    """An EGL handle (a cdata pointer) as an int, for hashing and display."""
    return int(ffi.cast("uintptr_t", handle))


def split_extensions(text) -> frozenset[str]:
    """A NULL-safe split of an extension string."""
    if text == ffi.NULL:
        return frozenset()
    return frozenset(ffi.string(text).decode().split())


def int_attribs(pairs: Iterable[tuple[int, int]]):
    """An ``EGLint`` attribute list ending in EGL_NONE."""
    flat = [value for pair in pairs for value in pair]
    return ffi.new("EGLint[]", flat + [lib.EGL_NONE])


def pointer_attribs(pairs: Iterable[tuple[int, int]]):
    """An ``EGLAttrib`` (pointer-sized) attribute list ending in EGL_NONE."""
    flat = [value for pair in pairs for value in pair]
    return ffi.new("EGLAttrib[]", flat + [lib.EGL_NONE])
