"""EGLStream with CUDA producer and consumer (section 4.1 of NVIDIA's EGL interop guide).

Order of use: ``display.create_stream()``, ``stream.connect_cuda_consumer()`` (the consumer
connects first), ``stream.connect_cuda_producer(width, height)``, then per frame
``producer.present(frame)``, ``consumer.acquire()`` / ``frame.release()``,
``producer.return_frame()``.
"""
from __future__ import annotations

import enum
import os
from typing import TYPE_CHECKING, Any

from .._bind.cuda import ERROR_LAUNCH_TIMEOUT, cuda_error
from ..cuda_device import CudaDevice
from ..display import Display, check_display
from .._resource import Resource
from .._bind import cuda_egl, egl_stream
from .._integers import as_int, check_flag
from ..errors import ClosedError, EGLError, StreamDisconnected, Timeout, UsageError
from ..frames.formats import ColorFormat, Layout

if TYPE_CHECKING:  # annotations only (the endpoints import this module; the factories below import them)
    from ..context import GLContext
    from .cuda import CudaConsumer, CudaProducer
    from .gl import GLSurfaceProducer, GLTextureConsumer


class StreamState(enum.IntEnum):
    """``EGL_STREAM_STATE_KHR`` values."""

    CREATED = egl_stream.STATE_CREATED
    CONNECTING = egl_stream.STATE_CONNECTING
    EMPTY = egl_stream.STATE_EMPTY
    NEW_FRAME = egl_stream.STATE_NEW_FRAME
    OLD_FRAME = egl_stream.STATE_OLD_FRAME
    DISCONNECTED = egl_stream.STATE_DISCONNECTED


class ResourceLocation(enum.IntEnum):
    """Where a CUDA consumer wants frames (``cuEGLStreamConsumerConnectWithFlags``)."""

    SYSMEM = cuda_egl.RESOURCE_LOCATION_SYSMEM
    VIDMEM = cuda_egl.RESOURCE_LOCATION_VIDMEM


def _destroy_stream(display_address: int, stream_address: int, fd_box: list[int]) -> None:
    try:
        egl_stream.destroy(display_address, stream_address)
    except Exception:  # pragma: no cover
        pass
    if fd_box:
        try:
            os.close(fd_box.pop())
        except OSError:  # pragma: no cover
            pass


def check_microseconds(name: str, value: Any, allow_none: bool = False) -> Any:
    """``value`` as a plain int if it is a whole number of microseconds the driver takes
    (0..2**31-1; ``allow_none``: None too, returned as it is), else :class:`UsageError`."""
    if value is None and allow_none:
        return None
    us = as_int(value)
    if us is None or not 0 <= us <= 0x7FFFFFFF:
        raise UsageError(f"{name} is a whole number of microseconds in 0..2**31-1, got {value!r}")
    return us


_PRESENT_LOOK_S = 0.05  # how long Stream.close waits for a present under way before it disconnects the consumer


