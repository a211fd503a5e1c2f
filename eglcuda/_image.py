"""EGLImage from a GL texture, and its CUDA view (section 4.2 of NVIDIA's EGL interop guide).

Two ways to reach an EGLImage's texels from CUDA, and eglcuda never hands back one that does not
alias the texture:

- ``native``: ``cuGraphicsEGLRegisterImage`` + ``cuGraphicsResourceGetMappedEglFrame``, the guide's
  path, made for Tegra. On discrete GPUs the driver may accept the registration and still give an
  array that is not the texture's memory (measured on an H100, driver 580: CUDA read other bytes
  than GL's texels, and CUDA's writes never reached GL).
- ``gl-interop``: the image's source texture mapped through CUDA-GL interop
  (``cuGraphicsGLRegisterImage``), which aliases both ways on discrete GPUs. It is the source
  texture, not a second texture bound to the image with ``glEGLImageTargetTexture2DOES``: on the
  H100 (driver 580) such a sibling gets the image's texels when bound and then neither GL's nor
  CUDA's later writes cross between the two (see :func:`siblings_alias`).

Which one is used is decided per display and CUDA device by a one-time self-test of each path: a
texture of random texels is read through the CUDA view, random bytes written through it are read
back in GL. A path is used only where both directions agree (``path="auto"`` takes the native one
first); forcing a path whose test failed raises :class:`NotCoherent`.

Synchronization follows the guide: GL work on the texture must be finished before CUDA touches the
image and CUDA work finished before GL uses it again. :meth:`CudaImage.map` finishes GL work first
and :meth:`MappedImage.unmap` finishes the CUDA stream's work (the native path) or unmaps, which
orders CUDA before later GL work (the GL-interop path).
"""
from __future__ import annotations

import dataclasses
import threading
import weakref
from typing import Any, NamedTuple

import numpy as np

from ._context import GLContext
from ._cuda import CudaDevice, check, cuda_error, get_device
from ._display import Display
from ._egl import address, egl_error, int_attribs
from ._errors import ClosedError, EglCudaError, NotCoherent, Unsupported, UsageError
from ._formats import ColorFormat, Layout
from ._frame import _copy_2d
from ._gl import TextureBinding, current_extensions, gl
from ._interop import stream_handle
from ._loader import bind_egl_extensions, require_cuda_entry
from ._native import ffi, lib

NATIVE = "native"
GL_INTEROP = "gl-interop"
PATHS = (NATIVE, GL_INTEROP)


class TextureFormat(NamedTuple):
    """A GL internal format eglcuda can give a CUDA view of."""

    name: str
    internal_format: int
    channels: int
    dtype: str  # numpy dtype of one channel
    gl_format: int  # the format and type glTexImage2D / glGetTexImage use for it
    gl_type: int
    color_format: ColorFormat | None  # the CUDA-EGL color format of a frame of it, where one exists

    @property
    def texel_bytes(self) -> int:
        return self.channels * np.dtype(self.dtype).itemsize


_GL_RGBA, _GL_RG, _GL_RED = 0x1908, 0x8227, 0x1903
_GL_UNSIGNED_BYTE, _GL_FLOAT = 0x1401, 0x1406
TEXTURE_FORMATS: dict[int, TextureFormat] = {
    f.internal_format: f
    for f in (
        # The driver describes an RGBA8 texture's frame as ABGR (CUDA-EGL names list channels
        # from the most significant byte of a 32-bit word, so bytes in memory are R, G, B, A).
        TextureFormat("RGBA8", 0x8058, 4, "uint8", _GL_RGBA, _GL_UNSIGNED_BYTE, ColorFormat.ABGR),
        TextureFormat("RG8", 0x822B, 2, "uint8", _GL_RG, _GL_UNSIGNED_BYTE, None),
        TextureFormat("R8", 0x8229, 1, "uint8", _GL_RED, _GL_UNSIGNED_BYTE, None),
        TextureFormat("R32F", 0x822E, 1, "float32", _GL_RED, _GL_FLOAT, None),
        TextureFormat("RGBA32F", 0x8814, 4, "float32", _GL_RGBA, _GL_FLOAT, None),
    )
}


def _destroy_image(display_address: int, image_address: int) -> None:
    try:
        lib.eglDestroyImageKHR(ffi.cast("EGLDisplay", display_address), ffi.cast("EGLImageKHR", image_address))
    except Exception:  # pragma: no cover - finalizers must not raise
        pass


