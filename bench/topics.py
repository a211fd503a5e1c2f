"""Frame topics: one publisher process, N subscriber processes. Publisher rate, per-subscriber rate
and present-to-receive latency (p50 / p99) for N = 1, 2, 4, 8, qos latest and every, 1080p NV12
and 4K ARGB, through each eglcuda transport, next to the alternatives in the same run:

- ``cuda-ipc``, ``cuda-vmm``, ``eglstream``: eglcuda.Publisher / Subscriber with the transport forced
  (for ``cuda-vmm`` the publisher offers it alone: its pool is VMM memory);
- ``ipc-ring``: a plain CUDA IPC ring written like GStreamer's cudaipcsink/cudaipcsrc: 8 device
  buffers and interprocess events, handles sent once per subscriber and opened once, per frame an
  event record and a small message per subscriber, the subscriber's stream waits on the event and
  it answers with a release; a buffer is reused once every subscriber released it (lossless);
- ``torch-mp``: torch.multiprocessing CUDA tensor sharing: 8 pool tensors put on one queue per
  subscriber (torch opens each tensor's IPC handle once and caches it), releases on a shared
  queue (lossless). Skipped with the reason when torch is absent.

The alternatives are lossless, so they appear in the ``every`` rows. Each configuration spawns fresh
processes, waits until every subscriber joined, warms up, then publishes as fast as the
subscribers allow for --duration seconds. Latency runs from just before the publisher hands a frame
over (its timestamp, CLOCK_MONOTONIC, shared by the host's processes) to the moment receive
returns in the subscriber (with --sync: after the subscriber's stream also caught up with the
frame's GPU work). Subscribers do no work on the frames. The publisher does none either, unless
--write: then it writes every frame on the GPU before handing it over (a device-to-device copy of
the whole frame, each plane, queued on the stream it publishes with), as a decoder or a kernel
producing the frame would; the ring does the same copies. Also measured: 8 'latest' subscribers with
one of them stalled (joined, never reads), against 8 that all read (the goal: "< 5 %").

    python bench/topics.py [--quick] [--mps] [--out DIR] [--duration S] [--sync] [--write] [--busy-wait US]
                           [--stall-pairs K [--stall-phase S]]
                           [--transports cuda-ipc,eglstream,ipc-ring,torch-mp] [--subscribers 1,2,4,8]
                           [--qos latest,every] [--sizes 1080p-nv12,4k-argb] [--profile DIR]
                           [--rounds R] [--baseline SITE_DIR] [--rate FPS] [--pin]

--stall-pairs K also measures the stalled subscriber inside one run: with N 'latest' subscribers
(the largest N), the first one is stopped (SIGSTOP) and resumed (SIGCONT) K times, --stall-phase
seconds each (default 0.5), while the publisher runs free; each stalled phase's publisher rate is
compared with the mean of the running phases on either side. Between two configurations (fresh
processes) this bench scatters by about 20 %; within one run the comparison is seconds apart.
--busy-wait US is the eglcuda subscribers' ``busy_wait`` in microseconds (default 20, the
Subscriber's default; 0 sleeps at once): how long a subscriber asks for the next frame without
sleeping before it sleeps. The ring's subscribers sleep in ``recv`` at once, as cudaipcsrc does.
--profile DIR writes a cProfile file per publisher and subscriber process of the eglcuda and ring
transports (``DIR/<configuration>/<role>-<pid>.prof``, read with ``python -m pstats``): where the
Python side of each spends its time. The profiler's own cost then inflates the rates and the CPU
times per frame: compare profiled runs only with each other.
--rounds R runs every configuration R times (fresh processes each time); the tables give the
median of the rounds. --baseline SITE_DIR runs each eglcuda configuration twice per round: once with
this tree's eglcuda and once with the eglcuda installed in SITE_DIR (an older tree, built with
``pip install --no-deps --no-build-isolation --target SITE_DIR OLD_TREE``; put first on the
children's PYTHONPATH), alternating which goes first, so that the machine's drift falls on both
alike. The comparison table then gives, per cell, the current tree's medians, the ratio to the
baseline's (frames/s: higher is better; CPU us/frame and latency: lower is better) and, in the
'every' rows, the ratio to the ipc-ring of the same rounds. (The stalled-subscriber rows run in the
first round only, with this tree.)
--rate FPS paces the eglcuda publishers (the ring and torch-mp run free): the publisher's CPU time
per frame is then measured with subscribers that keep up, less disturbed by a busy machine.
--pin puts each publisher on one CPU of its own and its subscribers on the others.
--mps runs everything under a private MPS daemon (eglcuda.mps.MPSDaemon: private pipe and log
directories, stopped at the end, also if this process dies).
Writes results.json, results.md and plots (matplotlib PNG; without matplotlib one line says the
plots were left out) to --out. Exits 2 with one line when this machine lacks what the chosen
transports need (an NVIDIA GPU; EGL streams between processes for eglstream, CUDA IPC for cuda-ipc
and ipc-ring) or nvidia-cuda-mps-control for --mps.

Here: the eglcuda roles and the orchestrator; the baselines' roles are in _topics_baselines.py
(run as this script's children, ``--role ring-pub`` ...), what the roles share in
_topics_common.py, the plots and tables in _topics_report.py.
"""
from __future__ import annotations