class Stream(Resource):
    """An EGLStream on a display: one producer and one consumer exchange frames through it.

    :param display: the display (of the CUDA device the frames live on).
    :param fifo_length: 0 for mailbox mode (the consumer always gets the newest frame, older
        ones are dropped), N > 0 for a FIFO of N frames (``EGL_KHR_stream_fifo``).
    :param latency_us: consumer latency hint (``EGL_CONSUMER_LATENCY_USEC_KHR``), microseconds.
    :param acquire_timeout_us: the stream's acquire timeout (``EGL_CONSUMER_ACQUIRE_TIMEOUT_USEC_KHR``),
        used by GL consumers; CUDA consumers take a timeout per :meth:`CudaConsumer.acquire`.
    :param reuse_last_frame: with True (EGL's default) the stream keeps the newest frame so the
        consumer always has one to acquire, and the producer cannot take it back until it presents
        another; False (``EGL_NV_stream_reset``) lets the last frame go back too.
    :param cross_process: export the stream's file descriptor at creation
        (``EGL_KHR_stream_cross_process_fd``), so that another process can open the stream after
        this one connects its consumer (see :func:`eglcuda.serve_stream`), or a producer on
        another GPU of this process can connect (the stream is then opened on that GPU's display
        too). EGL hands the descriptor out only once and only before any endpoint connects, hence
        the flag.

    Between GPUs: make the stream on the consumer's GPU's display with ``cross_process=True``,
    connect the consumer there, and the producer with ``device=`` its GPU; eglcuda connects each
    endpoint through the stream object of its own GPU's display.

    A stream opened from a descriptor (:meth:`from_fd`, :func:`eglcuda.receive_stream`) is the
    same object with the same endpoints; closing it closes this process's handle only.
    """

    def __init__(self, display: Display, fifo_length: int = 0, latency_us: int | None = None,
                 acquire_timeout_us: int | None = None, reuse_last_frame: bool = True,
                 cross_process: bool = False) -> None:
        check_display(display, "Stream")
        latency_us = check_microseconds("latency_us", latency_us, allow_none=True)
        acquire_timeout_us = check_microseconds("acquire_timeout_us", acquire_timeout_us, allow_none=True)
        length = as_int(fifo_length)
        if length is None or not 0 <= length <= 4096:
            raise UsageError(f"fifo_length is an int in 0..4096 (0 = mailbox), got {fifo_length!r}")
        fifo_length = length
        reuse_last_frame = check_flag(reuse_last_frame, "reuse_last_frame")
        cross_process = check_flag(cross_process, "cross_process")
        display.require("EGL_KHR_stream")
        attribs = []
        if fifo_length:
            display.require("EGL_KHR_stream_fifo")
            attribs.append((egl_stream.FIFO_LENGTH, fifo_length))
        if latency_us is not None:
            attribs.append((egl_stream.CONSUMER_LATENCY_USEC, latency_us))
        if acquire_timeout_us is not None:
            display.require("EGL_KHR_stream_consumer_gltexture")
            attribs.append((egl_stream.CONSUMER_ACQUIRE_TIMEOUT_USEC, acquire_timeout_us))
        if not reuse_last_frame:
            display.require("EGL_NV_stream_reset")
            attribs.append((egl_stream.SUPPORT_REUSE, 0))
        if cross_process:
            display.require("EGL_KHR_stream_cross_process_fd")
        handle = egl_stream.create(display.handle, attribs)
        self._adopt_handle(display, handle, fifo_length, reuse_last_frame, imported=False)
        if cross_process:
            try:
                self._export()
            except BaseException:
                self.close()
                raise

    def _adopt_handle(self, display: Display, handle: int, fifo_length: int, reuse_last_frame: bool,
                      imported: bool) -> None:
        self.display = display
        self.fifo_length = fifo_length
        self.reuse_last_frame = reuse_last_frame
        self.imported = imported
        self._address = handle
        self._fd_box: list[int] = []  # the exported (or imported) descriptor, closed with the stream
        # This stream opened on other GPUs' displays, for producers there (see _handle_for).
        self._siblings: dict[int, Stream] = {}
        self.consumer: CudaConsumer | GLTextureConsumer | None = None
        self.producer: CudaProducer | GLSurfaceProducer | None = None
        self._own(_destroy_stream, display._address, self._address, self._fd_box, parent=display)

    def close(self) -> None:
        """Disconnect the producer and the consumer (newest first) and destroy the stream. Safe
        to call twice. A thread waiting in the CUDA producer's ``present()`` for room in a full
        FIFO waits for the consumer, so then the consumer is disconnected first, which ends that
        wait, and the producer after it (as the producer's own ``close()``, up to 10 s)."""
        from .cuda import CudaProducer  # (the endpoints import this module)

        producer, consumer = self.producer, self.consumer
        if (isinstance(producer, CudaProducer) and consumer is not None and not producer.closed
                and not consumer.closed):  # (closed in a forked child)
            try:
                producer.close(timeout=_PRESENT_LOOK_S)
            except Timeout:
                consumer.close()
        super().close()

    @classmethod
    def from_fd(cls, display: Display, fd: int) -> "Stream":
        """Open, on ``display``, a stream another process exported
        (``eglCreateStreamFromFileDescriptorKHR``). ``fd`` stays the caller's to close.

        The stream keeps a duplicate of ``fd`` open for its whole life: closing the descriptor a
        stream was opened from tears the stream down on NVIDIA's driver (measured: the state turns
        DISCONNECTED and a producer's connect fails with CUDA_ERROR_UNKNOWN). Its FIFO length is
        read from the stream; connect the endpoint this process plays as usual (the consumer side
        connects first, in its own process)."""
        check_display(display, "Stream.from_fd")
        number = as_int(fd)
        if number is None or not 0 <= number < 2**31:  # (a C int, as os.dup and EGL take it)
            raise UsageError(f"a file descriptor is an int in 0..2**31-1, got {fd!r}")
        fd = number
        try:
            own = os.dup(fd)
        except OSError as exc:
            raise UsageError(f"file descriptor {fd} is not open ({exc.strerror})") from None
        try:
            display.require("EGL_KHR_stream", "EGL_KHR_stream_cross_process_fd")
            handle = egl_stream.create_from_fd(
                display.handle, own, f"opening a stream from file descriptor {fd} (is it one another process exported?)")
        except BaseException:
            os.close(own)
            raise
        stream = cls.__new__(cls)
        stream._adopt_handle(display, handle, 0, True, imported=True)
        stream._fd_box.append(own)
        stream.fifo_length = stream._query_or(egl_stream.FIFO_LENGTH, 0)
        stream.reuse_last_frame = bool(stream._query_or(egl_stream.SUPPORT_REUSE, 1))
        return stream

    def _export(self) -> int:
        """Export the stream's descriptor once; the stream owns it."""
        if self.imported:
            raise UsageError("this stream was opened from a descriptor: only the process that created it can export it")
        if self._fd_box:
            return self._fd_box[0]
        state = self.state
        if state is not StreamState.CREATED:
            raise UsageError(f"EGL exports a stream's descriptor only before any endpoint connects (state "
                             f"{state.name}): create the stream with cross_process=True")
        self.display.require("EGL_KHR_stream_cross_process_fd")
        fd = egl_stream.export_fd(self.display.handle, self.handle)
        self._fd_box.append(fd)
        return fd

    def _shared(self) -> bool:
        """Whether another process (or another GPU's display) may hold this stream: it was made
        with ``cross_process=True``, exported, or opened from a descriptor."""
        return bool(self._fd_box)

    def export_fd(self) -> int:
        """A new file descriptor for this stream, the caller's to send and close.

        For a transport of your own; :func:`eglcuda.serve_stream` does the usual UNIX-socket
        hand-over. Exporting needs a stream made with ``cross_process=True``, or one no endpoint
        has connected to yet."""
        if self.closed:
            raise ClosedError("the stream is closed (or its display is)")
        return os.dup(self._export())

    # ---- queries -----------------------------------------------------------------------------
    @property
    def handle(self) -> int:
        """The raw ``EGLStreamKHR``, as an address."""
        if self.closed:
            raise ClosedError("the stream is closed (or its display is)")
        return self._address

    def _query(self, attribute: int) -> int:
        return egl_stream.query(self.display.handle, self.handle, attribute)

    def _query_or(self, attribute: int, default: int) -> int:
        """An attribute this driver may not answer for: ``default`` when it refuses."""
        try:
            return self._query(attribute)
        except EGLError:
            return default

    def _query_u64(self, attribute: int) -> int:
        return egl_stream.query_u64(self.display.handle, self.handle, attribute)

    @property
    def state(self) -> StreamState:
        """The stream's state as EGL reports it (``EGL_STREAM_STATE_KHR``)."""
        return StreamState(self._query(egl_stream.STATE))

    def _driver_failure(self, status: int, call: str, doing: str, peer: str,
                        timeout_us: int | None = None) -> Exception:
        """The error for a failed endpoint call, read from the stream's state: the other end
        (``peer``) gone, no frame to hand out (an acquire that timed out: ``timeout_us`` given),
        or the driver's own error."""
        try:
            state = self.state
        except Exception:
            state = None
        if state is StreamState.DISCONNECTED:
            return StreamDisconnected(f"the {peer} disconnected from the stream ({doing} failed: "
                                      f"{cuda_error(status, call)})")
        if timeout_us is not None and state in (StreamState.EMPTY, StreamState.CONNECTING):
            return Timeout(f"no frame arrived within {timeout_us} us (stream {state.name})")
        if timeout_us is not None and status == ERROR_LAUNCH_TIMEOUT:
            # The driver's own answer for an acquire that waited in vain. The state read after it
            # may already show a frame presented since (NEW_FRAME), or the one the consumer saw
            # last, which a stream with reuse_last_frame=False does not hand out again (OLD_FRAME).
            where = state.name if state is not None else "state unknown"
            return Timeout(f"no new frame arrived within {timeout_us} us (stream {where} after the wait)")
        return cuda_error(status, call, doing)

    @property
    def producer_frame(self) -> int:
        """How many frames the producer has inserted (``EGL_PRODUCER_FRAME_KHR``)."""
        return self._query_u64(egl_stream.PRODUCER_FRAME)

    @property
    def consumer_frame(self) -> int:
        """The number of the frame the consumer holds or held last (``EGL_CONSUMER_FRAME_KHR``)."""
        return self._query_u64(egl_stream.CONSUMER_FRAME)

    @property
    def latency_us(self) -> int:
        """The consumer's latency in microseconds (``EGL_CONSUMER_LATENCY_USEC_KHR``); settable."""
        return self._query(egl_stream.CONSUMER_LATENCY_USEC)

    @latency_us.setter
    def latency_us(self, value: int) -> None:
        value = check_microseconds("latency_us", value)
        egl_stream.set_attribute(self.display.handle, self.handle, egl_stream.CONSUMER_LATENCY_USEC, value,
                                 "setting the consumer latency")

    @property
    def acquire_timeout_us(self) -> int:
        """How long an acquire waits for a frame, in microseconds
        (``EGL_CONSUMER_ACQUIRE_TIMEOUT_USEC_KHR``), as set when the stream was made."""
        return self._query(egl_stream.CONSUMER_ACQUIRE_TIMEOUT_USEC)

    # ---- endpoints ---------------------------------------------------------------------------
    def connect_cuda_consumer(self, device: int | CudaDevice | None = None, cuda_stream: Any = None,
                              location: ResourceLocation | None = None,
                              frame_numbers: bool = True) -> "CudaConsumer":
        """Connect CUDA as the consumer. Must come before the producer connects.

        ``frame_numbers`` (default True) gives each acquired frame the stream's consumer frame
        counter (:attr:`AcquiredFrame.number`) and tells a new frame from a re-acquired old one
        (:attr:`AcquiredFrame.is_new`). With the producer in another process that costs one EGL
        query per acquire. With a :class:`CudaProducer` on this stream in this process, a new frame
        waiting when the acquire begins is numbered from the producer's present counts instead, and
        EGL is asked only in the other cases. Turned off, ``number`` and ``is_new`` are None, and a
        frame handed out again is told by its memory (and, with the producer in this process, by
        its present count): once the producer has disconnected, that acquire raises
        :class:`StreamDisconnected`, as with numbers."""
        from .cuda import CudaConsumer  # a factory for the layer's endpoints (they import this module)

        return CudaConsumer(self, device, cuda_stream, location, frame_numbers)

    def connect_cuda_producer(self, width: int, height: int, device: int | CudaDevice | None = None,
                              format: ColorFormat | str | None = None,
                              layout: Layout | str | None = None) -> "CudaProducer":
        """Connect CUDA as the producer of ``width`` x ``height`` frames. ``format`` and
        ``layout`` fix what every frame must be; left None, the first presented frame fixes them."""
        from .cuda import CudaProducer  # a factory for the layer's endpoints (they import this module)

        return CudaProducer(self, width, height, device, format, layout)

    def connect_gl_consumer(self, context: "GLContext", texture: int | None = None) -> "GLTextureConsumer":
        """Connect GL as the consumer (``EGL_KHR_stream_consumer_gltexture``): frames arrive in an
        external texture of ``context``, which must be current on this thread. ``texture`` is an
        unused texture name to take, or None for one eglcuda makes. Must come before the producer."""
        from .gl import GLTextureConsumer  # a factory for the layer's endpoints (they import this module)

        return GLTextureConsumer(self, context, texture)

    def connect_gl_producer(self, width: int, height: int, api: str = "opengl") -> "GLSurfaceProducer":
        """Connect GL as the producer (``EGL_KHR_stream_producer_eglsurface``): a ``width`` x
        ``height`` surface with its own GL context; render while it is current, ``swap()``
        presents."""
        from .gl import GLSurfaceProducer  # a factory for the layer's endpoints (they import this module)

        return GLSurfaceProducer(self, width, height, api)

    def _check_consumer_slot(self) -> None:
        """Raise unless a consumer (of any kind) may connect now."""
        if self.closed:
            raise ClosedError("the stream is closed")
        if self.consumer is not None or self.state is not StreamState.CREATED:
            raise UsageError(f"the stream already has a consumer (state {self.state.name})")

    def _check_producer_slot(self) -> None:
        """Raise unless a producer (of any kind) may connect now: EGL wants the consumer first."""
        if self.closed:
            raise ClosedError("the stream is closed")
        state = self.state
        if self.producer is not None or state is not StreamState.CONNECTING:
            if state is StreamState.CREATED:
                raise UsageError("connect the consumer first: EGLStream requires the consumer to connect "
                                 "before the producer")
            raise UsageError(f"the stream cannot take a producer now (state {state.name})")

    def _device(self, device: int | CudaDevice | None) -> CudaDevice:
        return self.display.cuda_device(device)

    def _consumer_device(self, device: int | CudaDevice | None) -> CudaDevice:
        """The CUDA device a consumer connects from: the display's own. (A consumer on another GPU
        than the stream's display works, but at a hundredth of the speed, measured on two H200:
        each endpoint wants the stream object of its own GPU's display, and the consumer's is the
        one that creates the stream.)"""
        chosen = self._device(device)
        own = self.display.cuda_ordinal
        if own is not None and chosen.ordinal != own:
            raise UsageError(f"the consumer is on CUDA device {chosen.ordinal} but the stream was made on the display "
                             f"of CUDA device {own}: create the stream on the consumer's GPU "
                             f"(eglcuda.Display.for_cuda_device({chosen.ordinal}).create_stream(...)); the producer "
                             "may be on any GPU")
        return chosen

    def _handle_for(self, device: CudaDevice) -> int:
        """This stream's handle as an endpoint on ``device`` must use it: the stream itself when
        ``device`` is its display's GPU, else the same stream opened on the EGL display of
        ``device`` through its descriptor (made once, closed with this stream). Across GPUs each
        endpoint on its own display's stream object is what the driver runs fast (measured on two
        H200 in one process: 24-26k frames/s at 1080p, against 44-2,000 with the producer's context
        on the consumer's display's stream)."""
        own = self.display.cuda_ordinal
        if own is None or device.ordinal == own:
            return self.handle
        sibling = self._siblings.get(device.ordinal)
        if sibling is None:
            if not self._fd_box:
                raise UsageError(f"a producer on CUDA device {device.ordinal} needs the stream's descriptor to open it "
                                 f"on that GPU's display: create the stream with cross_process=True (its display is "
                                 f"CUDA device {own}'s)")
            display = Display.for_cuda_device(device.ordinal)
            self._adopt(display)  # closed with this stream, with the sibling made on it
            sibling = Stream.from_fd(display, self._fd_box[0])
            self._siblings[device.ordinal] = sibling
        return sibling.handle

    def __repr__(self) -> str:
        mode = f"FIFO {self.fifo_length}" if self.fifo_length else "mailbox"
        origin = " from fd" if self.imported else (" cross-process" if self._fd_box else "")
        return f"<Stream {mode}{origin}{' closed' if self.closed else ''}>"
