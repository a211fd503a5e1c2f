"""Relay and remote subscribers over UCX on TCP loopback, every process on the stand-in libcuda
(the fake's "device memory" is host memory: the relay's D2H copy and the remote side's H2D copy
run for real). Frames are random per (seed, seq); every byte of every frame is checked."""
from __future__ import annotations

import json
import pathlib
import os
import secrets
import signal
import subprocess
import sys
import time

import pytest

from .conftest import REMOTE_PEER, ROOT, Peer


def _frames_ok(peer) -> None:
    got = peer.got()
    assert got and all(m["ok"] for m in got), [m for m in got if not m["ok"]][:2]


def _until_none_connected(relay, seconds: float, every: float) -> None:
    """Ask the relay for its remote subscribers until none is connected (fails after ``seconds``)."""
    deadline = time.monotonic() + seconds
    while True:
        relay.messages.clear()
        relay.send("remotes")
        remotes = relay.wait_for(lambda m: m["event"] == "remotes")["remotes"]
        if not [r for r in remotes if r["connected"]]:
            return
        assert time.monotonic() < deadline, remotes
        time.sleep(every)


def test_every_and_latest_remote_subscribers_check_every_byte(cluster):
    cluster.publisher(rate=300)
    # (every_timeout 5 s: the 'every' remote receives nothing until the listing was taken)
    relay, address = cluster.relay("--qos", "every", "--queue", "8", "--every-timeout", "5")
    every = cluster.subscriber(address, "--qos", "every", "--queue", "4", "--count", "60", "--hold", "2", "--wait-go")
    latest = cluster.subscriber(address, "--qos", "latest", "--count", "12", "--sleep-ms", "30", "--wait-go")
    for peer in (every, latest):
        ready = peer.wait_for(lambda m: m["event"] in ("ready", "error"))
        assert ready["event"] == "ready", ready
        assert ready["transport"] == "remote" and ready["subscriber"] is True
        assert ready["info"] == [64, 48, "NV12"]
    relay.send("remotes")
    listed = relay.wait_for(lambda m: m["event"] == "remotes")["remotes"]
    assert sorted(r["qos"] for r in listed if r["connected"]) == ["every", "latest"]
    for peer in (every, latest):
        peer.send("go")
    for peer in (every, latest):
        peer.wait_for(lambda m: m["event"] == "done")
        _frames_ok(peer)
    seqs = [m["seq"] for m in every.got()]
    assert seqs == list(range(seqs[0], seqs[0] + 60))  # every: lossless through an 'every' relay
    assert all(m["skipped"] == 0 for m in every.got()[1:])
    seqs = [m["seq"] for m in latest.got()]
    assert seqs == sorted(set(seqs)) and sum(m["skipped"] for m in latest.got()) > 0  # latest: a slow one skips


def test_a_slow_every_remote_with_the_deepest_window_gets_every_frame_in_order(cluster):
    """A window of 16 to a remote that holds frames and sleeps: the relay runs out of credit
    again and again, and still every frame arrives, in order, none twice."""
    cluster.publisher(rate=300)
    _, address = cluster.relay("--qos", "every", "--queue", "16", "--every-timeout", "5")
    slow = cluster.subscriber(address, "--qos", "every", "--queue", "16", "--count", "80", "--hold", "3",
                              "--sleep-ms", "5")
    slow.wait_for(lambda m: m["event"] == "done", timeout=60)
    _frames_ok(slow)
    seqs = [m["seq"] for m in slow.got()]
    assert seqs == list(range(seqs[0], seqs[0] + 80))


def test_two_relays_into_one_process_and_one_relay_to_many_never_cross_messages(cluster, env, path):
    """UCX matches tags on a whole worker: two remote subscribers of one process (one engine), on
    two relays whose publishers differ in content, each get only their own relay's frames; and one
    relay's four remote subscribers in four processes each get every frame, in order."""
    cluster.publisher(seed=5, rate=300)
    other_path = path + ".b"
    from .conftest import TOPICS_PEER, Peer
    other = Peer(env, TOPICS_PEER, "publish", "--name", "t", "--path", other_path, "--width", "64", "--height", "48",
                 "--format", "NV12", "--frames", "0", "--rate", "300", "--seed", "9")
    cluster.peers.append(other)
    assert other.wait_for(lambda m: m["event"] == "ready")
    _, first = cluster.relay("--qos", "every", "--queue", "8")
    second_relay = Peer(env, REMOTE_PEER, "relay", "--name", "t", "--path", other_path, "--qos", "every", "--queue", "8")
    cluster.peers.append(second_relay)
    second = f"127.0.0.1:{second_relay.wait_for(lambda m: m['event'] == 'ready')['port']}"
    pair = Peer(env, REMOTE_PEER, "pair", "--name", "t", "--remote", first, "--remote2", second, "--seed", "5",
                "--seed2", "9", "--count", "80")
    cluster.peers.append(pair)
    many = [cluster.subscriber(first, "--qos", "every", "--queue", "4", "--count", "80") for _ in range(4)]
    done = pair.wait_for(lambda m: m["event"] == "done", timeout=60)
    assert done["bad"] == [], done["bad"][:3]
    for seqs in done["seqs"]:
        assert seqs == list(range(seqs[0], seqs[0] + 80)), seqs
    for peer in many:
        peer.wait_for(lambda m: m["event"] == "done", timeout=60)
        _frames_ok(peer)
        seqs = [m["seq"] for m in peer.got()]
        assert seqs == list(range(seqs[0], seqs[0] + 80))


@pytest.mark.parametrize("relay_mode, subscriber_mode", [("loop", "thread"), ("thread", "loop")])
def test_the_two_progress_modes_serve_each_other_every_byte(cluster, env, relay_mode, subscriber_mode):
    """EGLCUDA_UCX_PROGRESS: a relay whose engine progresses UCX on its own thread serves a
    remote subscriber whose engine uses UCXX's progress thread, and the other way round."""
    cluster.publisher(rate=300)
    relay, address = cluster.relay("--qos", "every", "--queue", "8", env={**env, "EGLCUDA_UCX_PROGRESS": relay_mode})
    assert relay.wait_for(lambda m: m["event"] == "ready")["progress"] == relay_mode
    sub = cluster.subscriber(address, "--qos", "every", "--queue", "4", "--count", "40",
                             env={**env, "EGLCUDA_UCX_PROGRESS": subscriber_mode})
    sub.wait_for(lambda m: m["event"] == "done", timeout=60)
    _frames_ok(sub)
    seqs = [m["seq"] for m in sub.got()]
    assert seqs == list(range(seqs[0], seqs[0] + 40))


