"""A remote subscriber that stops, never receives or floods costs the relay's other remote
subscribers and the topic's local subscribers nothing (TCP loopback, stand-in libcuda)."""
from __future__ import annotations

import os
import signal
import time

import pytest

from .conftest import REMOTE_PEER, TOPICS_PEER, Peer

RATE = 60.0


def _frames_ok(peer) -> None:
    got = peer.got()
    assert got and all(m["ok"] for m in got), [m for m in got if not m["ok"]][:2]


def _listing(relay) -> list[dict]:
    relay.messages.clear()
    relay.send("remotes")
    return relay.wait_for(lambda m: m["event"] == "remotes")["remotes"]


def _local(cluster, env, path) -> Peer:
    peer = Peer(env, TOPICS_PEER, "subscribe", "--name", "t", "--path", path, "--qos", "latest", "--timeout", "20",
                "--seed", "5")
    cluster.peers.append(peer)
    return peer


def _seqs(peer, start: int) -> list[int]:
    return [m["seq"] for m in peer.got()[start:]]


@pytest.mark.parametrize("victim_qos", ["every", "latest"])
def test_a_stopped_remote_costs_the_others_nothing(cluster, env, path, victim_qos):
    """One remote subscriber stopped with SIGSTOP for 5 s beside two that receive (one of each
    QoS) and a local subscriber, at 60 frames/s: each of the others gets at least 95 % of the
    frames published meanwhile. A stopped 'every' one is dropped after every_timeout (1 s), not
    after the relay's timeout (10 s), and on waking reads Dropped with that reason; a stopped
    'latest' one that wakes gets a frame published after it woke, not one from its window."""
    cluster.publisher(rate=RATE)
    relay, address = cluster.relay("--qos", "latest", "--every-timeout", "1", "--timeout", "10")
    victim = cluster.subscriber(address, "--qos", victim_qos, "--queue", "4", "--count", "0", "--timeout", "20")
    others = [cluster.subscriber(address, "--qos", qos, "--queue", "4", "--count", "0") for qos in ("latest", "every")]
    local = _local(cluster, env, path)
    for peer in (victim, *others, local):
        peer.wait_for(lambda m: m["event"] == "got", timeout=30)
    time.sleep(1.0)
    marks = [len(peer.got()) for peer in (*others, local)]
    os.kill(victim.process.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    dropped_after = None
    try:
        while time.monotonic() - stopped < 5.0:
            if victim_qos == "every" and dropped_after is None:
                if [r for r in _listing(relay) if r["dropped"]]:
                    dropped_after = time.monotonic() - stopped
            time.sleep(0.1)
        before_wake = len(victim.got())
        counts = [len(peer.got()) - mark for peer, mark in zip((*others, local), marks)]
        seqs = [_seqs(peer, mark) for peer, mark in zip((*others, local), marks)]
    finally:
        os.kill(victim.process.pid, signal.SIGCONT)
    published = max(s[-1] for s in seqs) - min(s[0] for s in seqs) + 1
    assert published >= 0.8 * RATE * 5, (published, counts)  # (the publisher itself kept its rate)
    # (The goal is 95 %, which the GPU tier holds (tests/gpu/test_remote.py). This tier's two
    # cores are shared with other work: whenever they are busy every subscriber here skips frames,
    # stopped neighbour or not, so 80 % here; a stopped neighbour used to leave the others 4 %.)
    for name, count in zip(("latest remote", "every remote", "local"), counts):
        assert count >= 0.8 * published, (name, count, published, counts)
    for peer in (*others, local):
        _frames_ok(peer)
    if victim_qos == "every":
        assert dropped_after is not None and dropped_after < 1.0 + 2.0, dropped_after
        gone = victim.wait_for(lambda m: m["event"] == "disconnected", timeout=15)
        assert gone["kind"] == "Dropped" and "every_timeout" in gone["reason"] and gone["code"] == 1, gone
    else:
        victim.wait_for(lambda m: len(victim.got()) > before_wake, timeout=10)
        first = victim.got()[before_wake]
        # (a frame from its window, sent before the stall, is 5 s old when taken; one published
        # after the wake, within two frame periods, is fresh)
        assert first["latency_us"] < 2 / RATE * 1e6 + 100_000, first
        assert [r for r in _listing(relay) if r["connected"] and r["qos"] == "latest" and not r["dropped"]]
    _frames_ok(victim)


@pytest.mark.parametrize("deaf_qos, count", [("every", 1), ("latest", 4)])
def test_a_remote_that_never_receives_is_dropped_and_holds_nothing_the_others_need(cluster, env, deaf_qos, count):
    """Remote subscribers with the key that beat but never post a receive (UCX's rendezvous
    sends to them never end): an 'every' one with a window of 8 (it used to hold 3 sends in flight
    and 9 of the 12 staging buffers), or four 'latest' ones (3 sends each). Each is dropped with
    the reason, and an honest remote subscriber beside them goes on receiving."""
    cluster.publisher(rate=RATE)
    relay, address = cluster.relay("--qos", "latest", "--every-timeout", "1", "--timeout", "10")
    honest = cluster.subscriber(address, "--qos", "every", "--queue", "4", "--count", "0")
    honest.wait_for(lambda m: m["event"] == "got", timeout=30)
    # (rendezvous for every frame, as for real frame sizes: a send ends only once the receiver took it)
    deaf_env = {**env, "UCX_RNDV_THRESH": "1K"}
    deaf = []
    for _ in range(count):
        peer = Peer(deaf_env, REMOTE_PEER, "deaf", "--name", "t", "--remote", address, "--qos", deaf_qos, "--queue",
                    "8")
        cluster.peers.append(peer)
        deaf.append(peer)
    for peer in deaf:
        peer.wait_for(lambda m: m["event"] == "ready", timeout=30)
    joined = time.monotonic()
    mark = len(honest.got())
    while True:
        dropped = [r for r in _listing(relay) if r["dropped"]]
        if len(dropped) >= count:
            break
        assert time.monotonic() - joined < 10, _listing(relay)
        time.sleep(0.2)
    for remote in dropped:
        assert "was not received" in remote["dropped"] or "every_timeout" in remote["dropped"], dropped
    # The honest one kept going meanwhile (an 'every' deaf one never held more than its quota)
    # and goes on after the drops.
    waited = time.monotonic() - joined
    if deaf_qos == "every":
        assert len(honest.got()) - mark >= 0.8 * RATE * waited, (len(honest.got()) - mark, waited)
    time.sleep(2.0)  # (a dropped one that speaks is cut off 1.5 s after its reason: its buffers come back)
    after = len(honest.got())
    time.sleep(2.0)
    assert len(honest.got()) - after >= 0.8 * RATE * 2.0, len(honest.got()) - after
    _frames_ok(honest)
    seqs = [m["seq"] for m in honest.got()]
    assert seqs == sorted(set(seqs))
    for peer in deaf:
        peer.send("bye")
        done = peer.wait_for(lambda m: m["event"] == "done", timeout=15)
        assert done["kind"] == "Dropped" and done["reason"] in [r["dropped"] for r in dropped], done


def test_remotes_stopped_one_after_another_do_not_take_the_staging_ring_from_the_others(cluster, env, path):
    """Four 'latest' remote subscribers stopped with SIGSTOP 0.4 s apart, each keeping its sends
    in flight (rendezvous: a send ends only once its receiver took it): between them they held
    all twelve staging buffers, and the two remotes beside them got nothing until the relay's
    timeout (10 s). A silent remote whose sends hold buffers while none is free is dropped after
    three missed beats: the others keep getting frames, every byte right."""
    rndv = {**env, "UCX_RNDV_THRESH": "1K"}
    cluster.publisher(rate=RATE)
    relay, address = cluster.relay("--qos", "latest", "--every-timeout", "1", "--timeout", "10", env=rndv)
    victims = [cluster.subscriber(address, "--qos", "latest", "--count", "0", "--timeout", "30", env=rndv)
               for _ in range(4)]
    others = [cluster.subscriber(address, "--qos", qos, "--queue", "4", "--count", "0", env=rndv)
              for qos in ("latest", "every")]
    for peer in (*victims, *others):
        peer.wait_for(lambda m: m["event"] == "got", timeout=30)
    time.sleep(1.0)
    try:
        for victim in victims:
            os.kill(victim.process.pid, signal.SIGSTOP)
            time.sleep(0.4)
        time.sleep(2.0)  # (three beats missed by the last one stopped)
        marks = [len(peer.got()) for peer in others]
        time.sleep(4.0)
        counts = [len(peer.got()) - mark for peer, mark in zip(others, marks)]
        dropped = [r["dropped"] for r in _listing(relay) if r["dropped"]]
    finally:
        for victim in victims:
            os.kill(victim.process.pid, signal.SIGCONT)
    # (the others' rate while all four stay stopped: 60/s; a quarter of it on this tier's two
    # shared cores running eight processes, where before they got none)
    assert all(count >= 0.25 * RATE * 4.0 for count in counts), counts
    assert dropped and all("staging buffers" in reason for reason in dropped), dropped
    for peer in others:
        _frames_ok(peer)
