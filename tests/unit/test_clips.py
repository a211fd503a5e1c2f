"""The frame-index band of the test clips (tests/data/make_clips.py) and the committed clips.

The band tests need numpy only. Decoding the committed clips needs PyAV or an ffmpeg
(imageio-ffmpeg's, $FFMPEG or one on PATH; both in the test-video extra) and is skipped where
neither is installed.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from ..data import make_clips as mc


def _planes(width=320, height=240, fill=100):
    y = np.full((height, width), fill, np.uint8)
    u = np.full((height // 2, width // 2), 90, np.uint8)
    v = np.full((height // 2, width // 2), 160, np.uint8)
    return y, u, v


def test_every_index_round_trips():
    y, u, v = _planes()
    for i in range(mc.MAX_INDEX + 1):
        mc.stamp_index(y, u, v, i)
        assert mc.frame_index_from_luma(y) == i


def test_band_survives_noise_and_pitched_views():
    rng = np.random.default_rng(1)
    y, u, v = _planes(width=640, height=360)
    mc.stamp_index(y, u, v, 300)
    noisy = np.clip(y.astype(np.int16) + rng.integers(-40, 41, y.shape), 0, 255).astype(np.uint8)
    assert mc.frame_index_from_luma(noisy) == 300
    pitched = np.zeros((360, 768), np.uint8)  # pitch 768 > width 640
    pitched[:, :640] = noisy
    assert mc.frame_index_from_luma(pitched[:, :640]) == 300
    assert mc.frame_index_from_luma(noisy[:, :, None]) == 300  # (H, W, 1) CAI-style view
    nv12 = np.concatenate([noisy, np.full((180, 640), 128, np.uint8)])  # whole NV12 frame
    assert mc.frame_index_from_luma(nv12) == 300


def test_chroma_under_band_is_neutral():
    y, u, v = _planes()
    mc.stamp_index(y, u, v, 5)
    assert (u[:32, :160] == 128).all() and (v[:32, :160] == 128).all()
    assert (u[32:, :] == 90).all() and (v[:, 160:] == 160).all()


def test_unreadable_bands_raise():
    y, _, _ = _planes()
    with pytest.raises(ValueError, match="unreadable"):
        mc.frame_index_from_luma(y)  # flat grey: no contrast
    y2, u, v = _planes()
    mc.stamp_index(y2, u, v, 6)
    y2[:32, 0:32], y2[32:64, 0:32] = y2[32:64, 0:32].copy(), y2[:32, 0:32].copy()  # flip bit 0
    with pytest.raises(ValueError, match="parity"):
        mc.frame_index_from_luma(y2)
    with pytest.raises(ValueError, match="smaller"):
        mc.frame_index_from_luma(np.zeros((48, 320), np.uint8))
    with pytest.raises(ValueError):
        mc.stamp_index(*_planes(), mc.MAX_INDEX + 1)


def _manifest():
    return json.loads(mc.MANIFEST.read_text())


def test_manifest_names_committed_clips():
    manifest = _manifest()
    assert "index_320x240_h264.mp4" in manifest
    for name, entry in manifest.items():
        assert (mc.HERE / name).stat().st_size == entry["bytes"]
        assert len(entry["y_sha256"]) == len(entry["uv_sha256"]) == entry["frames"]


def test_clips_decode_to_their_indices_pyav():
    av = pytest.importorskip("av", reason="needs PyAV to decode the clips: pip install -e '.[test-video]'")
    for name, entry in _manifest().items():
        with av.open(str(mc.HERE / name)) as container:
            n = 0
            for i, frame in enumerate(container.decode(video=0)):
                nv12 = frame.to_ndarray(format="nv12")
                h = entry["height"]
                assert nv12.shape == (h * 3 // 2, entry["width"])
                assert mc.frame_index_from_luma(nv12[:h]) == i
                assert mc.nv12_digests(nv12[:h], nv12[h:]) == (entry["y_sha256"][i], entry["uv_sha256"][i])
                n += 1
        assert n == entry["frames"], name


def _ffmpeg_or_skip():
    try:
        return mc.find_ffmpeg()
    except SystemExit as exc:  # none: it says how to get one
        pytest.skip(str(exc))


def test_clips_decode_to_their_indices_ffmpeg():
    ffmpeg = _ffmpeg_or_skip()
    for name, entry in _manifest().items():
        fresh = mc.verify(ffmpeg, mc.HERE / name, entry)  # checks every index and the count
        assert fresh["y_sha256"] == entry["y_sha256"], name
        assert fresh["uv_sha256"] == entry["uv_sha256"], name
