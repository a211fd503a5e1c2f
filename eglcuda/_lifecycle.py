"""What a long-lived object that owns connections needs around the process's life, in one place:

- :class:`Tracked`: the open objects of one class; in a child made by ``fork()`` each gets its
  ``forked`` hook (its connections and memory are the parent's), and at interpreter exit each is
  closed (its peers hear a goodbye, not a dropped connection);
- :class:`Deferral`: a ``close()`` called on a thread that is inside one of the object's own calls
  (a signal handler or a finalizer ran it there) is put off until that thread leaves the call;
  other threads leave it alone (they could wait for locks that thread holds).

The topic classes use both (``Publisher``, ``Subscriber``). A Tracked registers its exit hook when
it is made: made at the import of a module above the resources, it runs before the resources'
own exit hook (``atexit`` runs the newest first), so the objects close while their resources live.
"""
from __future__ import annotations

import atexit
import os
import threading
import weakref
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Tracked(Generic[T]):
    """The open objects of one class. ``forked(obj)`` runs for each in a forked child (only
    flags and fresh locks there: no I/O), ``at_exit(obj)`` for each at interpreter exit (its
    exceptions are swallowed: exit goes on)."""

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
