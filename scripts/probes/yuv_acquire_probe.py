"""Probe: when does the first acquire of a 640x480 YUV420 planar pitch frame fail with
CUDA_ERROR_INVALID_VALUE (seen in some full GPU-tier runs)? Runs the every-byte test's sequence
over all formats, sizes and layouts several times in one process; on a failure prints the frame's
plane addresses, pitch and alignments, then retries the acquire."""
import sys
import numpy as np
import eglcuda
from eglcuda import ColorFormat, Layout

FORMATS = [ColorFormat.ARGB, ColorFormat.ABGR, ColorFormat.RGBA, ColorFormat.BGRA, ColorFormat.Y, ColorFormat.A,
           ColorFormat.YUV420_PLANAR, ColorFormat.NV12, ColorFormat.YUV444_PLANAR]
SIZES = [(2, 2), (34, 18), (640, 480), (1280, 720), (642, 480), (640, 482)]
rng = np.random.default_rng(1)
display = eglcuda.Display.for_cuda_device(0)
fails = tries = 0
for rep in range(int(sys.argv[1]) if len(sys.argv) > 1 else 4):
    for size in SIZES:
        for fmt in FORMATS:
            for layout in (Layout.PITCH, Layout.ARRAY):
                w, h = size
                if fmt in eglcuda._formats.EVEN_SIZE_ONLY and (w % 2 or h % 2):
                    continue
                stream = display.create_stream()
                consumer = stream.connect_cuda_consumer()
                producer = stream.connect_cuda_producer(w, h, format=fmt, layout=layout)
                frames = [producer.allocate_frame() for _ in range(3)]
                for round_ in range(4):
                    frame = frames[round_ % 3] if round_ < 3 else producer.return_frame(timeout_us=1_000_000)
                    data = [rng.integers(0, 256, p.shape, dtype=np.uint8) for p in frame.planes]
                    for p, d in zip(frame.planes, data):
                        p.copy_from(d)
                    producer.present(frame)
                    tries += 1
                    try:
                        acquired = consumer.acquire(timeout_us=1_000_000)
                    except eglcuda.CUDAError as exc:
                        fails += 1
                        addrs = [p.pointer for p in frame.planes] if layout is Layout.PITCH else []
                        print(f"FAIL rep {rep} {w}x{h} {fmt.name} {layout.value} round {round_}: {exc}")
                        print("   pitch", frame.pitch, "planes", [hex(a) for a in addrs],
                              "mod4096", [a % 4096 for a in addrs], "mod 2MB", [a % (2 << 20) for a in addrs])
                        try:
                            acquired = consumer.acquire(timeout_us=1_000_000)
                            print("   retry ok")
                        except eglcuda.EglCudaError as exc2:
                            print("   retry failed:", exc2)
                            break
                    got = acquired.to_numpy()
                    ok = all(np.array_equal(g, d) for g, d in zip(got, data))
                    if not ok:
                        print(f"DATA MISMATCH {w}x{h} {fmt.name} {layout.value} round {round_}")
                    acquired.release()
                stream.close()
print(f"acquires {tries}, failures {fails}")
