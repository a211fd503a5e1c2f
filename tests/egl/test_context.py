"""Headless GL contexts, driven through PyOpenGL, checked on every texel."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import eglcuda
from eglcuda._bind import egl

from ..conftest import gl_module

GL = gl_module(module_level=True)


def make_fbo(width: int, height: int, texels: np.ndarray):
    texture = GL.glGenTextures(1)
    GL.glBindTexture(GL.GL_TEXTURE_2D, texture)
    GL.glTexParameteri(GL.GL_TEXTURE_2D, GL.GL_TEXTURE_MIN_FILTER, GL.GL_NEAREST)
    GL.glPixelStorei(GL.GL_UNPACK_ALIGNMENT, 1)
    GL.glPixelStorei(GL.GL_PACK_ALIGNMENT, 1)
    GL.glTexImage2D(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA8, width, height, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, texels)
    fbo = GL.glGenFramebuffers(1)
    GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, fbo)
    GL.glFramebufferTexture2D(GL.GL_FRAMEBUFFER, GL.GL_COLOR_ATTACHMENT0, GL.GL_TEXTURE_2D, texture, 0)
    assert GL.glCheckFramebufferStatus(GL.GL_FRAMEBUFFER) == GL.GL_FRAMEBUFFER_COMPLETE
    return texture, fbo


def read_rgba(width: int, height: int) -> np.ndarray:
    data = GL.glReadPixels(0, 0, width, height, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE)
    return np.frombuffer(data, np.uint8).reshape(height, width, 4)


@pytest.mark.parametrize("surfaceless", [True, False])
def test_pyopengl_draws_into_the_context(display, surfaceless):
    if surfaceless and not display.supports("EGL_KHR_surfaceless_context"):
        pytest.skip("EGL_KHR_surfaceless_context missing")
    rng = np.random.default_rng()
    width, height = 37, 23  # not powers of two, odd
    texels = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
    with display.create_context(surfaceless=surfaceless) as context:
        assert context.is_current and context.surfaceless is surfaceless
        assert GL.glGetString(GL.GL_VERSION)
        texture, fbo = make_fbo(width, height, texels)
        np.testing.assert_array_equal(read_rgba(width, height), texels)

        # Draw: clear a random rectangle to a random colour; every texel in and out is checked.
        x0, y0 = int(rng.integers(0, width - 5)), int(rng.integers(0, height - 5))
        w, h = int(rng.integers(1, width - x0)), int(rng.integers(1, height - y0))
        colour = rng.integers(0, 256, 4, dtype=np.uint8)
        GL.glEnable(GL.GL_SCISSOR_TEST)
        GL.glScissor(x0, y0, w, h)
        GL.glClearColor(*(colour / 255.0))
        GL.glClear(GL.GL_COLOR_BUFFER_BIT)
        GL.glDisable(GL.GL_SCISSOR_TEST)
        expected = texels.copy()
        expected[y0:y0 + h, x0:x0 + w] = colour
        np.testing.assert_array_equal(read_rgba(width, height), expected)
        GL.glDeleteFramebuffers(1, [fbo])
        GL.glDeleteTextures([texture])
    assert context.closed
    assert egl.current_context() == 0


def test_current_restores_previous(display):
    outer = display.create_context()
    inner = display.create_context()
    try:
        with outer.current():
            with inner.current():
                assert inner.is_current and not outer.is_current
            assert outer.is_current
        assert not outer.is_current
    finally:
        inner.close()
        outer.close()


def test_release_and_make_current_on_another_thread(display):
    context = display.create_context()
    context.make_current()
    context.release()
    assert not context.is_current
    seen = {}

    def worker():
        context.make_current()
        seen["version"] = GL.glGetString(GL.GL_VERSION)
        seen["current"] = context.is_current
        context.release()

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(30)
    assert seen.get("current") is True and seen.get("version")
    context.close()


def test_version_and_profile(display):
    with display.create_context(version=(3, 3), profile="core") as context:
        major = GL.glGetIntegerv(GL.GL_MAJOR_VERSION)
        minor = GL.glGetIntegerv(GL.GL_MINOR_VERSION)
        assert (int(major), int(minor)) >= (3, 3)
        assert GL.glGetIntegerv(GL.GL_CONTEXT_PROFILE_MASK) & GL.GL_CONTEXT_CORE_PROFILE_BIT
        assert context.is_current


@pytest.mark.parametrize(
    "options",
    [{"api": "vulkan"}, {"version": (3,)}, {"version": (3, -1)}, {"profile": "core"},
     {"profile": "legacy", "version": (3, 3)}, {"pbuffer_size": (0, 4)}, {"api": "gles", "profile": "core", "version": (3, 0)},
     {"version": 3}, {"version": (2**40, 0)}, {"version": (True, False)}, {"api": ["opengl"]},
     {"profile": ["core"], "version": (3, 3)}, {"surface_type": "pbuffer"},
     {"pbuffer_size": 16}, {"pbuffer_size": ("a", "b")},
     {"pbuffer_size": (16.5, 16), "surfaceless": False}, {"pbuffer_size": (2**40, 16), "surfaceless": False},
     {"surfaceless": "no"}, {"surfaceless": 0}],
)
def test_bad_options_raise_before_egl(display, options):
    with pytest.raises(eglcuda.UsageError):
        display.create_context(**options)


def test_a_pbuffer_that_fails_destroys_the_context_made_for_it(display, monkeypatch):
    """A pbuffer size EGL's ints cannot hold (16.5, 2**40) raised a bare TypeError or
    OverflowError from the pbuffer call, after the context was made, and that context was never
    destroyed (about 2 MiB each on Mesa). Sizes are checked first now; and whatever a failed
    pbuffer raises, the context goes with it."""
    made, destroyed = [], []
    create_context, destroy_context = egl.create_context, egl.destroy_context
    monkeypatch.setattr(egl, "create_context", lambda *args: made.append(create_context(*args)) or made[-1])
    monkeypatch.setattr(egl, "destroy_context", lambda dpy, ctx: destroyed.append(ctx) or destroy_context(dpy, ctx))
    for size in ((16.5, 16), (2**40, 16)):
        with pytest.raises(eglcuda.UsageError, match="pbuffer_size"):
            display.create_context(surfaceless=False, pbuffer_size=size)
    assert made == []

    def refused(*args):
        raise RuntimeError("refused")

    monkeypatch.setattr(egl, "create_pbuffer_surface", refused)
    with pytest.raises(RuntimeError, match="refused"):
        display.create_context(surfaceless=False)
    assert len(made) == 1 and destroyed == made


def test_gles_context(display):
    if "OpenGL_ES" not in display.client_apis:
        pytest.skip("display offers no OpenGL ES")
    with display.create_context(api="gles") as context:
        assert context.is_current


def test_closed_context_raises(display):
    context = display.create_context()
    context.close()
    context.close()
    with pytest.raises(eglcuda.ClosedError):
        context.make_current()
    with pytest.raises(eglcuda.ClosedError):
        context.handle
