"""The few OpenGL calls eglcuda makes itself, through PyOpenGL (PyOpenGL is for GL calls only;
EGL goes through eglcuda's own bindings).

PyOpenGL picks its platform when first imported: eglcuda asks for EGL (``PYOPENGL_PLATFORM=egl``)
unless the program chose another one before.
"""
from __future__ import annotations

import os
from types import ModuleType

from ._errors import Unsupported

_module: ModuleType | None = None


def gl() -> ModuleType:
    """``OpenGL.GL``, imported for EGL contexts on first use."""
    global _module
    if _module is None:
        os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
        try:
            from OpenGL import GL
        except ImportError as exc:  # pragma: no cover - PyOpenGL is a dependency
            raise Unsupported("PyOpenGL", where="this Python", hint="pip install PyOpenGL") from exc
        _module = GL
    return _module


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
