"""One-time checks of what the stream layer can do on this machine's hardware (run by
``python -m eglcuda info``, not by the streams themselves)."""
from __future__ import annotations

import numpy as np

from ..display import Display
from ..errors import EglCudaError
from ..frames.frame import Frame


def cross_gpu_stream(producer_gpu: int, consumer_gpu: int, width: int = 64, height: int = 32) -> tuple[bool, str]:
    """Whether a frame of random bytes crosses from ``producer_gpu`` to ``consumer_gpu`` through an
    EGLStream in this process, every byte intact: (works, what was seen or why not). Never raises
    for a platform reason; takes well under a second."""
    rng = np.random.default_rng()
    try:
        with Display.for_cuda_device(consumer_gpu) as display:
            with display.create_stream(fifo_length=1, cross_process=True) as stream:
                consumer = stream.connect_cuda_consumer()
                producer = stream.connect_cuda_producer(width, height, device=producer_gpu)
                frame = Frame.allocate(width, height, device=producer_gpu)
                try:
                    data = rng.integers(0, 256, frame.planes[0].shape, dtype=np.uint8)
                    frame.planes[0].copy_from(data)
                    producer.present(frame)
                    with consumer.acquire(timeout_us=2_000_000) as acquired:
                        same = bool(np.array_equal(acquired.planes[0].to_numpy(), data))
                finally:
                    producer.close()
                    frame.close()
    except EglCudaError as exc:
        return False, f"{type(exc).__name__}: {exc}"
    if not same:
        return False, f"a {width}x{height} frame arrived with other bytes"
    return True, f"a {width}x{height} frame of random bytes arrived intact"
