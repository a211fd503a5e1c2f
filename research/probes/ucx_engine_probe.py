"""What eglcuda's UCX engine (eglcuda/remote/_ucx.py) costs a message, next to UCXX alone in the
same run: the flow of bench/_ucx_raw.py (a receiver owns ``window`` buffers, acknowledges each
frame with 8 bytes and posts its receive again; the sender keeps at most ``window`` frames
unacknowledged; window 1 is ping-pong) through ``_ucx.engine()`` in both processes, every message
an ``Endpoint.send_now`` / ``recv_now`` whose ``done`` callback runs on the engine's loop (what the
relay's and a remote subscriber's frame path do), against ``bench/_ucx_raw.py`` in its ``blocking``
mode (the raw engine of bench/remote.py's tables) and ``thread`` mode, each configuration once per
round, rounds interleaved. Two processes over TCP loopback (``UCX_TLS=tcp UCX_NET_DEVICES=lo``).

Before the stream the sending process sits connected and idle for --idle seconds: its CPU use
meanwhile (% of a core) is what an idle relay or subscriber costs in that progress mode.

    python research/probes/ucx_engine_probe.py [--size 115200] [--duration 2] [--rounds 3]
                                               [--modes thread,loop] [--windows 1,3] [--idle 2]

``--modes thread@DIR`` runs that engine with the eglcuda package of DIR (a copy of another version,
e.g. ``git archive HEAD~1 eglcuda | tar -x -C DIR`` plus the built extensions) in the same rounds.

Prints one line per configuration and round, then the medians and their ratio to the raw engine
(blocking) of the same round and window.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

import _needs  # research/probes/_needs.py: a missing need is one line and status 2

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "bench"))
for key, value in {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n"}.items():
    os.environ.setdefault(key, value)

FRAME, ACK = 1, 2  # message kinds
SENDER_PREFIX, RECEIVER_PREFIX = 0x5E11DE7, 0x7ECE17E  # what each side receives on
WARMUP = 20
STOP = 2**64 - 1


def _emit(line: str) -> None:
    print(line, flush=True)


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _receive(args: argparse.Namespace) -> None:
    import numpy as np

    from eglcuda.remote import _ucx

    engine = _ucx.engine()
    finished = asyncio.Event()

    async def serve(ep: _ucx.Endpoint) -> None:
        ep.use_tags(RECEIVER_PREFIX, SENDER_PREFIX)
        raw = [np.empty(args.size, np.uint8) for _ in range(args.window)]
        buffers = [engine.arr(buffer) for buffer in raw]
        ack = engine.arr(np.zeros(1, np.uint64))

        def landed(index: int, error: Any) -> None:
            if error is not None:
                finished.set()
                return
            ep.send_now(ack, ACK, lambda error: None)
            if int(raw[index].view(np.uint64)[0]) == STOP:
                finished.set()
                return
            ep.recv_now(buffers[index], FRAME, lambda error: landed(index, error))

        for index in range(args.window):
            ep.recv_now(buffers[index], FRAME, lambda error, index=index: landed(index, error))
        await finished.wait()
        await asyncio.sleep(0.2)  # (the last acknowledgement leaves)

    async def start() -> int:
        engine.claim_prefix(RECEIVER_PREFIX)
        listener = engine.listen(0, serve)
        _receive.listener = listener  # type: ignore[attr-defined]
        return listener.port

    port = _ucx.run(engine.loop, start(), 10)
    _emit(f"PORT {port}")
    _ucx.run(engine.loop, finished.wait(), 600)
    time.sleep(0.3)


def _send(args: argparse.Namespace) -> None:
    import numpy as np

    from eglcuda.remote import _ucx

    engine = _ucx.engine()
    data = np.random.default_rng(1).integers(0, 255, args.size, dtype=np.uint8)
    data[:8] = 0
    stop = data.copy()
    stop.view(np.uint64)[0] = STOP

    async def main() -> dict:
        engine.claim_prefix(SENDER_PREFIX)
        ep = engine.connect("127.0.0.1", args.port)
        ep.use_tags(SENDER_PREFIX, RECEIVER_PREFIX)
        frame = engine.arr(data)
        acks = [engine.arr(np.zeros(1, np.uint64)) for _ in range(args.window)]
        await ep.send(np.zeros(8, np.uint8), FRAME)  # (connected: the first message went)
        await ep.recv(np.zeros(1, np.uint64), ACK)
        cpu, wall = _cpu_s(), time.monotonic()
        await asyncio.sleep(args.idle)
        idle = 100 * (_cpu_s() - cpu) / (time.monotonic() - wall)
        over = asyncio.get_running_loop().create_future()
        inflight: collections.deque[tuple[int, bool]] = collections.deque()
        times: list[int] = []
        state = {"total": 0, "count": 0, "started": 0, "deadline": 0.0, "cpu": 0.0}

        def sent(error: Any) -> None:
            if error is not None and not over.done():
                over.set_exception(error)

        def post() -> None:
            total = state["total"]
            if total == WARMUP:
                state.update(started=time.monotonic_ns(), deadline=time.monotonic() + args.duration, cpu=_cpu_s())
            inflight.append((time.monotonic_ns(), total >= WARMUP))
            ep.send_now(frame, FRAME, sent)
            ep.recv_now(acks[total % args.window], ACK, acked)
            state["total"] = total + 1

        def acked(error: Any) -> None:
            if error is not None:
                if not over.done():
                    over.set_exception(error)
                return
            sent_at, timed = inflight.popleft()
            if timed:
                times.append(time.monotonic_ns() - sent_at)
                state["count"] += 1
            if state["total"] <= WARMUP or time.monotonic() < state["deadline"]:
                post()
            elif not inflight and not over.done():
                over.set_result(None)

        for _ in range(args.window):
            post()
        await over
        span = (time.monotonic_ns() - state["started"]) / 1e9
        cpu_us = (_cpu_s() - state["cpu"]) * 1e6 / max(1, state["count"])
        await ep.send(stop, FRAME)
        await ep.recv(np.zeros(1, np.uint64), ACK)
        times.sort()
        return {"frames": state["count"], "rate": state["count"] / span, "p50_us": times[len(times) // 2] / 1e3,
                "p99_us": times[int(0.99 * (len(times) - 1))] / 1e3, "sender_cpu_us": cpu_us, "idle_pct": idle}

    result = _ucx.run(engine.loop, main(), args.duration + args.idle + 60)
    _emit("RESULT " + json.dumps(result))


def _engine_measure(size: int, window: int, mode: str, duration: float, idle: float) -> dict:
    mode, _, package = mode.partition("@")  # MODE@DIR: the eglcuda package found in DIR first (another version)
    env = {**os.environ, "EGLCUDA_UCX_PROGRESS": mode}
    if package:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.abspath(package), env.get("PYTHONPATH", "")]))
    here = os.path.abspath(__file__)
    common = ["--size", str(size), "--window", str(window)]
    receiver = subprocess.Popen([sys.executable, here, "receive", *common], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
    try:
        line = ""
        while receiver.stdout is not None and not line.startswith("PORT "):
            line = receiver.stdout.readline()
            if not line:
                raise RuntimeError(f"receiver: {receiver.stderr.read()[-800:] if receiver.stderr else ''}")
        sent = subprocess.run([sys.executable, here, "send", "--port", line.split()[1], "--duration", str(duration),
                               "--idle", str(idle), *common], capture_output=True, text=True, env=env,
                              timeout=duration + idle + 90)
        results = [line[7:] for line in sent.stdout.splitlines() if line.startswith("RESULT ")]
        if not results:
            raise RuntimeError(f"sender: {sent.stderr[-800:]}")
        receiver.wait(timeout=30)
        return dict(json.loads(results[0]))
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", nargs="?", choices=("receive", "send"))
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--size", type=int, default=320 * 240 * 3 // 2)
    parser.add_argument("--window", type=int, default=3)
    parser.add_argument("--windows", default="1,3")
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--idle", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="thread,loop",
                        help="eglcuda engine progress modes (EGLCUDA_UCX_PROGRESS); MODE@DIR: with the eglcuda package "
                             "of DIR (e.g. a copy of an older version, to compare in one run)")
    parser.add_argument("--raw-modes", default="blocking",
                        help="bench/_ucx_raw.py modes (its thread mode polls: UCXX 0.52's request.wait() is a coroutine "
                             "it never awaits)")
    args = parser.parse_args()
    if args.role == "receive":
        _receive(args)
        return 0
    if args.role == "send":
        _send(args)
        return 0
    _needs.needs_module(__file__, "numpy", "pip install numpy")
    _needs.needs_module(__file__, "ucxx", _needs.UCXX_HOW)
    import _ucx_raw

    windows = [int(w) for w in args.windows.split(",")]
    rows: dict[tuple[str, int], list[dict]] = collections.defaultdict(list)
    for round_ in range(1, args.rounds + 1):
        for window in windows:
            configs = [(f"raw {m}", m) for m in args.raw_modes.split(",") if m]
            configs += [(f"engine {m}", m) for m in args.modes.split(",") if m]
            for name, mode in configs:
                try:
                    if name.startswith("raw"):
                        result = _ucx_raw.measure(args.size, window, mode, args.duration)
                    else:
                        result = _engine_measure(args.size, window, mode, args.duration, args.idle)
                except Exception as exc:  # noqa: BLE001 - said in the row
                    result = {"error": " ".join(str(exc).split())[-300:]}
                rows[(name, window)].append(result)
                base = rows[("raw blocking", window)][-1] if ("raw blocking", window) in rows else {}
                ratio = result.get("rate", float("nan")) / base.get("rate", float("nan"))
                if "rate" not in result:
                    _emit(f"round {round_} w{window} {name:16} {result['error']}")
                    continue
                line = (f"round {round_} w{window} {name:16} {result['rate']:9.0f}/s p50 {result['p50_us']:7.0f} us "
                        f"p99 {result['p99_us']:7.0f} us x{ratio:.2f} raw")
                if "idle_pct" in result:
                    line += f"  sender {result['sender_cpu_us']:.0f} us/frame, idle {result['idle_pct']:.1f} %"
                _emit(line)
    _emit("medians (ratio: median of each round's ratio to raw blocking, same window)")
    for (name, window), results in rows.items():
        good = [(r, b) for r, b in zip(results, rows[("raw blocking", window)]) if "rate" in r and "rate" in b]
        if not good:
            continue
        ratio = statistics.median(r["rate"] / b["rate"] for r, b in good)
        line = (f"w{window} {name:16} {statistics.median(r['rate'] for r, _ in good):9.0f}/s "
                f"p50 {statistics.median(r['p50_us'] for r, _ in good):7.0f} us x{ratio:.2f}")
        if "idle_pct" in good[0][0]:
            line += f"  idle {statistics.median(r['idle_pct'] for r, _ in good):.1f} % of a core"
        _emit(line)
    return 1 if _needs.every_row_failed(r for results in rows.values() for r in results) else 0  # nothing measured


if __name__ == "__main__":
    sys.exit(main())
