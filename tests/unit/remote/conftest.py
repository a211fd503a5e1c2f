"""Fixtures of the remote-subscriber tests: every process loads the stand-in libcuda
(tests/fakes/), UCX runs over TCP loopback, and the relay's key comes from the environment."""
from __future__ import annotations

import importlib.util
import os
import pathlib
import secrets
import tempfile

import pytest

from ... import remote_extra
from ...json_peer import JsonPeer

ROOT = pathlib.Path(__file__).resolve().parents[3]
TOPICS_PEER = ROOT / "tests" / "gpu" / "topics_peer.py"
REMOTE_PEER = ROOT / "tests" / "remote_peer.py"
# UCX_MODULES=^cuda: UCX's CUDA transports would load the stand-in libcuda, which lacks what they call
UCX_ENV = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n", "UCX_MODULES": "^cuda"}


def ucxx_present() -> bool:
    return importlib.util.find_spec("ucxx") is not None


@pytest.fixture
def env(fake_env):
    remote_extra.skip_without()
    return {**fake_env, **UCX_ENV, "EGLCUDA_REMOTE_KEY": secrets.token_hex(32), "EGLCUDA_REMOTE_KEY_FILE": ""}


@pytest.fixture
def path():
    with tempfile.TemporaryDirectory(prefix="eglcuda-remote-topics-") as folder:
        os.chmod(folder, 0o700)
        yield os.path.join(folder, "t.topic")


class Peer(JsonPeer):
    """A spawned peer process (tests/remote_peer.py, or topics_peer.py for the publisher)."""

    def __init__(self, env, script: pathlib.Path, *args: str) -> None:
        super().__init__([str(script), *args], env=env, cwd=str(ROOT))


class Cluster:
    """The processes of one test: a publisher, a relay, remote subscribers; all stopped at the end."""

    def __init__(self, env, path: str) -> None:
        self.env = env
        self.path = path
        self.peers: list[Peer] = []

    def publisher(self, *args: str, seed: int = 5, rate: float = 300.0) -> Peer:
        peer = Peer(self.env, TOPICS_PEER, "publish", "--name", "t", "--path", self.path, "--width", "64",
                    "--height", "48", "--format", "NV12", "--frames", "0", "--rate", str(rate), "--seed", str(seed),
                    *args)
        self.peers.append(peer)
        assert peer.wait_for(lambda m: m["event"] == "ready")
        return peer

    def relay(self, *args: str, env=None) -> tuple[Peer, str]:
        peer = Peer(env or self.env, REMOTE_PEER, "relay", "--name", "t", "--path", self.path, *args)
        self.peers.append(peer)
        ready = peer.wait_for(lambda m: m["event"] == "ready")
        return peer, f"127.0.0.1:{ready['port']}"

    def subscriber(self, address: str, *args: str, seed: int = 5, env=None) -> Peer:
        peer = Peer(env or self.env, REMOTE_PEER, "subscribe", "--name", "t", "--remote", address, "--seed",
                    str(seed), *args)
        self.peers.append(peer)
        return peer

    def cycles(self, address: str, *args: str) -> Peer:
        peer = Peer(self.env, REMOTE_PEER, "cycles", "--name", "t", "--remote", address, "--seed", "5", *args)
        self.peers.append(peer)
        return peer

    def garbage(self, address: str, modes: str, *args: str) -> dict:
        """What the relay answered each of ``modes`` (comma-separated), tried in turn by one peer."""
        peer = Peer(self.env, REMOTE_PEER, "garbage", "--name", "t", "--remote", address, "--mode", modes, *args)
        self.peers.append(peer)
        count = len(modes.split(","))
        peer.wait_for(lambda m: len([a for a in peer.messages if a.get("event") == "answer"]) >= count)
        return {m["mode"]: m for m in peer.messages if m.get("event") == "answer"}

    def stop(self) -> None:
        for peer in reversed(self.peers):
            peer.stop()


@pytest.fixture
def cluster(env, path):
    group = Cluster(env, path)
    try:
        yield group
    finally:
        group.stop()
