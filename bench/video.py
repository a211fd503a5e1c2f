"""Video pipeline: NVDEC decode -> frame topic -> subscribers, against what a user would write
instead, in one run (ratios are within the run). For each clip (1080p60 and 2160p60 H.264 by
default, made by tests/data/make_clips.py --bench), frames/s of:

- ``decode``: NVDEC decode only (PyNvVideoCodec ``Decode``; frames stay in the decoder's buffers);
- ``decode-locked``: decode through ``GetNumDecodedFrame`` + ``GetLockedFrame`` / ``UnlockFrame``
  (the decoder's side of publishing its buffers without a copy);
- ``publish-0``: decode + one device-to-device copy into a topic pool frame + publish, nobody
  subscribed (the cost of the copy and of the publisher);
- ``publish-1``, ``publish-3``: the same to 1 and 3 subscriber processes (qos every, CUDA IPC; each
  receives and releases), with decode-to-subscriber latency p50 / p99: from the moment a decoded
  frame is ready to the subscriber's ``receive`` returning, and to the frame's copy being complete
  on the subscriber's stream ("ready");
- ``publish-1-paced``: 1 subscriber, frames published at the clip's frame rate (latency without a
  backlog);
- ``pipeline-infer``: decoder process -> topic -> inference subscriber process (NV12 -> RGB, resize,
  a small CNN in PyTorch), rate at the subscriber;
- ``oneproc-infer``: the same decode and inference in one process, no streaming;
- ``cpu-decode``, ``cpu-upload``, ``cpu-infer``: the CPU path users fall back to: PyAV decodes on
  the CPU (threads AUTO), then ``to_ndarray("rgb24")`` and ``torch.from_numpy(...).cuda()``, then
  the same network;
- ``copy``: GPU time of the pool copy itself (two ``cuMemcpy2DAsync``, timed with CUDA events over
  200 copies) and its host cost per frame.

Each row runs in fresh processes, skips its first frames (the decoder's session start, cuDNN's
first kernels), then runs for --duration seconds, looping the clip.

    python bench/video.py [--quick] [--out DIR] [--duration S] [--clips A.mp4,B.mp4] [--rows r1,r2,...]
    python bench/video.py --plot-only DIR          # redraw the plots from DIR/results.json

Needs a GPU with NVDEC and PyNvVideoCodec (the ``video`` extra); PyTorch for the inference rows
and PyAV for the CPU rows (skipped with the reason without them). Writes results.json,
results.md and plots (matplotlib) to --out; the last line starts with SUMMARY. Exits 2 with one
line when there is no GPU, no PyNvVideoCodec or no clip.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _script import at_least, fail, output_folder, require, run  # noqa: E402

sys.path.insert(0, str(ROOT / "samples"))
import _video as video  # noqa: E402

PROGRAM = "bench/video.py"
GENERATED = ROOT / "tests" / "data" / "generated"
CLIPS = [GENERATED / "bench_1920x1080p60_h264.mp4", GENERATED / "bench_3840x2160p60_h264.mp4"]
ROWS = ["decode", "decode-locked", "publish-0", "publish-1", "publish-3", "publish-1-paced", "pipeline-infer",
        "oneproc-infer", "cpu-decode", "cpu-upload", "cpu-infer", "copy"]
LABELS = {
    "decode": "NVDEC decode only",
    "decode-locked": "NVDEC decode only, locked frames (zero-copy decoder side)",
    "publish-0": "decode + copy into the pool + publish, 0 subscribers",
    "publish-1": "decode + publish, 1 subscriber (every)",
    "publish-3": "decode + publish, 3 subscribers (every)",
    "publish-1-paced": "decode + publish at the clip's rate, 1 subscriber",
    "pipeline-infer": "decode -> topic -> inference process",
    "oneproc-infer": "one process: NVDEC decode + inference",
    "cpu-decode": "CPU: PyAV decode only",
    "cpu-upload": "CPU: PyAV decode + RGB + torch upload",
    "cpu-infer": "CPU: PyAV decode + RGB + upload + inference",
    "copy": "the pool copy alone (GPU time)",
}
WARMUP = 10  # frames not timed
TOPIC = "bench-video"


def emit(**result) -> None:
    print("RESULT " + json.dumps(result), flush=True)


def now_ns() -> int:
    return time.monotonic_ns()


class Timer:
    """Counts frames after the warm-up until ``duration`` seconds have passed."""

    def __init__(self, duration: float) -> None:
        self.duration = duration
        self.frames = -WARMUP
        self.started = 0.0

    def tick(self) -> bool:
        """Count one frame; False once the time is up."""
        self.frames += 1
        if self.frames == 0:
            self.started = time.perf_counter()
        return self.frames <= 0 or time.perf_counter() - self.started < self.duration

    def rate(self) -> float:
        elapsed = time.perf_counter() - self.started
        return self.frames / elapsed if self.frames > 0 and elapsed > 0 else math.nan


def open_clip(path: str):
    nvc, why = video.import_nvc()
    if nvc is None:
        raise SystemExit(why)
    return nvc, video.open_video(nvc, path)


# ==== the roles (each in its own process) ===============================================================

def role_decode(args) -> None:
    nvc, info = open_clip(args.clip)
    reader = video.NvdecReader(nvc, info, locked=args.row == "decode-locked")
    timer = Timer(args.duration)
    for frame in reader.frames(loops=1 << 20):
        reader.unlock(frame)
        if not timer.tick():
            break
    emit(role="main", rate=timer.rate(), frames=timer.frames,
         decode_ms_per_frame=1e3 * reader.decode_s / max(1, reader.decoded))


def role_publish(args) -> None:
    import eglcuda

    nvc, info = open_clip(args.clip)
    with eglcuda.Publisher(TOPIC, info.width, info.height, "NV12", fps=info.fps, path=args.path, pool=8,
                           every_timeout=30.0) as pub:
        emit(role="ready")
        deadline = time.monotonic() + 120
        while len(pub.subscribers) < args.n:
            if time.monotonic() > deadline:
                raise SystemExit(f"only {len(pub.subscribers)} of {args.n} subscribers joined")
            time.sleep(0.005)
        reader = video.NvdecReader(nvc, info)
        timer = Timer(args.duration)
        interval = 1.0 / info.fps if args.paced else 0.0
        host_us = []
        started = time.monotonic()
        for count, frame in enumerate(reader.frames(loops=1 << 20)):
            if interval:
                delay = started + count * interval - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            ready = now_ns()
            pool_frame = pub.next_frame(timeout=60)
            video.copy_into(pool_frame, frame, info.width)
            pub.publish(pool_frame, payload=video.pack_payload(frame.index, frame.pts), timestamp_ns=ready)
            video.cuda_sync(0)  # as the sample does: the decoder's buffer is read before its next Decode
            if timer.frames >= 0:
                host_us.append((now_ns() - ready) / 1e3)
            if not timer.tick():
                break
        rate = timer.rate()
        transports = sorted({s.transport for s in pub.subscribers})
        pub.close(timeout=60)
    emit(role="main", rate=rate, frames=timer.frames, transports=transports,
         copy_publish_host_us_p50=video.percentile(host_us, 0.5),
         decode_ms_per_frame=1e3 * reader.decode_s / max(1, reader.decoded))


def role_subscribe(args) -> None:
    import eglcuda

    sub = eglcuda.Subscriber(TOPIC, qos="every", queue=4, path=args.path, timeout=120)
    model = stream = torch = None
    if args.infer:
        import torch

        model = video.Inference(torch)
        model.warm_up(sub.info.height, sub.info.width)
        stream = torch.cuda.ExternalStream(sub.cuda_stream)
    emit(role="joined", transport=sub.info.transport)
    handover, ready, pending = [], [], []
    count, first, last = 0, 0.0, 0.0
    try:
        if torch is not None:
            torch.cuda.set_stream(stream)
        for message in sub:
            count += 1
            if model is not None:
                planes = message.frame.planes
                pending.append(model(video.torch_view(torch, planes[0]), video.torch_view(torch, planes[1])))
                if len(pending) >= 64:
                    torch.stack(pending).cpu()
                    pending.clear()
            if count > WARMUP:
                handover.append((message.received_ns - message.timestamp_ns) / 1e3)
                if model is None:
                    video.cuda_sync(sub.cuda_stream)
                    ready.append((now_ns() - message.timestamp_ns) / 1e3)
                last = time.perf_counter()
                first = first or last
        if pending:
            torch.stack(pending).cpu()
    finally:
        sub.close()
    timed = len(handover)
    emit(role="subscriber", frames=count, rate=(timed - 1) / (last - first) if timed > 1 and last > first else math.nan,
         p50_us=video.percentile(handover, 0.5), p99_us=video.percentile(handover, 0.99),
         ready_p50_us=video.percentile(ready, 0.5), ready_p99_us=video.percentile(ready, 0.99))


def role_oneproc(args) -> None:
    import torch

    import eglcuda

    nvc, info = open_clip(args.clip)
    model = video.Inference(torch)
    model.warm_up(info.height, info.width)
    reader = video.NvdecReader(nvc, info)
    timer = Timer(args.duration)
    pending = []
    for frame in reader.frames(loops=1 << 20):
        wrapped = eglcuda.Frame.from_pointer([frame.y, frame.uv], info.width, info.height, pitch=info.width,
                                             format="NV12")
        with torch.inference_mode():
            rgb = video.nv12_to_rgb(torch, torch.from_dlpack(wrapped.planes[0]), torch.from_dlpack(wrapped.planes[1]))
            converted = torch.cuda.Event()
            converted.record()
            pending.append(model.classify(rgb))
        if len(pending) >= 64:
            torch.stack(pending).cpu()
            pending.clear()
        converted.synchronize()  # the decoder's buffer is read before its next Decode writes it
        if not timer.tick():
            break
    if pending:
        torch.stack(pending).cpu()
    torch.cuda.synchronize()
    emit(role="main", rate=timer.rate(), frames=timer.frames)


def role_cpu(args) -> None:
    import av

    torch = model = None
    if args.row in ("cpu-upload", "cpu-infer"):
        import torch

        if args.row == "cpu-infer":
            model = video.Inference(torch)
    timer = Timer(args.duration)
    pending = []
    threads = os.cpu_count()
    done = False
    while not done:
        with av.open(args.clip) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            for frame in container.decode(stream):
                if torch is not None:
                    rgb = torch.from_numpy(frame.to_ndarray(format="rgb24")).cuda()
                    if model is not None:
                        x = rgb.permute(2, 0, 1).unsqueeze(0).float().mul_(1.0 / 255.0)
                        pending.append(model.classify(x))
                        if len(pending) >= 64:
                            torch.stack(pending).cpu()
                            pending.clear()
                if not timer.tick():
                    done = True
                    break
    if torch is not None:
        torch.cuda.synchronize()
    emit(role="main", rate=timer.rate(), frames=timer.frames, cpu_threads=threads)


def role_copy(args) -> None:
    import torch

    import eglcuda

    nvc, info = open_clip(args.clip)
    width, height = info.width, info.height
    source = torch.randint(0, 256, (height * 3 // 2, width), dtype=torch.uint8, device="cuda")
    frame = video.Decoded(0, source.data_ptr(), source.data_ptr() + width * height, 0, False)
    target = eglcuda.Frame.allocate(width, height, "NV12")
    for _ in range(10):
        video.copy_into(target, frame, width)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    count = 200
    started = time.perf_counter()
    start.record()
    for _ in range(count):
        video.copy_into(target, frame, width)
    end.record()
    host = (time.perf_counter() - started) / count
    end.synchronize()
    gpu_us = start.elapsed_time(end) * 1e3 / count
    check = target.to_numpy()
    whole = source.cpu().numpy()
    same = bool((check[0] == whole[:height]).all() and (check[1].reshape(-1, width) == whole[height:]).all())
    target.close()
    nbytes = width * height * 3 // 2
    emit(role="main", copy_gpu_us=gpu_us, copy_host_us=host * 1e6, bytes=nbytes,
         gb_per_s=2 * nbytes / (gpu_us * 1e-6) / 1e9, copied_right=same)


# ==== the orchestrator =================================================================================

def spawn(args, role: str, clip: str, row: str, extra: list[str] = ()) -> subprocess.Popen:
    argv = [sys.executable, __file__, "--role", role, "--clip", clip, "--row", row, "--duration", str(args.duration),
            *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def collect(children: list[subprocess.Popen], timeout: float) -> tuple[list[dict], str]:
    results, errors = [], []
    deadline = time.monotonic() + timeout
    for child in children:
        try:
            out, err = child.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            out, err = child.communicate()
            errors.append("timed out")
        results += [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
        if child.returncode:
            tail = [line for line in err.strip().splitlines() if line.strip()][-1:] or [f"exit {child.returncode}"]
            errors.append(tail[0][-300:])
    return results, "; ".join(errors)


def run_row(args, clip: str, row: str) -> dict:
    if row in ("decode", "decode-locked"):
        results, error = collect([spawn(args, "decode", clip, row)], 300)
    elif row in ("oneproc-infer", "copy"):
        results, error = collect([spawn(args, "oneproc" if row == "oneproc-infer" else "copy", clip, row)], 300)
    elif row.startswith("cpu-"):
        results, error = collect([spawn(args, "cpu", clip, row)], 300)
    else:
        n = {"publish-0": 0, "publish-1": 1, "publish-3": 3, "publish-1-paced": 1, "pipeline-infer": 1}[row]
        with tempfile.TemporaryDirectory(prefix="eglcuda-bench-video-") as folder:
            os.chmod(folder, 0o700)
            path = os.path.join(folder, f"{TOPIC}.topic")
            extra = ["--path", path, "--n", str(n)] + (["--paced"] if row == "publish-1-paced" else [])
            publisher = spawn(args, "publish", clip, row, extra)
            subs = [spawn(args, "subscribe", clip, row, ["--path", path] + (["--infer"] if row == "pipeline-infer"
                                                                             else [])) for _ in range(n)]
            results, error = collect([publisher, *subs], 300)
    main = [r for r in results if r.get("role") == "main"]
    subs = [r for r in results if r.get("role") == "subscriber"]
    if error or not main:
        return {"error": error or "no result"}
    out = {k: v for k, v in main[0].items() if k != "role"}
    if subs:
        out.update(subscribers=len(subs), subscriber_rate=min(s["rate"] for s in subs),
                   p50_us=max(s["p50_us"] for s in subs), p99_us=max(s["p99_us"] for s in subs),
                   ready_p50_us=max(s["ready_p50_us"] for s in subs), ready_p99_us=max(s["ready_p99_us"] for s in subs))
        if row == "pipeline-infer":
            out["publisher_rate"], out["rate"] = out["rate"], out["subscriber_rate"]
    elif row.startswith("publish"):
        out["subscribers"] = 0
    return out


def skip_reason(row: str) -> str | None:
    import importlib.util

    if row in ("pipeline-infer", "oneproc-infer", "cpu-upload", "cpu-infer", "copy") \
            and importlib.util.find_spec("torch") is None:
        return "needs PyTorch"
    if row.startswith("cpu-") and importlib.util.find_spec("av") is None:
        return "needs PyAV (pip install av)"
    return None


def size_name(info) -> str:
    return {1080: "1080p", 2160: "2160p (4K)", 720: "720p"}.get(info.height, f"{info.width}x{info.height}")


def markdown(doc: dict) -> str:
    lines = [f"Video pipeline, one run on {doc['device']}; {doc['duration']} s timed per row (after {WARMUP} frames); "
             "ratios against NVDEC decode only (and, for the inference rows, against one process).", ""]
    for clip in doc["clips"]:
        rows = [r for r in doc["rows"] if r["clip"] == clip["path"]]
        base = next((r.get("rate") for r in rows if r["row"] == "decode" and "rate" in r), math.nan)
        oneproc = next((r.get("rate") for r in rows if r["row"] == "oneproc-infer" and "rate" in r), math.nan)
        lines += [f"### {clip['size']}: {os.path.basename(clip['path'])} ({clip['width']}x{clip['height']} "
                  f"{clip['codec']}, {clip['fps']:g} fps)", "",
                  "| row | frames/s | vs decode only | latency p50 / p99 us (hand-over) | ready p50 / p99 us |",
                  "|---|---:|---:|---:|---:|"]
        for row in rows:
            name = LABELS.get(row["row"], row["row"])
            if "skipped" in row or "error" in row:
                lines.append(f"| {name} | {row.get('skipped') or 'ERROR ' + row['error']} | | | |")
                continue
            if row["row"] == "copy":
                lines.append(f"| {name} | {row['copy_gpu_us']:.1f} us GPU, {row['copy_host_us']:.1f} us host per frame "
                             f"({row['gb_per_s']:.0f} GB/s) | {row['copy_gpu_us'] * base / 1e6:.2%} of a decode | | |")
                continue
            ratio = row["rate"] / base if base == base else math.nan
            if row["row"] in ("pipeline-infer", "cpu-infer") and oneproc == oneproc:
                ratio_text = f"{ratio:.2f}x ({row['rate'] / oneproc:.2f}x one process)"
            else:
                ratio_text = f"{ratio:.2f}x"
            latency = (f"{row['p50_us']:.0f} / {row['p99_us']:.0f}" if "p50_us" in row else "")
            known = "ready_p50_us" in row and not math.isnan(row["ready_p50_us"])
            ready = f"{row['ready_p50_us']:.0f} / {row['ready_p99_us']:.0f}" if known else ""
            lines.append(f"| {name} | {row['rate']:.0f} | {ratio_text} | {latency} | {ready} |")
        lines.append("")
    return "\n".join(lines)


def _hbars(path: pathlib.Path, title: str, xlabel: str, labels: list[str], series: dict[str, list[float]]) -> None:
    """Horizontal grouped bars (one group per label, one bar per series), log x axis, values written."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    count = max(1, len(series))
    height = 0.8 / count
    figure, axes = plt.subplots(figsize=(10, 0.45 * len(labels) * max(1, count) + 1.6), layout="constrained")
    for index, (name, values) in enumerate(series.items()):
        positions = [y + (index - (count - 1) / 2) * height for y in range(len(labels))]
        shown = [(p, v) for p, v in zip(positions, values) if v == v and v > 0]
        if shown:
            bars = axes.barh([p for p, _ in shown], [v for _, v in shown], height * 0.95, label=name)
            axes.bar_label(bars, fmt="%.4g", fontsize=7, padding=2)
    axes.set_yticks(range(len(labels)), labels, fontsize=8)
    axes.invert_yaxis()
    axes.set_xscale("log")
    axes.set_xlabel(xlabel)
    axes.set_title(title)
    axes.grid(axis="x", color="#dddddd")
    axes.set_axisbelow(True)
    axes.legend(fontsize=8, loc="lower right")
    figure.savefig(path, dpi=110)
    plt.close(figure)


