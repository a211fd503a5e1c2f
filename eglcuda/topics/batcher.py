"""Batches from many topics: :class:`Batcher` copies frames of N subscribers into one device
buffer per plane, ``[B, H, W]`` (``[B, H, W, C]`` for packed formats), and hands out
:class:`Batch` objects with each frame's metadata (:class:`BatchFrame`).

How a batch forms: the first frame of a batch starts its formation clock; frames are taken in
round-robin passes over the sources, one frame per source per pass, until ``batch_size`` frames
or ``formation_timeout`` seconds after that first frame. Each source frame is copied on the
batcher's stream and released at once; its publisher writes it again only after the copy ran on
the GPU (docs/ordering.md). A batch buffer is written again only after every stream the batch
was handed to has finished reading it, asked and waited for on the GPU at the batch's release.
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
import weakref
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from .._bind import cuda, cuda_egl
from .._integers import as_int
from .._lifecycle import Tracked, stay_if_ended_by_exit
from .._resource import Resource
from ..cuda_device import CudaDevice, get_device
from ..errors import ClosedError, Dropped, EglCudaError, MismatchedSource, StreamDisconnected, Timeout, UsageError, shown
from ..frames.formats import PLANE_ALIGNMENT, SAME_GEOMETRY, ColorFormat, Layout, PlaneGeometry, _plane_geometry
from ..frames.frame import FrameBase, Plane
from ..frames.interop import stream_handle
from .protocol import Reason
from .sockets import wait_seconds
from .subscriber import Subscriber, closed_error
from .transports.views import SlotView
from .waitset import WaitSet

MAX_BATCH = 1024  # frames in one batch
MAX_POOL = 16  # batch buffers
CLOSE_WAIT_S = 5.0  # how long close() waits for a next() of another thread to end


class BatchFrame:
    """One frame of a :class:`Batch`: where it came from and what its publisher said.

    - ``index``: its place in the batch (row ``index`` of every plane);
    - ``source``: the index of its subscriber in :attr:`Batcher.subscribers`; ``topic``: that
      subscriber's topic name;
    - ``seq``, ``timestamp_ns``, ``payload``, ``skipped``, ``received_ns``: the
      :class:`eglcuda.Message`'s (``skipped``: frames of this source published since its previous
      frame in a batch that this batcher did not get)."""

    __slots__ = ("index", "source", "topic", "seq", "timestamp_ns", "payload", "skipped", "received_ns")

    def __init__(self, index: int, source: int, topic: str, seq: int, timestamp_ns: int, payload: bytes,
                 skipped: int, received_ns: int) -> None:
        self.index = index
        self.source = source
        self.topic = topic
        self.seq = seq
        self.timestamp_ns = timestamp_ns
        self.payload = payload
        self.skipped = skipped
        self.received_ns = received_ns

    def __repr__(self) -> str:
        return f"<BatchFrame {self.index}: source {self.source} ({self.topic!r}) seq {self.seq}>"


class BatchPlane(Plane):
    """One plane of a :class:`Batch`: ``count`` images of the plane's geometry, back to back
    (rows ``pitch`` bytes apart, images ``height * pitch`` apart). A zero-copy view like a frame's
    :class:`eglcuda.Plane`: ``torch.from_dlpack(plane)`` and ``cupy.asarray(plane)`` see shape
    ``(count, height, width)`` or ``(count, height, width, channels)``, uint8, contiguous."""

    __slots__ = ("count",)

    def __init__(self, batch: "Batch", index: int, geometry: PlaneGeometry, address: int, count: int) -> None:
        super().__init__(batch, index, geometry, address)
        self.count = count

    @property
    def shape(self) -> tuple[int, ...]:
        g = self.geometry
        return (self.count, g.height, g.width, g.channels) if g.channels > 1 else (self.count, g.height, g.width)

    @property
    def strides(self) -> tuple[int, ...]:
        g = self.geometry
        image = g.height * g.pitch
        return (image, g.pitch, g.channels, 1) if g.channels > 1 else (image, g.pitch, 1)

    def _rows(self) -> Plane:
        """The whole batch plane as one tall plane (``count * height`` rows), for the copies."""
        g = self.geometry
        return Plane(self._frame, self.index, dataclasses.replace(g, height=g.height * self.count), self._address)

    def to_numpy(self) -> np.ndarray:
        """A host copy of the batch plane, shaped like :attr:`shape` (tests and debugging)."""
        return self._rows().to_numpy().reshape(self.shape)

    def copy_from(self, data: np.ndarray) -> None:
        """Upload host data of :attr:`shape` (uint8) into the batch plane."""
        data = np.ascontiguousarray(data)
        if data.dtype != np.uint8 or data.shape != self.shape:
            raise UsageError(f"expected uint8 data of shape {self.shape}, got {data.dtype} {data.shape}")
        g = self.geometry
        self._rows().copy_from(data.reshape(self.count * g.height, g.row_bytes))

    def copy_to_device(self, pointer: int, pitch: int, cuda_stream: Any = None) -> None:
        """Queue a copy of the whole batch plane (``count * height`` rows) into linear device
        memory, ``pitch`` bytes per row; ordered as :meth:`eglcuda.Plane.copy_to_device`."""
        self._rows().copy_to_device(pointer, pitch, cuda_stream)

    def copy_from_device(self, pointer: int, pitch: int, cuda_stream: Any = None) -> None:
        """Queue a copy of ``count * height`` rows of linear device memory into the batch plane."""
        self._rows().copy_from_device(pointer, pitch, cuda_stream)

    def __repr__(self) -> str:
        return f"<BatchPlane {self.index} {self.count}x{self.width}x{self.height}x{self.channels}>"


class _BatchMemory(Resource):
    """One batch buffer: every plane of ``batch_size`` images in one device allocation."""

    def __init__(self, device: CudaDevice, size: int) -> None:
        device.make_current()
        self.pointer = cuda.mem_alloc(size, f"allocating a batch buffer of {size} bytes")
        self._own(_free_memory, device.ordinal, self.pointer)


class _BatchStream(Resource):
    """The stream a batcher made for its copies (destroyed at its close or collection; in a
    forked child, never touched)."""

    def __init__(self, device: CudaDevice) -> None:
        device.make_current()
        self.handle = cuda_egl.stream_create()
        self._own(_destroy_stream, device.ordinal, self.handle)


def _destroy_stream(ordinal: int, stream: int) -> None:
    """Finalizer of a batcher's stream. Never raises (work still queued on it finishes first)."""
    try:
        get_device(ordinal).make_current()
        cuda_egl.stream_destroy(stream)
    except Exception:  # pragma: no cover - finalizers must not raise
        pass


