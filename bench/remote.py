"""Remote subscribers: a topic served over UCX by an eglcuda relay, measured on one host over TCP
loopback (``UCX_TLS=tcp``, ``UCX_NET_DEVICES=lo``: the path a frame takes between hosts, not UCX's
shared-memory shortcuts), next to the alternatives in the same run:

- ``eglcuda``: a publisher process, a local subscriber process (qos latest), a relay process
  (``eglcuda.Relay``) and N remote subscriber processes (``eglcuda.Subscriber(name, remote=...)``,
  qos latest), each a fresh interpreter; with --every, also ``eglcuda every``: the same with the
  relay and its remotes at qos every and the deepest window (``wire.MAX_WINDOW`` frames in flight,
  where a 'latest' remote has ``LATEST_WINDOW``): how much of a remote's rate its window sets;
- ``ucx-raw``: UCXX itself moving host buffers of the frame's size between two processes (the
  engine's floor, bench/_ucx_raw.py): with the relay's window of frames in flight (its
  ``LATEST_WINDOW``) and one in flight (ping-pong), in each of --engine-modes: ``blocking`` (the
  core API, a thread sleeping in ``progress_worker_event``: the fastest where measured) and
  ``asyncio-blocking`` (UCXX's asyncio API, ``progress_mode="blocking"``);
- ``zmq``: what a user would otherwise write: a device-to-host copy, pyzmq PUB to N SUB
  processes (high-water mark 2: a slow subscriber loses frames, like qos latest), and a
  host-to-device copy on arrival (all with eglcuda's CUDA bindings, pinned by nothing: plain
  host memory, as ``cupy.asnumpy`` gives);
- ``local only``: the publisher and the local subscriber without relay: the local subscriber's
  rate with and without remote subscribers running;
- ``local beside ucx-raw`` (--beside-raw): the same pair while the raw engine moves frames of the
  same size flat out between two other processes: what the host's shared resources (the
  loopback's copies, memory bandwidth, caches) take from the local subscriber with no relay.

Each configuration runs for --duration seconds once every process joined; frames count when their
publish time (``Message.timestamp_ns``, the publisher's CLOCK_MONOTONIC, shared by the host's
processes) falls in that window. Latency runs from the publish time to the moment the frame is
*usable* in the subscriber: in its own device memory (its pool slot for eglcuda, a device buffer
for zmq) with its stream synchronized. The publisher runs free (--rates max) or paced (--rates 60:
frames per second). Rates are per subscriber; bytes/s are the frame's bytes times that rate.

Goals, checked at the end (medians over --rounds): one flat-out remote subscriber at >= 0.9x the
raw engine's rate from host buffers with the relay's window (>= 0.5x for frames under a million
pixels, e.g. --width 320 --height 240: what a frame costs apart from its bytes) and, with
--raw-gpu, >= 1.0x the raw engine taking each frame through the GPU; 8 remote subscribers at 60
frames/s each with p99 < 10 ms; a local subscriber beside one flat-out remote within 5 % of its
rate alone.

    python bench/remote.py [--quick] [--out DIR] [--duration S] [--sizes 1080p-nv12,4k-argb]
                           [--subscribers 1,4,8] [--rates max,60] [--variants eglcuda,zmq,ucx-raw]
                           [--width W --height H]   (one custom NV12 size, e.g. for a CPU dry run)
                           [--no-plots]             (a machine without matplotlib: plots later)
                           [--ucx-env K=V,...]      (UCX settings for every process, raw engine included)
                           [--raw-rings 12]         (also the raw engine sending from a ring of 12 buffers)
                           [--raw-gpu]              (also the raw engine with each frame from and into GPU memory)
                           [--rounds R]             (everything R times in turn; the goals on the medians)
                           [--mps]                  (every process a client of a private MPS daemon)
                           [--frame-modes integrity,encrypted]  (also with the relay's frames so protected)
                           [--every]                (also a remote taking every frame: qos='every', the deepest window)
                           [--beside-raw]           (also the local subscriber beside the raw engine, no relay)
    python bench/remote.py --replot DIR            (the plots of DIR/results.json, into DIR)

Here: the eglcuda roles and the orchestrator; the zmq baseline's roles are in _remote_zmq.py, what the
roles share in _remote_common.py, the raw engine in _ucx_raw.py, the results in _remote_report.py.

Writes results.json, results.md and plots (PNG, docs/img style) to --out; prints the table last.
Exits 2 with one line where there is no CUDA GPU, no ucxx (``pip install -e '.[remote-cu13]'``
or ``remote-cu12``), no pyzmq or no matplotlib (``pip install -e '.[bench]'``; not checked with
--no-plots). On a machine
without a GPU, the fake libcuda of tests/fakes runs it end to end (small sizes): the numbers then
measure the Python and UCX side only.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pathlib
import resource
import secrets
import sys
import tempfile
import threading
import time
from typing import Callable

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _remote_common import TAIL_S, Pacer, RoleProcess, Tally, Window, emit, frame_bytes, now_ns  # noqa: E402
from _remote_report import goals, markdown, plot, summarize  # noqa: E402
from _remote_zmq import role_zmq_publisher, role_zmq_subscriber  # noqa: E402
from _script import BENCH_HINT, CRYPTOGRAPHY, MATPLOTLIB, at_least, fail, listed, mps_binaries, mps_daemon, output_folder, require, run  # noqa: E402

PROGRAM = "bench/remote.py"
SIZES = {"1080p-nv12": (1920, 1080, "NV12"), "4k-argb": (3840, 2160, "ARGB")}
UCX_ENV = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n"}
ZMQ = ("zmq", "pyzmq for the baseline", BENCH_HINT)
JOIN_S = 60.0  # how long every process of a configuration may take to join
BESIDE_MARGIN_S = 4.0  # the raw engine beside the local pair runs this much longer than their window
NAME = "bench-remote"


# ==== the eglcuda roles ===========================================================================

def role_publisher(args) -> int:
    import eglcuda

    width, height, fmt = args.width, args.height, args.format
    window = Window()
    published = 0
    with eglcuda.Publisher(NAME, width, height, fmt, path=args.path, pool=8, max_pool=32, every_timeout=5.0) as pub:
        emit(role="ready")
        pacer = Pacer(args.rate)
        while not window.over(TAIL_S):
            pacer.wait()
            frame = pub.next_frame(timeout=30)
            stamp = now_ns()
            pub.publish(frame, payload=b"")
            published += window.inside(stamp)
            if not window.given.is_set() and not pacer.period:
                time.sleep(0.001)  # while the others join: keep frames coming without eating a core
        span = (window.end - window.start) / 1e9
        emit(role="publisher", rate=published / span if span > 0 else math.nan, frames=published)
    return 0


def _subscriber_loop(sub, window: Window, tally: Tally) -> None:
    import eglcuda
    from eglcuda._bind import cuda

    stream = sub.cuda_stream or 0
    while not window.over(2.0):
        try:
            message = sub.receive(1.0)
        except eglcuda.Timeout:
            continue
        except (eglcuda.Dropped, eglcuda.StreamDisconnected):
            break  # the publisher closed at the end
        cuda.stream_synchronize(stream, "waiting for a frame to be usable")
        tally.add(window, message.timestamp_ns, now_ns())
        message.release()


def role_local(args) -> int:
    import eglcuda

    window, tally = Window(), Tally()
    with eglcuda.Subscriber(NAME, qos="latest", path=args.path, timeout=JOIN_S) as sub:
        emit(role="joined", transport=sub.info.transport)
        _subscriber_loop(sub, window, tally)
    emit(role="local", **tally.result(window))
    return 0


def cpu_in(window: Window) -> Callable[[], float]:
    """CPU seconds this process (all its threads) spends inside the timed window: a thread reads
    getrusage at the window's start and end; call the result after the window."""
    spent: list[float] = []

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def sample() -> None:
        window.given.wait()
        while now_ns() < window.start and not window.abandoned:
            time.sleep(0.002)
        start = cpu()
        while now_ns() < window.end and not window.abandoned:
            time.sleep(0.002)
        spent.append(cpu() - start)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    return lambda: (thread.join(5), spent[0] if spent else math.nan)[1]


