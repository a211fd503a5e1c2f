"""Topics on the CPU, failures and drops: killed publishers and subscribers, a publisher
restarted while a subscriber waits, subscribers that break the protocol, failed hand-overs, the
reasons of drops and that nothing hides them, waiting for a publisher."""
from __future__ import annotations

import os
import re
import socket
import threading
import time

import pytest

import eglcuda
from eglcuda.topics import protocol
from eglcuda.topics.protocol import Reason

from .helpers import NullPublisherBackend, Peer, open_fds, pattern, publisher, put, subscriber


def test_publisher_killed_then_restarted_while_the_subscriber_waits(path):
    first = Peer("publish", "--path", path, "--rate", "500")
    second = None
    try:
        first.wait_for(lambda m: m["event"] == "ready")
        sub = subscriber(path, qos="every", queue=4, timeout=10)
        old = sub.info.instance
        for _ in range(5):
            with sub.receive(5) as message:
                assert message.frame.data == pattern(message.payload)
        first.kill()
        started = time.monotonic()
        with pytest.raises(eglcuda.StreamDisconnected) as caught:
            while True:
                sub.receive(5).release()  # frames already sent may still come, intact
        assert not isinstance(caught.value, eglcuda.Dropped)  # a crash, not a drop
        assert time.monotonic() - started < 2
        second = Peer("publish", "--path", path, "--rate", "500")  # replaces the stale socket
        info = sub.wait_for_publisher(timeout=20)
        assert info.instance != old and info.publisher_pid == second.process.pid
        for _ in range(5):
            with sub.receive(5) as message:
                assert message.frame.data == pattern(message.payload)
                assert message.payload.startswith(b"%d:" % info.instance)
        sub.close()
    finally:
        first.stop()
        if second is not None:
            second.stop()


def test_subscriber_killed_costs_the_publisher_nothing(path):
    with publisher(path, every_timeout=2.0) as pub:
        peer = Peer("subscribe", "--path", path, "--qos", "every", "--queue", "2", "--hold", "2")
        try:
            peer.wait_for(lambda m: m["event"] == "ready")
            other = subscriber(path, qos="every", queue=16)
            put(pub, b"0")
            put(pub, b"1")
            peer.wait_for(lambda m: m.get("seq") == 1)
            assert all(m["ok"] for m in peer.got())
            peer.kill()  # holding both frames, its queue full
            started = time.monotonic()
            for i in range(2, 10):
                put(pub, b"%d" % i)
            assert time.monotonic() - started < 1.0  # never waited every_timeout on the dead one
            got = []
            for _ in range(10):
                with other.receive(1) as message:
                    assert message.frame.data == pattern(message.payload)
                    got.append(message.seq)
            assert got == list(range(10))
            (record,) = pub.dropped
            assert "killed" in record.reason and record.code == "TRANSPORT"
            other.close()
        finally:
            peer.stop()


def test_a_subscriber_that_breaks_the_protocol_is_dropped(path):
    with publisher(path) as pub:
        good = subscriber(path, qos="every")
        bad = subscriber(path, qos="every")
        put(pub, b"0")
        bad._conn.sock.send(protocol.encode_release(12345))  # a frame it never had
        time.sleep(0.002)  # a publisher reads its subscribers' messages at least every millisecond
        put(pub, b"1")
        (record,) = pub.dropped
        assert record.code == "PROTOCOL" and "12345" in record.reason
        with pytest.raises(eglcuda.Dropped, match="12345"):
            for _ in range(3):
                bad.receive(1).release()
        assert [good.receive(1).seq for _ in range(2)] == [0, 1]
        good.close()
        bad.close()


