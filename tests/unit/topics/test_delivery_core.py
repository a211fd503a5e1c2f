"""The publisher's books and per-frame steps, compiled (eglcuda/topics/_delivery.pyx): the
typed Slot and Member classes, hand_out (the FRAME message to every message-only subscriber that
may take it now), settle (plain releases), and the per-frame questions and skips (full_every,
take_free, worth_a_read, skip_full), on real sockets."""
from __future__ import annotations

import collections
import os
import random
import socket
import types

import pytest

from eglcuda.topics import _delivery, _ring, protocol
from eglcuda.topics._delivery import FREE, PUBLISHED, Member, Slot

Qos = protocol.Qos


class _Link:
    def __init__(self, transport, message_only=True, plain_release=True):
        self.transport, self.message_only, self.plain_release = transport, message_only, plain_release


class _Transport:
    name = "fast"

    def __init__(self, fail=False):
        self.fail, self.records = fail, []

    def on_publish(self, slot, stream):
        if self.fail:
            raise RuntimeError("the record failed")
        self.records.append((slot.index, stream))


def _sub(transport, qos=Qos.EVERY, credit=4, seen=(0,), **link):
    """A Member on one end of a socket pair (the other end: ``.peer_end``)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    hello = types.SimpleNamespace(qos=qos, queue=4)
    peer = types.SimpleNamespace(pid=1, uid=0)
    sub = Member(1, ours, peer, hello, _Link(transport, **link), transport.name, 4096, 8)
    sub.credit = credit
    sub.seen_slots.update(seen)
    _ends[sub] = theirs
    return sub


_ends: dict = {}


def _close(sub):
    sub.sock.close()
    _ends.pop(sub).close()


def _published(index):
    slot = Slot(index, None)
    slot.state = PUBLISHED
    return slot


def test_hand_out_serves_the_common_case_and_returns_the_rest_in_order():
    fast, other = _Transport(), _Transport()
    ready = _sub(fast)
    full_latest = _sub(fast, qos=Qos.LATEST, credit=2)
    full_latest.outstanding.update({1: None, 2: None})
    new_slot = _sub(fast, seen=())
    elsewhere = _sub(other)
    numbered = _sub(fast, message_only=False)
    gone = _sub(fast)
    _ends[gone].close()  # its connection is broken: the send fails
    dead = _sub(fast)
    dead.alive = False
    subs = [ready, full_latest, new_slot, elsewhere, numbered, gone, dead]
    slot = _published(0)
    data = bytes(random.randrange(256) for _ in range(40))
    recorded: set = set()
    try:
        others = _delivery.hand_out(subs, slot, 7, data, 1234, recorded)
        # elsewhere's transport records too: each message-only transport once, before its first send
        assert recorded == {fast, other} and fast.records == [(0, 1234)] and other.records == [(0, 1234)]
        assert others == [full_latest, new_slot, numbered, gone]
        assert _ends[ready].recv(100) == data and _ends[elsewhere].recv(100) == data
        assert (ready.outstanding, ready.delivered, ready.noticed) == ({7: slot}, 1, False)
        assert slot.holders == {ready, elsewhere}
        for sub in others:
            assert sub.delivered == 0 and 7 not in sub.outstanding
    finally:
        for sub in subs:
            if sub is not gone:
                _close(sub)
        gone.sock.close()
        _ends.pop(gone, None)


def test_a_latest_subscriber_at_its_credit_is_skipped_in_the_core_until_it_released_something():
    """A 'latest' subscriber with a ring, at its credit and told of a skip already, skips frames in
    hand_out itself (no Python path, no read of its socket) while it released nothing: a release
    into its ring, one sent by socket (its ring counts it), a read due, or a NOTICE owed sends it
    back to the publisher's path; without ``now``, hand_out leaves it there as before."""
    fast = _Transport()
    sub = _sub(fast, qos=Qos.LATEST, credit=2)
    ring, fd = _ring.create()
    theirs = _ring.attach(fd)
    os.close(fd)
    sub.ring = ring
    held = [_published(1), _published(2)]
    sub.outstanding.update({5: held[0], 6: held[1]})
    sub.noticed = True
    slot = _published(0)
    now, interval = 100.0, 0.001

    def hand_out(read_at=now - 0.0002, at=now):
        return _delivery.hand_out([sub], slot, 7, b"frame", None, set(), 0, b"", at, read_at, interval)

    try:
        for seq in range(3):
            assert hand_out() == [] and hand_out(at=-1.0) == [sub]
        assert sub.skipped == 3 and sub.delivered == 0 and fast.records == []
        assert not _delivery.worth_a_read([sub], now, now - 0.0002, interval)
        assert hand_out(read_at=now - 0.002) == [sub]  # a read is due
        sub.noticed = False
        assert hand_out() == [sub]  # a NOTICE is owed
        sub.noticed = True
        assert theirs.release(_ends[sub].fileno(), 5, 0)  # into the ring
        assert hand_out() == [sub] and _delivery.worth_a_read([sub], now, now - 0.0002, interval)
        assert _delivery.collect([sub], collections.deque()) == [] and 5 not in sub.outstanding
        sub.outstanding[5] = held[0]
        assert hand_out() == []
        theirs.sent_on_socket()  # a release with a done event went by socket
        assert hand_out() == [sub] and _delivery.worth_a_read([sub], now, now - 0.0002, interval)
        _delivery.note_sockets([sub])  # the publisher read the socket
        assert hand_out() == [] and not _delivery.worth_a_read([sub], now, now - 0.0002, interval)
        assert sub.skipped == 5
    finally:
        ring.close()
        theirs.close()
        _close(sub)


