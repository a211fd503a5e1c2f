"""The video pipeline on a GPU: samples/video_pipeline.py decodes the committed test clips
(tests/data/make_clips.py: each frame carries its index, tests/data/clips.json the CPU decoder's
SHA-256 of every Y and UV plane) with NVDEC and publishes them; every subscriber process checks
every frame it received against the decoder's digests (infer, stats) or its index band and
colours (GL), and with qos every none may be lost. NVDEC against the CPU decoder is reported
(a warning when not bit-exact), not failed.

Skipped with the reason when PyNvVideoCodec is not importable (pip install -e '.[video]'; research/probes/video_run.sh installs a wheel of it from a
local folder)."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import warnings

import pytest

from ..conftest import require_extension

ROOT = pathlib.Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "samples" / "video_pipeline.py"
DATA = ROOT / "tests" / "data"
sys.path.insert(0, str(ROOT / "samples"))
import _video as video  # noqa: E402

CLIPS = ["index_320x240_h264.mp4", "index_320x240_hevc.mp4"]


@pytest.fixture(scope="module")
def nvc(cuda_ordinal):
    module, why = video.import_nvc()
    if module is None:
        pytest.skip(why)
    return module


@pytest.fixture
def display(cuda_display):
    require_extension(cuda_display, "EGL_KHR_stream", "EGL_KHR_stream_cross_process_fd")
    return cuda_display


def manifest() -> dict:
    return json.loads((DATA / "clips.json").read_text())


def run_sample(out: pathlib.Path, *args: str, timeout: float = 240) -> tuple[subprocess.CompletedProcess, dict | None]:
    done = subprocess.run([sys.executable, str(SAMPLE), *args, "--out", str(out)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env={**os.environ, "PYOPENGL_PLATFORM": "egl"})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return done, (json.loads(lines[-1][len("RESULT "):]) if lines else None)


def report_cpu_decoder(name: str, decoder: dict) -> None:
    cpu = decoder.get("cpu_decoder")
    assert cpu is not None, "the sample found no CPU decoder digests for a committed clip"
    print(f"{name}: NVDEC vs the CPU decoder: {cpu['bit_exact']} of {cpu['compared']} frames bit-exact")
    if cpu["bit_exact"] != cpu["compared"]:
        warnings.warn(f"{name}: NVDEC differs from the CPU decoder from frame {cpu['first_difference']} on "
                      f"({cpu['bit_exact']} of {cpu['compared']} bit-exact)")


@pytest.mark.parametrize("clip", CLIPS)
def test_every_cuda_subscriber_checks_every_frame(display, nvc, clip, tmp_path):
    pytest.importorskip("torch")
    frames = manifest()[clip]["frames"]
    done, result = run_sample(tmp_path, str(DATA / clip), "--max", "--check", "--qos", "every",
                              "--subscribers", "infer,stats")
    assert result is not None, done.stdout + done.stderr
    print(done.stdout)
    decoder = result["decoder"]
    assert decoder["frames"] == frames
    assert decoder["index_ok"] is True, "the decoded frames' index bands are not 0, 1, 2, ..."
    report_cpu_decoder(clip, decoder)
    for sub in result["subscribers"]:
        assert "error" not in sub, sub
        assert (sub["frames"], sub["first_seq"], sub["missing"], sub["skipped"]) == (frames, 0, 0, 0), sub
        assert sub["checked"] == frames and sub["bad"] == 0, sub
    assert done.returncode == 0, done.stdout + done.stderr
    assert len((tmp_path / "latency.csv").read_text().splitlines()) == frames + 1
    assert len((tmp_path / "inference.csv").read_text().splitlines()) == frames + 1


def test_gl_subscriber_shows_every_frame(display, nvc, tmp_path):
    require_extension(display, "EGL_KHR_stream_consumer_gltexture")
    pytest.importorskip("OpenGL.GL")
    clip = CLIPS[0]
    frames = manifest()[clip]["frames"]
    done, result = run_sample(tmp_path, str(DATA / clip), "--max", "--check", "--qos", "every", "--subscribers", "gl",
                              "--sheet-every", "5")
    assert result is not None, done.stdout + done.stderr
    print(done.stdout)
    (gl,) = result["subscribers"]
    assert "error" not in gl, gl
    assert (gl["frames"], gl["missing"], gl["skipped"]) == (frames, 0, 0), gl
    assert gl["index_checked"] and gl["checked"] == frames and gl["bad"] == 0, gl
    assert gl["sheet_frames"] == list(range(0, frames, 5))
    assert len(gl["colour_checks"]) == len(gl["sheet_frames"]), gl
    for colour in gl["colour_checks"]:
        assert not colour["swapped"], f"GL shows the frames with U and V swapped: {gl['colour_checks']}"
        assert colour["mean_abs_error"] <= video.GL_COLOUR_TOLERANCE, gl["colour_checks"]
    sheet = video.read_png(str(tmp_path / "contact_sheet.png"))
    assert sheet.shape[2] == 3 and sheet.shape[0] > 240 // 2
    assert done.returncode == 0, done.stdout + done.stderr


def test_latest_subscribers_and_realtime_pacing(display, nvc, tmp_path):
    done, result = run_sample(tmp_path, str(DATA / CLIPS[0]), "--qos", "latest", "--subscribers", "stats", "--check")
    assert result is not None, done.stdout + done.stderr
    (stats,) = result["subscribers"]
    assert stats["frames"] >= 1 and stats["bad"] == 0 and stats["out_of_order"] == 0, stats
    assert result["decoder"]["elapsed_s"] >= 29 / 30 - 0.05  # 30 frames at 30 frames/s
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_missing_file_is_one_line(display, nvc, tmp_path):
    done = subprocess.run([sys.executable, str(SAMPLE), str(tmp_path / "missing.mp4")], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [f"samples/video_pipeline.py: needs a video file to decode: "
                                        f"{tmp_path / 'missing.mp4'} does not exist"]
