"""Frames between two GPUs: eglcuda's EGLStream (one process and two) against the C reference and
against what users do instead.

One table per direction (GPU a -> GPU b) and size (1920x1080 NV12, 3840x2160 ARGB), all measured
in this one invocation:

- C: bench/c/cross_gpu.c, the same driver calls with no Python, each endpoint on its own GPU's
  EGL display, in one process (two threads) and in two processes.
- eglcuda, one process: the stream on the consumer's display (``cross_process=True``), the producer
  connected with ``device=`` its GPU (eglcuda opens the stream on that GPU's display), a producer
  thread and the consumer on the main thread, FIFO 4, six frames in the ring.
- eglcuda, two processes: the consumer process creates and serves the stream, the producer
  process receives it on its own GPU's display.
- torch ``.to("cuda:b")`` of a tensor on GPU a (a peer copy; torch optional).
- ``cuMemcpyPeerAsync`` from a producer buffer on GPU a into a consumer-owned buffer on GPU b,
  on the consumer's stream (cuda-python).
- CUDA IPC: the producer process's buffers opened by the consumer process on the other GPU
  (``CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS``), interprocess events per buffer, slot numbers over a
  pipe (bench/cross_process.py's transport, with buffers of the same byte size).

Rates are frames/s of a free-running loop; latency is from just before a frame is handed over
(its content complete on the producer's GPU) until the consumer's side has it (acquired, or the
copy done), CLOCK_MONOTONIC in both processes.

    python bench/cross_gpu.py [--quick] [--out DIR]

Needs two NVIDIA GPUs with EGL streams, gcc and bench/c/cross_gpu.c for the C reference, and
cuda-python (``pip install -e '.[bench]'``); torch is optional.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _script import CUDA_PYTHON, build_reference, fail, listed, output_folder, require, run  # noqa: E402

PROGRAM = "bench/cross_gpu.py"
HERE = pathlib.Path(__file__).resolve().parent
CASES = [(1920, 1080, "NV12"), (3840, 2160, "ARGB")]
FIFO = 4
POOL = 6


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1)))]


def frame_bytes(width: int, height: int, fmt: str) -> int:
    return width * height * 3 // 2 if fmt == "NV12" else width * height * 4


# ---- C ---------------------------------------------------------------------------------------------

def build_c() -> pathlib.Path:
    return build_reference("cross_gpu")


def run_c(binary: pathlib.Path, mode: str, producer: int, consumer: int, width: int, height: int, fmt: str,
          frames: int) -> dict:
    out = subprocess.run([str(binary), mode, str(producer), str(consumer), str(width), str(height), fmt.lower(),
                          str(frames)], check=True, capture_output=True, text=True, timeout=300).stdout
    line = [l for l in out.splitlines() if l.startswith("fps=")][-1]
    values = dict(item.split("=") for item in line.split())
    return {"fps": float(values["fps"]), "p50": float(values["latency_p50_us"]),
            "p99": float(values["latency_p99_us"])}


# ---- eglcuda ------------------------------------------------------------------------------------------

def eglcuda_in_process(producer_gpu: int, consumer_gpu: int, width: int, height: int, fmt: str,
                       frames: int) -> dict:
    import eglcuda

    stamps = [0.0] * (frames + 1)
    latencies: list[float] = []
    errors: list[BaseException] = []
    with eglcuda.Display.for_cuda_device(consumer_gpu) as display:
        with display.create_stream(fifo_length=FIFO, cross_process=True) as stream:
            consumer = stream.connect_cuda_consumer()
            producer = stream.connect_cuda_producer(width, height, device=producer_gpu, format=fmt)
            pool = [producer.allocate_frame() for _ in range(POOL)]

            def produce() -> None:
                try:
                    free = list(pool)
                    for number in range(1, frames + 1):
                        while not free:
                            back = producer.return_frame(timeout_us=2_000_000)
                            if back is not None:
                                free.append(back)
                        stamps[number] = now()
                        producer.present(free.pop())
                except BaseException as exc:  # noqa: BLE001 - reported below
                    errors.append(exc)

            worker = threading.Thread(target=produce)
            start = now()
            worker.start()
            try:
                for _ in range(frames):
                    frame = consumer.acquire_next(timeout_us=5_000_000)
                    latencies.append(1e6 * (now() - stamps[frame.number]))
                frame.release()
                elapsed = now() - start
            finally:
                worker.join(60)
            if errors:
                raise errors[0]
    steady = latencies[len(latencies) // 10:]
    return {"fps": frames / elapsed, "p50": statistics.median(steady), "p99": percentile(steady, 0.99)}


def _producer_process(socket_path: str, gpu: int, width: int, height: int, fmt: str, frames: int, stamps_name: str,
                      result) -> None:
    from multiprocessing import shared_memory

    import numpy as np

    import eglcuda

    try:
        memory = shared_memory.SharedMemory(name=stamps_name)
        stamps = np.ndarray((frames + 1,), np.float64, buffer=memory.buf)
        with eglcuda.Display.for_cuda_device(gpu) as display:
            stream = eglcuda.receive_stream(display, socket_path, timeout=60)
            producer = stream.connect_cuda_producer(width, height, device=gpu, format=fmt)
            free = [producer.allocate_frame() for _ in range(POOL)]
            for number in range(1, frames + 1):
                while not free:
                    back = producer.return_frame(timeout_us=2_000_000)
                    if back is not None:
                        free.append(back)
                stamps[number] = now()
                producer.present(free.pop())
            result.put("ok")
            result.get(timeout=120)  # the consumer has acquired every frame
            stream.close()
        del stamps
        memory.close()
    except BaseException as exc:  # noqa: BLE001 - the parent reports it in one line
        result.put(f"producer: {type(exc).__name__}: {exc}")


def eglcuda_two_processes(producer_gpu: int, consumer_gpu: int, width: int, height: int, fmt: str,
                          frames: int) -> dict:
    from multiprocessing import shared_memory

    import numpy as np

    import eglcuda

    spawn = mp.get_context("spawn")
    memory = shared_memory.SharedMemory(create=True, size=8 * (frames + 1))
    stamps = np.ndarray((frames + 1,), np.float64, buffer=memory.buf)
    result = spawn.Queue()
    latencies = []
    try:
        with tempfile.TemporaryDirectory(prefix="eglcuda-bench-") as folder, \
                eglcuda.Display.for_cuda_device(consumer_gpu) as display:
            path = os.path.join(folder, "s")
            stream = display.create_stream(fifo_length=FIFO, cross_process=True)
            consumer = stream.connect_cuda_consumer()
            child = spawn.Process(target=_producer_process,
                                  args=(path, producer_gpu, width, height, fmt, frames, memory.name, result))
            child.start()
            try:
                eglcuda.serve_stream(stream, path, timeout=60)
                start = None
                for _ in range(frames):
                    frame = consumer.acquire_next(timeout_us=10_000_000)
                    if start is None:
                        start = now()
                    latencies.append(1e6 * (now() - stamps[frame.number]))
                frame.release()
                elapsed = now() - start
                said = result.get(timeout=60)
                if said != "ok":
                    raise RuntimeError(said)
                result.put("done")
            finally:
                child.join(60)
                if child.is_alive():
                    child.kill()
                stream.close()
    finally:
        del stamps
        memory.close()
        memory.unlink()
    steady = latencies[len(latencies) // 10:]
    return {"fps": (frames - 1) / elapsed, "p50": statistics.median(steady), "p99": percentile(steady, 0.99)}


# ---- what users do instead -------------------------------------------------------------------------

def _driver():
    from cuda.bindings import driver as cu

    return cu


def _check(result):
    error, *values = result
    if int(error) != 0:
        raise RuntimeError(f"CUDA call failed: {error}")
    return values[0] if len(values) == 1 else (tuple(values) or None)


def memcpy_peer(producer_gpu: int, consumer_gpu: int, size: int, frames: int) -> dict:
    """A ring of producer buffers on one GPU copied into a consumer-owned buffer on the other
    (cuMemcpyPeerAsync on the consumer's stream), one copy in flight per slot."""
    cu = _driver()
    _check(cu.cuInit(0))
    contexts = {}
    for ordinal in (producer_gpu, consumer_gpu):
        contexts[ordinal] = _check(cu.cuDevicePrimaryCtxRetain(_check(cu.cuDeviceGet(ordinal))))
    _check(cu.cuCtxSetCurrent(contexts[producer_gpu]))
    sources = [_check(cu.cuMemAlloc(size)) for _ in range(POOL)]
    for source in sources:
        _check(cu.cuMemsetD8(source, 7, size))
    _check(cu.cuCtxSetCurrent(contexts[consumer_gpu]))
    target = _check(cu.cuMemAlloc(size))
    stream = _check(cu.cuStreamCreate(1))
    latencies = []
    start = now()
    for i in range(frames):
        t0 = now()
        _check(cu.cuMemcpyPeerAsync(target, contexts[consumer_gpu], sources[i % POOL], contexts[producer_gpu], size,
                                    stream))
        _check(cu.cuStreamSynchronize(stream))
        latencies.append(1e6 * (now() - t0))
    elapsed = now() - start
    _check(cu.cuMemFree(target))
    _check(cu.cuStreamDestroy(stream))
    _check(cu.cuCtxSetCurrent(contexts[producer_gpu]))
    for source in sources:
        _check(cu.cuMemFree(source))
    steady = latencies[len(latencies) // 10:]
    return {"fps": frames / elapsed, "p50": statistics.median(steady), "p99": percentile(steady, 0.99)}


def torch_to(producer_gpu: int, consumer_gpu: int, size: int, frames: int) -> dict | str:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    sources = [torch.full((size,), 7, dtype=torch.uint8, device=f"cuda:{producer_gpu}") for _ in range(POOL)]
    torch.cuda.synchronize(producer_gpu)
    target_device = torch.device(f"cuda:{consumer_gpu}")
    latencies = []
    start = now()
    for i in range(frames):
        t0 = now()
        copy = sources[i % POOL].to(target_device, non_blocking=True)
        torch.cuda.synchronize(target_device)
        latencies.append(1e6 * (now() - t0))
        del copy
    elapsed = now() - start
    steady = latencies[len(latencies) // 10:]
    return {"fps": frames / elapsed, "p50": statistics.median(steady), "p99": percentile(steady, 0.99)}


def cuda_ipc(producer_gpu: int, consumer_gpu: int, size: int, frames: int) -> dict:
    os.environ["EGLCUDA_BENCH_PRODUCER_GPU"] = str(producer_gpu)
    os.environ["EGLCUDA_BENCH_CONSUMER_GPU"] = str(consumer_gpu)
    sys.path.insert(0, str(HERE))
    import cross_process

    # The transport moves ARGB buffers of width x height: one row of `size` bytes keeps the byte count.
    width = size // 4
    row = cross_process.run_pair("cuda-ipc", width, 1, max(frames // 3, 50), frames)
    if row["bad"]:
        raise RuntimeError(f"CUDA IPC: {row['bad']} frames arrived wrong")
    return {"fps": row["fps"], "p50": row["latency_us"], "p99": row["latency_p99_us"]}


# ---- the run ----------------------------------------------------------------------------------------

def pair(text: str) -> tuple[int, int]:
    """A --directions value, ``PRODUCER:CONSUMER`` (two GPU ordinals); ValueError otherwise."""
    producer, colon, consumer = text.partition(":")
    if not colon or int(producer) < 0 or int(consumer) < 0:
        raise ValueError(text)
    return int(producer), int(consumer)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer frames")
    parser.add_argument("--out", default=None, help="folder for results.json and the markdown table")
    parser.add_argument("--directions", default="0:1,1:0", help="producer:consumer GPU pairs")
    args = parser.parse_args()
    output_folder(parser, "--out", args.out)
    directions = listed(parser, "--directions", args.directions, "producer:consumer GPU pairs, e.g. 0:1,1:0", pair)
    require(PROGRAM, "two-gpus", "cross-process", modules=[CUDA_PYTHON], gcc=True)
    if not (HERE / "c" / "cross_gpu.c").exists():
        fail(PROGRAM, f"needs the C reference {HERE / 'c' / 'cross_gpu.c'}, which this checkout lacks", 2)
    frames = 1500 if args.quick else 6000
    binary = build_c()
    rows = []
    for producer_gpu, consumer_gpu in directions:
        for width, height, fmt in CASES:
            size = frame_bytes(width, height, fmt)
            measured = {
                "C, one process": run_c(binary, "inprocess_pipelined", producer_gpu, consumer_gpu, width, height, fmt, frames),
                "eglcuda, one process": eglcuda_in_process(producer_gpu, consumer_gpu, width, height, fmt, frames),
                "C, two processes": run_c(binary, "twoproc", producer_gpu, consumer_gpu, width, height, fmt, frames),
                "eglcuda, two processes": eglcuda_two_processes(producer_gpu, consumer_gpu, width, height, fmt,
                                                                frames),
                "cuMemcpyPeerAsync": memcpy_peer(producer_gpu, consumer_gpu, size, frames),
                "torch .to()": torch_to(producer_gpu, consumer_gpu, size, frames),
                "CUDA IPC, two processes": cuda_ipc(producer_gpu, consumer_gpu, size, frames),
            }
            for name, value in measured.items():
                row = {"direction": f"GPU{producer_gpu} -> GPU{consumer_gpu}", "size": f"{width}x{height} {fmt}",
                       "path": name}
                row.update(value if isinstance(value, dict) else {"skipped": value})
                rows.append(row)
                text = (f"{value['fps']:9.0f} frames/s  p50 {value['p50']:8.1f} us  p99 {value['p99']:8.1f} us"
                        if isinstance(value, dict) else f"skipped: {value}")
                print(f"{row['direction']}  {row['size']:<15} {name:<24} {text}", flush=True)
    table = markdown(rows, frames)
    print("\n" + table)
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "cross_gpu.json").write_text(json.dumps(rows, indent=1))
        (out / "cross_gpu.md").write_text(table + "\n")
    return 0


def markdown(rows: list[dict], frames: int) -> str:
    lines = [f"{frames} frames per cell, FIFO {FIFO}, {POOL} frames in the ring; one run.", "",
             "| direction | size | path | frames/s | / C same processes | latency p50 (us) | p99 (us) |",
             "|---|---|---|---:|---:|---:|---:|"]
    for row in rows:
        if "skipped" in row:
            lines.append(f"| {row['direction']} | {row['size']} | {row['path']} | skipped: {row['skipped']} | | | |")
            continue
        kind = "two processes" if "two processes" in row["path"] else "one process"
        c = next((r for r in rows if r["direction"] == row["direction"] and r["size"] == row["size"]
                  and r["path"] == f"C, {kind}"), None)
        ratio = f"{row['fps'] / c['fps']:.2f}" if c and "fps" in c else ""
        lines.append(f"| {row['direction']} | {row['size']} | {row['path']} | {row['fps']:.0f} | {ratio} | "
                     f"{row['p50']:.1f} | {row['p99']:.1f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
