"""bench/c/cross_gpu.c on any machine with gcc: it builds warning-free, and its modes run against the
fake driver (tests/fakes/: the one fake libcuda, fake_cuda.c, over fake_egl_shared.c's EGLStreams
shared by the processes of one fork tree): twoproc, fanout to several consumer processes (every
byte checked with CHECK=1), KERNELS=1, BREAKDOWN=1's extra fields, failures (one line per process,
exit status 1) and usage errors."""
from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

from ..fakes import build as fake_build

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE = ROOT / "bench" / "c" / "cross_gpu.c"

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cross_gpu")
    binary = folder / "cross_gpu"
    done = subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(binary), str(SOURCE), "-ldl",
                           "-lpthread"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    libs = folder / "lib"
    fake_build.build_cross_process(libs)
    return binary, libs


def run(built, *args, timeout=60, **env):
    binary, libs = built
    environment = {k: v for k, v in os.environ.items()
                   if k not in ("CHECK", "PACE_US", "KERNELS", "PEEK", "PEEK_1D", "FILL", "NONBLOCKING", "BREAKDOWN",
                                "CONSUMERS")}
    environment.update(LD_LIBRARY_PATH=str(libs), **{k: str(v) for k, v in env.items()})
    return subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env=environment, start_new_session=True)


def fields(line: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in line.split())


def result(done) -> dict[str, str]:
    assert done.returncode == 0, done.stderr
    assert "FAKE MISUSE" not in done.stderr, done.stderr
    return fields(done.stdout.splitlines()[-1])


def test_twoproc_line_is_unchanged(built):
    values = result(run(built, "twoproc", 0, 0, 64, 48, "nv12", 300))
    assert list(values) == ["fps", "latency_p50_us", "latency_p99_us", "present_us", "release_us"]
    assert float(values["fps"]) > 0


@pytest.mark.parametrize("fmt", ["nv12", "argb"])
def test_twoproc_check_kernels(built, fmt):
    done = run(built, "twoproc", 0, 0, 66, 50, fmt, 200, CHECK=1, KERNELS=1)
    result(done)
    assert "check=ok" in done.stdout


@pytest.mark.parametrize("consumers", [1, 3, 8])
def test_fanout_every_consumer_gets_every_byte(built, consumers):
    done = run(built, "fanout", 0, 0, 64, 48, "nv12", 300, consumers, CHECK=1)
    values = result(done)
    assert values["consumers"] == str(consumers)
    assert list(values)[:5] == ["fps", "latency_p50_us", "latency_p99_us", "present_us", "release_us"]
    lines = done.stdout.splitlines()
    assert lines[0] == "check=ok"
    per_consumer = [fields(line) for line in lines if line.startswith("consumer=")]
    assert [c["consumer"] for c in per_consumer] == [str(i) for i in range(consumers)]
    assert all(float(c["latency_p50_us"]) > 0 for c in per_consumer)


def test_fanout_consumers_from_the_environment_and_kernels(built):
    values = result(run(built, "fanout", 0, 0, 64, 48, "argb", 300, CONSUMERS=2, KERNELS=1))
    assert values["consumers"] == "2"


def test_fanout_never_waits_on_a_stream_with_nothing_to_give_back(built):
    # The fake's returns wait up to 1 ms when nothing is there, as the driver's do: the producer
    # asks only the streams that hold the oldest frame, so a run of 4 x 500 rounds stays fast.
    done = run(built, "fanout", 0, 0, 64, 48, "nv12", 500, 4, FAKE_STATS=1)
    result(done)
    missed = [int(fields(line.split(": ", 1)[1])["missed"]) for line in done.stderr.splitlines()
              if line.startswith("stream ")]
    assert len(missed) == 4 and sum(missed) < 20, done.stderr


def test_breakdown_fields(built):
    done = run(built, "twoproc", 0, 0, 64, 48, "nv12", 400, BREAKDOWN=1)
    values = result(done)
    for phase in ("none", "producer", "consumer", "both"):
        for key in ("present_us", "release_us", "latency_p50_us", "fps"):
            assert float(values[f"{key}_{phase}"]) > 0, (key, phase, values)


