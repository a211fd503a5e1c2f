"""Samples, benchmarks and scripts/gpu_check.py on a machine that lacks what they need: one line
naming it and how to get it, exit status 2, never a traceback."""
from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

import eglcuda

ROOT = pathlib.Path(__file__).resolve().parents[2]
GPU_SCRIPTS = [
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "samples").glob("[a-z]*.py")),
    "bench/cross_gpu.py", "bench/cross_process.py", "bench/fanout.py", "bench/memory_kinds.py", "bench/mps.py",
    "bench/sources.py", "bench/stream_profile.py", "bench/stream_roundtrip.py", "bench/topics.py", "bench/video.py",
    "bench/remote.py",
    "scripts/gpu_check.py",
]


@pytest.mark.parametrize("script", GPU_SCRIPTS)
def test_missing_gpu_is_one_line_and_status_2(script, tmp_path):
    if eglcuda.available("cuda-stream"):
        pytest.skip("this machine has what the scripts need: they run for real in scripts/gpu_check.py")
    if not (ROOT / script).exists():
        pytest.skip(f"{script} is not in this tree")
    result = subprocess.run([sys.executable, str(ROOT / script)], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{script}: ") and "needs" in lines[0]


@pytest.mark.parametrize("script", [s for s in GPU_SCRIPTS if s != "scripts/gpu_check.py"])
def test_help_works_anywhere(script, tmp_path):
    if not (ROOT / script).exists():
        pytest.skip(f"{script} is not in this tree")
    result = subprocess.run([sys.executable, str(ROOT / script), "--help"], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:")


def test_the_samples_declare_the_packages_they_import():
    # Every package a sample imports is eglcuda's, the standard library's, or in an extra.
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("samples-cuda12", "samples-cuda13"):
        names = " ".join(extras[extra])
        assert "cupy-cuda" in names and "PyOpenGL" in names
    for name in ("matplotlib", "scipy", "cupy-cuda13x", "cuda-python", "PyOpenGL"):
        assert any(requirement.startswith(name) for requirement in extras["bench"]), name


def test_video_is_only_an_extra():
    # PyNvVideoCodec is the `video` extra's, never a dependency of eglcuda itself.
    tomllib = pytest.importorskip("tomllib")

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["video"] == ["PyNvVideoCodec>=2.2"]
    assert not any("nvvideocodec" in d.lower() or d.lower().startswith(("av", "torch")) for d in project["dependencies"])


def _imported_modules(*folders: str) -> set[str]:
    """The top-level modules that the Python files under ``folders`` import."""
    names: set[str] = set()
    pattern = re.compile(r"^\s*(?:import|from)\s+([A-Za-z_]\w*)", re.M)
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            names.update(pattern.findall(path.read_text()))
    return names


def test_the_test_extra_holds_what_the_tests_import_and_nothing_more():
    tomllib = pytest.importorskip("tomllib")

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    module_of = {"pyopengl": "OpenGL", "imageio-ffmpeg": "imageio_ffmpeg"}
    declared = {re.split(r"[<>=!~\[ ;]", requirement)[0].lower() for requirement in extras["test"]}
    imported = _imported_modules("tests")
    for distribution in declared:
        assert module_of.get(distribution, distribution) in imported, f"[test] lists {distribution}, no test imports it"
    # PyAV and imageio-ffmpeg: without them the clip and fake-decoder tests could only skip.
    assert {"pytest", "pyopengl", "hypothesis", "av", "imageio-ffmpeg"} <= declared


def test_the_bench_extra_has_torch_for_the_comparisons():
    tomllib = pytest.importorskip("tomllib")

    bench = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["bench"]
    assert "torch" in _imported_modules("bench")
    assert any(requirement.startswith("torch") for requirement in bench)
