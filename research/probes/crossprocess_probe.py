# Research record (see research/README.md): runs against the current package (public API only).
"""Which orderings let a fresh producer process connect to a cross-process EGLStream?

Each variant runs a consumer and a producer as fresh interpreters (subprocess) and reports
whether the producer connected and 3 frames arrived with the right bytes. Variables:
consumer/producer initialize CUDA before touching EGL or after; the producer closes the received
descriptor at once or after connecting; CUDA initialized through eglcuda or cuda-python.

    python research/probes/crossprocess_probe.py
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

import _needs  # research/probes/_needs.py: a missing need is one line and status 2


def init_cuda(how: str) -> None:
    if how == "eglcuda":
        import eglcuda
        eglcuda.get_device(0).make_current()
    elif how == "cudapython":
        from cuda.bindings import driver as cu
        cu.cuInit(0)
        _, dev = cu.cuDeviceGet(0)
        _, ctx = cu.cuDevicePrimaryCtxRetain(dev)
        cu.cuCtxSetCurrent(ctx)


def consumer(path: str, cuda_first: str) -> dict:
    import eglcuda
    if cuda_first != "no":
        init_cuda(cuda_first)
    with eglcuda.Display.for_cuda_device(0) as display:
        stream = display.create_stream(fifo_length=4, cross_process=True)
        c = stream.connect_cuda_consumer()
        eglcuda.serve_stream(stream, path, timeout=20)
        got = []
        try:
            for _ in range(3):
                with c.acquire(timeout_us=3_000_000) as frame:
                    data = frame.to_numpy()[0]
                    rng = np.random.default_rng(frame.number)
                    got.append(bool(np.array_equal(data, rng.integers(0, 256, data.shape, dtype=np.uint8))))
        except eglcuda.EglCudaError as exc:
            return {"frames_ok": got, "error": repr(exc)}
        stream.close()
    return {"frames_ok": got}


def producer(path: str, cuda_first: str, close_late: bool, pause: bool = False) -> dict:
    import eglcuda
    if cuda_first != "no":
        init_cuda(cuda_first)
    with eglcuda.Display.for_cuda_device(0) as display:
        if close_late:
            fd, _, conn = eglcuda.receive_fd(path, timeout=20)
            stream = eglcuda.Stream.from_fd(display, fd)
        else:
            stream = eglcuda.receive_stream(display, path, timeout=20)
        if pause:
            import time
            time.sleep(0.5)
        try:
            p = stream.connect_cuda_producer(64, 32)
        except eglcuda.EglCudaError as exc:
            if close_late:
                os.close(fd)
                eglcuda.acknowledge(conn, True)
            return {"connected": False, "error": repr(exc), "state": stream.state.name}
        if close_late:
            os.close(fd)
            eglcuda.acknowledge(conn, True)
        frames = [p.allocate_frame() for _ in range(3)]
        for number, frame in enumerate(frames, 1):
            rng = np.random.default_rng(number)
            frame.planes[0].copy_from(rng.integers(0, 256, frame.planes[0].shape, dtype=np.uint8))
            p.present(frame)
        import time
        time.sleep(2)
        stream.close()
    return {"connected": True}


def main() -> int:
    if len(sys.argv) == 5 and sys.argv[1] in ("consumer", "producer"):  # a child: ROLE PATH CUDA_FIRST CLOSE_LATE
        role, path, cuda_first, close_late = sys.argv[1:5]
        try:
            result = consumer(path, cuda_first) if role == "consumer" else producer(path, cuda_first, close_late == "1", close_late == "s")
        except Exception as exc:  # noqa: BLE001
            result = {"error": repr(exc)}
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    _needs.answer_help(__doc__)
    if len(sys.argv) > 1:
        _needs.unmet(__file__, f"takes no arguments: usage: python {_needs.program_path(__file__)}")
    _needs.needs_cuda(__file__, "cuda", "cross-process")
    connected = 0
    variants = [("no", "no", "0"), ("no", "eglcuda", "0"), ("eglcuda", "no", "0"), ("eglcuda", "eglcuda", "0"),
                ("no", "no", "1"), ("eglcuda", "eglcuda", "1"), ("cudapython", "cudapython", "0"),
                ("no", "no", "s"), ("eglcuda", "eglcuda", "s"), ("no", "no", "0"), ("eglcuda", "eglcuda", "0")]
    for c_first, p_first, late in variants:
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "s")
            cons = subprocess.Popen([sys.executable, __file__, "consumer", path, c_first, "0"], stdout=subprocess.PIPE, text=True)
            prod = subprocess.Popen([sys.executable, __file__, "producer", path, p_first, late], stdout=subprocess.PIPE, text=True)
            try:
                c_out, _ = cons.communicate(timeout=40)
                p_out, _ = prod.communicate(timeout=40)
            except subprocess.TimeoutExpired:
                cons.kill(); prod.kill()
                c_out = p_out = "TIMEOUT"
        pick = lambda text: next((l[7:] for l in text.splitlines() if l.startswith("RESULT ")), text[-300:])
        connected += '"connected": true' in pick(p_out)
        print(f"consumer cuda first={c_first:<10} producer cuda first={p_first:<10} close fd late={late}: "
              f"producer {pick(p_out)} | consumer {pick(c_out)}", flush=True)
    return 0 if connected else 1  # no producer connected in any variant: nothing was measured


if __name__ == "__main__":
    sys.exit(main())
