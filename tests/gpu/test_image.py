"""EGLImage <-> CUDA on the NVIDIA display: the path decision, every texel in both directions,
a kernel writing through the surface object, repeated mapping, and leaks."""
from __future__ import annotations

import gc

import numpy as np
import pytest

import eglcuda
from eglcuda import ImagePath
from eglcuda.images.image import TEXTURE_FORMATS
from eglcuda.images.paths import make_texture, read_texture

from ..conftest import require_extension
from ..imagekit import float_image, random_texels
from .test_stream import open_fds

RGBA8 = TEXTURE_FORMATS[0x8058]
R8 = TEXTURE_FORMATS[0x8229]
RG8 = TEXTURE_FORMATS[0x822B]
R32F = TEXTURE_FORMATS[0x822E]

XOR_KERNELS = r"""
extern "C" __global__ void xor_rgba8(unsigned long long surface, const unsigned char *key, int width, int height) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x >= width || y >= height) return;
    uchar4 texel = surf2Dread<uchar4>(surface, x * 4, y);
    const unsigned char *k = key + (y * width + x) * 4;
    surf2Dwrite(make_uchar4(texel.x ^ k[0], texel.y ^ k[1], texel.z ^ k[2], texel.w ^ k[3]), surface, x * 4, y);
}
extern "C" __global__ void xor_r8(unsigned long long surface, const unsigned char *key, int width, int height) {
    int x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y;
    if (x >= width || y >= height) return;
    unsigned char texel = surf2Dread<unsigned char>(surface, x, y);
    surf2Dwrite((unsigned char)(texel ^ key[y * width + x]), surface, x, y);
}
"""


@pytest.fixture
def context(cuda_display):
    require_extension(cuda_display, "EGL_KHR_image_base", "EGL_KHR_gl_texture_2D_image")
    with cuda_display.create_context() as context:
        yield context


def test_path_decision_on_this_platform(cuda_display, context):
    choice = eglcuda.image_path(cuda_display)
    device = eglcuda.get_device(0)
    assert choice.path in (ImagePath.NATIVE, ImagePath.GL_INTEROP)
    if not device.info.integrated:
        # Measured on discrete GPUs (docs/platforms.md): native registration succeeds but does not alias.
        assert choice.native_coherent is False and choice.path == ImagePath.GL_INTEROP, choice
        assert choice.gl_interop_coherent is True
    assert eglcuda.image_path(cuda_display) is choice  # decided once per display and device
    assert "coherent" in choice.reason


def test_forcing_a_path_that_is_not_coherent_raises(cuda_display, context):
    choice = eglcuda.image_path(cuda_display)
    if choice.native_coherent:
        pytest.skip("the native path is coherent here")
    texture = make_texture(RGBA8, random_texels(np.random.default_rng(), RGBA8, 8, 8))
    with eglcuda.Image(context, texture) as image:
        with pytest.raises(eglcuda.NotCoherent, match="not coherent"):
            image.register_cuda(path="native")
        with pytest.raises(eglcuda.UsageError):
            image.register_cuda(path="fastest")


@pytest.mark.parametrize("fmt", [RGBA8, RG8, R8], ids=lambda f: f.name)
@pytest.mark.parametrize("size", [(1, 1), (7, 3), (64, 64), (300, 171), (1920, 1080)])
def test_both_directions_every_texel(context, fmt, size):
    from OpenGL import GL

    rng = np.random.default_rng()
    width, height = size
    texels = random_texels(rng, fmt, width, height)
    texture = make_texture(fmt, texels)
    with eglcuda.Image(context, texture) as image, image.register_cuda() as registration:
        # GL -> CUDA
        with registration.map() as mapped:
            assert mapped.layout is eglcuda.Layout.ARRAY and mapped.format == fmt
            np.testing.assert_array_equal(mapped.to_numpy(), texels)
            # CUDA -> GL
            written = random_texels(rng, fmt, width, height)
            mapped.copy_from(written)
        with context.current():
            np.testing.assert_array_equal(read_texture(fmt, texture, width, height), written)
            # GL writes again; CUDA must see the new texels at the next map.
            again = random_texels(rng, fmt, width, height)
            GL.glBindTexture(GL.GL_TEXTURE_2D, texture)
            GL.glPixelStorei(GL.GL_UNPACK_ALIGNMENT, 1)
            GL.glTexSubImage2D(GL.GL_TEXTURE_2D, 0, 0, 0, width, height, fmt.gl_format, fmt.gl_type, again)
        with registration.map() as mapped:
            np.testing.assert_array_equal(mapped.to_numpy(), again)
    with context.current():
        GL.glDeleteTextures([texture])


