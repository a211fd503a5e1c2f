"""A video pipeline: NVDEC decode -> frame topic -> inference, GL preview and stats in other processes.

This process decodes FILE (H.264 or HEVC, 8-bit 4:2:0) with NVDEC through PyNvVideoCodec, copies
each decoded NV12 frame into a pool frame of an eglcuda topic (one device-to-device copy: the
decoder writes its buffers again at its next call) and publishes it, at the file's frame rate
(--realtime, the default) or as fast as the subscribers take frames (--max). Each subscriber is
its own process (spawned: CUDA does not survive fork):

- infer: NV12 -> RGB on the GPU, resize to 224x224, a small convolutional network in PyTorch
  (random weights); prints its rate and the latest result every second, writes inference.csv;
- gl: a GL texture subscriber (EGLStream): draws every frame into an offscreen framebuffer, reads
  back the frame index band, and writes contact_sheet.png with every n-th frame;
- stats: decode-to-subscriber latency of every frame (when receive returns, and when the frame's
  GPU copy is complete), written as latency.csv and latency_histogram.png (matplotlib).

--check: the decoder sends the SHA-256 of every decoded Y and UV plane with its frame; infer and
stats recompute them from what they received, the GL subscriber checks the frame index in the
picture and its colours, and the decoder compares its digests with the CPU decoder's
(tests/data/clips.json, or FILE.json beside a generated clip). The frame index checks need a clip
made by tests/data/make_clips.py, which carries the index in a band of its picture; on another
clip they say "not checked", and the digests are still compared.

    python samples/video_pipeline.py FILE [--max] [--frames N] [--loop K] [--qos every|latest]
                                     [--subscribers infer,gl,stats] [--check] [--out DIR]

Writes its pictures and tables to --out (default video-pipeline-out), prints a summary and a last
line "RESULT {json}". Exits 0 when every subscriber got its frames (every: all of them; with
--check: all checks passed), 1 otherwise, 2 with one line when something it needs is missing
(a GPU, PyNvVideoCodec, NVDEC for the file, the file, PyTorch, PyOpenGL).
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
import threading
import time

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
from _sample import PYOPENGL, fail, lazy, one_line, require  # noqa: E402
import _video as video  # noqa: E402

np = lazy("numpy")
PROGRAM = "samples/video_pipeline.py"
ROLES = ("infer", "gl", "stats")
TOPIC = "video"
TORCH = ("torch", "PyTorch for the inference subscriber", "pip install torch (the build for your CUDA version)")
SHEET_THUMBS = 16  # frames on the contact sheet, about


def report(**message) -> None:
    print(json.dumps(message), flush=True)


def say(role: str, text: str) -> None:
    print(f"{role}: {text}", file=sys.stderr, flush=True)


def band_reader():
    """tests/data/make_clips.py's frame index reader when this runs from a checkout (the test
    clips carry their index in the picture), else None."""
    try:
        sys.path.insert(0, str(ROOT))
        from tests.data.make_clips import frame_index_from_luma
    except ImportError:
        return None
    finally:
        sys.path.remove(str(ROOT))
    return frame_index_from_luma


def carries_index_band(shown: list[int | None]) -> bool:
    """Whether a clip carries tests/data/make_clips.py's frame index band: most of its frames have
    a readable one (None: unreadable). Another clip's pictures are not checked for an index (the
    digests still are); in a clip with the band, an unreadable one is a wrong frame."""
    return bool(shown) and 2 * sum(index is not None for index in shown) >= len(shown)


def manifest_entry(path: str) -> dict | None:
    """The CPU decoder's digests of ``path``: its entry in tests/data/clips.json, or FILE.json."""
    name = os.path.basename(path)
    for candidate in (pathlib.Path(path).with_name(name + ".json"), ROOT / "tests" / "data" / "clips.json"):
        if not candidate.is_file():  # (a FIFO there would wait for a writer)
            continue
        try:
            entries = json.loads(candidate.read_text())
        except (OSError, ValueError):
            continue
        entry = entries.get(name) if isinstance(entries, dict) else None
        if isinstance(entry, dict) and entry.get("bytes") == os.path.getsize(path) and digests_of(entry):
            return entry
    return None