def _free_memory(ordinal: int, pointer: int) -> None:
    """Finalizer of a batch buffer. Never raises."""
    try:
        get_device(ordinal).make_current()
        cuda.mem_free(pointer)
    except Exception:  # pragma: no cover - finalizers must not raise
        pass


class Batch(FrameBase):
    """A batch of frames from a :class:`Batcher`: ``planes`` (one :class:`BatchPlane` per plane
    of the topics' format, ``size`` images each) and ``frames`` (one :class:`BatchFrame` per
    image, in batch order). Read it on any stream, as a frame (docs/ordering.md): a DLPack
    consumer's stream is remembered, ``__cuda_array_interface__`` counts the likely readers,
    and other streams are named at :meth:`release`. The batch's memory is written again only
    after those streams finished reading it. A context manager that releases it."""

    __slots__ = ("_batcher", "_memory", "_stream", "_cuda_stream", "_slot", "frames", "size", "_layout",
                 "_plane_refs", "_handed_to", "_released", "width", "height", "format", "layout", "pitch", "device",
                 "__weakref__")

    def __init__(self, batcher: "Batcher", memory: _BatchMemory, slot: int, frames: list[BatchFrame]) -> None:
        # Nothing the batch holds refers back to it, and the batcher (which holds the batches
        # out) is held weakly: a batcher or a batch dropped without close() or release() goes
        # at once with its device memory, never waiting for the cycle collector.
        self._batcher = weakref.ref(batcher)
        self._memory = memory  # (the planes' views keep it alive through the batch)
        self._stream = batcher._stream  # (a stream the batcher made lives while a batch ordered on it does)
        self._cuda_stream = batcher._cuda_stream
        self._slot = slot
        self.frames = frames
        self.size = len(frames)
        self._handed_to: list[int] | None = None
        self._released = False
        self.width = batcher.width
        self.height = batcher.height
        self.format = batcher.format
        self.layout = Layout.PITCH
        self.pitch = batcher._layout[0][1].pitch
        self.device = batcher.device
        self._layout = batcher._layout
        # The planes are made when asked for and kept weakly: a plane keeps its batch alive.
        self._plane_refs: tuple[weakref.ReferenceType[BatchPlane], ...] = ()

    @property
    def _planes(self) -> tuple[BatchPlane, ...]:  # type: ignore[override]
        held = tuple([ref() for ref in self._plane_refs])
        if held and None not in held:
            return held  # type: ignore[return-value]  # None was ruled out just above
        base = self._memory.pointer
        planes = tuple([plane if plane is not None else BatchPlane(self, i, g, base + offset, self.size)
                        for i, (plane, (offset, g)) in enumerate(zip(held or (None,) * len(self._layout),
                                                                     self._layout))])
        self._plane_refs = tuple([weakref.ref(plane) for plane in planes])
        return planes

    @property
    def cuda_stream(self) -> int | None:
        """The stream the batch's copies were queued on (the batcher's); None once the batcher
        that made that stream for itself is closed (the stream goes with its last batch)."""
        if self._stream is not None:
            batcher = self._batcher()
            if self._stream.closed or (batcher is not None and batcher._closed):
                return None
        return self._cuda_stream

    @property
    def released(self) -> bool:
        return self._released

    @property
    def sources(self) -> list[int]:
        """The source of each image (``frames[i].source``)."""
        return [f.source for f in self.frames]

    def _check_usable(self) -> None:
        if self._released:
            raise ClosedError("the batch was released; its buffer is being filled again")

    def release(self, cuda_stream: Any = None) -> None:
        """Give the batch buffer back to the batcher. Its next copies into it wait, on the GPU,
        for every stream the batch was handed to and for ``cuda_stream`` (one more stream where
        work on it was queued that eglcuda could not learn of: a raw pointer, a
        ``__cuda_array_interface__`` view read on another stream). Safe to call twice."""
        if self._released:
            return
        if cuda_stream is not None:
            self._note_users((stream_handle(cuda_stream),))
        batcher = self._batcher()
        if batcher is None:  # (collected: nothing will write the buffer again; it goes with the batch)
            self._released = True
            return
        batcher._give_back(self)

    def __enter__(self) -> "Batch":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = " released" if self._released else ""
        return f"<Batch of {self.size} {self.width}x{self.height} {self.format.name}{state}>"


