"""Headless OpenGL contexts on an EGL display.

Made for PyOpenGL with ``PYOPENGL_PLATFORM=egl``: once a context is current, PyOpenGL's GL calls
go to it, since both load the same ``libEGL.so.1`` and GL dispatch follows the thread's current
context.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Iterator

from . import _timeline
from ._display import Display
from ._egl import address, egl_error, int_attribs
from ._errors import ClosedError, UsageError
from ._native import ffi, lib

_APIS = {"opengl": (lib.EGL_OPENGL_API, lib.EGL_OPENGL_BIT), "gles": (lib.EGL_OPENGL_ES_API, lib.EGL_OPENGL_ES3_BIT)}
_PROFILES = {
    "core": lib.EGL_CONTEXT_OPENGL_CORE_PROFILE_BIT,
    "compatibility": lib.EGL_CONTEXT_OPENGL_COMPATIBILITY_PROFILE_BIT,
}


def _destroy(display_address: int, context_address: int, surface_address: int) -> None:
    """Release (if current here) and destroy the context and its pbuffer. Never raises."""
    try:
        dpy = ffi.cast("EGLDisplay", display_address)
        ctx = ffi.cast("EGLContext", context_address)
        if address(lib.eglGetCurrentContext()) == context_address:
            lib.eglMakeCurrent(dpy, ffi.NULL, ffi.NULL, ffi.NULL)
        if surface_address:
            lib.eglDestroySurface(dpy, ffi.cast("EGLSurface", surface_address))
        lib.eglDestroyContext(dpy, ctx)
        _timeline.forget_context(context_address)  # GL deletes its semaphores with the context
    except Exception:  # pragma: no cover - finalizers must not raise
        pass


class GLContext:
    """An OpenGL (or OpenGL ES) context with no window.

    Surfaceless (``EGL_KHR_surfaceless_context``) where the display allows it, otherwise bound to a
    small pbuffer. Make it current on a thread with :meth:`make_current` or ``with ctx.current():``.

    :param display: the display to create it on; the context keeps it alive.
    :param api: ``"opengl"`` (desktop GL) or ``"gles"``.
    :param version: ``(major, minor)`` to ask for, or None for the driver's default.
    :param profile: ``"core"`` or ``"compatibility"`` (desktop GL with a version only).
    :param surfaceless: force (True) or forbid (False) a surfaceless context; None picks.
    :param pbuffer_size: (width, height) in pixels of the pbuffer when one is used.
    :param surface_type: ``EGL_SURFACE_TYPE`` bits the config must support instead of pbuffers
        (eglcuda's GL stream producer asks for ``EGL_STREAM_BIT_KHR``); the context is then
        surfaceless until made current on such a surface.
    """

    def __init__(
        self,
        display: Display,
        api: str = "opengl",
        version: tuple[int, int] | None = None,
        profile: str | None = None,
        surfaceless: bool | None = None,
        pbuffer_size: tuple[int, int] = (16, 16),
        surface_type: int | None = None,
    ) -> None:
        if api not in _APIS:
            raise UsageError(f"api must be one of {sorted(_APIS)}, got {api!r}")
        if profile is not None and (profile not in _PROFILES or api != "opengl" or version is None):
            raise UsageError("profile is 'core' or 'compatibility', for api='opengl' with a version")
        if version is not None and (len(version) != 2 or not all(isinstance(v, int) and v >= 0 for v in version)):
            raise UsageError(f"version is (major, minor), got {version!r}")
        if len(pbuffer_size) != 2 or min(pbuffer_size) < 1:
            raise UsageError(f"pbuffer_size is (width, height) >= 1, got {pbuffer_size!r}")
        can_surfaceless = display.supports("EGL_KHR_surfaceless_context")
        if surface_type is not None:  # a config for other surfaces (a stream's): no pbuffer of its own
            surfaceless = True
        if surfaceless and not can_surfaceless:
            display.require("EGL_KHR_surfaceless_context")
        self.surfaceless = can_surfaceless if surfaceless is None else surfaceless
        self.display = display
        self.api = api
        api_enum, renderable = _APIS[api]
        dpy = display.handle

        config = ffi.new("EGLConfig *")
        count = ffi.new("EGLint *")
        wanted = int_attribs(
            [
                (lib.EGL_SURFACE_TYPE, lib.EGL_PBUFFER_BIT if surface_type is None else surface_type),
                (lib.EGL_RENDERABLE_TYPE, renderable),
                (lib.EGL_RED_SIZE, 8),
                (lib.EGL_GREEN_SIZE, 8),
                (lib.EGL_BLUE_SIZE, 8),
                (lib.EGL_ALPHA_SIZE, 8),
            ]
        )
        if not lib.eglChooseConfig(dpy, wanted, config, 1, count):
            raise egl_error("eglChooseConfig", f"choosing an RGBA8 {api} config on {display.description}")
        if count[0] < 1:
            raise UsageError(f"{display.description} has no RGBA8 pbuffer config for {api}")
        self.config = config[0]
        if not lib.eglBindAPI(api_enum):
            raise egl_error("eglBindAPI", f"binding the {api} API")
        attribs = []
        if version is not None:
            attribs += [(lib.EGL_CONTEXT_MAJOR_VERSION, version[0]), (lib.EGL_CONTEXT_MINOR_VERSION, version[1])]
        if profile is not None:
            attribs.append((lib.EGL_CONTEXT_OPENGL_PROFILE_MASK, _PROFILES[profile]))
        context = lib.eglCreateContext(dpy, self.config, ffi.NULL, int_attribs(attribs))
        if context == ffi.NULL:
            raise egl_error("eglCreateContext", f"creating an {api} {version or ''} context")
        surface = ffi.NULL
        if not self.surfaceless:
            size = int_attribs([(lib.EGL_WIDTH, pbuffer_size[0]), (lib.EGL_HEIGHT, pbuffer_size[1])])
            surface = lib.eglCreatePbufferSurface(dpy, self.config, size)
            if surface == ffi.NULL:
                error = egl_error("eglCreatePbufferSurface", "creating the context's pbuffer")
                lib.eglDestroyContext(dpy, context)
                raise error
        self._context_address = address(context)
        self._surface_address = address(surface)
        self._finalizer = weakref.finalize(self, _destroy, address(dpy), self._context_address, self._surface_address)
        display._adopt(self)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive or self.display.closed

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedError("the GL context is closed (or its display is)")

    @property
    def handle(self):
        """The raw ``EGLContext``."""
        self._check_open()
        return ffi.cast("EGLContext", self._context_address)

    @property
    def is_current(self) -> bool:
        """Whether this context is current on the calling thread."""
        return not self.closed and address(lib.eglGetCurrentContext()) == self._context_address

    def make_current(self) -> None:
        """Make this context current on the calling thread."""
        self._check_open()
        surface = ffi.cast("EGLSurface", self._surface_address)
        lib.eglBindAPI(_APIS[self.api][0])
        if not lib.eglMakeCurrent(self.display.handle, surface, surface, self.handle):
            raise egl_error("eglMakeCurrent", "making the GL context current")

    def release(self) -> None:
        """Make no context current on the calling thread (if this one is)."""
        if self.is_current:
            if not lib.eglMakeCurrent(self.display.handle, ffi.NULL, ffi.NULL, ffi.NULL):
                raise egl_error("eglMakeCurrent", "releasing the GL context")

    @contextlib.contextmanager
    def current(self) -> Iterator["GLContext"]:
        """Make the context current for a ``with`` block, then restore what was current."""
        previous = (lib.eglGetCurrentDisplay(), lib.eglGetCurrentSurface(lib.EGL_DRAW),
                    lib.eglGetCurrentSurface(lib.EGL_READ), lib.eglGetCurrentContext())
        self.make_current()
        try:
            yield self
        finally:
            if previous[0] != ffi.NULL:
                lib.eglMakeCurrent(*previous)
            elif not self.closed:
                lib.eglMakeCurrent(self.display.handle, ffi.NULL, ffi.NULL, ffi.NULL)

    def close(self) -> None:
        """Destroy the context (releasing it first if current here). Safe to call twice."""
        self._finalizer()

    def __enter__(self) -> "GLContext":
        self.make_current()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        kind = "surfaceless" if self.surfaceless else "pbuffer"
        return f"<GLContext {self.api} {kind}{' closed' if self.closed else ''} on {self.display.description}>"