def digests_of(entry: dict) -> bool:
    """Whether a manifest entry is one: a frame count and that many Y and UV digests (else it is
    not used, rather than read as one)."""
    frames = entry.get("frames")
    return (type(frames) is int and frames >= 0
            and all(isinstance(entry.get(key), list) and len(entry[key]) >= frames
                    for key in ("y_sha256", "uv_sha256")))


# ==== subscribers ====================================================================================

class Tally:
    """What a subscriber received: sequence numbers, skips, and its checks."""

    def __init__(self) -> None:
        self.frames = 0
        self.first = None
        self.last = None
        self.out_of_order = 0
        self.skipped = 0
        self.checked = 0
        self.bad = 0
        self.bad_seqs: list[int] = []
        self.started = None
        self.ended = None

    def got(self, message) -> None:
        now = time.monotonic()
        self.started = self.started or now
        self.ended = now
        if self.last is not None and message.seq <= self.last:
            self.out_of_order += 1
        self.first = message.seq if self.first is None else self.first
        self.last = message.seq
        self.frames += 1
        self.skipped += message.skipped

    def check(self, ok: bool, seq: int) -> None:
        self.checked += 1
        if not ok:
            self.bad += 1
            if len(self.bad_seqs) < 10:
                self.bad_seqs.append(seq)

    def summary(self) -> dict:
        span = (self.ended - self.started) if self.started is not None and self.ended is not None else 0.0
        missing = 0 if self.first is None else (self.last - self.first + 1 - self.frames)
        return {"frames": self.frames, "first_seq": self.first, "last_seq": self.last, "missing": missing,
                "out_of_order": self.out_of_order, "skipped": self.skipped, "checked": self.checked, "bad": self.bad,
                "bad_seqs": self.bad_seqs, "rate": (self.frames - 1) / span if span > 0 else math.nan}


def digests_match(message) -> bool:
    payload = video.unpack_payload(message.payload)
    if payload["digests"] is None:
        raise RuntimeError("--check: the decoder sent no digests")
    return video.nv12_digests(*video.received_nv12(message.frame)) == payload["digests"]


def subscribe(args, **extra):
    import eglcuda

    return eglcuda.Subscriber(TOPIC, qos=args.qos, queue=extra.pop("queue", 4), path=args.path, timeout=60,
                              **extra)


def infer_role(args) -> dict:
    import torch

    sub = subscribe(args, transport=args.transport)
    width, height = sub.info.width, sub.info.height
    model = video.Inference(torch)
    model.warm_up(height, width)
    stream = torch.cuda.ExternalStream(sub.cuda_stream)
    report(event="ready", role="infer", transport=sub.info.transport)
    tally = Tally()
    pending: list[tuple[int, int, object]] = []
    rows: list[tuple[int, int, int, float]] = []
    last_print, printed = time.monotonic(), 0

    def flush() -> None:
        if pending:
            values = torch.stack([out for _, _, out in pending]).cpu().tolist()
            rows.extend((seq, index, int(c), p) for (seq, index, _), (c, p) in zip(pending, values))
            pending.clear()

    try:
        with torch.cuda.stream(stream):
            for message in sub:  # each step releases the previous message (after the work queued on `stream`)
                tally.got(message)
                planes = message.frame.planes
                out = model(video.torch_view(torch, planes[0]), video.torch_view(torch, planes[1]))
                pending.append((message.seq, video.unpack_payload(message.payload)["index"], out))
                if args.check:
                    tally.check(digests_match(message), message.seq)
                now = time.monotonic()
                if now - last_print >= 1.0:
                    flush()
                    seq, index, cls, probability = rows[-1]
                    say("infer", f"{(tally.frames - printed) / (now - last_print):6.1f} frames/s; frame {index}: "
                                 f"class {cls} (p {probability:.3f})")
                    last_print, printed = now, tally.frames
        flush()
    finally:
        sub.close()
    path = os.path.join(args.out, "inference.csv")
    with open(path, "w") as out:
        out.write("seq,frame,class,probability\n")
        out.writelines(f"{seq},{index},{cls},{p:.6f}\n" for seq, index, cls, p in rows)
    classes = sorted({cls for _, _, cls, _ in rows})
    return {**tally.summary(), "transport": sub.info.transport, "csv": path, "classes_seen": classes}


