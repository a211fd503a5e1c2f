"""Remote subscribers over a real link, for both tiers (tests/unit/remote/test_link.py on the
stand-in libcuda, tests/gpu/test_remote_link.py on GPUs): the publisher and the relay in network
namespace ``a``, the remote subscribers in namespace ``b``, joined by a veth pair and, where the
kernel has netem, delay and loss on both ends (bench/_netlink.py makes the link). UCX runs over
TCP on the veth only (``UCX_NET_DEVICES`` names its end on each side). Frames are
tests/gpu/topics_peer.py's: random, a function of (seed, seq); every byte of every frame is checked
by the subscriber that got it."""
from __future__ import annotations

import contextlib
import pathlib
import sys
from collections.abc import Iterator, Mapping

import pytest

from .json_peer import JsonPeer

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOPICS_PEER = ROOT / "tests" / "gpu" / "topics_peer.py"
REMOTE_PEER = ROOT / "tests" / "remote_peer.py"
sys.path.insert(0, str(ROOT / "bench"))
import _netlink  # noqa: E402

CLEAN = _netlink.LinkSpec()
# each way: a 4 ms round trip; the loss hits 1500-byte packets (segmentation offload off, as on a wire)
LOSSY = _netlink.LinkSpec(delay_ms=2.0, loss_pct=0.5)


@contextlib.contextmanager
def link(spec: _netlink.LinkSpec) -> Iterator[_netlink.Link]:
    """The link, or a skip naming the first thing this machine lacks for it."""
    why = _netlink.missing(spec)
    if why:
        pytest.skip(why)
    with _netlink.Link(spec) as made:
        yield made


class Peer(JsonPeer):
    wait_timeout = 60.0


class Sides:
    """The processes of one test on a link: a publisher and a relay on side a, remote subscribers
    on side b; each in its side's network namespace with UCX on its end of the veth only."""

    def __init__(self, made: _netlink.Link, env: Mapping[str, str], path: str) -> None:
        self.link, self.env, self.path = made, env, path
        self.peers: list[Peer] = []

    def _spawn(self, side: str, script: pathlib.Path, *args: str) -> Peer:
        env = {**self.env, "UCX_NET_DEVICES": _netlink.DEVICES[side]}
        peer = Peer([str(script), *args], env=env, cwd=str(ROOT), prefix=self.link.enter(side))
        self.peers.append(peer)
        return peer

    def publisher(self, width: int, height: int, rate: float, seed: int, *args: str) -> Peer:
        peer = self._spawn("a", TOPICS_PEER, "publish", "--name", "t", "--path", self.path, "--width", str(width),
                           "--height", str(height), "--format", "NV12", "--frames", "0", "--rate", str(rate),
                           "--steady", "--seed", str(seed), *args)
        assert peer.wait_for(lambda m: m["event"] == "ready")
        return peer

    def relay(self, *args: str) -> tuple[Peer, str]:
        peer = self._spawn("a", REMOTE_PEER, "relay", "--name", "t", "--path", self.path, "--listen",
                           f"{_netlink.ADDRESSES['a']}:0", *args)
        ready = peer.wait_for(lambda m: m["event"] in ("ready", "error"))
        assert ready["event"] == "ready", ready
        return peer, f"{_netlink.ADDRESSES['a']}:{ready['port']}"

    def subscriber(self, address: str, seed: int, *args: str) -> Peer:
        return self._spawn("b", REMOTE_PEER, "subscribe", "--name", "t", "--remote", address, "--seed", str(seed),
                           *args)

    def stop(self) -> None:
        for peer in reversed(self.peers):
            peer.stop()


@contextlib.contextmanager
def sides(spec: _netlink.LinkSpec, env: Mapping[str, str], path: str) -> Iterator[Sides]:
    with link(spec) as made:
        group = Sides(made, env, path)
        try:
            yield group
        finally:
            group.stop()


def _every_byte(peer: Peer, count: int) -> list[dict]:
    """The frames ``peer`` got once it said done: ``count`` of them, each right to the byte."""
    done = peer.wait_for(lambda m: m["event"] in ("done", "error", "disconnected"), timeout=120)
    assert done["event"] == "done", done
    got = peer.got()
    assert len(got) == count, (len(got), peer.messages[-3:])
    assert all(m["ok"] for m in got), [m for m in got if not m["ok"]][:2]
    return got


