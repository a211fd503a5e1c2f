"""Frames between two processes: eglcuda's cross-process EGLStream vs CUDA IPC vs shared memory.

Producer and consumer run in two spawned processes per transport and size (ARGB frames,
1920x1080 and 3840x2160). Each pair runs two phases:

- latency: one frame at a time (the next is sent only after the consumer acknowledged the last,
  over a pipe, outside the timed span). Timed span: from just before the producer hands over a
  frame whose content is already complete on its GPU, to the moment the consumer's CUDA stream
  has the frame's data ready (its stream synchronized after the hand-over). Both processes stamp
  CLOCK_MONOTONIC, which Linux shares between processes.
- throughput: free running with 6 buffers in the ring (eglcuda: FIFO 4 plus the frames the
  producer holds); the producer fills each frame on the GPU, the consumer checks one word of
  each (a 4-byte read after its stream has the frame), frames/s over the whole run.

Transports:
(1) eglcuda: Stream(cross_process=True, FIFO 4, or EGLCUDA_BENCH_FIFO) served over a UNIX
    socket; present / acquire / release / return_frame.
(2) CUDA IPC through cuda-python: 6 device buffers and 6 interprocess events, their handles sent
    once and opened once (cached); per frame the producer records the event and sends the slot
    number over a pipe, the consumer waits on the event in its stream and sends the slot back.
(3) Host shared memory (multiprocessing.shared_memory), registered with cuMemHostRegister when
    the driver allows (else pageable): device->host copy in the producer, host->device copy in
    the consumer, slot numbers over a pipe.

    python bench/cross_process.py [--quick] [--markdown FILE] [--mps]

--mps runs every pair under CUDA MPS (a private daemon for the run, or the one already running);
each end reports whether its CUDA context is an MPS client, and the table says so.

Needs an NVIDIA GPU with EGL streams between processes, and cuda-python for IPC and the fills
(``pip install -e '.[bench]'``); CuPy is not used. A process that fails says why in one line,
which this script prints. Without CUDA IPC (Tegra) that transport is left out.
"""
from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _script import CUDA_PYTHON, lazy, listed, one_line, output_file, require, run, size  # noqa: E402

PROGRAM = "bench/cross_process.py"
np = lazy("numpy")  # imported at first use, once require() has checked it is there

SIZES = [(1920, 1080), (3840, 2160)]
TRANSPORTS = ["eglcuda", "cuda-ipc", "shm"]
SLOTS = 6
WARMUP = 20
FIFO = int(os.environ.get("EGLCUDA_BENCH_FIFO", "4"))  # an environment variable: spawned children see it
# How eglcuda's consumer checks a frame in the throughput phase (a diagnostic of docs/mps.md):
# "word" (default) its 4-byte copy and synchronize; "sync-first" a synchronize of its stream
# first, timed apart ("sync"); "split" the word's steps timed apart (the plane's address "plane",
# the copy call "copy", the synchronize "sync"); "pinned" the word in page-locked host memory;
# "none" no check.
CHECK = os.environ.get("EGLCUDA_BENCH_CHECK", "word")
CHECKS = ("word", "sync-first", "split", "pinned", "none")
# EGLCUDA_BENCH_FILL=0: eglcuda's producer does not write its frames in the throughput phase (with
# EGLCUDA_BENCH_CHECK=none: the stream's hand-over alone, as C's plain twoproc).
FILL = os.environ.get("EGLCUDA_BENCH_FILL", "1") != "0"
# EGLCUDA_BENCH_NUMBERS=0: eglcuda's consumer is connected with frame_numbers=False (no frame-counter
# query per acquire).
NUMBERS = os.environ.get("EGLCUDA_BENCH_NUMBERS", "1") != "0"
# EGLCUDA_BENCH_STREAM=legacy: each end's GPU work and its transport's calls go on the legacy default
# stream instead of a non-blocking stream of its own (eglcuda: the consumer connected with
# cuda_stream=0, present(cuda_stream=0)); producer-legacy: the producer's only. See
# docs/streams.md, "The legacy default stream between processes".
STREAM = os.environ.get("EGLCUDA_BENCH_STREAM", "own")
STREAMS = ("own", "legacy", "producer-legacy")
# The GPU each end runs on (bench/cross_gpu.py sets them): environment variables, for the same reason.
GPU = {"producer": int(os.environ.get("EGLCUDA_BENCH_PRODUCER_GPU", "0")),
       "consumer": int(os.environ.get("EGLCUDA_BENCH_CONSUMER_GPU", "0"))}


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def driver():
    try:
        from cuda.bindings import driver as cu
    except ImportError:  # cuda-python before 12.6
        from cuda import cuda as cu
    return cu