import argparse
import array
import bisect
import contextlib
import importlib.util
import json
import math
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _script import at_least, fail, listed, mps_binaries, mps_daemon, output_folder, require, run  # noqa: E402
from _topics_baselines import ring_publisher, ring_subscriber, torch_run  # noqa: E402
from _topics_common import (POOL, PROGRAM, ROOT, SIZES, TRANSPORTS, WARMUP, emit, now_ns, pin,  # noqa: E402
                            plane_rows, summarize)
from _topics_report import (median_known, compare, compare_markdown, format_row, markdown, plot,  # noqa: E402
                            summary_line)

EGLCUDA_TRANSPORTS = ("cuda-ipc", "cuda-vmm", "eglstream")


# ==== eglcuda ==================================================================================

def eglcuda_publisher(args) -> int:
    pin(args, True)
    import eglcuda

    width, height, fmt = SIZES[args.size]
    # cuda-vmm is offered alone: its pool is VMM memory. (No keyword otherwise: the same bench
    # runs against trees from before it.)
    offer = {"transports": ["cuda-vmm"]} if args.transport == "cuda-vmm" else {}
    pub = eglcuda.Publisher("bench", width, height, fmt, path=args.path, pool=POOL, every_timeout=30.0,
                            max_pool=64, **offer)
    emit(role="ready")
    write = None
    if args.write:
        from eglcuda._bind import cuda

        planes = plane_rows(width, height, fmt)
        source = cuda.mem_alloc(sum(b * r for _, b, r in planes), "the frames' source")

        def write(frame) -> None:  # what a decoder's or a kernel's output costs the stream
            for plane, (offset, row_bytes, _) in zip(frame.planes, planes):
                plane.copy_from_device(source + offset, row_bytes)
    deadline = time.monotonic() + 120
    while len(pub.subscribers) < args.n:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {len(pub.subscribers)} of {args.n} subscribers joined")
        time.sleep(0.01)
        frame = pub.next_frame()  # keeps the subscribers' handshakes moving
        pub.publish(frame, payload=b"")
    for _ in range(WARMUP):
        pub.publish(pub.next_frame(), payload=b"")
    times = array.array("q") if args.times else None  # --stall-pairs: when each frame was published
    emit(role="timed")
    count, started, cpu = 0, now_ns(), time.process_time()
    end = started + int(args.duration * 1e9)
    period = int(1e9 / args.rate) if args.rate else 0
    due = started
    while now_ns() < end:
        if period:  # --rate: paced, sleeping (no CPU time) until the frame is due
            due += period
            ahead = due - now_ns()
            if ahead > 0:
                time.sleep(ahead / 1e9)
        frame = pub.next_frame()
        if write is not None:
            write(frame)
        pub.publish(frame, payload=b"W")
        count += 1
        if times is not None:
            times.append(now_ns())
    elapsed = (now_ns() - started) / 1e9
    if times is not None:
        with open(args.times, "wb") as out:
            times.tofile(out)
    cpu = time.process_time() - cpu
    transports = sorted({s.transport for s in pub.subscribers})
    emit(role="publisher", rate=count / elapsed, frames=count, transports=transports, cpu_us=1e6 * cpu / count,
         module=os.path.dirname(eglcuda.__file__))
    pub.publish(pub.next_frame(), payload=b"E")
    pub.close(timeout=2)  # a stalled subscriber never leaves: do not wait long for it
    return 0


