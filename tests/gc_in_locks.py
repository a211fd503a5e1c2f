"""Shared by the EGL- and GPU-tier tests of finalizers run inside eglcuda's locked sections.

The garbage collector may run a finalizer at any allocation, on whichever thread allocates,
including a thread inside one of eglcuda's locked sections. A finalizer that takes that lock must
not deadlock. Each case runs in a child process with a timeout, so a deadlock fails the test
instead of hanging the session."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

PRELUDE = """
import gc, sys
import eglcuda
gc.disable()  # collect only where the script says

class Cycle:
    def __init__(self, payload):
        self.payload, self.me = payload, self
"""


def run_case(body: str, timeout_s: float = 60) -> str:
    """Run PRELUDE + body in a child; return its stdout. Fails on a non-zero exit or a timeout."""
    script = PRELUDE + textwrap.dedent(body)
    env = dict(os.environ, PYTHONFAULTHANDLER="1")
    try:
        result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout_s,
                                env=env)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"deadlock: the child did not finish in {timeout_s} s\n{exc.stderr}") from None
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout
