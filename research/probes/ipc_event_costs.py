# Research record (see research/README.md): runs against the current package (written 2026-11-23 for the topic transport's per-frame cost).
"""What each CUDA call on the cuda-ipc topic transport's per-frame path costs on the host, between
two real processes: interprocess events recorded, queried and waited on, against ordinary events
and a stream query. A parent ("publisher") and a child ("subscriber") exchange event handles
through a pipe, then each times its calls in a tight loop (microseconds per call, median of
``--rounds`` rounds of ``--calls`` calls).

    python research/probes/ipc_event_costs.py [--calls 20000] [--rounds 5]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
from _script import require  # noqa: E402 - the benchmarks' check: one line and status 2 when something is missing

PROGRAM = "research/probes/ipc_event_costs.py"


def timed(label: str, call, calls: int, rounds: int) -> tuple[str, float]:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter_ns()
        for _ in range(calls):
            call()
        samples.append((time.perf_counter_ns() - start) / calls / 1e3)
    return label, statistics.median(samples)


def side(role: str, calls: int, rounds: int) -> None:
    from eglcuda import get_device
    from eglcuda._bind import cuda, cuda_ipc
    from eglcuda._bind._native import ffi, lib

    device = get_device(0)
    device.make_current()
    stream = cuda.stream_create()
    mine = cuda_ipc.event_create_interprocess()
    cuda_ipc.record(mine, stream)
    plain = ffi.cast("CUevent", cuda.event_create())
    raw_stream = ffi.cast("CUstream", stream)
    # Exchange handles: the parent writes first, the child answers.
    if role == "parent":
        child = subprocess.Popen([sys.executable, __file__, "--child", "--calls", str(calls), "--rounds", str(rounds)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        child.stdin.write(cuda_ipc.event_handle(mine).hex() + "\n")
        child.stdin.flush()
        theirs = cuda_ipc.open_event_handle(bytes.fromhex(child.stdout.readline().strip()))
    else:
        theirs = cuda_ipc.open_event_handle(bytes.fromhex(sys.stdin.readline().strip()))
        print(cuda_ipc.event_handle(mine).hex(), flush=True)
    cuda.stream_synchronize(stream)
    if role == "child":
        sys.stdin.readline()  # the parent finished timing: the two never time at once
    rows = [
        timed("make_current (already current)", device.make_current, calls, rounds),
        timed("cuStreamQuery (idle stream)", lambda: cuda_ipc.stream_done(stream), calls, rounds),
        timed("cuEventRecord, ordinary event", lambda: lib.cuEventRecord(plain, raw_stream), calls, rounds),
        timed("cuEventRecord, own interprocess event", lambda: cuda_ipc.record(mine, stream), calls, rounds),
        timed("cuEventQuery, own interprocess event", lambda: cuda_ipc.event_done(mine), calls, rounds),
        timed("cuEventQuery, other process's event", lambda: cuda_ipc.event_done(theirs), calls, rounds),
        timed("cuStreamWaitEvent, other process's event", lambda: cuda_ipc.wait(stream, theirs), calls, rounds),
        timed("cuStreamWaitEvent, ordinary event", lambda: lib.cuStreamWaitEvent(raw_stream, plain, 0), calls, rounds),
    ]
    cuda.stream_synchronize(stream)
    if role == "parent":
        child.stdin.write("go\n")
        child.stdin.flush()
        out = child.stdout.read()
        child.wait(60)
        child_rows = json.loads(out.strip().splitlines()[-1])
        print(f"{'call':45} {'parent us':>10} {'child us':>10}")
        for (label, value), (_, other) in zip(rows, child_rows):
            print(f"{label:45} {value:10.2f} {other:10.2f}")
    else:
        print(json.dumps(rows), flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.child:
        require(PROGRAM, "cuda-ipc")
    side("child" if args.child else "parent", args.calls, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
