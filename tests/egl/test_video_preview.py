"""samples/_video.py's GL preview renderer on any EGL (Mesa in CI): it draws a texture into its
framebuffer texel for texel, and reads back rows in the texture's order (row 0 = t 0), whole or a
region. On the GPU the same renderer draws the external texture of a GL topic subscriber."""
from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "samples"))
import _video as video  # noqa: E402

from ..conftest import gl_module  # noqa: E402


@pytest.mark.parametrize("size", [(64, 48), (333, 97)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_preview_draws_every_texel_and_reads_regions(display, size):
    GL = gl_module()
    width, height = size
    rng = np.random.default_rng(11)
    texels = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
    with display.create_context() as context:
        try:
            preview = video.GLPreview(width, height, external=False)
        except RuntimeError as exc:
            pytest.skip(f"no GLSL 1.30 here: {exc}")
        texture = GL.glGenTextures(1)
        GL.glBindTexture(GL.GL_TEXTURE_2D, texture)
        GL.glPixelStorei(GL.GL_UNPACK_ALIGNMENT, 1)
        GL.glTexImage2D(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA8, width, height, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, texels)
        for _ in range(2):  # the second round reuses every object
            preview.draw(texture)
            assert np.array_equal(preview.read(), texels)
            assert np.array_equal(preview.read(3, 5, 20, 7), texels[5:12, 3:23])
        GL.glDeleteTextures([texture])
        preview.delete()
        assert GL.glGetError() == GL.GL_NO_ERROR
        assert context.is_current
