"""The frame ring (eglcuda/topics/_ring.pyx): frames announced and plain releases returned
through shared memory, a WAKE on the socket only for a side that said it sleeps.

The null transport with ``message_only=True`` takes the ring as cuda-ipc does (its FRAME message is
the whole hand-over); the fake-libcuda tests cover cuda-ipc and cuda-vmm themselves."""
from __future__ import annotations

import gc
import hashlib
import mmap
import os
import random
import signal
import socket
import struct
import threading
import time

import pytest

import eglcuda
from eglcuda.topics import _ring, protocol
from eglcuda.topics.protocol import Reason

from .helpers import ENV, NullPublisherBackend, answer, hello, open_fds, pattern, raw, subscriber
from ...json_peer import JsonPeer

PEER = os.path.join(os.path.dirname(__file__), "ring_peer.py")
# Offsets of the layout in _ring.pyx's text.
AT_RELEASES, AT_FRAMES, FRAME_ENTRIES, ENTRY = 256, 64, 4096, 512
AT_RELEASE_ENTRIES = FRAME_ENTRIES + 256 * ENTRY


def ring_publisher(path, **options):
    options.setdefault("_backend", NullPublisherBackend(message_only=True))
    return eglcuda.Publisher("t", 64, 32, "Y", path=path, **options)


def put(pub, payload: bytes, timeout=5.0) -> int:
    frame = pub.next_frame(timeout)
    frame.data[:] = pattern(payload)
    return pub.publish(frame, payload=payload)


def random_payload(rng: random.Random) -> bytes:
    """Mostly short (inline in a ring entry), sometimes around the entry's limit or far past it."""
    size = rng.choice([0, 1, 16, 200, _ring.INLINE_PAYLOAD - 1, _ring.INLINE_PAYLOAD, _ring.INLINE_PAYLOAD + 1,
                       rng.randrange(0, protocol.MAX_PAYLOAD + 1)])
    return rng.randbytes(size)


@pytest.mark.parametrize("queue", [1, 3])
def test_a_subscriber_that_sleeps_at_once_misses_no_wake_up(path, queue):
    """Lost wake-up race: a subscriber process that sleeps in every wait (busy_wait=0), a short
    queue so that the publisher waits for its releases (its own sleep and wake-up; with a queue
    of one, every frame), and random payloads (some past a ring entry: by socket, in order). Every
    frame arrives, in order, with its payload and bytes, and nobody is dropped (a lost wake-up
    ends in a timeout or a drop)."""
    count, rng = 15000, random.Random(43 + queue)
    with ring_publisher(path, every_timeout=5.0) as pub:
        peer = JsonPeer([PEER, path, str(count), str(queue)], env=ENV)
        try:
            assert peer.wait_for(lambda m: m["event"] == "ready")["ring"] is True
            deadline = time.monotonic() + 10
            while not pub.subscribers and time.monotonic() < deadline:
                pub.discard(pub.next_frame(1))  # (a late joiner starts at the next publish)
            assert pub.subscribers, "the subscriber did not join"
            digest, first = hashlib.sha256(), None
            for _ in range(count):
                payload = random_payload(rng)
                seq = put(pub, payload)
                first = seq if first is None else first
                digest.update(len(payload).to_bytes(4, "little") + payload)
            result = peer.wait_for(lambda m: m["event"] in ("done", "failed"), timeout=60)
            assert result["event"] == "done", result
            assert result["seqs"] == list(range(first, first + count))
            assert result["sha256"] == digest.hexdigest() and result["wrong"] == 0
            assert pub.dropped == []
        finally:
            peer.stop()


def test_payloads_across_the_ring_entry_limit_come_in_order(path):
    """Payloads of every size from empty to MAX_PAYLOAD, around the entry's inline limit, in one
    subscriber's queue at once: those that fit come in the ring, the others by socket, each in its
    place (the SLOT messages of new pool slots between them)."""
    inline = _ring.INLINE_PAYLOAD
    sizes = [0, inline, inline + 1, 1, protocol.MAX_PAYLOAD, inline - 1, 3000, 7, inline + 1, 0]
    rng = random.Random(7)
    with ring_publisher(path) as pub, subscriber(path, qos="every", queue=len(sizes)) as sub:
        assert sub._conn.ring is not None
        payloads = [rng.randbytes(size) for size in sizes]
        seqs = [put(pub, payload) for payload in payloads]
        got = [sub.receive(5) for _ in sizes]
        assert [m.seq for m in got] == seqs
        assert [m.payload for m in got] == payloads
        assert all(m.frame.data == pattern(m.payload) for m in got)
        for message in got:
            message.release()
        with pytest.raises(ValueError):
            put(pub, b"x" * (protocol.MAX_PAYLOAD + 1))


