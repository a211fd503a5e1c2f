"""A short eglcuda round trip against the fake driver, for running under valgrind or
AddressSanitizer (see run_under_valgrind.sh): every per-frame call, pitch and array frames, ARGB
and NV12, mailbox and FIFO, a producer thread, an injected fault, a descriptor, and every byte
checked. Exits non-zero on any failure; prints "roundtrip ok" at the end.

Needs EGLCUDA_LIBEGL and EGLCUDA_LIBCUDA pointing at the fake (tests/fakes/build.py)."""
from __future__ import annotations

import ctypes
import os
import sys
import threading

import numpy as np

import eglcuda
from eglcuda import ColorFormat, Layout

ROUNDS = int(os.environ.get("ROUNDTRIP_ROUNDS", "12"))


def fill(frame, rng):
    data = [rng.integers(0, 256, plane.shape, dtype=np.uint8) for plane in frame.planes]
    for plane, values in zip(frame.planes, data):
        plane.copy_from(values)
    return data


def same(acquired, expected):
    for got, want in zip(acquired.to_numpy(), expected):
        assert np.array_equal(got, want), "bytes differ"


def ring_loop(display, rng, fmt, layout, fifo_length):
    with display.create_stream(fifo_length=fifo_length) as stream:
        consumer = stream.connect_cuda_consumer()
        producer = stream.connect_cuda_producer(34, 18, format=fmt, layout=layout)
        ring = [producer.allocate_frame() for _ in range(3)]
        free = list(ring)
        acquired = None
        for round_ in range(ROUNDS):
            frame = free.pop(0)
            expected = fill(frame, rng)
            if round_ % 2:
                back = producer.present_and_return(frame, timeout_us=0 if round_ < 2 else 1_000_000)
            else:
                producer.present(frame)
                back = producer.return_frame(0 if round_ < 2 else 1_000_000)
            if back is not None:
                free.append(back)
            if round_ % 3:
                acquired = consumer.acquire_next(1_000_000)
            else:
                if acquired is not None and not acquired.released:
                    acquired.release()
                acquired = consumer.acquire(1_000_000)
            assert acquired.is_new
            same(acquired, expected)
        acquired.release()
    for frame in ring:
        frame.close()


def threaded(display, rng):
    payloads = [rng.integers(0, 256, (8, 24, 4), dtype=np.uint8) for _ in range(30)]
    received, errors = [], []
    with display.create_stream(fifo_length=2) as stream:
        consumer = stream.connect_cuda_consumer()
        producer = stream.connect_cuda_producer(24, 8)
        pool = [producer.allocate_frame() for _ in range(3)]

        def produce():
            try:
                free = list(pool)
                for payload in payloads:
                    while not free:
                        back = producer.return_frame(100_000)
                        if back is not None:
                            free.append(back)
                    frame = free.pop()
                    frame.planes[0].copy_from(payload)
                    producer.present(frame)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=produce)
        thread.start()
        while len(received) < len(payloads):
            with consumer.acquire(2_000_000) as acquired:
                if acquired.is_new:
                    received.append(acquired.planes[0].to_numpy())
        thread.join()
    assert not errors, errors
    assert all(np.array_equal(g, w) for g, w in zip(received, payloads)), "threaded frames differ"


def faults(display, rng):
    fake = ctypes.CDLL(os.environ["EGLCUDA_LIBEGL"])
    fake.fake_fail.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
    with display.create_stream() as stream:
        consumer = stream.connect_cuda_consumer()
        producer = stream.connect_cuda_producer(16, 8)
        frame = producer.allocate_frame()
        fake.fake_fail(b"cuEGLStreamProducerPresentFrame", 1, 999)
        try:
            producer.present(frame)
            raise AssertionError("the injected fault did not fail the present")
        except eglcuda.CUDAError as exc:
            assert exc.code == 999 and exc.call == "cuEGLStreamProducerPresentFrame"
        expected = fill(frame, rng)
        producer.present(frame)
        with consumer.acquire() as acquired:
            same(acquired, expected)
        consumer.acquire(timeout_us=1000).release()
    frame.close()


def descriptor(display):
    with display.create_stream(cross_process=True) as stream:
        fd = stream.export_fd()
        with eglcuda.Stream.from_fd(display, fd) as imported:
            assert imported.state is eglcuda.StreamState.CREATED
        os.close(fd)


def main() -> int:
    rng = np.random.default_rng(int(os.environ.get("ROUNDTRIP_SEED", "1234")))
    with eglcuda.Display.for_cuda_device(0) as display:
        for fmt, layout, fifo_length in ((ColorFormat.ARGB, Layout.PITCH, 0), (ColorFormat.NV12, Layout.PITCH, 2),
                                         (ColorFormat.ARGB, Layout.ARRAY, 2), (ColorFormat.NV12, Layout.ARRAY, 0),
                                         (ColorFormat.YUV420_PLANAR, Layout.PITCH, 1)):
            ring_loop(display, rng, fmt, layout, fifo_length)
        threaded(display, rng)
        faults(display, rng)
        descriptor(display)
    cuda = ctypes.CDLL(os.environ["EGLCUDA_LIBCUDA"])
    egl = ctypes.CDLL(os.environ["EGLCUDA_LIBEGL"])
    egl.fake_misuse_first.restype = ctypes.c_char_p
    live, misuse = cuda.fake_live_allocations(), egl.fake_misuse_count()
    assert live == 0, f"{live} allocations left"
    assert misuse == 0, f"driver misuse: {egl.fake_misuse_first()!r}"
    print("roundtrip ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
