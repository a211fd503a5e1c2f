"""Which CUDA path an EGLImage takes, decided once per display and CUDA device by a self-test of
each path, and whether GL textures bound to one EGLImage share storage (see
:mod:`eglcuda.images.image` for the paths and why they need testing).

The self-tests run through the image classes themselves (what they vouch for is what
``Image.register_cuda`` hands out), so this module sits above :mod:`eglcuda.images.image`;
the registration asks for the decision by importing it when called (``_chosen_path``).
"""
from __future__ import annotations

import dataclasses
import threading

import numpy as np

from .._bind.gl import TextureBinding, gl
from .._integers import check_flag
from .._bind.loader import require_cuda_entry
from ..context import GLContext
from ..cuda_device import CudaDevice
from ..display import Display, check_display
from ..errors import ClosedError, EglCudaError, Unsupported, UsageError
from .image import TEXTURE_FORMATS, CudaImage, Image, ImagePath, TextureFormat


@dataclasses.dataclass(frozen=True)
class PathChoice:
    """Which CUDA path an EGLImage of this display takes with ``path="auto"``, and why."""

    path: ImagePath | None  # None when neither works
    native_coherent: bool | None  # the self-test's verdict (None: it could not run)
    reason: str
    gl_interop_coherent: bool | None = None

    def coherent(self, path: str) -> bool | None:
        return self.native_coherent if path == ImagePath.NATIVE else self.gl_interop_coherent


_choices: dict[tuple[int, int], PathChoice] = {}
_choice_lock = threading.Lock()


def image_path(display: Display, device: int | CudaDevice | None = None, refresh: bool = False) -> PathChoice:
    """The path ``Image.register_cuda(path="auto")`` takes on this display and CUDA device, decided
    once (cached) by the coherence self-test. ``refresh`` runs the test again."""
    check_display(display, "image_path")
    refresh = check_flag(refresh, "refresh")
    display.require()  # (ClosedError once closed: a closed display's failed self-test is no verdict to keep)
    device = display.cuda_device(device)
    key = (display._address, device.ordinal)
    with _choice_lock:
        if refresh or key not in _choices:
            _choices[key] = _decide(display, device)
        return _choices[key]


def _decide(display: Display, device: CudaDevice) -> PathChoice:
    kind = "integrated (Tegra-like)" if device.info.integrated else "discrete"
    verdicts: dict[ImagePath, tuple[bool | None, str]] = {}
    for path in ImagePath:
        try:
            verdicts[path] = _self_test(display, device, path)
        except (Unsupported, UsageError) as exc:
            verdicts[path] = (None, f"could not run: {exc}")
        except ClosedError:
            raise  # (the display closed meanwhile: no verdict on the path)
        except EglCudaError as exc:  # the driver refused a step of the path: not usable
            verdicts[path] = (False, f"{type(exc).__name__}: {exc}")
    (native, native_why), (interop, interop_why) = verdicts[ImagePath.NATIVE], verdicts[ImagePath.GL_INTEROP]
    if native:
        return PathChoice(ImagePath.NATIVE, True,
                          f"{kind} GPU; native EGLImage registration aliases the texture both ways", interop)
    if interop:
        return PathChoice(ImagePath.GL_INTEROP, native, f"{kind} GPU; native path not coherent ({native_why}); "
                                                        "CUDA-GL interop on the source texture aliases both ways", True)
    return PathChoice(None, native, f"{kind} GPU; native path: {native_why}; GL interop: {interop_why}", interop)


def _self_test(display: Display, device: CudaDevice, path: ImagePath) -> tuple[bool, str]:
    """Random texels written in GL must read back through the CUDA view of ``path``, and random
    bytes written through the view must read back in GL. (coherent, what went wrong)."""
    require_cuda_entry("cuGraphicsEGLRegisterImage" if path is ImagePath.NATIVE else "cuGraphicsGLRegisterImage")
    rng = np.random.default_rng()
    width, height = 16, 8
    fmt = TEXTURE_FORMATS[0x8058]
    GL = gl()
    context = GLContext(display)
    try:
        with context.current():
            texels = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
            texture = make_texture(fmt, texels)
            try:
                with Image(context, texture) as image, CudaImage(image, device, path, _verified=True) as view:
                    with view.map() as mapped:
                        if not np.array_equal(mapped.to_numpy(), texels):
                            return False, "CUDA read different bytes than GL's texels"
                        written = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
                        mapped.copy_from(written)
                    GL.glFinish()
                    if not np.array_equal(read_texture(fmt, texture, width, height), written):
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
    by the other. Tested once per display (cached) with random texels, in a context of its own;
    the context current on the calling thread before stays current."""
    check_display(display, "siblings_alias")
    display.require()  # (ClosedError once closed)
    if display._address not in _sibling_verdicts:
        rng = np.random.default_rng()
        fmt = TEXTURE_FORMATS[0x8058]
        GL = gl()
        context = GLContext(display)
        try:
            with context.current():
                source = make_texture(fmt, rng.integers(0, 256, (4, 8, 4), dtype=np.uint8))
                with Image(context, source) as image:
                    alias = image.bind_texture()
                    agree = True
                    for writer, reader in ((source, alias), (alias, source)):
                        data = rng.integers(0, 256, (4, 8, 4), dtype=np.uint8)
                        write_texture(fmt, writer, data)
                        GL.glFinish()
                        agree = agree and np.array_equal(read_texture(fmt, reader, 8, 4), data)
                GL.glDeleteTextures([source, alias])
        finally:
            context.close()
        _sibling_verdicts[display._address] = bool(agree)
    return _sibling_verdicts[display._address]


# ---- GL texture helpers of the self-tests (and the conformance checks) ---------------------------------------------------------

def make_texture(fmt: TextureFormat, texels: np.ndarray) -> int:
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


def write_texture(fmt: TextureFormat, texture: int, texels: np.ndarray) -> None:
    """Replace the texels of level 0 of a 2D texture of the current context (glTexSubImage2D)."""
    GL = gl()
    with TextureBinding():
        GL.glBindTexture(GL.GL_TEXTURE_2D, texture)
        GL.glPixelStorei(GL.GL_UNPACK_ALIGNMENT, 1)
        GL.glTexSubImage2D(GL.GL_TEXTURE_2D, 0, 0, 0, texels.shape[1], texels.shape[0], fmt.gl_format, fmt.gl_type,
                           np.ascontiguousarray(texels))


def read_texture(fmt: TextureFormat, texture: int, width: int, height: int) -> np.ndarray:
    """The texels of level 0 of a 2D texture of the current context (glGetTexImage)."""
    GL = gl()
    out = np.empty((height, width, fmt.channels), fmt.dtype)
    with TextureBinding():
        GL.glBindTexture(GL.GL_TEXTURE_2D, texture)
        GL.glPixelStorei(GL.GL_PACK_ALIGNMENT, 1)
        GL.glGetTexImage(GL.GL_TEXTURE_2D, 0, fmt.gl_format, fmt.gl_type, out)
    return out

