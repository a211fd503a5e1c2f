"""Many sources into one process: what waiting on N topics costs the subscriber's process.

N publisher processes (1920x1080 NV12 by default, through cuda-ipc) each publish a topic, at 30
frames/s (each from a random phase, as cameras that are not synchronized) or flat out; one
subscriber process takes every frame of every topic (``every``, queue 4) in one of these ways:

- ``waitset``: one thread, one :class:`eglcuda.WaitSet` with every subscriber attached; each
  "message" event is one ``receive(timeout=0)``;
- ``threads``: a thread per topic, each in a blocking ``receive()`` (what a program did before
  there was a wait set);
- ``selectors``: one thread, ``selectors.DefaultSelector`` over the subscribers' ``fileno()``;
- ``asyncio``: one event loop, a task per topic awaiting ``receive_async()``.

Beside them, in the paced rows, two floors of as many sources: the same wakes with no eglcuda,
what any implementation pays for a thread woken from idle for the frames of N sources
(bench/_sources_floor.py):

- ``c``: bench/c/subscriber_wake.c, built here with gcc: one ``epoll_wait`` on every source's
  Unix socket, the read of each ready source's 64-byte message, the write of its 11-byte release,
  plus the cuda-ipc subscriber's four driver calls of a frame when libcuda.so.1 is there
  (``c (cuda)``; ``c (bare)`` without);
- ``python-floor``: the same as the C program's bare mode in Python, in a fresh interpreter
  (``select.epoll``, ``os.read``, ``os.write``).

Their figure is their waiting thread's whole CPU time a frame (wait to release; their clock is
read twice a wake, which their figure includes), p50/p99 the latency from the publisher's stamp
to the wake; their process columns are n/a, and without gcc the ``c`` row is n/a and says why.

Each message is released as soon as it is received: what is measured is eglcuda's part, waiting
included. Per row: frames received in the timed window; the waiting threads' CPU time per frame
and as a share of one core (``time.thread_time`` at the start and the end of the window on each
waiting thread: eglcuda's ``wait``, ``select``, ``receive`` and release calls and the few lines
of the loop around them; plus every Python thread of the process that is not the bench's: a
thread eglcuda started counts), the figure the floors give for their thread; with ``--split``,
of it the CPU inside eglcuda's calls (``time.thread_time`` around each call: a system call a
reading, which the waiting thread's figure then includes too); beside it the whole process's
CPU time per frame (``time.process_time``: the CUDA driver's threads as well) and of it the
threads other than the waiting ones (the driver's); and the latency from the publisher's stamp
(taken as ``publish`` starts) to the subscriber holding the frame (p50, p99). The 30 frames/s
rows are checked against the goals, on the waiting threads' CPU (eglcuda's calls, and no more
than the loop's lines besides): at most 30 us a frame for one topic, at most 5 % of one core for
32 topics through one wait set, p99 at most 200 us. After the table, a line per paced eglcuda
row gives its CPU a frame as a multiple of the C and the Python floor's of the same sources and
rate in the same run, and says where the goal of that row (30 us for one topic, 5 % of a core for
32) stands against what C pays.

    python bench/sources.py [--sources 1,8,32] [--rates 30,0]
                            [--variants waitset,threads,selectors,asyncio,c,python-floor]
                            [--seconds 10] [--warmup 2] [--size 1920x1080:NV12] [--transport cuda-ipc]
                            [--json FILE] [--quick] [--split]
    python bench/sources.py --batcher [--sources 1,8,32] [--rates 30,0] [--seconds 10] [--quick]

--batcher answers another question, with the same sources: what ``eglcuda.Batcher`` costs
against a loop written by hand (``receive()`` from each topic, ``torch.stack`` of the DLPack
views), both on the same publishers in one process, alternating (bench/_sources_batcher.py):
batches/s, frames/s and the consuming process's CPU time per frame. Needs PyTorch.

Needs an NVIDIA GPU with CUDA IPC (a discrete GPU) and eglcuda. Every variant is one function
``variant(subscribers, seconds, take)`` in ``VARIANTS``; a new way of waiting is one more. The ``c``
row needs gcc (``apt-get install gcc``); it is n/a without.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Protocol

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _sources_floor as floors  # noqa: E402
from _script import at_least, listed, output_file, require, run  # noqa: E402

PROGRAM = "bench/sources.py"
HERE = os.path.abspath(__file__)
ROOT = os.path.dirname(os.path.dirname(HERE))
GOAL_CPU_ONE_US = 30.0  # CPU per frame, one topic at 30 frames/s
GOAL_CORE_32 = 5.0  # percent of one core, 32 topics at 30 frames/s through one wait set
GOAL_P99_US = 200.0
TRANSPORTS = ("cuda-ipc", "cuda-vmm", "eglstream")
cpu = time.thread_time  # this thread's CPU seconds


def unread() -> float:
    """The clock of a row that reads no clock around each call (without ``--split``)."""
    return 0.0


class Calls:
    """One waiting thread's CPU seconds: in all (``total``, from its making to :meth:`done`: two
    readings of the thread's clock a row) and, with ``--split``, inside eglcuda's calls
    (``inside``, a reading before and after each call through ``clock``)."""

    __slots__ = ("inside", "total", "started", "tid", "clock")

    def __init__(self, split: bool) -> None:
        self.inside = 0.0 if split else math.nan
        self.total = 0.0
        self.tid = threading.get_native_id()
        self.clock: Callable[[], float] = cpu if split else unread
        self.started = cpu()

    def done(self) -> None:
        self.total = cpu() - self.started


class Take(Protocol):
    def __call__(self, message: Any, calls: Calls) -> None: ...


class Meters:
    """The waiting threads' :class:`Calls` of one timed window (a variant makes one per thread)."""

    def __init__(self, split: bool) -> None:
        self.threads: list[Calls] = []
        self.lock = threading.Lock()
        self.split = split

    def thread(self) -> Calls:
        calls = Calls(self.split)
        with self.lock:
            self.threads.append(calls)
        return calls


