"""Samples, benchmarks and scripts/*.py on a machine that lacks what they need: one line naming it
and how to get it, exit status 2, never a traceback; --help anywhere; a bad option value is a
usage error."""
from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

import eglcuda

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Every script a user runs: a new one is in these tests from the start.
SCRIPTS = sorted(str(p.relative_to(ROOT)) for folder in ("samples", "bench", "scripts")
                 for p in (ROOT / folder).glob("[a-z]*.py"))
# Those that need no GPU, with what they need instead (tested below).
NO_GPU = {"bench/call_overhead.py": "EGL", "bench/frame_seal.py": "pyca/cryptography", "scripts/slim_wheel.py": ""}
GPU_SCRIPTS = [s for s in SCRIPTS if s not in NO_GPU]


def test_the_script_lists_hold_every_script():
    assert "samples/cuda_to_cuda.py" in GPU_SCRIPTS and "bench/ordering.py" in GPU_SCRIPTS
    assert "scripts/gpu_check.py" in GPU_SCRIPTS and set(NO_GPU) <= set(SCRIPTS)


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


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_works_anywhere(script, tmp_path):
    if not (ROOT / script).exists():
        pytest.skip(f"{script} is not in this tree")
    result = subprocess.run([sys.executable, str(ROOT / script), "--help"], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:")


def _one_line(result: subprocess.CompletedProcess, script: str) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{script}: needs "), lines[0]
    return lines[0]


@pytest.mark.parametrize("script", [s for s in SCRIPTS if s != "scripts/slim_wheel.py"])  # (it needs arguments)
def test_without_numpy_is_one_line_and_status_2(script, tmp_path):
    # (an interpreter without NumPy has no eglcuda either: the script's check must say so, not an
    # import of a helper module before it)
    block = ("import runpy, sys; sys.modules['numpy'] = None; sys.argv = sys.argv[1:]; "
             "runpy.run_path(sys.argv[0], run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", block, str(ROOT / script)], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{script}: ") and "numpy" in lines[0], result.stderr


def test_call_overhead_without_egl_is_one_line(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "call_overhead.py"), "--quick"], capture_output=True,
                            text=True, timeout=120, cwd=tmp_path,
                            env={**os.environ, "EGLCUDA_LIBEGL": "/nonexistent/libEGL.so.1"})  # the loader's test hook
    assert "apt-get install" in _one_line(result, "bench/call_overhead.py")


def test_frame_seal_without_cryptography_is_one_line(tmp_path):
    block = ("import runpy, sys; sys.modules['cryptography'] = None; sys.argv = sys.argv[1:]; "
             "runpy.run_path(sys.argv[0], run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", block, str(ROOT / "bench" / "frame_seal.py"), "--repeat", "1"],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "remote-cu12" in _one_line(result, "bench/frame_seal.py")


def test_topics_asked_for_torch_mp_alone_without_pytorch_is_one_line(tmp_path):
    block = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = sys.argv[1:]; "
             "runpy.run_path(sys.argv[0], run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", block, str(ROOT / "bench" / "topics.py"), "--transports", "torch-mp",
                             "--quick"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert "PyTorch" in _one_line(result, "bench/topics.py")


