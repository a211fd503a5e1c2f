"""python -m eglcuda check on a GPU machine: every check applies and passes."""
from __future__ import annotations

import json
import subprocess
import sys

from eglcuda import conformance


def test_every_conformance_check_passes_on_the_gpu(cuda_display, tmp_path):
    out = tmp_path / "check.json"
    result = subprocess.run([sys.executable, "-m", "eglcuda", "check", "--json", str(out), "--require",
                             "cuda-stream,cross-process,eglimage-cuda,cuda-sync"],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(out.read_text())
    statuses = {c["name"]: (c["status"], c["detail"]) for c in report["checks"]}
    for check in conformance.CHECKS:
        status, detail = statuses[check.name]
        assert status == "pass", f"{check.name}: {detail}"
