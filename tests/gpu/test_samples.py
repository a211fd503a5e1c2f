"""Samples run as tests (small sizes; scripts/gpu_check.py runs them at full size)."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

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
