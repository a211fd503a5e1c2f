"""What calls answer in a child forked from the test process, reported back through a pipe."""
from __future__ import annotations

import os
from typing import Callable, Iterable


def answers_in_forked_child(calls: Iterable[Callable[[], object]], error: type[BaseException],
                            mark: str) -> list[str]:
    """Fork; in the child make each call, and report ``"fork"`` for an ``error`` whose message
    holds ``mark``, that error's message for another, ``"no error"`` when the call returned and
    the ``repr`` of any other exception. The child exits without running the parent's exit
    handlers; the parent reaps it and returns the answers in order."""
    calls = list(calls)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        answers = []
        for call in calls:
            try:
                call()
                answers.append("no error")
            except error as exc:
                answers.append("fork" if mark in str(exc) else str(exc))
            except BaseException as exc:
                answers.append(repr(exc))
        os.write(write, "|".join(answers).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        reported = pipe.read().decode()
    os.waitpid(pid, 0)
    return reported.split("|")


def said_in_forked_child(report: Callable[[], str], limit_s: int = 10) -> tuple[int, str]:
    """Fork; in the child ``report()`` and send what it returns. A child that waits longer than
    ``limit_s`` is killed by its alarm and says nothing. Returns the child's exit code (-14 for
    the alarm) and what it said. The child exits without running the parent's exit handlers."""
    import signal

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        signal.alarm(limit_s)
        try:
            os.write(write, report().encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        said = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), said