def _gl_ok(call) -> bool:
    """Run a GL call; False if GL flagged an error (PyOpenGL raises it, or glGetError has it)."""
    from OpenGL.error import GLError

    try:
        call()
    except GLError:
        return False
    return not gl().glGetError()


_gl_extensions: dict[int, frozenset[str]] = {}


def _require_gl_extension(context: GLContext, *names: str) -> None:
    """Raise :class:`Unsupported` unless ``context`` (current on this thread) lists one of
    ``names`` (extensions that define or require the same function)."""
    key = context._context_address
    if key not in _gl_extensions:
        _gl_extensions[key] = current_extensions()
    if not any(name in _gl_extensions[key] for name in names):
        raise Unsupported(" or ".join(names), where=f"this GL context ({context.display.description})")
    bind_egl_extensions(frozenset(names))


class Image:
    """An EGLImage made from a GL 2D texture (``EGL_GL_TEXTURE_2D_KHR``, contents preserved).

    :param context: the GL context the texture belongs to (made current for the calls that need
        it, then the previous context is restored).
    :param texture: the GL texture name; it must have storage at ``level``.
    :param level: the mipmap level the image shows.

    The image keeps its own reference to the texture's storage: deleting the texture afterwards
    leaves the image valid (EGL's rule). :meth:`close` destroys it; so does garbage collection.
    """

    def __init__(self, context: GLContext, texture: int, level: int = 0) -> None:
        if not isinstance(context, GLContext):
            raise UsageError(f"context must be an eglcuda.GLContext, got {type(context).__name__}")
        if context.closed:
            raise ClosedError("the GL context is closed (or its display is)")
        if type(texture) is not int or texture <= 0:
            raise UsageError(f"texture must be a GL texture name (an int > 0), got {texture!r}")
        if type(level) is not int or level < 0:
            raise UsageError(f"level must be an int >= 0, got {level!r}")
        display = context.display
        display.require("EGL_KHR_image_base", "EGL_KHR_gl_texture_2D_image")
        GL = gl()
        with context.current():
            if not GL.glIsTexture(texture):
                raise UsageError(f"texture {texture} is not a texture of this GL context (deleted, or never bound)")
            with TextureBinding():
                while GL.glGetError():
                    pass
                if not _gl_ok(lambda: GL.glBindTexture(GL.GL_TEXTURE_2D, texture)):
                    raise UsageError(f"texture {texture} is not a 2D texture (GL_TEXTURE_2D)")
                width = int(GL.glGetTexLevelParameteriv(GL.GL_TEXTURE_2D, level, GL.GL_TEXTURE_WIDTH))
                height = int(GL.glGetTexLevelParameteriv(GL.GL_TEXTURE_2D, level, GL.GL_TEXTURE_HEIGHT))
                internal = int(GL.glGetTexLevelParameteriv(GL.GL_TEXTURE_2D, level, GL.GL_TEXTURE_INTERNAL_FORMAT))
            if width == 0 or height == 0:
                raise UsageError(f"texture {texture} has no storage at level {level}")
            attribs = int_attribs([(lib.EGL_GL_TEXTURE_LEVEL_KHR, level), (lib.EGL_IMAGE_PRESERVED_KHR, lib.EGL_TRUE)])
            handle = lib.eglCreateImageKHR(display.handle, context.handle, lib.EGL_GL_TEXTURE_2D_KHR,
                                           ffi.cast("EGLClientBuffer", texture), attribs)
            if handle == ffi.NULL:
                raise egl_error("eglCreateImageKHR", f"making an EGLImage of texture {texture}")
        self.context = context
        self.display: Display = display
        self.texture = texture
        self.level = level
        self.width = width
        self.height = height
        self.internal_format = internal
        self.format: TextureFormat | None = TEXTURE_FORMATS.get(internal)
        self._address = address(handle)
        self._finalizer = weakref.finalize(self, _destroy_image, display._address, self._address)
        self._registrations: weakref.WeakSet[CudaImage] = weakref.WeakSet()
        display._adopt(self)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive or self.display.closed

    @property
    def handle(self):
        """The raw ``EGLImageKHR``."""
        if self.closed:
            raise ClosedError("the image is closed (or its display is)")
        return ffi.cast("EGLImageKHR", self._address)

    def bind_texture(self, texture: int | None = None, context: GLContext | None = None) -> int:
        """Make a GL texture of ``context`` (default: the image's) show this image
        (``glEGLImageTargetTexture2DOES``) and return its name: a new texture when ``texture`` is
        None (the caller deletes it), or the given one.

        The texture has the image's texels when bound. Whether later writes to it or to the
        source reach the other depends on the driver: :func:`siblings_alias` tells (Mesa: yes;
        NVIDIA driver 580 on an H100: no, the sibling is a copy)."""
        context = context or self.context
        handle = self.handle
        if context.display.closed or context.display._address != self.display._address:
            raise UsageError("the context must belong to the image's display")
        GL = gl()
        with context.current():
            # GL_OES_EGL_image defines the call; the external-image extension requires it.
            _require_gl_extension(context, "GL_OES_EGL_image", "GL_OES_EGL_image_external")
            if texture is None:
                texture = int(GL.glGenTextures(1))
            elif type(texture) is not int or texture <= 0:
                raise UsageError(f"texture must be a GL texture name (an int > 0), got {texture!r}")
            with TextureBinding():
                while GL.glGetError():
                    pass
                if not _gl_ok(lambda: GL.glBindTexture(GL.GL_TEXTURE_2D, texture)):
                    raise UsageError(f"texture {texture} is not a 2D texture (GL_TEXTURE_2D)")
                GL.glTexParameteri(GL.GL_TEXTURE_2D, GL.GL_TEXTURE_MIN_FILTER, GL.GL_NEAREST)
                GL.glTexParameteri(GL.GL_TEXTURE_2D, GL.GL_TEXTURE_MAG_FILTER, GL.GL_NEAREST)
                lib.glEGLImageTargetTexture2DOES(lib.GL_TEXTURE_2D, ffi.cast("GLeglImageOES", handle))
                error = GL.glGetError()
            if error:
                raise UsageError(f"glEGLImageTargetTexture2DOES failed with GL error 0x{error:04X} "
                                 f"(texture {texture})")
        return texture

    def finish_gl(self) -> None:
        """Wait until the GL work queued in the image's context is done (``glFinish``): do this
        before CUDA reads what GL drew. :meth:`CudaImage.map` does it for you."""
        with self.context.current():
            gl().glFinish()

    def register_cuda(self, device: int | CudaDevice | None = None, path: str = "auto") -> "CudaImage":
        """Register the image with CUDA and return the registration.

        ``path``: ``"auto"`` (the native path where the self-test shows it coherent, otherwise
        GL-interop), ``"native"`` or ``"gl-interop"`` to force one. Forcing ``"native"`` where the
        self-test failed raises :class:`NotCoherent` instead of returning a view that does not
        alias the texture."""
        return CudaImage(self, device, path)

    def close(self) -> None:
        """Unregister every CUDA registration of the image, then destroy it. Safe to call twice."""
        for registration in list(self._registrations):
            registration.close()
        self._finalizer()

    def __enter__(self) -> "Image":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        fmt = self.format.name if self.format else f"0x{self.internal_format:04X}"
        return f"<Image {self.width}x{self.height} {fmt} of texture {self.texture}{' closed' if self.closed else ''}>"


