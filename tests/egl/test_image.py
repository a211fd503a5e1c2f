"""EGLImage from a GL texture on any EGL (Mesa in CI): aliasing through a second texture, the
image outliving its texture, bad input, and 1,000 create/close cycles."""
from __future__ import annotations


import numpy as np
import pytest

import eglcuda
from eglcuda.images.image import TEXTURE_FORMATS
from eglcuda.images.paths import make_texture, read_texture, write_texture

from ..conftest import gl_module, require_extension
from ..forking import answers_in_forked_child
from ..imagekit import float_image, random_texels
from .test_leaks import grows

RGBA8 = TEXTURE_FORMATS[0x8058]
R8 = TEXTURE_FORMATS[0x8229]
RG8 = TEXTURE_FORMATS[0x822B]
R32F = TEXTURE_FORMATS[0x822E]


@pytest.fixture
def image_context(display):
    require_extension(display, "EGL_KHR_image_base", "EGL_KHR_gl_texture_2D_image")
    gl_module()
    with display.create_context() as context:
        yield context


@pytest.mark.parametrize("fmt", [RGBA8, RG8, R8], ids=lambda f: f.name)
@pytest.mark.parametrize("size", [(1, 1), (7, 5), (64, 64), (250, 33)])
def test_second_texture_bound_to_the_image_sees_every_texel(display, image_context, fmt, size):
    GL = gl_module()

    rng = np.random.default_rng()
    width, height = size
    texels = random_texels(rng, fmt, width, height)
    texture = make_texture(fmt, texels)
    shared = eglcuda.siblings_alias(display)
    if "Mesa" in display.vendor:
        assert shared  # Mesa's siblings share storage; NVIDIA driver 580 copies at bind
    image_context.make_current()
    with eglcuda.Image(image_context, texture) as image:
        assert (image.width, image.height, image.format) == (width, height, fmt)
        alias = image.bind_texture()
        assert alias != texture
        np.testing.assert_array_equal(read_texture(fmt, alias, width, height), texels)
        # A later write through the sibling reaches the source exactly when the self-test says
        # siblings share storage on this display.
        update = random_texels(rng, fmt, width, height)
        write_texture(fmt, alias, update)
        GL.glFinish()
        assert np.array_equal(read_texture(fmt, texture, width, height), update) == shared
        update = random_texels(rng, fmt, width, height)
        write_texture(fmt, texture, update)
        GL.glFinish()
        assert np.array_equal(read_texture(fmt, alias, width, height), update) == shared
        GL.glDeleteTextures([alias, texture])


def test_image_outlives_its_texture_and_can_be_rebound(image_context):
    GL = gl_module()

    rng = np.random.default_rng()
    texels = random_texels(rng, RGBA8, 9, 4)
    texture = make_texture(RGBA8, texels)
    image = eglcuda.Image(image_context, texture)
    GL.glDeleteTextures([texture])
    again = image.bind_texture()
    np.testing.assert_array_equal(read_texture(RGBA8, again, 9, 4), texels)
    GL.glDeleteTextures([again])
    image.close()
    image.close()  # twice is fine
    assert image.closed


def test_bad_textures_are_refused_before_egl(image_context):
    GL = gl_module()

    for bad in (0, -3, 1.5, "1", None, True):
        with pytest.raises(eglcuda.UsageError):
            eglcuda.Image(image_context, bad)
    with pytest.raises(eglcuda.UsageError, match="not a texture"):
        eglcuda.Image(image_context, 987654)
    texture = make_texture(RGBA8, np.zeros((2, 2, 4), np.uint8))
    GL.glDeleteTextures([texture])
    with pytest.raises(eglcuda.UsageError, match="not a texture"):
        eglcuda.Image(image_context, texture)
    empty = int(GL.glGenTextures(1))
    GL.glBindTexture(GL.GL_TEXTURE_2D, empty)
    with pytest.raises(eglcuda.UsageError, match="no storage"):
        eglcuda.Image(image_context, empty)
    with pytest.raises(eglcuda.UsageError):
        eglcuda.Image(image_context, 1, level=-1)
    with pytest.raises(eglcuda.UsageError):
        eglcuda.Image("not a context", 1)
    with pytest.raises(eglcuda.UsageError, match="2\\*\\*32"):
        eglcuda.Image(image_context, 2**32 + 1)  # a GLuint would wrap it to texture 1


