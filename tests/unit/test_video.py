"""The video pipeline on a machine without a GPU: samples/_video.py's helpers, and
samples/video_pipeline.py end to end against stand-ins (tests/fakes/driver/fake_cuda.c as
libcuda.so.1, tests/fakes/nvc/PyNvVideoCodec decoding with PyAV on the CPU). The decoder process,
the topic (cuda-ipc through the fake driver), a stats subscriber process and every check run for
real; NVDEC, the GPU's asynchrony, PyTorch and GL do not (tests/gpu/test_video.py runs those)."""
from __future__ import annotations

import glob
import json
import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "samples"))
import _video as video  # noqa: E402

from ..data import make_clips as mc  # noqa: E402
from ..fakes import build as fake_build  # noqa: E402

SAMPLE = ROOT / "samples" / "video_pipeline.py"
BENCH = ROOT / "bench" / "video.py"
CLIP = ROOT / "tests" / "data" / "index_320x240_h264.mp4"


# ---- helpers -----------------------------------------------------------------------------------------

def _load_sample():
    """samples/video_pipeline.py as a module (its main() only runs as a script)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("video_pipeline_sample", SAMPLE)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_payload_round_trips():
    digests = (bytes(range(32)), bytes(range(32, 64)))
    got = video.unpack_payload(video.pack_payload(7, -5, digests))
    assert got == {"index": 7, "pts": -5, "digests": digests}
    assert video.unpack_payload(video.pack_payload(3, 1 << 70))["digests"] is None
    assert len(video.pack_payload(0, 0)) == video.PAYLOAD.size <= 16 * 1024
    with pytest.raises(ValueError):
        video.unpack_payload(b"short")


def test_digests_are_those_of_the_manifest():
    y = np.arange(240 * 320, dtype=np.uint32).astype(np.uint8).reshape(240, 320)
    uv = np.full((120, 320), 128, np.uint8)
    ours = video.nv12_digests(y, uv)
    theirs = mc.nv12_digests(y, uv)
    assert (ours[0].hex(), ours[1].hex()) == theirs


def test_png_round_trips(tmp_path):
    rng = np.random.default_rng(3)
    for channels in (3, 4):
        image = rng.integers(0, 256, (17, 23, channels), dtype=np.uint8)
        path = str(tmp_path / f"x{channels}.png")
        video.write_png(path, image)
        assert np.array_equal(video.read_png(path), image)
    with pytest.raises(ValueError):
        video.write_png(str(tmp_path / "bad.png"), np.zeros((4, 4), np.uint8))


def test_contact_sheet_places_labelled_thumbnails():
    sheet = video.ContactSheet(thumb_width=64, columns=3)
    for label in range(5):
        sheet.add(np.full((90, 160, 4), 10 * label + 50, np.uint8), label * 12)
    image = sheet.image(gap=4)
    assert image.shape == (2 * (36 + 4) + 4, 3 * (64 + 4) + 4, 3)
    assert [label for label, _ in sheet.thumbs] == [0, 12, 24, 36, 48]
    thumb = sheet.thumbs[1][1]
    assert thumb.shape == (36, 64, 3)
    assert (thumb[:5] == 60).all()  # the picture, above the label
    label = thumb[36 - 23:]
    assert (label == 255).any() and (label == 0).any()  # white digits on black
    with pytest.raises(ValueError):
        video.ContactSheet().image()


def test_percentile():
    assert video.percentile(list(range(1, 101)), 0.5) == 50
    assert video.percentile(list(range(1, 101)), 0.99) == 99
    assert video.percentile([5.0], 0.99) == 5.0
    assert np.isnan(video.percentile([], 0.5))


def _nv12_from_rgb(rgb: np.ndarray, matrix: str = "bt709") -> tuple[np.ndarray, np.ndarray]:
    """Limited-range NV12 of an RGB image with flat 2x2 chroma blocks (test input)."""
    kr, kb = video.MATRICES[matrix]
    r, g, b = (rgb[..., i].astype(np.float64) for i in range(3))
    luma = kr * r + (1 - kr - kb) * g + kb * b
    u = (b - luma) / (2 * (1 - kb))
    v = (r - luma) / (2 * (1 - kr))
    y = np.clip(np.round(16 + luma * 219 / 255), 0, 255).astype(np.uint8)
    uv = np.empty((rgb.shape[0] // 2, rgb.shape[1]), np.uint8)
    uv[:, 0::2] = np.clip(np.round(128 + u[::2, ::2] * 224 / 255), 0, 255)
    uv[:, 1::2] = np.clip(np.round(128 + v[::2, ::2] * 224 / 255), 0, 255)
    return y, uv


def test_colour_conventions_are_told_apart():
    rng = np.random.default_rng(5)
    blocks = rng.integers(0, 256, (12, 16, 3)).astype(np.uint8)
    rgb = blocks.repeat(8, axis=0).repeat(8, axis=1)  # flat 8x8 blocks: 4:2:0 loses nothing
    y, uv = _nv12_from_rgb(rgb, "bt709")
    back = video.rgb_reference(y, uv, "bt709")
    assert np.abs(back - rgb).mean() < 1.5
    shown = np.concatenate([np.round(back).astype(np.uint8), np.full(rgb.shape[:2] + (1,), 255, np.uint8)], axis=2)
    name, error, swapped = video.best_color_match(shown, y, uv, step=1)
    assert name == "bt709 limited range" and error < 1.0 and not swapped
    swapped_view = np.round(video.rgb_reference(y, uv, "bt601", swap=True)).astype(np.uint8)
    name, error, swapped = video.best_color_match(swapped_view, y, uv, step=1)
    assert swapped and name == "bt601 limited range, U/V swapped" and error < 1.0


def test_band_of_a_grey_frame_reads_through_the_rgb_conversion():
    # What the GL subscriber reads: the band's luma turned into RGB by GL; any channel carries it.
    y = np.full((240, 320), 100, np.uint8)
    u = np.full((120, 160), 128, np.uint8)
    v = u.copy()
    mc.stamp_index(y, u, v, 345)
    uv = np.empty((120, 320), np.uint8)
    uv[:, 0::2], uv[:, 1::2] = u, v
    for matrix, full in (("bt601", False), ("bt709", True)):
        rgb = np.round(video.rgb_reference(y, uv, matrix, full)).astype(np.uint8)
        assert mc.frame_index_from_luma(rgb[:64, :320, 1]) == 345


# ---- the pipeline against the fake driver and a fake PyNvVideoCodec --------------------------------------

@pytest.fixture(scope="module")
def fake_env():
    pytest.importorskip("av", reason="needs PyAV, with which the fake PyNvVideoCodec decodes: "
                        "pip install -e '.[test-video]'")
    if fake_build.compiler() is None:
        pytest.skip("no C compiler for the fake libcuda")
    with tempfile.TemporaryDirectory(prefix="eglcuda-fakecuda-video-") as folder:
        fake_build.build_libcuda(folder)
        # tests/conftest.py has put the tree this eglcuda is imported from on PYTHONPATH (when it
        # is not on a child's default path): children import the same one.
        paths = [str(ROOT / "tests" / "fakes" / "nvc"), os.environ.get("PYTHONPATH", "")]
        yield {**os.environ, "LD_LIBRARY_PATH": folder, "PYTHONPATH": os.pathsep.join(p for p in paths if p),
               "__EGL_VENDOR_LIBRARY_FILENAMES": "/nonexistent.json"}  # no EGL: cuda-ipc only


def run(env, *args, timeout=180):
    return subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


def result_of(done) -> dict:
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, done.stdout + done.stderr
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.parametrize("qos", ["every", "latest"])
def test_pipeline_checks_every_frame(fake_env, tmp_path, qos):
    done = run(fake_env, SAMPLE, CLIP, "--max", "--check", "--subscribers", "stats", "--qos", qos, "--out", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    result = result_of(done)
    assert result["ok"] and result["decoder"]["frames"] == 30
    assert result["decoder"]["index_ok"] is True
    assert result["decoder"]["cpu_decoder"] == {"compared": 30, "bit_exact": 30, "first_difference": None}
    (stats,) = result["subscribers"]
    assert stats["transport"] == "cuda-ipc" and stats["bad"] == 0 and stats["checked"] == stats["frames"]
    if qos == "every":
        assert stats["frames"] == 30 and stats["first_seq"] == 0 and stats["missing"] == 0
    rows = (tmp_path / "latency.csv").read_text().splitlines()
    assert rows[0] == "seq,frame,pts,handover_us,ready_us,skipped" and len(rows) == stats["frames"] + 1
    summary = json.loads((tmp_path / "summary.json").read_text())
    entry = json.loads(mc.MANIFEST.read_text())[CLIP.name]
    assert summary["decoder"]["digests"] == [list(pair) for pair in zip(entry["y_sha256"], entry["uv_sha256"])]


def test_a_clip_without_the_index_band_is_not_checked_for_it(fake_env, tmp_path):
    # FFmpeg's test pattern, not a tests/data/make_clips.py clip: no frame index band in the picture.
    try:
        ffmpeg = mc.find_ffmpeg()
    except SystemExit as exc:
        pytest.skip(str(exc))
    clip = tmp_path / "pattern.mp4"
    subprocess.run([ffmpeg, "-hide_banner", "-loglevel", "error", "-f", "lavfi", "-i", "testsrc=size=320x240:rate=30",
                    "-frames:v", "12", "-pix_fmt", "yuv420p", str(clip)], check=True, timeout=120)
    done = run(fake_env, SAMPLE, clip, "--max", "--check", "--subscribers", "stats", "--out", tmp_path / "out")
    assert done.returncode == 0, done.stdout + done.stderr
    result = result_of(done)
    assert result["ok"] and result["decoder"]["frames"] == 12
    assert result["decoder"]["index_ok"] is None
    assert "carry no index band" in done.stdout and "order not checked" in done.stdout
    assert "FAIL" not in done.stdout
    (stats,) = result["subscribers"]
    assert stats["checked"] == stats["frames"] == 12 and stats["bad"] == 0  # the digests still are compared


def test_the_index_band_decides_what_is_checked():
    sample = _load_sample()
    assert sample.carries_index_band([0, 1, 2, None])
    assert not sample.carries_index_band([None, None, 7, None])
    assert not sample.carries_index_band([])


def test_pipeline_paces_at_the_file_rate(fake_env, tmp_path):
    done = run(fake_env, SAMPLE, CLIP, "--frames", "12", "--subscribers", "stats", "--out", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    decoder = result_of(done)["decoder"]
    assert decoder["frames"] == 12
    assert 11 / 30 - 0.02 <= decoder["elapsed_s"] < 11 / 30 + 1.0  # 30 frames/s


def test_a_corrupted_frame_is_caught(fake_env, tmp_path):
    # The decoder's digests of frame 4 are altered on the way (EGLCUDA_VIDEO_CORRUPT, a test hook):
    # the subscriber must notice, and the sample fail.
    env = {**fake_env, "EGLCUDA_VIDEO_CORRUPT": "4"}
    done = run(env, SAMPLE, CLIP, "--max", "--check", "--subscribers", "stats", "--out", tmp_path, timeout=180)
    assert done.returncode == 1, done.stdout + done.stderr
    (stats,) = result_of(done)["subscribers"]
    assert stats["bad"] == 1 and stats["bad_seqs"] == [4]
    assert "FAIL" in done.stdout


def test_what_is_missing_is_one_line(fake_env, tmp_path):
    done = run(fake_env, SAMPLE, tmp_path / "nothing.mp4", "--subscribers", "stats")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [f"samples/video_pipeline.py: needs a video file to decode: "
                                        f"{tmp_path / 'nothing.mp4'} does not exist"]
    done = run(fake_env, SAMPLE, "--subscribers", "stats")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and "needs a video file" in done.stderr
    (tmp_path / "not_video.mp4").write_bytes(b"\0" * 1000)
    done = run(fake_env, SAMPLE, tmp_path / "not_video.mp4", "--subscribers", "stats")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1 and "needs" in done.stderr, done.stderr
    no_nvc = {**fake_env, "PYTHONPATH": os.environ.get("PYTHONPATH", "")}  # without the fake PyNvVideoCodec
    done = run(no_nvc, SAMPLE, CLIP, "--subscribers", "stats")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [f"samples/video_pipeline.py: needs PyNvVideoCodec to decode with NVDEC: "
                                        f"{video.NVC_HINT}"]


def test_bench_rows_that_need_no_torch(fake_env, tmp_path):
    if not BENCH.exists():
        pytest.skip("bench/video.py is not in this tree")
    done = run(fake_env, BENCH, "--quick", "--clips", CLIP, "--rows", "decode,decode-locked,publish-0,publish-1,publish-3",
               "--out", tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads((tmp_path / "results.json").read_text())
    rows = {row["row"]: row for row in results["rows"]}
    for name in ("decode", "decode-locked", "publish-0", "publish-1", "publish-3"):
        assert rows[name]["rate"] > 0, rows[name]
    assert rows["publish-3"]["p50_us"] > 0 and rows["publish-3"]["subscribers"] == 3
    assert (tmp_path / "results.md").read_text().startswith("Video pipeline")


def _ts_clip(path: pathlib.Path, sizes: list[tuple[int, int]], frames: int = 8) -> None:
    """An H.264 MPEG-TS clip of ``frames`` frames of each size in turn (segments joined as they
    are: a stream whose size changes midway), encoded with PyAV."""
    import av

    with open(path, "wb") as out:
        for width, height in sizes:
            segment = path.with_suffix(f".{width}x{height}.ts")
            with av.open(str(segment), "w", format="mpegts") as container:
                stream = container.add_stream("libx264", rate=30)
                stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
                for i in range(frames):
                    picture = np.full((height, width, 3), (i * 29) % 256, np.uint8)
                    for packet in stream.encode(av.VideoFrame.from_ndarray(picture, format="rgb24")):
                        container.mux(packet)
                for packet in stream.encode():
                    container.mux(packet)
            out.write(segment.read_bytes())


@pytest.mark.parametrize("sizes", [[(320, 240), (640, 480)], [(640, 480), (320, 240)]], ids=["grows", "shrinks"])
def test_a_stream_that_changes_size_midway_is_refused_at_the_change(fake_env, tmp_path, sizes):
    """Only the first frame's size was checked: a stream that grew was published scrambled (and
    --check passed it), one that shrank was copied from past the decoder's buffer."""
    clip = tmp_path / "change.ts"
    try:
        _ts_clip(clip, sizes)
    except Exception as exc:  # noqa: BLE001 - a PyAV without libx264
        pytest.skip(f"PyAV cannot encode H.264 here: {exc}")
    done = run(fake_env, SAMPLE, clip, "--max", "--check", "--subscribers", "stats", "--out", tmp_path / "out")
    assert done.returncode == 1, done.stdout + done.stderr
    (first, second) = sizes
    assert done.stderr.splitlines() == [
        f"samples/video_pipeline.py: VideoProblem: the decoder outputs {second[0]}x{second[1]} frames from frame 8 on "
        f"(the stream changes size), the demuxer said {first[0]}x{first[1]}"], done.stderr


