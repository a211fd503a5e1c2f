"""The life of an object that talks to peers (a topic's ``Publisher`` and ``Subscriber``), beside
the handles it uses:

- :class:`Tracked`: the open objects of one class; in a child made by ``fork()`` each gets its
  ``forked`` hook (its connections and memory are the parent's), and at interpreter exit each is
  closed (its peers hear a goodbye, not a dropped connection);
- :class:`Deferral`: a ``close()`` called on a thread that is inside one of the object's own calls
  (a signal handler or a finalizer ran it there) is put off until that thread leaves the call;
  other threads leave it alone (they could wait for locks that thread holds).

Why this is not :class:`eglcuda._resource.Resource`: a Resource is one native handle, released by
a function that must not refer to the object (it runs at collection too), and in a forked child it
counts as closed and is never touched. A publisher or subscriber owns no handle of its own (a
publisher's pool frames are Resources; files and descriptors go through ``weakref.finalize``) but
connections, threads and locks, and it needs what those rules exclude: at exit it is closed
through its own ``close()``, which talks to its peers and uses its Resources, so before them; in a
forked child it stays an object that ``close()`` may still be called on (to let go of the child's
copies of its descriptors), with fresh locks set by Python code. So the two do not overlap: a
Resource releases a handle, a Tracked object ends a conversation.

A Tracked registers its exit hook when it is made: made at the import of a module above the
resources, it runs before the resources' own exit hook (``atexit`` runs the newest first), so the
objects close while their resources live.
"""
from __future__ import annotations

import atexit
import os
import threading
import weakref
from typing import Callable, Generic, Iterator, TypeVar

from .errors import ClosedError, StreamDisconnected

T = TypeVar("T")

# The thread running the exit hooks (0: the interpreter is not exiting). By then Python has
# joined every thread but the daemon ones.
_exit_thread = 0


def mark_exiting() -> None:
    """Say that this thread runs the interpreter's exit hooks (each hook that closes eglcuda's
    objects calls it first: whichever runs first)."""
    global _exit_thread
    _exit_thread = threading.get_ident()


def exiting() -> bool:
    """Whether the interpreter is running its exit hooks."""
    return _exit_thread != 0


def stay_if_ended_by_exit(error: BaseException) -> None:
    """Called with the error a blocking call of a publisher or a subscriber is about to
    raise. When the interpreter's exit closed the object under a daemon thread's call, that thread
    waits here to be stopped with the interpreter, as Python stops daemon threads: it does not
    die with a traceback that finalization cuts short. Anywhere else, it returns at once: on
    eglcuda's own threads too (named ``eglcuda-...``: a relay's local thread, say, ends by itself
    on that error, and its owner's close joins it). Call it with none of the object's locks held."""
    if (_exit_thread and threading.get_ident() != _exit_thread
            and isinstance(error, (ClosedError, StreamDisconnected))
            and not threading.current_thread().name.startswith("eglcuda-")):
        threading.Event().wait()


class Tracked(Generic[T]):
    """The open objects of one class. ``forked(obj)`` runs for each in a forked child (only
    flags, fresh locks and closing the child's copies of descriptors there: no I/O),
    ``at_exit(obj)`` for each at interpreter exit (its exceptions are swallowed: exit goes on)."""

    def __init__(self, forked: Callable[[T], None], at_exit: Callable[[T], None]) -> None:
        self._open: weakref.WeakSet[T] = weakref.WeakSet()
        self._forked = forked
        self._at_exit = at_exit
        os.register_at_fork(after_in_child=self._in_child)
        atexit.register(self._exit)

    def add(self, obj: T) -> None:
        self._open.add(obj)

    def discard(self, obj: T) -> None:
        self._open.discard(obj)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._open))

    def _in_child(self) -> None:
        for obj in self:
            self._forked(obj)

    def _exit(self) -> None:
        mark_exiting()
        for obj in self:
            try:
                self._at_exit(obj)
            except Exception:  # noqa: BLE001 - exit goes on
                pass


class Deferral:
    """A close() put off by the thread that called it from inside the object's own call. The
    call finishes it on its way out (:meth:`take` on that thread); ``value`` is what the close
    was called with."""

    __slots__ = ("thread", "value")

    def __init__(self) -> None:
        self.thread = 0  # the thread that put it off (0: none)
        self.value: object = None

    def put_off(self, value: object = None) -> None:
        self.thread = threading.get_ident()
        self.value = value

    def __bool__(self) -> bool:
        return self.thread != 0

    def mine(self) -> bool:
        """Put off by this thread."""
        return self.thread == threading.get_ident()

    def take(self) -> object:
        """Forget it (the caller finishes the close); what the close was called with."""
        value, self.thread, self.value = self.value, 0, None
        return value
