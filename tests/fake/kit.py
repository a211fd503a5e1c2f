"""Helpers of the fake-driver tests (used in the child interpreters)."""
from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np

import eglcuda

from ..gpu.streamkit import assert_frame_equals, connected, fill_random, produce_payloads  # noqa: F401


@contextlib.contextmanager
def display(ordinal: int = 0) -> Iterator[eglcuda.Display]:
    with eglcuda.Display.for_cuda_device(ordinal) as opened:
        yield opened


@contextlib.contextmanager
def stream_of(width: int, height: int, **options) -> Iterator[tuple]:
    """(display, stream, producer, consumer) on a fresh display of CUDA device 0; ``options`` go
    to :func:`connected` (fifo_length, reuse_last_frame, format, layout)."""
    with display() as opened, connected(opened, width, height, **options) as (stream, producer, consumer):
        yield opened, stream, producer, consumer


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