def role_relay(args) -> int:
    import eglcuda

    window = Window()
    cpu = cpu_in(window)
    key = bytes.fromhex(pathlib.Path(args.key_file).read_text().strip())
    with eglcuda.Relay(NAME, listen="127.0.0.1:0", key=key, path=args.path, timeout=JOIN_S,
                       frames=args.frames, qos=args.qos) as relay:
        emit(role="listening", port=relay.address[1])
        while not window.over(1.0):
            time.sleep(0.05)
        remotes = [{"sent": r.sent, "skipped": r.skipped, "dropped": r.dropped} for r in relay.remotes]
    emit(role="relay", remotes=remotes, cpu_s=cpu())
    return 0


def role_remote(args) -> int:
    import eglcuda

    window, tally = Window(), Tally()
    cpu = cpu_in(window)
    key = bytes.fromhex(pathlib.Path(args.key_file).read_text().strip())
    queue = {"queue": every_window()} if args.qos == "every" else {}  # (the deepest window a relay gives)
    with eglcuda.Subscriber(NAME, remote=f"127.0.0.1:{args.port}", key=key, qos=args.qos, timeout=JOIN_S,
                            **queue) as sub:
        emit(role="joined", transport=sub.info.transport)
        _subscriber_loop(sub, window, tally)
    emit(role="remote", **tally.result(window), cpu_s=cpu())
    return 0


