"""bench/sources.py's floors: what a subscriber's frame costs at a camera's rate when nobody
pays for eglcuda (``python-floor``) or for Python either (``c``), beside its paced rows, for
the same number of sources.

- ``c``: bench/c/subscriber_wake.c, built here with gcc into bench/build/: a forked publisher
  writes a stamped 64-byte message on each source's SOCK_SEQPACKET socketpair every 1/rate
  seconds, each source from a random phase of its own; the subscriber sleeps in one
  ``epoll_wait`` on all of them, reads each ready source's message and writes an 11-byte release,
  plus the cuda-ipc subscriber's four driver calls of a frame when libcuda.so.1 is there (``cuda``
  mode, an event and a stream per source; ``bare`` without it).
- ``python-floor``: the same as the C program's ``bare`` mode written in Python, in a fresh
  interpreter (this module run as a script): ``select.epoll``, ``os.read``, ``os.write``.

Both measure the subscriber thread's CPU time of each wake, from before the wait that returns it
to after the last release is written, shared out evenly between the frames it took, and each
frame's latency from the publisher's stamp to the wait's return; the first second is not
counted. Both print one line:

    frames=N cpu_us_mean=.. cpu_us_p50=.. cpu_us_p99=.. wake_us_p50=.. wake_us_p99=..

    python bench/_sources_floor.py --rate 30 --seconds 4 [--sources 32]   # the Python floor alone
"""
from __future__ import annotations

import argparse
import heapq
import math
import os
import pathlib
import random
import select
import shutil
import socket
import struct
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _script import build_reference  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
FLOORS = ("c", "python-floor")
MESSAGE, RELEASE = 64, 11


# ---- the Python floor (this module as a script) ------------------------------------------------

def publish(socks: list[socket.socket], rate: float, seconds: float) -> None:
    """The publisher child: on each socket, a stamped message every 1/rate seconds from a random
    phase of its own, then the end message; drains the releases; returns once the subscriber
    closed its ends."""
    period = 1.0 / rate
    now = time.monotonic()
    due = [(now + period * random.random(), i) for i in range(len(socks))]
    heapq.heapify(due)
    end = now + period + seconds
    while due[0][0] < end:
        at, i = heapq.heappop(due)
        pause = at - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        sock = socks[i]
        sock.send(struct.pack("=d?", time.monotonic(), False).ljust(MESSAGE, b"\0"))
        try:
            while sock.recv(RELEASE * 8, socket.MSG_DONTWAIT):
                pass
        except BlockingIOError:
            pass
        heapq.heappush(due, (at + period, i))
    for sock in socks:
        sock.send(struct.pack("=d?", time.monotonic(), True).ljust(MESSAGE, b"\0"))  # the end
    for sock in socks:
        while sock.recv(RELEASE * 8):
            pass


def python_floor(rate: float, seconds: float, sources: int = 1) -> str:
    """The subscriber of ``sources`` sockets: wait on all, read each ready one's message, release
    it; each wake's CPU shared out between its frames; the result line."""
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(sources)]
    child = os.fork()
    if child == 0:
        for ours, _ in pairs:
            ours.close()
        try:
            publish([theirs for _, theirs in pairs], rate, seconds)
        finally:
            os._exit(0)
    poll = select.epoll()
    for ours, theirs in pairs:
        theirs.close()
        poll.register(ours.fileno(), select.EPOLLIN)
    release = bytes(RELEASE)
    used: list[float] = []
    wakes: list[float] = []
    skip = int(rate * sources)  # the first second: warm-up, not counted
    cpu, now = time.thread_time, time.monotonic
    stamps: list[float] = []
    open_ = sources
    try:
        while open_:
            started = cpu()
            ready = poll.poll(10.0, sources)
            if not ready:
                raise SystemExit("no frame for 10 s")
            woke = now()
            stamps.clear()
            for fd, _ in ready:
                message = os.read(fd, MESSAGE)
                if len(message) != MESSAGE:
                    raise SystemExit("the publisher is gone")
                if message[8]:  # (this source's end)
                    poll.unregister(fd)
                    open_ -= 1
                    continue
                os.write(fd, release)
                stamps.append(struct.unpack_from("=d", message)[0])
            spent = cpu() - started
            for stamp in stamps:
                if skip > 0:
                    skip -= 1
                    continue
                used.append(spent / len(stamps))
                wakes.append(woke - stamp)
    finally:
        poll.close()
        for ours, _ in pairs:
            ours.close()
        os.waitpid(child, 0)
    if not used:
        raise SystemExit("no frames measured")
    mean = sum(used) / len(used)
    used.sort()
    wakes.sort()

    def at(values: list[float], q: float) -> float:
        return values[int(q * (len(values) - 1))]

    return (f"frames={len(used)} cpu_us_mean={1e6 * mean:.2f} cpu_us_p50={1e6 * at(used, 0.5):.2f} "
            f"cpu_us_p99={1e6 * at(used, 0.99):.2f} wake_us_p50={1e6 * at(wakes, 0.5):.1f} "
            f"wake_us_p99={1e6 * at(wakes, 0.99):.1f}")


