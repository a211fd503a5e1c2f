"""A relay's staging ring: :class:`Staging` owns the page-locked buffers that frames are copied
into (device -> host, on the relay's stream) and sent from, which of them are free, how many
sends still read each one, and the count of frames its remote subscribers can take now.

Two threads use it: the relay's local thread stages frames (:meth:`Staging.stage`, which copies
a frame only when some remote subscriber has room for it), the UCX engine's thread counts the
room (:meth:`Staging.set_room`), asks whether a staged frame's copy is done
(:meth:`Staging.copied`) before any send reads it, and gives buffers back as their sends end
(:meth:`Staging.unref`).

The local thread does not wait for a copy whose bytes nobody on the host reads before the send
(frames="plain": the seal covers the header, written by the host): it records the buffer's event
after the copy and goes back for the next frame, so that several frames can be in copy at once.
A seal over the frame's bytes (frames="integrity" or "encrypted") needs them on the host: then the
local thread waits for the copy, as it must before sealing.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any

from .._bind import cuda
from ..cuda_device import CudaDevice
from ..errors import EglCudaError
from . import wire
from .buffers import Pinned
from .session import FrameMode, FrameSeal

log = logging.getLogger("eglcuda.remote")

STAGING = 12  # staging buffers of a relay (frames between its D2H copy and the end of their sends)


class Staging:
    """The staging ring of a relay reading frames on ``device``'s ``stream``, sealing each with
    ``seal``. ``wait``: how long :meth:`stage` waits for a free buffer (0: a 'latest' relay
    skips the frame instead)."""

    def __init__(self, device: CudaDevice, stream: int, seal: FrameSeal, wait: float) -> None:
        self._device = device
        self._stream = stream
        self._seal = seal
        self._wait = wait
        self._ring: Pinned | None = None
        self._events: list[int] = []  # each buffer's: recorded after its copy (pipelined copies)
        self._pipelined = seal.mode is FrameMode.PLAIN  # (a seal over the frame's bytes waits for them)
        self._refs: dict[int, int] = {}  # sends still reading each buffer (engine's thread)
        # Free buffers: taken by the local thread, given back by the engine's (a lock held for a
        # deque's step, and a notify only while an 'every' relay's local thread waits for one).
        self._free: collections.deque[int] = collections.deque()
        self._free_cond = threading.Condition(threading.Lock())
        self._waiting = 0
        self._refused_at = -1.0  # when a frame last found no free buffer (monotonic)
        # Set while some remote subscriber can take a frame now, waited on by the local thread.
        # Under _room_lock: _room (the most frames one remote can take now: the engine's count)
        # and _staged (frames the local thread copied or is copying, not yet dispatched): a frame
        # is copied only when room is left for it, never only to be skipped.
        self.wanted = threading.Event()
        self._room_lock = threading.Lock()
        self._room = 0
        self._staged = 0
        self._skipped = -1  # the newest frame not staged for want of room (under _room_lock)
        # Each buffer's D2H copy parameters per plane (local thread), made at its first frame of
        # the ring's geometry: a frame fills in only where it is read from.
        self._plans: list[list[tuple[Any, int]] | None] = []  # (parameters, offset in the buffer)
        self._stream_arg = cuda.stream_arg(stream)

    def reallocates(self, frame_bytes: int) -> bool:
        """Whether :meth:`allocate` for frames of ``frame_bytes`` makes a new ring (the ring it
        has is for another size), which it may only once every send of the old one ended."""
        return self._ring is None or self._ring.size != wire.message_bytes(frame_bytes)

    def allocate(self, frame_bytes: int, what: str) -> None:
        """Buffers for frames of ``frame_bytes`` (all of them free: no send may read them)."""
        size = wire.message_bytes(frame_bytes)
        self._plans = [None] * STAGING  # (a new publisher's planes may lie otherwise in the same bytes)
        with self._room_lock:
            self._skipped = -1  # (a new publisher numbers its frames from 0 again: nothing of its was skipped)
        if not self.reallocates(frame_bytes):
            return  # (a restarted publisher of the same frame size: the ring serves as it is)
        old, self._ring = self._ring, None
        if old is not None:
            old.close()
        self._ring = Pinned(self._device, STAGING, size, what)
        if self._pipelined and not self._events:
            self._device.make_current()
            for _ in range(STAGING):
                self._events.append(cuda.event_create())
        with self._free_cond:
            self._free = collections.deque(range(STAGING))
        self._refs = {}

    # ---- the local thread ------------------------------------------------------------------------
    def stage(self, message: Any) -> int | None:
        """Queue the copy of ``message``'s frame into a free buffer and seal it; its index (None:
        skipped, nobody has room or no buffer is free). The copy may still run when this returns:
        nothing sends from the buffer before :meth:`copied` says so; ``message`` may be released
        at once (its release is ordered after the copy, queued on the subscriber's stream). A
        staged frame counts against the room until the engine dispatched it (:meth:`set_room`'s
        ``dispatched``)."""
        if not self._reserve(message.seq):
            return None  # nobody to send it to now: no copy
        index = self._take()
        if index is None:
            self._unreserve()
            return None  # every staging buffer is still being sent: this frame is skipped
        ring = self._ring
        assert ring is not None
        out = ring.arrays[index]
        try:
            wire.pack_frame(out, message.seq, message.timestamp_ns, message.payload)
            self._device.make_current()
            planes = message.frame.planes
            plans = self._plans[index]
            if plans is None:
                plans = self._plans[index] = self._plan(ring.address(index), planes)
            for plane, (plan, at) in zip(planes, plans):
                kind, address, pitch = plane._location()
                if kind == "device":
                    cuda.copy_host_planned(self._stream_arg, plan, address, pitch)
                else:  # (a frame in a CUDA array: its parameters each time)
                    g = plane.geometry
                    cuda.copy_2d(self._stream, (kind, address, pitch), ("host", out[at:], g.row_bytes), g.row_bytes,
                                 g.height, False)
            if self._pipelined:
                self._seal.seal(out)  # (the header's seal: the host's bytes, not the copy's)
                cuda.event_record(self._events[index], self._stream, "marking a relay's staging copy")
            else:
                cuda.stream_synchronize(self._stream, "copying a frame to a relay's staging buffer")
                self._seal.seal(out)  # (a seal over the frame's bytes too, or encrypted: frames=)
        except BaseException:
            self._give(index)
            self._unreserve()
            raise
        return index

    @staticmethod
    def _plan(host: int, planes: Any) -> list[tuple[Any, int]]:
        """The D2H copy parameters of each of ``planes`` into the buffer at ``host``, with where
        each lands in it: packed one after the other behind the message's header and payload area."""
        plans = []
        at = wire.DATA_AT
        for plane in planes:
            g = plane.geometry
            plans.append((cuda.host_copy_plan(host + at, g.row_bytes, g.height, to_host=True), at))
            at += g.row_bytes * g.height
        return plans

    def _take(self) -> int | None:
        """A free buffer; None when there is none (an 'every' relay waits up to its ``wait``, as a
        local 'every' subscriber would: the publisher's every_timeout decides; the watchdog drops
        the remote subscribers that keep the buffers)."""
        with self._free_cond:
            if not self._free and self._wait:
                self._waiting += 1
                try:
                    self._free_cond.wait_for(lambda: bool(self._free), self._wait)
                finally:
                    self._waiting -= 1
            if self._free:
                return self._free.popleft()
            self._refused_at = time.monotonic()
            return None

    def refused_since(self, since: float) -> bool:
        """Whether a frame found no free buffer at or after monotonic time ``since`` (some remote
        subscriber had room for it)."""
        return self._refused_at >= since

    def _give(self, index: int) -> None:
        with self._free_cond:
            self._free.append(index)
            if self._waiting:
                self._free_cond.notify()

    def _reserve(self, seq: int) -> bool:
        """Count one more frame staged (``seq``), if some remote subscriber has room left for it."""
        with self._room_lock:
            if self._room - self._staged <= 0:
                self.wanted.clear()
                self._skipped = max(self._skipped, seq)
                return False
            self._staged += 1
            if self._room - self._staged <= 0:
                self.wanted.clear()
            return True

    def _unreserve(self) -> None:
        """A reserved frame was not staged after all."""
        with self._room_lock:
            self._staged -= 1
            if self._room - self._staged > 0:
                self.wanted.set()

    def sends_ended(self, timeout: float) -> bool:
        """Whether every buffer came back (every send from them ended) within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while len(self._free) < STAGING:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    # ---- the engine's thread ---------------------------------------------------------------------
    def copied(self, index: int) -> bool:
        """Whether the copy into buffer ``index`` (staged) is done: its bytes may be sent."""
        if not self._pipelined:
            return True  # (stage() waited for it)
        self._device.make_current()
        return cuda.event_done(self._events[index], "asking whether a relay's staging copy is done")

    def set_room(self, room: int, dispatched: int = 0) -> None:
        """The most frames one remote subscriber can take now; with ``dispatched``, that many of
        the frames staged were dispatched (counted in the same step, so that the room the local
        thread sees is never one too many)."""
        with self._room_lock:
            self._staged -= dispatched
            self._room = room
            if room - self._staged > 0:
                self.wanted.set()
            else:
                self.wanted.clear()

    def skipped(self) -> int:
        """The newest frame not staged because no remote subscriber had room (-1: none). Read
        after a :meth:`set_room` that gave room: the frames staged from then on follow it."""
        with self._room_lock:
            return self._skipped

    def for_ucx(self) -> list[Any]:
        """The buffers as UCXX arrays, to send from."""
        ring = self._ring
        assert ring is not None
        return ring.for_ucx()

    def refer(self, index: int, count: int) -> None:
        """Buffer ``index`` is queued for ``count`` sends (0: nobody took it; free again)."""
        if count:
            self._refs[index] = count
        else:
            self._give(index)

    def unref(self, index: int) -> None:
        """One send of buffer ``index`` ended (or will never be made)."""
        left = self._refs.get(index, 0) - 1
        if left <= 0:
            self._refs.pop(index, None)
            self._give(index)
        else:
            self._refs[index] = left

    # ---- the end ----------------------------------------------------------------------------------
    def close(self, timeout: float) -> bool:
        """Free the buffers once every send from them ended, within ``timeout`` seconds; False:
        one did not, and they stay allocated (not freed under a send UCX may still read from)."""
        ring, self._ring = self._ring, None
        if ring is None:
            return True
        if not self.sends_ended(timeout):
            return False
        events, self._events = self._events, []
        for event in events:
            cuda.event_destroy(event)
        ring.close()
        return True

    def settle(self) -> None:
        """Wait for the copies queued (before the stream they run on ends: no copy into freed memory)."""
        try:
            self._device.make_current()
            cuda.stream_synchronize(self._stream, "closing a relay's staging")
        except EglCudaError as exc:  # pragma: no cover - a failed device: teardown goes on
            log.warning("a relay's staging copies did not end: %s", exc)
