"""Samples run as tests (small sizes; scripts/gpu_check.py runs them at full size)."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

import eglcuda

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_cuda_to_cuda_sample(cuda_display):
    pytest.importorskip("cupy")
    for extra in (["--fifo", "4"], ["--fifo", "0"]):
        result = subprocess.run(
            [sys.executable, str(ROOT / "samples" / "cuda_to_cuda.py"), "--width", "334", "--height", "98",
             "--frames", "60", "--formats", "ARGB,YUV420_PLANAR,NV12", *extra],
            capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        lines = result.stdout.splitlines()
        assert lines[-1] == "PASS"
        assert sum(line.startswith("PASS ") for line in lines) == 6  # 3 formats x 2 layouts


def test_gl_texture_to_cuda_sample(cuda_display):
    pytest.importorskip("cupy")
    result = subprocess.run(
        [sys.executable, str(ROOT / "samples" / "gl_texture_to_cuda.py"), "--width", "97", "--height", "41",
         "--iterations", "5"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].startswith("PASS: 5 rounds")
    assert "CUDA path: " in result.stdout
    # Forcing the native path where the self-test found it not coherent fails loudly.
    forced = subprocess.run(
        [sys.executable, str(ROOT / "samples" / "gl_texture_to_cuda.py"), "--width", "16", "--height", "16",
         "--iterations", "1", "--path", "native"], capture_output=True, text=True, timeout=300)
    if "CUDA path: native" not in forced.stdout:
        assert forced.returncode != 0 and "NotCoherent" in forced.stderr, forced.stdout + forced.stderr


def test_cuda_event_eglsync_sample(cuda_display):
    pytest.importorskip("cupy")
    result = subprocess.run(
        [sys.executable, str(ROOT / "samples" / "cuda_event_eglsync.py"), "--width", "131", "--height", "67",
         "--rounds", "5"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1].startswith("PASS: 5 rounds")
    assert "CUDA -> EGLSync: " in result.stdout and "EGLSync -> CUDA: " in result.stdout


def test_multi_camera_sample(cuda_display):
    pytest.importorskip("cupy")
    if not eglcuda.available("cuda-ipc"):
        pytest.skip("the sample needs CUDA IPC (a discrete GPU)")
    result = subprocess.run(
        [sys.executable, str(ROOT / "samples" / "multi_camera.py"), "--cameras", "8", "--fps", "30", "--seconds", "3",
         "--width", "640", "--height", "360"], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[-1] == "PASS" and lines[-2] == "  0 images with a wrong byte or payload", result.stdout
