"""What bench/remote.py's roles share (its own and the zmq baseline's in _remote_zmq.py, and
bench/remote_link.py's): a frame's geometry, the clock, the RESULT line, the timed window from the
orchestrator, a role process as the orchestrator sees it, a subscriber's tally, and a frame in device
memory (also the raw engine's, bench/_ucx_raw.py)."""
from __future__ import annotations

import json
import math
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time

TAIL_S = 0.3  # the publisher goes on this long after the window, so that late frames still count


class RoleProcess:
    """A role process as the orchestrator sees it: RESULT lines on its stdout, the timed window on its
    stdin, its stderr kept for the error said when it ends or does not answer. ``command`` is the
    whole command line (a namespace-entering prefix included); the process leads a session of its
    own, so that :meth:`stop` ends whatever it started."""

    def __init__(self, role: str, command: list[str], env: dict) -> None:
        self.role = role
        self.stderr = tempfile.TemporaryFile()
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                        text=True, env=env, start_new_session=True)
        self.results: list[dict] = []

    def read(self, timeout: float) -> dict | None:
        """The next RESULT line's object within ``timeout`` seconds (None: none came)."""
        deadline = time.monotonic() + timeout
        stdout = self.process.stdout
        assert stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            while time.monotonic() < deadline:
                if not selector.select(max(0.0, deadline - time.monotonic())):
                    break
                line = stdout.readline()
                if not line:
                    return None
                if line.startswith("RESULT "):
                    message = json.loads(line[7:])
                    self.results.append(message)
                    return message
        return None

    def expect(self, role: str, timeout: float) -> dict:
        """The next RESULT line's object, which must be ``role``'s (RuntimeError saying why else)."""
        message = self.read(timeout)
        if message is None or message.get("role") != role:
            raise RuntimeError(self.error())
        return message

    def go(self, start: int, end: int) -> None:
        """Tell the role its timed window (monotonic ns)."""
        try:
            assert self.process.stdin is not None
            self.process.stdin.write(f"go {start} {end}\n")
            self.process.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def error(self) -> str:
        self.stderr.seek(0)
        lines = [line.strip() for line in self.stderr.read().decode(errors="replace").splitlines() if line.strip()]
        status = self.process.poll()
        return f"{self.role} {'exited with status ' + str(status) if status is not None else 'did not answer'}" + \
            (f": {lines[-1]}" if lines else "")

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.process.wait(10)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        self.stderr.close()


def frame_geometry(width: int, height: int, fmt: str) -> tuple[int, int]:
    """(row bytes, rows) of a frame packed in one buffer: what the zmq baseline copies."""
    return (width * 4, height) if fmt == "ARGB" else (width, height * 3 // 2)


class DeviceFrame:
    """One device buffer of ``rows`` rows of ``row`` bytes on GPU 0, a stream, and the waited-for copies
    to and from host memory (eglcuda's CUDA bindings): the zmq baseline's frame, and the raw engine's
    with ``--gpu`` (bench/_ucx_raw.py)."""

    def __init__(self, row: int, rows: int, doing: str) -> None:
        from eglcuda._bind import cuda
        from eglcuda.cuda_device import get_device

        self.cuda, self.row, self.rows = cuda, row, rows
        get_device(0).make_current()
        self.pointer = cuda.mem_alloc(row * rows, doing)
        self.stream = cuda.stream_create(non_blocking=True)

    def to_host(self, host) -> None:
        self.cuda.copy_2d(self.stream, ("device", self.pointer, self.row), ("host", host, self.row), self.row,
                          self.rows, True)

    def from_host(self, host) -> None:
        self.cuda.copy_2d(self.stream, ("host", host, self.row), ("device", self.pointer, self.row), self.row,
                          self.rows, True)


def frame_bytes(width: int, height: int, fmt: str) -> int:
    row, rows = frame_geometry(width, height, fmt)
    return row * rows


class Pacer:
    """The publishers' pace: ``wait()`` sleeps until the next frame is due (``rate`` frames per
    second; 0: flat out, no wait)."""

    def __init__(self, rate: float) -> None:
        self.period = 1e9 / rate if rate > 0 else 0.0
        self._next_ns = float(now_ns())

    def wait(self) -> None:
        if self.period:
            wait = (self._next_ns - now_ns()) / 1e9
            if wait > 0:
                time.sleep(wait)
            self._next_ns += self.period


def now_ns() -> int:
    return time.monotonic_ns()


def emit(**message) -> None:
    print("RESULT " + json.dumps(message), flush=True)


class Window:
    """The timed window, from the orchestrator's "go START END" line on stdin (read by a thread:
    the frame loop never blocks on it). Stdin closing before that line means the orchestrator is
    gone: the window is then over at once, and the role ends instead of running on."""

    def __init__(self) -> None:
        self.start = self.end = 0
        self.given = threading.Event()
        self.abandoned = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            parts = line.split()
            if parts and parts[0] == "go":
                self.start, self.end = int(parts[1]), int(parts[2])
                self.given.set()
                return
        self.abandoned = True

    def over(self, margin_s: float = 0.0) -> bool:
        return self.abandoned or (self.given.is_set() and now_ns() > self.end + int(margin_s * 1e9))

    def inside(self, stamp: int) -> bool:
        return self.given.is_set() and self.start <= stamp < self.end


class Tally:
    """A subscriber's frames and latencies inside the window."""

    def __init__(self) -> None:
        self.latencies: list[int] = []
        self.seen = 0

    def add(self, window: Window, published_ns: int, usable_ns: int) -> None:
        self.seen += 1
        if window.inside(published_ns):
            self.latencies.append(usable_ns - published_ns)

    def result(self, window: Window) -> dict:
        values = sorted(self.latencies)
        span = (window.end - window.start) / 1e9 if window.given.is_set() else math.nan
        pick = (lambda q: values[min(len(values) - 1, int(q * (len(values) - 1)))] / 1e3) if values else \
            (lambda q: math.nan)
        return {"frames": len(values), "seen": self.seen, "rate": len(values) / span if span > 0 else math.nan,
                "p50_us": pick(0.5), "p99_us": pick(0.99), "max_us": values[-1] / 1e3 if values else math.nan}