def test_a_subscriber_killed_mid_ring_gives_its_slots_back(path):
    """A subscriber process SIGKILLed while it holds frames and more are announced in its ring: the
    publisher drops it (its connection ended), goes on, and its pool slots come back."""
    with ring_publisher(path, pool=2, max_pool=4, every_timeout=5.0) as pub:
        peer = JsonPeer([PEER, path, "1000000", "3"], env=ENV)
        try:
            assert peer.wait_for(lambda m: m["event"] == "ready")["ring"] is True
            deadline = time.monotonic() + 10
            while not pub.subscribers and time.monotonic() < deadline:
                pub.discard(pub.next_frame(1))
            for k in range(50):
                put(pub, b"%d" % k)
            os.kill(peer.process.pid, signal.SIGKILL)
            peer.process.wait(10)
            for k in range(40):  # ten times the pool: only possible with its slots back
                put(pub, b"after %d" % k, timeout=5.0)
            assert pub.subscribers == []
            assert [d.code for d in pub.dropped] == ["TRANSPORT"]
            assert "without a goodbye" in pub.dropped[0].reason
            assert pub.pool_size <= 4
        finally:
            peer.stop()


class Hostile:
    """A subscriber written by hand: the handshake, then its ring mapped from READY's descriptor,
    to write what it likes there."""

    def __init__(self, path: str) -> None:
        self.sock = raw(path)
        self.sock.sendall(hello(wishes=("null",)))
        assert isinstance(answer(self.sock), protocol.Welcome)
        self.sock.sendall(protocol.encode(protocol.Attach(b"null-attach")))
        data, fds, _, _ = socket.recv_fds(self.sock, 70000, 2)
        assert isinstance(protocol.decode(data, len(fds)), protocol.Ready) and len(fds) == 1
        self.fd = fds[0]
        self.memory = mmap.mmap(self.fd, 0)
        self.read = 0

    def frames(self) -> list[int]:
        """The seq of each frame entry announced since the last call."""
        (written,) = struct.unpack_from("<Q", self.memory, AT_FRAMES)
        seqs = []
        for k in range(self.read, written):
            at = FRAME_ENTRIES + (k % 256) * ENTRY
            if self.memory[at] == 1:
                seqs.append(struct.unpack_from("<Q", self.memory, at + 8)[0])
        self.read = written
        return seqs

    def release(self, index: int, seq: int, flags: int = protocol.RELEASE_TAKEN, count: int | None = None) -> None:
        struct.pack_into("<QQ", self.memory, AT_RELEASE_ENTRIES + (index % 256) * 16, seq, flags)
        struct.pack_into("<Q", self.memory, AT_RELEASES, index + 1 if count is None else count)

    def drop_reason(self) -> str:
        """The reason of the DROP the publisher sent (past its other messages)."""
        self.sock.settimeout(5)
        while True:
            data = self.sock.recv(70000)
            assert data, "the connection ended without a DROP"
            if data[0] == protocol.Kind.WAKE:
                continue
            message = protocol.decode(data)
            if isinstance(message, protocol.Drop):
                assert message.code == Reason.PROTOCOL
                return message.reason

    def close(self) -> None:
        self.memory.close()
        os.close(self.fd)
        self.sock.close()


@pytest.mark.parametrize("garbage", ["count-ahead", "count-back", "unheld-frame", "twice", "bad-flags"])
def test_a_subscriber_writing_garbage_in_its_ring_is_dropped(path, garbage):
    """A hostile subscriber's release counts and entries: the publisher drops it with a reason,
    frees no slot it did not hand that subscriber (a well-behaved subscriber's held frame keeps
    its bytes while the pool is reused), and cannot be made to fault (the memfd is sealed)."""
    with ring_publisher(path, pool=2, max_pool=3, every_timeout=2.0) as pub, subscriber(path, qos="every", queue=2) as good:
        bad = Hostile(path)
        try:
            with pytest.raises(PermissionError):
                os.ftruncate(bad.fd, 4096)  # (sealed: a shrunk ring would fault the publisher's reads)
            put(pub, b"first")
            put(pub, b"second")
            held = good.receive(5)  # the good one holds "first"
            good.receive(5).release()
            seqs = bad.frames()
            assert seqs == [held.seq, held.seq + 1]
            if garbage == "count-ahead":
                bad.release(0, seqs[0], count=1000)
                expected = "count or entry"
            elif garbage == "count-back":
                bad.release(0, seqs[0])
                put(pub, b"third")  # (the publisher reads that release)
                good.receive(5).release()
                bad.release(0, seqs[0], count=0)
                expected = "count or entry"
            elif garbage == "unheld-frame":
                bad.release(0, seqs[0] + 100)
                expected = "does not hold"
            elif garbage == "twice":
                bad.release(0, seqs[0])
                bad.release(1, seqs[0])
                expected = "does not hold"
            else:
                bad.release(0, seqs[0], flags=0x80)
                expected = "count or entry"
            for k in range(6):  # twice the pool: the good one's held slot must stay unwritten
                put(pub, b"more %d" % k)
                good.receive(5).release()
            assert expected in bad.drop_reason()
            assert [d.code for d in pub.dropped] == ["PROTOCOL"]
            assert held.frame.data == pattern(b"first") and held.payload == b"first"
            held.release()
        finally:
            bad.close()