def test_texture_names_as_pyopengl_returns_them_are_taken(image_context):
    """PyOpenGL's glGenTextures(1) returns a numpy.uint32: such a name made an Image (and a
    bind_texture) fail with "texture must be a GL texture name"."""
    GL = gl_module()

    texels = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
    source = make_texture(RGBA8, texels)
    generated = GL.glGenTextures(1)  # whatever type this PyOpenGL gives
    with eglcuda.Image(image_context, np.uint32(source)) as image:
        assert type(image.texture) is int and image.texture == source
        alias = image.bind_texture(texture=generated)
        assert type(alias) is int and alias == int(generated)
        np.testing.assert_array_equal(read_texture(RGBA8, alias, 3, 2), texels)
    with pytest.raises(eglcuda.UsageError, match="texture name"):
        eglcuda.Image(image_context, np.float32(source))
    GL.glDeleteTextures([source, alias])


def test_levels_past_the_texture_are_refused(image_context):
    texture = make_texture(RGBA8, np.ones((2, 2, 4), np.uint8))
    for level in (1, 20):  # no storage there; 20 is past any context's mipmap chain (a GL error)
        with pytest.raises(eglcuda.UsageError, match="no storage at level"):
            eglcuda.Image(image_context, texture, level=level)
    for level in (32, 2**40, True, np.int64(-1), 0.0):
        with pytest.raises(eglcuda.UsageError, match="mipmap level"):
            eglcuda.Image(image_context, texture, level=level)
    with eglcuda.Image(image_context, texture, level=np.int64(0)) as image:  # a NumPy integer is an integer
        assert image.level == 0 and type(image.level) is int


def test_bind_texture_refuses_names_a_gluint_cannot_hold(image_context):
    GL = gl_module()

    source = make_texture(RGBA8, np.full((2, 2, 4), 9, np.uint8))
    bystander = make_texture(RGBA8, np.full((4, 8, 4), 7, np.uint8))
    with eglcuda.Image(image_context, source) as image:
        with pytest.raises(eglcuda.UsageError, match="2\\*\\*32"):
            image.bind_texture(texture=2**32 + bystander)  # would wrap to the bystander
    GL.glBindTexture(GL.GL_TEXTURE_2D, bystander)
    assert int(GL.glGetTexLevelParameteriv(GL.GL_TEXTURE_2D, 0, GL.GL_TEXTURE_WIDTH)) == 8  # untouched


def test_bind_texture_refuses_what_is_not_a_context(image_context):
    """bind_texture(context=...) with something other than a GLContext was an AttributeError
    ('str' object has no attribute 'display')."""
    texture = make_texture(RGBA8, np.ones((2, 2, 4), np.uint8))
    with eglcuda.Image(image_context, texture) as image:
        for bad in ("context", 1, image_context.display):
            with pytest.raises(eglcuda.UsageError, match="GLContext"):
                image.bind_texture(context=bad)


