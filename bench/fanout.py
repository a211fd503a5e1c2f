"""Fan-out between processes: one producer process hands the same frame to N consumer processes.

Per case (1920x1080 NV12, 3840x2160 ARGB) and number of consumers (1, 2, 4, 8), all spawned
processes (never forked), on one GPU:

- eglcuda: each consumer process creates its own stream (``cross_process=True``, FIFO 4),
  connects its CUDA consumer and serves the stream (``eglcuda.serve_stream``); the producer process
  receives every stream (``eglcuda.receive_stream``), connects one ``CudaProducer`` to each, and
  each round presents the SAME frame (from a ring of 6) on every stream. A frame is used again
  once every stream has given it back (``return_frame``).
- CUDA IPC (cuda-python): the producer's ring of 6 device buffers and 6 interprocess events are
  opened once by each consumer process (``cuIpcOpenMemHandle``, ``cuIpcOpenEventHandle``); per
  round the producer records the slot's event and sends the slot number to every consumer over its
  pipe; a consumer waits on the event in its CUDA stream and sends the slot back. The producer
  reuses a slot only when all N consumers sent it back.

Each round the producer writes the round's number into the first 64 KiB of the frame (a
``cuMemsetD32Async`` on its CUDA stream, before the hand-over); every consumer checks one word of
it per frame (a 4-byte copy to the host on its CUDA stream, after the frame is ordered there), as
bench/cross_process.py does. A wrong word counts as a bad frame.

- rounds/s: a round is one frame handed to all N consumers and taken (acquired + checked +
  released, or received + checked + sent back) by all N; counted from the first consumer's start
  of the first measured round to the last consumer's end of the last one (after a warm-up of
  rounds/10 + 2 rounds, as bench/c/cross_gpu.c's fanout mode counts).
- latency: per consumer, from a CLOCK_MONOTONIC stamp just before the hand-over to that consumer
  (its present; the event record and pipe send) to the consumer holding the frame (acquire
  returned; slot received and the wait queued on its stream); free-running, so it includes the
  time a frame waits in the FIFO. p50/p99 over every consumer's frames and per consumer.

    python bench/fanout.py [--quick] [--consumers 1,2,4,8] [--cases 1920x1080:NV12,3840x2160:ARGB]
                           [--transports eglcuda,cuda-ipc] [--rounds N] [--mps] [--json FILE]

``run_fanout(transport, width, height, fmt, consumers, rounds)`` is what bench/mps.py calls.
Needs an NVIDIA GPU with EGL streams between processes, and cuda-python. A process that fails
says why in one line, which the parent reports (one line per process).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _script import CUDA_PYTHON, at_least, listed, one_line, output_file, require, run, size  # noqa: E402
from cross_process import Cuda as PairCuda, driver  # noqa: E402

PROGRAM = "bench/fanout.py"
CASES = [(1920, 1080, "NV12"), (3840, 2160, "ARGB")]
CONSUMERS = [1, 2, 4, 8]
TRANSPORTS = ["eglcuda", "cuda-ipc"]
FIFO = 4
POOL = 6  # the producer's ring: FIFO 4 + the frame a consumer holds + the one the stream keeps
REGION_WORDS = 16384  # what the producer writes each round: 64 KiB of plane 0 (less in a smaller plane)
GPU = int(os.environ.get("EGLCUDA_BENCH_GPU", "0"))  # an environment variable: spawned children see it
FIRST_ACQUIRE_US = 120_000_000  # the producer connects the streams one after the other
ACQUIRE_US = 10_000_000
RETURN_S = 10.0  # a frame that does not come back from every consumer within this is an error


def rounds_for(consumers: int, quick: bool) -> int:
    """Measured rounds per cell: a round costs about N times more with N consumers."""
    table = {1: 1000, 2: 1000, 4: 600, 8: 300} if quick else {1: 4000, 2: 3000, 4: 2000, 8: 1200}
    return table.get(consumers, max(300, (4000 if not quick else 1000) // consumers))


def warmup_for(rounds: int) -> int:
    return rounds // 10 + 2  # as bench/c/cross_gpu.c


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def frame_bytes(width: int, height: int, fmt: str) -> int:
    return width * height * 3 // 2 if fmt.upper() == "NV12" else width * height * 4


def region_words(width: int, height: int, fmt: str) -> int:
    """How many words of plane 0 the producer writes each round: 64 KiB, or plane 0's pixel rows
    when they hold less (row padding aside, plane 0 has at least width x height x bytes/pixel)."""
    return max(1, min(REGION_WORDS, width * height * (1 if fmt.upper() == "NV12" else 4) // 4))


def word_index(number: int, words: int) -> int:
    """Which of the producer's words a consumer checks for round `number`."""
    return number * 2654435761 % words