def stats_role(args) -> dict:
    sub = subscribe(args, transport=args.transport)
    report(event="ready", role="stats", transport=sub.info.transport)
    tally = Tally()
    rows = []
    try:
        for message in sub:
            tally.got(message)
            handover = (message.received_ns - message.timestamp_ns) / 1e3
            video.cuda_sync(sub.cuda_stream)  # the frame's copy into the pool is complete, seen from here
            ready = (time.monotonic_ns() - message.timestamp_ns) / 1e3
            payload = video.unpack_payload(message.payload)
            rows.append((message.seq, payload["index"], payload["pts"], handover, ready, message.skipped))
            if args.check:
                tally.check(digests_match(message), message.seq)
    finally:
        sub.close()
    csv_path = os.path.join(args.out, "latency.csv")
    with open(csv_path, "w") as out:
        out.write("seq,frame,pts,handover_us,ready_us,skipped\n")
        out.writelines(f"{s},{i},{p},{h:.1f},{r:.1f},{k}\n" for s, i, p, h, r, k in rows)
    handover = [r[3] for r in rows]
    ready = [r[4] for r in rows]
    png = os.path.join(args.out, "latency_histogram.png")
    title = f"decode -> subscriber latency, {sub.info.width}x{sub.info.height} NV12, {sub.info.transport}, {args.qos}"
    drawn = video.latency_histogram(png, {"hand-over (receive returned)": handover,
                                          "ready (the frame's GPU copy complete)": ready}, title)
    if not drawn:
        say("stats", "matplotlib is not installed: wrote latency.csv only (pip install matplotlib for the histogram)")
    return {**tally.summary(), "transport": sub.info.transport, "csv": csv_path, "png": png if drawn else None,
            "handover_p50_us": video.percentile(handover, 0.5), "handover_p99_us": video.percentile(handover, 0.99),
            "ready_p50_us": video.percentile(ready, 0.5), "ready_p99_us": video.percentile(ready, 0.99)}


def gl_role(args) -> dict:
    import eglcuda

    display = eglcuda.Display.for_cuda_device(0)
    context = display.create_context()
    context.make_current()
    sub = subscribe(args, queue=2, gl_context=context)
    width, height = sub.info.width, sub.info.height
    preview = video.GLPreview(width, height, external=True)
    read_index = band_reader() if args.check else None
    band = (min(width, 320), min(height, 64))
    report(event="ready", role="gl", transport=sub.info.transport)
    tally = Tally()
    sheet = video.ContactSheet()
    colours: list[dict] = []
    flipped = 0
    shown_indices: list[tuple[int, int | None, int]] = []  # (seq, index read from the picture, index sent)
    try:
        for message in sub:
            tally.got(message)
            preview.draw(message.frame.texture)
            index = video.unpack_payload(message.payload)["index"]
            if read_index is not None:
                strip = preview.read(0, 0, *band)  # also waits for the drawing
                try:
                    shown = read_index(strip[..., 1])
                except ValueError:
                    shown = None
                    try:  # the picture upside down would read from the bottom rows, reversed
                        if read_index(preview.read(0, height - band[1], *band)[::-1, :, 1]) == index:
                            flipped += 1
                    except ValueError:
                        pass
                shown_indices.append((message.seq, shown, index))
            if message.seq % args.sheet_every == 0:
                full = preview.read()
                sheet.add(full, index)
                reference = os.path.join(args.out, "reference", f"{message.seq:06d}.npy")
                if args.check and os.path.exists(reference):
                    nv12 = np.load(reference)
                    name, error, swapped = video.best_color_match(full, nv12[:height], nv12[height:])
                    colours.append({"seq": message.seq, "convention": name, "mean_abs_error": round(error, 2),
                                    "swapped": swapped})
            elif read_index is None:
                preview.read(0, 0, 1, 1)  # wait for the drawing before the frame goes back
    finally:
        sub.close()
        preview.delete()
        context.release()
        context.close()
        display.close()
    index_checked = read_index is not None and carries_index_band([shown for _, shown, _ in shown_indices])
    if index_checked:
        for seq, shown, index in shown_indices:
            tally.check(shown == index, seq)
    elif read_index is not None:
        say("gl", "the pictures carry no frame index band (not a tests/data/make_clips.py clip): not checked")
    path = os.path.join(args.out, "contact_sheet.png")
    if sheet.thumbs:
        video.write_png(path, sheet.image())
    result = {**tally.summary(), "transport": sub.info.transport, "sheet": path if sheet.thumbs else None,
              "sheet_frames": [label for label, _ in sheet.thumbs], "colour_checks": colours,
              "index_checked": index_checked}
    if flipped:
        result["rows_flipped"] = flipped
    return result