def plot(doc: dict, out: pathlib.Path) -> list[str]:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return []
    written = []

    def values(row: str, key: str) -> list[float]:
        found = []
        for clip in doc["clips"]:
            hit = next((r for r in doc["rows"] if r["clip"] == clip["path"] and r["row"] == row and key in r), None)
            found.append(float(hit[key]) if hit else math.nan)
        return found

    rate_rows = [r for r in ROWS if r != "copy" and any(v == v for v in values(r, "rate"))]
    if rate_rows:
        series = {clip["size"]: [values(r, "rate")[i] for r in rate_rows] for i, clip in enumerate(doc["clips"])}
        _hbars(out / "video_rates.png", f"Frames/s on {doc['device']}: NVDEC -> topic -> subscribers, one process, CPU",
               "frames/s (log scale)", [LABELS[r] for r in rate_rows], series)
        written.append("video_rates.png")
    latency_rows = [r for r in ("publish-1-paced", "publish-1", "publish-3", "pipeline-infer")
                    if any(v == v for v in values(r, "p50_us"))]
    if latency_rows:
        labels = [f"{LABELS[r]} {q}" for r in latency_rows for q in ("p50", "p99")]
        series = {clip["size"]: [values(r, f"{q}_us")[i] for r in latency_rows for q in ("p50", "p99")]
                  for i, clip in enumerate(doc["clips"])}
        _hbars(out / "video_latency.png", "Decode-to-subscriber latency (receive returned)", "microseconds (log scale)",
               labels, series)
        written.append("video_latency.png")
    return written


