"""The engine's sweep of UCX's unexpected queue (``Engine._sweep``), against a stand-in worker
whose queue the test arranges: which messages are dropped unread, and which wait for their
connection's receive. No UCX: the sweep's decisions only."""
from __future__ import annotations

import types

import pytest

from eglcuda.remote import _ucx

PREFIX, KIND = 0x1234, 7
OURS = PREFIX << 8 | KIND  # a tag one of our connections receives on (a control message's)


class Queue:
    """UCX's unexpected queue as the sweep sees it: probes match the first message (mask 0) or
    the first of one tag (full mask), and a probe with ``remove`` takes it out."""

    def __init__(self, tags: list[int]) -> None:
        self.tags = list(tags)

    def tag_probe(self, tag, mask, remove):
        if mask == "everything":
            found = self.tags[0] if self.tags else None
        else:
            found = next((t for t in self.tags if t == tag), None)
        if found is not None and remove:
            self.tags.remove(found)
        return types.SimpleNamespace(matched=found is not None, sender_tag=types.SimpleNamespace(value=found))

    def tag_recv_with_handle(self, scratch, taken):
        return object()


def engine(queue: Queue) -> _ucx.Engine:
    api = types.SimpleNamespace(UCXXTag=lambda value: value, UCXXTagMask=lambda value: "everything",
                                UCXXTagMaskFull="full")
    loop = types.SimpleNamespace(call_soon=lambda *args: None)
    made = object.__new__(_ucx.Engine)
    made.__dict__.update(api=api, worker=queue, loop=loop, _prefixes={PREFIX: (KIND,)}, _unclaimed=None,
                         _scratch=None, swept=0, post=lambda request, done: None)
    return made


def test_a_flood_that_never_lets_the_queue_empty_does_not_get_a_later_control_message_dropped(monkeypatch):
    """A control message waits first in the queue (its receive is being posted) and is taken by
    its reader; a key-less flood on other tags keeps the queue from emptying; two seconds later
    the connection's next control message comes first again, behind flood messages swept before
    it. It starts its own wait: it is not dropped for the first one's (which broke the session:
    the control channel's nonce moves only with messages that open)."""
    now = [100.0]
    monkeypatch.setattr(_ucx.time, "monotonic", lambda: now[0])
    queue = Queue([OURS, 1, 2])
    sweeper = engine(queue)
    sweeper._sweep()
    assert queue.tags == [OURS, 1, 2]  # (it waits for its receive)
    queue.tags.remove(OURS)  # (its reader took it)
    queue.tags += [3, OURS, 4]
    now[0] += 2.0
    sweeper._sweep()
    assert queue.tags == [OURS, 4] and sweeper.swept == 3


def test_a_message_of_ours_nobody_receives_is_dropped_after_its_wait(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(_ucx.time, "monotonic", lambda: now[0])
    queue = Queue([OURS, 1])
    sweeper = engine(queue)
    sweeper._sweep()
    now[0] += 0.5
    sweeper._sweep()
    assert queue.tags == [OURS, 1]
    now[0] += _ucx.UNCLAIMED_S
    sweeper._sweep()
    assert queue.tags == [] and sweeper.swept == 2


@pytest.mark.parametrize("kind", [KIND + 1, 0])
def test_a_message_on_our_prefix_of_a_kind_nobody_receives_goes_at_once(kind):
    queue = Queue([PREFIX << 8 | kind, 5])
    sweeper = engine(queue)
    sweeper._sweep()
    assert queue.tags == []
