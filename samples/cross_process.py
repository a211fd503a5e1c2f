"""CUDA -> CUDA over an EGLStream between two processes (section 4.1 of NVIDIA's guide, across
processes): the consumer process creates the stream, connects and serves it on a UNIX socket;
the producer process receives it and connects. Both are fresh interpreters started by this script
(spawned, never forked: CUDA does not survive fork).

The producer's kernel fills each frame with content derived from its frame number; the
consumer's kernel checks every byte of every frame (FIFO: none may be skipped). Prints
PASS/FAIL, frames/s and present-to-acquire latency (both processes stamp CLOCK_MONOTONIC).

    python samples/cross_process.py [--width 1920 --height 1080 --frames 600 --fifo 4 --format ARGB]

Kernels come from samples/cuda_to_cuda.py (CuPy, see there why).
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

import cupy as cp
import numpy as np

import eglcuda
from eglcuda import ColorFormat, Layout
from cuda_to_cuda import Kernels, seed_of


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def produce(args) -> dict:
    kernels = Kernels()
    with eglcuda.Display.for_cuda_device(args.device) as display:
        stream = eglcuda.receive_stream(display, args.socket, timeout=60)
        producer = stream.connect_cuda_producer(args.width, args.height, format=ColorFormat[args.format],
                                                layout=Layout.PITCH)
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
    return {"role": "producer", "presented": presented}


def consume(args) -> dict:
    kernels = Kernels()
    with eglcuda.Display.for_cuda_device(args.device) as display:
        stream = display.create_stream(fifo_length=args.fifo, cross_process=True)
        consumer = stream.connect_cuda_consumer()
        print(json.dumps({"role": "consumer", "event": "serving"}), flush=True)
        eglcuda.serve_stream(stream, args.socket, timeout=60)
        check_stream = cp.cuda.ExternalStream(consumer.cuda_stream)
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
            "fps": (len(numbers) - 1) / elapsed if elapsed > 0 else float("nan")}


def spawn(role: str, args, socket_path: str) -> subprocess.Popen:
    command = [sys.executable, os.path.abspath(__file__), "--role", role, "--socket", socket_path,
               "--width", str(args.width), "--height", str(args.height), "--frames", str(args.frames),
               "--fifo", str(args.fifo), "--format", args.format, "--device", str(args.device)]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def last_json(text: str) -> dict:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return {}


def orchestrate(args) -> int:
    with tempfile.TemporaryDirectory(prefix="eglcuda-sample-") as folder:
        socket_path = os.path.join(folder, "stream.sock")
        consumer = spawn("consumer", args, socket_path)
        producer = spawn("producer", args, socket_path)
        try:
            consumer_out, _ = consumer.communicate(timeout=600)
            producer_out, _ = producer.communicate("done\n", timeout=60)
        finally:
            for process in (consumer, producer):
                if process.poll() is None:
                    process.kill()
    got, sent = last_json(consumer_out), last_json(producer_out)
    numbers = got.get("numbers", [])
    ok = (consumer.returncode == 0 and producer.returncode == 0 and got.get("bad_bytes") == 0
          and numbers == list(range(1, args.frames + 1)))
    presented = {int(k): v for k, v in sent.get("presented", {}).items()}
    latencies = sorted(1e3 * (t - presented[int(n)]) for n, t in got.get("acquired", {}).items() if int(n) in presented)
    median = statistics.median(latencies) if latencies else float("nan")
    p99 = latencies[int(0.99 * (len(latencies) - 1))] if latencies else float("nan")
    print(f"{'PASS' if ok else 'FAIL'}  {args.width}x{args.height} {args.format} FIFO {args.fifo}, two processes: "
          f"frames checked {len(numbers)}/{args.frames}  bad bytes {got.get('bad_bytes')}  "
          f"{got.get('fps', float('nan')):.1f} frames/s  latency median {median:.3f} ms p99 {p99:.3f} ms")
    if not ok:
        print(f"consumer exit {consumer.returncode}, producer exit {producer.returncode}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--frames", type=int, default=600)
    parser.add_argument("--fifo", type=int, default=4, help="FIFO length (at least 1: every frame is checked)")
    parser.add_argument("--format", default="ARGB", help="a ColorFormat name")
    parser.add_argument("--device", type=int, default=0, help="CUDA device ordinal")
    parser.add_argument("--role", choices=["producer", "consumer"], help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.fifo < 1:
        parser.error("--fifo must be at least 1: in mailbox mode frames may be skipped")
    if args.role is None:
        return orchestrate(args)
    result = (produce if args.role == "producer" else consume)(args)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