class Batcher:
    """Batches of up to ``batch_size`` frames from ``subscribers`` (an nvstreammux for topics).

    :param subscribers: the sources, :class:`eglcuda.Subscriber` objects (local or remote) of
        topics with one size and format, on one CUDA device; a source of another size or
        format is refused with :class:`eglcuda.MismatchedSource`. The batcher receives from them;
        they stay the caller's (close them after the batcher).
    :param batch_size: the most frames in a batch (1..1024); also the images in each buffer.
    :param formation_timeout: seconds from the first frame of a batch until the batch is handed
        out with what it has (0: what is ready at once, after the first frame).
    :param timeout: how long :meth:`next` waits for the first frame of a batch by default.
    :param pool: batch buffers (1..16): how many batches may be out at once. Two let the next
        batch's copies run while the GPU still reads the previous one.
    :param cuda_stream: the stream the copies are queued on and batches are ordered on (None:
        the stream the subscribers were all given, ``Subscriber(cuda_stream=s)``, when they share
        one, which spares a stream query per frame; else a stream made for the batcher).

    Collection is fair: sources are visited round-robin, one frame per source per pass, and
    each batch starts after the source the previous one ended with, so a source that always has
    frames waiting never keeps another's out of a batch. A source whose publisher is gone (or
    that was closed) leaves the rotation (:attr:`ended` says why); the others go on.
    """

    def __init__(self, subscribers: Iterable[Subscriber], batch_size: int, *, formation_timeout: float = 0.04,
                 timeout: float = 5.0, pool: int = 2, cuda_stream: Any = None) -> None:
        self._closed = True  # (until construction is done: close() has nothing to do)
        # close() from another thread while one is inside next(): it sets _closing, wakes the
        # wait through _wake (an eventfd in the wait set), and the buffers go once next() ended.
        self._closing = False
        # Held by the thread inside next(). Reentrant so that a close() from a signal handler
        # in that thread can tell it is inside (it leaves the teardown to next()'s end).
        self._call_lock = threading.RLock()
        self._inside = False  # a next() is running (a nested one, from a signal handler, is refused)
        # A release() from another thread and the teardown: the readers' streams are joined
        # onto the batcher's stream before that stream goes, never after. Reentrant: a signal
        # handler's close() or release() may run while its thread is inside either.
        self._release_lock = threading.RLock()
        self._wake: int | None = None
        self._wake_attachment: Any = None
        self._wake_closer: Any = None
        # Frames a next() took and copied into the free buffer before it raised: the next batch
        # starts with them (they were released to their publishers; they are not lost).
        self._carried: list[BatchFrame] = []
        counts = []
        for label, value, most in (("batch_size", batch_size, MAX_BATCH), ("pool", pool, MAX_POOL)):
            count = as_int(value)
            if count is None or not 1 <= count <= most:
                raise UsageError(f"{label} is an int in 1..{most}, got {shown(value)}")
            counts.append(count)
        batch_size, pool = counts
        self._formation_timeout = wait_seconds(formation_timeout, "formation_timeout")
        self._timeout = wait_seconds(timeout, "timeout")
        if isinstance(subscribers, Subscriber):
            # (A subscriber is iterable too, message after message: taken as the list, it would
            # receive until its publisher closed.)
            raise UsageError("subscribers is a list of eglcuda.Subscriber, got one Subscriber: Batcher([sub], ...)")
        if isinstance(subscribers, (str, bytes)) or not isinstance(subscribers, Iterable):
            raise UsageError(f"subscribers is a list of eglcuda.Subscriber, got {type(subscribers).__name__}")
        #: The sources, in the order given (a batch frame's ``source`` is an index into it).
        self.subscribers: tuple[Subscriber, ...] = tuple(subscribers)
        if not self.subscribers:
            raise UsageError("a batcher needs at least one subscriber")
        self._batch_size = batch_size
        self.device: CudaDevice = self._check_sources(self.subscribers)
        first = self.subscribers[0]
        info = first.info
        assert info is not None  # (_check_sources: every source is connected)
        self.width, self.height, self.format = info.width, info.height, info.format
        self._layout, size = _batch_layout(info.format, info.width, info.height, batch_size)
        self._plane_shapes = tuple((g.height, g.width, g.channels) for _, g in self._layout)
        # Per plane: the copy's parameters, made once (each frame fills in its addresses), and
        # the bytes from one image to the next in the buffer.
        self._plans = tuple((cuda.copy_plan(g.row_bytes, g.height, g.pitch), offset, g.height * g.pitch)
                            for offset, g in self._layout)
        self._stream: _BatchStream | None = None  # the stream the batcher made for itself, while it is open
        self._made_stream = False
        self._pid = os.getpid()  # (in a forked child the batcher is the parent's: no driver call there)
        self._memory: list[_BatchMemory] = []
        self._waitset: WaitSet | None = None
        self.device.make_current()
        try:
            if cuda_stream is None:
                # (Only the caller's stream: one a subscriber made goes at its close, which may
                # come before the batcher's, as a source that ends does.)
                shared = {s.cuda_stream for s in self.subscribers}
                if len(shared) == 1 and None not in shared and not any(s._made_its_stream() for s in self.subscribers):
                    self._cuda_stream: int = shared.pop()  # type: ignore[assignment]  # (None ruled out)
                else:
                    self._stream = _BatchStream(self.device)
                    self._cuda_stream = self._stream.handle
                    self._made_stream = True
            else:
                self._cuda_stream = stream_handle(cuda_stream)
            self._memory = [_BatchMemory(self.device, size) for _ in range(pool)]
            self._free = list(range(pool))  # buffers whose batch was released (or never handed out)
            self._out: dict[int, Batch] = {}
            self._waitset = WaitSet()
            self._attached = [self._waitset.attach(s) for s in self.subscribers]
            self._wake = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
            self._wake_closer = weakref.finalize(self, os.close, self._wake)
            self._wake_attachment = self._waitset.attach(self._wake)
            self._attachments = {id(a): i for i, a in enumerate(self._attached)}
        except BaseException:
            self._closed = False
            self.close()
            raise
        self._closed = False
        _open.add(self)
        self._cursor = 0  # the source the next batch starts its first pass with
        self._ready = set(range(len(self.subscribers)))  # sources that may have a frame (asked first)
        self._last_seq: list[int | None] = [None] * len(self.subscribers)
        self._last_join: list[Any] = [None] * len(self.subscribers)  # each source's TopicInfo at that frame
        self._names = tuple(s.name for s in self.subscribers)
        # Per source: the mapped slots' description (a SlotView's _spec) whose geometry matched
        # the batch's, with each plane's copy (plan, offset in a slot, pitch, offset in the
        # buffer, bytes an image): a frame of it is copied from its slot's address in one call,
        # without making its Plane objects (None: not seen yet).
        self._slot_planes: list[tuple[Any, tuple[tuple[Any, int, int, int, int], ...]] | None] = \
            [None] * len(self.subscribers)
        self._stream_arg = cuda.stream_arg(self._cuda_stream)
        #: Sources that left the rotation: their index -> the error that ended them.
        self.ended: dict[int, BaseException] = {}
        self._errors: dict[int, BaseException] = {}  # sources the wait set reported ended

    @staticmethod
    def _check_sources(subscribers: Sequence[Subscriber]) -> CudaDevice:
        """Refuse what cannot be batched, before any driver call; the sources' CUDA device."""
        seen: dict[int, int] = {}
        reference = None
        for index, sub in enumerate(subscribers):
            if not isinstance(sub, Subscriber):
                raise UsageError(f"subscriber {index} is a {type(sub).__name__}, not an eglcuda.Subscriber")
            if id(sub) in seen:
                raise UsageError(f"subscriber {index} is subscriber {seen[id(sub)]} again: give each source once")
            seen[id(sub)] = index
            if sub.closed:
                raise ClosedError(f"subscriber {index} (topic {sub.name!r}) is closed")
            if sub._remote is None and sub._forked:  # (the parent's connection: wait_for_publisher() raises here)
                raise sub._forked_error()
            info = sub.info
            if not sub.connected or info is None:
                raise UsageError(f"subscriber {index} (topic {sub.name!r}) is not connected to its publisher: "
                                 "wait_for_publisher() first")
            device = sub._cuda_device()
            if device is None:
                raise UsageError(f"subscriber {index} (topic {sub.name!r}) receives into GL textures; a batcher "
                                 "takes CUDA subscribers")
            described = (info.width, info.height, info.format, device.ordinal)
            if reference is None:
                reference = (sub.name, described)
                first_device: CudaDevice = device
                continue
            if described != reference[1]:
                raise MismatchedSource(_mismatch(index, sub.name, described, *reference))
        return first_device

    # ---- forming batches ---------------------------------------------------------------------
    def next(self, timeout: float | None = None) -> Batch:
        """The next batch: waits up to ``timeout`` seconds (None: the batcher's ``timeout``) for
        its first frame, then up to ``formation_timeout`` for more, and returns a batch of 1 to
        ``batch_size`` frames. Raises :class:`eglcuda.Timeout` when no frame came,
        :class:`eglcuda.StreamDisconnected` once every source ended (the last one's reason),
        :class:`eglcuda.UsageError` when ``pool`` batches are out unreleased,
        :class:`eglcuda.ClosedError` when :meth:`close` (from another thread too) ended it.
        Frames taken before an error in the same call are not lost: the next batch starts
        with them."""
        if self._closed or self._closing:
            raise ClosedError("the batcher is closed")
        if os.getpid() != self._pid:
            raise UsageError(f"this batcher belongs to process {self._pid}, not to this forked child: make a new "
                             "Batcher here (close() here only lets go of its copy)")
        wait = self._timeout if timeout is None else wait_seconds(timeout)
        nested = False
        error: BaseException | None = None
        if not self._call_lock.acquire(blocking=False):
            if self._closing:
                raise ClosedError("the batcher is closed")
            raise UsageError("another thread is inside this batcher's next(): form batches in one thread")
        try:  # (at once after the lock: nothing that could raise runs between the two)
            if self._inside:  # (this thread, from a signal handler that interrupted a next())
                nested = True
                raise UsageError("next() called from inside next() (a signal handler?): form batches in one place")
            self._inside = True
            if self._closed or self._closing:  # (closed as this call began)
                raise ClosedError("the batcher is closed")
            return self._form(wait)
        except BaseException as exc:
            error = exc
            raise
        finally:
            if nested:
                self._call_lock.release()  # (the outer next() goes on as it was)
            else:
                self._end_call()
                if error is not None:
                    # The exit hooks closed the sources under a daemon thread's next(): it stays
                    # here, no lock held, to be stopped with the interpreter (as a receive does).
                    stay_if_ended_by_exit(error)

    def _end_call(self) -> None:
        """next()'s end, lock held: the teardown a close() left to it, then the lock."""
        self._inside = False
        try:
            if self._closing:
                self._teardown()  # (close() came from another thread, or from a signal handler in this one)
        finally:
            self._call_lock.release()
        # A close() from a signal handler after the check above left the teardown to us.
        if self._closing and not self._closed and self._call_lock.acquire(blocking=False):
            try:
                self._teardown()
            finally:
                self._call_lock.release()

    def _form(self, wait: float) -> Batch:
        """next()'s work, in the one thread inside it."""
        if not self._free:
            raise UsageError(f"{len(self._out)} batches are out, as many as the pool holds: release one first")
        frames, self._carried = self._carried, []
        if len(self.ended) == len(self.subscribers) and not frames:
            raise self._all_ended()
        slot = self._free[0]  # (the buffer carried frames were copied into: a release appends)
        memory = self._memory[slot]
        # For the first frame; then the formation clock's, which starts at the batch's first
        # frame (received_ns: the same clock).
        deadline = frames[0].received_ns / 1e9 + self._formation_timeout if frames else time.monotonic() + wait
        self.device.make_current()
        try:
            while True:
                empty = not frames
                self._pass(memory.pointer, frames)
                if empty and frames:
                    deadline = frames[0].received_ns / 1e9 + self._formation_timeout
                if len(frames) == self._batch_size:
                    break
                if len(self.ended) == len(self.subscribers):
                    if frames:
                        break
                    raise self._all_ended()
                if frames and time.monotonic() >= deadline:
                    break  # (the formation time is up: sources that keep sending cannot stretch it)
                # Every source asked in the pass is now waited for (none is left ready): one wait
                # collects each source that has frames, returning at once when any has (past the
                # deadline it only asks), so a source that always has one is never the only one asked.
                woken = self._wait_for_frames(deadline)
                if self._closing:
                    raise ClosedError("the batcher was closed")
                if not woken:
                    if frames:
                        break
                    raise Timeout(f"no frame from any of {len(self.subscribers)} sources in {wait} s")
            if self._closing:  # (closed while this pass copied: no batch of a closed batcher)
                raise ClosedError("the batcher was closed")
        except BaseException:
            self._carried = frames
            raise
        self._free.pop(0)
        batch = Batch(self, memory, slot, frames)
        self._out[slot] = batch
        return batch

    def _pass(self, base: int, frames: list[BatchFrame]) -> None:
        """One round-robin pass: one frame from each source that has one ready, starting at the
        cursor, until the batch is full."""
        ready = self._ready
        if not ready or len(frames) >= self._batch_size:  # (a batch carried over full: no room)
            return
        subscribers = self.subscribers
        count = len(subscribers)
        start = self._cursor
        order = sorted(ready, key=lambda i: (i - start) % count) if len(ready) > 1 else list(ready)
        stream = self._cuda_stream
        for index in order:
            source = subscribers[index]
            # The source's receive lock is held until the frame is released behind its copies: a
            # close() from another thread waits for it, so that it unmaps nothing the copies read.
            # (Held by another thread's receive: nothing to take now, as receive(0) would say.)
            turn = source._receive_turn()
            if not turn.acquire(False):
                ready.discard(index)
                continue
            try:
                try:
                    message = source.receive(0)
                except Timeout:
                    ready.discard(index)
                    if index in self._errors:
                        self._end(index, self._errors[index])
                    continue
                except (StreamDisconnected, ClosedError) as exc:
                    self._end(index, exc)
                    continue
                try:
                    self._copy(index, message, base, frames)
                except EglCudaError:
                    if not source._ending():
                        raise
                    # Closed by another thread since its receive: the frame was let go (its memory may
                    # be unmapped already) and is not copied; the source ends as a closed one does.
                    self._end(index, closed_error(self._names[index]))
                    continue
                finally:
                    # Released on the batcher's stream, behind the copies: the done event the
                    # publisher waits for before it writes the frame again is recorded there (no
                    # event orders the subscriber's stream after ours first).
                    message.release(stream)
            finally:
                turn.release()
                source._turn_ended()  # (a signal handler's close() put off while the lock was held)
            # Asked again only once the wait set says it has a frame (a receive that finds
            # none costs an exception).
            ready.discard(index)
            self._cursor = (index + 1) % count
            if len(frames) == self._batch_size:
                break

    def _copy(self, index: int, message: Any, base: int, frames: list[BatchFrame]) -> None:
        """Queue the copies of ``message``'s planes into image ``len(frames)`` of the buffer at
        ``base``, on the batcher's stream, ordered after the frame's stream (the message,
        released on that stream, then waits for the copies: docs/ordering.md)."""
        frame = message.frame
        stream = self._cuda_stream
        position = len(frames)
        known = self._slot_planes[index]
        if known is not None and frame.__class__ is SlotView and frame._spec is known[0] and not frame._released:
            # A mapped slot of a geometry checked before: addresses from the slot's base.
            source_stream = frame._stream
            if source_stream is not None and source_stream != stream:
                cuda.join_streams(stream, (source_stream,), "ordering a batch's copy after its source frame")
            frame._note_users((stream,))
            cuda.copy_planned_all(self._stream_arg, known[1], frame._base, base, position)
        elif not self._copy_planes(index, frame, base, position):
            return
        last = self._last_seq[index]
        seq = message.seq
        info = self.subscribers[index].info
        if last is None or info is not self._last_join[index]:
            # The source's first frame, or its first since its subscriber joined a publisher
            # again (wait_for_publisher() called by the program): seqs count from that one.
            skipped = message.skipped
            self._last_join[index] = info
        else:
            skipped = seq - last - 1
        self._last_seq[index] = seq
        frames.append(BatchFrame(position, index, self._names[index], seq, message.timestamp_ns, message.payload,
                                 skipped, message.received_ns))

    def _copy_planes(self, index: int, frame: Any, base: int, position: int) -> bool:
        """_copy through the frame's planes (any frame; the first of each source's mapped slots
        checks their geometry once); False when the frame does not fit the batch (its source ended)."""
        planes = frame.planes
        if frame.width != self.width or frame.height != self.height or frame.format is not self.format:
            # (Plane shapes follow from size and format: the full check only for a frame that differs.
            # A format of the same bytes under another name, as the driver labels NV12, is the
            # batch's; another one with planes of the same shapes, BGRA for ARGB, is not.)
            shapes = tuple((p.height, p.width, p.channels) for p in planes)
            label = SAME_GEOMETRY.get(frame.format, frame.format)
            if shapes != self._plane_shapes or label is not SAME_GEOMETRY.get(self.format, self.format):
                error = MismatchedSource(f"source {index} (topic {self.subscribers[index].name!r}) sent a "
                                         f"{frame.width}x{frame.height} {frame.format.name} frame of planes {shapes}, "
                                         f"the batch's are {self.width}x{self.height} {self.format.name}, planes "
                                         f"{self._plane_shapes}")
                self._end(index, error)
                return False
        stream = self._cuda_stream
        # Our stream waits for the frame's only while that stream has work queued (an idle one
        # costs one query, no event); the frame's release, on our stream, waits for our copies.
        source_stream = frame.cuda_stream
        if source_stream is not None:
            cuda.join_streams(stream, (source_stream,), "ordering a batch's copy after its source frame")
        frame._note_users((stream,))
        for plane, (plan, offset, image), (_, g) in zip(planes, self._plans, self._layout):
            target = base + offset + position * image
            kind, address, pitch = plane._location()
            if kind == "device":
                cuda.copy_planned(stream, plan, address, pitch, target)
            else:  # (a CUDA array)
                cuda.copy_2d(stream, (kind, address, pitch), ("device", target, g.pitch), g.row_bytes, g.height, False)
        if frame.__class__ is SlotView and frame.layout is not Layout.ARRAY:
            geometry = frame._spec.geometry
            self._slot_planes[index] = (frame._spec, tuple(
                (plan, at, plane.geometry.pitch, offset, image)
                for (plan, offset, image), at, plane in zip(self._plans, geometry.plane_offsets, planes)))
        return True

    def _wait_for_frames(self, deadline: float) -> bool:
        """Sleep until a source has something (its subscriber is readable, or it ended) or
        ``deadline`` (past it: only ask, without sleeping); returns whether one woke it."""
        waitset = self._waitset
        assert waitset is not None
        while True:
            events = waitset.wait(max(0.0, deadline - time.monotonic()))
            woken = stray = False
            for event in events:
                if event.attachment is self._wake_attachment:
                    if not self._closing:  # (a stray write: drained, so that it does not wake every wait)
                        try:
                            os.eventfd_read(self._wake)  # type: ignore[arg-type]  # (attached: not None)
                        except OSError:  # (BlockingIOError: drained already)
                            pass
                        stray = True
                        continue
                    return True
                woken = True
                index = self._attachments.get(id(event.attachment))
                if index is None or index in self.ended:
                    continue
                if event.kind == "error":
                    # Frames queued before the end are still received first: the source ends when
                    # its receive says so (or, should it have nothing more, with this error).
                    self._errors[index] = event.error or StreamDisconnected(f"source {index} ended")
                self._ready.add(index)
            if woken or not stray or time.monotonic() >= deadline:
                return woken  # (a stray wake alone is no reason to end the wait early)

    def _end(self, index: int, error: BaseException) -> None:
        """Source ``index`` leaves the rotation, for ``error``."""
        if index in self.ended:
            return
        # Kept without the traceback of its raise: that holds the frame of _pass (this batcher)
        # and, for a subscriber's lasting error (its publisher gone), the subscriber keeps it too.
        # With it, a batcher dropped unclosed stayed, with its buffers and stream, for as long as
        # that subscriber lived (not "at once"), or until the cycle collector ran.
        error.__traceback__ = None
        self.ended[index] = error
        self._ready.discard(index)
        attachment = self._attached[index]
        del self._attachments[id(attachment)]
        if self._waitset is not None:
            # (An ended subscriber's descriptor stays readable: left attached, every wait would
            # return at once.)
            self._waitset.detach(attachment)

    def _all_ended(self) -> StreamDisconnected:
        reasons = "; ".join(f"source {i} ({self.subscribers[i].name!r}): {e}" for i, e in sorted(self.ended.items()))
        last = self.ended[max(self.ended)]
        error = StreamDisconnected(f"every source of the batcher ended: {reasons}")
        error.__cause__ = last
        return error

    def _give_back(self, batch: Batch) -> None:
        """A batch's release: the next copies into its buffer (all on the batcher's stream) wait
        on the GPU for every stream that read it and may still run."""
        with self._release_lock:
            if batch._released or self._closed or self._out.get(batch._slot) is not batch:
                batch._released = True  # (the batcher was closed meanwhile: its teardown has the buffer)
                return
            readers = batch._handed_to
            if readers and os.getpid() == self._pid:  # (in a forked child: the parent's streams)
                self.device.make_current()
                # (Should this raise, the batch stays out and usable: a release may be tried again.)
                cuda.join_streams(self._cuda_stream, readers, "ordering a batch buffer after its readers")
            if batch._released:
                return  # (a signal handler's release() or close() ran during the join: it gave the buffer back)
            batch._released = True
            del self._out[batch._slot]
            self._free.append(batch._slot)

    # ---- iteration and state -----------------------------------------------------------------
    def __iter__(self) -> Iterator[Batch]:
        """Batches until every source ended; each step releases the previous batch if it is
        still out. Ends quietly when every source's publisher closed its topic; other ends
        raise as in :meth:`next`."""
        previous: Batch | None = None
        try:
            while True:
                if previous is not None:
                    previous.release()
                try:
                    previous = self.next()
                except StreamDisconnected:
                    if all(isinstance(e, Dropped) and e.code == Reason.CLOSING for e in self.ended.values()):
                        return
                    raise
                yield previous
        finally:
            if previous is not None:
                previous.release()

    @property
    def batch_size(self) -> int:
        """The most frames in a batch (the images each buffer was made for: fixed)."""
        return self._batch_size

    @property
    def formation_timeout(self) -> float:
        """Seconds from a batch's first frame until it is handed out with what it has; may be
        set (checked as at construction)."""
        return self._formation_timeout

    @formation_timeout.setter
    def formation_timeout(self, seconds: float) -> None:
        self._formation_timeout = wait_seconds(seconds, "formation_timeout")

    @property
    def timeout(self) -> float:
        """How long :meth:`next` waits for a batch's first frame by default; may be set (checked
        as at construction)."""
        return self._timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._timeout = wait_seconds(seconds, "timeout")

    @property
    def cuda_stream(self) -> int | None:
        """The stream the copies are queued on and batches are ordered on (a ``CUstream``
        handle); None once the batcher that made it for itself is closed (it is destroyed then, or
        with the last batch still out; a caller's or the subscribers' stream stays named)."""
        if self._made_stream and (self._closed or self._stream is None or self._stream.closed):
            return None
        return self._cuda_stream

    @property
    def closed(self) -> bool:
        return self._closed or self._closing

    @property
    def outstanding(self) -> int:
        """Batches handed out and not released."""
        return len(self._out)

    def close(self) -> None:
        """Stop batching: batches still out become unusable (their memory is freed once no view
        of it is left), the buffers and the batcher's own stream go; the subscribers stay open.
        Safe to call twice, and from another thread: a :meth:`next` waiting there raises
        :class:`eglcuda.ClosedError` at once, and the buffers go as it returns (this call waits
        for that up to 5 s). From a signal handler that interrupted :meth:`next` in the same
        thread it returns at once, and the buffers go as that next() returns (a next() from such
        a handler raises :class:`eglcuda.UsageError`). In a forked child it makes no driver call
        (the buffers and the stream are the parent's): it only lets go of the child's copies."""
        if self._closed or self._closing:
            return
        self._closing = True
        if os.getpid() != self._pid:
            # (A forked child's copy: its next() refuses to run, and the wake descriptor is
            # shared with the parent, whose wait it must not end.)
            self._teardown()
            return
        with self._release_lock:
            if self._wake is not None:
                try:
                    os.eventfd_write(self._wake, 1)
                except OSError:  # (its counter is full: it is readable anyway)
                    pass
        if self._call_lock._is_owned():  # type: ignore[attr-defined]
            return  # (a signal handler inside next(): the buffers go as it returns)
        if self._call_lock.acquire(timeout=CLOSE_WAIT_S):
            try:
                self._teardown()
            finally:
                self._call_lock.release()
        # (else the next() of another thread has not returned yet: the buffers go as it does)

    def _teardown(self) -> None:
        """close()'s work (once): by the thread that holds the call lock, or by a forked child
        for its copy."""
        with self._release_lock:
            if self._closed:
                return
            self._closed = True
            _open.discard(self)
            out = getattr(self, "_out", {})
            for batch in out.values():
                batch._released = True
            self._out = {}
            # (Under the lock: a close() from another thread writes the wake under it, never to a
            # descriptor closed here, whose number another file may have taken.)
            closer, self._wake_closer, self._wake = self._wake_closer, None, None
            if closer is not None:
                closer()
        waitset, self._waitset = self._waitset, None
        if waitset is not None:
            waitset.close()
        try:
            if self._memory and os.getpid() == self._pid:
                self.device.make_current()
                cuda.stream_synchronize(self._cuda_stream, "finishing a batcher's copies")
        finally:
            for slot, memory in enumerate(self._memory):
                if slot not in out:
                    memory.close()
                # (A buffer whose batch is out may still be viewed, by a tensor made from it: its
                # memory goes when the batch and every view of it are gone.)
            self._memory = []
            # With a batch out, the stream goes with the last of them, as its buffer does: a read
            # of it that began before this close (another thread's to_numpy(), say) still queues on it.
            if self._stream is not None and not out:
                self._stream.close()
            self._stream = None  # (the batches out hold it: it goes with the last of them, not with this object)

    def __enter__(self) -> "Batcher":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{len(self.subscribers) - len(self.ended)} sources, {len(self._out)} out"
        return f"<Batcher of {self.batch_size} {self.width}x{self.height} {self.format.name}: {state}>"