def subscriber(args) -> int:
    role = args.role
    try:
        result = {"infer": infer_role, "gl": gl_role, "stats": stats_role}[role](args)
    except Exception as exc:  # noqa: BLE001 - reported to the decoder, which prints it
        if os.environ.get("EGLCUDA_TRACEBACK") == "1":
            raise
        report(event="done", role=role, error=one_line(exc))
        return 1
    report(event="done", role=role, **result)
    return 0


# ==== the decoder =====================================================================================

class Child:
    """A spawned subscriber; its JSON lines are collected by a reader thread."""

    def __init__(self, role: str, argv: list[str]) -> None:
        self.role = role
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        self.messages: list[dict] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            try:
                self.messages.append(json.loads(line))
            except ValueError:
                print(line, end="", file=sys.stderr)

    def find(self, event: str) -> dict | None:
        return next((m for m in list(self.messages) if m.get("event") == event), None)

    def wait_for(self, event: str, deadline: float) -> dict | None:
        while time.monotonic() < deadline:
            found = self.find(event)
            if found is not None or (self.process.poll() is not None and not self.reader.is_alive()):
                return found or self.find("done")
            time.sleep(0.01)
        return None

    def finish(self, timeout: float) -> dict:
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        self.reader.join(10)
        return self.find("done") or {"role": self.role, "error": f"exited with status {self.process.returncode} "
                                                                  "without a result"}


def count_frames(nvc, info, limit: int = 1 << 20) -> int | None:
    """Packets in the file (one per frame for these codecs in MP4/MKV), when it is not huge."""
    if os.path.getsize(info.path) > 500 << 20:
        return None
    count = 0
    for packet in nvc.CreateDemuxer(filename=info.path):
        count += packet.bsl > 0
        if count >= limit:
            break
    return count


