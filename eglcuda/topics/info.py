"""What the topic layer reports: :class:`TopicInfo` (a topic as a subscriber learns it),
:class:`SubscriberInfo` (a subscriber as its publisher sees it) and :class:`DropRecord`."""
from __future__ import annotations

from dataclasses import dataclass

from ..frames.formats import ColorFormat, Layout


@dataclass(frozen=True)
class TopicInfo:
    """A topic: its frames and its publisher, as told at subscription (or by the publisher
    itself, :attr:`eglcuda.Publisher.info`).

    ``fps`` is the publisher's nominal rate, or the rate it measured so far when it gave none
    (None: not known yet). ``transport`` is the one this subscriber receives through (None on the
    publisher's own info). ``instance`` changes when the publisher restarts."""

    name: str
    path: str
    width: int
    height: int
    format: ColorFormat
    layout: Layout
    pitch: int
    fps: float | None
    pool: int
    publisher_pid: int
    instance: int
    transport: str | None = None
    next_seq: int = 0


@dataclass(frozen=True)
class SubscriberInfo:
    """One subscriber of a topic, as its publisher sees it. ``delivered`` frames were handed to
    it, ``skipped`` were published while it could take no more (``latest``), ``outstanding`` it
    holds or has not read yet. ``since`` is the time it joined (``time.time()``)."""

    id: int
    pid: int
    uid: int
    qos: str
    queue: int
    transport: str
    delivered: int
    skipped: int
    outstanding: int
    since: float


@dataclass(frozen=True)
class DropRecord:
    """A subscriber the publisher dropped (or lost: its process died), and why."""

    id: int
    pid: int
    qos: str
    transport: str
    code: str
    reason: str
    at: float
