"""Waiting on many topics on the GPU: publishers in fresh interpreters (tests/gpu/topics_peer.py),
subscribers in this process taken through one :class:`eglcuda.WaitSet`, ``selectors`` over
``fileno()`` or asyncio, every byte of every frame checked, through each transport; a remote
subscriber (through a relay, tests/remote_peer.py) in the same wait set as local ones; a
publisher or relay killed shows as an error event; the example of docs/sources.md runs."""
from __future__ import annotations

import ast
import asyncio
import os
import pathlib
import re
import secrets
import selectors
import signal
import subprocess
import sys
import tempfile
import time

import pytest

import eglcuda

from .. import remote_extra
from ..json_peer import JsonPeer
from .topics_peer import check

ROOT = pathlib.Path(__file__).resolve().parents[2]
TOPICS_PEER = ROOT / "tests" / "gpu" / "topics_peer.py"
REMOTE_PEER = ROOT / "tests" / "remote_peer.py"
FRAMES = 90  # per topic
TRANSPORTS = ["cuda-ipc", "cuda-vmm", "eglstream"]


def offer_args(transport: str) -> list[str]:
    """What makes a publishing topics_peer.py offer ``transport`` (cuda-vmm is offered when named)."""
    return ["--offer", "cuda-vmm"] if transport == "cuda-vmm" else []


class Peer(JsonPeer):
    wait_timeout = 60.0

    def __init__(self, script, *args: str, env=None) -> None:
        super().__init__([str(script), *args], env=env, cwd=str(ROOT))


@pytest.fixture
def folder():
    with tempfile.TemporaryDirectory(prefix="eglcuda-gpu-waitset-") as path:
        os.chmod(path, 0o700)
        yield path


@pytest.fixture(params=TRANSPORTS)
def transport(request, cuda_display):
    if request.param == "cuda-ipc" and eglcuda.get_device(0).info.integrated:
        pytest.skip("CUDA IPC is not available on an integrated GPU (Tegra)")
    return request.param


def publishers(folder, transport, count, rate=120.0, env=None):
    """``count`` publisher processes of topics t0.. (seed i + 1), publishing until stopped."""
    peers = []
    for i in range(count):
        peers.append(Peer(TOPICS_PEER, "publish", "--name", f"t{i}", "--path", os.path.join(folder, f"t{i}.topic"),
                          "--width", "1920", "--height", "1080", "--format", "NV12", "--frames", "0", "--rate",
                          str(rate), "--seed", str(i + 1), *offer_args(transport), env=env))
    for peer in peers:
        peer.wait_for(lambda m: m["event"] == "ready")
    return peers


def subscribers(folder, transport, count):
    return [eglcuda.Subscriber(f"t{i}", qos="every", queue=4, path=os.path.join(folder, f"t{i}.topic"),
                               transport=transport, timeout=30) for i in range(count)]


def checked(message, seed: int, got: dict) -> None:
    ok, why = check(message, seed)
    assert ok, f"topic seed {seed}, frame {message.seq}: {why}"
    got.setdefault(seed, []).append(message.seq)
    message.release()


def assert_every_frame(got: dict, count: int) -> None:
    assert sorted(got) == list(range(1, count + 1))
    for seqs in got.values():
        assert len(seqs) >= FRAMES and seqs == list(range(seqs[0], seqs[0] + len(seqs)))  # lossless, in order


@pytest.mark.parametrize("mode", ["waitset", "selectors", "asyncio"])
def test_many_topics_in_one_thread_every_byte(folder, transport, mode):
    count = 4
    peers = publishers(folder, transport, count)
    subs = subscribers(folder, transport, count)
    seeds = {id(sub): i + 1 for i, sub in enumerate(subs)}
    got: dict = {}
    deadline = time.monotonic() + 60
    try:
        def enough() -> bool:
            return len(got) == count and all(len(s) >= FRAMES for s in got.values())

        if mode == "waitset":
            with eglcuda.WaitSet() as waits:
                for sub in subs:
                    waits.attach(sub, deadline=5)
                while not enough():
                    assert time.monotonic() < deadline
                    for event in waits.wait(5):
                        assert event.kind == "message", event
                        checked(event.source.receive(0), seeds[id(event.source)], got)
        elif mode == "selectors":
            with selectors.DefaultSelector() as chosen:
                for sub in subs:
                    chosen.register(sub, selectors.EVENT_READ)
                while not enough():
                    assert time.monotonic() < deadline
                    for key, _ in chosen.select(5):
                        try:
                            message = key.fileobj.receive(0)
                        except eglcuda.Timeout:
                            continue
                        checked(message, seeds[id(key.fileobj)], got)
        else:
            async def one(sub):
                while len(got.get(seeds[id(sub)], ())) < FRAMES:
                    checked(await sub.receive_async(10), seeds[id(sub)], got)

            async def every():
                await asyncio.gather(*(one(sub) for sub in subs))

            asyncio.run(every())
        assert_every_frame(got, count)
    finally:
        for sub in subs:
            sub.close()
        for peer in peers:
            peer.stop()


