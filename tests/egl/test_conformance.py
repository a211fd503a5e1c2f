"""python -m eglcuda check on any EGL (Mesa in CI): the EGL checks pass, the GPU checks say why
they do not apply, the JSON holds the same, and a failure makes the exit status 1."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import eglcuda
from eglcuda import conformance

from ..conftest import gl_module

EGL_CHECKS = ["gl-context", "eglimage-siblings", "fence-sync", "reusable-sync"]
GPU_CHECKS = ["cuda-stream", "cross-process", "eglimage-cuda", "cuda-egl-gl-sync"]


def test_the_egl_checks_pass_here(egl_device):
    gl_module()
    outcomes = {o.name: o for o in conformance.run_checks(EGL_CHECKS)}
    assert list(outcomes) == EGL_CHECKS
    for name, outcome in outcomes.items():
        assert outcome.status == conformance.PASS, f"{name}: {outcome.detail}"
        assert outcome.detail


def test_gpu_checks_without_a_gpu_say_what_they_need(egl_device):
    if eglcuda.available("cuda-stream"):
        pytest.skip("this machine has a GPU: tests/gpu runs these checks")
    for outcome in conformance.run_checks(GPU_CHECKS):
        assert outcome.status == conformance.NOT_APPLICABLE
        assert outcome.detail.startswith("needs "), outcome.detail


def test_a_failing_check_fails_the_command(egl_device, monkeypatch):
    def wrong() -> str:
        raise conformance.CheckFailed("frame 3, plane 0: 12 of 4096 bytes differ")

    def crashing() -> str:
        raise eglcuda.CUDAError(999, "cuEGLStreamProducerPresentFrame")

    checks = [conformance.Check("wrong", "", (), False, wrong), conformance.Check("crash", "", (), False, crashing)]
    monkeypatch.setattr(conformance, "CHECKS", checks)
    outcomes = conformance.run_checks()
    assert [o.status for o in outcomes] == [conformance.FAIL, conformance.FAIL]
    assert outcomes[0].detail == "frame 3, plane 0: 12 of 4096 bytes differ"
    assert outcomes[1].detail.startswith("CUDAError: cuEGLStreamProducerPresentFrame failed")
    assert conformance.summary_line(outcomes) == "0 passed, 2 failed, 0 not applicable"


def test_command_prints_the_table_and_writes_json(egl_device, tmp_path):
    gl_module()
    out = tmp_path / "check.json"
    result = subprocess.run([sys.executable, "-m", "eglcuda", "check", "--json", str(out), "--require", "egl,sync"],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    report = json.loads(out.read_text())
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert [statuses[name] for name in EGL_CHECKS] == ["pass"] * 4
    assert report["passed"] >= 4 and report["failed"] == 0
    assert report["capabilities"]["egl"]["available"] is True
    assert result.stdout.splitlines()[-1] == conformance.summary_line(
        [conformance.Outcome(c["name"], c["status"], c["detail"], c["seconds"]) for c in report["checks"]])


def test_require_of_a_missing_capability_fails(egl_device, tmp_path):
    if eglcuda.available("two-gpus"):
        pytest.skip("this machine has two GPUs")
    result = subprocess.run([sys.executable, "-m", "eglcuda", "check", "--only", "reusable-sync", "--json", "-",
                             "--require", "two-gpus"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "require:two-gpus" in result.stdout and "FAIL" in result.stdout
