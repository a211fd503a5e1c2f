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

Which one is used is decided per display and CUDA device by a one-time self-test of each path
(:mod:`eglcuda.images.paths`): a texture of random texels is read through the CUDA view, random
bytes written through it are read back in GL. A path is used only where both directions agree
(``path="auto"`` takes the native one first); forcing a path whose test failed raises
:class:`NotCoherent`.

Synchronization follows the guide: GL work on the texture must be finished before CUDA touches the
image and CUDA work finished before GL uses it again. :meth:`CudaImage.map` finishes GL work first
and :meth:`MappedImage.unmap` finishes the CUDA stream's work (the native path) or unmaps, which
orders CUDA before later GL work (the GL-interop path).
"""
from __future__ import annotations

import enum
import numbers
from typing import Any, NamedTuple

import numpy as np

from .._bind import cuda, cuda_graphics, egl, egl_image
from .._bind import gl as _gl
from .._bind.gl import TextureBinding, current_extensions, gl
from .._bind.loader import bind_egl_extensions, require_cuda_entry
from .._integers import as_int, check_flag
from .._resource import Resource
from ..context import GLContext, on_context_destroyed
from ..cuda_device import CudaDevice, get_device
from ..display import Display
from ..errors import ClosedError, NotCoherent, Unsupported, UsageError, shown
from ..frames.formats import ColorFormat, Layout
from ..frames.interop import stream_handle


class ImagePath(str, enum.Enum):
    """How a CUDA view reaches an EGLImage's texels (see the module notes). Compares equal to its
    value (``ImagePath.NATIVE == "native"``)."""

    NATIVE = "native"  # cuGraphicsEGLRegisterImage on the EGLImage
    GL_INTEROP = "gl-interop"  # cuGraphicsGLRegisterImage on the image's source texture

    def __str__(self) -> str:
        return self.value


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


# GL extensions by context address. Forgotten when eglcuda destroys the context: EGL may give a
# later context the same address.
_gl_extensions: dict[int, frozenset[str]] = {}


def _forget_gl_extensions(context_address: int) -> None:
    _gl_extensions.pop(context_address, None)


on_context_destroyed(_forget_gl_extensions)


_MAX_LEVELS = 32  # a GLint mipmap level of a texture whose sides fit 32 bits
_MAX_TEXTURE_NAME = 2**32 - 1  # a GLuint


def _texture_name(texture: object) -> int:
    """``texture`` as a GL texture name (an int), or :class:`UsageError`. NumPy integers are
    taken: PyOpenGL's ``glGenTextures(1)`` returns a ``numpy.uint32``."""
    if isinstance(texture, bool) or not isinstance(texture, numbers.Integral) or not 0 < int(texture) <= _MAX_TEXTURE_NAME:
        raise UsageError(f"texture must be a GL texture name (an int in 1..2**32-1), got {texture!r}")
    return int(texture)


def _require_gl_extension(context: GLContext, *names: str) -> None:
    """Raise :class:`Unsupported` unless ``context`` (current on this thread) lists one of
    ``names`` (extensions that define or require the same function)."""
    key = context._context_address
    if key not in _gl_extensions:
        _gl_extensions[key] = current_extensions()
    if not any(name in _gl_extensions[key] for name in names):
        raise Unsupported(" or ".join(names), where=f"this GL context ({context.display.description})")
    bind_egl_extensions(frozenset(names))


def _level_geometry(texture: int, level: int) -> tuple[int, int, int] | None:
    """Width, height and internal format of ``texture`` at ``level`` in the current context (zeros
    for a level without storage), or None when the name is not a 2D texture."""
    GL = gl()
    with TextureBinding():
        _gl.clear_errors()
        if not _gl.accepted(lambda: GL.glBindTexture(GL.GL_TEXTURE_2D, texture)):
            return None
        sizes: list[int] = []
        # A level past the context's largest mipmap is a GL error, not an empty level.
        if not _gl.accepted(lambda: sizes.extend(
                int(GL.glGetTexLevelParameteriv(GL.GL_TEXTURE_2D, level, query))
                for query in (GL.GL_TEXTURE_WIDTH, GL.GL_TEXTURE_HEIGHT, GL.GL_TEXTURE_INTERNAL_FORMAT))):
            return 0, 0, 0
        return sizes[0], sizes[1], sizes[2]