# ---- the ways of waiting (the subscriber process) ---------------------------------------------

def wait_set(subs: list[Any], seconds: float, take: Take, meters: Meters) -> None:
    import eglcuda

    until = time.monotonic() + seconds
    with eglcuda.WaitSet() as waits:
        for sub in subs:
            waits.attach(sub)
        calls = meters.thread()
        clock = calls.clock
        try:
            while True:
                left = until - time.monotonic()
                if left <= 0:
                    return
                started = clock()
                events = waits.wait(left)
                calls.inside += clock() - started
                for event in events:
                    if event.kind == "message":
                        started = clock()
                        message = event.source.receive(0)
                        calls.inside += clock() - started
                        take(message, calls)
                    elif event.kind == "error":
                        raise event.error
        finally:
            calls.done()


def threads(subs: list[Any], seconds: float, take: Take, meters: Meters) -> None:
    import eglcuda

    until = time.monotonic() + seconds
    failed: list[BaseException] = []

    def loop(sub: Any) -> None:
        calls = meters.thread()
        clock = calls.clock
        try:
            while True:
                left = until - time.monotonic()
                if left <= 0:
                    return
                started = clock()
                try:
                    message = sub.receive(left)
                except eglcuda.Timeout:
                    calls.inside += clock() - started
                    continue
                calls.inside += clock() - started
                take(message, calls)
        except BaseException as exc:  # noqa: BLE001 - said by the main thread
            failed.append(exc)
        finally:
            calls.done()

    workers = [threading.Thread(target=loop, args=(sub,)) for sub in subs]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if failed:
        raise failed[0]


def selector(subs: list[Any], seconds: float, take: Take, meters: Meters) -> None:
    import eglcuda

    until = time.monotonic() + seconds
    with selectors.DefaultSelector() as chosen:
        for sub in subs:
            chosen.register(sub, selectors.EVENT_READ)
        calls = meters.thread()
        clock = calls.clock
        try:
            while True:
                left = until - time.monotonic()
                if left <= 0:
                    return
                started = clock()
                ready = chosen.select(left)  # (the selector is Python's, as a user would have it: counted)
                calls.inside += clock() - started
                for key, _ in ready:
                    started = clock()
                    try:
                        message = key.fileobj.receive(0)  # type: ignore[union-attr]
                    except eglcuda.Timeout:
                        calls.inside += clock() - started
                        continue
                    calls.inside += clock() - started
                    take(message, calls)
        finally:
            calls.done()


