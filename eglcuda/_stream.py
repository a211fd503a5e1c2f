"""EGLStream with CUDA producer and consumer (section 4.1 of NVIDIA's EGL interop guide).

Order of use: ``display.create_stream()``, ``stream.connect_cuda_consumer()`` (the consumer
connects first), ``stream.connect_cuda_producer(width, height)``, then per frame
``producer.present(frame)``, ``consumer.acquire()`` / ``frame.release()``,
``producer.return_frame()``.
"""
from __future__ import annotations

import enum
import os
import time
import weakref
from typing import TYPE_CHECKING, Any, Iterator, NoReturn

from ._cuda import CudaDevice, check, cuda_error, get_device
from ._display import Display
from ._egl import address, egl_error, int_attribs
from ._errors import ClosedError, EGLError, StreamDisconnected, Timeout, Unsupported, UsageError
from ._formats import ColorFormat, Layout, check_size, color_format
from ._frame import AcquiredFrame, Frame
from . import _hotpath
from ._hotpath import ConsumerCore, ProducerCore
from ._interop import stream_handle
from ._native import ffi, lib

if TYPE_CHECKING:
    from ._context import GLContext
    from ._glstream import GLSurfaceProducer, GLTextureConsumer

_LAUNCH_TIMEOUT = lib.CUDA_ERROR_LAUNCH_TIMEOUT
MAX_FRAMES_IN_FLIGHT = 64  # the guide: CUDA cannot present more than 64 active frames
DEFAULT_ACQUIRE_TIMEOUT_US = 1_000_000
# Which call a fused helper (csrc/helpers.c) says failed.
_CALL_NAMES = {0: "cuCtxSetCurrent", 1: "cuEGLStreamConsumerAcquireFrame",
               2: "cuGraphicsResourceGetMappedEglFrame", 3: "eglQueryStreamu64KHR",
               4: "cuEGLStreamConsumerReleaseFrame", 5: "cuEGLStreamProducerPresentFrame",
               6: "cuEGLStreamProducerReturnFrame"}

# The C methods of the endpoints (csrc/hotpath.c) call the fused helpers of csrc/helpers.c.
_hotpath.bind(tuple(address(ffi.addressof(lib, name)) for name in (
    "eglcuda_producer_present", "eglcuda_producer_return", "eglcuda_producer_present_return",
    "eglcuda_consumer_acquire", "eglcuda_consumer_next", "eglcuda_consumer_release", "eglcuda_consumer_counter")))


class StreamState(enum.IntEnum):
    """``EGL_STREAM_STATE_KHR`` values."""

    CREATED = lib.EGL_STREAM_STATE_CREATED_KHR
    CONNECTING = lib.EGL_STREAM_STATE_CONNECTING_KHR
    EMPTY = lib.EGL_STREAM_STATE_EMPTY_KHR
    NEW_FRAME = lib.EGL_STREAM_STATE_NEW_FRAME_AVAILABLE_KHR
    OLD_FRAME = lib.EGL_STREAM_STATE_OLD_FRAME_AVAILABLE_KHR
    DISCONNECTED = lib.EGL_STREAM_STATE_DISCONNECTED_KHR


class ResourceLocation(enum.IntEnum):
    """Where a CUDA consumer wants frames (``cuEGLStreamConsumerConnectWithFlags``)."""

    SYSMEM = lib.CU_EGL_RESOURCE_LOCATION_SYSMEM
    VIDMEM = lib.CU_EGL_RESOURCE_LOCATION_VIDMEM


def _destroy_stream(display_address: int, stream_address: int, fd_box: list[int]) -> None:
    try:
        lib.eglDestroyStreamKHR(ffi.cast("EGLDisplay", display_address), ffi.cast("EGLStreamKHR", stream_address))
    except Exception:  # pragma: no cover
        pass
    if fd_box:
        try:
            os.close(fd_box.pop())
        except OSError:  # pragma: no cover
            pass


