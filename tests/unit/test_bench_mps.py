"""bench/mps.py and bench/fanout.py off the GPU: the table, goals and plot from a results.json,
tracebacks condensed to their exception lines (tests/unit/test_scripts.py checks their one line
and status 2 where there is no GPU, and --help)."""
from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import sys

import pytest


ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def bench_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # bench/mps.py imports fanout.py as the script would


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while being made
    spec.loader.exec_module(module)
    return module


def test_condense_keeps_the_exception_lines():
    mps = load("mps")
    text = ("eglcuda 1920x1080:\nTraceback (most recent call last):\n  File \"x\", line 1\n    boom()\n"
            "RuntimeError: CUDA call failed: 999\n\nTraceback (most recent call last):\n  File \"y\"\n"
            "RuntimeError: CUDA call failed: 999\n")
    assert mps.condense(text) == ["eglcuda 1920x1080: RuntimeError: CUDA call failed: 999"]
    assert mps.condense("one line") == ["one line"]


def synthetic(mps, tmp_path) -> pathlib.Path:
    """A results.json as bench/mps.py writes it, every cell measured in both phases."""
    cells = {}
    for key, label, params in [(c.key, c.label, c.params) for c in mps.build_cells(pathlib.Path("x"), True,
                                                                                   list(mps.GROUPS))]:
        cell = {"group": key.split(".")[0], "label": label, "params": params}
        for phase, gain in (("off", 1.0), ("on", 5.0)):
            n = params.get("consumers", 1)
            rate = gain * 10000 / n * (0.95 if key.startswith("fan.eglcuda") else 0.8 if "cuda-ipc" in key
                                       else 0.5 if key.endswith(".fill.peek") else 1)
            value = {"fps": rate, "rounds_per_s": rate, "latency_p50_us": 1e6 / rate, "latency_p99_us": 3e6 / rate,
                     "present_us": 40 / gain, "release_us": 15 / gain, "bad": 0, "calls_us": {"present": 20.0}}
            for p in mps.BREAKDOWN_PHASES:
                value.update({f"present_us_{p}": 30.0, f"release_us_{p}": 12.0, f"latency_p50_us_{p}": 50.0,
                              f"fps_{p}": rate})
            cell[phase] = value
        cells[key] = cell
    cells["xp.shm.4k-argb"]["off"] = {"error": ["shm 3840x2160: RuntimeError: CUDA call failed: 2"]}
    results = {"date": "today", "quick": True, "frames": mps.frames_for(True), "device": {"name": "GPU"},
               "phases": {"off": {"daemon": None}, "on": {"daemon": "private MPS daemon"}}, "cells": cells}
    (tmp_path / "results.json").write_text(json.dumps(results))
    return tmp_path


def test_table_and_goals(tmp_path):
    mps = load("mps")
    folder = synthetic(mps, tmp_path)
    results = json.loads((folder / "results.json").read_text())
    table = mps.markdown(results)
    assert "| C twoproc 1920x1080 NV12, KERNELS=1: frames/s | 10,000 | 50,000 | 5.00 |  |  |" in table
    assert "| C twoproc 3840x2160 ARGB, KERNELS=1 PEEK=1: present | 40.0 | 8.0 | 0.20 |  |  |" in table
    # eglcuda fan-out N=2 against C (KERNELS=1) and CUDA IPC, without MPS / with MPS
    assert "| eglcuda fan-out 1920x1080 NV12 N=2: rounds/s | 4,750 | 23,750 | 5.00 | 0.95 / 0.95 | 1.19 / 1.19 |" \
        in table
    assert "| shm (cross_process.py) 3840x2160 ARGB: frames/s | failed | 50,000 | - |  |  |" in table
    # One stream: eglcuda's pair against C with the same work (FILL=1 PEEK=1, half the rate here)
    assert "| C twoproc 3840x2160 ARGB, FILL=1 PEEK=1: frames/s | 5,000 | 25,000 | 5.00 |  |  |" in table
    assert "| eglcuda (cross_process.py) 3840x2160 ARGB: frames/s | 10,000 | 50,000 | 5.00 | 2.00 / 2.00 | 1.25 / 1.25 |" \
        in table
    assert "### Goals under MPS: 30 of 30 met (0 not measured)" in table


def test_plot(tmp_path):
    pytest.importorskip("matplotlib", reason="needs matplotlib for the plot: pip install matplotlib")
    mps = load("mps")
    folder = synthetic(mps, tmp_path)
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "mps.py"), "--plot", str(folder)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (folder / "fanout.png").stat().st_size > 10000
    assert (folder / "table.md").read_text().startswith("Cross-process figures")


def test_fanout_rounds_and_region():
    fanout = load("fanout")
    assert [fanout.rounds_for(n, True) for n in (1, 2, 4, 8)] == [1000, 1000, 600, 300]
    assert fanout.region_words(1920, 1080, "NV12") == fanout.REGION_WORDS
    assert fanout.region_words(64, 48, "NV12") == 64 * 48 // 4  # never past plane 0
    assert fanout.region_words(1, 1, "ARGB") == 1
    assert all(0 <= fanout.word_index(n, 777) < 777 for n in range(1000))