class Image(Resource):
    """An EGLImage made from a GL 2D texture (``EGL_GL_TEXTURE_2D_KHR``, contents preserved).

    :param context: the GL context the texture belongs to (made current for the calls that need
        it, then the previous context is restored).
    :param texture: the GL texture name; it must have storage at ``level``.
    :param level: the mipmap level the image shows.

    The image keeps its own reference to the texture's storage: deleting the texture afterwards
    leaves the image valid (EGL's rule). :meth:`close` unregisters its CUDA registrations, then
    destroys it; so does garbage collection, and closing its context (or display).
    """

    def __init__(self, context: GLContext, texture: int, level: int = 0) -> None:
        if not isinstance(context, GLContext):
            raise UsageError(f"context must be an eglcuda.GLContext, got {type(context).__name__}")
        context._check_open()  # (in a forked child: says the context is the parent's)
        texture = _texture_name(texture)
        mip_level = as_int(level)  # (a NumPy integer too, not a bool)
        if mip_level is None or not 0 <= mip_level < _MAX_LEVELS:
            raise UsageError(f"level must be a mipmap level, an int in 0..{_MAX_LEVELS - 1}, got {shown(level)}")
        level = mip_level
        display = context.display
        display.require("EGL_KHR_image_base", "EGL_KHR_gl_texture_2D_image")
        GL = gl()
        with context.current():
            if not GL.glIsTexture(texture):
                raise UsageError(f"texture {texture} is not a texture of this GL context (deleted, or never bound)")
            geometry = _level_geometry(texture, level)
            if geometry is None:
                raise UsageError(f"texture {texture} is not a 2D texture (GL_TEXTURE_2D)")
            width, height, internal = geometry
            if width == 0 or height == 0:
                raise UsageError(f"texture {texture} has no storage at level {level}")
            handle = egl_image.create_from_texture(display.handle, context.handle, texture, level)
        self.context = context
        self.display: Display = display
        self.texture = texture
        self.level = level
        self.width = width
        self.height = height
        self.internal_format = internal
        self.format: TextureFormat | None = TEXTURE_FORMATS.get(internal)
        self._address = handle
        self._own(egl_image.destroy, display._address, handle, parent=context)

    @property
    def handle(self) -> int:
        """The raw ``EGLImageKHR``, as an address."""
        self._check_open()  # (in a forked child: says the image is the parent's)
        return self._address

    def bind_texture(self, texture: int | None = None, context: GLContext | None = None) -> int:
        """Make a GL texture of ``context`` (default: the image's) show this image
        (``glEGLImageTargetTexture2DOES``) and return its name: a new texture when ``texture`` is
        None (the caller deletes it), or the given one.

        The texture has the image's texels when bound. Whether later writes to it or to the
        source reach the other depends on the driver: :func:`siblings_alias` tells (Mesa: yes;
        NVIDIA driver 580 on an H100: no, the sibling is a copy)."""
        if context is not None and not isinstance(context, GLContext):
            raise UsageError(f"context must be an eglcuda.GLContext, got {type(context).__name__}")
        context = context or self.context
        handle = self.handle
        if context.display.closed or context.display._address != self.display._address:
            raise UsageError("the context must belong to the image's display")
        GL = gl()
        with context.current():
            # GL_OES_EGL_image defines the call; the external-image extension requires it.
            _require_gl_extension(context, "GL_OES_EGL_image", "GL_OES_EGL_image_external")
            made = texture is None
            texture = int(GL.glGenTextures(1)) if made else _texture_name(texture)
            try:
                with TextureBinding():
                    _gl.clear_errors()
                    if not _gl.accepted(lambda: GL.glBindTexture(GL.GL_TEXTURE_2D, texture)):
                        raise UsageError(f"texture {texture} is not a 2D texture (GL_TEXTURE_2D)")
                    GL.glTexParameteri(GL.GL_TEXTURE_2D, GL.GL_TEXTURE_MIN_FILTER, GL.GL_NEAREST)
                    GL.glTexParameteri(GL.GL_TEXTURE_2D, GL.GL_TEXTURE_MAG_FILTER, GL.GL_NEAREST)
                    egl_image.target_texture_2d(handle)
                    _gl.check("glEGLImageTargetTexture2DOES", f"binding texture {texture} to the EGLImage")
            except BaseException:
                if made:  # (a texture the caller never saw: nobody else would delete it)
                    GL.glDeleteTextures([texture])
                raise
        return texture

    def finish_gl(self) -> None:
        """Wait until the GL work queued in the image's context is done (``glFinish``): do this
        before CUDA reads what GL drew. :meth:`CudaImage.map` does it for you."""
        self._check_open()
        with self.context.current():
            gl().glFinish()

    def register_cuda(self, device: int | CudaDevice | None = None, path: str = "auto") -> "CudaImage":
        """Register the image with CUDA and return the registration.

        ``path``: ``"auto"`` (the native path where the self-test shows it coherent, otherwise
        GL-interop), ``"native"`` or ``"gl-interop"`` (or an :class:`ImagePath`) to force one.
        Forcing ``"native"`` where the self-test failed raises :class:`NotCoherent` instead of
        returning a view that does not alias the texture."""
        return CudaImage(self, device, path)

    def __repr__(self) -> str:
        fmt = self.format.name if self.format else f"0x{self.internal_format:04X}"
        return f"<Image {self.width}x{self.height} {fmt} of texture {self.texture}{' closed' if self.closed else ''}>"