def decode_and_publish(args, nvc, info, pub, children) -> dict:
    import eglcuda  # noqa: F401 - the pool frames are eglcuda's

    width, height = info.width, info.height
    reader = video.NvdecReader(nvc, info, latency=args.decode_latency)
    check = args.check
    read_index = band_reader() if check else None
    dump = check and "gl" in args.roles and width * height <= 1920 * 1080
    if dump:
        os.makedirs(os.path.join(args.out, "reference"), exist_ok=True)
    interval = 0.0 if args.max else 1.0 / info.fps
    digests, indices, copy_us = [], [], []
    corrupt = int(os.environ.get("EGLCUDA_VIDEO_CORRUPT", "-1"))
    published = 0
    started = time.monotonic()
    for frame in reader.frames(loops=args.loop):
        if args.frames and published >= args.frames:
            break
        if any(c.process.poll() is not None for c in children):
            raise RuntimeError("a subscriber exited early: " + "; ".join(
                f"{c.role}: {(c.find('done') or {}).get('error', 'no reason given')}" for c in children
                if c.process.poll() is not None))
        if interval:
            delay = started + published * interval - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        sums = None
        if check:
            y, uv = video.host_nv12(frame, width, height)
            sums = video.nv12_digests(y, uv)
            digests.append((sums[0].hex(), sums[1].hex()))
            if read_index is not None:
                try:
                    indices.append(read_index(y))
                except ValueError:
                    indices.append(None)
            if dump and published % args.sheet_every == 0:
                np.save(os.path.join(args.out, "reference", f"{published:06d}.npy"), np.concatenate([y, uv]))
        if sums is not None and corrupt == published:
            sums = (bytes(32), sums[1])  # a test hook (EGLCUDA_VIDEO_CORRUPT=N): the checks must catch it
        ready_ns = time.monotonic_ns()
        pool_frame = pub.next_frame(timeout=60)
        video.copy_into(pool_frame, frame, width)
        pub.publish(pool_frame, payload=video.pack_payload(frame.index, frame.pts, sums), timestamp_ns=ready_ns)
        # The copy read the decoder's buffer, which its next Decode call writes: wait for it (both
        # are on the legacy default stream, so this only matters if the decoder used another).
        video.cuda_sync(0)
        copy_us.append((time.monotonic_ns() - ready_ns) / 1e3)
        published += 1
    elapsed = time.monotonic() - started
    result = {"frames": published, "elapsed_s": elapsed, "rate": published / elapsed if elapsed > 0 else math.nan,
              "decode_ms_per_frame": 1e3 * reader.decode_s / max(1, reader.decoded),
              "copy_publish_us_p50": video.percentile(copy_us, 0.5),
              "copy_publish_us_p99": video.percentile(copy_us, 0.99)}
    if check:
        result["digests"] = digests
        if read_index is not None:
            # None: the clip has no index band, so there is nothing to compare (not a failure).
            result["index_ok"] = indices == list(range(len(indices))) if carries_index_band(indices) else None
        entry = manifest_entry(info.path)
        if entry is not None:
            same = [n < entry["frames"] and digests[n] == (entry["y_sha256"][n], entry["uv_sha256"][n])
                    for n in range(len(digests))]
            result["cpu_decoder"] = {"compared": len(same), "bit_exact": sum(same),
                                     "first_difference": next((n for n, s in enumerate(same) if not s), None)}
    return result


def verdict(role_result: dict, published: int, qos: str, check: bool) -> tuple[bool, str]:
    if "error" in role_result:
        return False, f"FAILED: {role_result['error']}"
    r = role_result
    problems = []
    if qos == "every":
        if r["frames"] != published or r["first_seq"] != 0 or r["missing"] or r["skipped"]:
            problems.append(f"got {r['frames']} of {published} frames (first {r['first_seq']}, {r['missing']} missing, "
                            f"{r['skipped']} skipped)")
    elif r["frames"] == 0:
        problems.append("got no frame")
    if r["out_of_order"]:
        problems.append(f"{r['out_of_order']} out of order")
    if check and r["role"] != "gl" and (r["checked"] != r["frames"] or r["bad"]):
        problems.append(f"{r['bad']} of {r['checked']} frames differ from the decoder's (seq {r['bad_seqs']})")
    if check and r["role"] == "gl":
        if r.get("index_checked") and r["bad"]:
            problems.append(f"{r['bad']} of {r['checked']} pictures show another frame index (seq {r['bad_seqs']})"
                            + (f"; {r['rows_flipped']} read upside down" if r.get("rows_flipped") else ""))
        for colour in r.get("colour_checks", []):
            if colour["swapped"] or colour["mean_abs_error"] > video.GL_COLOUR_TOLERANCE:
                problems.append(f"frame seq {colour['seq']} colours match {colour['convention']} at best "
                                f"(mean error {colour['mean_abs_error']})")
                break
    return not problems, "; ".join(problems) or "PASS"