class Cuda:
    """The few driver calls both ends need, through cuda-python, on a device's primary context."""

    def __init__(self, ordinal: int = 0, role: str = "producer") -> None:
        self.cu = cu = driver()
        self.ok = cu.CUresult.CUDA_SUCCESS
        self.check(cu.cuInit(0))
        device = self.check(cu.cuDeviceGet(ordinal))
        self.context = self.check(cu.cuDevicePrimaryCtxRetain(device))
        self.check(cu.cuCtxSetCurrent(self.context))
        # non-blocking, or the legacy default stream (EGLCUDA_BENCH_STREAM=legacy)
        legacy = STREAM == "legacy" or (STREAM == "producer-legacy" and role == "producer")
        self.stream = cu.CUstream(0) if legacy else self.check(cu.cuStreamCreate(1))
        self.word = np.zeros(1, np.uint32)
        self.word_address = self.word.ctypes.data
        if CHECK == "pinned":
            self.word_address = int(self.check(cu.cuMemAllocHost(4)))

    def check(self, result):
        error, *values = result
        if error != self.ok:
            raise RuntimeError(f"CUDA call failed: {error}")
        return values[0] if len(values) == 1 else (tuple(values) or None)

    def alloc(self, size: int) -> int:
        return int(self.check(self.cu.cuMemAlloc(size)))

    def fill(self, pointer: int, size: int, value: int) -> None:
        self.check(self.cu.cuMemsetD32Async(pointer, value, size // 4, self.stream))

    def sync(self) -> None:
        self.check(self.cu.cuStreamSynchronize(self.stream))

    def word_at(self, pointer: int, index: int, size: int) -> int:
        """One 4-byte word of a frame, read after the stream's earlier work."""
        offset = (index * 2654435761 % (size // 4)) * 4
        self.check(self.cu.cuMemcpyDtoHAsync(self.word_address, pointer + offset, 4, self.stream))
        self.sync()
        if self.word_address != self.word.ctypes.data:
            return int.from_bytes(ctypes.string_at(self.word_address, 4), "little")
        return int(self.word[0])


# ---- the producer and consumer of each transport ---------------------------------------------
# Each end returns {"sent" or "got": [timestamps of the latency phase], "first"/"last": the
# throughput phase's first hand-over / last check, "bad": frames whose word was wrong}.

def eglcuda_producer(conn, width, height, latency_frames, throughput_frames, socket_path):
    import eglcuda

    cuda = Cuda(GPU["producer"])
    with eglcuda.Display.for_cuda_device(GPU["producer"]) as display:
        stream = eglcuda.receive_stream(display, socket_path, timeout=60)
        producer = stream.connect_cuda_producer(width, height, device=GPU["producer"])
        free = [producer.allocate_frame() for _ in range(SLOTS)]
        size = free[0].pitch * height

        def take():
            while not free:
                back = producer.return_frame(timeout_us=2_000_000)
                if back is not None:
                    free.append(back)
            return free.pop()

        sent = []
        for i in range(WARMUP + latency_frames):
            frame = take()
            cuda.fill(frame.planes[0].pointer, size, i)
            cuda.sync()
            sent.append(now())
            producer.present(frame)
            conn.recv()
            back = producer.return_frame(0)
            if back is not None:
                free.append(back)
        first = None
        steps: dict[str, list[float]] = {"present": [], "return_frame": [], "fill": []}
        for i in range(throughput_frames):
            started = now()
            frame = take()
            returned = now()
            if FILL:
                cuda.fill(frame.planes[0].pointer, size, WARMUP + latency_frames + i)
            filled = now()
            first = first or filled
            producer.present(frame, cuda_stream=cuda.stream)
            steps["present"].append(now() - filled)
            steps["return_frame"].append(returned - started)
            steps["fill"].append(filled - returned)
        conn.recv()  # the consumer is done: the stream may go
        stream.close()
    return {"sent": sent[WARMUP:], "first": first,
            "calls_us": {k: 1e6 * sum(v) / throughput_frames for k, v in steps.items()},
            "calls_p50_us": {k: 1e6 * statistics.median(v) for k, v in steps.items()}}


def eglcuda_consumer(conn, width, height, latency_frames, throughput_frames, socket_path):
    import eglcuda

    cuda = Cuda(GPU["consumer"], "consumer")
    with eglcuda.Display.for_cuda_device(GPU["consumer"]) as display:
        stream = display.create_stream(fifo_length=FIFO, cross_process=True)
        consumer = stream.connect_cuda_consumer(cuda_stream=int(cuda.stream), frame_numbers=NUMBERS)
        eglcuda.serve_stream(stream, socket_path, timeout=60)
        got, bad = [], 0
        for i in range(WARMUP + latency_frames):
            frame = consumer.acquire(timeout_us=10_000_000)
            cuda.sync()
            got.append(now())
            plane = frame.planes[0]
            bad += cuda.word_at(plane.pointer, i, plane.pitch * height) != i
            frame.release()
            conn.send(None)
        steps: dict[str, list[float]] = {"acquire": [], "check": [], "release": []}
        if CHECK in ("sync-first", "split"):
            steps.update({"plane": [], "copy": [], "sync": []} if CHECK == "split" else {"sync": []})
        for i in range(WARMUP + latency_frames, WARMUP + latency_frames + throughput_frames):
            t0 = now()
            frame = consumer.acquire(timeout_us=10_000_000)
            t1 = now()
            if CHECK == "sync-first":
                cuda.sync()
                t_synced = now()
                steps["sync"].append(t_synced - t1)
                t1 = t_synced
            if CHECK == "split":
                plane = frame.planes[0]
                pointer, size = plane.pointer, plane.pitch * height
                t_plane = now()
                offset = (i * 2654435761 % (size // 4)) * 4
                cuda.check(cuda.cu.cuMemcpyDtoHAsync(cuda.word_address, pointer + offset, 4, cuda.stream))
                t_copy = now()
                cuda.sync()
                bad += int(cuda.word[0]) != i
                steps["plane"].append(t_plane - t1)
                steps["copy"].append(t_copy - t_plane)
                steps["sync"].append(now() - t_copy)
            elif CHECK != "none":
                plane = frame.planes[0]
                bad += cuda.word_at(plane.pointer, i, plane.pitch * height) != i
            t2 = now()
            frame.release()
            t3 = now()
            steps["acquire"].append(t1 - t0)
            steps["check"].append(t2 - t1)
            steps["release"].append(t3 - t2)
        last = now()
        conn.send(None)
        stream.close()
    return {"got": got[WARMUP:], "last": last, "bad": bad,
            "calls_us": {k: 1e6 * sum(v) / throughput_frames for k, v in steps.items()},
            "calls_p50_us": {k: 1e6 * statistics.median(v) for k, v in steps.items()}}


def ipc_producer(conn, width, height, latency_frames, throughput_frames, socket_path):
    cuda, cu = Cuda(GPU["producer"]), driver()
    size = width * 4 * height
    buffers = [cuda.alloc(size) for _ in range(SLOTS)]
    flags = cu.CUevent_flags.CU_EVENT_INTERPROCESS | cu.CUevent_flags.CU_EVENT_DISABLE_TIMING
    events = [cuda.check(cu.cuEventCreate(int(flags))) for _ in range(SLOTS)]
    conn.send([(bytes(cuda.check(cu.cuIpcGetMemHandle(b)).reserved), bytes(cuda.check(cu.cuIpcGetEventHandle(e)).reserved))
               for b, e in zip(buffers, events)])
    conn.recv()  # the consumer opened them
    sent = []
    for i in range(WARMUP + latency_frames):
        slot = i % SLOTS
        cuda.fill(buffers[slot], size, i)
        cuda.sync()
        sent.append(now())
        cuda.check(cu.cuEventRecord(events[slot], cuda.stream))
        conn.send((slot, i))
        conn.recv()
    free = list(range(SLOTS))
    first = None
    for i in range(WARMUP + latency_frames, WARMUP + latency_frames + throughput_frames):
        while conn.poll() or not free:
            free.append(conn.recv())
        slot = free.pop(0)
        cuda.fill(buffers[slot], size, i)
        first = first or now()
        cuda.check(cu.cuEventRecord(events[slot], cuda.stream))
        conn.send((slot, i))
    while conn.recv() is not None:  # slots coming back, then the consumer's done
        pass
    cuda.sync()
    for b, e in zip(buffers, events):
        cu.cuEventDestroy(e)
        cu.cuMemFree(b)
    return {"sent": sent[WARMUP:], "first": first}


def ipc_consumer(conn, width, height, latency_frames, throughput_frames, socket_path):
    cuda, cu = Cuda(GPU["consumer"], "consumer"), driver()
    size = width * 4 * height
    buffers, events = [], []
    for mem_bytes, event_bytes in conn.recv():  # opened once, used for every frame
        mem = cu.CUipcMemHandle()
        mem.reserved = mem_bytes
        buffers.append(int(cuda.check(cu.cuIpcOpenMemHandle(mem, 1))))  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
        event = cu.CUipcEventHandle()
        event.reserved = event_bytes
        events.append(cuda.check(cu.cuIpcOpenEventHandle(event)))
    conn.send(None)
    got, bad = [], 0
    for _ in range(WARMUP + latency_frames):
        slot, i = conn.recv()
        cuda.check(cu.cuStreamWaitEvent(cuda.stream, events[slot], 0))
        cuda.sync()
        got.append(now())
        bad += cuda.word_at(buffers[slot], i, size) != i
        conn.send(None)
    for _ in range(throughput_frames):
        slot, i = conn.recv()
        cuda.check(cu.cuStreamWaitEvent(cuda.stream, events[slot], 0))
        bad += cuda.word_at(buffers[slot], i, size) != i
        conn.send(slot)
    last = now()
    conn.send(None)
    for b in buffers:
        cu.cuIpcCloseMemHandle(b)
    return {"got": got[WARMUP:], "last": last, "bad": bad}


def _register(cuda, view: np.ndarray) -> bool:
    """Pin shared memory for fast copies where the driver allows it."""
    result = cuda.cu.cuMemHostRegister(view.ctypes.data, view.nbytes, 1)  # CU_MEMHOSTREGISTER_PORTABLE
    return result[0] == cuda.ok


def shm_producer(conn, width, height, latency_frames, throughput_frames, socket_path):
    from multiprocessing import shared_memory

    cuda, cu = Cuda(GPU["producer"]), driver()
    size = width * 4 * height
    shm = shared_memory.SharedMemory(create=True, size=size * SLOTS)
    host = np.ndarray((SLOTS, size), np.uint8, buffer=shm.buf)
    pinned = _register(cuda, host)
    source = cuda.alloc(size)
    conn.send(shm.name)
    conn.recv()
    sent = []
    for i in range(WARMUP + latency_frames):
        slot = i % SLOTS
        cuda.fill(source, size, i)
        cuda.sync()
        sent.append(now())
        cuda.check(cu.cuMemcpyDtoHAsync(host[slot].ctypes.data, source, size, cuda.stream))
        cuda.sync()
        conn.send((slot, i))
        conn.recv()
    free = list(range(SLOTS))
    first = None
    for i in range(WARMUP + latency_frames, WARMUP + latency_frames + throughput_frames):
        while conn.poll() or not free:
            free.append(conn.recv())
        slot = free.pop(0)
        cuda.fill(source, size, i)
        first = first or now()
        cuda.check(cu.cuMemcpyDtoHAsync(host[slot].ctypes.data, source, size, cuda.stream))
        cuda.sync()
        conn.send((slot, i))
    while conn.recv() is not None:
        pass
    if pinned:
        cu.cuMemHostUnregister(host.ctypes.data)
    del host
    shm.close()
    shm.unlink()
    cu.cuMemFree(source)
    return {"sent": sent[WARMUP:], "first": first, "pinned": pinned}


def shm_consumer(conn, width, height, latency_frames, throughput_frames, socket_path):
    from multiprocessing import shared_memory

    cuda, cu = Cuda(GPU["consumer"], "consumer"), driver()
    size = width * 4 * height
    shm = shared_memory.SharedMemory(name=conn.recv())
    host = np.ndarray((SLOTS, size), np.uint8, buffer=shm.buf)
    pinned = _register(cuda, host)
    target = cuda.alloc(size)
    conn.send(None)
    got, bad = [], 0
    for _ in range(WARMUP + latency_frames):
        slot, i = conn.recv()
        cuda.check(cu.cuMemcpyHtoDAsync(target, host[slot].ctypes.data, size, cuda.stream))
        cuda.sync()
        got.append(now())
        bad += cuda.word_at(target, i, size) != i
        conn.send(None)
    for _ in range(throughput_frames):
        slot, i = conn.recv()
        cuda.check(cu.cuMemcpyHtoDAsync(target, host[slot].ctypes.data, size, cuda.stream))
        bad += cuda.word_at(target, i, size) != i  # synchronizes: the slot may go back
        conn.send(slot)
    last = now()
    conn.send(None)
    if pinned:
        cu.cuMemHostUnregister(host.ctypes.data)
    del host
    shm.close()
    cu.cuMemFree(target)
    return {"got": got[WARMUP:], "last": last, "bad": bad, "pinned": pinned}


ENDS = {"eglcuda": (eglcuda_producer, eglcuda_consumer), "cuda-ipc": (ipc_producer, ipc_consumer),
        "shm": (shm_producer, shm_consumer)}


def _end(role, transport, conn, results, *args):
    try:
        function = ENDS[transport][0 if role == "producer" else 1]
        result = function(conn, *args)
        from eglcuda import mps  # after the run: CUDA is up in this process by now
        result["mps"] = mps.under_mps(GPU[role])[0]
        results.put((role, result))
    except BaseException as exc:  # noqa: BLE001 - reported by the parent, in one line
        results.put((role, {"error": one_line(exc)}))


def run_pair(transport: str, width: int, height: int, latency_frames: int, throughput_frames: int) -> dict:
    spawn = mp.get_context("spawn")
    producer_conn, consumer_conn = spawn.Pipe()
    results = spawn.Queue()
    with tempfile.TemporaryDirectory(prefix="eglcuda-bench-") as folder:
        args = (width, height, latency_frames, throughput_frames, os.path.join(folder, "s"))
        ends = [spawn.Process(target=_end, args=("consumer", transport, consumer_conn, results, *args)),
                spawn.Process(target=_end, args=("producer", transport, producer_conn, results, *args))]
        for end in ends:
            end.start()
        outcome = {}
        try:
            for _ in ends:
                try:
                    role, result = results.get(timeout=300)
                except Exception:  # queue.Empty: an end neither finished nor reported
                    break
                outcome[role] = result
        finally:
            for end in ends:
                end.join(30)
                if end.is_alive():
                    end.kill()
    errors = [f"the {role} process failed: {r['error']}" for role, r in outcome.items() if "error" in r]
    errors += [f"the {role} process did not report within 300 s" for role in ("producer", "consumer")
               if role not in outcome]
    if errors:
        raise RuntimeError(f"{transport} {width}x{height}: " + "; ".join(errors))
    sent, got = outcome["producer"]["sent"], outcome["consumer"]["got"]
    latencies = sorted(1e6 * (b - a) for a, b in zip(sent, got))
    return {"transport": transport, "size": f"{width}x{height}", "bad": outcome["consumer"]["bad"],
            "latency_us": statistics.median(latencies),
            "latency_p99_us": latencies[int(0.99 * (len(latencies) - 1))],
            "fps": throughput_frames / (outcome["consumer"]["last"] - outcome["producer"]["first"]),
            "pinned": outcome["consumer"].get("pinned"),
            "mps": (outcome["producer"].get("mps"), outcome["consumer"].get("mps")),
            "calls_us": {**outcome["producer"].get("calls_us", {}), **outcome["consumer"].get("calls_us", {})},
            "calls_p50_us": {**outcome["producer"].get("calls_p50_us", {}),
                             **outcome["consumer"].get("calls_p50_us", {})}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer frames (the GPU check's setting)")
    parser.add_argument("--markdown", help="write the markdown table to this file")
    parser.add_argument("--transports", default=",".join(TRANSPORTS), help="comma-separated subset")
    parser.add_argument("--sizes", default=",".join(f"{w}x{h}" for w, h in SIZES), help="e.g. 1920x1080")
    parser.add_argument("--mps", action="store_true",
                        help="run the processes under CUDA MPS (a private daemon, or the one already running)")
    args = parser.parse_args()
    output_file(parser, "--markdown", args.markdown)
    listed(parser, "--transports", args.transports, f"transports from {','.join(TRANSPORTS)}", choices=TRANSPORTS)
    listed(parser, "--sizes", args.sizes, "WIDTHxHEIGHT sizes, e.g. 1920x1080", size)
    if CHECK not in CHECKS:
        print(f"{PROGRAM}: EGLCUDA_BENCH_CHECK is one of {', '.join(CHECKS)}, got {CHECK!r}", file=sys.stderr)
        return 2
    if STREAM not in STREAMS:
        print(f"{PROGRAM}: EGLCUDA_BENCH_STREAM is one of {', '.join(STREAMS)}, got {STREAM!r}", file=sys.stderr)
        return 2
    if not FILL and CHECK != "none":
        print(f"{PROGRAM}: EGLCUDA_BENCH_FILL=0 leaves the frames unwritten: set EGLCUDA_BENCH_CHECK=none",
              file=sys.stderr)
        return 2
    require(PROGRAM)  # eglcuda itself, before the MPS session uses it
    from eglcuda import mps

    with mps.session(args.mps, children_only=True, quiet=True) as daemon:  # spawned children inherit it
        require(PROGRAM, "cross-process", modules=[CUDA_PYTHON])
        if daemon is not None:  # only now: what is missing is the one line
            print(f"MPS: {daemon.describe()}", file=sys.stderr, flush=True)
        return run_all(args)


MPS_WORDS = {(True, True): "on", (False, False): "off"}  # (producer, consumer) as the driver reports them


def run_all(args: argparse.Namespace) -> int:
    latency_frames, throughput_frames = (100, 200) if args.quick else (300, 600)
    transports = args.transports.split(",")
    import eglcuda

    ipc, why = eglcuda.available("cuda-ipc", reason=True)
    if "cuda-ipc" in transports and not ipc:
        print(f"leaving out the cuda-ipc transport: {why}")
        transports.remove("cuda-ipc")
    sizes = [tuple(int(v) for v in size.split("x")) for size in args.sizes.split(",")]
    if transports != TRANSPORTS or sizes != SIZES:
        args.markdown = None  # the table and summary need every cell
    rows = []
    for width, height in sizes:
        for transport in transports:
            row = run_pair(transport, width, height, latency_frames, throughput_frames)
            rows.append(row)
            print(f"{row['size']:>10} {transport:<9} latency median {row['latency_us']:9.1f} us  p99 "
                  f"{row['latency_p99_us']:9.1f} us  {row['fps']:8.1f} frames/s  bad frames {row['bad']}"
                  + (f"  (host memory {'pinned' if row['pinned'] else 'pageable'})" if transport == "shm" else "")
                  + f"  MPS {MPS_WORDS.get(row['mps'], row['mps'])}",
                  flush=True)
            if transport == "eglcuda":
                print("           eglcuda us/frame in each call: "
                      + ", ".join(f"{k} {v:.1f}" for k, v in row["calls_us"].items()), flush=True)
                print("           median us: "
                      + ", ".join(f"{k} {v:.1f}" for k, v in row["calls_p50_us"].items()), flush=True)
    if transports != TRANSPORTS or sizes != SIZES:
        return 1 if sum(r["bad"] for r in rows) else 0
    lines = [f"Cross-process, ARGB, {latency_frames} paced frames for latency (after {WARMUP} warm-up), "
             f"{throughput_frames} free-running frames for throughput, {SLOTS} buffers; one run, both processes "
             "spawned per transport and size."
             + (" Both processes under CUDA MPS." if all(r["mps"] == (True, True) for r in rows) else
                " Not under CUDA MPS." if all(r["mps"] == (False, False) for r in rows) else
                f" CUDA MPS per pair (producer, consumer): {[r['mps'] for r in rows]}."), "",
             "| size | transport | latency median (us) | p99 (us) | latency / eglcuda | frames/s | eglcuda fps / this |",
             "|---|---|---:|---:|---:|---:|---:|"]
    worst = {}
    for row in rows:
        base = next(r for r in rows if r["size"] == row["size"] and r["transport"] == "eglcuda")
        ratio, fps_ratio = row["latency_us"] / base["latency_us"], base["fps"] / row["fps"]
        worst[(row["size"], row["transport"])] = ratio
        lines.append(f"| {row['size']} | {row['transport']} | {row['latency_us']:.1f} | {row['latency_p99_us']:.1f} | "
                     f"{ratio:.2f}x | {row['fps']:.1f} | {fps_ratio:.2f}x |")
    lines += ["", "Where eglcuda's free-running frame goes, us per frame, wall time in each call (the producer "
              "and the consumer run at once, so the two sides overlap):", "",
              "| size | producer present | producer return_frame (waits for a free frame) | consumer acquire "
              "(waits for a frame) | consumer 4-byte check | consumer release |", "|---|---:|---:|---:|---:|---:|"]
    for row in rows:
        if row["transport"] == "eglcuda":
            c = row["calls_us"]
            lines.append(f"| {row['size']} | {c['present']:.1f} | {c['return_frame']:.1f} | {c['acquire']:.1f} | "
                         f"{c['check']:.1f} | {c['release']:.1f} |")
    table = "\n".join(lines)
    print("\n" + table)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(table + "\n")
    bad = sum(r["bad"] for r in rows)
    print(f"SUMMARY 4K latency shm/eglcuda x{worst[('3840x2160', 'shm')]:.1f}, "
          f"cuda-ipc/eglcuda x{worst[('3840x2160', 'cuda-ipc')]:.2f}; 1080p cuda-ipc/eglcuda "
          f"x{worst[('1920x1080', 'cuda-ipc')]:.2f}; bad frames {bad}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
