"""bench/remote.py's results: the per-configuration summary, the markdown table, the goals
as PASS / FAIL lines, and the plots (kept apart from the roles and the orchestration)."""
from __future__ import annotations

import math
import pathlib
import statistics
from typing import Callable, Iterator


def summarize(row: dict) -> dict:
    """Per-configuration figures over the subscribers: mean / min rate, median p50, worst p99."""
    subs = [s for s in row.get("subscribers", []) if s.get("frames")]
    if subs:
        row["rate_mean"] = statistics.fmean(s["rate"] for s in subs)
        row["rate_min"] = min(s["rate"] for s in row["subscribers"])
        row["p50_us"] = statistics.median(s["p50_us"] for s in subs)
        row["p99_us"] = max(s["p99_us"] for s in subs)
        # CPU per frame (all threads, user + system, inside the window): the relay's per frame sent
        # to any subscriber, a remote subscriber's per frame it received (the mean over them).
        frames = sum(s["frames"] for s in subs)
        if row.get("relay_cpu_s") is not None and frames:
            row["relay_cpu_ms"] = row["relay_cpu_s"] * 1e3 / frames
        mine = [s["cpu_s"] * 1e3 / s["frames"] for s in subs if s.get("cpu_s") is not None]
        if mine:
            row["remote_cpu_ms"] = statistics.fmean(mine)
    return row


def _f(value: float, digits: int = 0) -> str:
    return "n/a" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:,.{digits}f}"


