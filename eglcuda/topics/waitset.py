"""Waiting on many sources in one thread: :class:`WaitSet`, one ``epoll`` set over the
subscribers' readiness descriptors (``Subscriber.fileno()``, readiness.py) and any other
descriptor, with deadlines and intervals kept in the set itself (the wait's timeout is the
nearest of them: no timer thread, no polling while nothing is due)."""
from __future__ import annotations

import math
import numbers
import os
import select
import time
import weakref
from typing import Any, Callable, Literal, TypeVar

from .._integers import as_int
from ..errors import ClosedError, EglCudaError, UsageError, shown
from .subscriber import Subscriber

EventKind = Literal["message", "missed", "interval", "error", "readable"]
_MAX_EVENTS = 1024  # descriptors taken per epoll_wait (more ready ones: the next wait)
# Forks this process came through (its own count in each child): a set made before the last
# one belongs to the parent, whose epoll instance the child's descriptor still refers to.
_forks = [0]
os.register_at_fork(after_in_child=lambda: _forks.__setitem__(0, _forks[0] + 1))
T = TypeVar("T")
_MAX_SLEEP = 86400.0  # seconds slept per epoll_wait at most (its limit is 2**31-1 ms: longer waits loop)


class Attachment:
    """One thing attached to a :class:`WaitSet`: a subscriber, another object with a descriptor,
    or an interval. ``source`` is what was attached (None for an interval), ``deadline`` and
    ``period`` the seconds given to :meth:`WaitSet.attach` and :meth:`WaitSet.attach_interval`."""

    __slots__ = ("_source", "_deadline", "_period", "_fd", "_probe", "_due", "__weakref__")

    def __init__(self, source: Any, fd: int, deadline: float | None, period: float | None, now: float) -> None:
        self._source = source
        self._deadline = deadline
        self._period = period
        self._fd = fd  # -1: an interval
        # A subscriber's own look at what it holds (bound once: the wait calls it per wake-up).
        self._probe = source._wait_ready if isinstance(source, Subscriber) else None
        # When the next "missed" or "interval" is due (monotonic seconds; inf: never).
        step = deadline if deadline is not None else period
        self._due = now + step if step is not None else math.inf
        # (No reference to the set or to an event: a set dropped unclosed, and what it attached,
        # go at once by reference counting.)

    # (Read-only: the set's schedule was made from them.)
    @property
    def source(self) -> Any:
        return self._source

    @property
    def deadline(self) -> float | None:
        return self._deadline

    @property
    def period(self) -> float | None:
        return self._period

    def __repr__(self) -> str:
        if self._fd < 0:
            return f"<Attachment interval {self.period:g} s>"
        what = f" deadline {self.deadline:g} s" if self.deadline is not None else ""
        return f"<Attachment {self.source!r}{what}>"


class Event:
    """What :meth:`WaitSet.wait` found: ``kind`` is

    - ``"message"``: ``source.receive(timeout=0)`` hands out a message now (unless the subscriber
      ended in between: an EGLStream frame lives in its publisher's process, so a publisher that
      dies before the frame is received takes it along, and that receive raises the
      subscriber's error);
    - ``"error"``: it raises ``error`` (the subscriber was closed, dropped or disconnected:
      :class:`eglcuda.ClosedError`, :class:`eglcuda.Dropped`, :class:`eglcuda.StreamDisconnected`);
    - ``"missed"``: no message came within the attachment's ``deadline`` seconds (of the
      previous message, of the attach, or of the previous "missed");
    - ``"interval"``: an interval's period passed;
    - ``"readable"``: an attached object that is not a subscriber has its descriptor readable.

    An attachment's "message" and "readable" events are made once (the set keeps them) and handed
    out by every wait that finds it ready: read them, do not change them.
    """

    __slots__ = ("attachment", "kind", "error")

    def __init__(self, attachment: Attachment, kind: EventKind, error: BaseException | None = None) -> None:
        self.attachment = attachment
        self.kind = kind
        self.error = error

    @property
    def source(self) -> Any:
        """The subscriber or object attached (None for an interval)."""
        return self.attachment._source

    def __repr__(self) -> str:
        error = f" {self.error!r}" if self.error is not None else ""
        return f"<Event {self.kind} {self.attachment!r}{error}>"


