"""The runnable Python blocks of README.md and docs/*.md run as written on a GPU machine (each in
a fresh interpreter, in an empty folder; a ``background`` block beside the page's next block).
A block that exits with status 2 and names what it is missing (``eglcuda.require``) is skipped
with that line. Fragments are compiled by tests/unit/test_doc_snippets.py only."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import eglcuda

from ..doc_blocks import Block, all_blocks, blocks_of

RUNNABLE = [block for block in all_blocks() if not block.fragment and not block.background]
TIMEOUT = 180


@pytest.fixture(autouse=True)
def _a_gpu():
    ok, why = eglcuda.available("cuda-stream", reason=True)
    if not ok:
        if os.environ.get("EGLCUDA_REQUIRE_GPU") == "1":
            pytest.fail(f"{why} (and EGLCUDA_REQUIRE_GPU=1 says this tier must run)")
        pytest.skip(f"the docs' blocks run on a GPU machine: {why}")


def _start(block: Block, folder) -> subprocess.Popen:
    script = folder / f"block_{block.line}.py"
    script.write_text(block.code)
    return subprocess.Popen([sys.executable, str(script)], cwd=folder, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))


def _finish(block: Block, child: subprocess.Popen) -> str:
    try:
        out, _ = child.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        child.kill()
        out, _ = child.communicate()
        pytest.fail(f"{block.where} did not end within {TIMEOUT} s:\n{out}")
    if child.returncode == 2 and out.strip().splitlines() and "needs" in out.strip().splitlines()[-1]:
        pytest.skip(f"{block.where}: {out.strip().splitlines()[-1]}")
    assert child.returncode == 0, f"{block.where} exited with status {child.returncode}:\n{out}"
    # A block prints its checks as "what: True": a reader who runs it sees a False as a failure.
    assert ": False" not in out, f"{block.where} printed a failed check:\n{out}"
    return out


def _background_of(block: Block) -> Block | None:
    """The background block this block runs beside (the runnable block just before it, when
    that one is a background block)."""
    runnable = [b for b in blocks_of(block.path) if not b.fragment]
    index = runnable.index(block)
    return runnable[index - 1] if index and runnable[index - 1].background else None


@pytest.mark.parametrize("block", RUNNABLE, ids=[block.where for block in RUNNABLE])
def test_block_runs_as_written(block: Block, tmp_path):
    partner = _background_of(block)
    background = _start(partner, tmp_path) if partner is not None else None
    try:
        _finish(block, _start(block, tmp_path))
    except BaseException:
        if background is not None and background.poll() is None:
            background.kill()
            background.communicate()
        raise
    if partner is not None and background is not None:
        _finish(partner, background)
