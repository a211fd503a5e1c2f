"""Every cross-process figure without and with CUDA MPS, in one run, on one GPU.

Each figure runs twice in this one invocation: first without MPS, then under a private MPS
control daemon that this script starts with :mod:`eglcuda.mps` (``mps.session``: stopped at the
end, also on an error or Ctrl-C; a watchdog stops it if this process dies; the GPU's compute
mode and settings are never touched). Both ends of every pair are processes started here (the C
reference forks its own), all on CUDA device 0:

- C reference, one stream (bench/c/cross_gpu.c ``twoproc 0 0``): 1920x1080 NV12, 1920x1080 ARGB
  and 3840x2160 ARGB, each with no GPU work, with ``KERNELS=1`` (both processes queue a small
  memset per frame, as a pipeline does: the GPU time-slicing between processes shows only then)
  with ``KERNELS=1 PEEK=1`` (the consumer also copies one word of each frame to the host and
  synchronizes, as the Python benchmarks' consumers do) and with ``FILL=1 PEEK=1`` (the producer
  writes every byte of each frame, the consumer checks one word: the work of bench/cross_process.py's
  pairs, the C figure eglcuda's pair is held against); frames/s, latency, median present and release.
- C reference, ``BREAKDOWN=1`` (1080p NV12, 4K ARGB): present and release timed with the
  caller's CUDA stream idle and right after a queued memset, with and without the other process
  queueing work (four phases: none, producer, consumer, both).
- bench/cross_process.py's three transports (eglcuda, CUDA IPC, shared memory), ARGB at both
  sizes (its ``run_pair``): paced latency and free-running frames/s.
- Fan-out from one producer process to N = 1, 2, 4, 8 consumer processes at 1080p NV12 and 4K
  ARGB: C (``fanout`` mode with ``KERNELS=1 PEEK=1``, and with no GPU work at 1080p), eglcuda and
  CUDA IPC (bench/fanout.py: the producer writes 64 KiB of each frame, every consumer checks one
  word); rounds/s and present-to-consumer latency.

Writes to ``--out`` (default bench/build/mps): ``results.json`` (every figure, both phases,
written after each figure), ``table.md`` (one row per figure and metric: without MPS, with MPS,
with/without, eglcuda/C and eglcuda/CUDA IPC in both phases, then the goals under MPS) and
``fanout.png`` (rounds/s against consumers, log y; needs matplotlib, else redraw it anywhere with
``--plot DIR``).

    python bench/mps.py [--quick] [--out DIR] [--phases off,on] [--groups twoproc,breakdown,cross_process,fanout]
    python bench/mps.py --plot DIR      # fanout.png from DIR/results.json (no GPU needed)

Exit status: 0 every figure ran with no bad frame; 1 a figure failed (one line per failing
process, never a traceback) or saw a bad frame; 2 this machine lacks a GPU with EGL streams,
cuda-python, gcc or nvidia-cuda-mps-control (one line saying which).
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import pathlib
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # _script.py, fanout.py and cross_process.py, for this process and the spawned ones
from _script import CUDA_PYTHON, build_reference, fail, one_line, output_folder, require, run  # noqa: E402

PROGRAM = "bench/mps.py"
NUMPY = ("numpy", "numpy for bench/cross_process.py", "pip install numpy")
PHASES = ("off", "on")
PHASE_WORDS = {"off": "without MPS", "on": "with MPS"}
GROUPS = ("twoproc", "breakdown", "cross_process", "fanout")
TWOPROC_CASES = [(1920, 1080, "NV12"), (1920, 1080, "ARGB"), (3840, 2160, "ARGB")]
BREAKDOWN_CASES = [(1920, 1080, "NV12"), (3840, 2160, "ARGB")]
XP_SIZES = [(1920, 1080), (3840, 2160)]
XP_TRANSPORTS = ["eglcuda", "cuda-ipc", "shm"]
FANOUT_CASES = [(1920, 1080, "NV12"), (3840, 2160, "ARGB")]
FANOUT_CONSUMERS = [1, 2, 4, 8]
BREAKDOWN_PHASES = ("none", "producer", "consumer", "both")
C_ENVIRONMENT = ("CHECK", "PACE_US", "KERNELS", "PEEK", "PEEK_1D", "FILL", "NONBLOCKING", "BREAKDOWN",
                 "CONSUMERS")  # never inherited by a C run
# The C program's GPU work per frame: key suffix, words, environment.
C_WORK = {"none": ("", "no GPU work", {}), "kernels": (".kernels", "KERNELS=1", {"KERNELS": "1"}),
          "peek": (".kernels.peek", "KERNELS=1 PEEK=1", {"KERNELS": "1", "PEEK": "1"}),
          "fill": (".fill.peek", "FILL=1 PEEK=1", {"FILL": "1", "PEEK": "1"})}
TWOPROC_WORK = ("none", "kernels", "peek", "fill")
# The C figures eglcuda is held against: the same GPU work per frame as the Python side. Fan-out
# (bench/fanout.py): the producer writes 64 KiB of each frame, every consumer reads one word.
# One stream (bench/cross_process.py): the producer writes the whole frame, the consumer reads one word.
COMPARED = "peek"
COMPARED_PAIR = "fill"
GOAL_C = 0.9  # under MPS: eglcuda >= 0.9x the C reference


def frames_for(quick: bool) -> dict[str, int]:
    if quick:
        return {"twoproc": 1000, "breakdown": 1000, "xp_latency": 200, "xp_throughput": 1000}
    return {"twoproc": 5000, "breakdown": 4000, "xp_latency": 600, "xp_throughput": 5000}


class Failure(Exception):
    """A figure that failed: one line per failing process in ``lines``."""

    def __init__(self, lines: list[str]) -> None:
        self.lines = [" ".join(line.split()) for line in lines if line.strip()] or ["failed, nothing said why"]
        super().__init__("; ".join(self.lines))


def condense(text: str) -> list[str]:
    """A message that may hold Python tracebacks, as lines without them: a traceback gives only
    its exception line(s); a first line that ends with ':' (what failed) goes before each."""
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    header = ""
    if len(lines) > 1 and lines[0].endswith(":"):
        header, lines = lines[0] + " ", lines[1:]
    kept: list[str] = []
    for line in lines:
        if line[:1].isspace() or line.startswith(("Traceback (most recent call last)", "During handling of",
                                                  "The above exception was")):
            continue
        if header + line not in kept:
            kept.append(header + line)
    return kept


# ---- what the machine needs -------------------------------------------------------------------------------

def need() -> None:
    """Exit with status 2 and one line unless this machine has what the benchmark needs. The
    platform is probed in a child: this process never initializes CUDA."""
    require(PROGRAM, "cross-process", modules=[CUDA_PYTHON, NUMPY], gcc=True, in_child=True)
    from eglcuda import mps

    for binary in (mps.CONTROL, mps.SERVER):
        if mps.find_binary(binary) is None:
            fail(PROGRAM, f"needs {binary} to run under MPS (searched PATH and {', '.join(mps.SEARCH_DIRECTORIES)}): "
                          f"{mps.INSTALL_HINT}", 2)


def probe() -> int:
    """``--probe``, run as a child process: the GPU, its EGL streams and MPS as a new process sees
    them; one JSON line."""
    try:
        import eglcuda
        from eglcuda._bind import cuda as _cuda

        active, why = eglcuda.mps.under_mps(0)  # first: it reads the driver's answer at cuInit
        count = _cuda.device_count()
        name = eglcuda.get_device(0).info.name
        with eglcuda.Display.for_cuda_device(0) as display:
            display.require("EGL_KHR_stream", "EGL_KHR_stream_fifo", "EGL_KHR_stream_cross_process_fd")
        try:
            version = str(eglcuda.driver_version())
        except Exception:  # noqa: BLE001 - a detail
            version = None
        found = {"ok": True, "devices": count, "name": name, "driver": version, "mps": active, "mps_why": why}
    except Exception as exc:  # noqa: BLE001 - the parent says it in one line
        found = {"ok": False, "why": one_line(exc)}
    print(json.dumps(found), flush=True)
    return 0


def run_probe() -> dict:
    try:
        done = subprocess.run([sys.executable, str(pathlib.Path(__file__).resolve()), "--probe"], capture_output=True,
                              text=True, timeout=90)
    except subprocess.TimeoutExpired:
        return {"ok": False, "why": "the probe process did not finish within 90 s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        said = condense(done.stderr)
        return {"ok": False, "why": f"the probe process exited with status {done.returncode}"
                                    + (f": {said[-1]}" if said else "")}
    return json.loads(lines[-1])


# ---- the runners ----------------------------------------------------------------------------------------------

def build_c() -> pathlib.Path:
    try:
        return build_reference("cross_gpu")
    except RuntimeError as exc:
        raise Failure([str(exc)]) from None


def _fields(line: str) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for item in line.split():
        key, _, text = item.partition("=")
        try:
            values[key] = float(text)
        except ValueError:
            values[key] = text
    return values


def run_c(binary: pathlib.Path, mode: str, width: int, height: int, fmt: str, frames: int, *,
          consumers: int | None = None, work: str = "none", breakdown: bool = False,
          timeout: float = 120.0) -> dict:
    environment = {k: v for k, v in os.environ.items() if k not in C_ENVIRONMENT}
    environment.update(C_WORK[work][2])
    if breakdown:
        environment["BREAKDOWN"] = "1"
    command = [str(binary), mode, "0", "0", str(width), str(height), fmt.lower(), str(frames)]
    if consumers is not None:
        command.append(str(consumers))
    # Its own process group: on a timeout the C program and the processes it forked go together.
    process = subprocess.Popen(command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True)
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
        raise Failure([f"cross_gpu {mode}: did not finish within {timeout:g} s"] + condense(err)[-3:]) from None
    said = [line for line in err.splitlines() if line.strip()]
    if process.returncode != 0:
        raise Failure(said[-4:] or [f"cross_gpu {mode} exited with status {process.returncode}"])
    last = [line for line in out.splitlines() if line.startswith("fps=")]
    if not last:
        raise Failure([f"cross_gpu {mode} printed no result line"] + said[-2:])
    result = _fields(last[-1])
    per_consumer = [_fields(line) for line in out.splitlines() if line.startswith("consumer=")]
    if per_consumer:
        result["per_consumer"] = per_consumer
    result["frames"] = frames
    return result


def run_cross_process(transport: str, width: int, height: int, latency_frames: int, throughput_frames: int) -> dict:
    import cross_process

    try:
        row = cross_process.run_pair(transport, width, height, latency_frames, throughput_frames)
    except Exception as exc:  # noqa: BLE001 - its children's errors, one line each
        raise Failure(condense(f"{type(exc).__name__}: {exc}") or [one_line(exc)]) from None
    return {"fps": row["fps"], "latency_p50_us": row["latency_us"], "latency_p99_us": row["latency_p99_us"],
            "bad": row["bad"], "mps": list(row["mps"]) if isinstance(row.get("mps"), tuple) else row.get("mps"),
            "calls_us": row.get("calls_us", {}), "pinned": row.get("pinned"),
            "frames": {"latency": latency_frames, "throughput": throughput_frames}}


def run_fanout(transport: str, width: int, height: int, fmt: str, consumers: int, rounds: int) -> dict:
    import fanout

    try:
        return fanout.run_fanout(transport, width, height, fmt, consumers, rounds, timeout=120.0)
    except fanout.ChildFailure as exc:
        raise Failure(exc.lines) from None


# ---- the figures ------------------------------------------------------------------------------------------------

@dataclass
class Cell:
    key: str
    group: str
    label: str
    run: Callable[[], dict] = field(repr=False)
    params: dict = field(default_factory=dict)


def case_key(width: int, height: int, fmt: str = "ARGB") -> str:
    return f"{'4k' if width == 3840 else f'{height}p'}-{fmt.lower()}"


def case_words(width: int, height: int, fmt: str = "ARGB") -> str:
    return f"{width}x{height} {fmt}"


def build_cells(binary: pathlib.Path, quick: bool, groups: list[str]) -> list[Cell]:
    import fanout

    frames = frames_for(quick)
    cells: list[Cell] = []
    if "twoproc" in groups:
        for width, height, fmt in TWOPROC_CASES:
            for work in TWOPROC_WORK:
                suffix, words, _ = C_WORK[work]
                cells.append(Cell(
                    f"c.twoproc.{case_key(width, height, fmt)}{suffix}", "twoproc",
                    f"C twoproc {case_words(width, height, fmt)}, {words}",
                    lambda w=width, h=height, f=fmt, k=work: run_c(binary, "twoproc", w, h, f, frames["twoproc"],
                                                                   work=k),
                    {"width": width, "height": height, "format": fmt, "work": work}))
    if "breakdown" in groups:
        for width, height, fmt in BREAKDOWN_CASES:
            cells.append(Cell(
                f"c.breakdown.{case_key(width, height, fmt)}", "breakdown",
                f"C twoproc BREAKDOWN {case_words(width, height, fmt)}",
                lambda w=width, h=height, f=fmt: run_c(binary, "twoproc", w, h, f, frames["breakdown"], breakdown=True),
                {"width": width, "height": height, "format": fmt}))
    if "cross_process" in groups:
        for width, height in XP_SIZES:
            for transport in XP_TRANSPORTS:
                cells.append(Cell(
                    f"xp.{transport}.{case_key(width, height)}", "cross_process",
                    f"cross_process {transport} {case_words(width, height)}",
                    lambda t=transport, w=width, h=height: run_cross_process(t, w, h, frames["xp_latency"],
                                                                             frames["xp_throughput"]),
                    {"width": width, "height": height, "format": "ARGB", "transport": transport}))
    if "fanout" in groups:
        for width, height, fmt in FANOUT_CASES:
            for n in FANOUT_CONSUMERS:
                rounds = fanout.rounds_for(n, quick)
                params = {"width": width, "height": height, "format": fmt, "consumers": n, "rounds": rounds}
                case = case_key(width, height, fmt)
                for work in (COMPARED, "none") if (width, height) == (1920, 1080) else (COMPARED,):
                    suffix, words, _ = C_WORK[work]
                    cells.append(Cell(
                        f"c.fanout.{case}.n{n}{suffix}", "fanout", f"C fanout {case_words(width, height, fmt)} N={n}, {words}",
                        lambda w=width, h=height, f=fmt, n=n, r=rounds, k=work: run_c(binary, "fanout", w, h, f, r,
                                                                                      consumers=n, work=k),
                        {**params, "work": work}))
                for transport in fanout.TRANSPORTS:
                    cells.append(Cell(
                        f"fan.{transport}.{case}.n{n}", "fanout",
                        f"{transport} fan-out {case_words(width, height, fmt)} N={n}",
                        lambda t=transport, w=width, h=height, f=fmt, n=n, r=rounds: run_fanout(t, w, h, f, n, r),
                        {**params, "transport": transport}))
    return cells


def summary(value: dict) -> str:
    """One line for the progress log."""
    parts = []
    for key, words, unit in (("fps", "", "/s"), ("rounds_per_s", "", " rounds/s"), ("latency_p50_us", "p50 ", " us"),
                             ("latency_p99_us", "p99 ", " us"), ("present_us", "present ", " us"),
                             ("release_us", "release ", " us")):
        if isinstance(value.get(key), (int, float)):
            parts.append(f"{words}{value[key]:,.1f}{unit}")
    if "present_us_none" in value:
        parts.append("present none/producer/consumer/both " + "/".join(
            f"{value.get(f'present_us_{p}', float('nan')):.1f}" for p in BREAKDOWN_PHASES) + " us")
        parts.append("release " + "/".join(
            f"{value.get(f'release_us_{p}', float('nan')):.1f}" for p in BREAKDOWN_PHASES) + " us")
    if value.get("bad"):
        parts.append(f"BAD FRAMES {value['bad']}")
    if "mps" in value:
        parts.append(f"MPS {value['mps']}")
    return ", ".join(parts)


# ---- the run ------------------------------------------------------------------------------------------------------

def save(results: dict, out: pathlib.Path) -> None:
    temporary = out / "results.json.tmp"
    temporary.write_text(json.dumps(results, indent=1, default=str))
    os.replace(temporary, out / "results.json")


def run_phase(phase: str, cells: list[Cell], results: dict, out: pathlib.Path) -> int:
    """Runs every cell once; returns how many failed or saw bad frames."""
    troubles = 0
    for cell in cells:
        started = time.monotonic()
        try:
            value = cell.run()
        except Failure as exc:
            value = {"error": exc.lines}
        except Exception as exc:  # noqa: BLE001 - one line, never a traceback
            value = {"error": [one_line(exc)]}
        value["seconds"] = round(time.monotonic() - started, 2)
        results["cells"][cell.key][phase] = value
        if "error" in value:
            troubles += 1
            for line in value["error"]:
                print(f"[{PHASE_WORDS[phase]}] {cell.label}: FAILED: {line}", flush=True)
        else:
            troubles += bool(value.get("bad"))
            print(f"[{PHASE_WORDS[phase]}] {cell.label}: {summary(value)} ({value['seconds']:.1f} s)", flush=True)
        save(results, out)
    return troubles


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer frames (about 3-4 minutes in all on an H100)")
    parser.add_argument("--out", default=str(HERE / "build" / "mps"),
                        help="folder for results.json, table.md and fanout.png (default: bench/build/mps)")
    parser.add_argument("--phases", default=",".join(PHASES), help="off,on (default both: without MPS, then with)")
    parser.add_argument("--groups", default=",".join(GROUPS), help=f"a subset of {','.join(GROUPS)}")
    parser.add_argument("--plot", metavar="DIR", help="only draw DIR/fanout.png (and DIR/table.md) from "
                                                      "DIR/results.json; no GPU needed")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    output_folder(parser, "--out", args.out)
    if args.probe:
        return probe()
    if args.plot:
        return redraw(pathlib.Path(args.plot))
    phases = [p for p in args.phases.split(",") if p]
    groups = [g for g in args.groups.split(",") if g]
    if not phases or any(p not in PHASES for p in phases):
        parser.error("--phases takes off and/or on")
    if not groups or any(g not in GROUPS for g in groups):
        parser.error(f"--groups takes {', '.join(GROUPS)}")

    need()
    import eglcuda

    found = run_probe()  # in a child: this process never initializes CUDA
    if not found.get("ok"):
        print(f"{PROGRAM}: needs an NVIDIA GPU with EGL streams between processes: {found.get('why')}",
              file=sys.stderr)
        return 2
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        binary = build_c()
    except Failure as exc:
        print(f"{PROGRAM}: {exc.lines[0]}", file=sys.stderr)
        return 1
    cells = build_cells(binary, args.quick, groups)
    results: dict[str, Any] = {
        "program": PROGRAM, "date": datetime.datetime.now().isoformat(timespec="seconds"), "quick": args.quick,
        "frames": frames_for(args.quick), "device": {k: found.get(k) for k in ("name", "driver", "devices")},
        "phases": {}, "cells": {c.key: {"group": c.group, "label": c.label, "params": c.params} for c in cells}}
    print(f"{PROGRAM}: {len(cells)} figures x {len(phases)} phases on {found.get('name')} (driver {found.get('driver')}); "
          f"results in {out}", flush=True)
    troubles = 0
    started = time.monotonic()
    for phase in phases:
        phase_started = time.monotonic()
        record: dict[str, Any] = {"started": datetime.datetime.now().isoformat(timespec="seconds")}
        results["phases"][phase] = record
        try:
            with eglcuda.mps.session(phase == "on", children_only=True, quiet=True) as daemon:
                record["daemon"] = daemon.describe() if daemon is not None else None
                seen = found if phase == "off" else run_probe()
                record["probe"] = seen
                if phase == "off" and seen.get("mps"):
                    print(f"{PROGRAM}: warning: an MPS daemon already serves this GPU, so the 'without MPS' "
                          f"figures run under it ({seen.get('mps_why')})", flush=True)
                if phase == "on" and not (seen.get("ok") and seen.get("mps")):
                    raise RuntimeError(f"MPS did not take effect for a new process: {seen.get('mps_why') or seen.get('why')}")
                if daemon is not None:
                    print(f"[{PHASE_WORDS[phase]}] {daemon.describe()}", flush=True)
                troubles += run_phase(phase, cells, results, out)
        except Exception as exc:  # noqa: BLE001 - the daemon would not start or stop: one line, go on
            record["error"] = one_line(exc)
            troubles += 1
            print(f"[{PHASE_WORDS[phase]}] FAILED: {record['error']}", flush=True)
        record["seconds"] = round(time.monotonic() - phase_started, 1)
        save(results, out)
    results["seconds"] = round(time.monotonic() - started, 1)
    save(results, out)
    table = markdown(results)
    (out / "table.md").write_text(table + "\n")
    print("\n" + table, flush=True)
    print(plot(results, out / "fanout.png"), flush=True)
    return 1 if troubles else 0


# ---- the table --------------------------------------------------------------------------------------------------

def value_of(results: dict, key: str | None, phase: str, metric: str) -> float | None:
    if key is None:
        return None
    cell = results["cells"].get(key, {}).get(phase)
    if not cell or "error" in cell:
        return None
    value: Any = cell
    for part in metric.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


@dataclass
class Row:
    label: str
    key: str
    metric: str
    unit: str  # "/s" (a rate: higher is better) or "us" (a time: lower is better)
    p99: str | None = None
    c_key: str | None = None
    c_metric: str | None = None
    ipc_key: str | None = None
    ipc_metric: str | None = None


def rows_for(results: dict) -> list[tuple[str, list[Row]]]:
    keys = results["cells"]
    sections: list[tuple[str, list[Row]]] = []
    rows: list[Row] = []
    for width, height, fmt in TWOPROC_CASES:
        for work in TWOPROC_WORK:
            suffix, words, _ = C_WORK[work]
            key = f"c.twoproc.{case_key(width, height, fmt)}{suffix}"
            name = f"C twoproc {case_words(width, height, fmt)}, {words}"
            rows += [Row(f"{name}: frames/s", key, "fps", "/s"),
                     Row(f"{name}: latency p50 (p99)", key, "latency_p50_us", "us", p99="latency_p99_us"),
                     Row(f"{name}: present", key, "present_us", "us"),
                     Row(f"{name}: release", key, "release_us", "us")]
            if "PEEK" in C_WORK[work][2]:  # the consumer's other two steps
                rows += [Row(f"{name}: acquire and map", key, "acquire_us", "us"),
                         Row(f"{name}: peek (copy one word, synchronize)", key, "peek_us", "us")]
    for width, height in XP_SIZES:
        case = case_key(width, height)
        c_key = f"c.twoproc.{case}{C_WORK[COMPARED_PAIR][0]}"
        ipc = f"xp.cuda-ipc.{case}"
        for transport in XP_TRANSPORTS:
            key = f"xp.{transport}.{case}"
            name = f"{transport} (cross_process.py) {case_words(width, height)}"
            mine = transport == "eglcuda"
            rows += [Row(f"{name}: frames/s", key, "fps", "/s", c_key=c_key if mine else None, c_metric="fps",
                         ipc_key=ipc if mine else None, ipc_metric="fps"),
                     Row(f"{name}: paced latency p50 (p99)", key, "latency_p50_us", "us", p99="latency_p99_us",
                         ipc_key=ipc if mine else None, ipc_metric="latency_p50_us")]
            if mine:
                rows += [Row(f"{name}: present (mean of the free-running loop)", key, "calls_us.present", "us"),
                         Row(f"{name}: acquire (mean of the free-running loop)", key, "calls_us.acquire", "us"),
                         Row(f"{name}: check, one word through cuda-python (mean)", key, "calls_us.check", "us"),
                         Row(f"{name}: release (mean of the free-running loop)", key, "calls_us.release", "us")]
    sections.append(("One stream between two processes, one GPU (eglcuda/C: against C twoproc FILL=1 PEEK=1 of "
                     "the same size: like cross_process.py's pairs, the producer writes the whole frame and the "
                     "consumer reads one word)",
                     [r for r in rows if r.key in keys]))
    rows = []
    for width, height, fmt in BREAKDOWN_CASES:
        key = f"c.breakdown.{case_key(width, height, fmt)}"
        for phase in BREAKDOWN_PHASES:
            name = f"C BREAKDOWN {case_words(width, height, fmt)}, memset queued by {phase}"
            rows += [Row(f"{name}: present", key, f"present_us_{phase}", "us"),
                     Row(f"{name}: release", key, f"release_us_{phase}", "us"),
                     Row(f"{name}: latency p50", key, f"latency_p50_us_{phase}", "us"),
                     Row(f"{name}: frames/s", key, f"fps_{phase}", "/s")]
    sections.append(("Where present and release go (C twoproc, BREAKDOWN=1: a side that queues no memset "
                     "synchronizes its stream first, outside the timed call)", [r for r in rows if r.key in keys]))
    rows = []
    for width, height, fmt in FANOUT_CASES:
        case = case_key(width, height, fmt)
        for n in FANOUT_CONSUMERS:
            c_key, c0_key = f"c.fanout.{case}.n{n}{C_WORK[COMPARED][0]}", f"c.fanout.{case}.n{n}"
            egl, ipc = f"fan.eglcuda.{case}.n{n}", f"fan.cuda-ipc.{case}.n{n}"
            where = f"{case_words(width, height, fmt)} N={n}"
            compared = C_WORK[COMPARED][1]
            rows += [Row(f"C fan-out {where}, no GPU work: rounds/s", c0_key, "fps", "/s"),
                     Row(f"C fan-out {where}, {compared}: rounds/s", c_key, "fps", "/s"),
                     Row(f"eglcuda fan-out {where}: rounds/s", egl, "rounds_per_s", "/s", c_key=c_key, c_metric="fps",
                         ipc_key=ipc, ipc_metric="rounds_per_s"),
                     Row(f"CUDA IPC fan-out {where}: rounds/s", ipc, "rounds_per_s", "/s"),
                     Row(f"C fan-out {where}, {compared}: latency p50 (p99)", c_key, "latency_p50_us", "us",
                         p99="latency_p99_us"),
                     Row(f"eglcuda fan-out {where}: latency p50 (p99)", egl, "latency_p50_us", "us",
                         p99="latency_p99_us", c_key=c_key, c_metric="latency_p50_us", ipc_key=ipc,
                         ipc_metric="latency_p50_us"),
                     Row(f"CUDA IPC fan-out {where}: latency p50 (p99)", ipc, "latency_p50_us", "us",
                         p99="latency_p99_us"),
                     Row(f"C fan-out {where}, {compared}: present", c_key, "present_us", "us"),
                     Row(f"C fan-out {where}, {compared}: release", c_key, "release_us", "us"),
                     Row(f"eglcuda fan-out {where}: present (mean)", egl, "calls_us.present", "us"),
                     Row(f"eglcuda fan-out {where}: release (mean)", egl, "calls_us.release", "us")]
    sections.append(("Fan-out: one producer process, the same frame to N consumer processes (eglcuda/C: against "
                     "C fanout KERNELS=1 PEEK=1: the same GPU work per frame as eglcuda's and CUDA IPC's)",
                     [r for r in rows if r.key in keys]))
    return sections


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if unit == "/s" else f"{value:,.1f}"


def _ratios(results: dict, row: Row, key: str | None, metric: str | None) -> str:
    if key is None:
        return ""
    found = [ratio(value_of(results, row.key, p, row.metric), value_of(results, key, p, metric or row.metric))
             for p in PHASES]
    return " / ".join("-" if r is None else f"{r:.2f}" for r in found)


def markdown(results: dict) -> str:
    frames = results.get("frames", {})
    device = results.get("device", {})
    lines = [f"Cross-process figures without and with CUDA MPS, one run ({results.get('date')}, "
             f"{device.get('name')}, driver {device.get('driver')}{', --quick' if results.get('quick') else ''}): "
             f"C twoproc {frames.get('twoproc')} frames, BREAKDOWN {frames.get('breakdown')}, cross_process.py "
             f"{frames.get('xp_latency')} paced + {frames.get('xp_throughput')} free-running, fan-out rounds by N "
             "in results.json. Ratios: value / other value (rates: above 1 is faster; times: below 1 is "
             "shorter), 'without MPS / with MPS'.", ""]
    for phase, record in results.get("phases", {}).items():
        if record.get("error"):
            lines.append(f"- {PHASE_WORDS[phase]}: FAILED: {record['error']}")
        elif record.get("daemon"):
            lines.append(f"- {PHASE_WORDS[phase]}: {record['daemon']}")
    lines.append("")
    for title, rows in rows_for(results):
        if not rows:
            continue
        lines += [f"### {title}", "",
                  "| figure | without MPS | with MPS | with / without | eglcuda / C | eglcuda / CUDA IPC |",
                  "|---|---:|---:|---:|---:|---:|"]
        for row in rows:
            cells = []
            for phase in PHASES:
                value = value_of(results, row.key, phase, row.metric)
                text = _number(value, row.unit)
                if row.p99 and value is not None:
                    text += f" ({_number(value_of(results, row.key, phase, row.p99), row.unit)})"
                cell = results["cells"][row.key].get(phase)
                if cell and "error" in cell:
                    text = "failed"
                elif cell and cell.get("bad"):
                    text += f" ({cell['bad']} bad)"
                cells.append(text)
            with_without = ratio(value_of(results, row.key, "on", row.metric),
                                 value_of(results, row.key, "off", row.metric))
            lines.append(f"| {row.label} | {cells[0]} | {cells[1]} | "
                         f"{'-' if with_without is None else f'{with_without:.2f}'} | "
                         f"{_ratios(results, row, row.c_key, row.c_metric)} | "
                         f"{_ratios(results, row, row.ipc_key, row.ipc_metric)} |")
        lines.append("")
    lines += goals(results)
    return "\n".join(lines)


def goals(results: dict) -> list[str]:
    """The goals, under MPS: eglcuda >= 0.9x C, and at least CUDA IPC's rate and latency."""
    checks = []
    for _, rows in rows_for(results):
        for row in rows:
            mine = value_of(results, row.key, "on", row.metric)
            if row.c_key and row.unit == "/s":
                found = ratio(mine, value_of(results, row.c_key, "on", row.c_metric or row.metric))
                checks.append((f"{row.label}: eglcuda / C >= {GOAL_C}", found, found is not None and found >= GOAL_C))
            if row.ipc_key:
                found = ratio(mine, value_of(results, row.ipc_key, "on", row.ipc_metric or row.metric))
                if row.unit == "/s":
                    checks.append((f"{row.label}: eglcuda / CUDA IPC >= 1", found, found is not None and found >= 1))
                else:
                    checks.append((f"{row.label}: eglcuda / CUDA IPC <= 1", found, found is not None and found <= 1))
    if not checks:
        return []
    met = sum(ok for _, _, ok in checks)
    measured = sum(found is not None for _, found, _ in checks)
    lines = [f"### Goals under MPS: {met} of {len(checks)} met ({len(checks) - measured} not measured)", ""]
    for what, found, ok in checks:
        state = "not measured" if found is None else "met" if ok else "NOT met"
        lines.append(f"- {state}: {what}" + ("" if found is None else f" ({found:.2f})"))
    return lines


