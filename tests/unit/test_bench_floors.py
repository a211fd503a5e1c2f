"""bench/sources.py's floors on a machine without a GPU: bench/c/subscriber_wake.c built with gcc
and run in both modes (``cuda`` against the stand-in libcuda, tests/fakes), the Python floor
(bench/_sources_floor.py) in a fresh interpreter, the rows and the lines that hold eglcuda
against them, and the ``c`` row without gcc (n/a and why, no traceback)."""
from __future__ import annotations

import json
import math
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from ..fakes import build as fake_build

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE = ROOT / "bench" / "c" / "subscriber_wake.c"
RATE, SECONDS = 100, 2.0  # frames counted: about RATE x (SECONDS - 1)


@pytest.fixture(autouse=True)
def bench_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))


@pytest.fixture(scope="module")
def libcuda(tmp_path_factory):
    if fake_build.compiler() is None:
        pytest.skip("needs a C compiler (gcc or cc) for the stand-in libcuda")
    folder = tmp_path_factory.mktemp("libcuda")
    fake_build.build_libcuda(folder)
    return folder


@pytest.fixture(scope="module")
def binary(tmp_path_factory):
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build bench/c/subscriber_wake.c")
    out = tmp_path_factory.mktemp("subscriber_wake") / "subscriber_wake"
    done = subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(out), str(SOURCE), "-ldl"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return out


def check_line(stdout: str) -> dict[str, float]:
    import _sources_floor as floors

    lines = stdout.splitlines()
    assert len(lines) == 1, stdout
    values = floors.parse(lines[0])
    expected = RATE * (SECONDS - 1)
    assert 0.85 * expected <= values["frames"] <= 1.1 * expected + 2, values
    for key in ("cpu_us_mean", "cpu_us_p50", "cpu_us_p99", "wake_us_p50", "wake_us_p99"):
        assert math.isfinite(values[key]) and values[key] > 0, (key, values)
    assert values["cpu_us_p50"] <= values["cpu_us_p99"] and values["wake_us_p50"] <= values["wake_us_p99"]
    return values


@pytest.mark.parametrize("mode", ["bare", "cuda"])
def test_subscriber_wake_counts_every_frame_after_the_first_second(binary, libcuda, mode):
    env = {**os.environ, "LD_LIBRARY_PATH": str(libcuda)} if mode == "cuda" else dict(os.environ)
    done = subprocess.run([str(binary), str(RATE), str(SECONDS), mode], capture_output=True, text=True, timeout=30,
                          env=env)
    assert done.returncode == 0, done.stderr
    check_line(done.stdout)


def test_subscriber_wake_in_cuda_mode_without_libcuda_says_so(binary, tmp_path):
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path)}
    if subprocess.run([sys.executable, "-c", "import ctypes; ctypes.CDLL('libcuda.so.1')"], env=env).returncode == 0:
        pytest.skip("this machine has a libcuda.so.1")
    done = subprocess.run([str(binary), str(RATE), str(SECONDS), "cuda"], capture_output=True, text=True, timeout=30,
                          env=env)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == "missing libcuda.so.1"


def test_the_python_floor_prints_the_same_line():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "_sources_floor.py"), "--rate", str(RATE),
                           "--seconds", str(SECONDS)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    check_line(done.stdout)


def test_without_gcc_the_c_row_is_na_and_says_why(monkeypatch, tmp_path):
    import _sources_floor as floors
    import sources

    monkeypatch.setattr(floors.shutil, "which", lambda name: None)
    row = floors.measure("c", 30.0, 1.0, build=tmp_path)
    assert row["skipped"].startswith("needs gcc") and math.isnan(row["thread_us"])
    assert not list(tmp_path.iterdir())
    shown = sources.table_row(row)
    assert shown.startswith("| 1 x 30 fps | c | n/a | n/a |") and "| n/a: needs gcc" in shown
    eglcuda_row = {"variant": "waitset", "sources": 1, "rate": 30.0, "thread_us": 150.0}
    python_row = {"variant": "python-floor", "sources": 1, "rate": 30.0, "mode": "bare", "skipped": "",
                  "thread_us": 100.0}
    assert sources.against_floors([eglcuda_row, row, python_row]) == [
        "1 x 30 fps waitset: 150.0 us a frame = the C floor n/a (needs gcc to build "
        "bench/c/subscriber_wake.c (apt-get install gcc)), 1.5 x the Python floor (100.0 us)"]