class WaitSet:
    """Wait on any number of subscribers (local and remote alike), other descriptors, deadlines
    and intervals in one call, in one thread::

        with eglcuda.WaitSet() as waits:
            for sub in subscribers:
                waits.attach(sub, deadline=0.1)
            while True:
                for event in waits.wait(1.0):
                    if event.kind == "message":
                        with event.source.receive(timeout=0) as message: ...

    The set is level-triggered: a subscriber whose message was not received is reported again
    by the next :meth:`wait`, and one that failed is reported with its error until it is
    detached (or joined again with ``wait_for_publisher``: from the next :meth:`wait` on, its
    deadline counts again, from that wait). While nothing is ready and no deadline or interval is
    due, :meth:`wait` sleeps in the kernel and costs no CPU. Use one set from one thread (attach
    and detach too); a subscriber may be in several sets, and it is received from by the thread
    that waits. :meth:`close`, from another thread or from a signal handler that interrupts
    :meth:`wait`, ends that wait at once with :class:`eglcuda.ClosedError`. A set dropped without
    :meth:`close` goes at once (no reference cycle), closing its descriptors. In a child made by
    ``fork()``, a set of the parent raises :class:`eglcuda.UsageError` but for :meth:`close`
    (make a new set there)."""

    def __init__(self) -> None:
        epoll = select.epoll()
        try:
            # close() writes it: a closed epoll descriptor does not end an epoll_wait that another
            # thread is in, so without it a wait with no timeout would sleep on forever.
            wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
            try:
                epoll.register(wake, select.EPOLLIN)
            except BaseException:
                os.close(wake)
                raise
        except BaseException:
            epoll.close()
            raise
        self._epoll: select.epoll | None = epoll
        self._wake = wake
        # Closes the wake descriptor once: by close(), by a wait that close() ended, or at collection.
        self._wake_closer = weakref.finalize(self, os.close, wake)
        self._waiting = 0  # waits in progress (a close() leaves the wake descriptor open to them)
        self._woken = False  # close() has written the wake descriptor (from then on a wait may close it)
        self._pid = os.getpid()
        self._fork = _forks[0]
        # Per descriptor, the event it reports when ready, made once (it says the same every time;
        # its ``attachment`` is the attachment: kept here, not on the attachment, so no cycle).
        self._by_fd: dict[int, Event] = {}
        self._attachments: list[Attachment] = []
        self._timed: list[Attachment] = []  # those with a deadline or a period
        # Those with a deadline that reported an error (deadline off): each wait asks them again
        # first, while there are any, and counts the deadline again once one is no longer failed.
        self._failed: set[Attachment] = set()

    # ---- attaching -------------------------------------------------------------------------------
    def attach(self, source: Any, *, deadline: float | None = None) -> Attachment:
        """Attach a subscriber (``Subscriber``, ``Subscriber(remote=...)``) or any object with a
        ``fileno()`` (or a descriptor number). ``deadline``: seconds (any finite real number more
        than 0) within which the next message is expected; each time none came in it, a ``"missed"``
        event (none while the subscriber reports an error; again once ``wait_for_publisher``
        joined it to a publisher). Attaching the same descriptor twice, or an object whose
        ``fileno()`` fails (a closed file), raises :class:`eglcuda.UsageError`."""
        return self._closed_during("attach", self._attach, source, deadline)

    def _attach(self, source: Any, deadline: float | None) -> Attachment:
        epoll = self._open()
        if deadline is not None:
            deadline = _seconds(deadline, "deadline")
        if as_int(source) is not None:  # (a descriptor number, a NumPy integer too)
            fd = source
        elif callable(getattr(source, "fileno", None)):
            if isinstance(source, Subscriber) and source.closed:
                # (a subscriber closed before it was attached, whether or not its fileno() was asked for)
                raise ClosedError(f"{source!r} is closed: it cannot be attached")
            try:
                fd = source.fileno()
            except ValueError as exc:  # (a closed file; io.UnsupportedOperation)
                if isinstance(exc, EglCudaError):  # (a subscriber's own: closed, another process's)
                    raise
                raise UsageError(f"{source!r} has no open descriptor ({exc})") from None
            except OSError as exc:
                # (a closed multiprocessing Connection, a closed serial port; a subscriber's own
                # OSError is no such thing: one that could not make its descriptor, say)
                if isinstance(source, Subscriber):
                    raise
                raise UsageError(f"{source!r} has no open descriptor ({exc})") from None
        else:
            raise UsageError(f"attach() takes a Subscriber or an object with fileno(), got {type(source).__name__}")
        number = as_int(fd)  # (a NumPy integer too)
        if number is None or not 0 <= number < 2**31:
            raise UsageError(f"{source!r} has no open descriptor (fileno() gave {fd!r})")
        fd = number
        if fd in self._by_fd:
            raise UsageError(f"{source!r} is attached already (descriptor {fd})")
        attachment = Attachment(source, fd, deadline, None, time.monotonic())
        try:
            epoll.register(fd, select.EPOLLIN)
        except OSError as exc:
            raise UsageError(f"{source!r} cannot be waited on: {exc.strerror}") from None
        self._by_fd[fd] = Event(attachment, "message" if attachment._probe is not None else "readable")
        self._attachments.append(attachment)
        if deadline is not None:
            self._timed.append(attachment)
        return attachment

    def attach_interval(self, period: float) -> Attachment:
        """An ``"interval"`` event every ``period`` seconds (any real number more than 0, not
        inf), from now (a wait that comes late gets one event, and the next one a period after
        the time it was due; periods missed entirely are skipped, not bunched). A period below
        the clock's resolution (a subnormal one, say) gives an event at every wait."""
        return self._closed_during("attach_interval", self._attach_interval, period)

    def _attach_interval(self, period: float) -> Attachment:
        self._open()
        attachment = Attachment(None, -1, None, _seconds(period, "period"), time.monotonic())
        self._attachments.append(attachment)
        self._timed.append(attachment)
        return attachment

    def detach(self, attachment: Attachment) -> None:
        """Stop waiting on ``attachment`` (an attachment of another set, or one detached
        already: :class:`eglcuda.UsageError`; on a closed set: :class:`eglcuda.ClosedError`)."""
        self._closed_during("detach", self._detach, attachment)

    def _detach(self, attachment: Attachment) -> None:
        self._open()
        if attachment not in self._attachments:
            raise UsageError(f"{attachment!r} is not attached to this wait set")
        self._attachments.remove(attachment)
        self._failed.discard(attachment)
        if attachment in self._timed:
            self._timed.remove(attachment)
        if attachment._fd >= 0:
            del self._by_fd[attachment._fd]
            if self._epoll is not None:
                try:
                    self._epoll.unregister(attachment._fd)
                except (OSError, ValueError):  # (the descriptor was closed: the set forgot it)
                    pass

    def __len__(self) -> int:
        return len(self._attachments)

    @property
    def attachments(self) -> list[Attachment]:
        return list(self._attachments)

    # ---- waiting ---------------------------------------------------------------------------------
    def wait(self, timeout: float | None = None) -> list[Event]:
        """Wait up to ``timeout`` seconds (None or ``math.inf``: until something happens) for any
        attachment to be ready; return every event found ([] when the time passed first). Events of
        descriptors come before those of deadlines and intervals that fell due in the same
        wait; a subscriber with a message in time reports no "missed"."""
        # (The per-frame path: one clock reading before the sleep, one after it only when a
        # deadline or the timeout needs it, one look at each ready subscriber, no allocation
        # but the list for an event that says what it said before.)
        epoll = self._epoll
        if epoll is None:
            raise ClosedError("the wait set is closed")
        if self._fork != _forks[0]:
            raise self._forked_error()
        self._waiting += 1
        try:
            return self._wait(epoll, timeout)
        finally:
            self._waiting -= 1
            if self._woken and not self._waiting:  # (closed meanwhile: close() may have left this to us)
                self._wake_closer()

    def _wait(self, epoll: select.epoll, timeout: float | None) -> list[Event]:
        timed = self._timed
        by_fd = self._by_fd
        now = time.monotonic()
        if self._failed:  # (rare: a subscriber with a deadline reported an error)
            self._rearm(now)
        if timeout is None:
            until = math.inf
        elif (timeout.__class__ is float or timeout.__class__ is int) and 0 <= timeout < 1e15:
            until = now + timeout  # (checked as _seconds would, quicker: a bool's class is neither)
        else:
            until = now + _seconds(timeout, "timeout", zero=True, forever=True)
        while True:
            due = min([a._due for a in timed]) if timed else math.inf
            end = until if until < due else due
            if end == math.inf:
                wait_s = -1.0
            else:
                wait_s = end - now
                if wait_s < 0.0:
                    wait_s = 0.0
                elif wait_s > _MAX_SLEEP:  # (rare: the loop sleeps again until the end)
                    wait_s = _MAX_SLEEP
            try:
                ready = epoll.poll(wait_s, _MAX_EVENTS)  # (epoll rounds up to whole ms: no early wake-ups)
            except (OSError, ValueError):
                # A close() meanwhile: from a signal handler that interrupted the poll (EBADF as
                # it goes on), or from another thread (ValueError: a closed epoll).
                if self._epoll is None:
                    raise ClosedError("the wait set was closed during the wait") from None
                raise
            if self._epoll is None:  # (close() from another thread: its write to the wake descriptor woke us)
                raise ClosedError("the wait set was closed during the wait")
            events: list[Event] = []
            for fd, _ in ready:
                event = by_fd.get(fd)
                if event is None:
                    if fd == self._wake:  # (written by a child forked from C, no at-fork hook: not a close)
                        self._drain_wake()
                    continue
                attachment = event.attachment
                probe = attachment._probe
                state = True if probe is None else probe()
                if state is True:
                    events.append(event)
                    if attachment._deadline is not None:
                        attachment._due = -math.inf  # (set from the clock below: a message in time)
                elif state is not False:  # (False: nothing after all; the descriptor is quiet again)
                    events.append(Event(attachment, "error", state))
                    attachment._due = math.inf  # (no "missed" for a source that failed: its error says it)
                    if attachment._deadline is not None:
                        self._failed.add(attachment)  # (its deadline counts again once it is not failed)
            if events and not timed:
                if self._epoll is None:  # (closed as the events were gathered: a signal handler's close, say)
                    raise ClosedError("the wait set was closed during the wait")
                return events
            now = time.monotonic()
            if timed:
                for attachment in timed:
                    if attachment._due == -math.inf:
                        attachment._due = now + attachment._deadline  # type: ignore[operator]  # (a deadline: set above)
                if due <= now:
                    for attachment in timed:
                        if attachment._due <= now:
                            self._lapsed(attachment, now, events)
            if events:
                if self._epoll is None:  # (closed as the events were gathered)
                    raise ClosedError("the wait set was closed during the wait")
                return events
            if now >= until:
                if self._epoll is None:  # (closed by another thread meanwhile)
                    raise ClosedError("the wait set was closed during the wait")
                return events

    def _rearm(self, now: float) -> None:
        """Ask each attachment that reported an error whether it still fails (the subscriber may
        have joined a publisher again, ``wait_for_publisher``); one that does not has its
        deadline count again, from ``now``."""
        for attachment in list(self._failed):
            probe = attachment._probe
            if probe is None or not isinstance(probe(), BaseException):
                self._failed.discard(attachment)
                attachment._due = now + attachment._deadline  # type: ignore[operator]  # (only those with one)

    def _lapsed(self, attachment: Attachment, now: float, events: list[Event]) -> None:
        if attachment._fd < 0:
            period = attachment._period
            assert period is not None
            events.append(Event(attachment, "interval"))
            attachment._due += period
            if attachment._due <= now:  # (late by whole periods: skip them)
                late = (now - attachment._due) / period  # (inf for a period below the clock's resolution)
                if late < 1e15:
                    attachment._due += period * math.ceil(late + 1e-12)
                if attachment._due <= now:
                    attachment._due = now + period
            return
        deadline = attachment._deadline
        assert deadline is not None
        events.append(Event(attachment, "missed"))
        attachment._due = now + deadline

    # ---- the end ----------------------------------------------------------------------------------
    def _closed_during(self, call: str, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` for :meth:`attach` or :meth:`detach`; a close() that came meanwhile
        (a signal handler's, on this thread) makes it :class:`eglcuda.ClosedError`, whatever
        the half-done work raised, and leaves nothing of it in the closed set."""
        try:
            result = work(*args)
        except Exception:
            if self._epoll is None:
                raise ClosedError(f"the wait set was closed during {call}()") from None
            raise
        if self._epoll is None:
            self._forget_all()
            raise ClosedError(f"the wait set was closed during {call}()")
        return result

    def _open(self) -> select.epoll:
        if self._epoll is None:
            raise ClosedError("the wait set is closed")
        self._not_forked()
        return self._epoll

    def _not_forked(self) -> None:
        # In a forked child the set's descriptor is the parent's epoll instance: an attach or
        # detach here would change what the parent's waits see.
        if self._forked():
            raise self._forked_error()

    def _forked(self) -> bool:
        # (the at-fork count, and the process id for a fork made from C, which runs no hook;
        # wait() asks the count only: one system call fewer a wait)
        return self._fork != _forks[0] or self._pid != os.getpid()

    def _drain_wake(self) -> None:
        try:
            os.eventfd_read(self._wake)
        except OSError:  # (read meanwhile, or closed by a close() racing this wait)
            pass

    def _forked_error(self) -> UsageError:
        return UsageError(f"this wait set belongs to process {self._pid}, not to this forked child: make a new "
                          "WaitSet here (close() here only lets go of its copy)")

    def close(self) -> None:
        """Detach everything and close the set's descriptors (idempotent). The sources stay
        open. A :meth:`wait` in progress, on another thread or interrupted by this call from a
        signal handler, raises :class:`eglcuda.ClosedError` at once. In a forked child, the only
        call that works: it closes the child's copies of the descriptors and leaves the parent's
        set as it was (its waits are not woken)."""
        epoll, self._epoll = self._epoll, None  # (one close() goes on: two threads may call it at once)
        if epoll is not None:
            forked = self._forked()
            if not forked:  # (in a forked child the eventfd is the parent's too: no write)
                os.eventfd_write(self._wake, 1)
                self._woken = True  # (only now may a wait close it: never a write to a closed descriptor)
            epoll.close()
            # A wait in progress closes it as it leaves (closed now, its wake-up could be lost);
            # in a forked child no wait runs (a count copied from a parent's wait says nothing).
            if not self._waiting or forked:
                self._wake_closer()
        self._forget_all()

    def _forget_all(self) -> None:
        self._by_fd.clear()
        self._attachments.clear()
        self._timed.clear()
        self._failed.clear()

    @property
    def closed(self) -> bool:
        return self._epoll is None

    def __enter__(self) -> "WaitSet":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<WaitSet {len(self._attachments)} attached{', closed' if self._epoll is None else ''}>"


def _seconds(value: Any, what: str, zero: bool = False, forever: bool = False) -> float:
    """``value`` as seconds: a real number (numpy's too, not a bool), finite and more than 0
    (``zero``: or 0; ``forever``: or inf, also an int beyond any float)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        seconds = math.nan
    else:
        try:
            seconds = float(value)
        except OverflowError:  # (an int beyond any float)
            seconds = -math.inf if value < 0 else math.inf
    if not (seconds >= 0 if zero else seconds > 0) or (seconds == math.inf and not forever) or seconds != seconds:
        bound = "0 or more" if zero else "more than 0"
        # (inf is more than 0: where it is refused, the words say so)
        kind = "a number of seconds" if forever else "a finite number of seconds"
        raise UsageError(f"{what} is {kind} {bound}{' (or inf)' if forever else ''}, got {shown(value)}")
    return seconds
