"""The publisher's books and per-frame steps, compiled (eglcuda/topics/_delivery.pyx): the
typed Slot and Member classes, hand_out (the FRAME message to every message-only subscriber that
may take it now) and settle (plain releases), on real sockets."""
from __future__ import annotations

import collections
import random
import socket
import types

import pytest

from eglcuda.topics import _delivery, protocol
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
        rest = _delivery.settle(batch, free)
        assert rest == [batch[2], batch[3], batch[5], batch[6], batch[7], batch[8]]
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