def test_a_manifest_beside_the_clip_that_is_none_is_not_used(fake_env, tmp_path):
    """--check reads FILE.json beside the clip for the CPU decoder's digests: a malformed one ended
    the run in a bare AttributeError, KeyError or IndexError."""
    clip = tmp_path / CLIP.name
    clip.write_bytes(CLIP.read_bytes())
    size = clip.stat().st_size
    manifest = tmp_path / (CLIP.name + ".json")
    for body in ([1, 2], {CLIP.name: [1]}, {CLIP.name: {"bytes": size}},
                 {CLIP.name: {"bytes": size, "frames": 30, "y_sha256": ["a"], "uv_sha256": ["b"]}}):
        manifest.write_text(json.dumps(body))
        done = run(fake_env, SAMPLE, clip, "--max", "--check", "--subscribers", "stats", "--out", tmp_path / "out")
        assert done.returncode == 0, done.stdout + done.stderr
        result = result_of(done)
        compared = result["decoder"]["cpu_decoder"]  # (from tests/data/clips.json, the next manifest looked at)
        assert result["ok"] and compared["compared"] == compared["bit_exact"] == 30, body


def test_sigterm_cleans_up_like_ctrl_c(fake_env, tmp_path):
    """A SIGTERM (timeout, a supervisor) left the topic's temporary folder behind."""
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "eglcuda-video-*")))
    process = subprocess.Popen([sys.executable, str(SAMPLE), str(CLIP), "--loop", "100", "--subscribers", "stats",
                                "--out", str(tmp_path)], env=fake_env, cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().startswith("decoding ")  # (running: the topic is up)
        time.sleep(1.0)
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "eglcuda-video-*"))) <= before


@pytest.mark.parametrize("args, said", [(["--subscribers", "stats,stats"], "names each kind once"),
                                        (["--out", "/etc/hostname"], "is a file")])
def test_arguments_that_would_clash_are_usage_errors(args, said):
    done = subprocess.run([sys.executable, str(SAMPLE), str(CLIP), "--subscribers", "stats", *args],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2 and said in done.stderr.splitlines()[-1], done.stderr