class Cuda(PairCuda):
    """bench/cross_process.py's driver calls, and the per-round write and check of the fan-out."""

    def __init__(self, ordinal: int = 0) -> None:
        super().__init__(ordinal)
        self.handle = int(self.stream)
        self.word_address = self.word.ctypes.data

    def stamp(self, pointer: int, number: int, words: int) -> None:
        """The producer's per-round write: `words` words of `number` at `pointer`."""
        self.check(self.cu.cuMemsetD32Async(pointer, number, words, self.stream))

    def read(self, pointer: int, number: int, words: int) -> int:
        """The word a consumer checks for round `number`, read after its stream's earlier work."""
        self.check(self.cu.cuMemcpyDtoHAsync(self.word_address, pointer + 4 * word_index(number, words), 4,
                                             self.stream))
        self.check(self.cu.cuStreamSynchronize(self.stream))
        return int(self.word[0])


# ---- eglcuda ----------------------------------------------------------------------------------------

def eglcuda_producer(conns, paths, width, height, fmt, rounds, warmup):
    import eglcuda

    total = warmup + rounds
    n = len(conns)
    words = region_words(width, height, fmt)
    cuda = Cuda(GPU)
    stamps = [[0.0] * total for _ in range(n)]
    spent = {"present": 0.0, "take": 0.0, "fill": 0.0}
    with eglcuda.Display.for_cuda_device(GPU) as display:
        streams, producers = [], []
        try:
            for path in paths:  # in order: each consumer serves its own stream
                stream = eglcuda.receive_stream(display, path, timeout=120)
                streams.append(stream)
                producers.append(stream.connect_cuda_producer(width, height, device=GPU, format=fmt))
            pool = [producers[0].allocate_frame() for _ in range(POOL)]
            pointer = [frame.planes[0].pointer for frame in pool]
            index = {id(frame): i for i, frame in enumerate(pool)}
            holders: list[set[int]] = [set() for _ in pool]  # the streams that still hold each frame
            presented = [-1] * POOL  # the round each frame was last presented in
            free = list(range(POOL))

            def give_back(c: int, frame) -> None:
                i = index[id(frame)]
                if c not in holders[i]:
                    raise RuntimeError(f"consumer {c}'s stream gave back frame {i}, which it did not hold")
                holders[i].discard(c)
                if not holders[i]:
                    free.append(i)

            def take() -> int:
                # A return with nothing to give back waits about a millisecond inside the driver
                # (csrc/helpers.c): ask only the streams that hold the oldest frame out, one at a
                # time. Each stream gives its frames back in the order they were presented, so
                # that is the frame each of them returns next (as bench/c/cross_gpu.c's fanout).
                deadline = now() + RETURN_S
                while not free:
                    i = min((i for i in range(POOL) if holders[i]), key=lambda i: presented[i])
                    c = min(holders[i])
                    back = producers[c].return_frame(timeout_us=1_000_000)
                    if back is not None:
                        give_back(c, back)
                    elif now() > deadline:
                        raise RuntimeError(f"frame {i} did not come back from consumer {c} within {RETURN_S:g} s")
                return free.pop(0)

            stream_handle = cuda.handle
            for number in range(total):
                t0 = now()
                i = take()
                t1 = now()
                cuda.stamp(pointer[i], number, words)
                frame = pool[i]
                holders[i] = set(range(n))
                presented[i] = number
                t2 = now()
                for c, producer in enumerate(producers):
                    stamps[c][number] = now()
                    producer.present(frame, cuda_stream=stream_handle)
                if number >= warmup:
                    spent["take"] += t1 - t0
                    spent["fill"] += t2 - t1
                    spent["present"] += now() - t2
            for conn in conns:  # every consumer has every frame: the streams may go
                if conn.recv() != "done":
                    raise RuntimeError("a consumer sent something else than 'done'")
        finally:
            for stream in streams:
                stream.close()
    for conn in conns:
        conn.send("bye")
    return {"stamps": stamps,
            "calls_us": {"present": 1e6 * spent["present"] / (rounds * n), "take": 1e6 * spent["take"] / rounds,
                         "fill": 1e6 * spent["fill"] / rounds}}