# Options whose values the scripts parse themselves: a bad one is argparse's usage error (status 2)
# as the command line is read, on any machine; not a ValueError (status 1) once the GPU work has
# begun, a child that never starts, a bench that hangs or one that measures nothing and exits 0.
BAD_ARGUMENTS = [
    ("bench/frame_seal.py", "--repeat", "0"),
    ("bench/sources.py", "--rates", "x"),
    ("bench/sources.py", "--sources", "8,many"),
    ("bench/sources.py", "--size", "1920x"),
    ("bench/sources.py", "--transport", "bogus"),
    ("bench/sources.py", "--batcher", "--size", "640x480:ARGB"),
    ("bench/sources.py", "--size", "1921x1080:NV12"),
    ("bench/topics.py", "--transports", "bogus"),
    ("bench/topics.py", "--qos", "bogus"),
    ("bench/topics.py", "--subscribers", "x"),
    ("bench/topics.py", "--sizes", "bogus"),
    ("bench/remote.py", "--subscribers", "x"),
    ("bench/remote.py", "--rates", "fast"),
    ("bench/cross_gpu.py", "--directions", "0-1"),
    ("bench/cross_process.py", "--transports", "bogus"),
    ("bench/cross_process.py", "--sizes", "12"),
    ("bench/stream_roundtrip.py", "--cpus", "x"),
    ("samples/cuda_to_cuda.py", "--formats", "BOGUS"),
    ("samples/cuda_to_cuda.py", "--layouts", "bogus"),
    ("samples/cross_process.py", "--format", "BOGUS"),
    ("samples/cross_gpu.py", "--format", "BOGUS"),
    ("samples/cuda_to_cuda.py", "--width", "0"),
    ("samples/cuda_to_cuda.py", "--device", "-1"),
    ("samples/cross_process.py", "--frames", "0"),
    ("samples/cross_gpu.py", "--height", "1"),
    ("samples/cross_gpu.py", "--width", "1921"),
    ("samples/cross_process.py", "--format", "NV12", "--height", "1081"),
    ("samples/cuda_to_cuda.py", "--formats", "ARGB,NV12", "--width", "641"),
    ("samples/multi_camera.py", "--width", "1281"),
    ("samples/cuda_event_eglsync.py", "--rounds", "0"),
    ("samples/gl_texture_to_cuda.py", "--iterations", "0"),
    ("samples/multi_camera.py", "--cameras", "0"),
    ("samples/multi_camera.py", "--fps", "0"),
    ("samples/pipeline.py", "--frames", "-5"),
    ("samples/topic_fanout.py", "--width", "0"),
    ("bench/sources.py", "--seconds", "-1"),
    ("bench/sources.py", "--warmup", "-1"),
    ("bench/topics.py", "--duration", "nan"),
    ("bench/topics.py", "--busy-wait", "20000"),
    ("bench/fanout.py", "--rounds", "0"),
    ("bench/fanout.py", "--consumers", "0"),
    ("bench/fanout.py", "--cases", "0x0:NV12"),
    ("bench/fanout.py", "--cases", "1920x1080:BOGUS"),
    ("bench/fanout.py", "--cases", "1921x1080:NV12"),
    ("bench/stream_roundtrip.py", "--repeats", "-1"),
    ("bench/stream_profile.py", "--iterations", "0"),
    ("bench/video.py", "--duration", "-1"),
    ("bench/video.py", "--rows", ","),
    ("bench/remote.py", "--rounds", "0"),
    ("bench/remote.py", "--ucx-env", "TLS=tcp"),
    ("bench/remote_link.py", "--rate", "0"),
    ("bench/ordering.py", "--width", "0"),
    # non-finite numbers (they passed and ended the run midway, or never)
    ("bench/sources.py", "--rates", "nan"),
    ("bench/sources.py", "--rates", "30,inf"),
    ("bench/sources.py", "--warmup", "inf"),
    ("bench/topics.py", "--duration", "inf"),
    ("bench/_sources_floor.py", "--rate", "nan"),
    ("bench/_sources_floor.py", "--seconds", "inf"),
    # a results file the run could not write at its end, checked before the run
    ("bench/sources.py", "--json", "/"),
    ("bench/sources.py", "--json", "/nonexistent-folder/rows.json"),
    ("bench/fanout.py", "--json", ""),
    ("bench/cross_process.py", "--markdown", "/"),
    ("bench/memory_kinds.py", "--plot", "/nonexistent-folder/plot.svg"),
    ("bench/stream_roundtrip.py", "--markdown", "/"),
    ("scripts/gpu_check.py", "--out", "/etc/hostname"),
    # a results folder that is a file (it failed after the run's first row, or at its end)
    ("bench/topics.py", "--out", "/etc/hostname"),
    ("bench/remote.py", "--out", "/etc/hostname"),
    ("bench/video.py", "--out", "/etc/hostname"),
    ("bench/mps.py", "--out", "/etc/hostname/results"),
    ("bench/cross_gpu.py", "--out", "/etc/hostname"),
    ("bench/remote_link.py", "--out", "/etc/hostname"),
]


@pytest.mark.parametrize("script, args", [(s, a) for s, *a in BAD_ARGUMENTS], ids=[" ".join(b) for b in BAD_ARGUMENTS])
def test_a_bad_option_value_is_a_usage_error_before_anything_runs(script, args, tmp_path):
    if not (ROOT / script).exists():
        pytest.skip(f"{script} is not in this tree")
    result = subprocess.run([sys.executable, str(ROOT / script), *args], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    option = next(a for a in reversed(args) if a.startswith("--"))
    assert lines[0].startswith("usage: ") and lines[-1].startswith(f"{pathlib.Path(script).name}: error: "), lines
    assert option in lines[-1], lines[-1]


def test_plots_of_a_folder_without_results_is_a_bad_argument(tmp_path):
    # (bench/video.py draws what it can without matplotlib; bench/mps.py --plot says the same)
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "video.py"), "--plot-only", str(tmp_path / "none")],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bench/video.py: cannot read "), lines