def markdown(rows: list[dict], args, window: int) -> str:
    lines = [f"Remote subscribers over TCP loopback ({getattr(args, 'ucx_note', '')}); "
             f"MPS {getattr(args, 'mps_note', 'off')}; "
             f"{args.duration} s per configuration; latency = publish to usable (in the subscriber's device "
             f"memory, its stream synchronized); ucx-raw: host buffers, progress mode as named, window "
             f"{window} (the relay's) and 1 (ping-pong); ring: sent from a ring of buffers in turn; gpu: each frame "
             f"copied from GPU 0 to a ring of page-locked buffers before its send, and to GPU 0 after its receive.", "",
             "| size | variant | pace | N | publisher frames/s | per subscriber frames/s (mean / min) | "
             "MB/s per subscriber | p50 ms (median) | p99 ms (worst) | local subscriber frames/s | "
             "CPU ms per frame: relay / remote |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        variant = row["variant"] + (f" (round {row['round']})" if row.get("round") else "")
        head = f"| {row['size']} | {variant} | {row.get('pace', '')} | {row.get('n', '')} |"
        if "error" in row:
            lines.append(f"{head} error: {row['error']} | | | | | | |")
            continue
        if row["variant"].startswith("ucx-raw"):
            lines.append(f"{head} | {_f(row['rate'])} | {_f(row['bytes_per_s'] / 1e6)} | "
                         f"{_f(row['p50_us'] / 1e3, 2)} | {_f(row['p99_us'] / 1e3, 2)} | | |")
            continue
        local = row.get("local", {}).get("rate", math.nan)
        lines.append(f"{head} {_f(row['publisher_rate'])} | "
                     + (f"{_f(row['rate_mean'])} / {_f(row['rate_min'])} | {_f(row['rate_mean'] * row['bytes'] / 1e6)} | "
                        f"{_f(row['p50_us'] / 1e3, 2)} | {_f(row['p99_us'] / 1e3, 2)} |" if "rate_mean" in row
                        else " | | | |")
                     + f" {_f(local)} |"
                     + (f" {_f(row.get('relay_cpu_ms', math.nan), 2)} / {_f(row.get('remote_cpu_ms', math.nan), 2)} |"
                        if "relay_cpu_ms" in row or "remote_cpu_ms" in row else " |"))
    return "\n".join(lines)


def host_goal(size: str) -> float:
    """The least ratio to the raw engine from host buffers that one flat-out remote should reach:
    0.5x for a small frame (what a frame costs apart from its bytes), 0.9x from a million pixels."""
    named = {"1080p-nv12": 1920 * 1080, "4k-argb": 3840 * 2160}
    try:
        pixels = named.get(size) or math.prod(int(v) for v in size.split("-")[0].split("x"))
    except ValueError:
        pixels = 1920 * 1080
    return 0.5 if pixels < 1_000_000 else 0.9


GPU_GOAL = 1.0  # against the raw engine taking each frame through the GPU, as the relay and a remote do


def goals(rows: list[dict], window: int) -> list[str]:
    """The goals, each a line: PASS / FAIL and the figures (medians over rounds), INFO for the rest."""
    out = []

    def find(**want):
        return next((r for r in rows if all(r.get(k) == v for k, v in want.items()) and "error" not in r), None)

    for size in dict.fromkeys(r["size"] for r in rows):
        ratios: list[tuple[float, float, dict]] = []  # (ratio, rate, the raw row) of each round
        gpu_ratios: list[tuple[float, float, dict]] = []
        for round_ in sorted({r.get("round") for r in rows if r["size"] == size}, key=lambda r: r or 0):
            one = find(size=size, variant="eglcuda", n=1, pace="max", round=round_)
            raws = [r for r in rows if r["size"] == size and r.get("round") == round_ and
                    r["variant"].startswith("ucx-raw") and r["variant"].endswith(f" w{window}") and "rate" in r]
            # (the goal's floor: host buffers, one sent again and again; the engine's best at that window)
            raw = max((r for r in raws if " ring" not in r["variant"] and " gpu" not in r["variant"]),
                      key=lambda r: r["rate"], default=None)
            if one and raw and "rate_mean" in one:
                ratios.append((one["rate_mean"] / raw["rate"], one["rate_mean"], raw))
                for other in (r for r in raws if " ring" in r["variant"] or " gpu" in r["variant"]):
                    if " gpu" in other["variant"]:
                        gpu_ratios.append((one["rate_mean"] / other["rate"], one["rate_mean"], other))
                    else:
                        out.append(f"INFO {size}{_round(round_)}: 1 remote subscriber = "
                                   f"{one['rate_mean'] / other['rate']:.2f}x the raw engine sending from a ring of "
                                   f"buffers ({other['variant']}: {other['rate']:.0f}/s)")
        for found, goal, what in ((ratios, host_goal(size), "the raw engine from host buffers"),
                                  (gpu_ratios, GPU_GOAL, "the raw engine through the GPU")):
            if not found:
                continue
            ratio = statistics.median(r for r, _, _ in found)
            rate = statistics.median(r for _, r, _ in found)
            ok = ratio >= goal
            each = ", ".join(f"{r:.2f}x ({v:.0f} vs {w['rate']:.0f} {w['variant']})" for r, v, w in found)
            rounds = f"median of {len(found)} rounds " if len(found) > 1 else ""
            out.append(f"{'PASS' if ok else 'FAIL'} {size}: 1 remote subscriber, {rounds}{rate:.0f} frames/s = "
                       f"{ratio:.2f}x {what} of the same round (goal >= {goal:g}x); {each}")
        eight = find(size=size, variant="eglcuda", n=8, pace="60/s")
        if eight and "rate_min" in eight:
            ok = eight["rate_min"] >= 57 and eight["p99_us"] < 10_000
            out.append(f"{'PASS' if ok else 'FAIL'} {size}: 8 remote subscribers at 60/s: slowest "
                       f"{eight['rate_min']:.1f} frames/s, worst p99 {eight['p99_us'] / 1e3:.2f} ms (goal 60/s, p99 < 10 ms)")
        for pace in ("max", "60/s"):
            for row, alone in _beside_alone(rows, find, size, pace, "eglcuda"):
                change = row["local"]["rate"] / alone - 1
                verdict = ("PASS" if change >= -0.05 else "FAIL") if pace == "max" and row["n"] == 1 else "INFO"
                out.append(f"{verdict} {size} {pace}{_round(row.get('round'))}: local subscriber with {row['n']} "
                           f"remote: {_against_alone(row, alone)}; goal within 5 %)")
            for row, alone in _beside_alone(rows, find, size, pace, "local beside ucx-raw"):  # (the host's share)
                engine = row.get("beside", {})
                moved = (f"the raw engine moving {engine['rate']:.0f} frames/s beside it" if "rate" in engine
                         else f"the raw engine beside it failed: {engine.get('error', 'no result')}")
                out.append(f"INFO {size} {pace}{_round(row.get('round'))}: local subscriber with {moved}: "
                           f"{_against_alone(row, alone)})")
    return out


def _beside_alone(rows: list[dict], find: Callable[..., dict | None], size: str, pace: str,
                  variant: str) -> Iterator[tuple[dict, float]]:
    """(row, rate alone) for each row of ``variant`` with a local subscriber: the rate of the
    local subscriber alone (``local only``) in the same round."""
    for row in rows:
        if row.get("size") == size and row.get("variant") == variant and row.get("pace") == pace \
                and "local" in row and "error" not in row:
            alone = find(size=size, variant="local only", pace=pace, round=row.get("round"))
            if alone and "local" in alone:
                yield row, alone["local"]["rate"]


def _against_alone(row: dict, alone: float) -> str:
    rate = row["local"]["rate"]
    return f"{rate:.0f} frames/s vs {alone:.0f} without ({100 * (rate / alone - 1):+.1f} %"


def _round(round_: int | None) -> str:
    return f" round {round_}" if round_ else ""


def plot(rows: list[dict], out: pathlib.Path, window: int) -> list[str]:
    from _script import plot_bars

    written = []
    for size in dict.fromkeys(r["size"] for r in rows):
        for pace in dict.fromkeys(r.get("pace") for r in rows if r.get("pace")):
            ns = sorted({r["n"] for r in rows if r["size"] == size and r.get("pace") == pace and r.get("n")})
            if not ns:
                continue
            series: dict[str, list[float]] = {}
            latency: dict[str, list[float]] = {}
            for variant in ("eglcuda", "zmq"):
                picked = [next((r for r in rows if r["size"] == size and r.get("pace") == pace and r["variant"] == variant
                                and r.get("n") == n and "rate_mean" in r), None) for n in ns]
                if any(picked):
                    series[variant] = [p["rate_mean"] if p else math.nan for p in picked]
                    latency[f"{variant} p99"] = [p["p99_us"] / 1e3 if p else math.nan for p in picked]
            if pace == "max":
                for raw in (r for r in rows if r["size"] == size and r["variant"].startswith("ucx-raw") and "rate" in r):
                    series[raw["variant"].replace(" w1", " ping-pong")] = [raw["rate"]] * len(ns)
            groups = [f"N={n}" for n in ns]
            tag = f"remote_{size}_{'max' if pace == 'max' else 'paced'}".replace("-", "_")
            plot_bars(str(out / f"{tag}_rate.png"), f"Remote subscribers, {size}, publisher {pace}: per-subscriber rate",
                      "frames/s per subscriber", groups, series)
            plot_bars(str(out / f"{tag}_p99.png"), f"Remote subscribers, {size}, publisher {pace}: worst p99 latency",
                      "ms, publish to usable", groups, latency, log=True)
            written += [f"{tag}_rate.png", f"{tag}_p99.png"]
    return written