def test_the_lines_against_the_floors_say_where_the_goal_stands():
    import sources

    def floor(name: str, us: float, rate: float = 30.0) -> dict:
        return {"variant": name, "sources": 1, "rate": rate, "mode": "cuda" if name == "c" else "bare",
                "skipped": "", "thread_us": us}

    rows = [{"variant": "waitset", "sources": 1, "rate": 30.0, "thread_us": 190.0},
            {"variant": "waitset", "sources": 32, "rate": 30.0, "thread_us": 47.0},
            {"variant": "asyncio", "sources": 1, "rate": 30.0, "thread_us": math.nan},
            {"variant": "selectors", "sources": 1, "rate": 0.0, "thread_us": 20.0},
            floor("c", 95.0), floor("python-floor", 115.0)]
    said = sources.against_floors(rows)
    assert said[0] == ("1 x 30 fps waitset: 190.0 us a frame = 2.0 x the C floor (cuda, 95.0 us), "
                       "1.7 x the Python floor (115.0 us); the 30 us goal is below what C pays for the same wake "
                       "on this machine")
    assert said[1] == "1 x 30 fps asyncio: n/a (not measured), no ratio to the floors"
    assert len(said) == 2  # (32 topics and flat out: no floor beside them)
    rows[-2] = floor("c", 20.0)
    assert sources.against_floors(rows)[0].endswith("; the 30 us goal is above the C floor (20.0 us)")


@pytest.mark.parametrize("split", [False, True])
def test_the_sources_bench_puts_its_floors_beside_eglcuda(libcuda, binary, tmp_path, split):
    """bench/sources.py on the stand-in libcuda: a waitset row, the C floor (cuda mode: the
    stand-in is libcuda.so.1 here) and the Python floor, each at about the rate, and the line
    that holds the first against the other two; with --split, the part of the waiting thread's
    CPU inside eglcuda's calls too."""
    env = {**os.environ, "LD_LIBRARY_PATH": str(libcuda), "__EGL_VENDOR_LIBRARY_FILENAMES": "/nonexistent.json"}
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "sources.py"), "--sources", "1", "--rates", "30",
                           "--seconds", "1", "--warmup", "0.5", "--size", "64x48:NV12", "--variants",
                           "waitset,c,python-floor", "--json", str(out), *(["--split"] if split else [])],
                          env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads(out.read_text())
    assert [r["variant"] for r in rows] == ["waitset", "c", "python-floor"]
    assert rows[1]["mode"] == "cuda" and not rows[1]["skipped"]
    for row in rows:
        assert 20 <= row["fps"] <= 45 and row["thread_us"] > 0 and row["p50_us"] <= row["p99_us"], row
    assert "| 1 x 30 fps | c (cuda) | " in done.stdout and "| 1 x 30 fps | python-floor | " in done.stdout
    assert f"1 x 30 fps waitset: {rows[0]['thread_us']:.1f} us a frame = " in done.stdout
    if split:
        assert 0 < rows[0]["inside_us"] < rows[0]["thread_us"], rows[0]
    else:
        assert math.isnan(rows[0]["inside_us"]) and "| n/a |" in done.stdout


@pytest.mark.parametrize("floor", ["c", "python"])
def test_the_floors_wait_on_many_sources_and_count_every_frame(binary, libcuda, floor):
    """Four sources, each at the rate from a phase of its own: one wait on all of them, every
    frame after the first second counted once, each wake's CPU shared out between its frames."""
    sources = 4
    if floor == "c":
        command = [str(binary), str(RATE), str(SECONDS), "cuda", str(sources)]
    else:
        command = [sys.executable, str(ROOT / "bench" / "_sources_floor.py"), "--rate", str(RATE), "--seconds",
                   str(SECONDS), "--sources", str(sources)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=30,
                          env={**os.environ, "LD_LIBRARY_PATH": str(libcuda)})
    assert done.returncode == 0, done.stderr
    import _sources_floor as floors

    values = floors.parse(done.stdout.strip())
    expected = RATE * sources * (SECONDS - 1)
    assert 0.85 * expected <= values["frames"] <= 1.1 * expected + 2 * sources, values
    assert 0 < values["cpu_us_p50"] <= values["cpu_us_p99"] and 0 < values["wake_us_p50"] <= values["wake_us_p99"]


def test_a_32_source_wait_set_row_is_held_against_the_floors_of_32_sources():
    import sources

    def floor(name: str, us: float, pct: float, count: int) -> dict:
        return {"variant": name, "sources": count, "rate": 30.0, "mode": "cuda" if name == "c" else "bare",
                "skipped": "", "thread_us": us, "thread_pct": pct}

    rows = [{"variant": "waitset", "sources": 32, "rate": 30.0, "thread_us": 60.0, "thread_pct": 5.76},
            {"variant": "selectors", "sources": 32, "rate": 30.0, "thread_us": 66.0, "thread_pct": 6.34},
            floor("c", 20.0, 1.92, 32), floor("python-floor", 30.0, 2.88, 32), floor("c", 90.0, 0.27, 1)]
    said = sources.against_floors(rows)
    assert said == [
        "32 x 30 fps waitset: 60.0 us a frame = 3.0 x the C floor (cuda, 20.0 us), 2.0 x the Python floor "
        "(30.0 us); 5.76 % of a core against C's 1.92 % for the same wakes: the 5 % goal is above what C pays",
        "32 x 30 fps selectors: 66.0 us a frame = 3.3 x the C floor (cuda, 20.0 us), 2.2 x the Python floor "
        "(30.0 us)"]
