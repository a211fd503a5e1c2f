"""Headless OpenGL contexts on an EGL display.

Made for PyOpenGL with ``PYOPENGL_PLATFORM=egl``: once a context is current, PyOpenGL's GL calls
go to it, since both load the same ``libEGL.so.1`` and GL dispatch follows the thread's current
context.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Iterator

from ._bind import egl
from ._bind.egl import egl_error
from ._integers import as_int, check_flag
from ._resource import Resource
from .display import Display, check_display
from .errors import ClosedError, UsageError

_APIS = {"opengl": (egl.OPENGL_API, egl.OPENGL_BIT), "gles": (egl.OPENGL_ES_API, egl.OPENGL_ES3_BIT)}
_PROFILES = {
    "core": egl.CONTEXT_OPENGL_CORE_PROFILE_BIT,
    "compatibility": egl.CONTEXT_OPENGL_COMPATIBILITY_PROFILE_BIT,
}


_EGLINT_MAX = 2**31 - 1


def _egl_ints(value: object, least: int) -> tuple[int, int] | None:
    """``value`` as a pair of plain ints in ``least``..EGLint's largest (NumPy's integers taken;
    bools, floats and strings not), or None."""
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        return None
    first, second = as_int(value[0]), as_int(value[1])
    if first is None or second is None or not (least <= first <= _EGLINT_MAX and least <= second <= _EGLINT_MAX):
        return None
    return first, second


# Called with a context's address once it is destroyed: upper layers that keep per-context GL
# objects (the syncs layer's imported semaphores) register here, so this module needs none of them.
_destroy_hooks: list[Callable[[int], None]] = []


def on_context_destroyed(hook: Callable[[int], None]) -> None:
    """Call ``hook(context_address)`` after every GL context eglcuda destroys."""
    _destroy_hooks.append(hook)


def _destroy(display_address: int, context_address: int, surface_address: int) -> None:
    """Release (if current here) and destroy the context and its pbuffer. Never raises."""
    try:
        if egl.current_context() == context_address:
            egl.make_current(display_address, 0, 0, 0)
        if surface_address:
            egl.destroy_surface(display_address, surface_address)
        egl.destroy_context(display_address, context_address)
        for hook in _destroy_hooks:
            hook(context_address)  # GL deleted its objects with the context
    except Exception:  # pragma: no cover - finalizers must not raise
        pass


class GLContext(Resource):
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

    ``with context:`` makes it current and closes it at the end. Closing it (or its display)
    closes what was made in it (images) first, then releases it if current here and destroys it.
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
        check_display(display, "GLContext")
        if not isinstance(api, str) or api not in _APIS:
            raise UsageError(f"api must be one of {sorted(_APIS)}, got {api!r}")
        if profile is not None and (not isinstance(profile, str) or profile not in _PROFILES or api != "opengl"
                                    or version is None):
            raise UsageError("profile is 'core' or 'compatibility', for api='opengl' with a version")
        # (Checked before any EGL call: a value the driver's EGLint cannot hold raised a bare
        # TypeError or OverflowError, after the context was made for a pbuffer's size.)
        if version is not None:
            checked = _egl_ints(version, 0)
            if checked is None:
                raise UsageError(f"version is (major, minor), got {version!r}")
            version = checked
        size = _egl_ints(pbuffer_size, 1)
        if size is None:
            raise UsageError(f"pbuffer_size is (width, height) >= 1, got {pbuffer_size!r}")
        pbuffer_size = size
        if surface_type is not None:
            bits = as_int(surface_type)
            if bits is None or not 0 < bits <= _EGLINT_MAX:
                raise UsageError(f"surface_type is EGL_SURFACE_TYPE bits (an int), got {surface_type!r}")
            surface_type = bits
        if surfaceless is not None:
            surfaceless = check_flag(surfaceless, "surfaceless (or None: the display decides)")
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

        wanted = [
            (egl.SURFACE_TYPE, egl.PBUFFER_BIT if surface_type is None else surface_type),
            (egl.RENDERABLE_TYPE, renderable),
            (egl.RED_SIZE, 8),
            (egl.GREEN_SIZE, 8),
            (egl.BLUE_SIZE, 8),
            (egl.ALPHA_SIZE, 8),
        ]
        config = egl.choose_config(dpy, wanted, f"choosing an RGBA8 {api} config on {display.description}")
        if config is None:
            raise UsageError(f"{display.description} has no RGBA8 pbuffer config for {api}")
        self.config: int = config  # the EGLConfig, as an address
        if not egl.bind_api(api_enum):
            raise egl_error("eglBindAPI", f"binding the {api} API")
        attribs = []
        if version is not None:
            attribs += [(egl.CONTEXT_MAJOR_VERSION, version[0]), (egl.CONTEXT_MINOR_VERSION, version[1])]
        if profile is not None:
            attribs.append((egl.CONTEXT_OPENGL_PROFILE_MASK, _PROFILES[profile]))
        context = egl.create_context(dpy, config, attribs, f"creating an {api} {version or ''} context")
        surface = 0
        if not self.surfaceless:
            try:
                surface = egl.create_pbuffer_surface(dpy, config, pbuffer_size[0], pbuffer_size[1],
                                                     "creating the context's pbuffer")
            except BaseException:
                egl.destroy_context(dpy, context)
                raise
        self._context_address = context
        self._surface_address = surface
        self._own(_destroy, dpy, context, surface, parent=display)

    @property
    def handle(self) -> int:
        """The raw ``EGLContext``, as an address."""
        if self.closed:
            raise ClosedError("the GL context is closed (or its display is)")
        return self._context_address

    @property
    def is_current(self) -> bool:
        """Whether this context is current on the calling thread."""
        return not self.closed and egl.current_context() == self._context_address

    def make_current(self) -> None:
        """Make this context current on the calling thread."""
        context = self.handle
        egl.bind_api(_APIS[self.api][0])
        if not egl.make_current(self.display.handle, self._surface_address, self._surface_address, context):
            raise egl_error("eglMakeCurrent", "making the GL context current")

    def release(self) -> None:
        """Make no context current on the calling thread (if this one is)."""
        if self.is_current:
            if not egl.make_current(self.display.handle, 0, 0, 0):
                raise egl_error("eglMakeCurrent", "releasing the GL context")

    @contextlib.contextmanager
    def current(self) -> Iterator["GLContext"]:
        """Make the context current for a ``with`` block, then restore what was current."""
        previous = egl.current()
        self.make_current()
        try:
            yield self
        finally:
            if previous[0]:
                egl.make_current(*previous)
            elif not self.closed:
                egl.make_current(self.display.handle, 0, 0, 0)

    def __enter__(self) -> "GLContext":
        self.make_current()
        return self

    def __repr__(self) -> str:
        kind = "surfaceless" if self.surfaceless else "pbuffer"
        return f"<GLContext {self.api} {kind}{' closed' if self.closed else ''} on {self.display.description}>"