def test_a_killed_publisher_is_an_error_event_and_the_others_go_on(folder, transport):
    peers = publishers(folder, transport, 2)
    subs = subscribers(folder, transport, 2)
    got: dict = {}
    try:
        with eglcuda.WaitSet() as waits:
            for sub in subs:
                waits.attach(sub)
            os.kill(peers[0].process.pid, signal.SIGKILL)
            errors = []
            deadline = time.monotonic() + 60
            while not errors or len(got.get(2, ())) < FRAMES:
                assert time.monotonic() < deadline
                for event in waits.wait(5):
                    if event.kind == "error":
                        assert event.source is subs[0] and isinstance(event.error, eglcuda.StreamDisconnected)
                        errors.append(event.error)
                        waits.detach(event.attachment)
                    else:
                        assert event.kind == "message"
                        if event.source is subs[0] and transport == "eglstream":
                            # (a frame of an EGLStream lives in its publisher's process: one
                            # announced before the kill may be gone with it, and the receive says so)
                            try:
                                message = event.source.receive(0)
                            except eglcuda.StreamDisconnected as exc:
                                errors.append(exc)
                                waits.detach(event.attachment)
                                continue
                            except eglcuda.Timeout:
                                continue  # (killed between announcing and presenting: the end comes next)
                            checked(message, 1, got)
                        else:
                            checked(event.source.receive(0), 1 if event.source is subs[0] else 2, got)
            with pytest.raises(eglcuda.StreamDisconnected):
                subs[0].receive(0)
    finally:
        for sub in subs:
            sub.close()
        for peer in peers:
            peer.stop()


def test_a_remote_and_a_local_subscriber_in_one_wait_set(folder, cuda_ordinal, monkeypatch):
    remote_extra.skip_without("remote-cu13", "remote-cu12")
    settings = {"UCX_NET_DEVICES": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n", "UCX_TLS": "tcp,cuda_copy",
                "EGLCUDA_REMOTE_KEY": secrets.token_hex(32), "EGLCUDA_REMOTE_KEY_FILE": ""}
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    env = dict(os.environ)
    path = os.path.join(folder, "t0.topic")
    (publisher,) = publishers(folder, "cuda-ipc", 1, rate=60, env=env)
    relay = Peer(REMOTE_PEER, "relay", "--name", "t0", "--path", path, "--qos", "every", "--queue", "8", env=env)
    peers = [publisher, relay]
    subs = []
    try:
        address = f"127.0.0.1:{relay.wait_for(lambda m: m['event'] == 'ready')['port']}"
        remote = eglcuda.Subscriber("t0", remote=address, qos="every", queue=4, timeout=30)
        local = eglcuda.Subscriber("t0", qos="every", queue=4, path=path, timeout=30)
        subs = [remote, local]
        assert remote.info.transport == "remote"
        got: dict = {}
        with eglcuda.WaitSet() as waits:
            for sub in subs:
                waits.attach(sub, deadline=5)
            deadline = time.monotonic() + 60
            while not (len(got.get("remote", ())) >= FRAMES and len(got.get("local", ())) >= FRAMES):
                assert time.monotonic() < deadline
                for event in waits.wait(5):
                    assert event.kind == "message", event
                    message = event.source.receive(0)
                    ok, why = check(message, 1)
                    assert ok, why
                    got.setdefault("remote" if event.source is remote else "local", []).append(message.seq)
                    message.release()
            for seqs in got.values():
                assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
            relay.process.send_signal(signal.SIGKILL)
            relay.process.wait(10)
            deadline = time.monotonic() + 60
            while True:  # (the local one goes on; the remote one ends with its error)
                assert time.monotonic() < deadline
                events = waits.wait(5)
                failed = [e for e in events if e.kind == "error"]
                if failed:
                    assert failed[0].source is remote
                    assert isinstance(failed[0].error, eglcuda.StreamDisconnected)
                    break
                for event in events:
                    event.source.receive(0).release()
    finally:
        for sub in subs:
            sub.close()
        for peer in reversed(peers):
            peer.stop()


def test_the_example_of_the_sources_page_runs(cuda_display, folder):
    text = (ROOT / "docs" / "sources.md").read_text()
    example = re.search(r"```python\n(# three cameras.*?)```", text, re.S)
    assert example, "docs/sources.md has no wait set example"
    script = pathlib.Path(folder, "example.py")
    script.write_text(example.group(1))
    env = {**os.environ, "XDG_RUNTIME_DIR": folder}
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    counts = ast.literal_eval(done.stdout.strip().splitlines()[-1].removeprefix("frames: "))
    assert set(counts) == {"cam0", "cam1", "cam2"} and all(n > 30 for n in counts.values()), done.stdout
