"""Helpers for the stream tests of the GPU and fake-driver tiers: a connected stream, random and
tagged frames, checks."""
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


def rng() -> np.random.Generator:
    """Random data that differs per run (the seed is printed when a test fails)."""
    seed = int(np.random.SeedSequence().entropy % (2**32))
    print(f"random seed {seed}")
    return np.random.default_rng(seed)


def pattern(frame_or_shape, tag: int) -> list[np.ndarray]:
    """Deterministic bytes derived from ``tag`` for every plane: a consumer can check a frame
    against the tag it carries in its first 4 bytes without any shared state."""
    shapes = [p.shape for p in frame_or_shape.planes] if hasattr(frame_or_shape, "planes") else frame_or_shape
    out = []
    for index, shape in enumerate(shapes):
        values = np.random.default_rng(tag * 7 + index).integers(0, 256, shape, dtype=np.uint8)
        if index == 0:
            values.reshape(-1)[:4] = np.frombuffer(int(tag).to_bytes(4, "little"), np.uint8)
        out.append(values)
    return out


def tag_of(planes: list[np.ndarray]) -> int:
    return int.from_bytes(planes[0].reshape(-1)[:4].tobytes(), "little")


def check_tagged(acquired) -> int:
    """The tag a frame carries, after checking every byte against it."""
    got = acquired.to_numpy()
    tag = tag_of(got)
    for index, (g, e) in enumerate(zip(got, pattern([p.shape for p in got], tag))):
        assert np.array_equal(g, e), f"frame tagged {tag}: plane {index} corrupted"
    return tag