def test_a_subscriber_flooding_wake_bytes_is_dropped_and_costs_the_other_nothing(path):
    """A hostile subscriber sends one-byte WAKEs without end (a WAKE is due only after the
    publisher said it sleeps): it is dropped with that reason; a well-behaved subscriber beside
    it gets every frame, byte for byte."""
    with ring_publisher(path, pool=2, max_pool=4, every_timeout=2.0) as pub, subscriber(path, qos="every", queue=2) as good:
        bad = Hostile(path)
        try:
            wake = bytes([protocol.Kind.WAKE])
            bad.sock.setblocking(False)
            sent = 0
            try:
                while sent < 5000:
                    bad.sock.send(wake)
                    sent += 1
            except (BlockingIOError, ConnectionError):
                pass
            for k in range(20):
                put(pub, b"frame %d" % k)
                with good.receive(5) as message:
                    assert message.payload == b"frame %d" % k and message.frame.data == pattern(b"frame %d" % k)
            bad.sock.setblocking(True)
            assert "flooded WAKE" in bad.drop_reason()
            assert [d.code for d in pub.dropped] == ["PROTOCOL"]
        finally:
            bad.close()


def test_a_subscriber_pacing_wake_bytes_under_a_run_is_dropped_and_costs_the_other_nothing(path):
    """The same hostile subscriber releases each frame it gets but keeps sending WAKEs in short
    bursts (fewer in a row than a read drops for) while the publisher waits for a slow subscriber,
    each WAKE costing the publisher a wake-up: a WAKE follows a release written into the ring, so it
    is dropped once its WAKEs run past what its releases explain; the slow subscriber beside it gets
    every frame, byte for byte."""
    count = 60
    with ring_publisher(path, pool=2, max_pool=4, every_timeout=2.0) as pub, subscriber(path, qos="every", queue=1) as good:
        bad = Hostile(path)
        got, stop = [], threading.Event()

        def slow_reader():
            for _ in range(count):
                with good.receive(5) as message:
                    got.append((message.payload, message.frame.data == pattern(message.payload)))
                    time.sleep(0.005)

        def flood():
            burst, released = bytes([protocol.Kind.WAKE]), 0
            while not stop.is_set():
                for seq in bad.frames():
                    bad.release(released, seq)
                    released += 1
                try:
                    for _ in range(8):
                        bad.sock.send(burst, socket.MSG_DONTWAIT)
                except (BlockingIOError, ConnectionError):
                    pass
                time.sleep(0.001)

        threads = [threading.Thread(target=slow_reader), threading.Thread(target=flood)]
        try:
            for thread in threads:
                thread.start()
            for k in range(count):
                put(pub, b"frame %d" % k)
            threads[0].join(10)
            stop.set()
            threads[1].join(10)
            assert got == [(b"frame %d" % k, True) for k in range(count)]
            assert "more than the releases it wrote" in bad.drop_reason()
            assert [d.code for d in pub.dropped] == ["PROTOCOL"]
        finally:
            stop.set()
            bad.close()


def test_a_publisher_sending_messages_without_their_ring_entries_is_lost_not_kept(path):
    """A lying (or broken) publisher sends socket messages whose SOCKET entry never comes in the
    ring: the subscriber keeps no more of them than the ring has entries, then ends with
    PeerError instead of holding each one (memory without bound)."""
    with ring_publisher(path) as pub, subscriber(path, qos="latest", timeout=5) as sub:
        put(pub, b"first")
        with sub.receive(5) as message:
            assert message.payload == b"first"
        sock = pub._delivery.subs[0].sock
        notice = protocol.encode(protocol.Notice(1))
        sent = 0
        with pytest.raises(eglcuda.PeerError, match="malformed"):
            while sent < 5000:
                try:
                    for _ in range(64):
                        sock.send(notice, socket.MSG_DONTWAIT)
                        sent += 1
                except BlockingIOError:
                    pass
                try:
                    sub.receive(0).release()
                except eglcuda.Timeout:
                    pass
        assert 256 < sent < 1000