def across_the_link(group: Sides, width: int = 640, height: int = 480) -> None:
    """An ``every`` remote subscriber gets 120 frames in order and a slow ``latest`` one skips,
    each checked to the byte; the relay saw them connect from side b's address, and side a's end
    of the veth sent at least every byte of those frames."""
    seed = 7
    group.publisher(width, height, 200.0, seed)
    relay, address = group.relay("--qos", "every", "--queue", "8", "--every-timeout", "5")
    before = group.link.counters("a")
    every = group.subscriber(address, seed, "--qos", "every", "--queue", "4", "--count", "120", "--hold", "2",
                             "--wait-go")
    latest = group.subscriber(address, seed, "--qos", "latest", "--count", "15", "--sleep-ms", "30", "--wait-go")
    for peer in (every, latest):
        ready = peer.wait_for(lambda m: m["event"] in ("ready", "error"))
        assert ready["event"] == "ready", ready
        assert ready["info"] == [width, height, "NV12"]
    relay.send("remotes")
    remotes = relay.wait_for(lambda m: m["event"] == "remotes")["remotes"]
    assert sorted(r["peer"].rsplit(":", 1)[0] for r in remotes) == [_netlink.ADDRESSES["b"]] * 2, remotes
    for peer in (every, latest):
        peer.send("go")
    seqs = [m["seq"] for m in _every_byte(every, 120)]
    assert seqs == list(range(seqs[0], seqs[0] + 120))
    got = _every_byte(latest, 15)
    seqs = [m["seq"] for m in got]
    assert seqs == sorted(set(seqs)) and sum(m["skipped"] for m in got) > 0
    sent = group.link.counters("a")["tx_bytes"] - before["tx_bytes"]
    assert sent >= (120 + 15) * width * height * 3 // 2, sent


def at_60(group: Sides, spec: _netlink.LinkSpec, frames: int = 300, judge_rate: bool = True) -> dict:
    """1080p NV12 published at 60 frames/s through an ``every`` relay to an ``every`` remote
    subscriber: every frame arrives, in order, right to the byte. Over netem: no frame came sooner
    than the link's delay, and with loss netem dropped packets and TCP retransmitted. With
    ``judge_rate``, past a 30-frame warm-up the frames were published at >= 57 frames/s (an
    ``every`` relay that kept no pace would hold the publisher back) and arrived at >= 57
    frames/s. Returns what was measured (for the report)."""
    seed, warm = 11, 30
    group.publisher(1920, 1080, 60.0, seed)
    _, address = group.relay("--qos", "every", "--queue", "8", "--every-timeout", "5")
    before = {side: group.link.counters(side) for side in ("a", "b")}
    sub = group.subscriber(address, seed, "--qos", "every", "--queue", "4", "--count", str(frames), "--hold", "1")
    got = _every_byte(sub, frames)
    seqs = [m["seq"] for m in got]
    assert seqs == list(range(seqs[0], seqs[0] + frames))
    timed = got[warm:]
    span = lambda key: (timed[-1][key] - timed[0][key]) / 1e9  # noqa: E731
    published, arrived = (len(timed) - 1) / span("published_ns"), (len(timed) - 1) / span("received_ns")
    latencies = sorted(m["latency_us"] / 1e3 for m in timed)
    after = {side: group.link.counters(side) for side in ("a", "b")}
    delta = {key: sum(after[s][key] - before[s][key] for s in ("a", "b")) for key in before["a"]}
    measured = {"tcp_cc": group.link.congestion_control("a"), "published": published, "arrived": arrived,
                "p50_ms": latencies[len(latencies) // 2],
                "p99_ms": latencies[int(0.99 * (len(latencies) - 1))], **delta}
    assert delta["tx_bytes"] >= frames * 1920 * 1080 * 3 // 2, measured
    assert latencies[0] >= spec.delay_ms, measured  # (each frame crossed the delayed link)
    if spec.loss_pct:
        assert delta["netem_dropped"] > 0 and delta["tcp_retransmitted"] > 0, measured
    if judge_rate:
        assert published >= 57 and arrived >= 57, measured
    return measured
