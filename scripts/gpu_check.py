"""Where the whole library stands on a GPU machine, in one call.

Runs ``python -m eglcuda info``, the conformance checks (``python -m eglcuda check``, with the GPU
capabilities required), the GPU test tier (tests that need NVIDIA EGL + CUDA must run:
EGLCUDA_REQUIRE_GPU=1 turns a skip for a missing platform into a failure), the EGL tier, every
sample and the quick benchmarks; writes their logs under --out and prints one summary table.
The GPU fault tests (``tests/gpu/test_mps_faults.py``) run last of all: after a process faulted
on the GPU, EGLStreams into GL textures fail in later processes for the rest of the machine's
session (docs/mps.md, "After a GPU fault"), which the GL samples would report as failures.

    python scripts/gpu_check.py --out /tmp/eglcuda-check

On a machine without an NVIDIA GPU it says so in one line and stops (exit status 2): there,
``python -m eglcuda check`` and ``python -m pytest tests`` cover what applies. The samples need
CuPy and the benchmarks the bench extra: ``pip install -e '.[test,test-video,samples-cuda13,bench]'``.

Every new sample goes in SAMPLES, every quick benchmark in BENCHMARKS.
"""
from __future__ import annotations

import argparse
import os
import pathlib
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

ROOT = pathlib.Path(__file__).resolve().parents[1]

FAULT_TESTS = "tests/gpu/test_mps_faults.py"
TEST_GROUPS = [("gpu tier", ["tests/gpu", f"--ignore={FAULT_TESTS}"]), ("egl tier", ["tests/egl"]),
               ("unit", ["tests/unit"])]
LAST_GROUP = ("gpu faults (last: they leave GL consumers broken)", [FAULT_TESTS])
SAMPLES: list[tuple[str, list[str]]] = [
    ("cuda_to_cuda 1080p FIFO 4", ["samples/cuda_to_cuda.py", "--frames", "300"]),
    ("cuda_to_cuda 4K mailbox", ["samples/cuda_to_cuda.py", "--width", "3840", "--height", "2160", "--fifo", "0", "--frames", "200"]),
    ("gl_texture_to_cuda 1280x720", ["samples/gl_texture_to_cuda.py", "--iterations", "20"]),
    ("gl_texture_to_cuda 333x97", ["samples/gl_texture_to_cuda.py", "--width", "333", "--height", "97"]),
    ("cuda_event_eglsync 1024x768", ["samples/cuda_event_eglsync.py", "--rounds", "20"]),
    ("pipeline CUDA->CUDA->GL 1280x720", ["samples/pipeline.py", "--frames", "200"]),
    ("pipeline CUDA->CUDA->GL 333x97", ["samples/pipeline.py", "--width", "333", "--height", "97", "--frames", "50"]),
    ("cross_process 1080p ARGB FIFO 4", ["samples/cross_process.py", "--frames", "600"]),
    ("cross_process 4K NV12 FIFO 2", ["samples/cross_process.py", "--width", "3840", "--height", "2160",
                                      "--format", "NV12", "--fifo", "2", "--frames", "200"]),
    ("cross_process 1080p ARGB FIFO 4 under MPS", ["samples/cross_process.py", "--frames", "600", "--mps"]),
    ("pipeline CUDA->CUDA->GL 333x97 under MPS", ["samples/pipeline.py", "--width", "333", "--height", "97",
                                                  "--frames", "50", "--mps"]),
    ("topic_fanout 720p ARGB", ["samples/topic_fanout.py", "--frames", "300"]),
    ("multi_camera 8 x 720p NV12 at 30 frames/s", ["samples/multi_camera.py"]),
]
BENCHMARKS: list[tuple[str, list[str]]] = [
    ("call overhead", ["bench/call_overhead.py", "--quick"]),
    ("stream round trip", ["bench/stream_roundtrip.py", "--quick"]),
    ("cross process", ["bench/cross_process.py", "--quick"]),
    ("cross process under MPS", ["bench/cross_process.py", "--quick", "--mps"]),
    ("memory kinds", ["bench/memory_kinds.py", "--quick"]),
    ("topics", ["bench/topics.py", "--quick", "--out", "/tmp/eglcuda-bench-topics-quick"]),
]


def run(name: str, args: list[str], out: pathlib.Path, timeout: int, env: dict[str, str]) -> tuple[int, str, float]:
    log = out / (re.sub(r"\W+", "_", name) + ".log")
    start = time.perf_counter()
    try:
        result = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        code, text = result.returncode, result.stdout + result.stderr
    except subprocess.TimeoutExpired as exc:
        code, text = -1, f"{exc.stdout or ''}{exc.stderr or ''}\nTIMEOUT after {timeout}s"
    log.write_text(text if isinstance(text, str) else text.decode(errors="replace"))
    return code, text if isinstance(text, str) else "", time.perf_counter() - start