# ==== orchestration ===============================================================================

def spawn(role: str, args, env: dict, *extra: str) -> RoleProcess:
    """A role process of this bench (this file with ``--role``)."""
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--role", role, "--width", str(args.width),
               "--height", str(args.height), "--format", args.format, *extra]
    return RoleProcess(role, command, env)



def run_config(args, variant: str, n: int, rate: float, env: dict, frames: str = "plain",
               qos: str = "latest") -> dict:
    """One configuration of the eglcuda or zmq variant (``frames``: the relay's frame mode;
    ``qos``: the relay's and its remotes'): its processes, the window, the results."""
    children: list[RoleProcess] = []
    with tempfile.TemporaryDirectory(prefix="eglcuda-bench-remote-") as folder:
        os.chmod(folder, 0o700)
        path = os.path.join(folder, "bench.topic")
        key_file = os.path.join(folder, "key")
        with open(os.open(key_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as handle:
            handle.write(secrets.token_hex(32))
        rate_args = ("--rate", str(rate))
        try:
            subs: list[RoleProcess] = []
            local = relay = None
            if variant == "zmq":
                pub = spawn("zmq-pub", args, env, *rate_args)
                children.append(pub)
                port = pub.expect("ready", JOIN_S)["port"]
                subs = [spawn("zmq-sub", args, env, "--port", str(port)) for _ in range(n)]
                children += subs
            else:
                pub = spawn("pub", args, env, "--path", path, *rate_args)
                children.append(pub)
                pub.expect("ready", JOIN_S)
                local = spawn("local", args, env, "--path", path)
                children.append(local)
                local.expect("joined", JOIN_S)
                if n:
                    relay = spawn("relay", args, env, "--path", path, "--key-file", key_file, "--frames", frames,
                                  "--qos", qos)
                    children.append(relay)
                    port = relay.expect("listening", JOIN_S)["port"]
                    subs = [spawn("remote", args, env, "--port", str(port), "--key-file", key_file, "--qos", qos)
                            for _ in range(n)]
                    children += subs
            for sub in subs:
                sub.expect("joined", JOIN_S)
            time.sleep(0.5)  # warm up: every connection carried frames before the window
            start = now_ns() + int(0.2e9)
            end = start + int(args.duration * 1e9)
            for child in children:
                child.go(start, end)
            finish = args.duration + TAIL_S + 30
            published = pub.expect("publisher", finish)
            row: dict = {"publisher_rate": published["rate"]}
            if local is not None:
                row["local"] = local.expect("local", 15)
            row["subscribers"] = [sub.expect("remote", 15) for sub in subs]
            if relay is not None:
                said = relay.expect("relay", 15)
                row["relay"], row["relay_cpu_s"] = said.get("remotes"), said.get("cpu_s")
            return row
        except (RuntimeError, json.JSONDecodeError) as exc:
            return {"error": " ".join(str(exc).split())[:300]}
        finally:
            for child in children:
                child.stop()


def raw_engine(args, size: int, window: int, mode: str, env: dict, buffers: int = 1, gpu: bool = False,
               duration: float | None = None) -> dict:
    import _ucx_raw

    try:
        result = _ucx_raw.measure(size, window, mode, duration or args.duration, env, buffers=buffers, gpu=gpu)
    except Exception as exc:  # noqa: BLE001 - reported in the row
        return {"error": " ".join(str(exc).split())[:300]}
    result.pop("size", None)  # (bytes: the row's "size" is the frame's name)
    return result


def local_beside_raw(args, size: int, window: int, mode: str, rate: float, env: dict) -> dict:
    """The publisher and the local subscriber alone (as ``local only``) while the raw engine moves
    frames of the same size flat out between two other processes of the host: what the host's
    shared resources (the loopback's copies, memory bandwidth, caches) take from the local pair
    when no relay serves their topic. The raw engine starts first and runs past the local window."""
    beside: dict = {}
    engine = threading.Thread(target=lambda: beside.update(
        raw_engine(args, size, window, mode, env, duration=args.duration + BESIDE_MARGIN_S)), daemon=True)
    engine.start()
    time.sleep(1.0)  # (its processes import UCXX and connect before the local pair's window)
    row = run_config(args, "eglcuda", 0, rate, env)
    engine.join(args.duration + BESIDE_MARGIN_S + 150)
    row["beside"] = {k: beside[k] for k in ("rate", "error") if k in beside}
    return row


def relay_staging() -> int:
    """The relay's staging buffers (the raw engine's ring with --raw-gpu)."""
    from eglcuda.remote import staging

    return int(staging.STAGING)


def every_window() -> int:
    """The most frames a relay sends ahead of an 'every' remote subscriber's credits."""
    from eglcuda.remote import wire

    return int(wire.MAX_WINDOW)


def relay_window() -> int:
    """How many frames the relay sends ahead of a 'latest' remote subscriber's credit."""
    try:
        from eglcuda.remote import wire

        return int(wire.LATEST_WINDOW)
    except ImportError:
        return 3


# ==== main ========================================================================================

def pace(text: str) -> float:
    """A --rates value: ``max`` (0.0: flat out) or frames per second."""
    return 0.0 if text == "max" else float(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1080p only, N = 1 and 8, one second each")
    parser.add_argument("--out", default="bench-remote", help="folder for results and plots")
    parser.add_argument("--duration", type=at_least(0, float, above=True), default=None, help="timed seconds per configuration (default 2)")
    parser.add_argument("--rounds", type=at_least(1), default=1,
                        help="measure everything this many times in turn, the raw engine first in each round: "
                             "the goals are then judged on the medians of the rounds' ratios")
    parser.add_argument("--sizes", default=None, help=f"from {','.join(SIZES)}")
    parser.add_argument("--subscribers", default=None, help="remote subscriber counts, e.g. 1,4,8")
    parser.add_argument("--rates", default="max,60", help="publisher pace: max and/or frames per second")
    parser.add_argument("--variants", default="eglcuda,zmq,ucx-raw")
    parser.add_argument("--engine-modes", default="blocking,asyncio-blocking",
                        help="bench/_ucx_raw.py progress modes for ucx-raw (comma-separated)")
    parser.add_argument("--raw-rings", default="", metavar="N,...",
                        help="also the raw engine sending from a ring of N distinct buffers in turn (e.g. 12, "
                             "the relay's staging ring): one buffer sent again and again stays in the CPU's cache")
    parser.add_argument("--raw-gpu", action="store_true",
                        help="also the raw engine taking each frame's way through the GPU as the relay and a remote "
                             "subscriber do (a D2H copy into a ring of page-locked buffers before each send, an H2D "
                             "copy after each receive; bench/_ucx_raw.py --gpu)")
    parser.add_argument("--width", type=at_least(2), help="one custom NV12 size instead of --sizes (with --height)")
    parser.add_argument("--height", type=at_least(2))
    parser.add_argument("--ucx-env", default="", metavar="K=V,...",
                        help="UCX_* settings for every process (e.g. UCX_TCP_TX_SEG_SIZE=256K,UCX_TCP_RX_SEG_SIZE=1M)")
    parser.add_argument("--mps", action="store_true",
                        help="run every process under a private MPS daemon (one GPU shared by the host's processes)")
    parser.add_argument("--frame-modes", default="", metavar="MODE,...",
                        help="also each eglcuda configuration with the relay's frames integrity and/or encrypted "
                             "(docs/security.md)")
    parser.add_argument("--every", action="store_true",
                        help="also each eglcuda configuration with the relay and its remotes taking every frame "
                             "(qos='every', queue = the relay's deepest window) beside 'latest', in the same round")
    parser.add_argument("--beside-raw", action="store_true",
                        help="also the local subscriber alone while the raw engine moves the frame's size flat out "
                             "beside it (the first --engine-modes, the relay's window): what the host's shared "
                             "resources take from a local subscriber when no relay serves its topic")
    parser.add_argument("--no-plots", action="store_true", help="write no plots (no matplotlib needed)")
    parser.add_argument("--check", action="store_true",
                        help="only check what these arguments need (one line and status 2 when something is missing)")
    parser.add_argument("--replot", metavar="DIR", help="only draw the plots of DIR/results.json (into DIR)")
    # the roles of the processes this script spawns
    parser.add_argument("--role", choices=["pub", "local", "relay", "remote", "zmq-pub", "zmq-sub"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--format", default="NV12", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--key-file", help=argparse.SUPPRESS)
    parser.add_argument("--frames", default="plain", help=argparse.SUPPRESS)
    parser.add_argument("--qos", default="latest", choices=["latest", "every"], help=argparse.SUPPRESS)
    parser.add_argument("--rate", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    output_folder(parser, "--out", args.out)
    if args.role:
        return {"pub": role_publisher, "local": role_local, "relay": role_relay, "remote": role_remote,
                "zmq-pub": role_zmq_publisher, "zmq-sub": role_zmq_subscriber}[args.role](args)

    if args.replot:
        require(PROGRAM, modules=[MATPLOTLIB])
        folder = pathlib.Path(args.replot).resolve()
        try:
            saved = json.loads((folder / "results.json").read_text())
        except (OSError, ValueError) as exc:
            fail(PROGRAM, f"cannot read {folder / 'results.json'}: {exc}", 2)  # a bad --replot DIR
        if not (isinstance(saved, dict) and isinstance(saved.get("rows"), list) and "window" in saved):
            fail(PROGRAM, f"{folder / 'results.json'} is not this benchmark's results (no rows and window)", 2)
        written = plot(saved["rows"], folder, saved["window"])
        print(f"wrote {', '.join(str(folder / name) for name in written) or 'no plots (no rows to plot)'}")
        return 0
    variants = args.variants.split(",")
    import _ucx_raw

    if set(args.engine_modes.split(",")) - set(_ucx_raw.MODES):
        parser.error(f"--engine-modes from {','.join(_ucx_raw.MODES)}")
    unknown = set(variants) - {"eglcuda", "zmq", "ucx-raw"}
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}: eglcuda, zmq, ucx-raw")
    try:
        args.raw_rings = [int(n) for n in filter(None, args.raw_rings.split(","))]
    except ValueError:
        parser.error("--raw-rings takes buffer counts, e.g. 12")
    if any(n < 2 for n in args.raw_rings):
        parser.error("--raw-rings counts are at least 2")
    args.frame_modes = [m for m in args.frame_modes.split(",") if m]
    if set(args.frame_modes) - {"integrity", "encrypted"}:
        parser.error("--frame-modes from integrity,encrypted")
    if (args.width is None) != (args.height is None) or (args.width is not None and (args.width < 16 or args.height < 16
                                                                                       or args.width % 2 or args.height % 2)):
        parser.error("--width and --height go together, even numbers of at least 16")
    args.duration = args.duration or (1.0 if args.quick else 2.0)
    if not args.duration > 0:
        parser.error("--duration is more than 0 seconds")
    if not 1 <= args.rounds <= 20:
        parser.error("--rounds is 1 to 20")
    if args.width is not None:
        sizes = {f"{args.width}x{args.height}-nv12": (args.width, args.height, "NV12")}
    else:
        names = (args.sizes or ("1080p-nv12" if args.quick else ",".join(SIZES))).split(",")
        if set(names) - set(SIZES):
            parser.error(f"--sizes from {','.join(SIZES)}")
        sizes = {name: SIZES[name] for name in names}
    ns = listed(parser, "--subscribers", args.subscribers or ("1,8" if args.quick else "1,4,8"),
                "remote subscriber counts, e.g. 1,4,8", int, least=1)
    paces = listed(parser, "--rates", args.rates, "max and/or frames per second, e.g. max,60", pace, least=0)
    args.ucx_pairs = {}
    for setting in filter(None, args.ucx_env.split(",")):
        key, _, value = setting.partition("=")
        if not key.startswith(("UCX_", "UCXPY_")) or not value:
            parser.error(f"--ucx-env takes UCX_NAME=VALUE pairs, got {setting!r}")
        args.ucx_pairs[key] = value
    # Checks first: a GPU (CUDA), pyca/cryptography, ucxx, pyzmq, matplotlib (unless --no-plots).
    # (--mps: the probe runs in a child, so that this process never initializes CUDA before the daemon)
    require(PROGRAM, "cuda", in_child=args.mps,
            modules=[CRYPTOGRAPHY, *([] if args.no_plots else [MATPLOTLIB]), *([ZMQ] if "zmq" in variants else [])])
    from eglcuda.remote import ucxx_missing

    missing = ucxx_missing()
    if missing:
        fail(PROGRAM, missing, 2)
    if args.check:
        if args.mps:
            mps_binaries(PROGRAM)
        return 0
    with (mps_daemon() if args.mps else contextlib.nullcontext("off")) as mps_mode:
        print(f"MPS: {mps_mode}", flush=True)
        args.mps_note = mps_mode
        return measure_all(args, parser, variants, sizes, ns, paces)


def measure_all(args, parser, variants: list[str], sizes: dict, ns: list[int], paces: list[float]) -> int:
    """Every configuration asked for, in order; results.json and results.md after each row."""
    window = relay_window()
    # (built here: under --mps, os.environ names the daemon the processes started from now on use)
    env = {**os.environ, **{k: v for k, v in UCX_ENV.items() if k not in os.environ}, "PYTHONUNBUFFERED": "1"}
    env.update(args.ucx_pairs)
    args.ucx_note = " ".join(f"{k}={v}" for k, v in sorted(env.items())
                             if k.startswith(("UCX_", "UCXPY_")) and k != "UCX_WARN_UNUSED_ENV_VARS")
    out = pathlib.Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []

    def save(verdicts: list[str]) -> None:
        (out / "results.json").write_text(json.dumps({
            "duration": args.duration, "window": window, "engine_modes": args.engine_modes, "mps": args.mps,
            "ucx_env": {k: v for k, v in env.items() if k.startswith(("UCX_", "UCXPY_"))}, "rows": rows,
            "goals": verdicts}, indent=1))
        (out / "results.md").write_text(markdown(rows, args, window) + "\n\n" + "\n".join(f"- {v}" for v in verdicts) + "\n")

    def record(row: dict) -> None:
        rows.append(summarize(row))
        print(markdown([row], args, window).splitlines()[-1], flush=True)
        save(goals(rows, window))  # after each row: a run cut short keeps what it measured

    for size, (width, height, fmt) in sizes.items():
        args.width, args.height, args.format = width, height, fmt
        nbytes = frame_bytes(width, height, fmt)
        for round_ in range(1, args.rounds + 1):  # (each round: the raw engine, then every configuration)
            base = {"size": size, "bytes": nbytes, **({"round": round_} if args.rounds > 1 else {})}
            if "ucx-raw" in variants:
                for mode in args.engine_modes.split(","):
                    for w in dict.fromkeys((window, 1)):
                        record({**base, "variant": f"ucx-raw {mode} w{w}", "pace": "max",
                                **raw_engine(args, nbytes, w, mode, env)})
                    for ring in args.raw_rings:  # (a sender that sends from a ring of buffers, as the relay does)
                        record({**base, "variant": f"ucx-raw {mode} ring{ring} w{window}", "pace": "max",
                                **raw_engine(args, nbytes, window, mode, env, buffers=ring)})
                    if args.raw_gpu and not mode.startswith("asyncio"):  # (the relay's staging ring, its window)
                        record({**base, "variant": f"ucx-raw {mode} gpu w{window}", "pace": "max",
                                **raw_engine(args, nbytes, window, mode, env, buffers=relay_staging(), gpu=True)})
            for pace in paces:
                label = "max" if pace == 0 else f"{pace:g}/s"
                if "eglcuda" in variants:
                    record({**base, "variant": "local only", "pace": label, "n": 0,
                            **run_config(args, "eglcuda", 0, pace, env)})
                if args.beside_raw and "eglcuda" in variants:  # (after 'local only', same round)
                    record({**base, "variant": "local beside ucx-raw", "pace": label, "n": 0,
                            **local_beside_raw(args, nbytes, window, args.engine_modes.split(",")[0], pace, env)})
                for n in ns:
                    for variant in ("eglcuda", "zmq"):
                        if variant in variants:
                            record({**base, "variant": variant, "pace": label, "n": n,
                                    **run_config(args, variant, n, pace, env)})
                    if args.every and "eglcuda" in variants:  # (beside 'latest', same round)
                        record({**base, "variant": "eglcuda every", "pace": label, "n": n,
                                **run_config(args, "eglcuda", n, pace, env, qos="every")})
                    for mode in args.frame_modes if "eglcuda" in variants else ():  # (beside plain, same round)
                        record({**base, "variant": f"eglcuda {mode}", "pace": label, "n": n,
                                **run_config(args, "eglcuda", n, pace, env, frames=mode)})
    verdicts = goals(rows, window)
    table = markdown(rows, args, window)
    save(verdicts)
    written = [] if args.no_plots else plot(rows, out, window)
    print("\n" + table + "\n")
    for verdict in verdicts:
        print(verdict)
    print(f"\nwrote {out}/results.json, results.md, {', '.join(written) or 'no plots'}")
    return 1 if any("error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
