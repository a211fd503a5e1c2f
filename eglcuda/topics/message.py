"""A received frame: :class:`Message`, what :meth:`eglcuda.Subscriber.receive` hands out."""
from __future__ import annotations

import time
from typing import Any, Protocol

from .._lifecycle import stay_if_ended_by_exit
from ..errors import ClosedError
from . import protocol


class Releaser(Protocol):
    """What made a message and takes it back: a subscriber, or the feed of a remote one."""

    def _release(self, message: "Message", cuda_stream: Any) -> None: ...

_now_ns = time.monotonic_ns  # (one lookup per frame less)


def let_go(message: "Message") -> None:
    """Mark a message released without its transport (the publisher is gone, or this subscriber
    is closing): a view of a pool slot (CUDA IPC) stops working, as the slot is about to be
    unmapped or written again. (An EGLStream's acquired frame is released when its stream closes.)"""
    message._released = True
    if isinstance(getattr(message._frame, "_released", None), bool):
        message._frame._released = True


class Message:
    """One received frame with its metadata; a context manager that releases it.

    - ``frame``: read-only, on the subscriber's CUDA stream (:attr:`Subscriber.cuda_stream`):
      its ``planes`` hand out DLPack / ``__cuda_array_interface__`` views. Through CUDA IPC it
      is a :class:`eglcuda.topics.SlotView`; through an EGLStream the consumer's
      :class:`eglcuda.AcquiredFrame` (a GL subscriber's :class:`eglcuda.GLFrame`).
    - ``seq``: the publisher's sequence number (0, 1, 2, ... since it started);
      ``skipped``: frames published since this subscriber's previous message that it did not get.
    - ``timestamp_ns``: the publisher's timestamp (``CLOCK_MONOTONIC`` unless it gave its own);
      ``received_ns``: when :meth:`Subscriber.receive` returned it (same clock).
    - ``payload``: the publisher's bytes for this frame.

    :meth:`release` gives the frame back; until every subscriber released it, the publisher does
    not write its pool frame again. Work on the frame must be queued on the subscriber's stream,
    or on the stream given to :meth:`release`, before the release."""

    __slots__ = ("_subscriber", "_frame", "_header", "seq", "timestamp_ns", "payload", "skipped", "received_ns",
                 "number", "_released", "__weakref__")

    def __init__(self, subscriber: Releaser, frame: Any, header: protocol.Frame, skipped: int,
                 number: int | None) -> None:
        self._subscriber = subscriber
        self._frame = frame
        self._header = header
        self.seq = header.seq
        self.timestamp_ns = header.timestamp_ns
        self.payload = header.payload
        self.skipped = skipped
        self.number = number  # the frame's number on the subscriber's EGLStream (None for CUDA IPC)
        self.received_ns = _now_ns()
        self._released = False

    @property
    def frame(self) -> Any:
        """The frame in place (planes for DLPack and ``__cuda_array_interface__``); reading it
        after :meth:`release` raises :class:`ClosedError`."""
        if self._released:
            error = ClosedError("the message was released; its frame is no longer readable")
            stay_if_ended_by_exit(error)  # (a daemon thread's read as the exit closed the subscriber)
            raise error
        return self._frame

    @property
    def released(self) -> bool:
        """Whether the frame was given back (by :meth:`release`, the next step of a loop, or
        the subscriber's close)."""
        return self._released

    def release(self, cuda_stream: Any = None) -> None:
        """Give the frame back. The publisher's next write into it waits, on the GPU, for the
        subscriber's stream and every stream the frame was handed to (DLPack consumers'; for
        ``__cuda_array_interface__`` views the legacy default stream and CuPy's and PyTorch's
        current streams: docs/ordering.md). ``cuda_stream``: one more stream to wait for, where
        work on the frame was queued that eglcuda could not learn of (a raw pointer, a CAI view
        read on another stream). Safe to call twice; after the publisher is gone it only marks
        the message released. When the driver refuses to order the release after a stream (a
        ``cuda_stream`` destroyed, say), its :class:`eglcuda.CUDAError` is raised and the message
        stays held, to be released again."""
        if not self._released:
            self._subscriber._release(self, cuda_stream)

    def __reduce__(self) -> Any:
        # A copy would be a second message of the same frame: each one's release would reach the
        # publisher, which drops a subscriber that releases a frame twice.
        raise TypeError("a Message cannot be copied or pickled: it lends its frame until its release; copy "
                        "the frame's data (to_numpy, copy_to_device) and its metadata instead")

    def __enter__(self) -> "Message":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = " released" if self._released else ""
        return f"<Message seq {self.seq}{state}>"
