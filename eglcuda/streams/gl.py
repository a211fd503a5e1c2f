"""OpenGL endpoints of an EGLStream (sections 4.1 and 4.1.6 of NVIDIA's guide).

- :class:`GLTextureConsumer` (``EGL_KHR_stream_consumer_gltexture``): frames arrive in an
  external texture (``GL_TEXTURE_EXTERNAL_OES``) of a GL context; :meth:`GLFrame.read` draws it
  into an RGBA8 framebuffer and reads the texels back.
- :class:`GLSurfaceProducer` (``EGL_KHR_stream_producer_eglsurface``): an EGL surface whose
  buffer swaps present frames; render with GL while :meth:`GLSurfaceProducer.current`.

Orientation and channels, as measured on NVIDIA's driver (tests/gpu/test_glstream.py):
:meth:`GLFrame.read` returns rows in the frame's memory order (row 0 first) and RGBA channels;
a GL producer's frame arrives in CUDA as an ``ARGB`` CUDA array (memory order B, G, R, A) with
row 0 holding GL's bottom row (window y = 0).
"""
from __future__ import annotations

import operator
import threading
from typing import NoReturn

import numpy as np

from ..context import GLContext
from .._integers import as_int
from .._resource import Resource
from .._bind import egl_stream
from .._bind.egl import egl_error
from ..errors import ClosedError, EGLError, StreamDisconnected, Timeout, UsageError
from ..frames.formats import MAX_DIMENSION
from .._bind.gl import accepted as gl_accepted, check as gl_check, clear_errors as clear_gl_errors, gl
from .stream import Stream, StreamState, check_microseconds

GL_TEXTURE_EXTERNAL_OES = 0x8D65
GL_TEXTURE_BINDING_EXTERNAL_OES = 0x8D67

_VERTEX_ES = """#version 100
attribute vec2 corner;
varying vec2 uv;
void main() { uv = corner * 0.5 + 0.5; gl_Position = vec4(corner, 0.0, 1.0); }
"""
_FRAGMENT_ES = """#version 100
#extension GL_OES_EGL_image_external : require
precision highp float;
uniform samplerExternalOES frame;
varying vec2 uv;
void main() { gl_FragColor = texture2D(frame, uv); }
"""
# Desktop GL: GLSL 1.30 accepts the same extension on NVIDIA.
_VERTEX_GL = "#version 130\nin vec2 corner;\nout vec2 uv;\n" \
             "void main() { uv = corner * 0.5 + 0.5; gl_Position = vec4(corner, 0.0, 1.0); }\n"
_FRAGMENT_GL = "#version 130\n#extension GL_OES_EGL_image_external : require\nuniform samplerExternalOES frame;\n" \
               "in vec2 uv;\nout vec4 color;\nvoid main() { color = texture2D(frame, uv); }\n"


def _current_context(context: GLContext | None) -> GLContext:
    if context is None:
        raise UsageError("a GL endpoint needs the GLContext it works in")
    if not isinstance(context, GLContext):
        raise UsageError(f"context must be an eglcuda.GLContext, got {type(context).__name__}")
    if not context.is_current:
        raise UsageError("make the GL context current on this thread first (context.make_current() "
                         "or `with context:`): EGL attaches the stream to the current context's texture")
    return context