def eglcuda_subscriber(args) -> int:
    pin(args, False)
    import eglcuda
    from eglcuda._bind import cuda

    sub = eglcuda.Subscriber("bench", qos=args.qos, queue=4, path=args.path, timeout=120, transport=args.transport,
                             busy_wait=args.busy_wait * 1e-6)
    emit(role="joined", transport=sub.info.transport)
    if args.stall:
        time.sleep(10_000)  # joined, never reads: killed by the orchestrator
    latencies, received, first, last, cpu = [], 0, 0, 0, math.nan
    stream = sub.cuda_stream or 0
    try:
        while True:
            try:
                message = sub.receive(60)
            except eglcuda.Dropped:
                break
            if args.sync and sub.info.transport == "cuda-ipc":
                cuda.stream_synchronize(stream)
            stamp = now_ns() if args.sync else message.received_ns
            if message.payload == b"W":
                if not received:
                    cpu = time.process_time()
                received += 1
                latencies.append(stamp - message.timestamp_ns)
                first = first or stamp
                last = stamp
            finished = message.payload == b"E"
            if finished and received:
                cpu = time.process_time() - cpu
            message.release()
            if finished:
                break
    finally:
        sub.close()
    emit(role="subscriber", **summarize(latencies, received, first, last, cpu))
    return 0


def profiled(role, args) -> int:
    """``role(args)`` under cProfile, its statistics written to ``args.profile``/<role>-<pid>.prof."""
    import cProfile

    folder = pathlib.Path(args.profile)
    folder.mkdir(parents=True, exist_ok=True)
    profile = cProfile.Profile()
    try:
        return profile.runcall(role, args)
    finally:
        profile.dump_stats(str(folder / f"{args.role}-{os.getpid()}.prof"))


# ==== the orchestrator ===================================================================================

def child_args(args, size: str, duration: float) -> list[str]:
    """The options every process of a configuration gets."""
    return (["--size", size, "--duration", str(duration), "--busy-wait", str(args.busy_wait), "--rate", str(args.rate)]
            + (["--sync"] if args.sync else []) + (["--write"] if args.write else []) + (["--pin"] if args.pin else []))


def tree_env(args, tree: str) -> dict[str, str]:
    """The environment of an eglcuda configuration's processes: ``tree`` "baseline" puts
    --baseline first on PYTHONPATH (its eglcuda is imported), "current" leaves it off."""
    env = dict(os.environ)
    parts = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if args.baseline:
        parts = [p for p in parts if os.path.abspath(p) != args.baseline]
        if tree == "baseline":
            parts.insert(0, args.baseline)
    if parts:
        env["PYTHONPATH"] = os.pathsep.join(parts)
    else:
        env.pop("PYTHONPATH", None)
    return env