def summary_line(doc: dict) -> str:
    parts = []
    for clip in doc["clips"]:
        rows = {r["row"]: r for r in doc["rows"] if r["clip"] == clip["path"] and ("rate" in r or "copy_gpu_us" in r)}

        def rate(name: str) -> str:
            return f"{rows[name]['rate']:.0f}/s" if name in rows else "n/a"

        text = (f"{clip['size']}: decode {rate('decode')}, locked {rate('decode-locked')}, publish-0 "
                f"{rate('publish-0')}, publish-3 {rate('publish-3')}")
        if "publish-3" in rows:
            text += f" (p50 {rows['publish-3']['p50_us']:.0f} us, p99 {rows['publish-3']['p99_us']:.0f} us)"
        text += (f", infer: pipeline {rate('pipeline-infer')} / one process {rate('oneproc-infer')} / CPU "
                 f"{rate('cpu-infer')}")
        if "copy" in rows:
            text += f", copy {rows['copy']['copy_gpu_us']:.1f} us GPU"
        parts.append(text)
    return "; ".join(parts) or "no results"


def format_row(row: dict) -> str:
    label = f"{row['size']:>11} {row['row']:<16}"
    if "skipped" in row:
        return f"{label}: skipped ({row['skipped']})"
    if "error" in row:
        return f"{label}: ERROR {row['error']}"
    if row["row"] == "copy":
        return (f"{label}: {row['copy_gpu_us']:.1f} us GPU, {row['copy_host_us']:.1f} us host per frame, "
                f"{row['gb_per_s']:.0f} GB/s, copied right: {row['copied_right']}")
    text = f"{label}: {row['rate']:9.1f} frames/s"
    if "p50_us" in row:
        text += f", latency p50 {row['p50_us']:.0f} us p99 {row['p99_us']:.0f} us"
        if not math.isnan(row["ready_p50_us"]):
            text += f", ready p50 {row['ready_p50_us']:.0f} us"
    if "copy_publish_host_us_p50" in row:
        text += f", copy+publish {row['copy_publish_host_us_p50']:.0f} us host"
    return text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--quick", action="store_true", help="one second per row")
    parser.add_argument("--out", default="bench-video", help="folder for results and plots")
    parser.add_argument("--duration", type=at_least(0, float, above=True), default=None, help="timed seconds per row (default 3, quick 1)")
    parser.add_argument("--clips", default=None, help="comma-separated videos (default: the 1080p and 4K bench clips)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"from {','.join(ROWS)}")
    parser.add_argument("--plot-only", metavar="DIR", help="redraw the plots and table from DIR/results.json")
    parser.add_argument("--role", choices=["decode", "publish", "subscribe", "oneproc", "cpu", "copy"],
                        help=argparse.SUPPRESS)
    parser.add_argument("--clip", help=argparse.SUPPRESS)
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--paced", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--infer", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    output_folder(parser, "--out", args.out)
    if args.role:
        {"decode": role_decode, "publish": role_publish, "subscribe": role_subscribe, "oneproc": role_oneproc,
         "cpu": role_cpu, "copy": role_copy}[args.role](args)
        return 0
    if args.plot_only:
        folder = pathlib.Path(args.plot_only)
        try:
            doc = json.loads((folder / "results.json").read_text())
        except (OSError, ValueError) as exc:
            fail(PROGRAM, f"cannot read {folder / 'results.json'}: {exc}", 2)  # a bad --plot-only DIR
        try:
            table = markdown(doc)
            plots = plot(doc, folder)
        except (KeyError, TypeError, AttributeError, ValueError) as exc:  # (a file of another shape)
            fail(PROGRAM, f"{folder / 'results.json'} is not this benchmark's results ({exc!r})", 2)
        (folder / "results.md").write_text(table + "\n")
        print(f"wrote {folder}/results.md, {', '.join(plots) or 'no plots (no matplotlib)'}")
        return 0

    rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}: choose from {','.join(ROWS)}")
    if not rows:
        parser.error(f"--rows names at least one row from {','.join(ROWS)}, got {args.rows!r}")
    require(PROGRAM, "cuda")
    nvc, why = video.import_nvc()
    if nvc is None:
        fail(PROGRAM, why, 2)
    clips = [pathlib.Path(c) for c in args.clips.split(",")] if args.clips else CLIPS
    present = [c for c in clips if c.exists()]
    if not present:
        fail(PROGRAM, f"needs a video clip: none of {', '.join(str(c) for c in clips)} exists (make them with "
                      "python tests/data/make_clips.py --bench)", 2)
    args.duration = args.duration or (1.0 if args.quick else 3.0)
    out = pathlib.Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    import eglcuda

    device = eglcuda.get_device(0).info.name
    doc = {"device": device, "duration": args.duration, "quick": args.quick, "clips": [], "rows": []}
    for clip in clips:
        if not clip.exists():
            print(f"{clip}: missing, skipped (python tests/data/make_clips.py --bench makes it)", flush=True)
            continue
        try:
            info = video.open_video(nvc, str(clip))
        except video.VideoProblem as exc:
            print(f"{clip}: {exc}", flush=True)
            continue
        problem = video.nvdec_problem(nvc, info)
        entry = {"path": str(clip), "size": size_name(info), "width": info.width, "height": info.height,
                 "codec": info.codec, "fps": info.fps}
        doc["clips"].append(entry)
        for row in rows:
            why = problem or skip_reason(row)
            result = {"skipped": why} if why else run_row(args, str(clip), row)
            record = {"clip": str(clip), "size": entry["size"], "row": row, **result}
            doc["rows"].append(record)
            print(format_row(record), flush=True)
            (out / "results.json").write_text(json.dumps(doc, indent=1))  # what ran so far, if cut short
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    table = markdown(doc)
    (out / "results.md").write_text(table + "\n")
    written = plot(doc, out)
    print("\n" + table)
    print(f"wrote {out}/results.json, results.md, {', '.join(written) or 'no plots (matplotlib is not installed)'}")
    print("SUMMARY " + summary_line(doc))
    return 1 if any("error" in r for r in doc["rows"]) else 0


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