def eglcuda_consumer(c, conn, path, width, height, fmt, rounds, warmup):
    import eglcuda

    total = warmup + rounds
    words = region_words(width, height, fmt)
    cuda = Cuda(GPU)
    got = [0.0] * total
    bad = 0
    spent = {"acquire": 0.0, "check": 0.0, "release": 0.0}
    with eglcuda.Display.for_cuda_device(GPU) as display:
        stream = display.create_stream(fifo_length=FIFO, cross_process=True)
        try:
            consumer = stream.connect_cuda_consumer(cuda_stream=cuda.handle)
            eglcuda.serve_stream(stream, path, timeout=120)
            start = now()
            for number in range(total):
                if number == warmup:
                    start = now()
                t0 = now()
                frame = consumer.acquire(timeout_us=FIRST_ACQUIRE_US if number == 0 else ACQUIRE_US)
                t1 = got[number] = now()
                bad += cuda.read(frame.planes[0].pointer, number, words) != number
                t2 = now()
                frame.release()
                if number >= warmup:
                    spent["acquire"] += t1 - t0
                    spent["check"] += t2 - t1
                    spent["release"] += now() - t2
            end = now()
            conn.send("done")
            if conn.recv() != "bye":  # the producer has closed its end of every stream
                raise RuntimeError("the producer sent something else than 'bye'")
        finally:
            stream.close()
    return {"got": got, "start": start, "end": end, "bad": bad,
            "calls_us": {k: 1e6 * v / rounds for k, v in spent.items()}}


# ---- CUDA IPC ----------------------------------------------------------------------------------------

def ipc_producer(conns, paths, width, height, fmt, rounds, warmup):
    from multiprocessing.connection import wait

    total = warmup + rounds
    n = len(conns)
    words = region_words(width, height, fmt)
    cuda, cu = Cuda(GPU), driver()
    size = frame_bytes(width, height, fmt)
    buffers = [cuda.alloc(size) for _ in range(POOL)]
    flags = int(cu.CUevent_flags.CU_EVENT_INTERPROCESS | cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)
    events = [cuda.check(cu.cuEventCreate(flags)) for _ in range(POOL)]
    try:
        handles = [(bytes(cuda.check(cu.cuIpcGetMemHandle(b)).reserved),
                    bytes(cuda.check(cu.cuIpcGetEventHandle(e)).reserved)) for b, e in zip(buffers, events)]
        for conn in conns:
            conn.send(handles)
        for conn in conns:  # each consumer opened them
            if conn.recv() != "opened":
                raise RuntimeError("a consumer did not open the buffers")
        stamps = [[0.0] * total for _ in range(n)]
        holders = [0] * POOL  # consumers that have not sent the slot back yet
        free = list(range(POOL))
        done = 0
        spent = {"send": 0.0, "take": 0.0}

        def collect(timeout: float | None) -> bool:
            nonlocal done
            ready = wait(conns, timeout)
            for conn in ready:
                slot = conn.recv()
                if slot is None:  # that consumer is done
                    done += 1
                    continue
                holders[slot] -= 1
                if holders[slot] == 0:
                    free.append(slot)
            return bool(ready)

        for number in range(total):
            t0 = now()
            while not free:
                if not collect(RETURN_S):
                    raise RuntimeError(f"no slot came back from every consumer within {RETURN_S:g} s")
            slot = free.pop(0)
            t1 = now()
            cuda.stamp(buffers[slot], number, words)
            holders[slot] = n
            stamps[0][number] = now()
            cuda.check(cu.cuEventRecord(events[slot], cuda.stream))
            message = (slot, number)
            for c, conn in enumerate(conns):
                if c:
                    stamps[c][number] = now()
                conn.send(message)
            if number >= warmup:
                spent["take"] += t1 - t0
                spent["send"] += now() - t1
        deadline = now() + 120
        while done < n:  # the slots still coming back, then each consumer's end
            if not collect(max(0.0, deadline - now())) and now() > deadline:
                raise RuntimeError(f"{n - done} consumer(s) did not finish within 120 s")
        cuda.sync()
    finally:
        for event in events:
            cu.cuEventDestroy(event)
        for buffer in buffers:
            cu.cuMemFree(buffer)
    return {"stamps": stamps,
            "calls_us": {"record_and_send": 1e6 * spent["send"] / rounds, "take": 1e6 * spent["take"] / rounds}}