def test_a_publisher_announcing_past_the_credit_of_a_full_subscriber_is_lost(path):
    """A lying publisher announces frame after frame to a subscriber that holds all it may (its
    credit): those waiting are kept up to a bound, then the subscriber ends with PeerError."""
    with ring_publisher(path, every_timeout=2.0) as pub, subscriber(path, qos="every", queue=1, timeout=5) as sub:
        put(pub, b"first")
        held = sub.receive(5)
        member = pub._delivery.subs[0]
        seq = 1000
        with pytest.raises(eglcuda.PeerError, match="beyond this subscriber's credit"):
            for _ in range(4):
                for _ in range(200):
                    seq += 1
                    assert member.ring.frame(member.fd, seq, 0, 0, b"") == 0
                with pytest.raises(eglcuda.UsageError):  # (it holds its one: what waits is read and kept)
                    sub.receive(0)
        held.release()


def test_an_old_subscriber_is_refused_with_the_reason(path):
    with ring_publisher(path):
        sock = raw(path)
        sock.sendall(protocol.encode(protocol.Hello(os.getpid(), protocol.Qos.EVERY, 2, protocol.ConsumerKind.CUDA,
                                                    0, bytes(16), False, ("null",), "t", version=1)))
        refusal = answer(sock)
        sock.close()
    assert isinstance(refusal, protocol.Refuse) and refusal.code == Reason.VERSION
    assert f"protocol version 1, this side speaks {protocol.VERSION}" in refusal.reason


def ring_mappings() -> int:
    with open("/proc/self/maps") as maps:
        return sum("eglcuda-topic-ring" in line for line in maps)


def test_the_ring_leaves_no_descriptor_or_mapping(path):
    """The memfd is closed on both sides once mapped; the mappings go with close() (publisher:
    when the subscriber leaves; subscriber: at its close) and with a subscriber collected unclosed."""
    gc.collect()
    fds, maps = open_fds(), ring_mappings()
    with ring_publisher(path) as pub:
        for _ in range(3):
            sub = subscriber(path, qos="every")
            assert ring_fds_soon() == []  # (the publisher's service thread closes its copy after READY)
            assert ring_mappings() == maps + 2  # the publisher's end and the subscriber's
            put(pub, b"x")
            sub.receive(5).release()
            sub.close()
            put(pub, b"y")  # (the publisher reads the goodbye)
            assert ring_mappings() == maps
        sub = subscriber(path, qos="every")
        put(pub, b"z")
        del sub
        gc.collect()
        put(pub, b"w")
    gc.collect()
    assert ring_mappings() == maps
    assert open_fds() == fds
    assert ring_fds_soon() == []


def ring_fds_soon() -> list[str]:
    """The descriptors of this process open on a ring's memfd, after up to a second."""
    deadline = time.monotonic() + 1
    while True:
        found = [f for f in os.listdir("/proc/self/fd") if "eglcuda-topic-ring" in _link(f)]
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.01)


def _link(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return ""


def test_a_forked_child_leaves_the_parents_rings_alone(path):
    """A child of a process with a publisher and a ring subscriber releases a frame and closes
    both: it writes no release or goodbye into the shared rings (the publisher sees no release it
    did not get from the parent), its own mappings go, the parent's stay, and the subscriber goes
    on getting every frame through its ring."""
    gc.collect()
    maps = ring_mappings()
    with ring_publisher(path) as pub, subscriber(path, qos="every", queue=4) as sub:
        put(pub, b"a")
        message = sub.receive(5)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            try:
                message.release()
                sub.close()
                pub.close()
            finally:
                os._exit(0 if ring_mappings() == maps else 1)  # both closes let go of the child's mappings
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        put(pub, b"b")
        assert pub.dropped == [] and len(pub.subscribers) == 1
        assert pub.subscribers[0].outstanding == 2  # the child's release did not reach the publisher
        message.release()
        assert sub.receive(5).payload == b"b"
        for k in range(20):
            put(pub, b"after %d" % k)
            with sub.receive(5) as got:
                assert got.payload == b"after %d" % k and got.frame.data == pattern(got.payload)
        assert pub.dropped == [] and len(pub.subscribers) == 1


def test_a_wake_left_from_an_earlier_read_does_not_hide_a_message():
    """A WAKE that came in one batch with a message stays in the reader's batch; handing it out
    later must not stand for "the socket is empty" (a SOCKET entry's message then seemed missing:
    the lost-wake-up stress above found it)."""
    from eglcuda.topics import _wire

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        inbox = _wire.Inbox(ours.fileno())
        notice = protocol.encode(protocol.Notice(5))
        theirs.send(notice)
        theirs.send(bytes([protocol.Kind.WAKE]))
        assert inbox.next(None) == notice  # (the WAKE stays in the batch)
        later = protocol.encode(protocol.Notice(6))
        theirs.send(later)
        assert inbox.next(None) == later
        theirs.send(bytes([protocol.Kind.WAKE]))
        assert inbox.next(None) is None and inbox.rest() is None  # a WAKE alone: nothing to hand out
        inbox.close()
    finally:
        ours.close()
        theirs.close()
