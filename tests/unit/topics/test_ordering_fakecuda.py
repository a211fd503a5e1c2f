"""The ordering contract (docs/ordering.md) on the stand-in libcuda, whose fake_cuda_hold keeps a
stream "busy" so the order between streams can be seen without a GPU: a frame handed to a stream
(DLPack's ``stream=``, or ``__cuda_array_interface__``'s likely readers) makes the publish or the
release that follows wait for that stream, and the release then carries a done event for the
publisher. The GPU tier shows the same with real kernels and wrong bytes
(tests/gpu/test_ordering.py)."""
from __future__ import annotations

import pathlib

import pytest

from ...json_peer import JsonPeer
from .test_fakecuda import PUBLISH, Peer as TopicsPeer, env, path  # noqa: F401  (fixtures)

ROOT = pathlib.Path(__file__).resolve().parents[3]
PEER = pathlib.Path(__file__).with_name("ordering_fake_peer.py")


class Peer(JsonPeer):
    def __init__(self, env, role: str, path: str, *args: str) -> None:  # noqa: F811
        super().__init__([str(PEER), role, "--path", path, *args], env=env, cwd=str(ROOT))


def test_a_publish_waits_for_the_stream_a_writer_took_the_frame_on(env, path):  # noqa: F811
    """The publisher hands each pool frame to a held stream through DLPack and publishes it with
    no stream named: the publish stream (the legacy default stream) must be left waiting for it."""
    publisher = Peer(env, "publish", path, "--frames", "5", "--hand", "dlpack")
    subscriber = None
    try:
        publisher.wait_for(lambda m: m["event"] == "ready")
        subscriber = TopicsPeer(env, "subscribe", path, "--transport", "cuda-ipc", "--seed", "3", "--count", "5")
        subscriber.wait_for(lambda m: m["event"] == "ready")
        publisher.send("go")
        subscriber.wait_for(lambda m: m["event"] == "done")
        # The subscriber may be done before the publisher has said its last "published".
        publisher.wait_for(lambda m: m.get("event") == "published" and m["seq"] == 4)
        published = [m for m in publisher.messages if m.get("event") == "published"]
        assert len(published) == 5 and all(m["legacy_waits"] for m in published), published
        assert all(m["ok"] for m in subscriber.got()), subscriber.got()
    finally:
        for peer in (publisher, subscriber):
            if peer is not None:
                peer.stop()


@pytest.mark.parametrize("hand", ["dlpack", "cai", "none"])
def test_a_release_waits_for_the_streams_a_message_was_handed_to(env, path, hand):  # noqa: F811
    """The subscriber hands each message to a held stream (DLPack), or through
    ``__cuda_array_interface__`` with the legacy default stream held, and the documented loop
    releases it: its own stream (where the done event goes) must be left waiting. Handed nothing,
    its stream stays idle (the fast path: no event)."""
    publisher = TopicsPeer(env, "publish", path, *PUBLISH, "--frames", "0", "--rate", "300", "--seed", "3")
    subscriber = None
    try:
        publisher.wait_for(lambda m: m["event"] == "ready")
        subscriber = Peer(env, "subscribe", path, "--count", "5", "--hand", hand)
        subscriber.wait_for(lambda m: m["event"] == "done", timeout=30)
        got = subscriber.got()
        assert len(got) == 5 and all(m["ok"] for m in got), got
        assert all(m["own_waits"] == (hand != "none") for m in got), got
    finally:
        for peer in (publisher, subscriber):
            if peer is not None:
                peer.stop()


def test_a_close_waits_for_a_message_released_on_a_stream_of_the_users(env, path):  # noqa: F811
    """A message read on a busy stream of the user's and released there (``release(cuda_stream=)``)
    is read behind the slot's done event, not the subscriber's own stream: a close() right after
    must wait for that stream before it unmaps the slot (here until the stream is let go, 0.5 s
    later, well within the close's bound)."""
    publisher = TopicsPeer(env, "publish", path, *PUBLISH, "--frames", "0", "--rate", "300", "--seed", "3")
    subscriber = None
    try:
        publisher.wait_for(lambda m: m["event"] == "ready")
        subscriber = Peer(env, "subscribe", path, "--hand", "close-behind", "--hold-ms", "500")
        done = subscriber.wait_for(lambda m: m["event"] == "done", timeout=30)
        assert done["ok"], done
        assert done["done_waits"], "the release recorded nothing behind the held stream: the test proves nothing"
        assert 0.4 < done["close_s"] < 5, done
        assert not done["held_after_close"], done
    finally:
        for peer in (publisher, subscriber):
            if peer is not None:
                peer.stop()
