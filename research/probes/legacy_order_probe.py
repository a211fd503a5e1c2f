# Research record (see research/README.md): open, not yet run to the end (its first run, 2026-11-28, stopped at a producer connect; see README).
"""Probe: in ONE process, does a present that names the legacy default stream wait for that
stream's writes? (Between processes without MPS it does not, driver 580: docs/streams.md.)

A producer and a consumer in this process, one thread, FIFO 4, 1920x1080 ARGB, a ring of 6
frames. Per frame the producer queues eight fills of plane 0 on the legacy default stream (the
last one with the frame's number) and calls ``present(frame)`` at once; the consumer acquires and
reads eight words of the frame on its own stream right away. Two kinds of stream: one of this
process alone (eglcuda passes the legacy stream to the driver as it is) and one made with
``cross_process=True`` whose producer connects to a second handle opened from its descriptor, as
a producer on another GPU does (eglcuda synchronizes the legacy stream first). Serial, and with a
producer thread. Each variant prints one line; a variant that fails prints its error.

    python3 research/probes/legacy_order_probe.py [--frames 2000]
"""
from __future__ import annotations

import argparse
import os
import sys
import threading

import numpy as np

import eglcuda

import _needs  # research/probes/_needs.py: a missing need is one line and status 2


def driver():
    try:
        from cuda.bindings import driver as cu
    except ImportError:
        from cuda import cuda as cu  # type: ignore[no-redef]
    return cu


def run(display, frames: int, shared: bool, threaded: bool) -> dict:
    cu = driver()
    legacy = cu.CUstream(0)
    rng = np.random.default_rng()
    wrong = []
    with display.create_stream(fifo_length=4, cross_process=shared) as stream:
        consumer = stream.connect_cuda_consumer(frame_numbers=True)
        opened = stream
        if shared:
            fd = stream.export_fd()
            opened = eglcuda.Stream.from_fd(display, fd)
            os.close(fd)
        producer = opened.connect_cuda_producer(1920, 1080)
        ring = [producer.allocate_frame() for _ in range(6)]
        size = ring[0].planes[0].pitch * 1080

        def produce():
            free = list(ring)
            for number in range(1, frames + 1):
                while not free:
                    back = producer.return_frame(2_000_000)
                    if back is not None:
                        free.append(back)
                frame = free.pop()
                pointer = frame.planes[0].pointer
                for index in range(8):
                    cu.cuMemsetD32Async(pointer, number if index == 7 else 0xDEAD0000 | index, size // 4, legacy)
                producer.present(frame)

        words = np.zeros(8, np.uint32)
        thread = threading.Thread(target=produce) if threaded else None
        if thread:
            thread.start()
        for number in range(1, frames + 1):
            if not thread:  # serial: present one, then take it
                free_frame = ring[(number - 1) % 6]
                if number > 6:
                    assert producer.return_frame(2_000_000) is not None
                pointer = free_frame.planes[0].pointer
                for index in range(8):
                    cu.cuMemsetD32Async(pointer, number if index == 7 else 0xDEAD0000 | index, size // 4, legacy)
                producer.present(free_frame)
            with consumer.acquire(timeout_us=5_000_000) as acquired:
                plane = acquired.planes[0]
                stream_handle = cu.CUstream(acquired.cuda_stream)
                for index, offset in enumerate([0, size - 4] + [int(o) * 4 for o in rng.integers(0, size // 4, 6)]):
                    cu.cuMemcpyDtoHAsync(words.ctypes.data + 4 * index, plane.pointer + offset, 4, stream_handle)
                cu.cuStreamSynchronize(stream_handle)
                if np.any(words != acquired.number):
                    wrong.append(acquired.number)
        if thread:
            thread.join()
        if opened is not stream:
            opened.close()
    return {"shared": shared, "threaded": threaded, "frames": frames, "wrong": len(wrong), "first": wrong[:5]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=2000)
    args = parser.parse_args()
    _needs.needs_cuda(__file__, "cuda", "cuda-stream")
    _needs.needs_module(__file__, ("cuda.bindings.driver", "cuda.cuda"), _needs.CUDA_PYTHON_HOW)
    rows = []
    with eglcuda.Display.for_cuda_device(0) as display:
        for threaded in (False, True):
            for shared in (False, True):
                try:
                    rows.append(run(display, args.frames, shared, threaded))
                except eglcuda.EglCudaError as exc:
                    rows.append({"shared": shared, "threaded": threaded, "error": str(exc)})
                print(rows[-1], flush=True)
    return 1 if _needs.every_row_failed(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
