"""GL endpoints on EGLStreams: CUDA -> GL external texture and GL surface -> CUDA, every texel,
plus misuse. Orientation and channel order are asserted as docs/streams.md states them; on a
mismatch the message names the layout that would have matched."""
from __future__ import annotations

import itertools
import time

import numpy as np
import pytest

import eglcuda
from eglcuda import ColorFormat

from ..conftest import require_extension
from .streamkit import fill_random

# Memory order of an ARGB frame is B, G, R, A: this picks R, G, B, A out of it.
BGRA_TO_RGBA = [2, 1, 0, 3]


@pytest.fixture
def display(cuda_display):
    require_extension(cuda_display, "EGL_KHR_stream", "EGL_KHR_stream_consumer_gltexture",
                      "EGL_KHR_stream_producer_eglsurface")
    return cuda_display


def best_layout(got: np.ndarray, frame_bytes: np.ndarray) -> str:
    """Which channel order and row order would have matched (for the failure message)."""
    best = (-1, "")
    for perm in itertools.permutations(range(4)):
        for flip in (False, True):
            candidate = frame_bytes[::-1] if flip else frame_bytes
            score = int(np.count_nonzero(got == candidate[..., list(perm)]))
            best = max(best, (score, f"channels {list(perm)}, rows {'flipped' if flip else 'in order'}"))
    return f"{best[1]} matches {best[0]} of {got.size} bytes"


@pytest.mark.parametrize("api", ["opengl", "gles"])
@pytest.mark.parametrize("size", [(640, 480), (333, 97)], ids=lambda s: f"{s[0]}x{s[1]}")
def test_cuda_to_gl_every_texel(display, api, size):
    width, height = size
    rng = np.random.default_rng()
    with display.create_context(api=api) as context, display.create_stream(fifo_length=1) as stream:
        consumer = stream.connect_gl_consumer(context)
        producer = stream.connect_cuda_producer(width, height, format=ColorFormat.ARGB)
        frames = [producer.allocate_frame() for _ in range(3)]
        numbers = []
        for round_ in range(8):
            frame = frames[round_] if round_ < 3 else producer.return_frame(timeout_us=2_000_000)
            assert frame is not None
            expected = fill_random(frame, rng)[0]
            producer.present(frame)
            with consumer.acquire(timeout_us=2_000_000) as latched:
                assert latched.is_new
                numbers.append(latched.number)
                got = latched.read(width, height)
            want = expected[..., BGRA_TO_RGBA]
            assert np.array_equal(got, want), best_layout(got, expected)
        assert numbers == list(range(1, 9))
        consumer.close()


def test_gl_to_cuda_every_texel(display):
    from OpenGL import GL

    width, height = 640, 360
    rng = np.random.default_rng()
    with display.create_stream() as stream:
        consumer = stream.connect_cuda_consumer()
        producer = stream.connect_gl_producer(width, height)
        producer.make_current()
        source = GL.glGenTextures(1)
        GL.glBindTexture(GL.GL_TEXTURE_2D, source)
        GL.glTexImage2D(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA8, width, height, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, None)
        framebuffer = GL.glGenFramebuffers(1)
        GL.glBindFramebuffer(GL.GL_READ_FRAMEBUFFER, framebuffer)
        GL.glFramebufferTexture2D(GL.GL_READ_FRAMEBUFFER, GL.GL_COLOR_ATTACHMENT0, GL.GL_TEXTURE_2D, source, 0)
        for _ in range(6):
            texels = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)  # row 0 = GL's bottom row
            GL.glPixelStorei(GL.GL_UNPACK_ALIGNMENT, 1)
            GL.glTexSubImage2D(GL.GL_TEXTURE_2D, 0, 0, 0, width, height, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, texels)
            GL.glBindFramebuffer(GL.GL_DRAW_FRAMEBUFFER, 0)  # the stream's surface
            GL.glBlitFramebuffer(0, 0, width, height, 0, 0, width, height, GL.GL_COLOR_BUFFER_BIT, GL.GL_NEAREST)
            assert GL.glGetError() == GL.GL_NO_ERROR
            producer.swap()
            with consumer.acquire(timeout_us=2_000_000) as frame:
                assert frame.is_new
                assert (frame.width, frame.height) == (width, height)
                told = frame.format
                got = frame.to_numpy()[0]
            assert told in (ColorFormat.ARGB, ColorFormat.ABGR), told
            order = BGRA_TO_RGBA if told is ColorFormat.ARGB else [0, 1, 2, 3]
            assert np.array_equal(got[..., order], texels), best_layout(texels, got)
        producer.close()


def test_misuse(display):
    from OpenGL import GL

    with display.create_stream() as stream:
        with pytest.raises(eglcuda.UsageError, match="current"):
            stream.connect_gl_consumer(eglcuda.GLContext(display))  # made, never current
        with display.create_context() as context:
            flat = GL.glGenTextures(1)
            GL.glBindTexture(GL.GL_TEXTURE_2D, flat)  # a 2D texture now: not an external one
            with pytest.raises(eglcuda.UsageError, match="GL_TEXTURE_EXTERNAL_OES"):
                stream.connect_gl_consumer(context, texture=flat)
            consumer = stream.connect_gl_consumer(context)
            with pytest.raises(eglcuda.Timeout):  # no producer yet
                consumer.acquire(timeout_us=100_000)
            producer = stream.connect_cuda_producer(64, 32)
            frame = producer.allocate_frame()
            producer.present(frame)
            latched = consumer.acquire()
            with pytest.raises(eglcuda.UsageError, match="still holds"):
                consumer.acquire()
            latched.release()
            with pytest.raises(eglcuda.ClosedError):
                latched.release()
            with pytest.raises(eglcuda.ClosedError):
                latched.read(64, 32)
            with pytest.raises(eglcuda.UsageError, match="already has a consumer"):
                stream.connect_gl_consumer(context)
            consumer.close()

    # A GL producer whose consumer left: swap raises, at once.
    with display.create_stream() as stream:
        consumer = stream.connect_cuda_consumer()
        producer = stream.connect_gl_producer(32, 32)
        with pytest.raises(eglcuda.UsageError, match="make_current"):
            producer.swap()
        producer.make_current()
        GL.glClearColor(0.25, 0.5, 0.75, 1.0)
        GL.glClear(GL.GL_COLOR_BUFFER_BIT)
        producer.swap()
        consumer.acquire(timeout_us=2_000_000).release()
        consumer.close()
        started = time.monotonic()
        with pytest.raises((eglcuda.StreamDisconnected, eglcuda.EGLError)):
            for _ in range(3):
                producer.swap()
        assert time.monotonic() - started < 5
    with display.create_stream() as stream:
        with pytest.raises(eglcuda.UsageError, match="consumer first"):
            stream.connect_gl_producer(32, 32)