class _Reader:
    """Draws an external texture into an RGBA8 framebuffer and reads it (one per consumer)."""

    def __init__(self, es: bool) -> None:
        GL = gl()
        self.program = GL.glCreateProgram()
        for kind, source in ((GL.GL_VERTEX_SHADER, _VERTEX_ES if es else _VERTEX_GL),
                             (GL.GL_FRAGMENT_SHADER, _FRAGMENT_ES if es else _FRAGMENT_GL)):
            shader = GL.glCreateShader(kind)
            GL.glShaderSource(shader, source)
            GL.glCompileShader(shader)
            if not GL.glGetShaderiv(shader, GL.GL_COMPILE_STATUS):
                log = GL.glGetShaderInfoLog(shader)
                raise UsageError(f"the external-texture shader did not compile here: {log!r}")
            GL.glAttachShader(self.program, shader)
            GL.glDeleteShader(shader)
        GL.glBindAttribLocation(self.program, 0, "corner")
        GL.glLinkProgram(self.program)
        if not GL.glGetProgramiv(self.program, GL.GL_LINK_STATUS):
            raise UsageError(f"the external-texture program did not link: {GL.glGetProgramInfoLog(self.program)!r}")
        self.buffer = GL.glGenBuffers(1)
        GL.glBindBuffer(GL.GL_ARRAY_BUFFER, self.buffer)
        corners = np.array([-1, -1, 1, -1, -1, 1, 1, 1], np.float32)
        GL.glBufferData(GL.GL_ARRAY_BUFFER, corners.nbytes, corners, GL.GL_STATIC_DRAW)
        self.vertex_array = GL.glGenVertexArrays(1) if not es else None
        self.framebuffer = GL.glGenFramebuffers(1)
        self.target = GL.glGenTextures(1)
        self.size: tuple[int, int] | None = None

    def read(self, texture: int, width: int, height: int) -> np.ndarray:
        GL = gl()
        if self.size != (width, height):
            GL.glBindTexture(GL.GL_TEXTURE_2D, self.target)
            GL.glTexImage2D(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA8, width, height, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, None)
            GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, self.framebuffer)
            GL.glFramebufferTexture2D(GL.GL_FRAMEBUFFER, GL.GL_COLOR_ATTACHMENT0, GL.GL_TEXTURE_2D, self.target, 0)
            self.size = (width, height)
        GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, self.framebuffer)
        GL.glViewport(0, 0, width, height)
        GL.glUseProgram(self.program)
        if self.vertex_array is not None:
            GL.glBindVertexArray(self.vertex_array)
        GL.glBindBuffer(GL.GL_ARRAY_BUFFER, self.buffer)
        GL.glEnableVertexAttribArray(0)
        GL.glVertexAttribPointer(0, 2, GL.GL_FLOAT, GL.GL_FALSE, 0, None)
        GL.glActiveTexture(GL.GL_TEXTURE0)
        GL.glBindTexture(GL_TEXTURE_EXTERNAL_OES, texture)
        # Exact texels: nearest sampling, each fragment centre on a texel centre.
        GL.glTexParameteri(GL_TEXTURE_EXTERNAL_OES, GL.GL_TEXTURE_MIN_FILTER, GL.GL_NEAREST)
        GL.glTexParameteri(GL_TEXTURE_EXTERNAL_OES, GL.GL_TEXTURE_MAG_FILTER, GL.GL_NEAREST)
        GL.glUniform1i(GL.glGetUniformLocation(self.program, "frame"), 0)
        GL.glDrawArrays(GL.GL_TRIANGLE_STRIP, 0, 4)
        GL.glPixelStorei(GL.GL_PACK_ALIGNMENT, 1)
        pixels = GL.glReadPixels(0, 0, width, height, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE)
        GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, 0)
        gl_check("glDrawArrays", "drawing the external texture")
        data = np.frombuffer(pixels, np.uint8) if not isinstance(pixels, np.ndarray) else pixels
        return data.reshape(height, width, 4).copy()

    def delete(self) -> None:
        GL = gl()
        GL.glDeleteProgram(self.program)
        GL.glDeleteBuffers(1, [self.buffer])
        GL.glDeleteFramebuffers(1, [self.framebuffer])
        GL.glDeleteTextures([self.target])
        if self.vertex_array is not None:
            GL.glDeleteVertexArrays(1, [self.vertex_array])


class GLFrame:
    """A frame the GL consumer holds: its external texture shows the frame until :meth:`release`."""

    def __init__(self, consumer: "GLTextureConsumer", number: int | None, is_new: bool | None) -> None:
        self._consumer = consumer
        self.number = number
        self.is_new = is_new
        self.released = False

    @property
    def texture(self) -> int:
        """The ``GL_TEXTURE_EXTERNAL_OES`` texture that shows this frame."""
        if self.released:
            raise ClosedError("the frame was released")
        return self._consumer.texture

    def read(self, width: int, height: int) -> np.ndarray:
        """Draw the frame into an RGBA8 framebuffer of ``width`` x ``height`` and read it back:
        a ``(height, width, 4)`` uint8 array, row 0 = the frame's row 0. The consumer's context
        must be current."""
        if self.released:
            raise ClosedError("the frame was released")
        return self._consumer._read(width, height)

    def release(self) -> None:
        self._consumer._release(self)

    def __reduce__(self) -> NoReturn:
        # A copy would outlive the release: its texture would show whichever frame came later.
        raise TypeError("a GLFrame cannot be copied or pickled: its texture shows the frame only until "
                        "release(); read() it instead")

    def __enter__(self) -> "GLFrame":
        return self

    def __exit__(self, *exc) -> None:
        if not self.released:
            self.release()