def run_pipeline(args, nvc, info) -> int:
    import eglcuda

    os.makedirs(args.out, exist_ok=True)
    total = count_frames(nvc, info)
    if total is not None:
        total *= args.loop
        if args.frames:
            total = min(total, args.frames)
    if args.sheet_every is None:
        args.sheet_every = max(1, math.ceil((total or int(info.fps * 10)) / SHEET_THUMBS))
    mode = "as fast as the subscribers take them" if args.max else f"at {info.fps:g} frames/s"
    print(f"decoding {info.path}: {info.width}x{info.height} {info.codec}, {total or 'unknown number of'} frames, "
          f"published {mode} to {', '.join(args.roles)} (qos {args.qos})", flush=True)
    with tempfile.TemporaryDirectory(prefix="eglcuda-video-") as folder:
        os.chmod(folder, 0o700)
        args.path = os.path.join(folder, f"{TOPIC}.topic")
        with eglcuda.Publisher(TOPIC, info.width, info.height, "NV12", fps=info.fps, path=args.path, pool=8,
                               every_timeout=30.0) as pub:
            common = ["--path", args.path, "--out", args.out, "--qos", args.qos, "--transport", args.transport,
                      "--sheet-every", str(args.sheet_every)] + (["--check"] if args.check else [])
            children = [Child(role, [sys.executable, __file__, "--role", role, *common]) for role in args.roles]
            deadline = time.monotonic() + 120
            try:
                for child in children:
                    ready = child.wait_for("ready", deadline)
                    if ready is None or ready.get("event") != "ready":
                        why = (ready or {}).get("error", "did not join within 120 s")
                        raise RuntimeError(f"the {child.role} subscriber did not start: {why}")
                decoder = decode_and_publish(args, nvc, info, pub, children)
                transports = {s.pid: s.transport for s in pub.subscribers}
            except BaseException:
                for child in children:
                    child.process.kill()
                raise
            finally:
                pub.close(timeout=60)  # subscribers read what is queued, then leave
        results = [child.finish(120) for child in children]
    published = decoder["frames"]
    print(f"decoder: {published} frames in {decoder['elapsed_s']:.2f} s = {decoder['rate']:.1f} frames/s; NVDEC "
          f"{decoder['decode_ms_per_frame']:.2f} ms/frame, copy into the pool + publish p50 "
          f"{decoder['copy_publish_us_p50']:.0f} us (transports by pid: {transports})")
    failed = False
    if args.check:
        if decoder.get("index_ok") is False:
            failed = True
            print("decoder: FAIL: the decoded frames' index bands are not 0, 1, 2, ... in order")
        elif "index_ok" in decoder and decoder["index_ok"] is None:
            print("decoder: the frames carry no index band (not a tests/data/make_clips.py clip): order not checked")
        cpu = decoder.get("cpu_decoder")
        if cpu is None:
            print("decoder: no CPU decoder digests for this file (tests/data/clips.json or FILE.json): not compared")
        else:
            exact = cpu["bit_exact"] == cpu["compared"]
            print(f"decoder: NVDEC vs the CPU decoder: {cpu['bit_exact']} of {cpu['compared']} frames bit-exact"
                  + ("" if exact else f" (first difference at frame {cpu['first_difference']}; reported, not a failure)"))
    for result in results:
        result.setdefault("role", "?")
        ok, why = verdict(result, published, args.qos, args.check)
        result["ok"] = ok
        failed |= not ok
        line = f"{result['role']:6s} {'PASS' if ok else 'FAIL'}"
        if "error" not in result:
            line += f": {result['frames']} frames via {result['transport']}, {result['skipped']} skipped"
            if args.check:
                line += f", {result['checked']} checked, {result['bad']} wrong"
            if result["role"] == "stats":
                line += (f"; latency p50/p99: hand-over {result['handover_p50_us']:.0f}/{result['handover_p99_us']:.0f}"
                         f" us, ready {result['ready_p50_us']:.0f}/{result['ready_p99_us']:.0f} us -> {result['csv']}"
                         + (f", {result['png']}" if result.get("png") else ""))
            elif result["role"] == "infer":
                line += f"; {result['rate']:.1f} frames/s -> {result['csv']}"
            elif result["role"] == "gl":
                line += f"; contact sheet of {len(result['sheet_frames'])} frames -> {result['sheet']}"
                for colour in result.get("colour_checks", [])[:1]:
                    line += f"; colours: {colour['convention']} (mean error {colour['mean_abs_error']})"
        if not ok:
            line += f" -- {why}"
        print(line)
    summary = {"file": info.path, "width": info.width, "height": info.height, "codec": info.codec, "fps": info.fps,
               "qos": args.qos, "max": args.max, "check": args.check, "decoder": decoder, "subscribers": results,
               "ok": not failed}
    with open(os.path.join(args.out, "summary.json"), "w") as out:
        json.dump(summary, out, indent=1)
    short = {**summary, "decoder": {k: v for k, v in decoder.items() if k != "digests"}}
    print("RESULT " + json.dumps(short), flush=True)
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("file", nargs="?", help="an H.264 or HEVC video (MP4, MKV, ...)")
    pace = parser.add_mutually_exclusive_group()
    pace.add_argument("--realtime", action="store_true", help="publish at the file's frame rate (the default)")
    pace.add_argument("--max", action="store_true", help="publish as fast as decoding and the subscribers allow")
    parser.add_argument("--frames", type=int, default=0, help="stop after this many frames (0: the whole file)")
    parser.add_argument("--loop", type=int, default=1, help="decode the file this many times over")
    parser.add_argument("--subscribers", default=",".join(ROLES), help=f"from {','.join(ROLES)}")
    parser.add_argument("--qos", default="every", choices=["every", "latest"], help="every subscriber's qos")
    parser.add_argument("--transport", default="auto", choices=["auto", "cuda-ipc", "eglstream"],
                        help="for the CUDA subscribers (the GL one always uses an EGLStream)")
    parser.add_argument("--check", action="store_true", help="check every frame against the decoder's (see above)")
    parser.add_argument("--out", default="video-pipeline-out", help="folder for the pictures and tables")
    parser.add_argument("--sheet-every", type=int, default=None,
                        help=f"every n-th frame on the contact sheet (default: about {SHEET_THUMBS} frames)")
    parser.add_argument("--decode-latency", default="native", choices=["native", "low"],
                        help="NVDEC display delay: native (any stream) or low (streams without B-frames)")
    parser.add_argument("--role", choices=ROLES, help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.out = os.path.abspath(args.out)
    if args.role:
        return subscriber(args)

    args.roles = [r for r in args.subscribers.split(",") if r]
    unknown = [r for r in args.roles if r not in ROLES]
    if unknown or not args.roles:
        parser.error(f"--subscribers takes names from {','.join(ROLES)}, got {args.subscribers!r}")
    if len(set(args.roles)) != len(args.roles):  # (two of one kind would write the same files in --out)
        parser.error(f"--subscribers names each kind once, got {args.subscribers!r}")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        parser.error(f"--out names the folder for the results, and {args.out} is a file")
    if args.loop < 1 or args.frames < 0 or (args.sheet_every is not None and args.sheet_every < 1):
        parser.error("--loop and --sheet-every are at least 1, --frames at least 0")
    if args.check and args.loop > 1:
        parser.error("--check compares one pass of the file: leave --loop at 1")
    capabilities = ["cuda"] + (["cross-process", "gl-stream"] if "gl" in args.roles or args.transport == "eglstream"
                               else [])
    require(PROGRAM, *capabilities)
    nvc, why = video.import_nvc()
    if nvc is None:
        fail(PROGRAM, why, 2)
    if not args.file:
        fail(PROGRAM, "needs a video file to decode (H.264 or HEVC): python samples/video_pipeline.py FILE, e.g. "
                      "tests/data/index_320x240_h264.mp4", 2)
    try:
        info = video.open_video(nvc, args.file)
    except video.VideoProblem as exc:
        fail(PROGRAM, str(exc), 2)
    why = video.nvdec_problem(nvc, info)
    if why:
        fail(PROGRAM, why, 2)
    require(PROGRAM, modules=([TORCH] if "infer" in args.roles else []) + ([PYOPENGL] if "gl" in args.roles else []))
    return run_pipeline(args, nvc, info)


if __name__ == "__main__":
    from _sample import run

    sys.exit(run(main, PROGRAM))