# ---- the path decision ---------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PathChoice:
    """Which CUDA path an EGLImage of this display takes with ``path="auto"``, and why."""

    path: str | None  # NATIVE, GL_INTEROP, or None when neither works
    native_coherent: bool | None  # the self-test's verdict (None: it could not run)
    reason: str
    gl_interop_coherent: bool | None = None

    def coherent(self, path: str) -> bool | None:
        return self.native_coherent if path == NATIVE else self.gl_interop_coherent


_choices: dict[tuple[int, int], PathChoice] = {}
_choice_lock = threading.Lock()


def image_path(display: Display, device: int | CudaDevice | None = None, refresh: bool = False) -> PathChoice:
    """The path ``Image.register_cuda(path="auto")`` takes on this display and CUDA device, decided
    once (cached) by the coherence self-test. ``refresh`` runs the test again."""
    device = display.cuda_device(device)
    key = (display._address, device.ordinal)
    with _choice_lock:
        if refresh or key not in _choices:
            _choices[key] = _decide(display, device)
        return _choices[key]


def _decide(display: Display, device: CudaDevice) -> PathChoice:
    kind = "integrated (Tegra-like)" if device.info.integrated else "discrete"
    verdicts: dict[str, tuple[bool | None, str]] = {}
    for path in PATHS:
        try:
            verdicts[path] = _self_test(display, device, path)
        except (Unsupported, UsageError) as exc:
            verdicts[path] = (None, f"could not run: {exc}")
        except EglCudaError as exc:  # the driver refused a step of the path: not usable
            verdicts[path] = (False, f"{type(exc).__name__}: {exc}")
    (native, native_why), (interop, interop_why) = verdicts[NATIVE], verdicts[GL_INTEROP]
    if native:
        return PathChoice(NATIVE, True, f"{kind} GPU; native EGLImage registration aliases the texture both ways",
                          interop)
    if interop:
        return PathChoice(GL_INTEROP, native, f"{kind} GPU; native path not coherent ({native_why}); "
                                              "CUDA-GL interop on the source texture aliases both ways", True)
    return PathChoice(None, native, f"{kind} GPU; native path: {native_why}; GL interop: {interop_why}", interop)