def test_wrong_key_and_garbage_peers_are_refused_with_the_reason_and_change_nothing(cluster, env):
    cluster.publisher()
    relay, address = cluster.relay("--timeout", "1.5")
    wrong = cluster.subscriber(address, "--count", "3", env={**env, "EGLCUDA_REMOTE_KEY": secrets.token_hex(32)})
    error = wrong.wait_for(lambda m: m["event"] in ("ready", "error"))
    assert error["event"] == "error" and error["kind"] == "Refused", error
    assert "key" in error["reason"]
    started = time.monotonic()
    answers = cluster.garbage(address, "magic,wrongkey,old,big,silent", "--timeout", "3")
    answer = answers["magic"]
    assert answer["answer"] == "refused" and "not an eglcuda remote topic peer" in answer["reason"], answer
    answer = answers["wrongkey"]
    assert answer["answer"] == "refused" and "authentication failed" in answer["reason"], answer
    answer = answers["old"]  # (a peer of another protocol version is told which, in the clear)
    assert answer["answer"] == "refused" and "version 3, this side speaks 4" in answer["reason"], answer
    # Longer than any handshake message: the relay's receive of exactly HANDSHAKE bytes fails.
    assert answers["big"]["answer"] in ("closed", "refused"), answers["big"]
    # Silent: no answer (the relay aborts it after its timeout, 1.5 s; UCX does not tell the peer).
    assert answers["silent"]["answer"] in ("closed", "none"), answers["silent"]
    assert time.monotonic() - started < 3 + 8
    # Plain TCP junk at the port (not UCX at all).
    import socket
    with socket.create_connection(("127.0.0.1", int(address.rsplit(":", 1)[1])), timeout=2) as raw:
        raw.sendall(os.urandom(4096))
    relay.send("remotes")
    assert relay.wait_for(lambda m: m["event"] == "remotes")["remotes"] == []
    good = cluster.subscriber(address, "--count", "5")
    good.wait_for(lambda m: m["event"] == "done")
    _frames_ok(good)


def test_handshakes_ending_as_their_time_runs_out_leave_no_slot_taken(cluster):
    """A relay serving one remote subscriber at most, whose handshake limit is 1 s: peers with
    the right key send their proof ever closer to that limit and past it (welcomed, they leave
    at once). Whichever way each one ended, the relay's one slot is free afterwards."""
    cluster.publisher()
    relay, address = cluster.relay("--timeout", "1.0", "--max-remotes", "1")
    delays = [0.85 + 0.05 * step for step in range(7)]
    answers = cluster.garbage(address, ",".join(f"late:{delay:.2f}" for delay in delays), "--timeout", "3")
    assert len(answers) == len(delays)
    assert all(a["answer"] in ("WELCOME", "closed", "none") for a in answers.values()), answers
    _until_none_connected(relay, 5, 0.1)  # (the welcomed ones left: the relay hears it from their endpoints)
    good = cluster.subscriber(address, "--count", "5")
    ready = good.wait_for(lambda m: m["event"] in ("ready", "error"))
    assert ready["event"] == "ready", ready  # (a slot still counted busy: Refused, "serves 1 ... already")
    good.wait_for(lambda m: m["event"] == "done")
    _frames_ok(good)


# A relay whose handshakes run out of time as their first message is posted (a handshake
# limit of 1 ms, set after the relay was made), and subscribers that record that message.
_SENDS_OUTLIVING_THEIR_WAIT = r'''
import json, sys
import eglcuda
from eglcuda.remote import receiver, wire
firsts = []
expect = wire.expect
def recording(data, want, **options):
    if want is wire.Kind.RELAY:
        firsts.append(bytes(data[:len(wire.MAGIC)]).decode("latin-1"))
    return expect(data, want, **options)
receiver.wire.expect = recording
relay = eglcuda.Relay("t", "127.0.0.1:0", path=sys.argv[1])
relay._server._timeout = 0.001
said = []
for _ in range(4):
    try:
        eglcuda.Subscriber("t", remote=f"127.0.0.1:{relay.address[1]}", timeout=1).close()
        said.append("joined")
    except eglcuda.EglCudaError as exc:
        said.append(f"{type(exc).__name__}: {exc}")
relay.close()
print(json.dumps({"firsts": firsts, "said": said}), flush=True)
'''


