"""UCX's own floor for bench/remote.py: host buffers of a frame's size sent through UCXX, with no
eglcuda in the way. Two processes (a sender, as the relay is, and a receiver, as a remote
subscriber is) over the UCX transports the environment selects (bench/remote.py sets
``UCX_TLS=tcp`` and ``UCX_NET_DEVICES=lo``: the path a frame takes between hosts).

Flow control is the one a relay needs: the receiver owns ``window`` buffers; it posts a receive
into each, and when one completes it sends an 8-byte acknowledgement and posts the buffer again;
the sender keeps at most ``window`` frames unacknowledged. ``window=1`` is ping-pong (one frame,
then its acknowledgement). Progress modes:

- ``blocking``: ``UCXWorker.progress_worker_event`` (sleeps on the worker's epoll descriptor);
- ``polling``: ``UCXWorker.progress`` in a busy loop;
- ``thread``: UCXX's progress thread (epoll); the Python thread waits in ``request.wait()``;
- ``asyncio-blocking``, ``asyncio-polling``, ``asyncio-thread``: UCXX's asyncio API
  (``ucxx.create_listener`` / ``create_endpoint``, ``await ep.send`` / ``ep.recv``) with
  ``ucxx.init(progress_mode=...)``: the worker's descriptor in the event loop (what eglcuda's
  relay and remote subscribers used before their own engine, eglcuda/remote/_ucx.py, which is
  ``blocking``'s loop under an asyncio scheduler), a polling task, or UCXX's progress thread (its default).

    python bench/_ucx_raw.py receive --size BYTES --window W --mode M      (prints "PORT n")
    python bench/_ucx_raw.py send --port P --size BYTES --window W --mode M --duration S
                                                                           (prints "RESULT {json}")

``--gpu`` (core API modes) takes the frame's way through the GPU as the relay and a remote subscriber do,
in the same processes, with no eglcuda relay in the way: the sender copies each frame device -> a
page-locked buffer of its ring (``--buffers``, more than the window: a buffer is written again only
after its send ended) before sending it, the receiver receives into page-locked buffers and copies each
frame into device memory before acknowledging it (eglcuda's CUDA bindings: what a user writing this
with UCXX would do).

``measure(size, window, mode, duration, env)`` runs both and returns the sender's result:
frames/s, bytes/s and the per-frame send-to-acknowledgement time (p50 / p99, microseconds).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # (its siblings, under PYTHONSAFEPATH too)

PROGRAM = "bench/_ucx_raw.py"
MODES = ("blocking", "polling", "thread", "asyncio-blocking", "asyncio-polling", "asyncio-thread")
WARMUP = 20
ACK = 8


def _emit(line: str) -> None:
    print(line, flush=True)


# ==== the core API (blocking / polling / thread) =================================================

class _Core:
    """A UCXX context and worker driven in one of the core API's progress modes."""

    def __init__(self, mode: str) -> None:
        import ucxx._lib.libucxx as api

        self.api = api
        self.mode = mode
        self.context = api.UCXContext(feature_flags=(api.Feature.TAG, api.Feature.WAKEUP))
        self.worker = api.UCXWorker(self.context)
        if mode == "thread":
            self.worker.start_progress_thread(polling_mode=False, epoll_timeout=1)
        else:
            self.worker.init_blocking_progress_mode()

    def step(self) -> None:
        if self.mode == "blocking":
            self.worker.progress_worker_event()
        elif self.mode == "polling":
            self.worker.progress()
        # thread: the progress thread moves the requests

    def wait(self, request) -> None:
        if self.mode == "thread":
            request.wait()  # sleeps until the progress thread completes it
        while not request.completed:
            self.step()
        request.check_error()

    def tag(self, value: int):
        return self.api.UCXXTag(value)


