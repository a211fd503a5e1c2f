"""A relay's sender for one 'latest' remote subscriber, driven without a network: its frames
staged ahead of its credit go out as the credit comes, never more than credited, never stale,
a stopped remote holds no buffer for a frame staged ahead, and a deep window (small frames)
never lets it hold more of the staging ring than its quota."""
from __future__ import annotations

import random

import pytest

from eglcuda.remote import sender as sender_module
from eglcuda.remote.sender import AHEAD_FRESH_S, QUOTA, Limits, Sender
from eglcuda.remote.wire import MAX_WINDOW
from eglcuda.topics.protocol import Qos

WINDOW = 3


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now


class Link:
    """Where the sender posts its sends (what UCX would carry), in order."""

    def __init__(self) -> None:
        self.sends: list[tuple[int, object]] = []  # (staging buffer, its completion)

    def send_now(self, array: int, kind: int, done) -> None:
        self.sends.append((array, done))

    def abort(self) -> None:
        pass


class Ring:
    """The staging ring as a sender sees it: buffers to send from, references given back."""

    def __init__(self) -> None:
        self.given_back: list[int] = []

    def for_ucx(self) -> list[int]:
        return list(range(1 << 16))

    def unref(self, index: int) -> None:
        self.given_back.append(index)

    def refused_since(self, since: float) -> bool:
        return False  # (a ring with a buffer for every frame: the others never go without)


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(sender_module, "time", clock)
    return clock


def make_sender(link: Link, ring: Ring, window: int = WINDOW) -> Sender:
    sender = Sender(link, "peer", Qos.LATEST, 1, window, None, ring, Limits("t", 5.0, 1.0), lambda: None,
                    lambda s: None)
    sender._started = True  # (its welcome went out)
    return sender


def test_a_frame_staged_ahead_goes_out_as_the_credit_comes(clock):
    link, ring = Link(), Ring()
    sender = make_sender(link, ring)
    for seq in range(WINDOW):
        assert sender.offer(seq, seq, False)
        sender.pump()
    assert [b for b, _ in link.sends] == [0, 1, 2]
    assert sender.room(False) == 1  # (no credit left: one frame may be staged ahead of it)
    assert sender.offer(3, 3, False)
    sender.pump()
    assert len(link.sends) == WINDOW and sender.room(False) == 0  # (not sent: no credit)
    for _, done in link.sends:
        done(None)  # (received: the remote's credit for the first is on its way)
    clock.now += AHEAD_FRESH_S / 2
    sender.credit(1)
    assert [b for b, _ in link.sends] == [0, 1, 2, 3]  # (at once, no new staging)


def test_a_stale_frame_staged_ahead_is_let_go_and_a_stopped_remote_holds_none(clock):
    link, ring = Link(), Ring()
    sender = make_sender(link, ring)
    for seq in range(WINDOW):
        sender.offer(seq, seq, False)
        sender.pump()
    for _, done in link.sends:
        done(None)
    sender.offer(10, 3, False)
    clock.now += AHEAD_FRESH_S * 2  # (the remote was stopped: no credit came)
    sender.check(clock.now)
    assert 10 in ring.given_back and sender.held == 0
    assert sender.room(False) == 0  # (nothing staged ahead again until a credit came)
    sender.credit(1)  # (it woke up)
    assert len(link.sends) == WINDOW  # (the stale frame is not sent: a fresh one is staged for the credit)
    assert sender.room(False) == 2
    sender.offer(11, 9, False)
    sender.pump()
    assert link.sends[-1][0] == 11
    assert sender.info().skipped == 6  # (seq 3 let go, 4..8 never staged)


@pytest.mark.parametrize("window", [WINDOW, MAX_WINDOW])
@pytest.mark.parametrize("seed", range(8))
def test_random_credits_sends_and_delays_keep_the_window_and_freshness(clock, seed, window):
    rng = random.Random(seed)
    link, ring = Link(), Ring()
    sender = make_sender(link, ring, window)
    staged_at: dict[int, float] = {}
    completed = 0
    credited = window
    at_remote = 0  # frames sent whose credit the remote has not returned
    seq = 0
    checked = 0
    for _ in range(2000):
        step = rng.random()
        if step < 0.4:
            room = sender.room(False)
            if room > 0:
                seq += rng.randint(1, 3)
                staged_at[seq] = clock.now
                assert sender.offer(seq, seq, False)
                sender.pump()
            else:
                assert not sender.offer(seq + 1, seq + 1, False)
        elif step < (0.6 if window == WINDOW else 0.45) and completed < len(link.sends):
            link.sends[completed][1](None)
            completed += 1
            at_remote += 1
        elif step < 0.8 and at_remote:
            count = rng.randint(1, at_remote)
            at_remote -= count
            credited += count
            sender.credit(count)
        elif step < 0.9:
            clock.now += rng.choice((0.0005, 0.002, AHEAD_FRESH_S * 1.5))
        else:
            sender.check(clock.now)
        sent = [b for b, _ in link.sends]
        for frame in sent[checked:]:  # (sent just now: never a frame staged long ago)
            assert clock.now - staged_at[frame] <= AHEAD_FRESH_S
        checked = len(sent)
        assert len(sent) <= credited  # (never more than credited)
        assert sent == sorted(sent)  # (in the order staged)
        assert sender.held <= QUOTA
    sent = [b for b, _ in link.sends]
    assert len(set(sent)) == len(sent)
    let_go = [b for b in ring.given_back if b not in sent]
    assert not set(let_go) & set(sent)
    # Every frame staged was sent or given back (or is still queued), once.
    queued = {b for b, _ in sender._pending}
    assert set(staged_at) == set(sent) | set(let_go) | queued
    assert sender.info().sent == completed


def test_beats_at_the_protocols_pace_pass_a_burst_after_a_stall_passes_and_a_flood_is_refused(clock):
    """A remote beats once each BEAT_S: an hour of that passes, and so do beats held up by a stalled
    link that arrive together (no more than the time allowed); beats beyond it, a credit of no
    frame, are the peer's fault (WireError: it is dropped with that reason)."""
    from eglcuda.remote import wire
    from eglcuda.remote.sender import BEATS_AHEAD

    sender = make_sender(Link(), Ring())
    for _ in range(7200):  # (an hour)
        clock.now += wire.BEAT_S
        assert not sender.control(wire.Control.BEAT, 0)
    silence = 5.0  # (make_sender's Limits: a timeout of 5 s)
    clock.now += 2 * silence  # (a stalled link: its beats arrive at once, and a few ahead of them)
    for _ in range(int(2 * silence / wire.BEAT_S) + BEATS_AHEAD):
        sender.control(wire.Control.BEAT, 0)
    with pytest.raises(wire.WireError, match="a flood"):
        for _ in range(3 * BEATS_AHEAD):  # (beats faster than the pace, after an hour at it)
            sender.control(wire.Control.BEAT, 0)
    flooder = make_sender(Link(), Ring())
    with pytest.raises(wire.WireError, match="a flood"):
        for _ in range(int(2 * silence / wire.BEAT_S) + BEATS_AHEAD + 1):
            flooder.control(wire.Control.BEAT, 0)
    with pytest.raises(wire.WireError, match="no frame"):
        make_sender(Link(), Ring()).control(wire.Control.CREDIT, 0)
    assert make_sender(Link(), Ring()).control(wire.Control.BYE, 0)