def test_bind_texture_deletes_the_texture_it_made_when_the_bind_fails(image_context, monkeypatch):
    """A bind_texture() that made its own texture and then failed (the driver refusing
    glEGLImageTargetTexture2DOES) left that texture behind: the caller never got its name."""
    GL = gl_module()
    from eglcuda.images import image as image_module

    texture = make_texture(RGBA8, np.ones((2, 2, 4), np.uint8))
    made = []

    def refuse(handle):
        made.append(int(np.asarray(GL.glGetIntegerv(GL.GL_TEXTURE_BINDING_2D)).ravel()[0]))
        raise eglcuda.EGLError(0x300C, "glEGLImageTargetTexture2DOES", "injected")

    with eglcuda.Image(image_context, texture) as image:
        monkeypatch.setattr(image_module.egl_image, "target_texture_2d", refuse)
        with pytest.raises(eglcuda.EGLError, match="injected"):
            image.bind_texture()
        assert made and made[0] not in (0, texture)
        with image_context.current():
            assert not GL.glIsTexture(made[0])  # deleted
            assert GL.glIsTexture(texture)  # the caller's own stays
            given = int(GL.glGenTextures(1))
        with pytest.raises(eglcuda.EGLError, match="injected"):
            image.bind_texture(texture=given)
        with image_context.current():
            assert GL.glIsTexture(given)  # a texture the caller gave is the caller's to delete
            GL.glDeleteTextures([given, texture])


def test_texture_of_another_context_is_refused(display, image_context):
    texture = make_texture(RGBA8, np.ones((2, 2, 4), np.uint8))
    with display.create_context() as other:  # not sharing with image_context
        with pytest.raises(eglcuda.UsageError, match="not a texture"):
            eglcuda.Image(other, texture + 1000)
    image_context.make_current()


def test_non_2d_texture_is_refused(image_context):
    GL = gl_module()

    cube = int(GL.glGenTextures(1))
    GL.glBindTexture(GL.GL_TEXTURE_CUBE_MAP, cube)
    with pytest.raises(eglcuda.UsageError, match="not a 2D texture"):
        eglcuda.Image(image_context, cube)
    GL.glDeleteTextures([cube])


def test_closed_objects(display):
    require_extension(display, "EGL_KHR_image_base", "EGL_KHR_gl_texture_2D_image")
    gl_module()  # make_texture's GL calls
    context = display.create_context()
    context.make_current()
    texture = make_texture(RGBA8, np.ones((2, 2, 4), np.uint8))
    assert texture > 0
    image = eglcuda.Image(context, texture)
    display.close()  # closes children: the image and the context
    assert image.closed and context.closed
    with pytest.raises(eglcuda.ClosedError):
        image.handle
    with pytest.raises(eglcuda.ClosedError):
        image.bind_texture()
    with pytest.raises(eglcuda.ClosedError):
        eglcuda.Image(context, texture)


def test_the_self_tests_keep_the_current_context_and_give_a_closed_display_no_verdict(egl_device):
    """siblings_alias() tested in a context of its own and left none current: the caller's next
    GL call went nowhere (glGenTextures gave 0). image_path() of a closed display answered "no
    path" and kept that answer for the display's address, which the next display of the device
    gets: register_cuda(path="auto") then failed on it for good."""
    GL = gl_module()
    from eglcuda._bind import egl

    with eglcuda.Display.for_device(egl_device) as display:
        require_extension(display, "EGL_KHR_image_base", "EGL_KHR_gl_texture_2D_image")
        eglcuda.images.paths._sibling_verdicts.pop(display._address, None)  # (a first call: the test runs)
        with display.create_context() as context:
            before = egl.current()
            eglcuda.siblings_alias(display)
            assert egl.current() == before
            texture = int(GL.glGenTextures(1))
            assert texture > 0
            GL.glDeleteTextures([texture])
        for query in (eglcuda.siblings_alias, eglcuda.image_path):
            with pytest.raises(eglcuda.UsageError, match="takes an eglcuda.Display, got str"):
                query("display")
    for query in (eglcuda.siblings_alias, eglcuda.image_path):
        with pytest.raises(eglcuda.ClosedError):
            query(display)
    with eglcuda.Display.for_device(egl_device) as other, pytest.raises(eglcuda.UsageError, match="refresh"):
        eglcuda.image_path(other, refresh="yes")