def _self_test(display: Display, device: CudaDevice, path: str) -> tuple[bool, str]:
    """Random texels written in GL must read back through the CUDA view of ``path``, and random
    bytes written through the view must read back in GL. (coherent, what went wrong)."""
    require_cuda_entry("cuGraphicsEGLRegisterImage" if path == NATIVE else "cuGraphicsGLRegisterImage")
    rng = np.random.default_rng()
    width, height = 16, 8
    fmt = TEXTURE_FORMATS[0x8058]
    GL = gl()
    context = GLContext(display)
    try:
        with context.current():
            texels = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
            texture = _make_texture(fmt, texels)
            try:
                with Image(context, texture) as image, CudaImage(image, device, path, _verified=True) as view:
                    with view.map() as mapped:
                        if not np.array_equal(mapped.to_numpy(), texels):
                            return False, "CUDA read different bytes than GL's texels"
                        written = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
                        mapped.copy_from(written)
                    GL.glFinish()
                    if not np.array_equal(_read_texture(fmt, texture, width, height), written):
                        return False, "CUDA's writes did not reach GL"
                    return True, "both directions agree"
            finally:
                GL.glDeleteTextures([texture])
    finally:
        context.close()


_sibling_verdicts: dict[int, bool] = {}


def siblings_alias(display: Display) -> bool:
    """Whether two GL textures of one EGLImage (the source and one bound with
    ``glEGLImageTargetTexture2DOES``) share storage after binding: a GL write to either is seen
    by the other. Tested once per display (cached) with random texels."""
    if display._address not in _sibling_verdicts:
        rng = np.random.default_rng()
        fmt = TEXTURE_FORMATS[0x8058]
        GL = gl()
        with GLContext(display) as context:
            source = _make_texture(fmt, rng.integers(0, 256, (4, 8, 4), dtype=np.uint8))
            with Image(context, source) as image:
                alias = image.bind_texture()
                agree = True
                for writer, reader in ((source, alias), (alias, source)):
                    data = rng.integers(0, 256, (4, 8, 4), dtype=np.uint8)
                    _write_texture(fmt, writer, data)
                    GL.glFinish()
                    agree = agree and np.array_equal(_read_texture(fmt, reader, 8, 4), data)
            GL.glDeleteTextures([source, alias])
        _sibling_verdicts[display._address] = bool(agree)
    return _sibling_verdicts[display._address]


def _frame_location(frame) -> tuple[str, int, int]:
    if frame.frameType == lib.CU_EGL_FRAME_TYPE_ARRAY:
        return ("array", int(ffi.cast("uintptr_t", frame.frame.pArray[0])), 0)
    return ("device", int(ffi.cast("uintptr_t", frame.frame.pPitch[0])), frame.pitch)


def _make_texture(fmt: TextureFormat, texels: np.ndarray) -> int:
    """A new 2D texture of the current context holding ``texels`` (rows from the first)."""
    GL = gl()
    texture = int(GL.glGenTextures(1))
    with TextureBinding():
        GL.glBindTexture(GL.GL_TEXTURE_2D, texture)
        GL.glTexParameteri(GL.GL_TEXTURE_2D, GL.GL_TEXTURE_MIN_FILTER, GL.GL_NEAREST)
        GL.glTexParameteri(GL.GL_TEXTURE_2D, GL.GL_TEXTURE_MAG_FILTER, GL.GL_NEAREST)
        GL.glPixelStorei(GL.GL_UNPACK_ALIGNMENT, 1)
        GL.glTexImage2D(GL.GL_TEXTURE_2D, 0, fmt.internal_format, texels.shape[1], texels.shape[0], 0,
                        fmt.gl_format, fmt.gl_type, np.ascontiguousarray(texels))
    return texture