def test_hand_out_leaves_everyone_to_the_publisher_when_the_record_fails():
    fast = _Transport(fail=True)
    subs = [_sub(fast), _sub(fast)]
    recorded: set = set()
    try:
        others = _delivery.hand_out(subs, _published(0), 1, b"frame", None, recorded)
        assert others == subs and not recorded
        for sub in subs:
            with pytest.raises(BlockingIOError):
                _ends[sub].recv(100, socket.MSG_DONTWAIT)  # nothing was sent
    finally:
        for sub in subs:
            _close(sub)


def test_settle_frees_slots_on_plain_releases_and_keeps_each_subscribers_order():
    fast = _Transport()
    a, b, eglstream = _sub(fast), _sub(fast), _sub(fast, plain_release=False)
    slots = [_published(i) for i in range(4)]
    for seq, slot in enumerate(slots):
        for sub in (a, b):
            sub.outstanding[seq] = slot
            slot.holders.add(sub)
    eglstream.outstanding[0] = slots[0]
    slots[0].holders.add(eglstream)
    free: collections.deque = collections.deque()
    bye = protocol.encode(protocol.Bye(0, "leaving"))
    batch = [(a, protocol.Release(0, protocol.RELEASE_TAKEN)), (b, protocol.Release(0)),
             (a, protocol.Release(1, protocol.RELEASE_TAKEN | protocol.RELEASE_RECORDED)),  # a done event
             (a, protocol.Release(2, protocol.RELEASE_TAKEN)),  # after a's held-back one: held back too
             (b, protocol.Release(1, protocol.RELEASE_TAKEN)), (b, protocol.Release(9, protocol.RELEASE_TAKEN)),
             (b, protocol.Release(2, protocol.RELEASE_TAKEN)), (eglstream, protocol.Release(0, protocol.RELEASE_TAKEN)),
             (a, bye)]
    try:
        assert not a.leaving
        rest = _delivery.settle(batch, free)
        assert rest == [batch[2], batch[3], batch[5], batch[6], batch[7], batch[8]]
        assert a.leaving and not b.leaving  # a's goodbye is in the batch: its failures are its leaving
        assert slots[0].holders == {eglstream} and slots[0].state == PUBLISHED  # still held by one
        assert slots[1].holders == {a} and set(a.outstanding) == {1, 2, 3} and set(b.outstanding) == {2, 3}
        assert not free
        rest = _delivery.settle([(eglstream, protocol.Release(0, protocol.RELEASE_TAKEN))], free)
        assert len(rest) == 1  # its link does not free on a release: the publisher's own path
        _delivery.released(eglstream, eglstream.outstanding.pop(0), False, 0.0, free)
        assert list(free) == [slots[0]] and slots[0].state == FREE
    finally:
        for sub in (a, b, eglstream):
            _close(sub)


