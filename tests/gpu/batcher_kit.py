"""What the batcher tests share on both tiers (tests/gpu/test_batcher.py on a GPU,
tests/unit/topics/test_batcher_fakecuda.py on the stand-in libcuda): publisher processes
(tests/gpu/topics_peer.py), one topic each, and a batching process (tests/gpu/batcher_peer.py)
whose reports are read back."""
from __future__ import annotations

import os
import pathlib
import tempfile

import pytest

from ..json_peer import JsonPeer

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOPICS_PEER = ROOT / "tests" / "gpu" / "topics_peer.py"
BATCHER_PEER = ROOT / "tests" / "gpu" / "batcher_peer.py"


class Peer(JsonPeer):
    wait_timeout = 60.0


@pytest.fixture
def folder():
    with tempfile.TemporaryDirectory(prefix="eglcuda-batcher-") as path:
        os.chmod(path, 0o700)
        yield path


class Sources:
    """Publisher processes, one topic each: ``add(seed, rate, ...)``; ``specs`` for the batcher."""

    def __init__(self, env, folder: str, transport: str = "cuda-ipc") -> None:
        self.env, self.folder, self.transport = env, folder, transport
        self.peers: list[Peer] = []
        self.specs: list[str] = []

    def add(self, seed: int, rate: float, width: int = 64, height: int = 48, fmt: str = "NV12", **extra) -> None:
        name = f"cam{len(self.peers)}"
        self.peers.append(self._start(name, seed, rate, width, height, fmt, extra))
        self.specs.append(f"{name}:{os.path.join(self.folder, name + '.topic')}:{seed}")

    def replace(self, index: int, seed: int, rate: float, width: int = 64, height: int = 48, fmt: str = "NV12") -> None:
        """SIGKILL source ``index``'s publisher and start another on its topic, publishing ``seed``'s frames."""
        self.peers[index].stop()
        self.peers[index] = self._start(f"cam{index}", seed, rate, width, height, fmt, {})

    def _start(self, name: str, seed: int, rate: float, width: int, height: int, fmt: str, extra: dict) -> Peer:
        path = os.path.join(self.folder, f"{name}.topic")
        args = ["publish", "--name", name, "--path", path, "--width", str(width), "--height", str(height),
                "--format", fmt, "--frames", "0", "--rate", str(rate), "--seed", str(seed)]
        for key, value in extra.items():
            args += [f"--{key.replace('_', '-')}", str(value)]
        peer = Peer([str(TOPICS_PEER), *args], env=self.env, cwd=str(ROOT))
        peer.wait_for(lambda m: m["event"] == "ready")
        return peer

    def batcher(self, role: str = "batch", *args: str) -> Peer:
        sources = [a for spec in self.specs for a in ("--source", spec)]
        return Peer([str(BATCHER_PEER), role, *sources, "--transport", self.transport, *args], env=self.env,
                    cwd=str(ROOT))

    def stop(self) -> None:
        for peer in self.peers:
            peer.stop()


def run(peer: Peer, count: int) -> list[dict]:
    """The batches a batcher peer reported, once it is done; each byte checked there."""
    try:
        done = peer.wait_for(lambda m: m["event"] in ("done", "ended"))
    finally:
        peer.stop()
    batches = [m for m in peer.messages if m.get("event") == "batch"]
    assert done["event"] == "done" and len(batches) == count, (done, peer.stderr())
    assert all(not b["wrong"] for b in batches), [b["wrong"] for b in batches if b["wrong"]][:2]
    return batches