@pytest.mark.parametrize("script, option", [("bench/video.py", "--plot-only"), ("bench/mps.py", "--plot")])
@pytest.mark.parametrize("body", ["{}", "[1, 2]", '{"cells": 3}'])
def test_plots_of_results_of_another_shape_is_a_bad_argument(script, option, body, tmp_path):
    (tmp_path / "results.json").write_text(body)
    result = subprocess.run([sys.executable, str(ROOT / script), option, str(tmp_path)], capture_output=True,
                            text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "is not this benchmark's results" in lines[0], lines


def _wheel(path: pathlib.Path, *, record: bool = True) -> pathlib.Path:
    import zipfile

    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("demo/__init__.py", "")
        wheel.writestr("demo/libx.so", b"same")
        wheel.writestr("demo/libx.so.1", b"same")
        wheel.writestr("demo-1.0.dist-info/METADATA", "Name: demo\nVersion: 1.0\n")
        wheel.writestr("demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\n")
        if record:
            wheel.writestr("demo-1.0.dist-info/RECORD", "")
    return path


@pytest.mark.parametrize("case", ["missing", "not-a-zip", "no-record", "same-folder", "drop-metadata", "out-dir"])
def test_slim_wheel_refuses_what_it_cannot_do_in_a_usage_line(case, tmp_path):
    wheel = tmp_path / "demo-1.0-py3-none-any.whl"
    out = tmp_path / "out"
    extra: list[str] = []
    if case == "not-a-zip":
        wheel.write_text("not a zip")
    elif case == "no-record":
        _wheel(wheel, record=False)
    elif case != "missing":
        _wheel(wheel)
    if case == "same-folder":
        out = tmp_path
    elif case == "drop-metadata":
        extra = ["--drop", "*/METADATA"]
    elif case == "out-dir":
        out = pathlib.Path("/proc/no-such-folder")  # (not even root makes a folder there)
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "slim_wheel.py"), str(wheel), "--out-dir", str(out),
                             *extra], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr and result.stdout == "", result.stderr
    assert result.stderr.splitlines()[-1].startswith("slim_wheel.py: error: "), result.stderr


def test_slim_wheel_keeps_one_name_of_a_duplicated_library(tmp_path):
    import zipfile

    wheel = _wheel(tmp_path / "demo-1.0-py3-none-any.whl")
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "slim_wheel.py"), str(wheel), "--out-dir",
                             str(tmp_path / "out")], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    with zipfile.ZipFile(tmp_path / "out" / wheel.name) as slim:
        names = set(slim.namelist())
    assert "demo/libx.so.1" in names and "demo/libx.so" not in names, names


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


def test_the_test_extras_hold_what_the_tests_import_and_nothing_more():
    tomllib = pytest.importorskip("tomllib")

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    module_of = {"pyopengl": "OpenGL", "imageio-ffmpeg": "imageio_ffmpeg"}
    imported = _imported_modules("tests")
    declared = {}
    for extra in ("test", "test-video"):
        declared[extra] = {re.split(r"[<>=!~\[ ;]", requirement)[0].lower() for requirement in extras[extra]}
        for distribution in declared[extra]:
            assert module_of.get(distribution, distribution) in imported, f"[{extra}] lists {distribution}, no test imports it"
    assert {"pytest", "pyopengl", "hypothesis"} <= declared["test"]
    # The video tests' decoders (about 70 MB) stay out of [test]: without them those tests skip.
    assert declared["test-video"] == {"av", "imageio-ffmpeg"} and not declared["test"] & declared["test-video"]


def test_the_dev_extra_brings_the_build_tool():
    tomllib = pytest.importorskip("tomllib")

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(re.split(r"[<>=!~\[ ;]", requirement)[0] == "build" for requirement in extras["dev"])


def test_the_bench_extra_has_torch_for_the_comparisons():
    tomllib = pytest.importorskip("tomllib")

    bench = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["bench"]
    assert "torch" in _imported_modules("bench")
    assert any(requirement.startswith("torch") for requirement in bench)