def run_config(args, transport: str, size: str, qos: str, n: int, stalled: bool = False,
               tree: str = "current") -> dict:
    """One configuration in fresh processes; returns the publisher's and the subscribers' results.
    ``tree``: which eglcuda the processes import (see tree_env)."""
    common = child_args(args, size, args.duration)
    if args.profile:
        folder = f"{transport}-{size}-{qos}-n{n}{'-stalled' if stalled else ''}{'-' + tree if args.baseline else ''}"
        common += ["--profile", str(pathlib.Path(args.profile).resolve() / folder)]
    outputs = []
    env = tree_env(args, tree)
    with tempfile.TemporaryDirectory(prefix="eglcuda-bench-topics-") as folder:
        os.chmod(folder, 0o700)
        path = os.path.join(folder, "bench.topic")
        if transport in EGLCUDA_TRANSPORTS:
            publisher = subprocess.Popen([sys.executable, __file__, "--role", "pub", "--path", path, "--n", str(n),
                                          "--transport", transport, *common], stdout=subprocess.PIPE, text=True,
                                         cwd=ROOT, env=env)
            subscribers = [subprocess.Popen([sys.executable, __file__, "--role", "sub", "--path", path, "--qos", qos,
                                             "--transport", transport, *common]
                                            + (["--stall"] if stalled and index == 0 else []),
                                            stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env) for index in range(n)]
            try:
                out, _ = publisher.communicate(timeout=300)
                outputs.append(out)
                for index, child in enumerate(subscribers):
                    if stalled and index == 0:
                        child.kill()
                        child.communicate(timeout=30)
                        continue
                    out, _ = child.communicate(timeout=120)
                    outputs.append(out)
            finally:
                for child in [publisher, *subscribers]:
                    if child.poll() is None:
                        child.kill()
                        child.wait(10)
        else:
            role = "ring-pub" if transport == "ipc-ring" else "torch"
            child = subprocess.Popen([sys.executable, __file__, "--role", role, "--n", str(n), *common],
                                     stdout=subprocess.PIPE, text=True, cwd=ROOT, env=env)
            try:
                out, _ = child.communicate(timeout=300)
                outputs.append(out)
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait(10)
    results = [json.loads(line[7:]) for out in outputs for line in out.splitlines() if line.startswith("RESULT ")]
    skipped = [r for r in results if r["role"] == "skipped"]
    if skipped:
        return {"skipped": skipped[0]["reason"]}
    pub = [r for r in results if r["role"] == "publisher"]
    subs = [r for r in results if r["role"] == "subscriber"]
    if not pub or len(subs) != n - stalled:
        return {"error": f"{len(pub)} publisher and {len(subs)} of {n - stalled} subscriber results"}
    return {"publisher_rate": pub[0]["rate"], "transports": pub[0]["transports"],
            "subscriber_rates": [s["rate"] for s in subs], "p50_us": statistics.median(s["p50_us"] for s in subs),
            "p50_worst_us": max(s["p50_us"] for s in subs), "p99_us": max(s["p99_us"] for s in subs),
            "publisher_cpu_us": pub[0].get("cpu_us", math.nan),
            "subscriber_cpu_us": median_known(s.get("cpu_us") for s in subs),
            **({"module": pub[0]["module"]} if "module" in pub[0] else {})}


def _die_with_parent():
    """A preexec_fn for a child: SIGKILL when this process dies, so that a subscriber this process
    stopped (SIGSTOP) is not left behind, stopped, if it is killed. (prctl is looked up here, in
    the parent: the child only calls it.)"""
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    PR_SET_PDEATHSIG = 1
    return lambda: prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)


