"""eglcuda.mps with the driver's own nvidia-cuda-mps-control on an NVIDIA GPU: a private daemon
whose clients the driver reports as MPS clients, and nothing left behind (tests/unit/test_mps.py
covers the same with a fake daemon on any machine)."""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from eglcuda import mps

from ..json_peer import JsonPeer
from ..waiting import wait_until

ROOT = pathlib.Path(__file__).resolve().parents[2]
UNDER_MPS = "import json; from eglcuda import mps; print(json.dumps(mps.under_mps(0)))"


@pytest.fixture
def real_mps(cuda_ordinal, monkeypatch):
    """The driver's MPS binaries, and no MPS daemon running yet (skips, naming what is missing)."""
    if mps.find_binary() is None:
        pytest.skip(f"{mps.CONTROL} is not installed here: {mps.INSTALL_HINT}")
    running = mps.running_daemons()
    if running:
        pytest.skip(f"an MPS daemon already runs here ({running}): these tests start their own")
    monkeypatch.delenv(mps.PIPE_VARIABLE, raising=False)
    monkeypatch.delenv(mps.LOG_VARIABLE, raising=False)
    yield
    mps.stop(all=True, timeout=5)


def child(code: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """A fresh interpreter (the test process has CUDA initialized already: it cannot become a client)."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("CUDA_MPS_")}
    environment.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          env=environment, cwd=ROOT)


def test_the_driver_reports_clients_of_a_private_daemon(real_mps):
    outside = child(UNDER_MPS)
    assert outside.returncode == 0, outside.stderr
    active, reason = json.loads(outside.stdout)
    if active is None:
        pytest.fail(f"this driver cannot tell: {reason}")
    assert active is False, reason
    with mps.MPSDaemon() as daemon:
        inside = child(UNDER_MPS, daemon.env())
        assert inside.returncode == 0, inside.stderr + mps._log_tail(pathlib.Path(daemon.log_directory))
        active, reason = json.loads(inside.stdout)
        assert active is True, reason
        servers = daemon.status()["servers"]  # whether a server outlives its last client is the driver's affair
        pipe = daemon.pipe_directory
    assert not pathlib.Path(pipe).exists()
    assert [p for p in mps.mps_processes() if p.pipe_directory == pipe] == []
    assert not any(mps._alive(pid) for pid in servers)


def test_info_says_whether_mps_is_active(real_mps):
    command = "import sys; from eglcuda.cli import main; sys.exit(main(['info', '--json']))"
    plain = json.loads(child(command).stdout)
    assert plain["mps"]["active"] is False and "5x faster under MPS" in plain["mps"]["advice"]
    with mps.MPSDaemon() as daemon:
        under = json.loads(child(command, daemon.env()).stdout)
        assert under["mps"]["active"] is True and under["mps"]["pipe_directory"] == daemon.pipe_directory


OWNER = """
import json, sys, time, subprocess
from eglcuda import mps
daemon = mps.MPSDaemon().start()
client = subprocess.run([sys.executable, "-c", sys.argv[1]], env={**__import__("os").environ, **daemon.env()},
                        capture_output=True, text=True)
print(json.dumps({**daemon.status(), "client": client.stdout.strip()}), flush=True)
time.sleep(300)
"""


def test_sigkill_of_the_owner_leaves_no_daemon_behind(real_mps):
    owner = JsonPeer(["-c", OWNER, UNDER_MPS], cwd=str(ROOT))
    try:
        status = owner.wait_for(lambda m: "pipe_directory" in m, timeout=120)  # a daemon, then a CUDA client
        assert json.loads(status["client"])[0] is True
    finally:
        owner.kill()
        owner.stop()
    pipe = status["pipe_directory"]
    wait_until(lambda: not pathlib.Path(status["directory"]).exists()
               and not any(p.pipe_directory == pipe for p in mps.mps_processes()), 20)
    assert not pathlib.Path(status["directory"]).exists()
    assert [p for p in mps.mps_processes() if p.pipe_directory == pipe] == []