def ipc_consumer(c, conn, path, width, height, fmt, rounds, warmup):
    total = warmup + rounds
    words = region_words(width, height, fmt)
    cuda, cu = Cuda(GPU), driver()
    buffers, events = [], []
    try:
        for mem_bytes, event_bytes in conn.recv():  # opened once, used for every round
            mem = cu.CUipcMemHandle()
            mem.reserved = mem_bytes
            buffers.append(int(cuda.check(cu.cuIpcOpenMemHandle(mem, 1))))  # CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
            event = cu.CUipcEventHandle()
            event.reserved = event_bytes
            events.append(cuda.check(cu.cuIpcOpenEventHandle(event)))
        conn.send("opened")
        got = [0.0] * total
        bad = 0
        start = now()
        spent = {"receive": 0.0, "check": 0.0, "send_back": 0.0}
        for expected in range(total):
            if expected == warmup:
                start = now()
            t0 = now()
            slot, number = conn.recv()
            cuda.check(cu.cuStreamWaitEvent(cuda.stream, events[slot], 0))
            t1 = got[expected] = now()
            bad += number != expected or cuda.read(buffers[slot], number, words) != number
            t2 = now()
            conn.send(slot)
            if expected >= warmup:
                spent["receive"] += t1 - t0
                spent["check"] += t2 - t1
                spent["send_back"] += now() - t2
        end = now()
    finally:
        for buffer in buffers:
            cu.cuIpcCloseMemHandle(buffer)
        for event in events:
            cu.cuEventDestroy(event)
    conn.send(None)  # after closing: the producer may free its buffers now
    return {"got": got, "start": start, "end": end, "bad": bad,
            "calls_us": {k: 1e6 * v / rounds for k, v in spent.items()}}


ENDS = {"eglcuda": (eglcuda_producer, eglcuda_consumer), "cuda-ipc": (ipc_producer, ipc_consumer)}


# ---- the parent ----------------------------------------------------------------------------------------

class ChildFailure(RuntimeError):
    """Processes of one run that failed: one line each in ``lines``."""

    def __init__(self, what: str, lines: list[str]) -> None:
        self.lines = [f"{what}: {line}" for line in lines]
        super().__init__("; ".join(self.lines))


def _end(role, transport, side, results, *args):
    """A spawned process: run one end, report (role, result or one-line error) to the parent."""
    try:
        function = ENDS[transport][0 if side == "producer" else 1]
        result = function(*args)
        try:
            from eglcuda import mps  # after the run: CUDA is up in this process by now

            result["mps"] = mps.under_mps(GPU)[0]
        except Exception:  # noqa: BLE001 - advice only
            result["mps"] = None
        results.put((role, result))
    except BaseException as exc:  # noqa: BLE001 - reported by the parent, in one line
        results.put((role, {"error": one_line(exc)}))