@pytest.mark.parametrize("args,env,says", [
    (("twoproc", 0, 0, 64, 48, "nv12", 300, 3), {}, "CONSUMERS is fanout's argument"),
    (("fanout", 0, 0, 64, 48, "nv12", 300, 33), {}, "1..32"),
    (("fanout", 0, 0, 64, 48, "nv12", 300), {"BREAKDOWN": 1}, "BREAKDOWN=1 is for twoproc"),
    (("twoproc", 0, 0, 64, 48, "nv12", 300), {"BREAKDOWN": 1, "CHECK": 1}, "without CHECK"),
    (("twoproc", 0, 0, 64, 48, "nv12", 20), {"BREAKDOWN": 1}, "ITERATIONS >= 40"),
    (("twoproc", 0, 0, 64, 48, "nv12", 300), {"FILL": 1, "CHECK": 1}, "choose one"),
    (("twoproc", 0, 0, 64, 48, "nv12", 300), {"BREAKDOWN": 1, "FILL": 1}, "without FILL"),
    (("fanout", 0, 1, 64, 48, "nv12", 300, 2), {}, "needs two GPUs: found 1"),
])
def test_usage_errors(built, args, env, says):
    done = run(built, *args, **env)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and says in done.stderr, done.stderr


@pytest.mark.parametrize("mode,consumers", [("twoproc", None), ("fanout", 4)])
def test_a_failing_process_says_why_in_one_line(built, mode, consumers):
    args = [mode, 0, 0, 64, 48, "nv12", 1000] + ([consumers] if consumers else [])
    done = run(built, *args, FAKE_FAIL_STREAM=0, FAKE_FAIL_AT=150)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert lines and all(line.startswith("cross_gpu ") for line in lines), done.stderr
    assert any("cuEGLStreamConsumerAcquireFrame (frame 150) -> 999" in line for line in lines), done.stderr


@pytest.mark.parametrize("copy", ["2d", "1d"])
@pytest.mark.parametrize("mode,consumers,fmt", [("twoproc", None, "argb"), ("twoproc", None, "nv12"),
                                                  ("fanout", 3, "nv12")])
def test_fill_writes_every_frame_and_peek_checks_it(built, mode, consumers, fmt, copy):
    args = [mode, 0, 0, 64, 48, fmt, 300] + ([consumers] if consumers else [])
    peek = {"PEEK": 1, "PEEK_1D": int(copy == "1d")}
    values = result(run(built, *args, FILL=1, **peek))
    assert float(values["fps"]) > 0
    if mode == "twoproc":  # the consumer's two steps, timed
        assert float(values["acquire_us"]) > 0 and float(values["peek_us"]) > 0
    # A frame its producer did not write (the fake skips the 150th fill) is caught by the
    # consumer's check of the word it copies.
    done = run(built, *args, FILL=1, **peek, FAKE_SKIP_FILL_AT=150)
    assert done.returncode == 1
    assert "FILL: frame 150 arrived holding" in done.stderr, done.stderr


@pytest.mark.parametrize("mode,consumers", [("twoproc", None), ("fanout", 3)])
def test_nonblocking_streams_carry_every_byte(built, mode, consumers):
    args = [mode, 0, 0, 66, 50, "nv12", 200] + ([consumers] if consumers else [])
    # The fake refuses a stream created with other flags than the ones asked for.
    done = run(built, *args, CHECK=1, NONBLOCKING=1, FAKE_WANT_STREAM_FLAGS=1)
    result(done)
    assert "check=ok" in done.stdout
    result(run(built, *args, CHECK=1, FAKE_WANT_STREAM_FLAGS=0))
    assert run(built, *args, CHECK=1, FAKE_WANT_STREAM_FLAGS=1).returncode == 1


def test_peek_copies_a_word_per_frame(built):
    values = result(run(built, "fanout", 0, 0, 64, 48, "nv12", 300, 3, KERNELS=1, PEEK=1))
    assert values["consumers"] == "3"
    result(run(built, "twoproc", 0, 0, 64, 48, "argb", 300, KERNELS=1, PEEK=1))