def _check_us(name: str, value: Any, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 0x7FFFFFFF:
        raise UsageError(f"{name} is a whole number of microseconds in 0..2**31-1, got {value!r}")


def _checked_timeout(value: Any) -> int:
    """A per-frame call's ``timeout_us`` the C fast path did not take as a plain int: an int
    subclass becomes an int; anything else raises :class:`UsageError`."""
    _check_us("timeout_us", value, allow_none=False)
    return int(value)


class Stream:
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
        this one connects its consumer (see :func:`eglcuda.serve_stream`). EGL hands the
        descriptor out only once and only before any endpoint connects, hence the flag.

    A stream opened from a descriptor (:meth:`from_fd`, :func:`eglcuda.receive_stream`) is the
    same object with the same endpoints; closing it closes this process's handle only.
    """

    def __init__(self, display: Display, fifo_length: int = 0, latency_us: int | None = None,
                 acquire_timeout_us: int | None = None, reuse_last_frame: bool = True,
                 cross_process: bool = False) -> None:
        _check_us("latency_us", latency_us)
        _check_us("acquire_timeout_us", acquire_timeout_us)
        if not isinstance(fifo_length, int) or isinstance(fifo_length, bool) or not 0 <= fifo_length <= 4096:
            raise UsageError(f"fifo_length is an int in 0..4096 (0 = mailbox), got {fifo_length!r}")
        display.require("EGL_KHR_stream")
        attribs = []
        if fifo_length:
            display.require("EGL_KHR_stream_fifo")
            attribs.append((lib.EGL_STREAM_FIFO_LENGTH_KHR, fifo_length))
        if latency_us is not None:
            attribs.append((lib.EGL_CONSUMER_LATENCY_USEC_KHR, latency_us))
        if acquire_timeout_us is not None:
            display.require("EGL_KHR_stream_consumer_gltexture")
            attribs.append((lib.EGL_CONSUMER_ACQUIRE_TIMEOUT_USEC_KHR, acquire_timeout_us))
        if not reuse_last_frame:
            display.require("EGL_NV_stream_reset")
            attribs.append((lib.EGL_SUPPORT_REUSE_NV, lib.EGL_FALSE))
        if cross_process:
            display.require("EGL_KHR_stream_cross_process_fd")
        handle = lib.eglCreateStreamKHR(display.handle, int_attribs(attribs))
        if handle == ffi.NULL:
            raise egl_error("eglCreateStreamKHR", "creating an EGLStream")
        self._adopt_handle(display, handle, fifo_length, reuse_last_frame, imported=False)
        if cross_process:
            try:
                self._export()
            except BaseException:
                self.close()
                raise

    def _adopt_handle(self, display: Display, handle, fifo_length: int, reuse_last_frame: bool,
                      imported: bool) -> None:
        self.display = display
        self.fifo_length = fifo_length
        self.reuse_last_frame = reuse_last_frame
        self.imported = imported
        self._address = address(handle)
        self._fd_box: list[int] = []  # the exported (or imported) descriptor, closed with the stream
        self._finalizer = weakref.finalize(self, _destroy_stream, display._address, self._address, self._fd_box)
        self.consumer: CudaConsumer | None = None
        self.producer: CudaProducer | None = None
        display._adopt(self)

    @classmethod
    def from_fd(cls, display: Display, fd: int) -> "Stream":
        """Open, on ``display``, a stream another process exported
        (``eglCreateStreamFromFileDescriptorKHR``). ``fd`` stays the caller's to close.

        The stream keeps a duplicate of ``fd`` open for its whole life: closing the descriptor a
        stream was opened from tears the stream down on NVIDIA's driver (measured: the state turns
        DISCONNECTED and a producer's connect fails with CUDA_ERROR_UNKNOWN). Its FIFO length is
        read from the stream; connect the endpoint this process plays as usual (the consumer side
        connects first, in its own process)."""
        if type(fd) is not int or fd < 0:
            raise UsageError(f"a file descriptor is a non-negative int, got {fd!r}")
        try:
            own = os.dup(fd)
        except OSError as exc:
            raise UsageError(f"file descriptor {fd} is not open ({exc.strerror})") from None
        try:
            display.require("EGL_KHR_stream", "EGL_KHR_stream_cross_process_fd")
            handle = lib.eglCreateStreamFromFileDescriptorKHR(display.handle, own)
            if handle == ffi.NULL:
                raise egl_error("eglCreateStreamFromFileDescriptorKHR",
                                f"opening a stream from file descriptor {fd} (is it one another process exported?)")
        except BaseException:
            os.close(own)
            raise
        stream = cls.__new__(cls)
        stream._adopt_handle(display, handle, 0, True, imported=True)
        stream._fd_box.append(own)
        stream.fifo_length = stream._query_or(lib.EGL_STREAM_FIFO_LENGTH_KHR, 0)
        stream.reuse_last_frame = bool(stream._query_or(lib.EGL_SUPPORT_REUSE_NV, lib.EGL_TRUE))
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
        fd = lib.eglGetStreamFileDescriptorKHR(self.display.handle, self.handle)
        if fd < 0:
            raise egl_error("eglGetStreamFileDescriptorKHR", "exporting the stream")
        self._fd_box.append(fd)
        return fd

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
    def closed(self) -> bool:
        return not self._finalizer.alive or self.display.closed

    @property
    def handle(self):
        """The raw ``EGLStreamKHR``."""
        if self.closed:
            raise ClosedError("the stream is closed (or its display is)")
        return ffi.cast("EGLStreamKHR", self._address)

    def _query(self, attribute: int) -> int:
        value = ffi.new("EGLint *")
        if not lib.eglQueryStreamKHR(self.display.handle, self.handle, attribute, value):
            raise egl_error("eglQueryStreamKHR", "querying the stream")
        return value[0]

    def _query_or(self, attribute: int, default: int) -> int:
        """An attribute this driver may not answer for: ``default`` when it refuses."""
        try:
            return self._query(attribute)
        except EGLError:
            return default

    def _query_u64(self, attribute: int) -> int:
        value = ffi.new("EGLuint64KHR *")
        if not lib.eglQueryStreamu64KHR(self.display.handle, self.handle, attribute, value):
            raise egl_error("eglQueryStreamu64KHR", "querying the stream's frame counters")
        return int(value[0])

    @property
    def state(self) -> StreamState:
        return StreamState(self._query(lib.EGL_STREAM_STATE_KHR))

    def _driver_failure(self, status: int, call: str, doing: str, peer: str,
                        timeout_us: int | None = None) -> Exception:
        """The error for a failed endpoint call, read from the stream's state: the other end
        (``peer``) gone, no frame yet (when ``timeout_us`` is given), or the driver's own error."""
        try:
            state = self.state
        except Exception:
            state = None
        if state is StreamState.DISCONNECTED:
            return StreamDisconnected(f"the {peer} disconnected from the stream ({doing} failed: "
                                      f"{cuda_error(status, call)})")
        if timeout_us is not None and state in (StreamState.EMPTY, StreamState.CONNECTING):
            return Timeout(f"no frame arrived within {timeout_us} us (stream {state.name})")
        return cuda_error(status, call, doing)

    @property
    def producer_frame(self) -> int:
        """How many frames the producer has inserted (``EGL_PRODUCER_FRAME_KHR``)."""
        return self._query_u64(lib.EGL_PRODUCER_FRAME_KHR)

    @property
    def consumer_frame(self) -> int:
        """The number of the frame the consumer holds or held last (``EGL_CONSUMER_FRAME_KHR``)."""
        return self._query_u64(lib.EGL_CONSUMER_FRAME_KHR)

    @property
    def latency_us(self) -> int:
        return self._query(lib.EGL_CONSUMER_LATENCY_USEC_KHR)

    @latency_us.setter
    def latency_us(self, value: int) -> None:
        _check_us("latency_us", value, allow_none=False)
        if not lib.eglStreamAttribKHR(self.display.handle, self.handle, lib.EGL_CONSUMER_LATENCY_USEC_KHR, value):
            raise egl_error("eglStreamAttribKHR", "setting the consumer latency")

    @property
    def acquire_timeout_us(self) -> int:
        return self._query(lib.EGL_CONSUMER_ACQUIRE_TIMEOUT_USEC_KHR)

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
        EGL is asked only in the other cases. Turned off, ``number`` and ``is_new`` are None."""
        return CudaConsumer(self, device, cuda_stream, location, frame_numbers)

    def connect_cuda_producer(self, width: int, height: int, device: int | CudaDevice | None = None,
                              format: ColorFormat | str | None = None,
                              layout: Layout | str | None = None) -> "CudaProducer":
        """Connect CUDA as the producer of ``width`` x ``height`` frames. ``format`` and
        ``layout`` fix what every frame must be; left None, the first presented frame fixes them."""
        return CudaProducer(self, width, height, device, format, layout)

    def connect_gl_consumer(self, context: "GLContext", texture: int | None = None) -> "GLTextureConsumer":
        """Connect GL as the consumer (``EGL_KHR_stream_consumer_gltexture``): frames arrive in an
        external texture of ``context``, which must be current on this thread. ``texture`` is an
        unused texture name to take, or None for one eglcuda makes. Must come before the producer."""
        from ._glstream import GLTextureConsumer

        return GLTextureConsumer(self, context, texture)

    def connect_gl_producer(self, width: int, height: int, api: str = "opengl") -> "GLSurfaceProducer":
        """Connect GL as the producer (``EGL_KHR_stream_producer_eglsurface``): a ``width`` x
        ``height`` surface with its own GL context; render while it is current, ``swap()``
        presents."""
        from ._glstream import GLSurfaceProducer

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

    def close(self) -> None:
        """Disconnect both ends (producer first), then destroy the stream. Safe to call twice."""
        if not self._finalizer.alive:
            return
        for end in (self.producer, self.consumer):
            if end is not None:
                end.close()
        self._finalizer()

    def __enter__(self) -> "Stream":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = f"FIFO {self.fifo_length}" if self.fifo_length else "mailbox"
        origin = " from fd" if self.imported else (" cross-process" if self._fd_box else "")
        return f"<Stream {mode}{origin}{' closed' if self.closed else ''}>"


def _disconnect(ordinal: int, which: str, connection, cuda_stream: int, own_stream: bool) -> None:
    """Finalizer for both endpoints. Never raises."""
    try:
        device = get_device(ordinal)
        device.make_current()
        if which == "consumer":
            lib.cuEGLStreamConsumerDisconnect(connection)
        else:
            lib.cuEGLStreamProducerDisconnect(connection)
        if own_stream:
            lib.cuStreamDestroy(ffi.cast("CUstream", cuda_stream))
    except Exception:  # pragma: no cover
        pass


class CudaConsumer(ConsumerCore):
    """CUDA as the consumer of a stream. Made by :meth:`Stream.connect_cuda_consumer`.

    Holds at most one acquired frame at a time (the driver's rule): release it before the next
    :meth:`acquire`. Work on an acquired frame belongs on :attr:`cuda_stream`, which the driver
    orders after the producer's work on the frame (implicit synchronization).

    The per-frame calls (:meth:`acquire`, :meth:`acquire_next`, :meth:`AcquiredFrame.release`)
    are C methods of the base class (csrc/hotpath.c); the rare paths they call back into are here.
    """

    def __init__(self, stream: Stream, device: int | CudaDevice | None, cuda_stream: Any,
                 location: ResourceLocation | None, frame_numbers: bool = True) -> None:
        stream._check_consumer_slot()
        self.stream = stream
        self.device = stream._device(device)
        self.device.make_current()
        self._context = self.device.context
        self._own_stream = cuda_stream is None
        if self._own_stream:
            created = ffi.new("CUstream *")
            # Blocking (flags 0): orders with work on the legacy default stream, where many users'
            # kernels run.
            check(lib.cuStreamCreate(created, 0), "cuStreamCreate", "creating the consumer's CUDA stream")
            self.cuda_stream = int(ffi.cast("uintptr_t", created[0]))
        else:
            self.cuda_stream = stream_handle(cuda_stream)
        self._cu_stream = ffi.new("CUstream *", ffi.cast("CUstream", self.cuda_stream))
        self._connection = ffi.new("CUeglStreamConnection *")
        if location is None:
            status = lib.cuEGLStreamConsumerConnect(self._connection, stream.handle)
            call = "cuEGLStreamConsumerConnect"
        else:
            status = lib.cuEGLStreamConsumerConnectWithFlags(self._connection, stream.handle, int(ResourceLocation(location)))
            call = "cuEGLStreamConsumerConnectWithFlags"
        if status:
            if self._own_stream:
                lib.cuStreamDestroy(self._cu_stream[0])
            raise cuda_error(status, call, "connecting the CUDA consumer")
        self.location = location
        self._finalizer = weakref.finalize(self, _disconnect, self.device.ordinal, "consumer", self._connection,
                                           self.cuda_stream, self._own_stream)
        # Reused by every acquire: the per-frame path allocates no C memory.
        self._resource = ffi.new("CUgraphicsResource *")
        self._egl_frame = ffi.new("CUeglFrame *")
        self.frame_numbers = bool(frame_numbers)
        self._bind(address(self._context), address(self._connection), address(self._resource),
                   address(self._cu_stream), address(self._egl_frame), address(stream.display.handle),
                   address(stream.handle), self.frame_numbers, AcquiredFrame)
        stream.consumer = self

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive or self.stream.closed

    def frames(self, timeout_us: int = DEFAULT_ACQUIRE_TIMEOUT_US) -> Iterator[AcquiredFrame]:
        """Iterate over acquired frames until the producer disconnects. Each step releases the
        previous frame and acquires the next (:meth:`acquire_next`); leaving the loop releases
        the last one. A frame kept past its step is released by the next step all the same."""
        try:
            while True:
                try:
                    frame = self.acquire_next(timeout_us)
                except StreamDisconnected:
                    return
                yield frame
        finally:
            held = self._held
            if held is not None and self._connected:
                held.release()

    # ---- the rare paths of the C methods (each called inside the consumer's gate) -----------
    _timeout = staticmethod(_checked_timeout)

    def _fail_closed(self) -> NoReturn:
        raise ClosedError("the consumer is disconnected (or its stream closed)")

    def _fail_held(self) -> NoReturn:
        raise UsageError("the consumer still holds a frame: release it before acquiring another "
                         "(or use acquire_next, which does both)")

    def _fail_released(self) -> NoReturn:
        raise ClosedError("the frame was already released")

    def _fail_foreign(self) -> NoReturn:
        raise UsageError("this frame does not belong to this consumer")

    def _counter_failed(self) -> None:
        """The frame-counter query failed (the frame is acquired and mapped): go on without it."""
        lib.eglGetError()
        self._use_counter = False

    def _release_failed(self, status: int) -> NoReturn:
        raise cuda_error(status, "cuEGLStreamConsumerReleaseFrame", "releasing a frame")

    def _acquire_failed(self, status: int, failed_call: int, timeout_us: int) -> NoReturn:
        call = _CALL_NAMES[failed_call]
        raise self.stream._driver_failure(status, call, "acquiring a frame", "producer",
                                          timeout_us if call == "cuEGLStreamConsumerAcquireFrame" else None)

    def _check_disconnected(self, number: int) -> None:
        """A frame handed out again (not new): if the producer is gone, release it and say so."""
        if self.stream.state is StreamState.DISCONNECTED:
            # The stream hands out its last frame forever once the producer is gone (its process
            # may have died): say so instead of repeating a frame that never changes.
            lib.eglcuda_consumer_release(self._context, self._connection, self._resource[0], self._cu_stream)
            raise StreamDisconnected(f"the producer disconnected from the stream (last frame {number})")

    def _wait_for_producer(self, timeout_us: int) -> int:
        """Wait, without the driver, until a producer connects; returns the time left.

        Measured on NVIDIA 580: a consumer acquire issued while a cross-process stream still
        waits for its producer disconnects the stream (the producer's connect then fails with
        CUDA_ERROR_UNKNOWN). So the first acquire polls the state instead, every millisecond,
        which also gives a one-process consumer the plain timeout it would get anyway."""
        deadline = time.monotonic() + timeout_us / 1e6
        while True:
            state = self.stream.state
            if state is not StreamState.CONNECTING:
                self._producer_seen = True
                return max(0, int((deadline - time.monotonic()) * 1e6))
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"no producer connected within {timeout_us} us (stream CONNECTING)")
            time.sleep(min(0.001, left))

    def close(self) -> None:
        """Release a held frame and disconnect. Safe to call twice."""
        if not self._finalizer.alive:
            return
        self._shut()
        self._finalizer()

    disconnect = close

    def __enter__(self) -> "CudaConsumer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class CudaProducer(ProducerCore):
    """CUDA as the producer of a stream. Made by :meth:`Stream.connect_cuda_producer`.

    :meth:`present` checks each frame against the connection (size, format, layout) before the
    driver sees it, because a mismatch is undefined behaviour there. Presented frames belong to
    the stream until :meth:`return_frame` gives them back (at most 64 in flight); the driver also
    keeps every frame ever presented associated with the stream until the producer disconnects,
    so this producer keeps them alive until then.

    The per-frame calls (:meth:`present`, :meth:`return_frame`, :meth:`present_and_return`) are
    C methods of the base class (csrc/hotpath.c); the rare paths they call back into are here.
    """

    def __init__(self, stream: Stream, width: int, height: int, device: int | CudaDevice | None,
                 format: ColorFormat | str | None, layout: Layout | str | None) -> None:
        self.format = None if format is None else color_format(format)
        check_size(width, height, self.format)
        self.layout = None if layout is None else Layout(layout)
        stream._check_producer_slot()
        self.stream = stream
        self.width = width
        self.height = height
        self.device = stream._device(device)
        self.device.make_current()
        self._connection = ffi.new("CUeglStreamConnection *")
        check(lib.cuEGLStreamProducerConnect(self._connection, stream.handle, width, height),
              "cuEGLStreamProducerConnect", "connecting the CUDA producer")
        self._finalizer = weakref.finalize(self, _disconnect, self.device.ordinal, "producer", self._connection, 0, False)
        # The base class keeps the frames in flight (a C table; _in_flight gives a dict copy) and
        # every frame ever presented (_associated), by plane-0 address: the driver keeps them associated with the stream until
        # disconnect, and Frame.close refuses meanwhile, so a frame found there is known to be open
        # and to match the connection (checked once, on first present).
        self._returned = ffi.new("CUeglFrame *")
        self._context = self.device.context
        self._weak_self = weakref.ref(self)
        self._bind(address(self._context), address(self._connection), address(self._returned),
                   stream.reuse_last_frame)
        stream.producer = self
        if isinstance(stream.consumer, CudaConsumer):
            # Both ends in this process: the consumer numbers frames from this producer's present
            # counts instead of an EGL query per frame, where that is exact (csrc/hotpath.c).
            stream.consumer._link_producer(self, stream.fifo_length > 0)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive or self.stream.closed

    def allocate_frame(self, format: ColorFormat | str | None = None, layout: Layout | str | None = None) -> Frame:
        """A new frame of this connection's size (and format and layout, if fixed)."""
        fmt = format if format is not None else (self.format if self.format is not None else ColorFormat.ARGB)
        lay = layout if layout is not None else (self.layout if self.layout is not None else Layout.PITCH)
        return Frame.allocate(self.width, self.height, fmt, lay, self.device)

    def _check_frame(self, frame: Frame) -> None:
        if not isinstance(frame, Frame):
            raise UsageError(f"present takes an eglcuda.Frame, got {type(frame).__name__}")
        frame._check_usable()
        if frame.width != self.width or frame.height != self.height:
            raise UsageError(f"frame is {frame.width}x{frame.height} but the producer connected for "
                             f"{self.width}x{self.height}")
        if self.format is not None and frame.format != self.format:
            raise UsageError(f"frame format {frame.format.name} differs from the stream's {self.format.name}")
        if self.layout is not None and frame.layout is not self.layout:
            raise UsageError(f"frame layout {frame.layout.value} differs from the stream's {self.layout.value}")
        if frame.device.ordinal != self.device.ordinal:
            raise UsageError(f"frame lives on CUDA device {frame.device.ordinal}, the producer on {self.device.ordinal}")
        if frame._is_managed():
            # Measured: cuEGLStreamProducerPresentFrame crashes the process (SIGSEGV) on a managed
            # frame (H100 and H200, driver 580). Refuse before the driver sees it.
            raise Unsupported("presenting managed (unified) memory on an EGLStream",
                              where=f"CUDA device {self.device.ordinal}",
                              hint="the driver crashes on it; present device or pinned memory frames "
                                   "(copy the managed data into one)")
        if frame.key in self._in_flight:
            raise UsageError("this frame is already in flight: wait for return_frame() to give it back")
        if self.in_flight >= MAX_FRAMES_IN_FLIGHT:
            raise UsageError(f"{MAX_FRAMES_IN_FLIGHT} frames are in flight (the driver's limit): "
                             "return_frame() one before presenting another")

    # ---- the rare paths of the C methods (each called inside the producer's gate) -----------
    _stream_handle = staticmethod(stream_handle)

    _timeout = staticmethod(_checked_timeout)

    def _fail_closed(self) -> NoReturn:
        raise ClosedError("the producer is disconnected (or its stream closed)")

    def _present_failed(self, status: int) -> NoReturn:
        raise self.stream._driver_failure(status, "cuEGLStreamProducerPresentFrame", "presenting a frame", "consumer")

    def _first_present(self, frame: Frame, key: Any) -> None:
        """After this producer presented ``frame`` for the first time: fix the connection's format
        and layout if they were open, and keep the frame associated."""
        if self.format is None:
            self.format = frame.format
        if self.layout is None:
            self.layout = frame.layout
        self._associated[key] = frame
        frame._producer = self._weak_self

    def _return_failed(self, status: int, waited_us: int) -> None:
        """A return call's failure (inside the gate): None for 'none yet', else the error."""
        if status == _LAUNCH_TIMEOUT:
            if waited_us and self.stream.state is StreamState.DISCONNECTED:
                # A consumer gone (its process may have died) never releases: say so.
                raise StreamDisconnected("the consumer disconnected from the stream: presented frames "
                                         "will not come back")
            return None
        raise self.stream._driver_failure(status, "cuEGLStreamProducerReturnFrame", "taking back a frame", "consumer")

    def _returned_unknown(self) -> NoReturn:
        raise UsageError(f"the driver returned a frame eglcuda did not present (plane 0 at 0x{self._returned_key:x})")

    def close(self) -> None:
        """Disconnect; every frame presented is then free to close. Safe to call twice."""
        if not self._finalizer.alive:
            return
        self._shut()
        self._finalizer()
        self._drop_in_flight()
        self._associated.clear()

    disconnect = close

    def __enter__(self) -> "CudaProducer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
