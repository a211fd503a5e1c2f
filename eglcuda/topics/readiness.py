"""A subscriber's readiness descriptor: what ``Subscriber.fileno()`` returns, for ``selectors``,
``select``, asyncio's ``loop.add_reader`` and :class:`eglcuda.WaitSet`.

It is readable whenever ``receive(timeout=0)`` would hand out a message or raise (closed,
dropped, disconnected). Two things make it so:

- the connection's socket, watched through an ``epoll`` set of our own (its descriptor is the
  one handed out, so it stays the same when the subscriber joins a restarted publisher): a
  message, a WAKE byte of the frame ring (_ring.pyx, sent because the subscriber declared itself
  asleep, ``arm()``) or the connection's end make it readable; while the subscriber holds all it
  may, only the connection's end does (a publisher closes the connection after a drop, and
  shuts its sending half after a goodbye);
- a "due" ``eventfd`` in the same set, written when something is there that the socket does not
  show: messages read earlier and not handed out yet, an error, a close.

A subscriber makes it on the first ``fileno()`` only: one that nobody watches pays nothing.
"""
from __future__ import annotations

import os
import select
import threading


class Readiness:
    """One subscriber's readiness descriptor. ``combine``: an ``epoll`` set holding the due
    ``eventfd`` and the connection's socket (local subscribers); else the ``eventfd`` alone,
    written and cleared by its owner (remote subscribers, whose frames come on an engine thread)."""

    def __init__(self, combine: bool) -> None:
        self._lock = threading.RLock()  # (RLock: a signal handler's close() may set it inside a set or clear)
        self.due = False  # the eventfd holds a count (is readable)
        self._socket = -1  # the socket watched (-1: none)
        self.end_only = False  # the socket is watched for the connection's end only (not for messages)
        self._due_fd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._epoll: select.epoll | None = None
        if combine:
            try:
                self._epoll = select.epoll(2)
                self._epoll.register(self._due_fd, select.EPOLLIN)
            except BaseException:
                os.close(self._due_fd)
                raise

    def fileno(self) -> int:
        return self._due_fd if self._epoll is None else self._epoll.fileno()

    def watch(self, fd: int) -> None:
        """Watch the connection's socket ``fd`` (instead of an earlier one)."""
        with self._lock:
            self._forget_socket()
            if self._epoll is not None and fd >= 0:
                self._epoll.register(fd, select.EPOLLIN)
                self._socket = fd
                self.end_only = False

    def watch_end_only(self, end_only: bool) -> None:
        """Watch the socket for the connection's end only (its peer closed it, or shut its sending
        half), or again for any message too. While its subscriber holds all it may, a message that
        only says frames were skipped must not make the descriptor readable: nobody would read it."""
        if end_only != self.end_only:
            with self._lock:
                if end_only != self.end_only and self._socket >= 0 and self._epoll is not None:
                    try:
                        self._epoll.modify(self._socket, select.EPOLLRDHUP if end_only else select.EPOLLIN)
                    except (OSError, ValueError):  # (closed meanwhile: the set forgot it, or is gone)
                        return
                    self.end_only = end_only

    def unwatch(self) -> None:
        """Stop watching the socket (before it is closed: its number may be reused)."""
        with self._lock:
            self._forget_socket()

    def _forget_socket(self) -> None:
        if self._socket >= 0 and self._epoll is not None and not self._epoll.closed:
            try:
                self._epoll.unregister(self._socket)
            except OSError:  # (closed already: the set forgot it)
                pass
        self._socket = -1
        self.end_only = False

    def set(self) -> None:
        """Readable from now on, until :meth:`clear`."""
        if not self.due:
            with self._lock:
                if not self.due and self._due_fd >= 0:
                    os.eventfd_write(self._due_fd, 1)
                    self.due = True

    def clear(self) -> None:
        """Readable again only when the socket is."""
        if self.due:
            with self._lock:
                if self.due and self._due_fd >= 0:
                    try:
                        os.eventfd_read(self._due_fd)
                    except BlockingIOError:
                        pass
                    self.due = False

    def close(self) -> None:
        """Close the descriptors (idempotent): at collection, in a forked child, at exit."""
        with self._lock:
            self._socket = -1
            if self._epoll is not None:
                self._epoll.close()
            if self._due_fd >= 0:
                os.close(self._due_fd)
                self._due_fd = -1