class GLTextureConsumer(Resource):
    """GL as the consumer of a stream: made by :meth:`Stream.connect_gl_consumer` while
    ``context`` is current. Acquire and release in that context's thread."""

    def __init__(self, stream: Stream, context: GLContext, texture: int | None) -> None:
        stream.display.require("EGL_KHR_stream_consumer_gltexture")
        context = _current_context(context)
        stream._check_consumer_slot()
        GL = gl()
        clear_gl_errors()
        self._own_texture = texture is None
        if texture is None:
            texture = int(GL.glGenTextures(1))
        else:
            try:
                name = operator.index(texture)  # PyOpenGL hands out NumPy integers
            except TypeError:
                name = 0
            if isinstance(texture, bool) or name <= 0:
                raise UsageError(f"texture is a GL texture name (int > 0), got {texture!r}")
            texture = name
        saved = int(GL.glGetIntegerv(GL_TEXTURE_BINDING_EXTERNAL_OES))
        if not gl_accepted(lambda: GL.glBindTexture(GL_TEXTURE_EXTERNAL_OES, texture)):
            raise UsageError(f"texture {texture} cannot be bound as GL_TEXTURE_EXTERNAL_OES: it was created "
                             "with another target (a GL consumer needs an external texture; pass texture=None "
                             "to let eglcuda make one)")
        try:
            egl_stream.gl_consumer_connect(stream.display.handle, stream.handle)
        finally:
            GL.glBindTexture(GL_TEXTURE_EXTERNAL_OES, saved)
        self.stream = stream
        self.context = context
        self.texture = texture
        self._timeout_us: int | None = None
        self._held: GLFrame | None = None
        self._last_number: int | None = None
        self._reader: _Reader | None = None
        self._lock = threading.Lock()
        # The stream's destruction disconnects this consumer, and GL deletes the texture with its
        # context: nothing to release at collection, only the close steps below.
        self._own(_nothing, parent=stream)
        stream.consumer = self

    def acquire(self, timeout_us: int = 1_000_000) -> GLFrame:
        """Latch the next frame into the texture (``eglStreamConsumerAcquireKHR``), waiting up to
        ``timeout_us``. Without a new frame in time the driver latches the previous one again
        (``is_new`` False); with none ever, :class:`Timeout`; once the producer is gone,
        :class:`StreamDisconnected`."""
        timeout_us = check_microseconds("timeout_us", timeout_us)
        with self._lock:
            if self.closed:
                raise ClosedError("the GL consumer is disconnected (or its stream closed)")
            if self._held is not None:
                raise UsageError("the consumer still holds a frame: release it before acquiring another")
            if not self.context.is_current:
                raise UsageError("the consumer's GL context is not current on this thread")
            dpy, handle = self.stream.display.handle, self.stream.handle
            if timeout_us != self._timeout_us:
                egl_stream.set_attribute(dpy, handle, egl_stream.CONSUMER_ACQUIRE_TIMEOUT_USEC, timeout_us,
                                         "setting the acquire timeout")
                self._timeout_us = timeout_us
            if not egl_stream.gl_consumer_acquire(dpy, handle):
                error = egl_error("eglStreamConsumerAcquireKHR", "acquiring a frame into the texture")
                state = self.stream.state
                if state is StreamState.DISCONNECTED:
                    raise StreamDisconnected(f"the producer disconnected from the stream ({error})")
                if state in (StreamState.EMPTY, StreamState.CONNECTING):
                    raise Timeout(f"no frame arrived within {timeout_us} us (stream {state.name})")
                raise error
            number = self.stream.consumer_frame
            is_new = number != self._last_number
            self._last_number = number
            if not is_new and self.stream.state is StreamState.DISCONNECTED:
                egl_stream.gl_consumer_release(dpy, handle, quiet=True)
                raise StreamDisconnected(f"the producer disconnected from the stream (last frame {number})")
            self._held = GLFrame(self, number, is_new)
            return self._held

    def _read(self, width: int, height: int) -> np.ndarray:
        if not self.context.is_current:
            raise UsageError("the consumer's GL context is not current on this thread")
        if self._reader is None:
            self._reader = _Reader(self.context.api == "gles")
        return self._reader.read(self.texture, width, height)

    def _release(self, frame: GLFrame) -> None:
        with self._lock:
            if frame is not self._held:
                raise ClosedError("the frame was already released") if frame.released else \
                    UsageError("this frame does not belong to this consumer")
            frame.released = True
            self._held = None
            if self.closed:
                return
            egl_stream.gl_consumer_release(self.stream.display.handle, self.stream.handle)

    def _before_release(self) -> None:
        """Release a held frame and let go of the stream (the stream's destruction disconnects
        the consumer). Deletes eglcuda's texture and reader objects if the context is current."""
        if self._held is not None and not self.stream.closed:
            self._held.released = True
            self._held = None
            egl_stream.gl_consumer_release(self.stream.display.handle, self.stream.handle, quiet=True)
        if self.context.is_current:
            if self._reader is not None:
                self._reader.delete()
            if self._own_texture:
                gl().glDeleteTextures([self.texture])