# ---- the plot -----------------------------------------------------------------------------------------------------

def plot(results: dict, path: pathlib.Path) -> str:
    """fanout.png: rounds/s against consumers, per case; returns what was done, in one line."""
    series = []
    for transport, name, color in (("c.fanout", f"C, {C_WORK[COMPARED][1]}", "black"),
                                   ("c0.fanout", "C, no GPU work", "gray"),
                                   ("fan.eglcuda", "eglcuda", "tab:blue"), ("fan.cuda-ipc", "CUDA IPC", "tab:orange")):
        for phase, style in (("on", "-"), ("off", "--")):
            series.append((transport, f"{name}, {PHASE_WORDS[phase]}", color, style, phase))
    panels = []
    for width, height, fmt in FANOUT_CASES:
        case = case_key(width, height, fmt)
        lines = []
        for transport, name, color, style, phase in series:
            keys = {"c.fanout": f"c.fanout.{case}.n{{n}}{C_WORK[COMPARED][0]}", "c0.fanout": f"c.fanout.{case}.n{{n}}",
                    "fan.eglcuda": f"fan.eglcuda.{case}.n{{n}}", "fan.cuda-ipc": f"fan.cuda-ipc.{case}.n{{n}}"}
            metric = "fps" if transport.startswith("c") else "rounds_per_s"
            points = [(n, value_of(results, keys[transport].format(n=n), phase, metric)) for n in FANOUT_CONSUMERS]
            points = [(n, v) for n, v in points if v]
            if points:
                lines.append((name, color, style, points))
        if lines:
            panels.append((case_words(width, height, fmt), lines))
    if not panels:
        return "fanout.png: no fan-out figures to plot"
    try:
        import matplotlib

        matplotlib.use("Agg")  # files only
        from matplotlib import pyplot as plt
        from matplotlib.ticker import FuncFormatter, NullFormatter
    except ImportError:
        return (f"fanout.png not drawn: matplotlib is not installed here (pip install matplotlib, or "
                f"`python {PROGRAM} --plot {path.parent}` on a machine that has it)")
    figure, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 5.4), squeeze=False, layout="constrained")
    for axis, (title, lines) in zip(axes[0], panels):
        for name, color, style, points in lines:
            axis.plot([n for n, _ in points], [v for _, v in points], style, color=color, marker="o", markersize=4,
                      label=name)
        axis.set_xscale("log", base=2)
        axis.set_xticks(FANOUT_CONSUMERS, [str(n) for n in FANOUT_CONSUMERS])
        axis.set_yscale("log")
        axis.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:,.0f}"))
        axis.yaxis.set_minor_formatter(NullFormatter())
        axis.set_xlabel("consumer processes")
        axis.set_ylabel("rounds/s (one frame to every consumer)")
        axis.set_title(title)
        axis.grid(True, which="major", color="#dddddd")
    handles, labels = axes[0][0].get_legend_handles_labels()
    try:  # below the panels (matplotlib 3.7+)
        figure.legend(handles, labels, loc="outside lower center", ncols=4, fontsize=7)
    except (TypeError, ValueError):
        axes[0][0].legend(fontsize=7, loc="best")
    device = results.get("device", {}).get("name") or "GPU"
    figure.suptitle(f"Fan-out from one producer process, {device} (solid: with MPS, dashed: without)", fontsize=10)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return f"wrote {path}"


def redraw(folder: pathlib.Path) -> int:
    try:
        results = json.loads((folder / "results.json").read_text())
    except (OSError, ValueError) as exc:
        print(f"{PROGRAM}: cannot read {folder / 'results.json'}: {one_line(exc)}", file=sys.stderr)
        return 2
    try:
        table = markdown(results)
        said = plot(results, folder / "fanout.png")
    except (KeyError, TypeError, AttributeError, ValueError) as exc:  # (a file of another shape)
        print(f"{PROGRAM}: {folder / 'results.json'} is not this benchmark's results ({one_line(exc)})", file=sys.stderr)
        return 2
    (folder / "table.md").write_text(table + "\n")
    print(said)
    return 0 if said.startswith("wrote") else 1


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