# ---- the CUDA side -------------------------------------------------------------------------------

def _unregister(ordinal: int, resource: int, display_address: int, context_address: int,
                surface_address: int) -> None:
    """Release of a registration: unregister, with the GL context current for GL interop (then
    what was current before)."""
    get_device(ordinal).make_current()
    previous = None
    if context_address:
        previous = egl.current()
        egl.make_current(display_address, surface_address, surface_address, context_address)
    cuda_graphics.unregister(resource)
    if previous is not None:
        if previous[0]:
            egl.make_current(*previous)
        else:
            egl.make_current(display_address, 0, 0, 0)


def _chosen_path(image: Image, device: CudaDevice, path: str) -> tuple[ImagePath, str]:
    """The path a registration of ``image`` takes (``path``: "auto" or one to force) and why, from
    the self-test's verdict for its display and ``device``. Raises where none or the forced one is
    not coherent."""
    # The verdict is the self-test of eglcuda.images.paths, which runs through this module's
    # classes and so sits above it: imported here, the one place that asks for it.
    from .paths import image_path

    choice = image_path(image.display, device)
    if path == "auto":
        if choice.path is None:
            raise Unsupported("a coherent CUDA path for EGLImages", where=image.display.description,
                              hint=choice.reason)
        return choice.path, choice.reason
    if not choice.coherent(path):
        raise NotCoherent(f"the {path} EGLImage path is not coherent here: {choice.reason}")
    return ImagePath(path), choice.reason


class CudaImage(Resource):
    """An :class:`Image` registered with CUDA. Made by :meth:`Image.register_cuda`.

    ``path`` says how (an :class:`ImagePath`) and ``path_reason`` why. :meth:`map` gives the CUDA
    view; one mapping at a time. Closing the registration (or its image) ends the mapping first.
    """

    def __init__(self, image: Image, device: int | CudaDevice | None, path: str, _verified: bool = False) -> None:
        image._check_open()
        if path not in ("auto", *ImagePath):
            raise UsageError(f"path is 'auto', 'native' or 'gl-interop', got {path!r}")
        if image.format is None:
            names = ", ".join(f.name for f in TEXTURE_FORMATS.values())
            raise UsageError(f"the texture's internal format 0x{image.internal_format:04X} has no CUDA view in "
                             f"eglcuda (supported: {names})")
        self.image = image
        self.device = image.display.cuda_device(device)
        if _verified:  # the self-test itself: the path is what is being tested
            self.path, self.path_reason = ImagePath(path), "self-test"
        else:
            self.path, self.path_reason = _chosen_path(image, self.device, path)
        self.device.make_current()
        if self.path is ImagePath.NATIVE:
            resource = cuda_graphics.register_egl_image(image.handle)
            context_address = surface_address = 0
        else:
            require_cuda_entry("cuGraphicsGLRegisterImage")
            with image.context.current():
                if (not gl().glIsTexture(image.texture)
                        or _level_geometry(image.texture, image.level) != (image.width, image.height,
                                                                            image.internal_format)):
                    # (a deleted texture whose name GL gave to another one shows as a texture of
                    # another size or format; one of the same geometry cannot be told apart)
                    raise UsageError(f"the image's source texture {image.texture} was deleted (or its name reused "
                                     "by another texture); the GL-interop path maps that texture, so keep it while "
                                     "the image is used from CUDA")
                resource = cuda_graphics.register_gl_texture(image.texture)
            context_address = image.context._context_address
            surface_address = image.context._surface_address
        self._resource = resource
        self._own(_unregister, self.device.ordinal, resource, image.display._address, context_address,
                  surface_address, parent=image)
        self._mapped: MappedImage | None = None

    def map(self, cuda_stream: Any = None, finish_gl: bool = True) -> "MappedImage":
        """The CUDA view of the image, valid until :meth:`MappedImage.unmap`.

        ``finish_gl`` first waits for the GL work queued in the image's context (the guide's rule
        before CUDA reads or writes the image; mapping a GL-interop registration orders it as
        well). ``cuda_stream`` is where the view's work belongs (default: the legacy stream)."""
        self._check_open()
        finish_gl = check_flag(finish_gl, "finish_gl")
        if self._mapped is not None:
            raise UsageError("the image is already mapped: unmap that view first (the registration's "
                             "``mapped`` is it, also when it was dropped without unmap())")
        stream = stream_handle(cuda_stream)
        self.device.make_current()
        if self.path is ImagePath.NATIVE:
            if finish_gl:
                self.image.finish_gl()
            kind, where, pitch, color = cuda_graphics.mapped_egl_frame(self._resource)
        else:
            with self.image.context.current():
                if finish_gl:
                    gl().glFinish()
                where = cuda_graphics.map_array(self._resource, stream, self.image.level)
            kind, pitch = "array", 0
            color = self.image.format.color_format
        self._mapped = MappedImage(self, stream, kind, where, pitch, color)
        return self._mapped

    @property
    def mapped(self) -> "MappedImage | None":
        """The view :meth:`map` gave and that is not unmapped yet, or None. The registration
        holds it until :meth:`MappedImage.unmap` (dropping it does not end the mapping)."""
        return self._mapped

    def _unmap(self, mapped: "MappedImage", finish_cuda: bool) -> None:
        self._mapped = None
        self.device.make_current()
        if self.path is ImagePath.NATIVE:
            if finish_cuda:
                cuda.stream_synchronize(mapped.cuda_stream, "finishing CUDA work on the image before GL uses it")
            return
        with self.image.context.current():
            cuda_graphics.unmap(self._resource, mapped.cuda_stream)

    def __repr__(self) -> str:
        return f"<CudaImage {self.path} of {self.image!r}{' closed' if self.closed else ''}>"


