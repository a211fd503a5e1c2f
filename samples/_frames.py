"""What the topic samples' publishers write and their subscriber processes check: a known image
per frame, one JSON line per event, and the latency summary each subscriber reports at the end.

Shared by samples/topic_fanout.py and samples/remote_subscriber.py (numpy is imported by the
caller, after its needs were checked)."""
from __future__ import annotations

import json
from typing import Any

_images: dict[tuple[int, int, int], Any] = {}


def frame_bytes(height: int, width: int, seq: int, seed: int) -> Any:
    """The ARGB bytes of frame ``seq``: a fixed random image (from ``seed``) plus a value that
    changes per frame, so a frame read twice or out of order shows as wrong bytes."""
    import numpy as np

    base = _images.get((height, width, seed))
    if base is None:
        base = _images[(height, width, seed)] = np.random.default_rng(seed).integers(
            0, 256, (height, width, 4), np.uint8)
    return base + np.uint8((seq * 37 + 11) % 256)


def report(**message: Any) -> None:
    """One JSON line on stdout, which the sample's parent process reads."""
    print(json.dumps(message), flush=True)


def report_done(done: dict[str, Any]) -> None:
    """The subscriber's closing line: its counters, with its latencies cut to the median."""
    latencies = sorted(done.pop("latency_us")) or [0.0]
    done["latency_p50_us"] = latencies[len(latencies) // 2]
    report(event="done", **done)


def publish_known_frames(pub: Any, frames: int, height: int, width: int, seed: int) -> float:
    """Publish ``frames`` known images (payload: the frame's number) through ``pub``; returns the
    rate in frames/s."""
    import time

    started = time.monotonic()
    for seq in range(frames):
        frame = pub.next_frame(timeout=30)
        frame.planes[0].copy_from(frame_bytes(height, width, seq, seed))
        pub.publish(frame, payload=b"%d" % seq)
    return frames / (time.monotonic() - started)


def collect_reports(children: dict[str, Any], timeout: float = 60) -> list[dict[str, Any]]:
    """Each subscriber process's closing report (or an ``error`` entry for one that ended without
    it; its own error line went to our stderr)."""
    results = []
    for role, child in children.items():
        out, _ = child.communicate(timeout=timeout)
        lines = [json.loads(line) for line in out.splitlines() if line.strip().startswith("{")]
        if lines and lines[-1].get("event") == "done":
            results.append(lines[-1])
        else:
            results.append({"role": role, "error": f"exited with status {child.returncode} before reporting"})
    return results
