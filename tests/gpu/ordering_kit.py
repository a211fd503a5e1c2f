"""Slow readers and writers on every kind of CUDA stream, for the ordering race harness
(tests/gpu/test_ordering.py and its peer tests/gpu/ordering_peer.py).

Each reader takes a plane the way a user of its library would (DLPack or
``__cuda_array_interface__``), queues a kernel that spins for a while on its stream, then a copy of
the plane behind it, and returns the copy without waiting. Each writer does the same the other way:
spin, then write the frame's bytes. A frame written again before the reader's copy ran, or read
before the writer's write landed, shows as wrong bytes once the copies are checked. Nothing here
names a stream to eglcuda: the library must learn it from the hand-over, or from its documented
rule for ``__cuda_array_interface__`` (docs/ordering.md).
"""
from __future__ import annotations

import numpy as np

READERS = ["torch-default", "torch-side", "cupy-default", "cupy-nonblocking", "cupy-cai", "cupy-cai-side",
           "raw-cuda-python", "per-thread"]
WRITERS = ["torch-default", "torch-side", "cupy-nonblocking", "cupy-cai-side", "raw-cuda-python", "per-thread"]

_SPIN = r'''
extern "C" __global__ void spin(unsigned long long nanoseconds) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < nanoseconds);
}'''


def missing(kind: str) -> str | None:
    """What this machine lacks for ``kind`` (None: nothing)."""
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "CuPy (pip install cupy-cuda13x)"
    if kind.startswith("torch"):
        try:
            import torch
        except ImportError:
            return "PyTorch"
        if not torch.cuda.is_available():
            return "a CUDA build of PyTorch"
    if kind == "raw-cuda-python":
        try:
            from cuda.bindings import driver  # noqa: F401
        except ImportError:
            try:
                from cuda import cuda as driver  # noqa: F401
            except ImportError:
                return "cuda-python"
    return None


class Kit:
    """The streams and the spin kernel of one process, made once."""

    def __init__(self, spin_ms: float) -> None:
        import cupy

        self.cupy = cupy
        self.spin_ns = int(spin_ms * 1e6)
        self._spin = cupy.RawKernel(_SPIN, "spin")
        self._spin.compile()
        self.cupy_side = cupy.cuda.Stream(non_blocking=True)
        self._torch_side = None
        self._raw = None
        # Staged sources stay alive until finish(): freed sooner, CuPy's pool could hand their
        # memory to the next staging while a slow write still reads it.
        self._staged: list = []

    def torch_side(self):
        if self._torch_side is None:
            import torch

            self._torch_side = torch.cuda.Stream()
        return self._torch_side

    def raw_stream(self) -> int:
        """A non-blocking stream made with cuda-python's driver bindings, as its handle."""
        if self._raw is None:
            try:
                from cuda.bindings import driver
            except ImportError:
                from cuda import cuda as driver
            self.cupy.cuda.Device().use()  # the primary context current on this thread
            status, stream = driver.cuStreamCreate(driver.CUstream_flags.CU_STREAM_NON_BLOCKING)
            assert int(status) == 0, status
            self._raw = int(stream)
        return self._raw

    def spin(self) -> None:
        """The spin kernel on CuPy's current stream."""
        self._spin((1,), (1,), (self.cupy.uint64(self.spin_ns),))

    def _scope(self, kind: str):
        """The context manager that makes ``kind``'s stream current (CuPy's, PyTorch's, or both)."""
        cupy = self.cupy
        if kind == "torch-side":
            import torch

            side = self.torch_side()
            return _Both(torch.cuda.stream(side), cupy.cuda.ExternalStream(side.cuda_stream))
        if kind in ("cupy-nonblocking", "cupy-cai-side"):
            return self.cupy_side
        if kind == "raw-cuda-python":
            return cupy.cuda.ExternalStream(self.raw_stream())
        if kind == "per-thread":
            return cupy.cuda.Stream.ptds
        return cupy.cuda.Stream.null  # torch-default, cupy-default, cupy-cai: the legacy default stream

    def read(self, kind: str, plane):
        """Queue a slow read of ``plane`` on ``kind``'s stream; returns the copy (a CuPy or torch
        array), still being made."""
        with self._scope(kind):
            if kind.startswith("torch"):
                import torch

                view = torch.from_dlpack(plane)
                self.spin()
                return view.clone()
            view = self.cupy.asarray(plane) if kind.startswith("cupy-cai") else self.cupy.from_dlpack(plane)
            self.spin()
            return view.copy()

    def read_raw(self, plane, stream: int):
        """A slow read through the plane's raw pointer on the frame's own stream (the stream given
        to ``Subscriber(cuda_stream=...)``): a spin kernel, then a driver copy (no view taken)."""
        copy = self.cupy.empty((plane.height, plane.geometry.row_bytes), self.cupy.uint8)
        self.cupy.cuda.Device().synchronize()
        with self.cupy.cuda.ExternalStream(stream):
            self.spin()
        plane.copy_to_device(copy.data.ptr, plane.geometry.row_bytes)  # on the frame's stream
        return copy

    def write(self, kind: str, plane, data: np.ndarray) -> None:
        """Queue a slow write of ``data`` (host bytes of the plane's shape) into ``plane`` on
        ``kind``'s stream. The bytes are staged on the GPU first, so only the spin delays the
        write."""
        cupy = self.cupy
        staged = cupy.asarray(data)
        self._staged.append(staged)
        cupy.cuda.Device().synchronize()
        with self._scope(kind):
            if kind.startswith("torch"):
                import torch

                view = torch.from_dlpack(plane)
                source = torch.from_dlpack(staged)
                self.spin()
                view.copy_(source)
                return
            view = cupy.asarray(plane) if kind.startswith("cupy-cai") else cupy.from_dlpack(plane)
            self.spin()
            view[...] = staged

    def finish(self) -> None:
        self.cupy.cuda.Device().synchronize()
        self._staged.clear()


class _Both:
    """Two context managers entered and left together."""

    def __init__(self, first, second) -> None:
        self.first, self.second = first, second

    def __enter__(self):
        self.first.__enter__()
        self.second.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.second.__exit__(*exc)
        self.first.__exit__(*exc)


def as_numpy(copy) -> np.ndarray:
    """A reader's copy on the host (after :meth:`Kit.finish`)."""
    if hasattr(copy, "get"):
        return copy.get()
    return copy.cpu().numpy()
