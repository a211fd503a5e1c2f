"""What bench/remote.py's roles share (its own and the zmq baseline's in _remote_zmq.py): a frame's
geometry, the clock, the RESULT line, the timed window from the orchestrator, a subscriber's tally, and
a frame in device memory (also the raw engine's, bench/_ucx_raw.py)."""
from __future__ import annotations

import json
import math
import sys
import threading
import time

TAIL_S = 0.3  # the publisher goes on this long after the window, so that late frames still count


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
