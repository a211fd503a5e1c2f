"""CUDA -> CUDA over an EGLStream between two processes (section 4.1 of NVIDIA's guide, across
processes): the consumer process creates the stream, connects and serves it on a UNIX socket;
the producer process receives it and connects. Both are fresh interpreters started by this script
(spawned, never forked: CUDA does not survive fork).

The producer's kernel fills each frame with content derived from its frame number; the
consumer's kernel checks every byte of every frame (FIFO: none may be skipped). Prints
PASS/FAIL, frames/s and present-to-acquire latency (both processes stamp CLOCK_MONOTONIC).

    python samples/cross_process.py [--width 1920 --height 1080 --frames 600 --fifo 4 --format ARGB] [--mps]

With --mps both processes run under CUDA MPS (a private daemon for the run, or the one already
running); each reports whether its CUDA context is an MPS client.

Needs an NVIDIA GPU with EGL streams between processes, and CuPy (``pip install -e '.[samples-cuda13]'`` or
``samples-cuda12``); the kernels come from samples/cuda_to_cuda.py. A process that fails says why
in one line, which this script prints.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _sample import CUPY, FRAME, at_least, cupy_stream, frame_size, lazy, mps_session, names, one_line, run  # noqa: E402
from cuda_to_cuda import Kernels, seed_of  # noqa: E402

PROGRAM = "samples/cross_process.py"
cp = lazy("cupy")
np = lazy("numpy")
eglcuda = lazy("eglcuda")


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def produce(args) -> dict:
    cp.cuda.Device(args.producer_device).use()  # CuPy's kernels and stream on the producer's GPU
    kernels = Kernels()
    with eglcuda.Display.for_cuda_device(args.producer_device) as display:
        stream = eglcuda.receive_stream(display, args.socket, timeout=60)
        producer = stream.connect_cuda_producer(args.width, args.height, format=eglcuda.ColorFormat[args.format],
                                                layout=eglcuda.Layout.PITCH, device=args.producer_device)
        free = [producer.allocate_frame() for _ in range(max(stream.fifo_length, 1) + 2)]
        work = cp.cuda.Stream(non_blocking=True)
        presented: dict[int, float] = {}
        with work:
            for _ in range(args.frames):
                while not free:
                    back = producer.return_frame(timeout_us=2_000_000)
                    if back is not None:
                        free.append(back)
                frame = free.pop()
                number = producer.frames_presented + 1
                for i, plane in enumerate(frame.planes):
                    g = plane.geometry
                    grid, block = kernels.grid(g.row_bytes, g.height)
                    kernels.fill(grid, block, (cp.uint64(plane.pointer), cp.uint64(g.pitch), np.uint32(g.row_bytes),
                                               np.uint32(g.height), np.uint32(i), np.uint32(seed_of(number))))
                presented[number] = now()
                producer.present(frame, cuda_stream=work)
        sys.stdin.readline()  # the consumer has checked every frame: now the stream may go
        stream.close()
    return {"role": "producer", "presented": presented, "mps": eglcuda.mps.under_mps(args.producer_device)[0]}


def consume(args) -> dict:
    cp.cuda.Device(args.consumer_device).use()
    kernels = Kernels()
    with eglcuda.Display.for_cuda_device(args.consumer_device) as display:
        stream = display.create_stream(fifo_length=args.fifo, cross_process=True)
        consumer = stream.connect_cuda_consumer()
        print(json.dumps({"role": "consumer", "event": "serving"}), flush=True)
        eglcuda.serve_stream(stream, args.socket, timeout=60)
        check_stream = cupy_stream(cp, consumer.cuda_stream)
        bad = cp.zeros(1, cp.uint64)
        acquired_at: dict[int, float] = {}
        numbers = []
        started = None
        while len(numbers) < args.frames:
            with consumer.acquire(timeout_us=5_000_000) as frame:
                acquired_at[frame.number] = now()
                started = started or acquired_at[frame.number]
                if not frame.is_new:
                    continue
                numbers.append(frame.number)
                with check_stream:
                    for i, plane in enumerate(frame.planes):
                        g = plane.geometry
                        grid, block = kernels.grid(g.row_bytes, g.height)
                        kernels.check(grid, block, (cp.uint64(plane.pointer), cp.uint64(g.pitch), np.uint32(g.row_bytes),
                                                    np.uint32(g.height), np.uint32(i), np.uint32(seed_of(frame.number)),
                                                    bad))
        check_stream.synchronize()
        elapsed = now() - started
        stream.close()
    return {"role": "consumer", "acquired": acquired_at, "numbers": numbers, "bad_bytes": int(bad.get()[0]),
            "fps": (len(numbers) - 1) / elapsed if elapsed > 0 else float("nan"),
            "mps": eglcuda.mps.under_mps(args.consumer_device)[0]}


def spawn(role: str, args, socket_path: str) -> subprocess.Popen:
    command = [sys.executable, os.path.abspath(__file__), "--role", role, "--socket", socket_path,
               "--width", str(args.width), "--height", str(args.height), "--frames", str(args.frames),
               "--fifo", str(args.fifo), "--format", args.format, "--producer-device", str(args.producer_device),
               "--consumer-device", str(args.consumer_device)]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def last_json(text: str) -> dict:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                continue
    return {}


def failure_of(role: str, process: subprocess.Popen, out: str, err: str) -> str | None:
    """One line saying why a process failed (its own report, else its last line on stderr)."""
    if process.returncode == 0:
        return None
    reported = last_json(out).get("error")
    if reported:
        return f"the {role} process failed: {reported}"
    lines = [line.strip() for line in (err or "").splitlines() if line.strip()]
    return f"the {role} process exited with {process.returncode}" + (f": {lines[-1]}" if lines else "")


def orchestrate(args) -> int:
    with tempfile.TemporaryDirectory(prefix="eglcuda-sample-") as folder:
        socket_path = os.path.join(folder, "stream.sock")
        consumer = spawn("consumer", args, socket_path)
        producer = spawn("producer", args, socket_path)
        consumer_out = consumer_err = producer_out = producer_err = ""
        try:
            consumer_out, consumer_err = consumer.communicate(timeout=600)
            producer_out, producer_err = producer.communicate("done\n", timeout=60)
        except subprocess.TimeoutExpired:
            pass  # reported below with the exit codes
        finally:
            for process in (consumer, producer):
                if process.poll() is None:
                    process.kill()
                    process.wait()
    got, sent = last_json(consumer_out), last_json(producer_out)
    numbers = got.get("numbers", [])
    ok = (consumer.returncode == 0 and producer.returncode == 0 and got.get("bad_bytes") == 0
          and numbers == list(range(1, args.frames + 1)))
    presented = {int(k): v for k, v in sent.get("presented", {}).items()}
    latencies = sorted(1e3 * (t - presented[int(n)]) for n, t in got.get("acquired", {}).items() if int(n) in presented)
    median = statistics.median(latencies) if latencies else float("nan")
    p99 = latencies[int(0.99 * (len(latencies) - 1))] if latencies else float("nan")
    gpus = (f"GPU {args.producer_device} -> GPU {args.consumer_device}" if args.producer_device != args.consumer_device
            else f"GPU {args.producer_device}")
    under = {sent.get("mps"), got.get("mps")}
    gpus += (", under MPS" if under == {True} else ", no MPS" if under == {False}
             else f", MPS producer {sent.get('mps')} consumer {got.get('mps')}")
    if args.mps and False in under:
        ok = False  # asked for MPS and the driver says a process is not a client: the numbers would mislead
    print(f"{'PASS' if ok else 'FAIL'}  {args.width}x{args.height} {args.format} FIFO {args.fifo}, two processes, {gpus}: "
          f"frames checked {len(numbers)}/{args.frames}  bad bytes {got.get('bad_bytes')}  "
          f"{got.get('fps', float('nan')):.1f} frames/s  latency median {median:.3f} ms p99 {p99:.3f} ms")
    for why in (failure_of("consumer", consumer, consumer_out, consumer_err),
                failure_of("producer", producer, producer_out, producer_err)):
        if why:
            print(why)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--frames", type=int, default=600)
    parser.add_argument("--fifo", type=int, default=4, help="FIFO length (at least 1: every frame is checked)")
    parser.add_argument("--format", default="ARGB", help="a ColorFormat name")
    parser.add_argument("--device", type=int, default=0, help="CUDA device ordinal of both processes")
    parser.add_argument("--producer-device", type=int, default=None, help="the producer's CUDA device (default --device)")
    parser.add_argument("--consumer-device", type=int, default=None, help="the consumer's CUDA device (default --device)")
    parser.add_argument("--mps", action="store_true",
                        help="run both processes under CUDA MPS: a private daemon for this run (or the one already "
                             "running)")
    parser.add_argument("--role", choices=["producer", "consumer"], help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    at_least(parser, args, {**FRAME, "--frames": 1, "--device": 0, "--producer-device": 0, "--consumer-device": 0})
    args.producer_device = args.device if args.producer_device is None else args.producer_device
    args.consumer_device = args.device if args.consumer_device is None else args.consumer_device
    if args.fifo < 1:
        parser.error("--fifo must be at least 1: in mailbox mode frames may be skipped")
    frame_size(parser, args, names(parser, "--format", args.format, "ColorFormat"))
    args.format = args.format.upper()
    if args.role is None:
        # The two processes inherit the environment; they need nothing more than this checks.
        with mps_session(PROGRAM, args.mps, "cross-process", modules=[CUPY], children_only=True):
            return orchestrate(args)
    try:
        result = (produce if args.role == "producer" else consume)(args)
    except Exception as exc:  # one line to the parent, which prints it
        print(json.dumps({"role": args.role, "error": one_line(exc)}), flush=True)
        return 1
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
