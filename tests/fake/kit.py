"""Helpers of the fake-driver tests (used in the child interpreters)."""
from __future__ import annotations

import contextlib
from typing import Iterator

import eglcuda

from ..gpu.streamkit import (assert_frame_equals, check_tagged, connected, fill_random, pattern,  # noqa: F401
                             produce_payloads, rng, tag_of)


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
