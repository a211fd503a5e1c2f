"""A publisher's files: the topic's lock and its socket (see :mod:`eglcuda.topics.naming`), taken
at start (:meth:`TopicFiles.claim`) and released once, at close or when the publisher is collected
without being closed."""
from __future__ import annotations

import os
import time

from ..errors import UsageError
from . import naming, registry, sockets


class TopicFiles:
    """The lock and socket files of a publisher: released once, at close or when the publisher is
    collected without being closed."""

    def __init__(self, lock_path: str, socket_path: str) -> None:
        self.pid = os.getpid()
        self.lock_path = lock_path
        self.socket_path = socket_path
        self.lock_fd: int | None = None
        self.bound: os.stat_result | None = None
        self.wake = (-1, -1)  # the pipe that wakes the service thread

    def release(self) -> None:
        bound, self.bound = self.bound, None
        fd, self.lock_fd = self.lock_fd, None
        mine: list[int] = list(self.wake)
        self.wake = (-1, -1)
        if os.getpid() != self.pid:
            # A forked child: the files and the lock are the parent's; only the copies of the
            # descriptors are this process's to close.
            mine.append(-1 if fd is None else fd)
        else:
            sockets.remove_if_same(self.socket_path, bound)
            if fd is not None:
                naming.release_lock(self.lock_path, fd)
        for end in mine:
            if end >= 0:
                try:
                    os.close(end)
                except OSError:
                    pass

    def claim(self, name: str) -> None:
        """Take the topic's lock and make its socket path free (a dead publisher's is stale)."""
        deadline = time.monotonic() + 1.0
        while True:
            self.lock_fd = naming.take_lock(self.lock_path)
            if self.lock_fd is not None:
                break
            # Held: by a live publisher, or for a moment by a registry checking for stale sockets.
            if sockets.is_socket(self.socket_path) and sockets.listening(self.socket_path):
                raise UsageError(f"topic {name!r} already has a live publisher{_pid_at(self.socket_path)} at "
                                 f"{self.socket_path}")
            if time.monotonic() > deadline:
                raise UsageError(f"topic {name!r} is locked by another process ({self.lock_path}) although "
                                 "nothing listens at its socket: a publisher is starting or stopping there")
            time.sleep(0.01)
        sockets.remove_dead_socket(self.socket_path)  # a dead publisher's, if any


def _pid_at(path: str) -> str:
    try:
        return f" (pid {registry.query(path, 0.5).pid})"
    except Exception:  # noqa: BLE001 - only a detail of the message
        return ""
