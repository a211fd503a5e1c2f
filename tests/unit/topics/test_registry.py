"""Topics on the CPU: names, directories and paths, arguments, the registry (listing live topics,
cleaning stale ones, the status schema) and taking a dead publisher's name again."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

import eglcuda
from eglcuda.topics import naming, protocol

from .helpers import ENV, HERE, NullPublisherBackend, Peer, pattern, publisher, put, subscriber


@pytest.mark.parametrize("name", ["cam", "a", "camera-0.left_1", "X" * 63])
def test_valid_names(name):
    assert naming.check_name(name) == name


@pytest.mark.parametrize("name", ["", ".hidden", "-x", "a/b", "a..b", "X" * 64, "naïve", "a b", None, 3])
def test_invalid_names(name):
    with pytest.raises(eglcuda.UsageError):
        naming.check_name(name)


def test_topic_directory_is_made_private_and_unsafe_ones_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    directory = naming.topic_directory(create=True)
    assert directory == str(tmp_path / "eglcuda")
    assert os.stat(directory).st_mode & 0o777 == 0o700
    os.chmod(directory, 0o755)
    with pytest.raises(eglcuda.UsageError, match="mode 0755"):
        naming.topic_directory(create=True)
    os.rmdir(directory)
    os.symlink("/tmp", directory)
    with pytest.raises(eglcuda.UsageError, match="symbolic link"):
        naming.topic_directory(create=True)
    os.unlink(directory)
    if os.geteuid() == 0:
        os.mkdir(directory, 0o700)
        os.chown(directory, 65534, 65534)
        with pytest.raises(eglcuda.UsageError, match="belongs to uid 65534"):
            naming.topic_directory(create=True)
    missing = tmp_path / "missing" / "eglcuda"  # (mkdir fails: a UsageError that names it, not an OSError)
    with pytest.raises(eglcuda.UsageError, match=f"cannot make the eglcuda topic directory {missing}: No such file"):
        naming.topic_directory(create=True, directory=missing)
    monkeypatch.setenv("XDG_RUNTIME_DIR", "relative/dir")
    assert naming.default_directory() == f"/tmp/eglcuda-{os.geteuid()}"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert naming.default_directory() == f"/tmp/eglcuda-{os.geteuid()}"


def test_default_location_and_access_rules(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    with publisher(None, name="cam") as pub:
        assert pub.path == str(tmp_path / "eglcuda" / "cam.topic")
        assert os.stat(pub.path).st_mode & 0o777 == 0o600
        sub = subscriber(None, name="cam")
        assert sub.path == pub.path
        sub.close()
        with pytest.raises(eglcuda.UsageError, match="live publisher"):
            publisher(None, name="cam")
    with pytest.raises(eglcuda.UsageError, match="path="):
        publisher(None, name="cam", access="group")
    with pytest.raises(eglcuda.UsageError, match="at most 107"):
        naming.socket_path("x", "/tmp/" + "y" * 200)
    with pytest.raises(eglcuda.UsageError, match="access"):
        publisher(str(tmp_path / "a.topic"), access="world")


def test_bad_arguments(path):
    with pytest.raises(eglcuda.UsageError):
        eglcuda.Publisher("t", 0, 32, "Y", path=path, _backend=NullPublisherBackend())
    with pytest.raises(eglcuda.UsageError):
        eglcuda.Publisher("t", 63, 31, "NV12", path=path, _backend=NullPublisherBackend())
    for options in ({"pool": 0}, {"pool": 65}, {"every_timeout": 0}, {"fps": -1}, {"pool": 8, "max_pool": 4}):
        with pytest.raises(eglcuda.UsageError):
            publisher(path, **options)
    assert not os.path.exists(path)
    with publisher(path) as pub:
        for busy_wait in (0, 0.0, 0.01, 5e-6):  # (seconds: 0 sleeps at once)
            with subscriber(path, busy_wait=busy_wait) as sub:
                assert sub.busy_wait == busy_wait and isinstance(sub.busy_wait, float)
                with pytest.raises(AttributeError):
                    sub.busy_wait = 1e-3  # type: ignore[misc]  # (its connection's reader has it already)
        for options in ({"qos": "sometimes"}, {"queue": 0}, {"timeout": 0}, {"transport": "pigeon"},
                        {"busy_wait": -1e-6}, {"busy_wait": 0.02}, {"busy_wait": float("nan")},
                        {"busy_wait": True}, {"busy_wait": "20us"}):
            with pytest.raises(eglcuda.UsageError):
                eglcuda.Subscriber("t", path=path, **options)
        frame = pub.next_frame()
        with pytest.raises(eglcuda.UsageError, match="payload"):
            pub.publish(frame, payload=bytes(protocol.MAX_PAYLOAD + 1))
        with pytest.raises(eglcuda.UsageError, match="timestamp"):
            pub.publish(frame, timestamp_ns=-1)
        pub.publish(frame, timestamp_ns=123)
        with pytest.raises(eglcuda.UsageError, match="once"):
            pub.publish(frame)
        with pytest.raises(eglcuda.UsageError):
            pub.discard(frame)
    with pytest.raises(eglcuda.ClosedError):
        pub.next_frame()


def test_numpy_numbers_are_taken_for_timeouts_and_timestamps(path):
    # (close(timeout=np.float32(1)) was taken while next_frame(timeout=np.float32(1)) and
    # every_timeout=np.float32(1) were not, nor a timestamp_ns read from a NumPy array)
    np = pytest.importorskip("numpy")
    with publisher(path, every_timeout=np.float32(0.5), handshake_timeout=np.int64(2)) as pub:
        assert pub.every_timeout == 0.5 and type(pub.every_timeout) is float
        with subscriber(path, qos="every") as sub:
            pub.discard(pub.next_frame(np.float32(1)))
            for stamp in (np.int64(123), np.uint64(2**64 - 1)):
                pub.publish(pub.next_frame(np.float64(1)), timestamp_ns=stamp)
                message = sub.receive(5)
                assert message.timestamp_ns == int(stamp) and type(message.timestamp_ns) is int
                message.release()
            for bad in (np.bool_(True), np.float64(1.0), np.int64(-1)):
                with pytest.raises(eglcuda.UsageError, match="timestamp_ns"):
                    pub.publish(pub.next_frame(), timestamp_ns=bad)
            for bad in (np.float32("nan"), np.float64(-1), np.bool_(True), np.float64("inf")):
                with pytest.raises(eglcuda.UsageError, match="timeout"):
                    pub.next_frame(bad)


def test_numpy_integers_are_taken_for_sizes_pools_and_queues(path):
    """A width, height, pool or queue read from a NumPy array is the int it holds: what the
    subscriber is told is a plain int, and the frames are that size."""
    np = pytest.importorskip("numpy")
    with eglcuda.Publisher("t", np.int64(64), np.uint16(32), "Y", path=path, pool=np.int32(3), max_pool=np.int64(4),
                           fps=np.float32(30), _backend=NullPublisherBackend()) as pub:
        with subscriber(path, qos="every", queue=np.int64(2)) as sub:
            assert sub.queue == 2 and type(sub.queue) is int
            assert (sub.info.width, sub.info.height) == (64, 32) and type(sub.info.width) is int
            put(pub, b"np")
            with sub.receive(5) as message:
                assert message.frame.data == pattern(b"np")
    for bad in (np.float64(64), np.bool_(True), True):
        with pytest.raises(eglcuda.UsageError, match="width"):
            eglcuda.Publisher("t", bad, 32, "Y", path=path, _backend=NullPublisherBackend())
        with pytest.raises(eglcuda.UsageError, match="queue"):
            subscriber(path, queue=bad)


def test_arguments_that_only_looked_right(folder, path):
    for qos in (True, False):
        with pytest.raises(eglcuda.UsageError, match="qos"):
            subscriber(path, qos=qos)
    with pytest.raises(eglcuda.UsageError, match="access"):
        publisher(path, access=["user"])
    with pytest.raises(eglcuda.UsageError, match="does not exist"):
        publisher(os.path.join(folder, "missing", "t.topic"))
    assert os.listdir(folder) == []


def test_a_socket_of_another_kind_is_named_as_such(folder, path):
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    other.bind(path)
    other.listen(1)
    try:
        with pytest.raises(eglcuda.UsageError, match="another kind"):
            subscriber(path, timeout=1)
    finally:
        other.close()


def test_a_path_that_is_no_socket_is_named_as_such_at_once(folder, path):
    """A file or a directory at the topic's path will never answer: said at once, not after the
    whole timeout as "no publisher answered". A path where nothing is yet still waits."""
    for make, kind in ((lambda: open(path, "w").close(), "not a socket"), (lambda: os.mkdir(path), "a directory")):
        make()
        started = time.monotonic()
        with pytest.raises(eglcuda.UsageError, match=kind):
            subscriber(path, timeout=10)
        assert time.monotonic() - started < 5
        (os.rmdir if os.path.isdir(path) else os.remove)(path)
    started = time.monotonic()
    with pytest.raises(eglcuda.Timeout):
        subscriber(path, timeout=0.3)
    assert time.monotonic() - started >= 0.25


def test_registry_lists_live_topics_and_cleans_stale_ones(folder):
    alive = publisher(os.path.join(folder, "alive.topic"), name="alive", fps=25.0)
    sub = subscriber(os.path.join(folder, "alive.topic"), name="alive", qos="every", queue=3)
    put(alive, b"x")
    dead = Peer("publish", "--path", os.path.join(folder, "dead.topic"), "--name", "dead", "--frames", "1")
    try:
        dead.wait_for(lambda m: m["event"] == "done")
        dead.kill()
        for bad in ("no", 0):  # (a truthy "no" would have removed what was asked to be kept)
            with pytest.raises(eglcuda.UsageError, match="clean is True or False"):
                eglcuda.list_topics(folder, clean=bad)
        kept = eglcuda.list_topics(folder, clean=False)
        assert [t.name for t in kept.topics] == ["alive"]
        assert kept.stale == [os.path.join(folder, "dead.topic")] and kept.removed == []
        assert os.path.exists(os.path.join(folder, "dead.topic"))

        out = subprocess.run([sys.executable, "-m", "eglcuda", "topics", "--json", "--dir", folder], env=ENV,
                             capture_output=True, text=True, timeout=30, cwd=HERE.parent)
        assert out.returncode == 0, out.stderr
        listing = json.loads(out.stdout)
        assert listing["removed"] == [os.path.join(folder, "dead.topic")]
        (topic,) = listing["topics"]
        assert (topic["name"], topic["pid"], topic["width"], topic["height"], topic["format"], topic["fps"]) == \
            ("alive", os.getpid(), 64, 32, "Y", 25.0)
        (entry,) = topic["subscribers"]
        assert (entry["pid"], entry["qos"], entry["queue"], entry["transport"], entry["delivered"]) == \
            (os.getpid(), "every", 3, "null", 1)
        assert sorted(os.listdir(folder)) == ["alive.topic", "alive.topic.lock"]

        from eglcuda.topics.registry import format_listing

        text = format_listing(eglcuda.list_topics(folder))
        assert "alive: pid" in text and "every (queue 3), null, 1 delivered" in text
    finally:
        dead.stop()
        sub.close()
        alive.close()
    assert os.listdir(folder) == []
    assert eglcuda.list_topics(folder).topics == []


def test_the_listing_prints_others_text_without_control_characters(tmp_path):
    from eglcuda.topics.registry import Listing, format_listing

    relay = {"name": "cam", "pid": 7, "address": "0.0.0.0:9\x1b[2J", "qos": "latest",
             "remotes": [{"peer": "10.0.0.2:1\rforged", "qos": "every", "sent": 3, "skipped": 0,
                          "dropped": "slow\nrelay on 1.2.3.4: pid 1"}]}
    listing = Listing(str(tmp_path), stale=[str(tmp_path / "a\x07.topic")], relays=[relay],
                      unresponsive={str(tmp_path / "b.topic"): "reset\x1b]0;title\x07"})
    text = format_listing(listing)
    lines = text.split("\n")
    assert all(line.isprintable() for line in lines)
    assert len(lines) == 6  # (the heading, "(none)", the relay, its remote, the stale socket, the silent one)
    assert "0.0.0.0:9?[2J" in text and "10.0.0.2:1?forged" in text and "slow?relay on 1.2.3.4" in text


def test_status_schema_is_strict(path):
    from eglcuda.topics import registry

    with publisher(path) as pub:
        body = pub.status()
        registry.validate_status(body)
        for broken in ({**body, "extra": 1}, {k: v for k, v in body.items() if k != "pid"}, {**body, "pid": "1"},
                       {**body, "pid": -1}, {**body, "layout": "tiled"}, {**body, "subscribers": [{"id": 1}]},
                       {**body, "name": "../x"}, {**body, "version": 2}, {**body, "width": True}):
            with pytest.raises(protocol.ProtocolError):
                registry.validate_status(broken)


def test_a_killed_publisher_s_name_can_be_taken_again(path):
    peer = Peer("publish", "--path", path, "--frames", "1")
    try:
        peer.wait_for(lambda m: m["event"] == "done")
        with pytest.raises(eglcuda.UsageError, match="live publisher"):
            publisher(path)
        peer.kill()
    finally:
        peer.stop()
    with publisher(path) as pub:  # the stale socket and lock are taken over
        sub = subscriber(path)
        put(pub, b"x")
        sub.close()


def test_a_live_publisher_whose_lock_file_was_removed_is_listed_not_called_stale(folder):
    # (a /tmp cleaner, or a user, may remove the lock file of a long-running publisher)
    path = os.path.join(folder, "alive.topic")
    with publisher(path, name="alive"):
        os.unlink(naming.lock_path(path))
        for clean in (False, True):
            listing = eglcuda.list_topics(folder, clean=clean)
            assert [t.name for t in listing.topics] == ["alive"]
            assert listing.stale == [] and listing.removed == []
        assert os.path.exists(path)


def test_a_shared_topic_folder_of_this_user_is_listed(folder):
    # access="group" or "all" needs its socket in a folder those users can reach: listing that
    # folder (--dir) must work; one that others may write to is still refused.
    shared = os.path.join(folder, "shared")
    os.mkdir(shared)
    os.chmod(shared, 0o750)
    with publisher(os.path.join(shared, "cam.topic"), name="cam", access="group"):
        assert [t.name for t in eglcuda.list_topics(shared).topics] == ["cam"]
        out = subprocess.run([sys.executable, "-m", "eglcuda", "topics", "--dir", shared], env=ENV,
                             capture_output=True, text=True, timeout=60, cwd=HERE.parent)
        assert out.returncode == 0 and "cam: pid" in out.stdout, out.stderr
        os.chmod(shared, 0o770)
        with pytest.raises(eglcuda.UsageError, match="may write"):
            eglcuda.list_topics(shared)


def test_relay_status_files_that_are_no_files_or_name_no_process_are_skipped(tmp_path):
    """`python -m eglcuda topics` hung for good on a FIFO named like a relay's status file (its
    open waited for a writer), ended in an OverflowError for a pid beyond a C int, and listed a
    relay for a pid of 0 or -1 (a signal 0 to those succeeds). Each is skipped now; a live
    relay's file is still listed."""
    from eglcuda.topics import registry

    folder = tmp_path / "topics"
    folder.mkdir(mode=0o700)
    os.mkfifo(folder / f"fifo.topic.1{registry.RELAY_SUFFIX}")
    for i, pid in enumerate([2**31, 2**70, 0, -1, True, "1"]):
        (folder / f"odd{i}.topic.{i + 2}{registry.RELAY_SUFFIX}").write_text(json.dumps({"pid": pid, "remotes": []}))
    (folder / f"deep.topic.9{registry.RELAY_SUFFIX}").write_text("[" * 3000 + "]" * 3000)  # (json.loads recursed out)
    live = folder / f"live.topic.{os.getpid()}{registry.RELAY_SUFFIX}"
    live.write_text(json.dumps({"pid": os.getpid(), "remotes": [], "name": "live"}))
    done = subprocess.run([sys.executable, "-m", "eglcuda", "topics", "--dir", str(folder), "--json"],
                          capture_output=True, text=True, timeout=60, env=ENV)
    assert done.returncode == 0, done.stderr
    relays = json.loads(done.stdout)["relays"]
    assert [relay["pid"] for relay in relays] == [os.getpid()]