def test_a_release_with_a_done_event_keeps_the_slot_waiting_and_forget_lets_go():
    fast = _Transport()
    sub = _sub(fast)
    slot = _published(0)
    sub.outstanding[5] = slot
    slot.holders.add(sub)
    free: collections.deque = collections.deque()
    try:
        _delivery.released(sub, sub.outstanding.pop(5), True, 12.5, free)
        assert slot.waiters == {sub: 12.5} and list(free) == [slot] and slot.state == FREE
        held = _published(1)
        _delivery.delivered(sub, held, 6)
        _delivery.forget(sub, [slot, held], free)
        assert not slot.waiters and not held.holders and not sub.outstanding and list(free) == [slot, held]
    finally:
        _close(sub)


def test_the_per_frame_questions_pick_the_subscribers_the_python_path_did():
    """full_every, worth_a_read and skip_full against the rules written out here, on random
    subscribers (qos, credit, frames held and how old, alive or not)."""
    rng = random.Random(43)
    fast = _Transport()
    for _ in range(40):
        subs = []
        for index in range(rng.randint(0, 6)):
            sub = _sub(fast, qos=rng.choice([Qos.EVERY, Qos.LATEST]), credit=rng.randint(1, 3))
            for seq in range(rng.randint(0, 3)):
                slot = _published(seq)
                slot.published_at = 100.0 - rng.choice([0.0002, 0.0005, 0.002, 0.5])
                sub.outstanding[seq] = slot
            sub.alive = rng.random() > 0.15
            sub.noticed = rng.random() > 0.5
            subs.append(sub)
        try:
            now, read_at = 100.0, 100.0 - rng.choice([0.0001, 0.0005, 0.002])

            def full(sub):
                return len(sub.outstanding) >= sub.credit

            assert _delivery.full_every(subs) == [s for s in subs if s.alive and s.qos is Qos.EVERY and full(s)]
            at_credit = [s for s in subs if s.alive and s.qos is Qos.LATEST and full(s)]
            expected = bool(at_credit) and (now - read_at >= 0.001 or any(
                now - next(iter(s.outstanding.values())).published_at < 0.001 for s in at_credit))
            assert _delivery.worth_a_read(subs, now, read_at, 0.001) is expected
            skipped_before = {s: s.skipped for s in subs}
            noticed = {s: s.noticed for s in subs}
            rest, notify = _delivery.skip_full(subs)
            assert rest == [s for s in subs if s.alive and s not in at_credit]
            assert notify == [s for s in at_credit if not noticed[s]]
            assert all(s.skipped == skipped_before[s] + (s in at_credit) for s in subs)
        finally:
            for sub in subs:
                _close(sub)


def test_take_free_hands_out_the_oldest_slot_nobody_reads_and_asks_only_when_none_is_left():
    """A free slot released with a done event is asked about (a driver question) only when no
    free slot without one is left; the oldest settled one then; the others stay free, in order."""
    sub = _sub(_Transport())
    stale, held, reading, ready, later, done = (Slot(i, None) for i in range(6))
    stale.state = PUBLISHED  # an entry left from before it was published again
    held.holders.add(sub)  # (free, yet held again: it becomes published, free once released)
    reading.waiters[sub] = 1.0  # released with a done event its GPU work has not reached
    done.waiters[sub] = 1.5  # released with a done event its GPU work has passed
    free = collections.deque([stale, held, reading, ready, later])
    asked = []

    def settled(slot):
        asked.append(slot.index)
        return slot is not reading

    try:
        assert _delivery.take_free(free, settled) is ready
        assert asked == [] and list(free) == [reading, later] and held.state == PUBLISHED
        assert _delivery.take_free(free, settled) is later
        assert asked == [] and list(free) == [reading]
        assert _delivery.take_free(free, settled) is None
        assert asked == [2] and list(free) == [reading]  # (still read: it stays)
        free.append(done)
        assert _delivery.take_free(free, settled) is done
        assert asked == [2, 2, 5] and list(free) == [reading]
        reading.waiters.clear()
        assert _delivery.take_free(free, settled) is reading and list(free) == []

        def fails(slot):
            raise RuntimeError("the question failed")

        later.waiters[sub] = 2.0
        free.extend([later, reading])
        reading.waiters[sub] = 2.5
        with pytest.raises(RuntimeError):
            _delivery.take_free(free, fails)
        assert list(free) == [later, reading]  # (put back in order, also when the question raises)
        assert _delivery.take_free(collections.deque(), settled) is None
    finally:
        _close(sub)