def _forked(batcher: Batcher) -> None:
    # In a forked child: fresh locks (another thread of the parent may have held one at the
    # fork, and nothing in the child would let it go; the child's close() and release() take them).
    batcher._call_lock = threading.RLock()
    batcher._release_lock = threading.RLock()
    # Batches handed out stop working here: their buffers and stream are the parent's (exporting
    # or releasing one would be driver calls), as a subscriber's messages do.
    for batch in batcher._out.values():
        batch._released = True


def _at_exit(batcher: Batcher) -> None:
    """Nothing: at exit a batcher's buffers and stream close as eglcuda's other resources do."""


_open: Tracked[Batcher] = Tracked(_forked, _at_exit)


def _batch_layout(fmt: ColorFormat, width: int, height: int,
                  batch_size: int) -> tuple[tuple[tuple[int, PlaneGeometry], ...], int]:
    """Where each plane's ``batch_size`` images go in one buffer: ((offset, geometry), ...) with
    rows packed (pitch = the row's bytes), and the buffer's size."""
    layout = []
    offset = 0
    for g in _plane_geometry(fmt, width, height, 0):
        packed = dataclasses.replace(g, pitch=g.row_bytes)
        layout.append((offset, packed))
        offset += -(-packed.row_bytes * packed.height * batch_size // PLANE_ALIGNMENT) * PLANE_ALIGNMENT
    return tuple(layout), offset


def _mismatch(index: int, name: str, described: tuple[Any, ...], first_name: str, first: tuple[Any, ...]) -> str:
    def words(d: tuple[Any, ...]) -> str:
        return f"{d[0]}x{d[1]} {d[2].name} on CUDA device {d[3]}"

    return (f"subscriber {index} (topic {name!r}) receives {words(described)}, subscriber 0 (topic "
            f"{first_name!r}) {words(first)}: one batch holds frames of one size and format (scale the "
            "source, or batch it separately)")
