# Research record (see research/README.md): runs against the current package (import paths updated; short YUV420_PLANAR placements now print eglcuda's refusal, not the driver's failure).
"""Probe for the YUV flake: how far past our last plane does the driver reach?

Each attempt takes a fresh 2 MiB allocation (its own chunk), places a frame so that its last
plane ends ``slack`` bytes before the end of the allocation (planes back to back, as Frame.allocate lays
them out), and presents and acquires it once on a new stream. Also tries the frame at the
start of the allocation (no neighbour problem) as the control.

    python research/probes/plane_extent_probe.py FORMAT WIDTH HEIGHT PITCH"""
import sys

import _needs  # research/probes/_needs.py: a missing need is one line and status 2

_needs.answer_help(__doc__)
_needs.needs_args(__file__, 4, "FORMAT WIDTH HEIGHT PITCH (e.g. YUV420_PLANAR 640 480 768)")
_needs.needs_cuda(__file__, "cuda", "cuda-stream")

import numpy as np

import eglcuda
from eglcuda import ColorFormat
from eglcuda._bind.cuda import check
from eglcuda.cuda_device import get_device
from eglcuda.frames.formats import plane_geometry
from eglcuda._bind._native import ffi, lib

try:
    fmt, width, height, pitch = ColorFormat[sys.argv[1]], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
except (KeyError, ValueError):
    _needs.unmet(__file__, f"usage: python {_needs.program_path(__file__)} FORMAT WIDTH HEIGHT PITCH: FORMAT one of "
                           f"{', '.join(ColorFormat.__members__)}, the others whole numbers")
display = eglcuda.Display.for_cuda_device(0)
get_device(0).make_current()
rng = np.random.default_rng()
geometry = plane_geometry(fmt, width, height, pitch)
sizes = [g.pitch * g.height for g in geometry]
total = sum(sizes)


def attempt(end_slack: int | None) -> str:
    box = ffi.new("CUdeviceptr *")
    check(lib.cuMemAlloc(box, 2 << 20), "cuMemAlloc")
    region = int(box[0])
    try:
        chunk_end = region + (2 << 20)  # the end of the allocation (2 MiB aligned: its own chunk)
        base = region if end_slack is None else chunk_end - end_slack - total
        addresses, at = [], base
        for size in sizes:
            addresses.append(at)
            at += size
        try:
            frame = eglcuda.Frame.from_pointer(addresses, width, height, pitch, fmt)
        except eglcuda.UsageError as exc:  # since 2446b06 eglcuda refuses what the driver would read past
            return f"REFUSED by eglcuda: {str(exc)[:100]}"
        with display.create_stream() as stream:
            consumer = stream.connect_cuda_consumer()
            producer = stream.connect_cuda_producer(width, height, format=fmt)
            data = [rng.integers(0, 256, p.shape, dtype=np.uint8) for p in frame.planes]
            for plane, values in zip(frame.planes, data):
                plane.copy_from(values)
            try:
                producer.present(frame)
                with consumer.acquire(timeout_us=1_000_000) as acquired:
                    got = acquired.to_numpy()
            except eglcuda.EglCudaError as exc:
                return f"FAIL: {str(exc)[:100]}"
            if any(not np.array_equal(g, e) for g, e in zip(got, data)):
                return "WRONG DATA"
        frame.close()
        return "ok"
    finally:
        lib.cuMemFree(region)


box = ffi.new("CUdeviceptr *"); check(lib.cuMemAlloc(box, 2 << 20), "cuMemAlloc")
print("2 MiB allocation aligned:", int(box[0]) % (2 << 20) == 0); lib.cuMemFree(box[0])
print(f"{fmt.name} {width}x{height} pitch {pitch}: planes {[hex(s) for s in sizes]} total {hex(total)}")
print("  control (region start):", attempt(None))
for slack in (0, 0x1000, 0x8000, 0x10000, 0x16000, 0x16800, 0x17000, 0x20000, 0x2D000, 0x40000):
    print(f"  last plane ends {hex(slack)} before the allocation end:", attempt(slack), flush=True)