def run_stall_pairs(args, transport: str, size: str, n: int) -> dict:
    """One configuration of n 'latest' subscribers in which the first subscriber is stopped
    (SIGSTOP: it holds its frames and reads nothing) and resumed (SIGCONT) in turns of
    --stall-phase seconds, --stall-pairs times, while the publisher runs free. Each stalled phase's
    publisher rate is compared with the mean of the running phases around it: the same processes,
    seconds apart, so the machine's drift between configurations does not enter the ratio."""
    pairs, phase = args.stall_pairs, args.stall_phase
    common = child_args(args, size, (2 * pairs + 1) * phase + 1.0)
    with tempfile.TemporaryDirectory(prefix="eglcuda-bench-topics-") as folder:
        os.chmod(folder, 0o700)
        path, times_file = os.path.join(folder, "bench.topic"), os.path.join(folder, "times")
        spawn = dict(stdout=subprocess.PIPE, text=True, cwd=ROOT, preexec_fn=_die_with_parent())
        publisher = subprocess.Popen([sys.executable, __file__, "--role", "pub", "--path", path, "--n", str(n),
                                      "--times", times_file, "--transport", transport, *common], **spawn)
        subscribers = [subprocess.Popen([sys.executable, __file__, "--role", "sub", "--path", path, "--qos", "latest",
                                         "--transport", transport, *common], **spawn) for _ in range(n)]
        victim = subscribers[0]
        stopped = False
        try:
            while True:  # until the publisher starts its timed loop (every subscriber joined)
                line = publisher.stdout.readline()
                if not line:
                    return {"error": "the publisher ended before its timed loop"}
                if line.startswith("RESULT ") and json.loads(line[7:])["role"] == "timed":
                    break
            bounds = [now_ns()]  # phases: running, then stalled and running in turns
            time.sleep(phase)
            for _ in range(pairs):
                victim.send_signal(signal.SIGSTOP)
                stopped = True
                bounds.append(now_ns())
                time.sleep(phase)
                victim.send_signal(signal.SIGCONT)
                stopped = False
                bounds.append(now_ns())
                time.sleep(phase)
            bounds.append(now_ns())
            outputs = [publisher.communicate(timeout=120)[0]] + [child.communicate(timeout=120)[0]
                                                                  for child in subscribers]
            results = [json.loads(line[7:]) for out in outputs for line in out.splitlines()
                       if line.startswith("RESULT ")]
            reported = sum(1 for r in results if r["role"] == "subscriber")
            if publisher.returncode or not os.path.exists(times_file) or reported != n:
                return {"error": f"publisher exit status {publisher.returncode}, {reported} of {n} subscribers "
                                 "reported (one dropped or died?)"}
            times = array.array("q")
            with open(times_file, "rb") as data:
                times.frombytes(data.read())
        finally:
            if stopped:
                victim.send_signal(signal.SIGCONT)
            for child in [publisher, *subscribers]:
                if child.poll() is None:
                    child.kill()
                    child.wait(10)
    if not times or times[-1] < bounds[-2]:
        return {"error": "the publisher stopped publishing before the last phase"}
    bounds[-1] = min(bounds[-1], times[-1])  # (the publisher's own end, when it came first)
    # The first tenth of each phase is left out (the switch itself).
    rates = []
    for start, stop in zip(bounds, bounds[1:]):
        start += (stop - start) // 10
        count = bisect.bisect_left(times, stop) - bisect.bisect_left(times, start)
        rates.append(count / ((stop - start) / 1e9))
    running, stalled = rates[0::2], rates[1::2]
    changes = [rate / ((running[k] + running[k + 1]) / 2) - 1.0 for k, rate in enumerate(stalled)]
    return {"stall_pairs": pairs, "stall_phase": phase, "running_rates": running, "stalled_rates": stalled,
            "changes": changes, "median_change": statistics.median(changes)}