# ---- the rows, as bench/sources.py shows them ------------------------------------------------------

def parse(line: str) -> dict[str, float]:
    """The floors' result line as numbers (ValueError if it is not one)."""
    values = {key: float(value) for key, _, value in (item.partition("=") for item in line.split())}
    wanted = {"frames", "cpu_us_mean", "cpu_us_p50", "cpu_us_p99", "wake_us_p50", "wake_us_p99"}
    if set(values) != wanted:
        raise ValueError(f"not a floor's result line: {line!r}")
    return values


def build_c(folder: pathlib.Path = HERE / "build") -> pathlib.Path | str:
    """subscriber_wake.c built into ``folder``: its path, or why it could not be built."""
    if shutil.which("gcc") is None:
        return "needs gcc to build bench/c/subscriber_wake.c (apt-get install gcc)"
    try:
        return build_reference("subscriber_wake", folder)
    except RuntimeError as exc:
        return str(exc)


def has_libcuda() -> bool:
    """Whether libcuda.so.1 loads (asked in a child: this process stays without the driver)."""
    done = subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL('libcuda.so.1')"],
                          capture_output=True, timeout=60)
    return done.returncode == 0


def measure(variant: str, rate: float, seconds: float, build: pathlib.Path = HERE / "build",
            sources: int = 1) -> dict[str, Any]:
    """One floor's row of ``sources`` at ``rate`` each for ``seconds`` counted (after the
    uncounted first second), in bench/sources.py's columns: ``thread_us`` is the floor's CPU a
    frame, ``thread_pct`` its share of a core, p50/p99 its wake latency; the process columns are
    NaN. A floor that cannot run here gives a row with ``skipped``, the reason, and NaN figures."""
    row: dict[str, Any] = {"variant": variant, "sources": sources, "rate": rate, "mode": "", "skipped": ""}
    if variant == "c":
        binary = build_c(build)
        if isinstance(binary, str):
            return not_run(row, binary)
        row["mode"] = "cuda" if has_libcuda() else "bare"
        command = [str(binary), f"{rate:g}", f"{seconds + 1:g}", row["mode"], str(sources)]
    elif variant == "python-floor":
        row["mode"] = "bare"
        command = [sys.executable, __file__, "--rate", f"{rate:g}", "--seconds", f"{seconds + 1:g}", "--sources",
                   str(sources)]
    else:
        raise ValueError(f"no floor {variant!r}: from {', '.join(FLOORS)}")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 60)
    except subprocess.TimeoutExpired:
        return not_run(row, f"{variant} did not finish in {seconds + 60:g} s")
    lines = done.stdout.splitlines()
    try:
        if done.returncode:
            raise ValueError
        values = parse(lines[-1])
    except (ValueError, IndexError):
        said = [line for line in done.stderr.splitlines() if line.strip()]
        return not_run(row, f"{variant} failed (status {done.returncode}){': ' + said[-1] if said else ''}")
    frames = values["frames"]
    row.update(frames=int(frames), fps=frames / seconds, thread_us=values["cpu_us_mean"],
               thread_pct=100 * values["cpu_us_mean"] * 1e-6 * frames / seconds, p50_us=values["wake_us_p50"],
               p99_us=values["wake_us_p99"], cpu_p50_us=values["cpu_us_p50"], cpu_p99_us=values["cpu_us_p99"],
               inside_us=math.nan, cpu_us=math.nan, loop_us=math.nan, other_us=math.nan, core_pct=math.nan,
               clock_us=math.nan)
    return row


def not_run(row: dict[str, Any], why: str) -> dict[str, Any]:
    row.update(skipped=why, frames=0, fps=math.nan, thread_us=math.nan, thread_pct=math.nan, p50_us=math.nan,
               p99_us=math.nan, inside_us=math.nan, cpu_us=math.nan, loop_us=math.nan, other_us=math.nan,
               core_pct=math.nan, clock_us=math.nan)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description="The Python floor of bench/sources.py's paced rows: "
                                                 "epoll, read, release, no eglcuda")
    parser.add_argument("--rate", type=float, default=30.0, help="frames/s")
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds in all (the first is not counted)")
    parser.add_argument("--sources", type=int, default=1, help="sources, each at --rate")
    args = parser.parse_args()
    if not (0 < args.rate < math.inf and 1 < args.seconds < math.inf and 1 <= args.sources <= 256):  # (NaN too)
        parser.error("needs a finite --rate > 0, a finite --seconds > 1 and --sources in 1..256")
    print(python_floor(args.rate, args.seconds, args.sources), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
