"""Helpers of the EGLImage tests of the EGL and GPU tiers."""
from __future__ import annotations

import numpy as np

import eglcuda
from eglcuda.images.image import TEXTURE_FORMATS, TextureFormat
from eglcuda.images.paths import make_texture

R32F = TEXTURE_FORMATS[0x822E]


def random_texels(rng: np.random.Generator, fmt: TextureFormat, width: int, height: int) -> np.ndarray:
    if fmt.dtype == "uint8":
        return rng.integers(0, 256, (height, width, fmt.channels), dtype=np.uint8)
    return rng.standard_normal((height, width, fmt.channels)).astype(fmt.dtype)


def float_image(context: eglcuda.GLContext, width: int, height: int) -> tuple[eglcuda.Image | None, np.ndarray]:
    """An EGLImage of a new R32F texture of random texels (current context), and the texels; the
    image is None where the driver refuses to make it, after checking that the refusal is the
    named one (NVIDIA driver 580: EGL_BAD_PARAMETER; Mesa makes it)."""
    texels = random_texels(np.random.default_rng(), R32F, width, height)
    texture = make_texture(R32F, texels)
    try:
        image = eglcuda.Image(context, texture)
    except eglcuda.EGLError as exc:
        assert exc.call == "eglCreateImageKHR" and exc.name == "EGL_BAD_PARAMETER"
        return None, texels
    assert image.format == R32F
    return image, texels
