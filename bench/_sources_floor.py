"""bench/sources.py's floors: what one subscriber's frame costs at a camera's rate when nobody
pays for eglcuda (``python-floor``) or for Python either (``c``), beside its 1-topic paced rows.

- ``c``: bench/c/subscriber_wake.c, built here with gcc into bench/build/: a forked publisher
  writes a stamped 64-byte message on a SOCK_SEQPACKET socketpair every 1/rate seconds from a
  random phase; the subscriber sleeps in ``epoll_wait``, reads the message and writes an 11-byte
  release, plus the cuda-ipc subscriber's four driver calls of a frame when libcuda.so.1 is there
  (``cuda`` mode; ``bare`` without it).
- ``python-floor``: the same as the C program's ``bare`` mode written in Python, in a fresh
  interpreter (this module run as a script): ``select.epoll``, ``os.read``, ``os.write``.

Both measure the subscriber thread's CPU time of each frame, from before the wait that returns
it to after the release is written, and the latency from the publisher's stamp to the wait's
return; the first second is not counted. Both print one line:

    frames=N cpu_us_mean=.. cpu_us_p50=.. cpu_us_p99=.. wake_us_p50=.. wake_us_p99=..

    python bench/_sources_floor.py --rate 30 --seconds 4     # the Python floor on its own
"""
from __future__ import annotations

import argparse
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

def publish(sock: socket.socket, rate: float, seconds: float) -> None:
    """The publisher child: a stamped message every 1/rate seconds from a random phase, then the
    end message; drains the releases; returns once the subscriber closed its end."""
    period = 1.0 / rate
    next_at = time.monotonic() + period * random.random()
    end = next_at + seconds
    while next_at < end:
        pause = next_at - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        sock.send(struct.pack("=d?", time.monotonic(), False).ljust(MESSAGE, b"\0"))
        try:
            while sock.recv(RELEASE * 8, socket.MSG_DONTWAIT):
                pass
        except BlockingIOError:
            pass
        next_at += period
    sock.send(struct.pack("=d?", time.monotonic(), True).ljust(MESSAGE, b"\0"))  # the end
    while sock.recv(RELEASE * 8):
        pass


def python_floor(rate: float, seconds: float) -> str:
    """The subscriber: wait, read, release, each frame timed; the result line."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    child = os.fork()
    if child == 0:
        ours.close()
        try:
            publish(theirs, rate, seconds)
        finally:
            os._exit(0)
    theirs.close()
    fd = ours.fileno()
    poll = select.epoll()
    poll.register(fd, select.EPOLLIN)
    release = bytes(RELEASE)
    used: list[float] = []
    wakes: list[float] = []
    skip = int(rate)  # the first second: warm-up, not counted
    cpu, now = time.thread_time, time.monotonic
    try:
        while True:
            started = cpu()
            if not poll.poll(10.0):
                raise SystemExit("no frame for 10 s")
            woke = now()
            message = os.read(fd, MESSAGE)
            if len(message) != MESSAGE:
                raise SystemExit("the publisher is gone")
            if message[8]:
                break
            os.write(fd, release)
            spent = cpu() - started
            if skip > 0:
                skip -= 1
                continue
            used.append(spent)
            wakes.append(woke - struct.unpack_from("=d", message)[0])
    finally:
        poll.close()
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


def measure(variant: str, rate: float, seconds: float, build: pathlib.Path = HERE / "build") -> dict[str, Any]:
    """One floor's row at ``rate`` for ``seconds`` counted (after the uncounted first second),
    in bench/sources.py's columns: ``calls_us`` is the floor's CPU a frame, ``calls_pct`` its
    share of a core, p50/p99 its wake latency; the process columns are NaN. A floor that cannot
    run here gives a row with ``skipped``, the reason, and NaN figures."""
    row: dict[str, Any] = {"variant": variant, "sources": 1, "rate": rate, "mode": "", "skipped": ""}
    if variant == "c":
        binary = build_c(build)
        if isinstance(binary, str):
            return not_run(row, binary)
        row["mode"] = "cuda" if has_libcuda() else "bare"
        command = [str(binary), f"{rate:g}", f"{seconds + 1:g}", row["mode"]]
    elif variant == "python-floor":
        row["mode"] = "bare"
        command = [sys.executable, __file__, "--rate", f"{rate:g}", "--seconds", f"{seconds + 1:g}"]
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
    row.update(frames=int(frames), fps=frames / seconds, calls_us=values["cpu_us_mean"],
               calls_pct=100 * values["cpu_us_mean"] * 1e-6 * frames / seconds, p50_us=values["wake_us_p50"],
               p99_us=values["wake_us_p99"], cpu_p50_us=values["cpu_us_p50"], cpu_p99_us=values["cpu_us_p99"],
               cpu_us=math.nan, loop_us=math.nan, other_us=math.nan, core_pct=math.nan, clock_us=math.nan)
    return row


def not_run(row: dict[str, Any], why: str) -> dict[str, Any]:
    row.update(skipped=why, frames=0, fps=math.nan, calls_us=math.nan, calls_pct=math.nan, p50_us=math.nan,
               p99_us=math.nan, cpu_us=math.nan, loop_us=math.nan, other_us=math.nan, core_pct=math.nan,
               clock_us=math.nan)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description="The Python floor of bench/sources.py's paced rows: "
                                                 "epoll, read, release, no eglcuda")
    parser.add_argument("--rate", type=float, default=30.0, help="frames/s")
    parser.add_argument("--seconds", type=float, default=4.0, help="seconds in all (the first is not counted)")
    args = parser.parse_args()
    if args.rate <= 0 or args.seconds <= 1:
        parser.error("needs --rate > 0 and --seconds > 1")
    print(python_floor(args.rate, args.seconds), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
