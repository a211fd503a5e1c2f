"""A publisher's pool: the frames its subscribers read in place, one :class:`Slot` each, which of
them are free, and which the user is writing. Who holds a slot is kept by the delivery core
(``_delivery.pyx``); the pool hands out a free slot no reader's GPU work still reads."""
from __future__ import annotations

import collections
import logging
from typing import Any, Callable, Sequence

from ..errors import UsageError
from ..frames.formats import ColorFormat, Layout
from ..frames.frame import Frame
from . import _delivery
from ._delivery import FREE, PUBLISHED, WRITING, Member, Slot
from .transports import PublisherBackend, PublisherTransport
from .transports.registry import too_few_frames

log = logging.getLogger("eglcuda.topics")


class Pool:
    """The slots of one publisher, made by its backend and exported by each of its transports."""

    def __init__(self, backend: PublisherBackend, spec: tuple[int, int, ColorFormat, Layout], max_pool: int,
                 transports: Sequence[PublisherTransport], owner: str = "a publisher's pool") -> None:
        self.backend = backend
        self.owner = owner  # what a pool frame's refused close() names
        self.spec = spec  # width, height, format, layout
        self.max_pool = max_pool
        self._transports = transports
        self.slots: list[Slot] = []
        self.free: collections.deque[Slot] = collections.deque()  # (may hold stale entries: see take_free)
        self.writing: dict[int, Slot] = {}  # id(frame) -> slot: handed out by next_frame, not published
        self._by_frame: dict[int, Slot] = {}

    def __len__(self) -> int:
        return len(self.slots)

    def grow(self) -> Slot:
        """A new free slot (every transport exports it). When a transport cannot (the driver
        refused an export), the pool stays as it was and the error is raised."""
        width, height, fmt, layout = self.spec
        frame = self.backend.allocate(width, height, fmt, layout)
        slot = Slot(len(self.slots), frame)
        added: list[PublisherTransport] = []
        try:
            for transport in self._transports:
                transport.add_slot(slot)
                added.append(transport)
        except BaseException:
            for transport in added:
                transport.remove_slot(slot)
            self.backend.free(frame)
            raise
        if isinstance(frame, Frame):
            frame.held_by = self.owner  # (the user's close() of it is refused: it is the pool's)
        self.slots.append(slot)
        self._by_frame[id(slot.frame)] = slot
        self.free.append(slot)
        return slot

    def can_grow(self) -> bool:
        return len(self.slots) < self.max_pool

    def slot_of(self, frame: Any) -> Slot | None:
        return self._by_frame.get(id(frame))

    def take_free(self, settled: Callable[[Slot], bool]) -> Slot | None:
        """The oldest free slot nobody released with a done event, else the oldest whose former
        readers' GPU work has all finished (``settled`` asks), so that writing it needs no wait.
        The others stay free, in order. (Compiled: it runs every frame; see ``_delivery.take_free``.)"""
        return _delivery.take_free(self.free, settled)

    def unsettled(self) -> list[Slot]:
        """Free slots still read on the GPU (released with a done event not known to be complete)."""
        return [slot for slot in self.free if slot.state == FREE and slot.waiters]

    def refusal(self, transport: PublisherTransport) -> str | None:
        """Why this pool cannot serve a subscriber through ``transport`` (None: it can): an end
        that keeps as many pool frames as max_pool allows would never give one back, and the
        publisher would wait every_timeout for good. (The registry's rule leaves such a
        transport out of what a publisher offers; this covers a backend's own transports.)"""
        return too_few_frames(transport.keeps_frames, self.max_pool)

    def held(self, sub: Member) -> bool:
        """Whether ``sub`` holds any published slot."""
        return any(sub in slot.holders for slot in self.slots if slot.state == PUBLISHED)

    # ---- the user's frames ----------------------------------------------------------------------
    def start_writing(self, slot: Slot) -> Any:
        slot.state = WRITING
        self.writing[id(slot.frame)] = slot
        return slot.frame

    def take_written(self, frame: Any, refusal: str) -> Slot:
        """The slot of ``frame``, handed out by next_frame and not yet published or discarded
        (else :class:`UsageError` with ``refusal``)."""
        slot = self.writing.pop(id(frame), None)
        if slot is None or slot.frame is not frame:
            raise UsageError(refusal)
        return slot

    def write_again(self, slot: Slot) -> None:
        """Undo :meth:`take_written` (a publish that failed before it began)."""
        self.writing[id(slot.frame)] = slot

    def published(self, slot: Slot) -> None:
        """Handed out (or discarded): free again once nobody holds it."""
        slot.state = PUBLISHED
        _delivery.free_if_unheld(slot, self.free)

    # ---- the end ----------------------------------------------------------------------------------
    def free_all(self, name: str) -> None:
        """Free every frame (after every link let go of it)."""
        for slot in self.slots:
            if isinstance(slot.frame, Frame):
                slot.frame.held_by = None
            try:
                self.backend.free(slot.frame)
            except Exception as exc:  # noqa: BLE001 - teardown goes on
                log.warning("topic %s: freeing pool frame %d failed: %s", name, slot.index, exc)
        self.forget()

    def forget(self) -> None:
        """Drop every reference (a forked child: the frames are the parent's)."""
        self.slots = []
        self.free.clear()
        self._by_frame.clear()
        self.writing.clear()