def _write_texture(fmt: TextureFormat, texture: int, texels: np.ndarray) -> None:
    """Replace the texels of level 0 of a 2D texture of the current context (glTexSubImage2D)."""
    GL = gl()
    with TextureBinding():
        GL.glBindTexture(GL.GL_TEXTURE_2D, texture)
        GL.glPixelStorei(GL.GL_UNPACK_ALIGNMENT, 1)
        GL.glTexSubImage2D(GL.GL_TEXTURE_2D, 0, 0, 0, texels.shape[1], texels.shape[0], fmt.gl_format, fmt.gl_type,
                           np.ascontiguousarray(texels))


def _read_texture(fmt: TextureFormat, texture: int, width: int, height: int) -> np.ndarray:
    """The texels of level 0 of a 2D texture of the current context (glGetTexImage)."""
    GL = gl()
    out = np.empty((height, width, fmt.channels), fmt.dtype)
    with TextureBinding():
        GL.glBindTexture(GL.GL_TEXTURE_2D, texture)
        GL.glPixelStorei(GL.GL_PACK_ALIGNMENT, 1)
        GL.glGetTexImage(GL.GL_TEXTURE_2D, 0, fmt.gl_format, fmt.gl_type, out)
    return out


# ---- the CUDA side -------------------------------------------------------------------------------

def _unregister(ordinal: int, resource: int, display_address: int, context_address: int,
                surface_address: int) -> None:
    """Finalizer of a registration: unregister, with the GL context current for GL interop.
    Never raises."""
    try:
        get_device(ordinal).make_current()
        previous = None
        if context_address:
            previous = (lib.eglGetCurrentDisplay(), lib.eglGetCurrentSurface(lib.EGL_DRAW),
                        lib.eglGetCurrentSurface(lib.EGL_READ), lib.eglGetCurrentContext())
            surface = ffi.cast("EGLSurface", surface_address)
            lib.eglMakeCurrent(ffi.cast("EGLDisplay", display_address), surface, surface,
                               ffi.cast("EGLContext", context_address))
        lib.cuGraphicsUnregisterResource(ffi.cast("CUgraphicsResource", resource))
        if previous is not None:
            if previous[0] != ffi.NULL:
                lib.eglMakeCurrent(*previous)
            else:
                lib.eglMakeCurrent(ffi.cast("EGLDisplay", display_address), ffi.NULL, ffi.NULL, ffi.NULL)
    except Exception:  # pragma: no cover - finalizers must not raise
        pass