def _destroy_surface(ordinal: int, surface: list[int]) -> None:
    """Release of a mapping dropped without :meth:`MappedImage.unmap`: its surface object (the
    registration's unregistration ends the mapping itself)."""
    if surface[0]:
        get_device(ordinal).make_current()
        cuda.surface_destroy(surface[0])
        surface[0] = 0


class MappedImage(Resource):
    """The CUDA view of a mapped image: a CUDA array (``layout`` ARRAY) or pitch-linear memory,
    plus a surface object for kernels that write (``surf2Dwrite``) on arrays. Valid until
    :meth:`unmap` (or the end of a ``with`` block, or the registration's close); then every
    access raises."""

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
        self._surface = [0]  # the surface object, made on first use (shared with the release)
        self._finish_cuda = True
        self._own(_destroy_surface, registration.device.ordinal, self._surface, parent=registration)

    def _check(self) -> None:
        if self.closed:
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
        if not self._surface[0]:
            self._registration.device.make_current()
            self._surface[0] = cuda.surface_create(array, "making a surface object for the image")
        return self._surface[0]

    def _endpoint(self) -> tuple[str, int, int]:
        self._check()
        return (self._kind, self._where, self._pitch)

    def to_numpy(self) -> np.ndarray:
        """A host copy of the texels, shape (height, width, channels), rows as GL stores them
        (row 0 is the texture's first row, t = 0)."""
        fmt = self.format
        out = np.empty((self.height, self.width, fmt.channels), fmt.dtype)
        source = self._endpoint()
        self._registration.device.make_current()
        cuda.copy_2d(self.cuda_stream, source, ("host", out, self.width * fmt.texel_bytes),
                     self.width * fmt.texel_bytes, self.height, True)
        return out

    def copy_from(self, texels: np.ndarray) -> None:
        """Upload host texels of shape (height, width, channels) into the image and wait."""
        fmt = self.format
        texels = np.ascontiguousarray(texels)
        # The shape, not only the size: a transposed (width, height, channels) image or a flat
        # array has the right number of texels and would land scrambled. (height, width *
        # channels) is the same bytes, one row per line, as Plane.copy_from takes.
        shapes = ((self.height, self.width, fmt.channels), (self.height, self.width * fmt.channels))
        if texels.dtype != np.dtype(fmt.dtype) or texels.shape not in shapes:
            raise UsageError(f"expected {fmt.dtype} texels of shape ({self.height}, {self.width}, {fmt.channels}), "
                             f"got {texels.dtype} {texels.shape}")
        destination = self._endpoint()
        self._registration.device.make_current()
        cuda.copy_2d(self.cuda_stream, ("host", texels, self.width * fmt.texel_bytes), destination,
                     self.width * fmt.texel_bytes, self.height, True)

    def unmap(self, finish_cuda: bool = True) -> None:
        """End the view. ``finish_cuda`` (native path) waits for the work queued on the view's
        stream, so GL sees CUDA's writes; the GL-interop unmap orders it by itself."""
        if self.closed:
            raise ClosedError("the image was already unmapped")
        self._finish_cuda = check_flag(finish_cuda, "finish_cuda")
        try:
            self.close()
        finally:
            self._finalizer()  # the view is over even where the driver refused a step of the unmap

    def _before_release(self) -> None:
        surface, self._surface[0] = self._surface[0], 0
        if surface:
            cuda.surface_destroy(surface)
        self._registration._unmap(self, self._finish_cuda)

    def __repr__(self) -> str:
        state = " unmapped" if self.closed else ""
        return f"<MappedImage {self.width}x{self.height} {self.format.name} {self.path}{state}>"
