# Research record (see research/README.md): runs against the current package (import paths updated to eglcuda._bind).
"""Probe for the YUV flake: does a frame fail on a stream when it shares device memory (one
allocation, or the driver's 2 MiB chunk) with a frame presented on a stream destroyed before?

    python research/probes/shared_chunk_probe.py VARIANT     (each variant in a fresh process)

Layout copied from the failing test run: a 640x480 one-channel pitch frame X at the chunk base,
then three 640x480 YUV420 planar frames (pitch 768) right after it."""
import sys

import _needs  # research/probes/_needs.py: a missing need is one line and status 2

VARIANTS = ("dead", "never", "live", "dead_argb_x", "separate_dead", "separate_never", "fresh_region")
_needs.answer_help(__doc__)
_needs.needs_args(__file__, 1, f"VARIANT (one of {', '.join(VARIANTS)})")
if sys.argv[1] not in VARIANTS:
    _needs.unmet(__file__, f"unknown variant {sys.argv[1]}: one of {', '.join(VARIANTS)}")
_needs.needs_cuda(__file__, "cuda", "cuda-stream")

import numpy as np

import eglcuda
from eglcuda import ColorFormat
from eglcuda._bind.cuda import check
from eglcuda.cuda_device import get_device
from eglcuda._bind._native import ffi, lib

MiB = 1 << 20
variant = sys.argv[1]
display = eglcuda.Display.for_cuda_device(0)
device = get_device(0)
device.make_current()
rng = np.random.default_rng()


def cu_alloc(size: int) -> int:
    box = ffi.new("CUdeviceptr *")
    check(lib.cuMemAlloc(box, size), "cuMemAlloc")
    return int(box[0])


def yuv_at(base: int) -> eglcuda.Frame:
    return eglcuda.Frame.from_pointer([base, base + 0x5A000, base + 0x70800], 640, 480, 768, ColorFormat.YUV420_PLANAR)


def use_on_dead_stream(frame: eglcuda.Frame, close: bool = True):
    stream = display.create_stream()
    stream.connect_cuda_consumer()
    producer = stream.connect_cuda_producer(frame.width, frame.height, format=frame.format)
    producer.present(frame)
    stream.consumer.acquire().release()
    if close:
        stream.close()
    return stream


def run_yuv(frames) -> str:
    with display.create_stream() as stream:
        consumer = stream.connect_cuda_consumer()
        producer = stream.connect_cuda_producer(640, 480, format=ColorFormat.YUV420_PLANAR)
        for round_ in range(6):
            frame = frames[round_] if round_ < 3 else producer.return_frame(timeout_us=1_000_000)
            data = [rng.integers(0, 256, p.shape, dtype=np.uint8) for p in frame.planes]
            for plane, values in zip(frame.planes, data):
                plane.copy_from(values)
            try:
                producer.present(frame)
                with consumer.acquire(timeout_us=1_000_000) as acquired:
                    got = acquired.to_numpy()
            except eglcuda.EglCudaError as exc:
                return f"FAIL round {round_} ({hex(frame.key)}): {exc}"
            if any(not np.array_equal(g, e) for g, e in zip(got, data)):
                return f"WRONG DATA round {round_}"
    return "ok"


if variant in ("dead", "never", "live", "dead_argb_x"):
    region = cu_alloc(4 * MiB)  # one allocation, laid out like the failing run
    x_format = ColorFormat.ARGB if variant == "dead_argb_x" else ColorFormat.A
    x = eglcuda.Frame.from_pointer(region, 640, 480, 768 if x_format is ColorFormat.A else 2560, x_format)
    keep = None
    if variant != "never":
        keep = use_on_dead_stream(x, close=variant != "live")
    frames = [yuv_at(region + 0x5A000 + i * 0x87000) for i in range(3)]
elif variant in ("separate_dead", "separate_never"):
    x_address = cu_alloc(0x5A000)  # separate allocations the driver packs into one chunk
    x = eglcuda.Frame.from_pointer(x_address, 640, 480, 768, ColorFormat.A)
    if variant == "separate_dead":
        use_on_dead_stream(x)
    frames = [eglcuda.Frame.allocate(640, 480, ColorFormat.YUV420_PLANAR) for _ in range(3)]
    print("x", hex(x_address), "frames", [hex(f.key) for f in frames])
elif variant == "fresh_region":
    region = cu_alloc(4 * MiB)
    frames = [yuv_at(region + 0x5A000 + i * 0x87000) for i in range(3)]
else:
    raise SystemExit(f"unknown variant {variant}")
print(variant, run_yuv(frames), flush=True)