def collect(processes: dict, results, timeout: float, grace: float = 3.0) -> tuple[dict, list[str]]:
    """Each process's result; the errors as one line each. Stops waiting `grace` seconds after
    the first failure (the others may be blocked on the one that failed) and kills what is left."""
    outcome: dict = {}
    errors: list[str] = []
    deadline = time.monotonic() + timeout
    stop_at = None
    dead_since: dict[str, float] = {}
    try:
        while len(outcome) < len(processes):
            moment = time.monotonic()
            if moment > deadline or (stop_at is not None and moment > stop_at):
                break
            try:
                role, result = results.get(timeout=0.2)
            except queue.Empty:
                for role, process in processes.items():
                    if role in outcome or process.exitcode is None:
                        continue
                    # Its result may still be on its way through the queue: give it a moment.
                    first = dead_since.setdefault(role, moment)
                    if moment - first > 2.0:
                        outcome[role] = {"error": f"the process exited with status {process.exitcode} without "
                                                  "reporting"}
                        stop_at = stop_at or moment + grace
                continue
            outcome[role] = result
            if "error" in result and stop_at is None:
                stop_at = time.monotonic() + grace
    finally:
        # After a clean run each process is tearing down its CUDA context: let it finish.
        patience = time.monotonic() + (20.0 if stop_at is None and len(outcome) == len(processes) else 0.5)
        for process in processes.values():
            process.join(max(0.0, patience - time.monotonic()))
        for process in processes.values():
            if process.is_alive():
                process.kill()  # one of ours, spawned for this run
                process.join(5)
    for role in processes:
        if role not in outcome:
            if stop_at is None:
                errors.append(f"{role}: did not report within {timeout:g} s")
            # else: stopped waiting after another process failed; that one's line says why
        elif "error" in outcome[role]:
            errors.append(f"{role}: {outcome[role]['error']}")
    return outcome, errors


def run_fanout(transport: str, width: int, height: int, fmt: str, consumers: int, rounds: int,
               timeout: float = 300.0) -> dict:
    """One cell: spawns the producer and `consumers` consumer processes, returns the figures.
    Raises ChildFailure (one line per failed process)."""
    fmt = fmt.upper()
    warmup = warmup_for(rounds)
    what = f"{transport} fan-out {width}x{height} {fmt}, {consumers} consumer(s)"
    spawn = mp.get_context("spawn")
    results = spawn.Queue()
    with tempfile.TemporaryDirectory(prefix="eglcuda-fanout-") as folder:
        pipes = [spawn.Pipe() for _ in range(consumers)]
        paths = [os.path.join(folder, f"s{c}") for c in range(consumers)]
        common = (width, height, fmt, rounds, warmup)
        processes = {f"consumer {c}": spawn.Process(
            target=_end, args=(f"consumer {c}", transport, "consumer", results, c, pipes[c][1], paths[c], *common))
            for c in range(consumers)}
        processes["producer"] = spawn.Process(
            target=_end, args=("producer", transport, "producer", results, [p[0] for p in pipes], paths, *common))
        for process in processes.values():
            process.start()
        outcome, errors = collect(processes, results, timeout)
        for a, b in pipes:
            a.close()
            b.close()
    if errors:
        raise ChildFailure(what, errors)
    stamps = outcome["producer"]["stamps"]
    per_consumer, pooled = [], []
    for c in range(consumers):
        got = outcome[f"consumer {c}"]["got"]
        latencies = sorted(1e6 * (g - s) for s, g in zip(stamps[c][warmup:], got[warmup:]))
        pooled += latencies
        per_consumer.append({"latency_p50_us": statistics.median(latencies),
                             "latency_p99_us": percentile(latencies, 0.99)})
    pooled.sort()
    ends = [outcome[f"consumer {c}"] for c in range(consumers)]
    seconds = max(e["end"] for e in ends) - min(e["start"] for e in ends)
    calls = dict(outcome["producer"].get("calls_us", {}))
    for key in ends[0].get("calls_us", {}):
        calls[key] = statistics.mean(e["calls_us"][key] for e in ends)
    mps_flags = [outcome[role].get("mps") for role in processes]
    return {"transport": transport, "size": f"{width}x{height}", "format": fmt, "consumers": consumers,
            "rounds": rounds, "rounds_per_s": rounds / seconds, "frames_per_s": rounds * consumers / seconds,
            "latency_p50_us": statistics.median(pooled), "latency_p99_us": percentile(pooled, 0.99),
            "per_consumer": per_consumer, "bad": sum(e["bad"] for e in ends), "calls_us": calls,
            "mps": True if all(f is True for f in mps_flags) else False if all(f is False for f in mps_flags)
            else mps_flags}