def test_a_send_whose_wait_ran_out_of_time_sends_its_own_bytes(cluster, env):
    """A relay's handshake that runs out of time as its first message is posted abandons the
    wait, not the send: UCX still sends that buffer, which was freed with the wait, so the
    subscriber read whatever the relay's heap held there (and was refused as "not an eglcuda
    remote topic peer"). The buffer is kept until UCX is done with it."""
    cluster.publisher(rate=100)
    out = subprocess.run([sys.executable, "-c", _SENDS_OUTLIVING_THEIR_WAIT, cluster.path], env=env,
                         cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    said = json.loads(out.stdout.splitlines()[-1])
    assert said["firsts"] and all(first == "EGLCUDAR" for first in said["firsts"]), said
    assert not any("malformed" in answer for answer in said["said"]), said


def test_a_killed_remote_subscriber_leaves_the_others_alone(cluster):
    cluster.publisher(rate=200)
    relay, address = cluster.relay("--timeout", "2")
    victim = cluster.subscriber(address, "--count", "0")
    other = cluster.subscriber(address, "--count", "150", "--qos", "every")
    victim.wait_for(lambda m: m["event"] == "got")
    other.wait_for(lambda m: m["event"] == "got")
    victim.kill()
    other.wait_for(lambda m: m["event"] == "done", timeout=30)
    _frames_ok(other)
    seqs = [m["seq"] for m in other.got()]
    assert seqs == list(range(seqs[0], seqs[0] + 150))
    # the relay forgets the killed one (its endpoint fails, or it is silent past the timeout)
    _until_none_connected(relay, 8, 0.2)


def test_publisher_closes_dies_and_restarts_behind_the_relay(cluster):
    """The publisher closes (Dropped, code CLOSING, forwarded by the relay), a new one dies
    (StreamDisconnected), a third comes: wait_for_publisher joins each time (a new instance), and
    every byte after each rejoin is checked (the same seed: the same content).

    Each step waits for the event it needs, never for time: the first publisher publishes until
    it is told to close (a fixed number of frames could all be gone before the relay and the
    subscriber have started, on a loaded machine), and a rejoin may take as long as a fresh
    publisher process takes to start."""
    publisher = cluster.publisher("--until-told", rate=100)
    relay, address = cluster.relay()
    sub = cluster.subscriber(address, "--count", "0", "--rejoin", "--timeout", "10", "--rejoin-timeout", "60",
                             "--qos", "every")
    instances = [sub.wait_for(lambda m: m["event"] == "ready")["instance"]]
    sub.wait_for(lambda m: m["event"] == "got")
    publisher.send("bye")  # it stops publishing and closes the topic
    publisher.wait_for(lambda m: m["event"] == "published")
    gone = sub.wait_for(lambda m: m["event"] == "disconnected", timeout=15)
    assert gone["kind"] == "Dropped" and gone["code"] == 3, gone  # Reason.CLOSING: an iteration would end
    for step in range(2):
        publisher = cluster.publisher()
        rejoined = sub.wait_for(lambda m: m["event"] in ("rejoined", "rejoin-failed") and m.get("instance") not in
                                instances, timeout=60)
        assert rejoined["event"] == "rejoined", rejoined
        instances.append(rejoined["instance"])
        count = len(sub.got())
        sub.wait_for(lambda m: len(sub.got()) >= count + 10)
        if step == 0:
            publisher.kill()
            gone = sub.wait_for(lambda m: m["event"] == "disconnected" and m["kind"] == "StreamDisconnected",
                                timeout=15)
    _frames_ok(sub)


def test_an_every_remote_gets_a_restarted_publishers_frames_at_once(cluster):
    """An 'every' relay that served nobody for a while skipped the first publisher's frames (up to
    seq ~300 here). After that publisher closes and a new one starts, numbering from 0 again, the
    remote that joins again gets the new frames at once: the relay's record of what it skipped
    belongs to the old publisher (it refused every new frame up to that old seq: at 20 frames/s,
    15 s of nothing)."""
    publisher = cluster.publisher("--until-told", rate=100)
    relay, address = cluster.relay("--qos", "every")
    time.sleep(3)  # (the relay serves nobody: it skips the publisher's frames)
    sub = cluster.subscriber(address, "--count", "0", "--rejoin", "--timeout", "10", "--rejoin-timeout", "60",
                             "--qos", "every")
    instances = [sub.wait_for(lambda m: m["event"] == "ready")["instance"]]
    sub.wait_for(lambda m: m["event"] == "got")
    publisher.send("bye")
    gone = sub.wait_for(lambda m: m["event"] == "disconnected", timeout=15)
    assert gone["kind"] == "Dropped", gone
    cluster.publisher(rate=20)
    rejoined = sub.wait_for(lambda m: m["event"] in ("rejoined", "rejoin-failed") and m.get("instance") not in
                            instances, timeout=60)
    assert rejoined["event"] == "rejoined", rejoined
    count = len(sub.got())
    sub.wait_for(lambda m: len(sub.got()) >= count + 10, timeout=12)
    after = [m["seq"] for m in sub.got()[count:]]
    assert after == list(range(after[0], after[0] + len(after))), after
    _frames_ok(sub)


@pytest.mark.parametrize("relay_qos, remote_qos, size_after", [
    ("latest", "every", "1280x720"), ("every", "every", "1280x720"), ("latest", "latest", "1280x720"),
    ("every", "latest", "1280x720"), ("latest", "every", "640x480")])
def test_a_stopped_remote_costs_the_others_nothing_when_the_publisher_restarts(cluster, relay_qos, remote_qos,
                                                                                size_after):
    """Two remotes; one is stopped (SIGSTOP), then the publisher closes and a new one comes at
    once. Frames of 1.4 MB (sent by rendezvous, which a stopped peer never completes): the
    stopped one's sends keep their staging buffers until its sender lets go of it (every_timeout
    and more), and the relay waited for every buffer before it took the new publisher on, so the
    other one got nothing for seconds. It gets the new publisher's frames at once, of the same
    size or of another; the stopped one, woken, hears that it lost the old one and joins the new."""
    size = ("--width", "1280", "--height", "720")
    publisher = cluster.publisher("--until-told", *size, rate=30)
    _, address = cluster.relay("--qos", relay_qos, "--every-timeout", "2")
    args = ("--count", "0", "--rejoin", "--timeout", "10", "--rejoin-timeout", "60", "--qos", remote_qos)
    other = cluster.subscriber(address, *args)
    stopped = cluster.subscriber(address, *args)
    instances = [other.wait_for(lambda m: m["event"] == "ready")["instance"]]
    for peer in (other, stopped):
        peer.wait_for(lambda m: m["event"] == "got")
    os.kill(stopped.process.pid, signal.SIGSTOP)
    try:
        time.sleep(0.3)  # (frames are sent to it meanwhile, up to its credit: those sends never end)
        publisher.send("bye")
        publisher.wait_for(lambda m: m["event"] == "published")
        width, height = size_after.split("x")
        cluster.publisher("--width", width, "--height", height, rate=30)
        up_ns = time.monotonic_ns()  # (its first frame is published about now)
        rejoined = other.wait_for(lambda m: m["event"] in ("rejoined", "rejoin-failed") and m.get("instance") not in
                                  instances, timeout=60)
        assert rejoined["event"] == "rejoined", rejoined
        after = other.messages.index(rejoined)
        other.wait_for(lambda m: any(n["event"] == "got" for n in other.messages[after:]), timeout=60)
        first = next(n for n in other.messages[after:] if n["event"] == "got")
        late = (first["received_ns"] - up_ns) / 1e9
        assert late < 1.5, f"the other remote's first frame of the new publisher came {late:.2f} s after it"
    finally:
        os.kill(stopped.process.pid, signal.SIGCONT)
    gone = stopped.wait_for(lambda m: m["event"] == "disconnected", timeout=30)
    assert gone["kind"] in ("Dropped", "StreamDisconnected"), gone
    back = stopped.wait_for(lambda m: m["event"] in ("rejoined", "rejoin-failed") and m.get("instance") not in
                            instances, timeout=60)
    assert back["event"] == "rejoined", back
    at = stopped.messages.index(back)
    stopped.wait_for(lambda m: any(n["event"] == "got" for n in stopped.messages[at:]), timeout=30)
    _frames_ok(other)
    _frames_ok(stopped)


def test_close_from_another_thread_ends_wait_for_publisher_at_once(cluster):
    """wait_for_publisher(20) while the relay refuses (its publisher died), and while the relay
    is stopped (SIGSTOP: a handshake hangs): close() from another thread ends it with
    ClosedError within a fraction of its timeout, each time."""
    publisher = cluster.publisher()
    relay, address = cluster.relay()
    refused = cluster.subscriber(address, "--count", "0", "--rejoin", "--rejoin-timeout", "20",
                                 "--close-during-rejoin-ms", "300")
    hung = cluster.subscriber(address, "--count", "0", "--rejoin", "--rejoin-timeout", "20",
                              "--close-during-rejoin-ms", "2000")
    for peer in (refused, hung):
        peer.wait_for(lambda m: m["event"] == "got")
    publisher.kill()
    hung.wait_for(lambda m: m["event"] == "disconnected", timeout=15)
    failed = refused.wait_for(lambda m: m["event"] == "rejoin-failed", timeout=15)
    assert failed["kind"] == "ClosedError" and failed["waited"] < 0.3 + 1.5, failed
    os.kill(relay.process.pid, signal.SIGSTOP)  # (the hung one's next attempt to join hangs in its handshake)
    try:
        failed = hung.wait_for(lambda m: m["event"] == "rejoin-failed", timeout=25)
        assert failed["kind"] == "ClosedError" and failed["waited"] < 2.0 + 1.5, failed
    finally:
        os.kill(relay.process.pid, signal.SIGCONT)


def test_stalled_relay_times_out_then_disconnects_and_a_killed_one_at_once(cluster):
    """SIGSTOP of the relay: receive(t) raises Timeout, and after the subscriber's timeout of
    silence StreamDisconnected. Then SIGKILL of the (stopped) relay: a second subscriber, with a
    timeout too long to have noticed the silence, hears at once that the relay is gone."""
    cluster.publisher()
    relay, address = cluster.relay()
    sub = cluster.subscriber(address, "--count", "0", "--timeout", "2", "--receive-timeout", "0.5")
    other = cluster.subscriber(address, "--count", "0", "--timeout", "30", "--receive-timeout", "0.5")
    sub.wait_for(lambda m: m["event"] == "got")
    other.wait_for(lambda m: m["event"] == "got")
    os.kill(relay.process.pid, signal.SIGSTOP)
    started = time.monotonic()
    sub.wait_for(lambda m: m["event"] == "timeout", timeout=5)  # receive(timeout) first: Timeout
    gone = sub.wait_for(lambda m: m["event"] == "disconnected", timeout=10)
    assert gone["kind"] == "StreamDisconnected" and "said nothing" in gone["reason"], gone
    assert time.monotonic() - started < 2 + 2.0
    sub.wait_for(lambda m: m["event"] == "done", timeout=10)
    _frames_ok(sub)
    relay.kill()
    started = time.monotonic()
    gone = other.wait_for(lambda m: m["event"] == "disconnected", timeout=15)
    assert gone["kind"] == "StreamDisconnected" and "is gone" in gone["reason"], gone
    assert time.monotonic() - started < 3.0
    other.wait_for(lambda m: m["event"] == "done", timeout=10)
    _frames_ok(other)


def test_stalled_remote_subscriber_is_dropped_and_others_go_on(cluster):
    cluster.publisher(rate=200)
    relay, address = cluster.relay("--timeout", "1.5", "--qos", "latest")
    stalled = cluster.subscriber(address, "--count", "0", "--timeout", "30", "--qos", "latest")
    other = cluster.subscriber(address, "--count", "0", "--qos", "latest")
    stalled.wait_for(lambda m: m["event"] == "got")
    other.wait_for(lambda m: m["event"] == "got")
    os.kill(stalled.process.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 8
        while True:
            relay.messages.clear()
            relay.send("remotes")
            remotes = relay.wait_for(lambda m: m["event"] == "remotes")["remotes"]
            dropped = [r for r in remotes if r["dropped"]]
            if dropped:
                break
            assert time.monotonic() < deadline, remotes
            time.sleep(0.2)
        assert "said nothing" in dropped[0]["dropped"], dropped
        before = len(other.got())
        time.sleep(1.0)
        assert len(other.got()) > before + 10  # the other one kept getting frames meanwhile
        _frames_ok(other)
    finally:
        os.kill(stalled.process.pid, signal.SIGCONT)
    gone = stalled.wait_for(lambda m: m["event"] == "disconnected", timeout=35)
    assert gone["kind"] in ("StreamDisconnected", "Dropped"), gone


@pytest.mark.parametrize("short", ["relay", "subscriber"])
def test_a_timeout_shorter_than_a_beat_keeps_a_healthy_idle_link(cluster, short):
    """A topic at 1 frame/s, and a timeout of 0.4 s on one end (the beats come every 0.5 s while
    nothing else is said): the link was taken as stalled at the first quiet beat ("said
    nothing for 0.4 s"), the remote dropped by its relay or the relay left by its remote."""
    cluster.publisher(rate=1)
    relay, address = cluster.relay("--timeout", "0.4" if short == "relay" else "5")
    sub = cluster.subscriber(address, "--count", "4", "--timeout", "0.4" if short == "subscriber" else "5",
                             "--receive-timeout", "3")
    done = sub.wait_for(lambda m: m["event"] in ("done", "disconnected"), timeout=30)
    assert done["event"] == "done", done
    assert len(sub.got()) == 4
    _frames_ok(sub)
    relay.send("remotes")
    remotes = relay.wait_for(lambda m: m["event"] == "remotes")["remotes"]
    assert not [r for r in remotes if r["dropped"]], remotes


def test_a_relay_timeout_shorter_than_a_handshake_still_lets_remotes_join(cluster):
    """A relay with a tiny ``timeout`` (1 ms, to wait for its publisher and for silence): a
    remote's handshake over UCX takes longer than that, and each one ran out of that time, so no
    remote could join and none was told why. A handshake has a second at least, as silence has."""
    cluster.publisher(rate=100)
    # (The relay's own join to its publisher would have 1 ms too, which a loaded machine misses
    # many times in a row: the peer gives that join 10 s, the relay's limits keep 1 ms.)
    relay, address = cluster.relay("--timeout", "0.001", "--join-timeout", "10")
    sub = cluster.subscriber(address, "--count", "20", "--receive-timeout", "3")
    done = sub.wait_for(lambda m: m["event"] in ("done", "disconnected", "error"), timeout=30)
    assert done["event"] == "done", done
    assert len(sub.got()) == 20
    _frames_ok(sub)


def test_slow_every_remote_subscriber_is_dropped_with_the_reason(cluster):
    cluster.publisher(rate=200)
    relay, address = cluster.relay("--qos", "latest", "--every-timeout", "0.2")
    slow = cluster.subscriber(address, "--qos", "every", "--queue", "2", "--count", "0", "--sleep-ms", "400")
    gone = slow.wait_for(lambda m: m["event"] == "disconnected", timeout=20)
    assert gone["kind"] == "Dropped" and "every_timeout" in gone["reason"] and gone["code"] == 1, gone
    _frames_ok(slow)


def test_a_forked_child_cannot_use_the_engine_and_leaves_the_parent_alone(cluster, env):
    cluster.publisher()
    _, address = cluster.relay()
    from .conftest import Peer
    peer = Peer(env, REMOTE_PEER, "forked", "--name", "t", "--remote", address, "--seed", "5", "--count", "20")
    cluster.peers.append(peer)
    done = peer.wait_for(lambda m: m["event"] == "done", timeout=30)
    assert done["child"] == 0, done  # (3: the child made one; 4: another error; 5: close() raised)
    assert done["ok"] and done["got"] == 22, done


def test_no_relay_listening_times_out(env):
    started = time.monotonic()
    out = subprocess.run([sys.executable, str(REMOTE_PEER), "subscribe", "--name", "t", "--remote", "127.0.0.1:9",
                          "--timeout", "1.5"], env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=30)
    answer = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")][0]
    assert answer["event"] == "error" and answer["kind"] == "Timeout", (answer, out.stderr[-2000:])
    assert time.monotonic() - started < 15


def test_a_relay_host_no_resolver_knows_is_refused_at_once(env):
    """A mistyped relay host name is a UsageError naming it at once, not a Timeout after
    retrying for the whole timeout."""
    import socket

    host = "no-such-relay.invalid"
    try:
        socket.getaddrinfo(host, None, family=socket.AF_INET)
    except socket.gaierror as exc:
        if exc.errno != socket.EAI_NONAME:
            pytest.skip(f"this machine's resolver cannot say now whether {host} exists: {exc}")
    else:
        pytest.skip(f"this machine's resolver knows {host}")
    started = time.monotonic()
    out = subprocess.run([sys.executable, str(REMOTE_PEER), "subscribe", "--name", "t", "--remote", f"{host}:9999",
                          "--timeout", "20"], env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    answer = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")][0]
    assert answer["event"] == "error" and answer["kind"] == "UsageError", (answer, out.stderr[-2000:])
    assert host in answer["reason"] and "not known" in answer["reason"], answer
    assert time.monotonic() - started < 10


def test_join_leave_cycles_leak_nothing(cluster):
    """Joins, refusals and timeouts, again and again: the threads and descriptors after the
    first cycle (the UCX engine and context, made once per process) stay as they are."""
    cluster.publisher()
    relay, address = cluster.relay()
    cycles = cluster.cycles(address, "--count", "4")
    done = cycles.wait_for(lambda m: m["event"] in ("done", "bad"), timeout=60)
    assert done["event"] == "done", done
    first, last = done["marks"]
    assert first == last, done["marks"]
    relay.send("remotes")
    remotes = relay.wait_for(lambda m: m["event"] == "remotes")["remotes"]
    assert [r for r in remotes if r["connected"]] == []


def test_cli_relay_with_a_key_file_and_the_topics_listing(cluster, env, path, tmp_path):
    cluster.publisher()
    key_file = tmp_path / "key"  # (made by keygen: the subscriber uses the same file)
    subprocess.run([sys.executable, "-m", "eglcuda", "keygen", str(key_file)], env=env, cwd=os.path.dirname(path),
                   check=True, capture_output=True, timeout=60)
    cli_env = {**env, "EGLCUDA_REMOTE_KEY": ""}
    from .conftest import Peer
    relay = Peer(cli_env, pathlib.Path("-m"), "eglcuda", "relay", "t", "--path", path, "--key-file", str(key_file),
                 "--listen", "127.0.0.1:0")
    cluster.peers.append(relay)
    line = relay.wait_for(lambda m: m.get("event") == "noise" and "listening on" in m["line"])["line"]
    address = line.strip().rsplit(" ", 1)[1]
    sub = cluster.subscriber(address, "--count", "0", "--qos", "latest",
                             env={**cli_env, "EGLCUDA_REMOTE_KEY_FILE": str(key_file)})
    sub.wait_for(lambda m: m["event"] == "got")
    deadline = time.monotonic() + 5
    while True:
        out = subprocess.run([sys.executable, "-m", "eglcuda", "topics", "--dir", os.path.dirname(path)], env=env,
                             cwd=os.path.dirname(path), capture_output=True, text=True, timeout=30)  # (not the checkout: its eglcuda is unbuilt in CI)
        if "remote " in out.stdout:
            break
        assert time.monotonic() < deadline, out.stdout + out.stderr
        time.sleep(0.3)
    assert f"relay on {address}" in out.stdout and "latest" in out.stdout, out.stdout
    relay.process.send_signal(signal.SIGTERM)
    assert relay.process.wait(15) == 0
    gone = sub.wait_for(lambda m: m["event"] == "disconnected", timeout=15)
    assert gone["kind"] == "Dropped" and "closed" in gone["reason"], gone
    assert not [name for name in os.listdir(os.path.dirname(path)) if name.endswith(".relay")]


def test_a_cli_relay_signalled_as_soon_as_it_says_it_listens_closes_cleanly(cluster, env, path):
    """A supervisor that sends SIGTERM the moment the relay prints its 'listening' line gets a
    clean close (exit status 0, no relay entry left), every time: the line comes only once the
    signal closes the relay."""
    cluster.publisher()
    from .conftest import Peer
    for _ in range(4):
        relay = Peer(env, pathlib.Path("-m"), "eglcuda", "relay", "t", "--path", path, "--listen", "127.0.0.1:0")
        cluster.peers.append(relay)
        relay.wait_for(lambda m: m.get("event") == "noise" and "listening on" in m["line"])
        relay.process.send_signal(signal.SIGTERM)
        assert relay.process.wait(15) == 0
        assert not [name for name in os.listdir(os.path.dirname(path)) if name.endswith(".relay")]


def _mitm(cluster, env, address: str, mode: str):
    from .conftest import Peer
    peer = Peer(env, REMOTE_PEER, "mitm", "--name", "t", "--remote", address, "--mode", mode, "--timeout", "4")
    cluster.peers.append(peer)
    return peer, f"127.0.0.1:{peer.wait_for(lambda m: m['event'] == 'ready')['port']}"


def test_a_relay_in_the_middle_without_the_key_can_neither_welcome_nor_feed_a_subscriber(cluster, env):
    """A peer without the key that receives the subscriber's connection forwards its handshake to
    the real relay (which holds the key) and the relay's answers back: the subscriber and the
    relay agree on a session the peer cannot read. Its own WELCOME is refused; with the relay's
    WELCOME passed on, its own GONE note is ignored and its own frame ends the link with the reason."""
    cluster.publisher()
    relay, address = cluster.relay()
    mitm, fake = _mitm(cluster, env, address, "welcome")
    victim = cluster.subscriber(fake, "--count", "3", "--timeout", "4")
    error = victim.wait_for(lambda m: m["event"] in ("ready", "error"))
    assert mitm.wait_for(lambda m: m["event"] == "forwarded")["kind"] == "WELCOME"
    assert error["event"] == "error" and error["kind"] == "Refused" and "did not open" in error["reason"], error
    mitm, fake = _mitm(cluster, env, address, "frame")
    victim = cluster.subscriber(fake, "--count", "3", "--timeout", "4", "--receive-timeout", "20")
    ready = victim.wait_for(lambda m: m["event"] in ("ready", "error"))
    assert ready["event"] == "ready", ready
    mitm.send(str(ready["tags"][0]))
    mitm.wait_for(lambda m: m["event"] == "forged")
    gone = victim.wait_for(lambda m: m["event"] in ("disconnected", "got"), timeout=10)
    assert gone["event"] == "disconnected" and "frame did not open" in gone["reason"], gone
    assert "mitm-note" not in gone["reason"]  # (the note of its own making changed nothing)


def _rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def test_forged_credits_and_bye_on_another_subscribers_tag_change_nothing(cluster, env):
    """A subscriber with the key sends, on another subscriber's tag (as seen on the wire), a BYE
    and a credit sealed under its own session, random bytes and a message too long for a control
    message: the relay opens none of them, and the other subscriber goes on receiving every frame.
    48 MB of messages of kinds the relay never receives on that tag do not stay in its memory."""
    from tests.remote_peer import FLOOD_BYTES

    from .conftest import Peer
    cluster.publisher()
    relay, address = cluster.relay()
    relay_pid = next(m for m in relay.messages if m["event"] == "ready")["pid"]
    victim = cluster.subscriber(address, "--count", "0")
    ready = victim.wait_for(lambda m: m["event"] == "ready")
    tags = ready["tags"]
    forger = Peer(env, REMOTE_PEER, "forge", "--name", "t", "--remote", address)
    cluster.peers.append(forger)
    forger.wait_for(lambda m: m["event"] == "ready")
    before = _rss_bytes(relay_pid)
    forger.send(str(tags[1]))
    forger.wait_for(lambda m: m["event"] == "forged", timeout=60)
    count = len(victim.got())
    victim.wait_for(lambda m: len(victim.got()) >= count + 60)
    assert not [m for m in victim.messages if m["event"] == "disconnected"]
    relay.send("remotes")
    remotes = relay.wait_for(lambda m: m["event"] == "remotes")["remotes"]
    # (RemoteInfo.peer is the address each connected from: the victim is the one that got its
    # frames; the forger never receives, and holds its window at most)
    mine = [r for r in remotes if r["sent"] >= count + 60]
    assert len(mine) == 1 and mine[0]["connected"] and mine[0]["dropped"] is None, remotes
    _frames_ok(victim)
    grown = _rss_bytes(relay_pid) - before
    assert grown < FLOOD_BYTES // 2, f"the relay grew by {grown / 1e6:.0f} MB"


def test_a_key_holder_flooding_beats_is_dropped_at_once_and_costs_the_others_nothing(cluster, env):
    """A 'latest' subscriber with the key floods its own control tag with beats that open (200,000
    as fast as it can post them, where the protocol beats once each half second, and on for 3 s
    after it was dropped): the relay drops it with the reason within a few of them, its memory does
    not grow with the flood, and another subscriber goes on receiving every frame."""
    cluster.publisher(rate=60.0)
    relay, address = cluster.relay()
    relay_pid = next(m for m in relay.messages if m["event"] == "ready")["pid"]
    honest = cluster.subscriber(address, "--count", "0")
    honest.wait_for(lambda m: m["event"] == "got", timeout=30)
    before = _rss_bytes(relay_pid)
    flooder = Peer(env, REMOTE_PEER, "beats", "--name", "t", "--remote", address, "--count", "200000",
                   "--qos", "latest")  # (a 'latest' one that stops receiving is not dropped for it)
    cluster.peers.append(flooder)
    flooder.wait_for(lambda m: m["event"] == "ready", timeout=30)
    count = len(honest.got())
    done = flooder.wait_for(lambda m: m["event"] == "done", timeout=90)
    assert done["kind"] == "Dropped" and "a flood" in done["reason"], done
    assert done["sent"] < 200_000, done  # (cut off, not served to the end)
    honest.wait_for(lambda m: len(honest.got()) >= count + 60, timeout=30)
    assert not [m for m in honest.messages if m["event"] == "disconnected"]
    _frames_ok(honest)
    seqs = [m["seq"] for m in honest.got()[count:]]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "the honest 'every' subscriber missed frames"
    relay.send("remotes")
    remotes = relay.wait_for(lambda m: m["event"] == "remotes")["remotes"]
    assert sorted(r["dropped"] is None for r in remotes) == [False, True], remotes
    grown = _rss_bytes(relay_pid) - before
    assert grown < 30e6, f"the relay grew by {grown / 1e6:.0f} MB"


def test_integrity_and_encrypted_frames_arrive_byte_for_byte_and_a_stricter_subscriber_is_refused(cluster):
    cluster.publisher()
    _, encrypted = cluster.relay("--frames", "encrypted")
    _, plain = cluster.relay()
    subs = [cluster.subscriber(encrypted, "--count", "30", "--frames", "encrypted"),
            cluster.subscriber(encrypted, "--count", "30", "--qos", "latest")]
    strict = cluster.subscriber(plain, "--count", "3", "--frames", "integrity")
    error = strict.wait_for(lambda m: m["event"] in ("ready", "error"))
    assert error["event"] == "error" and error["kind"] == "Refused" and "requires integrity" in error["reason"], error
    for sub in subs:
        sub.wait_for(lambda m: m["event"] == "done")
        _frames_ok(sub)


@pytest.mark.parametrize("wait", ["waitset", "asyncio"])
def test_a_remote_subscriber_waits_through_a_wait_set_and_asyncio(cluster, wait):
    """A remote subscriber's fileno(), in a WaitSet or under asyncio's receive_async: every frame,
    in order, every byte; a relay whose publisher is killed shows as an error event (the
    subscriber hears StreamDisconnected through the wait), then a restarted publisher is joined
    again on the same descriptor."""
    publisher = cluster.publisher(rate=200)
    relay, address = cluster.relay("--qos", "every", "--queue", "8")
    sub = cluster.subscriber(address, "--qos", "every", "--count", "0", "--wait", wait, "--rejoin", "--timeout", "10")
    sub.wait_for(lambda m: m["event"] == "ready")
    sub.wait_for(lambda m: len(sub.got()) >= 60)
    publisher.kill()
    gone = sub.wait_for(lambda m: m["event"] == "disconnected", timeout=20)
    assert gone["kind"] in ("StreamDisconnected", "Dropped"), gone
    count = len(sub.got())
    cluster.publisher(rate=200)
    sub.wait_for(lambda m: m["event"] == "rejoined", timeout=30)
    sub.wait_for(lambda m: len(sub.got()) >= count + 30, timeout=30)
    _frames_ok(sub)
    first = [m["seq"] for m in sub.got()[:count]]
    assert first == list(range(first[0], first[0] + count))


def test_a_batcher_forms_batches_from_a_remote_subscriber(cluster, env):
    """A Batcher over a remote subscriber (its class is eglcuda.Subscriber, its receive lock its
    feed's): every batch whole, every byte of every image right, seqs without a gap (every)."""
    cluster.publisher(rate=200)
    _, address = cluster.relay("--qos", "every", "--queue", "8")
    batcher = Peer(env, ROOT / "tests" / "gpu" / "batcher_peer.py", "batch", "--source", "t:-:5", "--remote",
                   address, "--batch-size", "2", "--count", "5", "--formation-ms", "200", "--timeout", "10")
    cluster.peers.append(batcher)
    done = batcher.wait_for(lambda m: m["event"] in ("done", "ended"))
    batches = [m for m in batcher.messages if m.get("event") == "batch"]
    assert done["event"] == "done" and len(batches) == 5, (done, batcher.stderr())
    assert all(not b["wrong"] and b["size"] == 2 for b in batches), batches
    seqs = [seq for b in batches for seq in b["seqs"]]
    assert seqs == list(range(seqs[0], seqs[0] + 10)), seqs


@pytest.mark.parametrize("frames", ["plain", "integrity"])
def test_a_frame_is_sent_only_once_its_slow_copy_to_staging_is_done(cluster, env, frames):
    # The relay's D2H copies each end 4 ms after the stream's previous one (the stand-in writes
    # 0xEE bytes until then): the local thread goes on while they run (plain) or waits for each
    # before the seal reads it (integrity); a frame sent before its copy ended arrives as 0xEE
    # bytes or fails its seal. Lossless: 'every' end to end with the smallest queue.
    cluster.publisher(rate=200)
    relay, address = cluster.relay("--qos", "every", "--queue", "1", "--every-timeout", "5", "--frames", frames,
                                   env={**env, "FAKE_D2H_DELAY_US": "4000"})
    every = cluster.subscriber(address, "--qos", "every", "--queue", "1", "--count", "40", "--frames", frames)
    latest = cluster.subscriber(address, "--qos", "latest", "--count", "15", "--frames", frames)
    for peer in (every, latest):
        peer.wait_for(lambda m: m["event"] == "done")
        _frames_ok(peer)
    seqs = [m["seq"] for m in every.got()]
    assert seqs == list(range(seqs[0], seqs[0] + 40))
    seqs = [m["seq"] for m in latest.got()]
    assert seqs == sorted(set(seqs))


def test_an_every_remote_joining_beside_a_latest_one_sees_no_gap_after_its_first_frame(cluster, env):
    # An 'every' relay beside a 'latest' remote skips the frames no remote has room for (the
    # 'latest' one waiting for its credit). Its slow D2H copies (4 ms each) keep frames staged
    # before a newcomer came in flight until after it came: an 'every' remote joining then was
    # given those, while a frame after them had been skipped: a gap after its first frames.
    cluster.publisher(rate=250)
    relay, address = cluster.relay("--qos", "every", "--queue", "2", "--every-timeout", "5",
                                   env={**env, "FAKE_D2H_DELAY_US": "4000"})
    latest = cluster.subscriber(address, "--qos", "latest", "--count", "0")
    latest.wait_for(lambda m: len(latest.got()) >= 5)
    for _ in range(4):  # (each join is one more chance for the race)
        every = cluster.subscriber(address, "--qos", "every", "--queue", "1", "--count", "12")
        every.wait_for(lambda m: m["event"] == "done")
        _frames_ok(every)
        seqs = [m["seq"] for m in every.got()]
        assert seqs == list(range(seqs[0], seqs[0] + 12)), seqs


def test_a_window_buffer_is_credited_only_once_its_slow_copy_to_the_pool_is_done(cluster, env):
    # The remote subscribers' H2D copies each end 4 ms after their stream's previous one and read
    # the window buffer only then (the stand-in): a credit sent before the copy ended lets the
    # relay send the next frame into that buffer first, and the pool gets its bytes.
    cluster.publisher(rate=300)
    _, address = cluster.relay("--qos", "every", "--queue", "8", "--every-timeout", "5")
    slow = {**env, "FAKE_H2D_DELAY_US": "4000"}
    every = cluster.subscriber(address, "--qos", "every", "--queue", "2", "--count", "40", env=slow)
    latest = cluster.subscriber(address, "--qos", "latest", "--count", "15", env=slow)
    for peer in (every, latest):
        peer.wait_for(lambda m: m["event"] == "done")
        _frames_ok(peer)
    seqs = [m["seq"] for m in every.got()]
    assert seqs == list(range(seqs[0], seqs[0] + 40))


def test_a_latest_remote_takes_the_topic_while_its_user_is_busy_and_receives_a_fresh_frame(cluster):
    # Its frames land in its pool as they arrive and each window buffer goes back to the relay
    # as soon as its copy is done: the relay goes on sending while the user receives nothing
    # (it used to stop once the window of 3 was full), and the user's next receive gets a
    # frame published a moment before, every byte of it right.
    cluster.publisher(rate=300)
    relay, address = cluster.relay("--qos", "latest")
    latest = cluster.subscriber(address, "--qos", "latest", "--count", "6", "--wait-go")
    latest.wait_for(lambda m: m["event"] == "ready")
    sent = []
    for _ in range(2):
        time.sleep(1.0)
        relay.messages.clear()
        relay.send("remotes")
        sent.append(sum(r["sent"] for r in relay.wait_for(lambda m: m["event"] == "remotes")["remotes"]))
    assert sent[1] - sent[0] >= 30, sent  # (300 a second published; two shared cores may take fewer)
    latest.send("go")
    latest.wait_for(lambda m: m["event"] == "done")
    _frames_ok(latest)
    got = latest.got()
    assert got[0]["latency_us"] < 200_000, got[0]
    seqs = [m["seq"] for m in got]
    assert seqs == sorted(set(seqs))


def test_an_every_remote_holding_most_of_its_pool_gets_every_frame_in_order(cluster):
    # Queue 3, holding 2 while it sleeps: frames arriving while no slot is free wait in the
    # window and are copied when taken, those after them wait behind them, and those arriving
    # with a slot free are copied on arrival: every frame, in order, every byte.
    cluster.publisher(rate=300)
    relay, address = cluster.relay("--qos", "every", "--queue", "8", "--every-timeout", "5")
    every = cluster.subscriber(address, "--qos", "every", "--queue", "3", "--count", "60", "--hold", "2",
                               "--sleep-ms", "5")
    every.wait_for(lambda m: m["event"] == "done", timeout=60)
    _frames_ok(every)
    seqs = [m["seq"] for m in every.got()]
    assert seqs == list(range(seqs[0], seqs[0] + 60))


@pytest.mark.parametrize("qos, message", [("latest", "released"), ("every", "released"), ("latest", "kept")])
def test_a_remote_subscriber_dropped_without_close_leaves_the_relay_once_collected(cluster, env, qos, message):
    """Collected, it leaves the relay: at once, or, while the program still holds a message it
    handed out (its pool's bytes, still intact), once that is released. (A 'latest' one would
    otherwise go on taking the topic's frames until its process exits.)"""
    cluster.publisher(rate=300)
    relay, address = cluster.relay("--qos", "latest")
    peer = Peer(env, REMOTE_PEER, "dropped", "--name", "t", "--remote", address, "--qos", qos, "--seed", "5",
                "--message", message)
    cluster.peers.append(peer)
    assert peer.wait_for(lambda m: m["event"] == "dropped", timeout=30)["ok"]
    if message == "kept":
        time.sleep(0.5)
        relay.send("remotes")
        remotes = relay.wait_for(lambda m: m["event"] == "remotes")["remotes"]
        assert [r for r in remotes if r["connected"]], remotes  # (its message is still the program's)
        peer.send("")
        assert peer.wait_for(lambda m: m["event"] == "released", timeout=30)["ok"]  # every byte, still
    _until_none_connected(relay, 10, 0.2)
    peer.send("")


@pytest.mark.parametrize("qos, queue, most", [("latest", 4, 2), ("every", 3, 3)])
def test_a_remote_subscriber_holds_as_many_messages_as_it_may_and_no_more(cluster, env, qos, queue, most):
    # ('latest': two, as a local one; its pool has a slot more, for the frame arriving next.
    # 'every': its queue.) The one more is refused with the reason and costs nothing.
    cluster.publisher(rate=300)
    _, address = cluster.relay("--qos", "every", "--queue", "8", "--every-timeout", "5")
    peer = Peer(env, REMOTE_PEER, "hold-limit", "--name", "t", "--remote", address, "--qos", qos, "--queue",
                str(queue), "--count", str(most), "--seed", "5")
    cluster.peers.append(peer)
    done = peer.wait_for(lambda m: m["event"] == "done", timeout=30)
    assert "release one" in done["refused"], done
    assert done["ok"], done
    assert done["seqs"] == sorted(set(done["seqs"])), done


_REJOIN_AT_ONCE = r'''
import json, sys
sys.path.insert(0, "tests/gpu")
import eglcuda
from topics_peer import check
refused, oks = [], []
for qos in ("latest", "every"):
    for _ in range(10):
        try:
            with eglcuda.Subscriber("t", remote=sys.argv[1], qos=qos) as sub:
                with sub.receive(10) as message:
                    oks.append(check(message, 5)[0])
        except eglcuda.Refused as exc:
            refused.append(str(exc))
print(json.dumps({"refused": refused, "oks": oks}), flush=True)
'''


def test_a_remote_subscriber_closed_and_made_again_at_once_is_not_refused_as_one_too_many(cluster, env):
    """A relay serving as many remotes as it may: one closes and a new one joins at once (a program
    that reconnects). The relay counted the one that said goodbye until its connection was gone,
    and refused the new one ("serves 1 remote subscribers already") about one time in two."""
    cluster.publisher(rate=300)
    _, address = cluster.relay("--max-remotes", "1")
    out = subprocess.run([sys.executable, "-c", _REJOIN_AT_ONCE, address], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    said = json.loads(out.stdout.splitlines()[-1])
    assert said == {"refused": [], "oks": [True] * 20}, said


_RELEASE_REFUSED = r'''
import json, sys
sys.path.insert(0, "tests/gpu")
import eglcuda
from eglcuda._bind import cuda
from topics_peer import check
said = []
for qos in ("latest", "every"):
    with eglcuda.Subscriber("t", remote=sys.argv[1], qos=qos) as sub:
        message = sub.receive(10)
        eglcuda.get_device(0).make_current()
        dead = cuda.stream_create(non_blocking=True)
        cuda.stream_destroy(dead)
        try:
            message.release(dead)
            error = None
        except eglcuda.CUDAError as exc:
            error = type(exc).__name__
        said.append({"error": error, "released": message.released, "held": sub.held,
                     "ok": check(message, 5)[0] if not message.released else None})
        message.release()
        said.append({"held": sub.held})
print(json.dumps(said), flush=True)
'''


def test_a_release_the_driver_refuses_to_order_raises_and_the_message_stays_held(cluster, env):
    """As a local subscriber's (Message.release): a release whose ordering after the frame's
    readers the driver refuses (a destroyed cuda_stream) raises its CUDAError and leaves the
    message held and readable. A remote subscriber swallowed the error and let the slot go, to be
    written by the next frame's copy with nothing ordered after the user's work on it."""
    cluster.publisher(rate=300)
    _, address = cluster.relay()
    out = subprocess.run([sys.executable, "-c", _RELEASE_REFUSED, address], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    said = json.loads(out.stdout.splitlines()[-1])
    assert said == [{"error": "CUDAError", "released": False, "held": 1, "ok": True}, {"held": 0}] * 2, said
