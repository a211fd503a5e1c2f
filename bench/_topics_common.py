"""What bench/topics.py's roles share (its own and the baselines' in _topics_baselines.py): the
planes of a packed frame, the clock, CPU pinning (--pin), the RESULT line and a subscriber's
summary."""
from __future__ import annotations

import json
import math
import os
import pathlib
import time

PROGRAM = "bench/topics.py"
TOPICS = pathlib.Path(__file__).resolve().with_name("topics.py")  # (the roles run as its children)
ROOT = TOPICS.parent.parent
SIZES = {"1080p-nv12": (1920, 1080, "NV12"), "4k-argb": (3840, 2160, "ARGB")}
TRANSPORTS = ["cuda-ipc", "cuda-vmm", "eglstream", "ipc-ring", "torch-mp"]
POOL = 8
WARMUP = 50


def plane_rows(width: int, height: int, fmt: str) -> list[tuple[int, int, int]]:
    """(offset, row bytes, rows) of each plane of a frame packed in one buffer: the copies
    --write queues per frame."""
    planes = [(width * 4, height)] if fmt == "ARGB" else [(width, height), (width, height // 2)]
    offsets = [sum(b * r for b, r in planes[:i]) for i in range(len(planes))]
    return [(offset, row_bytes, rows) for offset, (row_bytes, rows) in zip(offsets, planes)]


def now_ns() -> int:
    return time.monotonic_ns()


def pin(args, publisher: bool) -> None:
    """--pin: the publisher on the first CPU this process may use, everyone else on the others."""
    if args.pin:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) >= 2:
            os.sched_setaffinity(0, cpus[:1] if publisher else cpus[1:])


def emit(**result) -> None:
    print("RESULT " + json.dumps(result), flush=True)


def summarize(latencies_ns: list[int], received: int, first_ns: int, last_ns: int, cpu_s: float = math.nan) -> dict:
    """A subscriber's result; ``cpu_s``: its process's CPU time from its first timed frame to the
    end marker (all threads), reported per frame: what the transport costs the subscriber's CPU,
    whatever the other processes do."""
    values = sorted(latencies_ns)
    pick = (lambda q: values[min(len(values) - 1, int(q * (len(values) - 1)))] / 1e3) if values else (lambda q: math.nan)
    span = (last_ns - first_ns) / 1e9
    return {"frames": received, "rate": received / span if span > 0 else math.nan, "p50_us": pick(0.5),
            "p99_us": pick(0.99), "cpu_us": 1e6 * cpu_s / received if received else math.nan}
