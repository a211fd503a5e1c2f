"""The few OpenGL calls eglcuda makes itself, and the GL error funnel: :func:`check` reads
``glGetError`` right after a call and raises :class:`GLError`.

Core GL goes through PyOpenGL (PyOpenGL is for GL calls only; EGL goes through eglcuda's own
bindings). The semaphore extensions (GL_EXT_semaphore, GL_EXT_semaphore_fd,
GL_NV_timeline_semaphore; csrc/interop_semaphore.h) go through eglcuda's own table, bound with
``eglGetProcAddress`` once the current context lists them.

PyOpenGL picks its platform when first imported: eglcuda asks for EGL (``PYOPENGL_PLATFORM=egl``)
unless the program chose another one before.
"""
from __future__ import annotations

import os
from types import ModuleType
from typing import Any, Callable

from ..errors import GLError, Unsupported
from . import loader
from ._native import ffi, lib

_module: ModuleType | None = None


def gl() -> ModuleType:
    """``OpenGL.GL``, imported for EGL contexts on first use. Raises :class:`Unsupported`, naming
    what to install, when libEGL, a desktop GL library or PyOpenGL is missing: PyOpenGL itself
    fails on those with an AttributeError or a NullFunctionError at the first call."""
    global _module
    if _module is None:
        os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
        loader.egl()  # PyOpenGL's EGL platform needs libEGL before its GL module imports
        ok, _ = loader.opengl_available()
        if not ok:  # PyOpenGL would fall back to GLES and fail at the first desktop GL call
            raise Unsupported(loader.OPENGL_LIBRARY, where="this machine", hint=loader.OPENGL_INSTALL_HINT)
        try:
            from OpenGL import GL
        except ImportError as exc:
            raise Unsupported("PyOpenGL", where="this Python", hint="pip install PyOpenGL") from exc
        except Exception as exc:  # PyOpenGL present but broken (a platform it cannot load)
            raise Unsupported("a working PyOpenGL", where="this Python",
                              hint=f"importing OpenGL.GL failed: {type(exc).__name__}: {exc}") from exc
        _module = GL
    return _module


def check(call: str, doing: str = "") -> None:
    """Raise :class:`GLError` if GL flagged an error (``glGetError``) for ``call``, just made."""
    code = int(gl().glGetError())
    if code:
        raise GLError(code, call, doing)


def clear_errors() -> None:
    """Drop the errors GL has flagged so far, so the next :func:`check` sees only new ones."""
    GL = gl()
    while GL.glGetError():
        pass


def accepted(call: Callable[[], Any]) -> bool:
    """Run a PyOpenGL call; False if GL flagged an error (PyOpenGL raises it, or glGetError has it)."""
    GL = gl()
    from OpenGL.error import GLError as PyOpenGLError  # imported after gl() has chosen the platform

    try:
        call()
    except PyOpenGLError:
        return False
    return not GL.glGetError()


def current_extensions() -> frozenset[str]:
    """The extensions of the GL context current on this thread."""
    GL = gl()
    count = int(GL.glGetIntegerv(GL.GL_NUM_EXTENSIONS))
    names = set()
    for index in range(count):
        name = GL.glGetStringi(GL.GL_EXTENSIONS, index)
        names.add(name.decode() if isinstance(name, bytes) else str(name))
    return frozenset(names)


class TextureBinding:
    """Saves the GL_TEXTURE_2D binding of the current context and puts it back (``with``)."""

    def __enter__(self) -> "TextureBinding":
        GL = gl()
        self.saved = int(GL.glGetIntegerv(GL.GL_TEXTURE_BINDING_2D))
        return self

    def __exit__(self, *exc) -> None:
        GL = gl()
        GL.glBindTexture(GL.GL_TEXTURE_2D, self.saved)


# ---- semaphores (GL_EXT_semaphore, GL_EXT_semaphore_fd, GL_NV_timeline_semaphore) -----------------

def create_timeline_semaphore() -> int:
    """A new timeline semaphore name in the current context (0 when GL made none)."""
    created = ffi.new("unsigned int *")
    lib.glCreateSemaphoresNV(1, created)
    if created[0]:
        lib.glSemaphoreParameterivNV(created[0], lib.GL_SEMAPHORE_TYPE_NV,
                                     ffi.new("int *", lib.GL_SEMAPHORE_TYPE_TIMELINE_NV))
    return int(created[0])


def import_semaphore_fd(semaphore: int, fd: int) -> None:
    """Give an opaque fd to a semaphore (GL owns it once the import succeeds; see :func:`is_semaphore`)."""
    lib.glImportSemaphoreFdEXT(semaphore, lib.GL_HANDLE_TYPE_OPAQUE_FD_EXT, fd)


def is_semaphore(semaphore: int) -> bool:
    """Whether ``semaphore`` names a semaphore (with storage) in the current context."""
    return bool(lib.glIsSemaphoreEXT(semaphore))


def wait_semaphore(semaphore: int, value: int) -> None:
    """GL commands issued next in the current context wait, on the GPU, until the timeline
    semaphore reaches ``value`` (no buffer or texture barriers)."""
    lib.glSemaphoreParameterui64vEXT(semaphore, lib.GL_TIMELINE_SEMAPHORE_VALUE_NV, ffi.new("uint64_t *", value))
    lib.glWaitSemaphoreEXT(semaphore, 0, ffi.NULL, 0, ffi.NULL, ffi.NULL)