def test_a_subscriber_that_sends_descriptors_is_dropped_and_the_publisher_keeps_none(path):
    """Each message it sends carries two descriptors; the publisher reads several at once: the
    first one's drop used to leave the others' descriptors open in the publisher's process."""
    with publisher(path) as pub:
        good = subscriber(path, qos="every")
        put(pub, b"0")
        good.receive(1).release()
        fds = open_fds()
        bad = subscriber(path, qos="every")
        read_end, write_end = os.pipe()
        for _ in range(3):
            socket.send_fds(bad._conn.sock, [protocol.encode_release(0)], [read_end, write_end])
        os.close(read_end)
        os.close(write_end)
        time.sleep(0.01)
        for key in (b"1", b"2"):
            put(pub, key)
            good.receive(1).release()
        (record,) = pub.dropped
        assert record.code == "PROTOCOL" and "descriptors" in record.reason
        bad.close()
        assert open_fds() == fds
        good.close()


@pytest.mark.parametrize("then", ["alive", "goodbye", "goodbye-socket-open", "killed"])
def test_a_failed_hand_over_reads_the_subscriber_first(path, then):
    """Sending the frame's message or handing the frame over fails. The publisher first reads what
    the subscriber sent since its last read of the sockets: a goodbye makes it a leave (no drop),
    whether its socket is closed already (the send fails) or not yet (the transport fails); its
    connection closed without one, a drop saying its process exited or was killed; nothing, a
    transport drop with the error."""
    with publisher(path) as pub:
        sub = subscriber(path, qos="every")
        put(pub, b"0")
        sub.receive(1).release()
        if then == "goodbye":
            sub.close()  # its release, then its goodbye
        elif then == "goodbye-socket-open":
            sub._conn.sock.send(protocol.encode(protocol.Bye(int(Reason.CLOSING), "leaving")))
        elif then == "killed":
            sub._conn.sock.close()  # the connection ends without a goodbye, as when its process dies
        pub._transports["null"].fail_deliver = True
        pub._service = lambda: None  # the messages come after publish() read the sockets
        put(pub, b"1")
        assert pub.subscribers == []
        if then.startswith("goodbye"):
            assert pub.dropped == []
        else:
            (record,) = pub.dropped
            assert record.code == "TRANSPORT"
            expected = "delivering frame 1 failed" if then == "alive" else "exited or was killed"
            assert expected in record.reason, record.reason
        if then != "goodbye":
            sub.close()


def test_a_transport_that_fails_closed_disconnects_instead_of_looking_closed(path):
    """A ClosedError from the transport that no close() caused (its consumer went away) is a
    lost connection (StreamDisconnected), not 'the subscriber is closed'; reconnecting works."""
    with publisher(path) as pub:
        sub = subscriber(path, qos="every", queue=2)
        sub._backend.transports[-1].fail_with = eglcuda.ClosedError("the consumer is gone")
        put(pub, b"0", timeout=5)
        with pytest.raises(eglcuda.StreamDisconnected, match="the consumer is gone"):
            sub.receive(5)
        assert not sub.connected and not sub.closed
        sub.wait_for_publisher(5)
        put(pub, b"1", timeout=5)
        with sub.receive(5) as message:
            assert message.frame.data == pattern(b"1")
        sub.close()


def test_a_drop_reaches_a_subscriber_whose_socket_queued_messages_filled(path, monkeypatch):
    """Messages queued before a drop must not hide it: an 'every' subscriber that stopped
    reading until its socket was full is dropped ("its socket stayed full"); the DROP did not fit
    behind the frames on its socket, so after reading them the subscriber saw only the end of
    the connection (StreamDisconnected) instead of Dropped with the reason."""
    from eglcuda.topics import handshake as handshake_module

    monkeypatch.setattr(handshake_module, "SEND_BUFFER", 1 << 16)  # (full after a few frames of 16 KB)
    with publisher(path, every_timeout=0.1) as pub:
        sub = subscriber(path, qos="every", queue=64)
        sent = 0
        while not pub.dropped and sent < 64:
            put(pub, b"%d" % sent + bytes(16000), timeout=5)
            sent += 1
        assert [record.reason for record in pub.dropped] == ["its socket stayed full for 0.1 s (every_timeout)"]
        got = 0
        with pytest.raises(eglcuda.StreamDisconnected) as raised:
            while True:
                sub.receive(1).release()
                got += 1
        assert isinstance(raised.value, eglcuda.Dropped), raised.value
        assert "socket stayed full" in str(raised.value) and 0 < got < sent
        sub.close()


