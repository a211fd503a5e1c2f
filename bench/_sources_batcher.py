"""bench/sources.py's batcher rows: N publisher processes, one consuming process that forms
batches of N frames (one per source) in two ways, in the same run, on the same publishers:

- ``batcher``: ``eglcuda.Batcher(subs, N)``, each batch taken as torch tensors through DLPack
  (``torch.from_dlpack(batch.planes[0])``, no copy), released by the next step of the loop;
- ``loop``: what a user writes by hand: ``receive()`` from each subscriber in turn, a DLPack view
  of each frame's plane 0 and ``torch.stack`` of the views (one copy, on torch's stream), then
  each message released.

Both copy each frame once (the batcher into its buffer, ``torch.stack`` into a new tensor); the
batcher copies every plane, the loop plane 0 only (Y of NV12: two thirds of the bytes). The rows
give batches/s, frames/s and the consuming process's CPU time per frame (``time.process_time``),
after a warm-up, for --duration seconds each, the two variants alternating over --rounds.

    python bench/_sources_batcher.py rows [--sources 1,8,32] [--fps 0,30] [--size 1920x1080]
                                          [--duration 3] [--rounds 2]

(--fps 0: the publishers as fast as the consumer lets them.) Run as a child by this module:
``python bench/_sources_batcher.py publish --path P --name T --width W --height H --fps F``
(publishes until its stdin closes).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _script import BENCH_HINT, require, run  # noqa: E402

VARIANTS = ("batcher", "loop")


def publish(args: argparse.Namespace) -> int:
    """A publisher child: frames as fast as allowed (or at ``fps``) until stdin closes."""
    import threading

    import eglcuda

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    with eglcuda.Publisher(args.name, args.width, args.height, "NV12", fps=args.fps or None, path=args.path,
                           every_timeout=30.0) as pub:
        print("ready", flush=True)
        started = time.monotonic()
        seq = 0
        while not stop.is_set():
            try:
                pub.publish(pub.next_frame(timeout=1.0))
            except eglcuda.Timeout:
                continue
            seq += 1
            if args.fps:
                delay = started + seq / args.fps - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
    return 0


def _publishers(count: int, folder: str, width: int, height: int, fps: float) -> tuple[list[Any], list[str]]:
    children, paths = [], []
    for index in range(count):
        path = os.path.join(folder, f"source{index}.topic")
        child = subprocess.Popen([sys.executable, __file__, "publish", "--name", f"source{index}", "--path", path,
                                  "--width", str(width), "--height", str(height), "--fps", str(fps)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        children.append(child)
        paths.append(path)
    for child in children:
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError("a publisher of the batcher rows did not start")
    return children, paths


def _measure(step: Callable[[], int], duration: float, warmup: float) -> dict[str, float]:
    """Run ``step`` (one batch; returns its frames) for ``warmup`` then ``duration`` seconds."""
    end = time.monotonic() + warmup
    while time.monotonic() < end:
        step()
    batches = frames = 0
    cpu, started = time.process_time(), time.monotonic()
    while time.monotonic() - started < duration:
        frames += step()
        batches += 1
    elapsed, cpu = time.monotonic() - started, time.process_time() - cpu
    return {"batches_s": batches / elapsed, "frames_s": frames / elapsed,
            "cpu_us_frame": cpu / max(frames, 1) * 1e6, "fill": frames / max(batches, 1)}


def batcher_variant(subs: list[Any], duration: float, warmup: float, fps: float) -> dict[str, float]:
    """eglcuda.Batcher: one batch of up to N frames per step, plane 0 taken by torch (DLPack)."""
    import torch

    import eglcuda

    # Formation timeout: one frame interval at a camera rate (the sources' frames of one round
    # arrive spread over it, so a shorter one cuts batches short); flat out, the batches fill first.
    formation = 1.0 / fps if fps else 0.05
    with eglcuda.Batcher(subs, len(subs), formation_timeout=formation, timeout=10.0) as batcher:
        previous: list[Any] = []

        def step() -> int:
            if previous:
                previous.pop().release()
            batch = batcher.next()
            torch.from_dlpack(batch.planes[0])  # the model's input, [B, H, W] uint8
            previous.append(batch)
            return batch.size

        try:
            return _measure(step, duration, warmup)
        finally:
            for batch in previous:
                batch.release()


def loop_variant(subs: list[Any], duration: float, warmup: float, fps: float) -> dict[str, float]:
    """By hand: receive from each, torch.stack of the DLPack views, release each."""
    import torch

    def step() -> int:
        messages = [sub.receive(10.0) for sub in subs]
        torch.stack([torch.from_dlpack(m.frame.planes[0]) for m in messages])
        for message in messages:
            message.release()
        return len(messages)

    return _measure(step, duration, warmup)


def rows(sources: list[int], fps_list: list[float], width: int, height: int, duration: float,
         rounds: int) -> list[dict[str, Any]]:
    """One row per (sources, fps, variant): the median of ``rounds`` rounds, the variants
    alternating within each round, on the same publishers."""
    import eglcuda

    out = []
    for count in sources:
        for fps in fps_list:
            with tempfile.TemporaryDirectory(prefix="eglcuda-bench-batcher-") as folder:
                os.chmod(folder, 0o700)
                children, paths = _publishers(count, folder, width, height, fps)
                subs = [eglcuda.Subscriber(f"source{i}", qos="every", queue=4, path=path, timeout=30)
                        for i, path in enumerate(paths)]
                try:
                    results: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
                    for round_index in range(rounds):
                        order = VARIANTS if round_index % 2 == 0 else VARIANTS[::-1]
                        for variant in order:
                            measure = batcher_variant if variant == "batcher" else loop_variant
                            results[variant].append(measure(subs, duration, min(1.0, duration / 3), fps))
                finally:
                    for sub in subs:
                        sub.close()
                    for child in children:
                        child.stdin.close()
                    for child in children:
                        try:
                            child.wait(30)
                        except subprocess.TimeoutExpired:
                            child.kill()
                            child.wait(10)
            for variant in VARIANTS:
                measured = results[variant]
                row: dict[str, Any] = {"sources": count, "fps": fps, "variant": variant}
                for key in measured[0]:
                    values = sorted(m[key] for m in measured)
                    row[key] = values[len(values) // 2]
                out.append(row)
    return out


def table(found: list[dict[str, Any]], width: int, height: int) -> str:
    """The rows as a Markdown table (docs/sources.md)."""
    lines = [f"Batches of one frame per source, {width}x{height} NV12, torch reading plane 0 of each batch:", "",
             "| sources | publishers' rate | variant | batches/s | frames/s | CPU us/frame | frames/batch |",
             "|---:|---|---|---:|---:|---:|---:|"]
    for row in found:
        rate = f"{row['fps']:g} fps" if row["fps"] else "flat out"
        lines.append(f"| {row['sources']} | {rate} | {row['variant']} | {row['batches_s']:,.0f} | "
                     f"{row['frames_s']:,.0f} | {row['cpu_us_frame']:.1f} | {row['fill']:.2f} |")
    return "\n".join(lines)


PROGRAM = "bench/sources.py --batcher"
TORCH = ("torch", "PyTorch for the batches' tensors and the hand-written loop's torch.stack", BENCH_HINT)


def main() -> int:
    parser = argparse.ArgumentParser(description="Batcher against a hand-written torch.stack loop")
    parser.add_argument("role", choices=["rows", "publish"])
    parser.add_argument("--sources", default="1,8,32", help="numbers of sources (comma-separated)")
    parser.add_argument("--fps", default="0,30", help="publishers' rates (comma-separated; 0: flat out)")
    parser.add_argument("--size", default="1920x1080", help="WIDTHxHEIGHT of the NV12 frames")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds measured per variant and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--width", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--height", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "publish":
        args.fps = float(args.fps)
        return publish(args)
    require(PROGRAM, "cuda-ipc", modules=[TORCH])
    width, height = (int(v) for v in args.size.lower().split("x"))
    found = rows([int(v) for v in args.sources.split(",")], [float(v) for v in args.fps.split(",")], width, height,
                 args.duration, args.rounds)
    print(table(found, width, height))
    return 0


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