@pytest.mark.parametrize("fmt", [RGBA8, R8], ids=lambda f: f.name)
def test_kernel_rewrites_the_texture_through_the_surface(context, fmt):
    cp = pytest.importorskip("cupy")
    from OpenGL import GL

    rng = np.random.default_rng()
    width, height = 333, 77
    texels = random_texels(rng, fmt, width, height)
    key = random_texels(rng, fmt, width, height)
    texture = make_texture(fmt, texels)
    kernel = cp.RawModule(code=XOR_KERNELS).get_function("xor_rgba8" if fmt is RGBA8 else "xor_r8")
    stream = cp.cuda.Stream(non_blocking=True)
    with eglcuda.Image(context, texture) as image, image.register_cuda() as registration:
        with registration.map(cuda_stream=stream) as mapped:
            device_key = cp.asarray(key)
            with stream:
                kernel(((width + 127) // 128, height), (128,),
                       (cp.uint64(mapped.surface), device_key, np.int32(width), np.int32(height)))
        # unmap ordered the kernel before GL's read
        with context.current():
            np.testing.assert_array_equal(read_texture(fmt, texture, width, height), texels ^ key)
            GL.glDeleteTextures([texture])


def test_repeated_map_unmap_with_random_data(context):
    rng = np.random.default_rng()
    width, height = 130, 66
    texture = make_texture(RGBA8, random_texels(rng, RGBA8, width, height))
    with eglcuda.Image(context, texture) as image, image.register_cuda() as registration:
        for _ in range(50):
            data = random_texels(rng, RGBA8, width, height)
            with registration.map() as mapped:
                mapped.copy_from(data)
            with context.current():
                np.testing.assert_array_equal(read_texture(RGBA8, texture, width, height), data)
        assert registration.mapped is None
        mapped = registration.map()
        assert registration.mapped is mapped
        with pytest.raises(eglcuda.UsageError, match="already mapped"):
            registration.map()
        mapped.unmap()
        assert registration.mapped is None
        with pytest.raises(eglcuda.ClosedError):
            mapped.array
        with pytest.raises(eglcuda.ClosedError):
            mapped.unmap()
    assert registration.closed
    with pytest.raises(eglcuda.ClosedError):
        registration.map()


def test_a_view_dropped_without_unmap_is_found_through_the_registration(context):
    """A view dropped without unmap() still holds the mapping (a later map() is refused): the
    registration's ``mapped`` gives it back to unmap, and the next map() works with every texel."""
    from OpenGL import GL

    rng = np.random.default_rng()
    width, height = 34, 18
    texture = make_texture(RGBA8, random_texels(rng, RGBA8, width, height))
    with eglcuda.Image(context, texture) as image, image.register_cuda() as registration:
        registration.map()  # (dropped at once)
        gc.collect()
        with pytest.raises(eglcuda.UsageError, match="``mapped``"):
            registration.map()
        registration.mapped.unmap()
        data = random_texels(rng, RGBA8, width, height)
        with registration.map() as mapped:
            mapped.copy_from(data)
            assert np.array_equal(mapped.to_numpy(), data)
        with context.current():
            np.testing.assert_array_equal(read_texture(RGBA8, texture, width, height), data)
    with context.current():
        GL.glDeleteTextures([texture])


def test_gl_interop_needs_the_source_texture(cuda_display, context):
    from OpenGL import GL

    if eglcuda.image_path(cuda_display).path != ImagePath.GL_INTEROP:
        pytest.skip("the native path is used here")
    texture = make_texture(RGBA8, np.zeros((4, 4, 4), np.uint8))
    with eglcuda.Image(context, texture) as image:
        GL.glDeleteTextures([texture])
        with pytest.raises(eglcuda.UsageError, match="was deleted"):
            image.register_cuda()


def test_gl_interop_refuses_a_texture_that_took_the_deleted_ones_name(cuda_display, context):
    """The source texture deleted and its name given to a texture of another size: the GL-interop
    registration would map the new texture, so it is refused, as a deleted one is."""
    from OpenGL import GL

    if eglcuda.image_path(cuda_display).path != ImagePath.GL_INTEROP:
        pytest.skip("the native path is used here")
    texture = make_texture(RGBA8, np.zeros((4, 4, 4), np.uint8))
    with eglcuda.Image(context, texture) as image:
        GL.glDeleteTextures([texture])
        GL.glBindTexture(GL.GL_TEXTURE_2D, texture)  # (the name made a texture again, as glGenTextures may)
        GL.glTexImage2D(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA8, 8, 2, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, None)
        GL.glBindTexture(GL.GL_TEXTURE_2D, 0)
        assert GL.glIsTexture(texture)
        with pytest.raises(eglcuda.UsageError, match="name reused"):
            image.register_cuda()
    with context.current():
        GL.glDeleteTextures([texture])


def test_wrong_size_upload_is_refused(context):
    texture = make_texture(RGBA8, np.zeros((4, 5, 4), np.uint8))
    with eglcuda.Image(context, texture) as image, image.register_cuda() as registration:
        with registration.map() as mapped:
            with pytest.raises(eglcuda.UsageError, match="expected uint8"):
                mapped.copy_from(np.zeros((4, 4, 4), np.uint8))
            with pytest.raises(eglcuda.UsageError, match="expected uint8"):
                mapped.copy_from(np.zeros((4, 5, 4), np.float32))
            # The right number of texels in the wrong shape would land scrambled.
            for shape in ((5, 4, 4), (4 * 5 * 4,)):
                with pytest.raises(eglcuda.UsageError, match="expected uint8"):
                    mapped.copy_from(np.zeros(shape, np.uint8))


def test_image_close_unregisters_first(context):
    texture = make_texture(RGBA8, np.zeros((4, 4, 4), np.uint8))
    image = eglcuda.Image(context, texture)
    registration = image.register_cuda()
    mapped = registration.map()
    image.close()
    assert registration.closed
    with pytest.raises(eglcuda.ClosedError):
        mapped.array


def test_create_register_close_cycles_do_not_leak(context):
    rng = np.random.default_rng()
    device = eglcuda.get_device(0)
    texture = make_texture(RGBA8, random_texels(rng, RGBA8, 256, 256))

    def cycle():
        with eglcuda.Image(context, texture) as image, image.register_cuda() as registration:
            with registration.map() as mapped:
                mapped.surface

    for _ in range(50):
        cycle()
    free_before, fds_before = device.memory_info()[0], open_fds()
    for _ in range(1000):
        cycle()
    free_after, fds_after = device.memory_info()[0], open_fds()
    assert fds_after - fds_before <= 2
    assert free_before - free_after < 16 << 20

    def dropped():  # never closed: garbage collection releases image and registration
        image = eglcuda.Image(context, texture)
        image.register_cuda()

    import gc

    for _ in range(300):
        dropped()
    gc.collect()
    assert device.memory_info()[0] > free_before - (16 << 20)
    assert open_fds() - fds_before <= 2


def test_float_texture_reads_through_cuda_where_the_driver_makes_its_image(context):
    image, texels = float_image(context, 13, 6)
    if image is not None:
        with image, image.register_cuda() as registration, registration.map() as mapped:
            np.testing.assert_array_equal(mapped.to_numpy(), texels)