class _Gpu:
    """--gpu: page-locked host buffers and one device frame on GPU 0; ``down`` copies the frame
    into a host buffer, ``up`` a host buffer into the frame, each waited for."""

    def __init__(self, size: int, count: int) -> None:
        import numpy as np
        from _remote_common import DeviceFrame
        from eglcuda.cuda_device import get_device
        from eglcuda.remote.buffers import Pinned

        self.pinned = Pinned(get_device(0), count, size, "the raw engine's page-locked buffers")
        self.frame = DeviceFrame(size, 1, "the raw engine's device frame")
        data = np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8)
        data[:8] = 0  # (the first 8 bytes say "stop" in the last message only)
        self.frame.from_host(data)

    def down(self, index: int) -> None:
        self.frame.to_host(self.pinned.arrays[index])

    def up(self, index: int) -> None:
        self.frame.from_host(self.pinned.arrays[index])


def _core_receive(args) -> None:
    import numpy as np
    from ucxx._lib.arr import Array

    core = _Core(args.mode)
    holder: dict = {}

    def accept(request) -> None:
        holder["ep"] = listener.create_endpoint_from_conn_request(request, True)

    listener = core.api.UCXListener.create(worker=core.worker, port=args.port, cb_func=accept)
    _emit(f"PORT {listener.port}")
    while "ep" not in holder:
        core.step()
        if args.mode == "thread":
            time.sleep(0.001)
    ep = holder["ep"]
    gpu = _Gpu(args.size, args.window) if args.gpu else None
    raw = gpu.pinned.arrays if gpu else [np.empty(args.size, np.uint8) for _ in range(args.window)]
    buffers = [Array(buffer) for buffer in raw]
    acks = [Array(np.zeros(1, np.uint64)) for _ in range(args.window)]
    frame_tag, ack_tag = core.tag(1), core.tag(2)
    pending = [ep.tag_recv(buffer, tag=frame_tag) for buffer in buffers]
    sends: list = [None] * args.window
    index = 0
    while True:
        core.wait(pending[index])
        if gpu is not None:
            gpu.up(index)  # (the frame is usable on the GPU before its buffer is given back)
        if sends[index] is not None:
            core.wait(sends[index])
        sends[index] = ep.tag_send(acks[index], tag=ack_tag)
        # The sender's last frame says "stop" in its first 8 bytes.
        if int(raw[index].view(np.uint64)[0]) == 2**64 - 1:
            core.wait(sends[index])
            break
        pending[index] = ep.tag_recv(buffers[index], tag=frame_tag)
        index = (index + 1) % args.window
    time.sleep(0.2)  # let the acknowledgement leave before the endpoint closes


def _core_send(args) -> None:
    import numpy as np
    from ucxx._lib.arr import Array

    core = _Core(args.mode)
    ep = core.api.UCXEndpoint.create(core.worker, args.host, args.port, True)
    rng = np.random.default_rng(1)
    gpu = _Gpu(args.size, args.buffers) if args.gpu else None
    ring = gpu.pinned.arrays if gpu else [rng.integers(0, 255, args.size, dtype=np.uint8) for _ in range(args.buffers)]
    for data in ring:
        data[:8] = 0
    stop = np.array(ring[0])
    stop.view(np.uint64)[0] = 2**64 - 1
    frames, last = [Array(data) for data in ring], Array(stop)
    acks = [Array(np.zeros(1, np.uint64)) for _ in range(args.window)]
    frame_tag, ack_tag = core.tag(1), core.tag(2)
    inflight: list = []  # (sent at, send request, ack request)
    times: list[int] = []
    count, started, deadline = 0, 0, 0.0
    total = 0
    cpu_at_start = (0.0, 0.0)
    while True:
        now = time.monotonic()
        if total == WARMUP:
            started, deadline = time.monotonic_ns(), now + args.duration
            cpu_at_start = _cpu_us()
        done = total >= WARMUP and now >= deadline
        if len(inflight) < args.window and not done:
            slot = total % args.window
            if gpu is not None:
                gpu.down(total % args.buffers)  # (its last send ended: at most window < buffers are in flight)
            inflight.append((time.monotonic_ns(), ep.tag_send(frames[total % args.buffers], tag=frame_tag),
                             ep.tag_recv(acks[slot], tag=ack_tag), total >= WARMUP))
            total += 1
            continue
        if not inflight:
            break
        sent_at, send, ack, timed = inflight.pop(0)
        core.wait(send)
        core.wait(ack)
        if timed:
            times.append(time.monotonic_ns() - sent_at)
            count += 1
    span = (time.monotonic_ns() - started) / 1e9
    cpu = [b - a for a, b in zip(cpu_at_start, _cpu_us())]  # (the timed frames: the sender's CPU for each)
    stopper = (ep.tag_send(last, tag=frame_tag), ep.tag_recv(acks[0], tag=ack_tag))
    for request in stopper:
        core.wait(request)
    _emit("RESULT " + json.dumps({**_summary(count, span, args.size, times),
                                  "sender_user_us": cpu[0] / max(1, count), "sender_sys_us": cpu[1] / max(1, count)}))


