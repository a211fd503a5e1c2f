"""A test's peer process: a fresh interpreter running one script whose stdout is JSON lines.

A reader thread collects the lines as they come, so a test can wait for a given message with a
deadline, and a peer that died says why (its exit status and the end of its stderr).
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence


class JsonPeer:
    """``JsonPeer([script, *args])``: spawns ``python script args`` (never forked); ``prefix`` is a
    command that runs it (``nsenter ...``: in another network namespace) and execs, keeping its pid."""

    wait_timeout = 30.0  # seconds; subclasses for slower peers raise it

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None = None, cwd: str | None = None,
                 prefix: Sequence[str] = ()) -> None:
        self.process = subprocess.Popen([*prefix, sys.executable, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True, env=env, cwd=cwd)
        self.messages: list[dict] = []
        self._stderr_tail: str | None = None  # kept when stop() closes the pipe
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                self.messages.append(json.loads(line))
            except ValueError:  # a library's own print: kept, so that a failure can show it
                self.messages.append({"event": "noise", "line": line})

    def wait_for(self, predicate: Callable[[dict], bool], timeout: float | None = None) -> dict:
        """The first message that ``predicate`` accepts; AssertionError when none came in time."""
        deadline = time.monotonic() + (self.wait_timeout if timeout is None else timeout)
        while time.monotonic() < deadline:
            for message in list(self.messages):
                if predicate(message):
                    return message
            if self.process.poll() is not None and not self._reader.is_alive():
                break
            time.sleep(0.005)
        raise AssertionError(f"peer never said it; exit {self.process.poll()}, said {self.messages[-5:]}, "
                             f"stderr {self.stderr()}")

    def got(self) -> list[dict]:
        """The messages whose event is "got" (a frame the peer received), in order."""
        return [m for m in list(self.messages) if m.get("event") == "got"]

    def stderr(self) -> str:
        """The end of its stderr once it has exited (also after :meth:`stop`)."""
        if self.process.poll() is None:
            return "(running)"
        if self._stderr_tail is None:
            self._stderr_tail = self.process.stderr.read()[-3000:]
        return self._stderr_tail

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def send(self, line: str) -> None:
        """Write ``line`` to its stdin; nothing when it has exited (what it said is what counts)."""
        try:
            self.process.stdin.write(line + "\n")
            self.process.stdin.flush()
        except (BrokenPipeError, ValueError, OSError):
            pass

    def finish(self, timeout: float | None = None) -> int:
        """Say "bye" on stdin and wait for the exit status; killed if it does not exit in time."""
        self.send("bye")
        try:
            return self.process.wait(self.wait_timeout if timeout is None else timeout)
        finally:
            self.stop()

    def stop(self) -> None:
        """Kill it if it still runs, and close our ends of its pipes (leak tests count descriptors)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._reader.join(10)  # it stops at the end of the dead process's output
        self.stderr()  # read before the pipe closes: a failing assertion may still ask for it
        for pipe in (self.process.stdin, self.process.stdout, self.process.stderr):
            if pipe is not None and not pipe.closed:
                try:
                    pipe.close()
                except OSError:
                    pass