class CudaImage:
    """An :class:`Image` registered with CUDA. Made by :meth:`Image.register_cuda`.

    ``path`` says how (``"native"`` or ``"gl-interop"``) and ``path_reason`` why. :meth:`map`
    gives the CUDA view; one mapping at a time.
    """

    def __init__(self, image: Image, device: int | CudaDevice | None, path: str, _verified: bool = False) -> None:
        if image.closed:
            raise ClosedError("the image is closed")
        if path not in ("auto", *PATHS):
            raise UsageError(f"path is 'auto', 'native' or 'gl-interop', got {path!r}")
        if image.format is None:
            names = ", ".join(f.name for f in TEXTURE_FORMATS.values())
            raise UsageError(f"the texture's internal format 0x{image.internal_format:04X} has no CUDA view in "
                             f"eglcuda (supported: {names})")
        self.image = image
        self.device = image.display.cuda_device(device)
        if _verified:  # the self-test itself: the path is what is being tested
            self.path_reason = "self-test"
        else:
            choice = image_path(image.display, self.device)
            if path == "auto":
                if choice.path is None:
                    raise Unsupported("a coherent CUDA path for EGLImages", where=image.display.description,
                                      hint=choice.reason)
                path = choice.path
            elif not choice.coherent(path):
                raise NotCoherent(f"the {path} EGLImage path is not coherent here: {choice.reason}")
            self.path_reason = choice.reason
        self.path = path
        self._resource = ffi.new("CUgraphicsResource *")
        self.device.make_current()
        if path == NATIVE:
            check(lib.cuGraphicsEGLRegisterImage(self._resource, image.handle, lib.CU_GRAPHICS_REGISTER_FLAGS_NONE),
                  "cuGraphicsEGLRegisterImage", "registering the EGLImage with CUDA")
            context_address = surface_address = 0
        else:
            require_cuda_entry("cuGraphicsGLRegisterImage")
            with image.context.current():
                if not gl().glIsTexture(image.texture):
                    raise UsageError(f"the image's source texture {image.texture} was deleted; the GL-interop path "
                                     "maps that texture, so keep it while the image is used from CUDA")
                check(lib.cuGraphicsGLRegisterImage(self._resource, image.texture, lib.GL_TEXTURE_2D,
                                                    lib.CU_GRAPHICS_REGISTER_FLAGS_SURFACE_LDST),
                      "cuGraphicsGLRegisterImage", "registering the image's source texture with CUDA")
            context_address = image.context._context_address
            surface_address = image.context._surface_address
        self._finalizer = weakref.finalize(
            self, _unregister, self.device.ordinal, int(ffi.cast("uintptr_t", self._resource[0])),
            image.display._address, context_address, surface_address)
        self._mapped: MappedImage | None = None
        image._registrations.add(self)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive or self.image.closed

    def map(self, cuda_stream: Any = None, finish_gl: bool = True) -> "MappedImage":
        """The CUDA view of the image, valid until :meth:`MappedImage.unmap`.

        ``finish_gl`` first waits for the GL work queued in the image's context (the guide's rule
        before CUDA reads or writes the image; mapping a GL-interop registration orders it as
        well). ``cuda_stream`` is where the view's work belongs (default: the legacy stream)."""
        if self.closed:
            raise ClosedError("the CUDA registration is closed (or its image is)")
        if self._mapped is not None:
            raise UsageError("the image is already mapped: unmap it first")
        stream = stream_handle(cuda_stream)
        self.device.make_current()
        if self.path == NATIVE:
            if finish_gl:
                self.image.finish_gl()
            frame = ffi.new("CUeglFrame *")
            check(lib.cuGraphicsResourceGetMappedEglFrame(frame, self._resource[0], 0, 0),
                  "cuGraphicsResourceGetMappedEglFrame", "reading the image's CUDA frame")
            kind, where, pitch = _frame_location(frame)
            color = frame.eglColorFormat
        else:
            with self.image.context.current():
                if finish_gl:
                    gl().glFinish()
                check(lib.cuGraphicsMapResources(1, self._resource, ffi.cast("CUstream", stream)),
                      "cuGraphicsMapResources", "mapping the image's GL texture")
                array = ffi.new("CUarray *")
                status = lib.cuGraphicsSubResourceGetMappedArray(array, self._resource[0], 0, self.image.level)
                if status:
                    lib.cuGraphicsUnmapResources(1, self._resource, ffi.cast("CUstream", stream))
                    raise cuda_error(status, "cuGraphicsSubResourceGetMappedArray", "reading the mapped array")
            kind, where, pitch = "array", int(ffi.cast("uintptr_t", array[0])), 0
            color = self.image.format.color_format
        self._mapped = MappedImage(self, stream, kind, where, pitch, color)
        return self._mapped

    def _unmap(self, mapped: "MappedImage", finish_cuda: bool) -> None:
        self._mapped = None
        self.device.make_current()
        if self.path == NATIVE:
            if finish_cuda:
                check(lib.cuStreamSynchronize(ffi.cast("CUstream", mapped.cuda_stream)), "cuStreamSynchronize",
                      "finishing CUDA work on the image before GL uses it")
            return
        with self.image.context.current():
            check(lib.cuGraphicsUnmapResources(1, self._resource, ffi.cast("CUstream", mapped.cuda_stream)),
                  "cuGraphicsUnmapResources", "unmapping the image's GL texture")

    def close(self) -> None:
        """Unmap (if mapped) and unregister. Safe to call twice."""
        if not self._finalizer.alive:
            return
        if self._mapped is not None and not self.image.closed:
            self._mapped.unmap()
        self._mapped = None
        self._finalizer()

    def __enter__(self) -> "CudaImage":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<CudaImage {self.path} of {self.image!r}{' closed' if self.closed else ''}>"