def _cpu_us() -> tuple[float, float]:
    """This process's (user, system) CPU time so far, microseconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime * 1e6, usage.ru_stime * 1e6


def _summary(count: int, span: float, size: int, times: list[int]) -> dict:
    times = sorted(times)
    pick = (lambda q: times[min(len(times) - 1, int(q * (len(times) - 1)))] / 1e3) if times else (lambda q: float("nan"))
    rate = count / span if span > 0 else float("nan")
    return {"frames": count, "rate": rate, "bytes_per_s": rate * size, "p50_us": pick(0.5), "p99_us": pick(0.99)}


# ==== the asyncio API ============================================================================

def _async_receive(args) -> None:
    import asyncio

    import numpy as np
    import ucxx

    async def main() -> None:
        ucxx.init(progress_mode=args.mode.split("-", 1)[1])
        finished = asyncio.Event()

        async def serve(ep) -> None:
            buffers = [np.empty(args.size, np.uint8) for _ in range(args.window)]
            ack = np.zeros(1, np.uint64)
            # One receive at a time per buffer, in order; acks go out as each lands.
            tasks = [asyncio.ensure_future(ep.recv(buffer)) for buffer in buffers]
            index = 0
            while True:
                await tasks[index]
                await ep.send(ack)
                if int(buffers[index].view(np.uint64)[0]) == 2**64 - 1:
                    break
                tasks[index] = asyncio.ensure_future(ep.recv(buffers[index]))
                index = (index + 1) % args.window
            await asyncio.sleep(0.2)
            finished.set()

        listener = ucxx.create_listener(serve, port=args.port or None)
        _emit(f"PORT {listener.port}")
        await finished.wait()
        listener.close()

    asyncio.run(main())


def _async_send(args) -> None:
    import asyncio
    from collections import deque

    import numpy as np
    import ucxx

    async def main() -> None:
        ucxx.init(progress_mode=args.mode.split("-", 1)[1])
        ep = await ucxx.create_endpoint(args.host, args.port)
        data = np.random.default_rng(1).integers(0, 255, args.size, dtype=np.uint8)
        data[:8] = 0
        stop = data.copy()
        stop.view(np.uint64)[0] = 2**64 - 1
        acks = [np.zeros(1, np.uint64) for _ in range(args.window)]
        inflight: deque = deque()
        times: list[int] = []
        count, total, started, deadline = 0, 0, 0, 0.0

        while True:
            now = time.monotonic()
            if total == WARMUP:
                started, deadline = time.monotonic_ns(), now + args.duration
            done = total >= WARMUP and now >= deadline
            if len(inflight) < args.window and not done:
                slot = total % args.window
                inflight.append((time.monotonic_ns(), asyncio.ensure_future(ep.send(data)),
                                 asyncio.ensure_future(ep.recv(acks[slot])), total >= WARMUP))
                total += 1
                continue
            if not inflight:
                break
            sent_at, send, ack, timed = inflight.popleft()
            await send
            await ack
            if timed:
                times.append(time.monotonic_ns() - sent_at)
                count += 1
        span = (time.monotonic_ns() - started) / 1e9
        await ep.send(stop)
        await ep.recv(acks[0])
        _emit("RESULT " + json.dumps(_summary(count, span, args.size, times)))
        await ep.close()

    asyncio.run(main())


# ==== both ends, from a parent process ===========================================================

def measure(size: int, window: int, mode: str, duration: float, env: dict[str, str] | None = None,
            timeout: float = 120.0, buffers: int = 1, gpu: bool = False) -> dict:
    """Runs a receiver and a sender (fresh processes, with ``env`` over this process's
    environment) and returns the sender's result, plus ``size``, ``window``, ``mode``,
    ``buffers`` (the sender's ring: 1 sends one buffer again and again) and ``gpu`` (--gpu)."""
    environment = {**os.environ, **(env or {})}
    here = os.path.abspath(__file__)
    common = ["--size", str(size), "--window", str(window), "--mode", mode, *(["--gpu"] if gpu else [])]
    receiver = subprocess.Popen([sys.executable, here, "receive", *common], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=environment)
    try:
        line = ""
        while receiver.stdout is not None and not line.startswith("PORT "):
            line = receiver.stdout.readline()  # UCX writes its warnings to stdout too
            if not line:
                break
        if not line.startswith("PORT "):
            raise RuntimeError(f"the raw UCX receiver did not start: {receiver.stderr.read()[-500:] if receiver.stderr else ''}")
        port = int(line.split()[1])
        sent = subprocess.run([sys.executable, here, "send", "--port", str(port), "--duration", str(duration),
                               "--buffers", str(buffers), *common],
                              capture_output=True, text=True, env=environment, timeout=timeout)
        results = [line[7:] for line in sent.stdout.splitlines() if line.startswith("RESULT ")]
        if sent.returncode != 0 or not results:
            raise RuntimeError(f"the raw UCX sender failed (status {sent.returncode}): {sent.stderr.strip()[-500:]}")
        receiver.wait(timeout=30)
        return {"size": size, "window": window, "mode": mode, "buffers": buffers, "gpu": gpu, **json.loads(results[0])}
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("role", choices=("receive", "send"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--size", type=int, required=True)
    parser.add_argument("--window", type=int, default=1)
    parser.add_argument("--mode", choices=MODES, default="blocking")
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--buffers", type=int, default=1,
                        help="the sender's ring of distinct buffers, sent in turn (core API modes)")
    parser.add_argument("--gpu", action="store_true",
                        help="each frame from GPU memory and into it, through page-locked buffers (core API modes)")
    args = parser.parse_args()
    if args.window < 1 or args.size < 8 or args.buffers < 1:
        parser.error("--window and --buffers must be >= 1 and --size >= 8")
    if args.gpu and (args.mode.startswith("asyncio") or (args.role == "send" and args.buffers <= args.window)):
        parser.error("--gpu takes a core API mode and more --buffers than --window")
    # What it needs, first (one line, status 2): UCXX, and for --gpu a GPU.
    from _script import fail, require

    if importlib.util.find_spec("ucxx") is None:
        fail(PROGRAM, "needs ucxx (RAPIDS' UCX bindings): pip install -e '.[remote-cu13]' (or remote-cu12)", 2)
    if args.gpu:
        require(PROGRAM, "cuda")
    try:
        if args.mode.startswith("asyncio"):
            (_async_receive if args.role == "receive" else _async_send)(args)
        else:
            (_core_receive if args.role == "receive" else _core_send)(args)
    except Exception as exc:  # noqa: BLE001 - a failed connection, say: one line, not a traceback
        fail(PROGRAM, f"{type(exc).__name__}: {exc}", 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