def event_loop(subs: list[Any], seconds: float, take: Take, meters: Meters) -> None:
    import eglcuda

    async def one(sub: Any, until: float) -> None:
        loop = asyncio.get_running_loop()
        while True:
            left = until - loop.time()
            if left <= 0:
                return
            try:
                message = await sub.receive_async(left)
            except eglcuda.Timeout:
                continue
            take(message, calls)

    async def every() -> None:
        until = asyncio.get_running_loop().time() + seconds
        await asyncio.gather(*(one(sub, until) for sub in subs))

    calls = meters.thread()
    calls.inside = math.nan  # (the event loop's waiting and the tasks' interleave: not told apart)
    calls.clock = unread
    try:
        asyncio.run(every())
    finally:
        calls.done()


VARIANTS: dict[str, Callable[[list[Any], float, Take, Meters], None]] = {
    "waitset": wait_set, "threads": threads, "selectors": selector, "asyncio": event_loop}
CHOICES = [*VARIANTS, *floors.FLOORS]  # the floors (bench/_sources_floor.py): paced rows only


# ---- the processes ----------------------------------------------------------------------------

def publisher_role(args: argparse.Namespace) -> int:
    import eglcuda

    width, height, fmt = parse_size(args.size)
    with eglcuda.Publisher(args.name, width, height, fmt, path=args.path, fps=args.rate or None,
                           transports=[args.transport], every_timeout=30.0) as pub:
        print("READY", flush=True)
        period = 1.0 / args.rate if args.rate else 0.0
        next_at = time.monotonic() + random.random() * period  # (a phase of its own)
        while True:
            if period:
                pause = next_at - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
                next_at += period
            frame = pub.next_frame(30.0)
            pub.publish(frame)


def subscriber_role(args: argparse.Namespace) -> int:
    import eglcuda

    subs = [eglcuda.Subscriber(f"s{i}", qos="every", queue=4, path=path, timeout=60, transport=args.transport)
            for i, path in enumerate(args.paths.split(","))]
    variant = VARIANTS[args.variant]
    latencies: list[int] = []
    counting = [False]

    def take(message: Any, calls: Calls) -> None:
        woke = time.monotonic_ns()
        if counting[0]:
            latencies.append(woke - message.timestamp_ns)
        started = calls.clock()
        message.release()
        calls.inside += calls.clock() - started

    variant(subs, args.warmup, take, Meters(args.split))
    meters = Meters(args.split)
    counting[0] = True
    before = python_threads_cpu()
    process, wall = time.process_time(), time.monotonic()
    variant(subs, args.seconds, take, meters)
    process, wall = time.process_time() - process, time.monotonic() - wall
    after = python_threads_cpu()
    counting[0] = False
    for sub in subs:
        sub.close()
    values = sorted(latencies)
    frames = len(values)

    def pick(q: float) -> float:
        return values[min(frames - 1, int(q * (frames - 1)))] / 1e3 if frames else math.nan

    # Python threads that are not the bench's (the waiting ones, the main one) and lived through
    # the window: a thread a library started (eglcuda's, counted with the waiting threads).
    ours = {calls.tid for calls in meters.threads} | {threading.main_thread().native_id}
    started_threads = sum(after[tid] - before[tid] for tid in after if tid in before and tid not in ours)
    waiting = sum(calls.total for calls in meters.threads) + started_threads
    inside = sum(calls.inside for calls in meters.threads) + started_threads  # (NaN without --split)
    per_frame = 1e6 / frames if frames else math.nan
    print("RESULT " + json.dumps({
        "frames": frames, "fps": frames / wall, "thread_us": waiting * per_frame, "thread_pct": 100 * waiting / wall,
        "inside_us": inside * per_frame, "loop_us": (waiting - inside) * per_frame,
        "other_us": (process - waiting) * per_frame, "cpu_us": process * per_frame,
        "core_pct": 100 * process / wall, "p50_us": pick(0.5), "p99_us": pick(0.99),
        "clock_us": clock_cost() * 1e6 if args.split else math.nan}), flush=True)
    return 0