# eglcuda is on no package index: an install line must name the checkout (pip install -e '.[NAME]')
# or a built file, never the project's name. Where users read them: messages, skip reasons, help.
NOT_ON_AN_INDEX = re.compile(r"pip install (?:-U )?['\"]?eglcuda\b")


def test_install_lines_work_when_pasted():
    places = [ROOT / "README.md", ROOT / "docs" / "cli.md",
              *(p for folder in ("samples", "bench", "scripts", "tests", "eglcuda") for p in (ROOT / folder).rglob("*.py"))]
    this = pathlib.Path(__file__).resolve()
    # (eglcuda/remote words its own message and tests it there)
    skipped = {ROOT / "eglcuda" / "remote", ROOT / "tests" / "unit" / "remote" / "test_remote_units.py"}
    bad = []
    for path in places:
        if path.resolve() == this or any(path == s or s in path.parents for s in skipped):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if NOT_ON_AN_INDEX.search(line):
                bad.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("script", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "bench" / "tables").glob("*.sh")))
def test_the_table_scripts_help_and_refuse_an_option(script, tmp_path):
    # (an option was taken for the OUT folder: --help ran the benchmarks with --out --help)
    result = subprocess.run(["bash", str(ROOT / script), "--help"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 0 and f"bash {script} [OUT]" in result.stdout, result.stdout + result.stderr
    assert "set -euo" not in result.stdout and not (tmp_path / "bench-tables").exists()
    result = subprocess.run(["bash", str(ROOT / script), "--quick"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == "", result.stdout + result.stderr
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("usage: "), result.stderr


@pytest.mark.parametrize("script", ["bench/tables/topics.sh", "bench/tables/remote.sh"])
def test_a_table_script_says_what_is_missing_in_one_line_before_any_row(script):
    # (it printed its first row's heading, then the benchmark's line, after the first half of
    # topics.sh had run a few minutes on a machine without MPS's daemon)
    if eglcuda.available("cuda-stream"):
        pytest.skip("this machine has what the benchmarks need: the tables run for real (bash " + script + ")")
    result = subprocess.run(["bash", str(ROOT / script)], capture_output=True, text=True, timeout=120,
                            env={**__import__("os").environ, "PYTHON": sys.executable})
    said = (result.stdout + result.stderr).splitlines()
    assert result.returncode == 2 and len(said) == 1 and ": needs " in said[0], result.stdout + result.stderr
    result = subprocess.run(["bash", str(ROOT / script)], capture_output=True, text=True, timeout=120,
                            env={**__import__("os").environ, "PYTHON": "/nonexistent/python3"})
    assert result.returncode == 2 and result.stdout == "" and len(result.stderr.splitlines()) == 1, result.stderr
    assert "set PYTHON" in result.stderr


# (each script's first call is the benchmark's --check of what its rows need)
@pytest.mark.parametrize("script, calls", [("bench/tables/topics.sh", 3), ("bench/tables/remote.sh", 5)])
def test_the_table_scripts_pass_their_benchmarks_valid_options(script, calls, tmp_path):
    # Without a GPU each benchmark call parses its options, then answers in one line that it needs
    # one (exit 2); a shim in place of python notes that answer and lets the script go on, so that
    # every call's options are parsed (an unknown option would be argparse's usage, not one line).
    if eglcuda.available("cuda-stream"):
        pytest.skip("this machine has what the benchmarks need: the tables run for real (bash " + script + ")")
    log = tmp_path / "calls.log"
    shim = tmp_path / "python"
    shim.write_text(f'#!/bin/sh\nerr=$("{sys.executable}" "$@" 2>&1 >/dev/null); rc=$?\n'
                    f'printf "%s\\t%s\\n" "$rc" "$err" >> "{log}"\n[ "$rc" = 2 ] && exit 0\nexit "$rc"\n')
    shim.chmod(0o755)
    # (OUT relative to where the script runs, not to the checkout it changes into)
    result = subprocess.run(["bash", str(ROOT / script), "out"], capture_output=True, text=True, cwd=tmp_path,
                            timeout=600, env={**__import__("os").environ, "PYTHON": str(shim)})
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"results: {tmp_path}/out/" in result.stdout, result.stdout
    answers = log.read_text().splitlines()
    assert len(answers) == calls, answers
    for answer in answers:
        status, said = answer.split("\t", 1)
        assert status == "2" and said.startswith("bench/") and ": needs " in said, answer
