"""Helpers for the GPU stream tests: a connected stream, random frames, checks."""
from __future__ import annotations

import contextlib

import numpy as np

import eglcuda


@contextlib.contextmanager
def connected(display, width, height, *, fifo_length=0, reuse_last_frame=True, **producer_options):
    stream = display.create_stream(fifo_length=fifo_length, reuse_last_frame=reuse_last_frame)
    consumer = stream.connect_cuda_consumer()
    producer = stream.connect_cuda_producer(width, height, **producer_options)
    try:
        yield stream, producer, consumer
    finally:
        stream.close()


def fill_random(frame: eglcuda.Frame, rng: np.random.Generator) -> list[np.ndarray]:
    data = [rng.integers(0, 256, plane.shape, dtype=np.uint8) for plane in frame.planes]
    for plane, values in zip(frame.planes, data):
        plane.copy_from(values)
    return data


def assert_frame_equals(acquired, expected: list[np.ndarray]) -> None:
    got = acquired.to_numpy()
    assert len(got) == len(expected)
    for index, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == e.shape, (index, g.shape, e.shape)
        mismatches = int(np.count_nonzero(g != e))
        assert mismatches == 0, f"plane {index}: {mismatches} of {g.size} bytes differ"


def produce_payloads(producer, pool, payloads, errors: list, fused: bool = False) -> None:
    """Producer-thread body: copy each payload into a free frame of ``pool`` and present it,
    taking frames back as they come (``fused``: with present_and_return). Errors go to ``errors``."""
    try:
        free = list(pool)
        for payload in payloads:
            while not free:
                back = producer.return_frame(timeout_us=100_000)
                if back is not None:
                    free.append(back)
            frame = free.pop()
            frame.planes[0].copy_from(payload)
            if fused:
                back = producer.present_and_return(frame)
                if back is not None:
                    free.append(back)
            else:
                producer.present(frame)
    except Exception as exc:  # pragma: no cover - the test reports it
        errors.append(exc)