class MappedImage:
    """The CUDA view of a mapped image: a CUDA array (``layout`` ARRAY) or pitch-linear memory,
    plus a surface object for kernels that write (``surf2Dwrite``) on arrays. Valid until
    :meth:`unmap` (or the end of a ``with`` block); then every access raises."""

    def __init__(self, registration: CudaImage, cuda_stream: int, kind: str, where: int, pitch: int,
                 color_format: int | None) -> None:
        self._registration = registration
        self.cuda_stream = cuda_stream
        self._kind = kind
        self._where = where
        self._pitch = pitch
        self.format: TextureFormat = registration.image.format
        self.width = registration.image.width
        self.height = registration.image.height
        self.path = registration.path
        try:
            self.color_format = None if color_format is None else ColorFormat(color_format)
        except ValueError:
            self.color_format = color_format  # a format eglcuda has no name for: the raw value
        self._surface = 0
        self._unmapped = False

    def _check(self) -> None:
        if self._unmapped:
            raise ClosedError("the image was unmapped; map it again")

    @property
    def layout(self) -> Layout:
        self._check()
        return Layout.ARRAY if self._kind == "array" else Layout.PITCH

    @property
    def array(self) -> int:
        """The ``CUarray`` handle (array layout)."""
        self._check()
        if self._kind != "array":
            raise UsageError("this view is pitch-linear: use pointer and pitch")
        return self._where

    @property
    def pointer(self) -> int:
        """The device pointer (pitch layout)."""
        self._check()
        if self._kind != "device":
            raise UsageError("this view is a CUDA array: use array or surface")
        return self._where

    @property
    def pitch(self) -> int:
        self._check()
        return self._pitch

    @property
    def surface(self) -> int:
        """A ``CUsurfObject`` over the array for ``surf2Dread``/``surf2Dwrite`` (x in bytes),
        made on first use and destroyed at unmap."""
        array = self.array
        if not self._surface:
            desc = ffi.new("CUDA_RESOURCE_DESC *")
            desc.resType = lib.CU_RESOURCE_TYPE_ARRAY
            desc.res.array.hArray = ffi.cast("CUarray", array)
            handle = ffi.new("CUsurfObject *")
            self._registration.device.make_current()
            check(lib.cuSurfObjectCreate(handle, desc), "cuSurfObjectCreate", "making a surface object for the image")
            self._surface = int(handle[0])
        return self._surface

    def _endpoint(self) -> tuple[str, int, int]:
        self._check()
        return (self._kind, self._where, self._pitch)

    def to_numpy(self) -> np.ndarray:
        """A host copy of the texels, shape (height, width, channels), rows as GL stores them
        (row 0 is the texture's first row, t = 0)."""
        fmt = self.format
        out = np.empty((self.height, self.width, fmt.channels), fmt.dtype)
        _copy_2d(self._registration.device, self.cuda_stream, src=self._endpoint(),
                 dst=("host", out, self.width * fmt.texel_bytes), width_bytes=self.width * fmt.texel_bytes,
                 height=self.height)
        return out

    def copy_from(self, texels: np.ndarray) -> None:
        """Upload host texels of shape (height, width, channels) into the image and wait."""
        fmt = self.format
        texels = np.ascontiguousarray(texels)
        if texels.dtype != np.dtype(fmt.dtype) or texels.size != self.height * self.width * fmt.channels:
            raise UsageError(f"expected {fmt.dtype} texels of shape ({self.height}, {self.width}, {fmt.channels}), "
                             f"got {texels.dtype} {texels.shape}")
        _copy_2d(self._registration.device, self.cuda_stream, src=("host", texels, self.width * fmt.texel_bytes),
                 dst=self._endpoint(), width_bytes=self.width * fmt.texel_bytes, height=self.height)

    def unmap(self, finish_cuda: bool = True) -> None:
        """End the view. ``finish_cuda`` (native path) waits for the work queued on the view's
        stream, so GL sees CUDA's writes; the GL-interop unmap orders it by itself."""
        if self._unmapped:
            raise ClosedError("the image was already unmapped")
        self._unmapped = True
        if self._surface:
            lib.cuSurfObjectDestroy(self._surface)
            self._surface = 0
        self._registration._unmap(self, finish_cuda)

    def __enter__(self) -> "MappedImage":
        return self

    def __exit__(self, *exc) -> None:
        if not self._unmapped:
            self.unmap()

    def __repr__(self) -> str:
        state = " unmapped" if self._unmapped else ""
        return f"<MappedImage {self.width}x{self.height} {self.format.name} {self.path}{state}>"
