"""The other process of the cross-process stream tests, started as a fresh interpreter.

    python tests/gpu/stream_peer.py producer --socket PATH [--frames N] ...
    python tests/gpu/stream_peer.py consumer --socket PATH [--fifo N]
    python tests/gpu/stream_peer.py cycles --socket PATH --count N

Frame content is a function of (seed, frame number), so each side can check the other's frames
without sending data. Progress goes to stdout one JSON object per line, flushed.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time

import numpy as np

import eglcuda
from eglcuda import ColorFormat


def frame_content(frame, seed: int, number: int) -> list[np.ndarray]:
    """The random planes of frame ``number`` (frames count from 1, as the stream does)."""
    rng = np.random.default_rng([seed, number])
    return [rng.integers(0, 256, plane.shape, dtype=np.uint8) for plane in frame.planes]


def say(**message) -> None:
    print(json.dumps(message), flush=True)


def maybe_die(args, step: str) -> None:
    """SIGKILL this process at ``step`` of the hand-over when --die-at names it (as a crash would)."""
    if args.die_at == step:
        say(event="dying", step=step)
        os.kill(os.getpid(), signal.SIGKILL)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def cuda_driver():
    """cuda-python's driver module (cuda.bindings since 12.6, ``cuda.cuda`` before)."""
    try:
        from cuda.bindings import driver
    except ImportError:
        from cuda import cuda as driver  # type: ignore[no-redef]
    return driver


def write_on_legacy_stream(driver, frame, number: int, passes: int) -> None:
    """Queue ``passes`` fills of plane 0 on the legacy default stream, the last one with ``number``
    in every 32-bit word, and return without waiting for them (what a kernel writing the frame on
    PyTorch's or CuPy's default stream does)."""
    plane = frame.planes[0]
    words = plane.pitch * frame.height // 4
    for index in range(passes):
        value = number if index == passes - 1 else 0xDEAD0000 | index
        status, = driver.cuMemsetD32Async(plane.pointer, value, words, driver.CUstream(0))
        if status != driver.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuMemsetD32Async: {status}")


def produce(args) -> int:
    with eglcuda.Display.for_cuda_device(args.device) as display:
        stream = eglcuda.receive_stream(display, args.socket, timeout=30)
        maybe_die(args, "received")
        producer = stream.connect_cuda_producer(args.width, args.height, format=ColorFormat[args.format],
                                                layout=args.layout, device=args.device)
        maybe_die(args, "connected")
        free = [producer.allocate_frame() for _ in range(stream.fifo_length + 2)]
        driver = cuda_driver() if args.write == "legacy-async" else None
        say(event="connected", fifo_length=stream.fifo_length, pid=os.getpid())
        number = 0
        while args.frames == 0 or number < args.frames:
            while not free:
                back = producer.return_frame(timeout_us=1_000_000)
                if back is not None:
                    free.append(back)
            frame = free.pop()
            number = producer.frames_presented + 1
            if driver is not None:
                write_on_legacy_stream(driver, frame, number, args.passes)
            else:
                for plane, data in zip(frame.planes, frame_content(frame, args.seed, number)):
                    plane.copy_from(data)
            producer.present(frame)  # cuda_stream None: the legacy default stream
            if driver is None:
                say(event="presented", number=number)
            maybe_die(args, "presented")
            if args.pace_ms:
                time.sleep(args.pace_ms / 1e3)
        sys.stdin.readline()  # the test says when its consumer has checked every frame
        stream.close()
    return 0


def consume(args) -> int:
    with eglcuda.Display.for_cuda_device(0) as display:
        stream = display.create_stream(fifo_length=args.fifo, cross_process=True)
        consumer = stream.connect_cuda_consumer()
        maybe_die(args, "connected")
        say(event="serving", pid=os.getpid())
        eglcuda.serve_stream(stream, args.socket, timeout=30)
        maybe_die(args, "served")
        while True:
            try:
                with consumer.acquire(timeout_us=1_000_000) as frame:
                    say(event="acquired", number=frame.number, new=frame.is_new)
            except eglcuda.Timeout:
                continue
            except eglcuda.StreamDisconnected:
                say(event="disconnected")
                break
        stream.close()
    return 0


def cycles(args) -> int:
    """Receive ``count`` streams one after the other, present one frame on each, and wait for the
    consumer to close before closing; report descriptors after the first and the last cycle."""
    fds = []
    with eglcuda.Display.for_cuda_device(0) as display:
        device = display.cuda_device()
        memory = []
        for cycle in range(args.count):
            stream = eglcuda.receive_stream(display, args.socket, timeout=30)
            producer = stream.connect_cuda_producer(args.width, args.height)
            frame = producer.allocate_frame()
            for plane, data in zip(frame.planes, frame_content(frame, args.seed, 1)):
                plane.copy_from(data)
            producer.present(frame)
            deadline = time.monotonic() + 20
            while stream.state is not eglcuda.StreamState.DISCONNECTED:
                if time.monotonic() > deadline:
                    say(event="error", message=f"cycle {cycle}: the consumer never disconnected")
                    return 1
                time.sleep(0.001)
            stream.close()
            frame.close()
            if cycle in (0, args.count - 1):
                fds.append(open_fds())
                memory.append(device.memory_info()[0])
    say(event="done", fds=fds, free_memory=memory)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["producer", "consumer", "cycles"])
    parser.add_argument("--socket", required=True)
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--format", default="ARGB")
    parser.add_argument("--frames", type=int, default=0, help="0: until killed")
    parser.add_argument("--fifo", type=int, default=4)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pace-ms", type=float, default=0.0)
    parser.add_argument("--count", type=int, default=200)
    parser.add_argument("--device", type=int, default=0, help="the producer's CUDA device")
    parser.add_argument("--layout", default="pitch", choices=["pitch", "array"])
    parser.add_argument("--write", default="copy", choices=["copy", "legacy-async"],
                        help="copy: frame_content through copy_from; legacy-async: --passes fills of "
                             "plane 0 queued on the legacy default stream, the last with the frame's number")
    parser.add_argument("--passes", type=int, default=8)
    parser.add_argument("--die-at", default=None, choices=["received", "connected", "presented", "served"],
                        help="SIGKILL this process at that step")
    args = parser.parse_args()
    return {"producer": produce, "consumer": consume, "cycles": cycles}[args.role](args)


if __name__ == "__main__":
    sys.exit(main())