def percentile(ordered: list[float], q: float) -> float:
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1)))]


# ---- command line ----------------------------------------------------------------------------------------

def parse_case(text: str) -> tuple[int, int, str]:
    """``WIDTHxHEIGHT[:FORMAT]``: NV12 (an even width and height) or ARGB (when left out); ValueError
    otherwise."""
    dimensions, _, fmt = text.partition(":")
    width, height = size(dimensions)
    fmt = (fmt or "ARGB").upper()
    if fmt not in ("NV12", "ARGB") or (fmt == "NV12" and (width % 2 or height % 2)):
        raise ValueError(text)
    return width, height, fmt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds")
    parser.add_argument("--consumers", default=",".join(map(str, CONSUMERS)), help="e.g. 1,2,4,8")
    parser.add_argument("--cases", default=",".join(f"{w}x{h}:{f}" for w, h, f in CASES),
                        help="WIDTHxHEIGHT:FORMAT,... (NV12 or ARGB)")
    parser.add_argument("--transports", default=",".join(TRANSPORTS), help="comma-separated subset")
    parser.add_argument("--rounds", type=at_least(1), help="measured rounds per cell (default: by consumers)")
    parser.add_argument("--mps", action="store_true", help="run the processes under CUDA MPS (a private daemon, "
                                                           "or the one already running)")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args()
    output_file(parser, "--json", args.json)
    consumers = listed(parser, "--consumers", args.consumers, "numbers of consumers, e.g. 1,2,4,8", int, least=1)
    cases = listed(parser, "--cases", args.cases, "WIDTHxHEIGHT:FORMAT cases, NV12 (even sizes) or ARGB, "
                   "e.g. 1920x1080:NV12", parse_case)
    transports = args.transports.split(",")
    if any(t not in ENDS for t in transports):
        parser.error(f"--transports takes {', '.join(ENDS)}")
    # Probed in a child: this process never initializes CUDA, so an MPS daemon serves every process.
    require(PROGRAM, "cross-process", modules=[CUDA_PYTHON], in_child=True)
    from eglcuda import mps

    rows, failed = [], 0
    with mps.session(args.mps, children_only=True):  # spawned children inherit the environment
        for width, height, fmt in cases:
            for n in consumers:
                for transport in transports:
                    rounds = args.rounds or rounds_for(n, args.quick)
                    try:
                        row = run_fanout(transport, width, height, fmt, n, rounds)
                    except ChildFailure as exc:
                        failed += 1
                        for line in exc.lines:
                            print(f"FAILED {line}", flush=True)
                        continue
                    rows.append(row)
                    print(f"{row['size']:>9} {fmt:<4} {transport:<8} N={n}  {row['rounds_per_s']:9.0f} rounds/s  "
                          f"latency p50 {row['latency_p50_us']:8.1f} us  p99 {row['latency_p99_us']:8.1f} us  "
                          f"bad {row['bad']}  MPS {row['mps']}", flush=True)
    print()
    print("| case | transport | consumers | rounds/s | latency p50 (us) | p99 (us) | bad |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for row in rows:
        print(f"| {row['size']} {row['format']} | {row['transport']} | {row['consumers']} | {row['rounds_per_s']:.0f} | "
              f"{row['latency_p50_us']:.1f} | {row['latency_p99_us']:.1f} | {row['bad']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 1 if failed or any(r["bad"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