def test_closing_the_context_closes_its_images(display):
    require_extension(display, "EGL_KHR_image_base", "EGL_KHR_gl_texture_2D_image")
    gl_module()  # make_texture's GL calls
    context = display.create_context()
    context.make_current()
    # One image per texture: NVIDIA's EGL refuses a second EGLImage of a texture (EGL_BAD_ACCESS).
    images = [eglcuda.Image(context, make_texture(RGBA8, np.ones((2, 2, 4), np.uint8))) for _ in range(3)]
    context.close()  # the images first (and what CUDA registered from them), then the context
    assert context.closed and all(image.closed for image in images)
    assert not display.closed


def test_gl_errors_of_eglcuda_calls_are_gl_errors(image_context):
    GL = gl_module()

    from eglcuda._bind import gl as gl_binding
    from eglcuda._bind._native import ffi, lib

    texture = make_texture(RGBA8, np.ones((2, 2, 4), np.uint8))
    with eglcuda.Image(image_context, texture) as image:
        alias = image.bind_texture()  # binds GL_OES_EGL_image's function
        gl_binding.clear_errors()
        gl_binding.check("nothing")  # nothing flagged: no exception
        # A target GL_OES_EGL_image does not take: GL_INVALID_ENUM, flagged for glGetError.
        lib.glEGLImageTargetTexture2DOES(0x1234, ffi.cast("GLeglImageOES", image.handle))
        with pytest.raises(eglcuda.GLError) as info:
            gl_binding.check("glEGLImageTargetTexture2DOES", "binding to no target")
    assert info.value.name == "GL_INVALID_ENUM" and info.value.call == "glEGLImageTargetTexture2DOES"
    assert str(info.value).endswith("while binding to no target")
    GL.glDeleteTextures([alias, texture])


def test_unsupported_format_has_no_cuda_view_but_an_image(image_context):
    GL = gl_module()

    texture = int(GL.glGenTextures(1))
    GL.glBindTexture(GL.GL_TEXTURE_2D, texture)
    GL.glTexImage2D(GL.GL_TEXTURE_2D, 0, GL.GL_RGB565, 4, 4, 0, GL.GL_RGB, GL.GL_UNSIGNED_SHORT_5_6_5, None)
    with eglcuda.Image(image_context, texture) as image:
        assert image.format is None
        with pytest.raises(eglcuda.UsageError, match="no CUDA view"):
            image.register_cuda(device=0)
    GL.glDeleteTextures([texture])


def test_image_create_close_is_flat(image_context):
    GL = gl_module()

    texture = make_texture(RGBA8, np.ones((16, 16, 4), np.uint8))

    def cycle():
        image = eglcuda.Image(image_context, texture)
        alias = image.bind_texture()
        GL.glDeleteTextures([alias])
        image.close()

    assert grows(cycle) < 8 << 20

    def dropped():
        eglcuda.Image(image_context, texture)  # never closed: garbage collection destroys it

    assert grows(dropped, warmup=20, cycles=300) < 8 << 20
    GL.glDeleteTextures([texture])


def test_float_texture_works_or_the_driver_refusal_is_named(image_context):
    image, texels = float_image(image_context, 13, 6)
    if image is not None:
        with image:
            alias = image.bind_texture()
            np.testing.assert_array_equal(read_texture(R32F, alias, 13, 6), texels)


def test_a_forked_child_is_told_its_images_are_the_parents(image_context):
    """In a child made by fork(), an image the parent made said "the image is closed (or its
    display is)", and a new Image "the GL context is closed": nothing was closed, the objects
    are the parent's. Both now name the fork; the parent goes on with the image."""
    texture = make_texture(RGBA8, np.ones((2, 2, 4), np.uint8))
    image = eglcuda.Image(image_context, texture)
    answers = answers_in_forked_child(
        (lambda: image.handle, image.bind_texture, image.finish_gl, image.register_cuda,
         lambda: eglcuda.Image(image_context, texture)), eglcuda.ClosedError, "forked")
    assert answers == ["fork"] * 5, answers
    alias = image.bind_texture()
    image.close()
    gl_module().glDeleteTextures([alias, texture])