def python_threads_cpu() -> dict[int, float]:
    """CPU seconds of each Python thread of this process but the calling one (by native id),
    from /proc (clock ticks: coarse, enough over a window of seconds)."""
    tick = os.sysconf("SC_CLK_TCK")
    found = {}
    for thread in threading.enumerate():
        tid = thread.native_id
        if tid is None or thread is threading.current_thread():
            continue
        try:
            with open(f"/proc/self/task/{tid}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue  # (it ended meanwhile)
        found[tid] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return found


def clock_cost() -> float:
    """Seconds one ``thread_time()`` reading costs (a measured call pays about one)."""
    rounds = 20000
    started = cpu()
    for _ in range(rounds):
        cpu()
    return (cpu() - started) / rounds


def measure(variant: str, sources: int, rate: float, args: argparse.Namespace) -> dict[str, Any]:
    """One row: ``sources`` publisher processes and one subscriber process waiting as ``variant``."""
    common = ["--size", args.size, "--transport", args.transport]
    with tempfile.TemporaryDirectory(prefix="eglcuda-bench-sources-") as folder:
        paths = [os.path.join(folder, f"s{i}.topic") for i in range(sources)]
        publishers = [subprocess.Popen([sys.executable, HERE, "--role", "pub", "--path", path, "--name", f"s{i}",
                                        "--rate", str(rate), *common], stdout=subprocess.PIPE, text=True, cwd=ROOT)
                      for i, path in enumerate(paths)]
        try:
            for process in publishers:
                if process.stdout is None or process.stdout.readline().strip() != "READY":
                    raise RuntimeError(f"a publisher did not start (exit {process.wait()})")
            subscriber = subprocess.run([sys.executable, HERE, "--role", "sub", "--paths", ",".join(paths),
                                         "--variant", variant, "--seconds", str(args.seconds), "--warmup",
                                         str(args.warmup), *common, *(["--split"] if args.split else [])],
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        text=True, cwd=ROOT, timeout=args.seconds + args.warmup + 120)
        finally:
            for process in publishers:
                process.send_signal(signal.SIGKILL)
                process.wait()
    lines = [line for line in subscriber.stdout.splitlines() if line.startswith("RESULT ")]
    if subscriber.returncode != 0 or not lines:
        raise RuntimeError(f"the {variant} subscriber failed: {subscriber.stderr.strip().splitlines()[-1:]}")
    return {"variant": variant, "sources": sources, "rate": rate, **json.loads(lines[-1][7:])}


def verdicts(row: dict[str, Any]) -> str:
    """The goals a 30 frames/s row is held to (others: none), on the waiting threads' CPU time."""
    if row["rate"] != 30:
        return ""
    said = []
    measured = not math.isnan(row["thread_us"])
    if row["sources"] == 1 and measured:
        said.append(f"cpu {'PASS' if row['thread_us'] <= GOAL_CPU_ONE_US else 'FAIL'}")
    if row["sources"] == 32 and row["variant"] == "waitset":
        said.append(f"core {'PASS' if row['thread_pct'] <= GOAL_CORE_32 else 'FAIL'}")
    said.append(f"p99 {'PASS' if row['p99_us'] <= GOAL_P99_US else 'FAIL'}")
    return ", ".join(said)


def table_row(row: dict[str, Any]) -> str:
    """A row of the table; n/a where a figure is not measured (a floor's process columns)."""
    def shown(key: str, digits: int) -> str:
        return "n/a" if math.isnan(row[key]) else f"{row[key]:.{digits}f}"

    rate = f"{row['rate']:g} fps" if row["rate"] else "flat out"
    variant = row["variant"] + (f" ({row['mode']})" if row["variant"] == "c" and row["mode"] else "")
    goals = f"n/a: {row['skipped']}" if row.get("skipped") else (
        "floor (no goal)" if row["variant"] in floors.FLOORS else verdicts(row))
    cells = [f"{row['sources']} x {rate}", variant, shown("fps", 0), shown("thread_us", 1), shown("thread_pct", 2),
             shown("inside_us", 1), shown("cpu_us", 1), shown("other_us", 1), shown("core_pct", 2), shown("p50_us", 0),
             shown("p99_us", 0), goals]
    return "| " + " | ".join(cells) + " |"


def against_floors(rows: list[dict[str, Any]]) -> list[str]:
    """A line per paced eglcuda row that has floors of its sources and rate in this run: its
    waiting thread's CPU a frame as a multiple of the C and the Python floor's, and where the goal
    of the row (30 us a frame for one topic, 5 % of a core for 32 through a wait set) stands
    against C's."""
    said = []
    for row in rows:
        if row["variant"] in floors.FLOORS or not row["rate"]:
            continue
        beside = {f["variant"]: f for f in rows if f["variant"] in floors.FLOORS and f["rate"] == row["rate"]
                  and f["sources"] == row["sources"]}
        if not beside:
            continue
        head = f"{row['sources']} x {row['rate']:g} fps {row['variant']}: "
        if math.isnan(row["thread_us"]):
            said.append(head + "n/a (not measured), no ratio to the floors")
            continue
        parts = []
        for name, floor in beside.items():
            label = "C floor" if name == "c" else "Python floor"
            if floor["skipped"]:
                parts.append(f"the {label} n/a ({floor['skipped']})")
            else:
                mode = f"{floor['mode']}, " if name == "c" else ""
                parts.append(f"{row['thread_us'] / floor['thread_us']:.1f} x the {label} "
                             f"({mode}{floor['thread_us']:.1f} us)")
        line = head + f"{row['thread_us']:.1f} us a frame = " + ", ".join(parts)
        c_floor = beside.get("c", {"skipped": "not run"})
        if row["rate"] == 30 and not c_floor["skipped"] and row["sources"] == 1:
            line += ("; the 30 us goal is below what C pays for the same wake on this machine"
                     if GOAL_CPU_ONE_US < c_floor["thread_us"] else
                     f"; the 30 us goal is above the C floor ({c_floor['thread_us']:.1f} us)")
        elif row["rate"] == 30 and not c_floor["skipped"] and row["sources"] == 32 and row["variant"] == "waitset":
            line += (f"; {row['thread_pct']:.2f} % of a core against C's {c_floor['thread_pct']:.2f} % for the same "
                     f"wakes: the 5 % goal is {'below' if GOAL_CORE_32 < c_floor['thread_pct'] else 'above'} "
                     "what C pays")
        said.append(line)
    return said


def batcher_rows(args: argparse.Namespace) -> int:
    """--batcher: bench/_sources_batcher.py's rows (a function per variant there), run in a
    process of their own as the waiting rows' subscribers are; its exit status and one line when
    something is missing (PyTorch, CUDA IPC)."""
    width, height, _ = parse_size(args.size)  # NV12: main() checked
    done = subprocess.run([sys.executable, os.path.join(os.path.dirname(HERE), "_sources_batcher.py"), "rows",
                           "--sources", args.sources, "--fps", args.rates, "--size", f"{width}x{height}",
                           "--duration", str(args.seconds), "--rounds", "2"], cwd=ROOT)
    return done.returncode


def parse_size(text: str) -> tuple[int, int, str]:
    """``WIDTHxHEIGHT[:FORMAT]`` (a ColorFormat name, NV12 when left out) of a size a frame of that
    format can have (NV12: even); ValueError otherwise."""
    size, _, fmt = text.partition(":")
    width, times, height = size.partition("x")
    fmt = (fmt or "NV12").upper()
    if not times or int(width) < 2 or int(height) < 2:
        raise ValueError(text)
    try:
        from eglcuda.frames.formats import check_size, color_format
    except ImportError:
        return int(width), int(height), fmt  # require() names what is missing
    try:
        check_size(int(width), int(height), color_format(fmt))
    except Exception as exc:  # eglcuda's UsageError: no such format, or no such frame (an odd NV12 width)
        raise ValueError(text) from exc
    return int(width), int(height), fmt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", default="1,8,32", help="numbers of topics, e.g. 1,8,32")
    parser.add_argument("--rates", default="30,0", help="frames/s of each publisher (0: flat out)")
    parser.add_argument("--variants", default=",".join(CHOICES), help=f"from {','.join(CHOICES)}")
    parser.add_argument("--seconds", type=at_least(0, float, above=True), default=10.0, help="timed seconds per row")
    parser.add_argument("--warmup", type=at_least(0, float), default=2.0, help="seconds received before the timed window")
    parser.add_argument("--size", default="1920x1080:NV12", help="WIDTHxHEIGHT:FORMAT of every topic")
    parser.add_argument("--transport", default="cuda-ipc", help="cuda-ipc or cuda-vmm (or eglstream)")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--quick", action="store_true", help="3 timed seconds a row, 1 of warm-up")
    parser.add_argument("--split", action="store_true",
                        help="also read the thread's CPU clock around each call: the CPU inside eglcuda's calls "
                             "(each reading costs the waiting thread a system call)")
    parser.add_argument("--batcher", action="store_true",
                        help="the batcher's rows instead: eglcuda.Batcher against receive + torch.stack (NV12)")
    # the roles of the processes this script spawns
    parser.add_argument("--role", choices=["pub", "sub"], help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--paths", help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args()
    output_file(parser, "--json", args.json)
    if args.role == "pub":
        return publisher_role(args)
    if args.role == "sub":
        return subscriber_role(args)
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in CHOICES]
    if unknown:
        parser.error(f"unknown variants {unknown}: from {','.join(CHOICES)}")
    listed(parser, "--sources", args.sources, "numbers of topics, e.g. 1,8,32", int, least=1)
    listed(parser, "--rates", args.rates, "frames per second of each publisher (0: flat out), e.g. 30,0", float, least=0)
    try:
        _, _, fmt = parse_size(args.size)
    except ValueError:
        parser.error(f"--size is WIDTHxHEIGHT:FORMAT, e.g. 1920x1080:NV12 (NV12: an even width and height), "
                     f"got {args.size!r}")
    if args.batcher and fmt != "NV12":
        parser.error(f"--batcher measures NV12 topics, got --size {args.size}")
    if args.transport not in TRANSPORTS:
        parser.error(f"--transport is one of {', '.join(TRANSPORTS)}, got {args.transport!r}")
    if args.quick:
        args.seconds, args.warmup = 3.0, 1.0
    if args.batcher:
        return batcher_rows(args)
    needs = ["cuda"] + (["cuda-ipc"] if args.transport == "cuda-ipc" else [])
    needs += ["cross-process"] if args.transport == "eglstream" else []
    require(PROGRAM, *needs, in_child=True)
    rows = []
    print(f"{args.size} through {args.transport}; {args.seconds:g} s a row after {args.warmup:g} s of warm-up")
    print("CPU us a frame: the waiting threads' (eglcuda's calls and the few lines of the loop around them; threads "
          "eglcuda started too) and their share of a core; of it inside eglcuda's calls (--split: the thread's clock "
          "read around each call); the whole process, and of it the other threads (the CUDA driver's; for threads, "
          "the main one that joins)")
    if any(v in floors.FLOORS for v in variants):
        print("c, python-floor (paced rows only): the same wakes of as many sources with no eglcuda, in C "
              "(bench/c/subscriber_wake.c; cuda: with the subscriber's driver calls) and in Python (epoll, read, "
              "release); their figure is their waiting thread's CPU a frame, p50/p99 their wake latency")
    print("| sources x rate | variant | frames/s | waiting thread us/frame | its % of a core | in calls us/frame | "
          "process us/frame | other threads us | process % of a core | p50 us | p99 us | goals (waiting thread) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for rate in [float(r) for r in args.rates.split(",")]:
        for sources in [int(n) for n in args.sources.split(",")]:
            for variant in variants:
                if variant in floors.FLOORS:
                    if not rate:
                        continue
                    row = floors.measure(variant, rate, args.seconds, sources=sources)
                else:
                    row = measure(variant, sources, rate, args)
                rows.append(row)
                print(table_row(row), flush=True)
    clock = [row["clock_us"] for row in rows if not math.isnan(row["clock_us"])]
    if clock:
        print(f"(--split: each timed call includes about one reading of the thread's CPU clock, "
              f"{sorted(clock)[len(clock) // 2]:.2f} us, and the waiting thread's figure every reading)")
    if any(v in floors.FLOORS for v in variants) and not any(row["variant"] in floors.FLOORS for row in rows):
        print("(c, python-floor: they run in paced rows only, and there are none here)")
    for line in against_floors(rows):
        print(line)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