def junit_counts(path: pathlib.Path) -> tuple[int, int, int]:
    suite = ET.parse(path).getroot()
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    total, failed = int(suite.get("tests")), int(suite.get("failures")) + int(suite.get("errors"))
    skipped = int(suite.get("skipped"))
    return total - failed - skipped, skipped, failed


# What the GPU machine must have: anything missing fails the conformance group.
REQUIRED = "egl,sync,cuda,cuda-egl,cuda-stream,cross-process,gl-stream,eglimage-cuda,cuda-sync"


def no_gpu() -> str | None:
    """Why this machine is no GPU machine (one line), or None."""
    try:
        import eglcuda
    except ImportError as exc:
        return f"eglcuda is not importable ({exc}): pip install -e '.[test]' first"
    why = eglcuda.availability.explain("cuda-stream")
    return f"no GPU here, nothing to check: {why}" if why else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu-check-logs", help="folder for the logs")
    parser.add_argument("--only", choices=["tests", "samples", "bench"], help="run one part")
    args = parser.parse_args()
    out = pathlib.Path(args.out).resolve()
    if not args.out or (out.exists() and not out.is_dir()):
        parser.error(f"--out names the folder for the logs, got {args.out!r} ({'empty' if not args.out else 'a file'})")
    why = no_gpu()
    if why:
        print(f"scripts/gpu_check.py: {why}", file=sys.stderr)
        return 2
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        print(f"scripts/gpu_check.py: --out {args.out}: {exc.strerror}", file=sys.stderr)
        return 2
    env = dict(os.environ, EGLCUDA_REQUIRE_GPU="1", PYOPENGL_PLATFORM="egl", PYTHONUNBUFFERED="1")
    rows: list[tuple[str, str, str]] = []

    code, text, _ = run("info", ["-m", "eglcuda", "info"], out, 120, env)
    print(text)
    rows.append(("info", "ok" if code == 0 else f"FAIL (exit {code})", ""))
    code, text, seconds = run("conformance", ["-m", "eglcuda", "check", "--json", str(out / "check.json"),
                                              "--require", REQUIRED], out, 600, env)
    print(text)
    closing = [line for line in text.splitlines() if " passed, " in line]
    rows.append(("conformance (python -m eglcuda check)",
                 (closing[-1] if closing else "no result") + ("" if code == 0 else f"; FAIL (exit {code})"),
                 f"{seconds:.0f}s"))

    def tests(name: str, arguments: list[str]) -> None:
        xml = out / (name.split(" (")[0].replace(" ", "_") + ".xml")
        code, text, seconds = run(name, ["-m", "pytest", *arguments, "-ra", "-q", f"--junitxml={xml}"], out, 1500, env)
        if xml.exists():
            passed, skipped, failed = junit_counts(xml)
            rows.append((f"tests: {name}", f"{passed} passed, {failed} failed, {skipped} skipped", f"{seconds:.0f}s"))
        else:
            rows.append((f"tests: {name}", f"FAIL (exit {code}, no report)", f"{seconds:.0f}s"))

    if args.only in (None, "tests"):
        for name, arguments in TEST_GROUPS:
            tests(name, arguments)
    if args.only in (None, "samples"):
        for name, sample in SAMPLES:
            code, text, seconds = run(f"sample {name}", sample, out, 600, env)
            verdict = "PASS" if code == 0 and "PASS" in text else f"FAIL (exit {code})"
            rows.append((f"sample: {name}", verdict, f"{seconds:.0f}s"))
    if args.only in (None, "bench"):
        for name, bench in BENCHMARKS:
            code, text, seconds = run(f"bench {name}", bench, out, 900, env)
            summary = [line.split("SUMMARY", 1)[1].strip() for line in text.splitlines() if "SUMMARY" in line]
            rows.append((f"bench: {name}", ("; ".join(summary) or "ok") if code == 0 else f"FAIL (exit {code})",
                         f"{seconds:.0f}s"))
    if args.only in (None, "tests"):
        tests(*LAST_GROUP)

    width = max(len(r[0]) for r in rows)
    print("\n" + "=" * 100)
    for name, verdict, seconds in rows:
        print(f"{name:<{width}}  {seconds:>5}  {verdict}")
    bad = [r for r in rows if "FAIL" in r[1] or re.search(r"[1-9]\d* failed", r[1])]
    print("=" * 100)
    print("ALL GREEN" if not bad else f"{len(bad)} group(s) not green")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