def test_a_frame_that_cannot_be_taken_after_a_drop_does_not_hide_the_drop(path):
    """A subscriber dropped for being slow whose queued frame (or slot) cannot be used
    any more when it reads again (the publisher exited meanwhile) raises Dropped with the drop's
    reason, not the transport's failure."""
    with publisher(path, every_timeout=0.1) as pub:
        sub = subscriber(path, qos="every", queue=1)
        put(pub, b"0", timeout=5)
        put(pub, b"1", timeout=5)  # its queue is full: dropped after every_timeout
        assert [record.code for record in pub.dropped] == ["QUEUE_FULL"]
        sub._backend.transports[-1].fail_with = eglcuda.StreamDisconnected("cuIpcOpenMemHandle failed")
        with pytest.raises(eglcuda.Dropped, match="every_timeout") as raised:
            sub.receive(5)
        assert raised.value.code == Reason.QUEUE_FULL
        assert not sub.connected
        sub.close()


def test_a_frame_announced_before_a_drop_is_not_handed_out_once_its_slot_is_written_again(path):
    """An 'every' subscriber that stopped (SIGSTOP, a long pause) past every_timeout is dropped,
    and the publisher writes the slots it held again. Reading on, it used to get the frames
    announced before the drop, their bytes already another frame's (no error); it now raises
    the drop with its reason."""
    with publisher(path, every_timeout=0.1, pool=2, max_pool=2, _backend=NullPublisherBackend(message_only=True)) as pub:
        sub = subscriber(path, qos="every", queue=1)
        put(pub, b"0", timeout=5)
        put(pub, b"1", timeout=5)  # its queue is full: dropped after every_timeout
        assert [record.code for record in pub.dropped] == ["QUEUE_FULL"]
        put(pub, b"2", timeout=5)
        put(pub, b"3", timeout=5)  # both pool slots written again
        with pytest.raises(eglcuda.Dropped, match="every_timeout") as raised:
            sub.receive(5)
        assert raised.value.code == Reason.QUEUE_FULL and not sub.connected
        sub.close()


def test_waiting_for_a_publisher_without_limit_can_be_asked(path):
    """wait_for_publisher(inf) waits (here for a publisher started 0.3 s later) instead of failing
    on a socket timeout that cannot hold it."""
    pub = publisher(path)
    sub = subscriber(path)
    pub.close()
    with pytest.raises(eglcuda.StreamDisconnected):
        sub.receive(2)
    later = threading.Timer(0.3, lambda: holder.append(publisher(path)))
    holder: list = []
    later.start()
    try:
        info = sub.wait_for_publisher(float("inf"))
        assert info.name == "t" and sub.connected
    finally:
        later.join()
        sub.close()
        for pub in holder:
            pub.close()


@pytest.mark.parametrize("what", ["directory", "link"])
def test_a_lock_path_that_cannot_be_a_lock_file_is_a_usage_error(path, what):
    """What is at the socket's lock path is no file a lock can be (a directory; a symbolic link,
    which is never followed): the publisher says so, naming it, instead of a bare OSError, and
    leaves it there."""
    lock = path + ".lock"
    if what == "directory":
        os.mkdir(lock)
    else:
        os.symlink(path + ".elsewhere", lock)
    kind = "a directory" if what == "directory" else "a symbolic link"
    with pytest.raises(eglcuda.UsageError, match=f"{re.escape(lock)} as the topic's lock file: it is {kind}"):
        publisher(path)
    assert os.path.lexists(lock) and not os.path.exists(path)


def test_a_payload_that_cannot_be_read_is_a_usage_error_and_the_frame_stays_the_callers(path):
    """publish(payload=<a released memoryview>) raised a bare ValueError from bytes(); it is a
    UsageError, and the frame can still be published."""
    with publisher(path) as pub:
        frame = pub.next_frame(1.0)
        view = memoryview(b"header")
        view.release()
        with pytest.raises(eglcuda.UsageError, match="payload cannot be read"):
            pub.publish(frame, payload=view)
        assert pub.publish(frame, payload=b"header") >= 0