def _nothing() -> None:
    pass


def _destroy_surface(display_address: int, surface_address: int) -> None:
    egl_stream.producer_surface_destroy(display_address, surface_address)


class GLSurfaceProducer(Resource):
    """GL as the producer of a stream: an EGL surface of ``width`` x ``height`` whose
    :meth:`swap` presents what was rendered into it. Made by :meth:`Stream.connect_gl_producer`,
    which also makes a GL context of the surface's config (``context``)."""

    def __init__(self, stream: Stream, width: int, height: int, api: str = "opengl") -> None:
        stream.display.require("EGL_KHR_stream_producer_eglsurface")
        size = (as_int(width), as_int(height))
        if not all(v is not None and 0 < v <= MAX_DIMENSION for v in size):
            raise UsageError(f"width and height are ints in 1..{MAX_DIMENSION}, got {width!r}x{height!r}")
        width, height = size  # type: ignore[assignment]
        stream._check_producer_slot()
        self.context = GLContext(stream.display, api=api, surface_type=egl_stream.SURFACE_TYPE_STREAM)
        try:
            surface = egl_stream.producer_surface_create(stream.display.handle, self.context.config, stream.handle,
                                                         width, height)
        except BaseException:
            self.context.close()
            raise
        self.stream = stream
        self.width = width
        self.height = height
        self._surface_address = surface
        self._own(_destroy_surface, stream.display._address, self._surface_address, parent=stream)
        self.frames_presented = 0
        stream.producer = self

    @property
    def surface(self):
        if self.closed:
            raise ClosedError("the GL producer is disconnected (or its stream closed)")
        return self._surface_address

    def make_current(self) -> None:
        """Make the producer's context current on this thread, drawing into the stream's surface."""
        surface = self.surface
        egl_stream.producer_surface_make_current(self.stream.display.handle, surface, self.context.handle,
                                                 gles=self.context.api != "opengl")

    def swap(self) -> None:
        """Present what was rendered (``eglSwapBuffers``): the consumer gets it as the next frame."""
        surface = self.surface
        if egl_stream.current_draw_surface() != self._surface_address:
            raise UsageError("the producer surface is not current on this thread: call make_current() first")
        if self.stream.state is StreamState.DISCONNECTED:
            raise StreamDisconnected("the consumer disconnected from the stream: nothing to present to")
        try:
            egl_stream.swap_buffers(self.stream.display.handle, surface)
        except EGLError as error:
            if self.stream.state is StreamState.DISCONNECTED:
                raise StreamDisconnected(f"the consumer disconnected from the stream ({error})") from None
            raise
        self.frames_presented += 1

    def close(self) -> None:
        """Destroy the surface (disconnecting the producer), then its context. Safe to call twice."""
        super().close()
        self.context.close()