def needs(transports: list[str]) -> list[str]:
    """The capabilities (eglcuda.available's names) the chosen transports need."""
    wanted = ["cuda"]
    if "eglstream" in transports:
        wanted.append("cross-process")
    if any(t in ("cuda-ipc", "ipc-ring") for t in transports):
        wanted.append("cuda-ipc")
    return wanted


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1080p only, N = 1, 4, 8, one second each")
    parser.add_argument("--mps", action="store_true", help="run everything under a private MPS daemon")
    parser.add_argument("--check", action="store_true",
                        help="only check what these arguments need (one line and status 2 when something is missing)")
    parser.add_argument("--out", default="bench-topics", help="folder for results and plots")
    parser.add_argument("--duration", type=at_least(0, float, above=True), default=None, help="timed seconds per configuration")
    parser.add_argument("--sync", action="store_true", help="latency includes the subscriber's stream catching up")
    parser.add_argument("--write", action="store_true",
                        help="the publisher writes every frame on the GPU (a device copy per plane) before handing it over")
    parser.add_argument("--transports", default=",".join(TRANSPORTS))
    parser.add_argument("--subscribers", default=None, help="e.g. 1,2,4,8")
    parser.add_argument("--qos", default="latest,every")
    parser.add_argument("--sizes", default=None, help=f"from {','.join(SIZES)}")
    parser.add_argument("--busy-wait", type=at_least(0, float), default=20.0, metavar="US",
                        help="eglcuda subscribers' busy_wait in microseconds (0: sleep at once)")
    parser.add_argument("--profile", default=None, help="write cProfile files of each process to this folder")
    parser.add_argument("--stall-pairs", type=at_least(0), default=0, metavar="K",
                        help="also measure one stalled 'latest' subscriber of N inside one run: stop it and "
                             "resume it K times (SIGSTOP / SIGCONT), comparing the publisher's rate in each phase")
    parser.add_argument("--stall-phase", type=at_least(0, float), default=0.5, metavar="S", help="seconds per --stall-pairs phase")
    parser.add_argument("--rate", type=at_least(0, float), default=0.0, metavar="FPS",
                        help="eglcuda publishers publish at this rate (0: as fast as the subscribers allow)")
    parser.add_argument("--pin", action="store_true",
                        help="the publisher on one CPU of its own, the subscribers on the others (sched_setaffinity)")
    parser.add_argument("--rounds", type=at_least(1), default=1, metavar="R",
                        help="run every configuration R times; the tables give the medians")
    parser.add_argument("--baseline", default=None, metavar="SITE_DIR",
                        help="also run each eglcuda configuration with the eglcuda installed in SITE_DIR (an older "
                             "tree: pip install --target), alternating with this tree, and compare them")
    # the roles of the processes this script spawns
    parser.add_argument("--role", choices=["pub", "sub", "ring-pub", "ring-sub", "torch"], help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--size", default="1080p-nv12", help=argparse.SUPPRESS)
    parser.add_argument("--transport", default="auto", help=argparse.SUPPRESS)
    parser.add_argument("--stall", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--times", help=argparse.SUPPRESS)
    args = parser.parse_args()
    output_folder(parser, "--out", args.out)
    if args.stall_pairs < 0 or not args.stall_phase > 0:
        parser.error("--stall-pairs is 0 or more and --stall-phase more than 0")
    if not 0 <= args.rate <= 1e6:
        parser.error(f"--rate is 0 to 1e6 frames/s, got {args.rate:g}")
    if args.rounds < 1:
        parser.error(f"--rounds is 1 or more, got {args.rounds}")
    if not 0 <= args.busy_wait <= 10_000:
        parser.error(f"--busy-wait is 0 to 10000 microseconds, got {args.busy_wait:g}")
    if args.role:
        args.duration = args.duration or 2.0
        role = {"pub": eglcuda_publisher, "sub": eglcuda_subscriber, "ring-pub": ring_publisher,
                "ring-sub": ring_subscriber, "torch": torch_run}[args.role]
        return profiled(role, args) if args.profile else role(args)

    transports = listed(parser, "--transports", args.transports, f"transports from {','.join(TRANSPORTS)}",
                        choices=TRANSPORTS)
    sizes = listed(parser, "--sizes", args.sizes or ("1080p-nv12" if args.quick else ",".join(SIZES)),
                   f"sizes from {','.join(SIZES)}", choices=SIZES)
    ns = listed(parser, "--subscribers", args.subscribers or ("1,4,8" if args.quick else "1,2,4,8"),
                "subscriber counts, e.g. 1,2,4,8", int, least=1)
    qoses = listed(parser, "--qos", args.qos, "latest and/or every", choices=("latest", "every"))
    if set(transports) == {"torch-mp"} and importlib.util.find_spec("torch") is None:
        # (in a run of several transports its rows are skipped with the reason; asked for alone,
        # a run would measure nothing)
        fail(PROGRAM, "needs PyTorch for --transports torch-mp: pip install -e '.[bench]'", 2)
    # Probed in a child: this process never initializes CUDA, so an MPS daemon serves every process.
    require(PROGRAM, *needs(transports), in_child=True)
    if args.check:
        if args.mps:
            mps_binaries(PROGRAM)
        return 0
    if args.baseline:
        args.baseline = os.path.abspath(args.baseline)
        if not os.path.isfile(os.path.join(args.baseline, "eglcuda", "__init__.py")):
            print(f"{PROGRAM}: --baseline {args.baseline} holds no eglcuda: build the older tree there with "
                  "pip install --no-deps --no-build-isolation --target DIR TREE", file=sys.stderr)
            return 2
    args.duration = args.duration or (1.0 if args.quick else 2.0)
    out = pathlib.Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with (mps_daemon() if args.mps else contextlib.nullcontext("off")) as mps_mode:
        print(f"MPS: {mps_mode}; eglcuda subscribers busy-wait {args.busy_wait:g} us", flush=True)
        for round_ in range(args.rounds):
            for size in sizes:
                for qos in qoses:
                    for transport in transports:
                        if transport in ("ipc-ring", "torch-mp") and qos != "every":
                            continue  # lossless rings: compared in the 'every' rows
                        for n in ns:
                            for tree in trees(args, transport, round_):
                                row = {"size": size, "qos": qos, "transport": transport, "n": n,
                                       **({"round": round_, "tree": tree} if args.rounds > 1 or args.baseline else {}),
                                       **run_config(args, transport, size, qos, n, tree=tree)}
                                rows.append(row)
                                print(format_row(row), flush=True)
                                save(out, args, rows)  # (so far: a run cut short keeps what it measured)
        for size in sizes:
            if "latest" in qoses and max(ns) >= 2:
                for transport in [t for t in transports if t in EGLCUDA_TRANSPORTS]:
                    n = max(ns)
                    row = {"size": size, "qos": "latest", "transport": transport, "n": n, "stalled": True,
                           **run_config(args, transport, size, "latest", n, stalled=True)}
                    rows.append(row)
                    print(format_row(row), flush=True)
                    if args.stall_pairs > 0:
                        row = {"size": size, "qos": "latest", "transport": transport, "n": n, "paired": True,
                               **run_stall_pairs(args, transport, size, n)}
                        rows.append(row)
                        print(format_row(row), flush=True)
    cells = save(out, args, rows)
    first = [r for r in rows if r.get("round", 0) == 0 and r.get("tree", "current") == "current"]
    table = markdown(first, args)
    compared = compare_markdown(cells, args) if cells else ""
    (out / "results.md").write_text(table + ("\n\n" + compared if compared else "") + "\n")
    written = plot(first, out)
    print("\n" + table)
    print(f"\nwrote {out}/results.json, results.md, {', '.join(written) or 'no plots'}")
    print("SUMMARY " + summary_line(first))
    if compared:
        print("\n" + compared)
    errors = [r for r in rows if "error" in r]
    return 1 if errors else 0


def save(out: pathlib.Path, args, rows: list[dict]) -> list[dict]:
    """Write results.json (the rows, and with --rounds or --baseline the comparison); returns the comparison."""
    cells = compare(rows) if args.rounds > 1 or args.baseline else []
    (out / "results.json").write_text(json.dumps({"mps": args.mps, "duration": args.duration, "sync": args.sync,
                                                  "write": args.write, "busy_wait_us": args.busy_wait,
                                                  "rounds": args.rounds, "baseline": args.baseline,
                                                  "rows": rows, "comparison": cells}, indent=1))
    return cells


def trees(args, transport: str, round_: int) -> list[str]:
    """Which eglcuda trees run a configuration in round ``round_``, in order: with --baseline, an
    eglcuda transport runs with both, the baseline first in even rounds (the alternatives run once,
    with this tree)."""
    if not args.baseline or transport not in EGLCUDA_TRANSPORTS:
        return ["current"]
    return ["baseline", "current"] if round_ % 2 == 0 else ["current", "baseline"]


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
