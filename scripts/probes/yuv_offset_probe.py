"""Probe: does the YUV420 planar pitch acquire failure (CUDA_ERROR_INVALID_VALUE, 640x480) depend
on where the frame's planes sit in memory? Wraps one large allocation at plane-0 offsets of
k * 256 bytes and, for each, presents the frame on a fresh stream and acquires it."""
import sys
import numpy as np
import eglcuda
from eglcuda import ColorFormat
from eglcuda._native import ffi, lib

W, H = int(sys.argv[1]) if len(sys.argv) > 1 else 640, int(sys.argv[2]) if len(sys.argv) > 2 else 480
display = eglcuda.Display.for_cuda_device(0)
device = display.cuda_device()
device.make_current()
pitch = (W + 255) // 256 * 256
size = pitch * H * 2 + (1 << 22)
box = ffi.new("CUdeviceptr *")
assert lib.cuMemAlloc(box, size) == 0
base = int(box[0])
rng = np.random.default_rng(3)
results = {}
for step in list(range(0, 64)) + [128, 256, 512, 1024, 2048, 4096, 8192]:
    offset = step * 256
    frame = eglcuda.Frame.from_pointer(base + offset, W, H, pitch, ColorFormat.YUV420_PLANAR, device)
    stream = display.create_stream()
    consumer = stream.connect_cuda_consumer()
    producer = stream.connect_cuda_producer(W, H, format=ColorFormat.YUV420_PLANAR)
    data = [rng.integers(0, 256, p.shape, dtype=np.uint8) for p in frame.planes]
    for p, d in zip(frame.planes, data):
        p.copy_from(d)
    producer.present(frame)
    try:
        with consumer.acquire(1_000_000) as got:
            ok = all(np.array_equal(g, d) for g, d in zip(got.to_numpy(), data))
            results[offset] = "ok" if ok else "WRONG DATA"
    except eglcuda.EglcudaError as exc:
        results[offset] = f"FAIL {type(exc).__name__}"
    stream.close()
    frame.close()
addresses = lambda off: [hex(a) for a in (base + off, base + off + pitch * H, base + off + pitch * H + pitch // 2 * H // 2)]
print(f"{W}x{H} pitch {pitch}, base {hex(base)}")
fails = [o for o, r in results.items() if r != "ok"]
for o in sorted(results):
    if results[o] != "ok" or o in (0, 256, 512):
        print(f"offset {o:7d} ({o % 4096:5d} mod 4096): {results[o]}  planes {addresses(o)}")
print(f"SUMMARY {len(results) - len(fails)} ok, {len(fails)} failed of {len(results)} offsets")
