"""eglcuda.Batcher on the stand-in libcuda (tests/fakes/driver/fake_cuda.c): real publisher
processes (tests/gpu/topics_peer.py), a batching process (tests/gpu/batcher_peer.py) that checks
every byte of every image of every batch, and the order of events: round-robin collection, the
formation clock starting at a batch's first frame, metadata, refusals, and the GPU-side order of
releases (a source frame waits for its copy; a batch buffer waits for its readers). The fake has
no asynchrony: tests/gpu/test_batcher.py shows the same order with real kernels."""
from __future__ import annotations

import pytest

from ...gpu.batcher_kit import Sources, folder, run  # noqa: F401  (fixture)
from .test_fakecuda import env  # noqa: F401  (fixture)


@pytest.fixture
def sources(env, folder):  # noqa: F811
    made = Sources(env, folder)
    yield made
    made.stop()


def test_every_byte_and_metadata_of_batches_from_three_sources(sources):
    """Three NV12 topics; each image of each batch is its source's frame of that seq, byte for
    byte; seqs per source rise without gaps (every), skipped is 0, timestamps rise, and the
    planes are [B, H, W] and [B, H/2, W/2, 2]."""
    for seed in (11, 12, 13):
        sources.add(seed, rate=200)
    batches = run(sources.batcher("batch", "--batch-size", "3", "--count", "20", "--formation-ms", "200"), 20)
    per_source: dict[int, list[int]] = {}
    for b in batches:
        assert b["shapes"] == [[b["size"], 48, 64], [b["size"], 24, 32, 2]], b
        for source, seq, skipped in zip(b["sources"], b["seqs"], b["skipped"]):
            per_source.setdefault(source, []).append(seq)
            if len(per_source[source]) > 1:
                assert skipped == 0, b
    assert sorted(per_source) == [0, 1, 2]
    for seqs in per_source.values():
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), per_source
    stamps = [t for b in batches for t in b["timestamps"]]
    assert len(stamps) == sum(b["size"] for b in batches) >= 40


def test_a_source_that_always_has_frames_never_keeps_another_out(sources):
    """Two sources flat out with full queues (every, queue 8, the batcher starting late): each
    batch of 4 takes them in turn (a, b, a, b) while both have frames queued (the 8 queued each
    fill 4 batches); a batcher draining one source first would fill batches with one source."""
    sources.add(21, rate=0)
    sources.add(22, rate=0)
    batches = run(sources.batcher("batch", "--batch-size", "4", "--count", "4", "--queue", "8",
                                  "--prefill-ms", "500", "--formation-ms", "500"), 4)
    for b in batches:
        assert b["size"] == 4 and b["sources"] in ([0, 1, 0, 1], [1, 0, 1, 0]), b


def test_a_slow_source_beside_a_flood_loses_no_frame(sources):
    sources.add(31, rate=0)
    sources.add(32, rate=40)
    """A flood (always 8 frames queued) beside 40 frames/s, 10 ms spent on each batch: the slow
    source's frames all get in, in order, none held back behind the flood's."""
    batches = run(sources.batcher("batch", "--batch-size", "4", "--count", "50", "--queue", "8",
                                  "--formation-ms", "100", "--sleep-ms", "10"), 50)
    slow = [seq for b in batches for source, seq in zip(b["sources"], b["seqs"]) if source == 1]
    assert slow == list(range(slow[0], slow[0] + len(slow))), slow
    # 50 batches take over 0.5 s: about 20 frames of the slow source were published meanwhile.
    assert len(slow) >= 12, slow
    assert all(b["sources"].count(0) >= 2 for b in batches), batches


def test_the_formation_clock_starts_at_the_first_frame(sources):
    """One source at 5 frames/s, batches of 4, formation timeout 50 ms: each batch holds one
    frame and is handed out about 50 ms after that frame came; the calls themselves wait far
    longer (for the first frame), which a clock started at the call would cut short."""
    sources.add(41, rate=5)
    batches = run(sources.batcher("batch", "--batch-size", "4", "--count", "6", "--formation-ms", "50"), 6)
    for b in batches:
        assert b["size"] == 1, b
        assert 45 <= b["formed_ms"] <= 150, b
    assert max(b["call_ms"] for b in batches[1:]) > 100, batches


def test_sources_that_keep_sending_do_not_stretch_the_formation_time(sources):
    """Two flooding sources, batches of up to 1024 frames, a formation timeout of 5 ms: a batch
    is handed out once 5 ms passed since its first frame. Formation went on while any source
    had a frame, until the batch was full (hundreds of frames received past the timeout). Past
    it, only the pass under way ends: at most one frame a source."""
    for seed in (71, 72):
        sources.add(seed, rate=0)
    batches = run(sources.batcher("batch", "--batch-size", "1024", "--count", "5", "--queue", "8",
                                  "--formation-ms", "5"), 5)
    for b in batches:
        late = [ms for ms in b["received_ms"] if ms > 5.0]
        assert b["size"] == 1024 or len(late) <= 2, (b["size"], len(late), late[:4])


def test_a_released_source_frame_waits_for_its_copy_and_a_batch_buffer_for_its_reader(sources):
    """With the batcher's stream held busy, each source frame of a batch has been released with
    a done event pending behind the batcher's copies (the publisher waits for it before writing
    the frame again); the sources not in the batch have none pending. A batch handed to a busy stream (DLPack) leaves the
    batcher's stream waiting for that stream at its release."""
    sources.add(51, rate=100)
    sources.add(52, rate=100)
    batches = run(sources.batcher("batch", "--batch-size", "1", "--count", "6", "--fake-hold", "--no-check"), 6)
    for b in batches:
        in_batch = set(b["sources"])
        assert b["sources_wait_for_copies"] == [i in in_batch for i in range(2)], b
    batches = run(sources.batcher("batch", "--batch-size", "2", "--count", "4", "--hand-to-held"), 4)
    assert all(b["batcher_waits_for_reader"] for b in batches), batches


@pytest.mark.parametrize("held", ["busy", "idle"])
def test_a_copy_waits_for_a_busy_source_stream_and_an_idle_one_costs_no_wait(sources, held):
    """The sources' streams held busy while each batch forms: the batcher's stream waits for
    them (its copies come after the work queued before each frame); idle: it is left idle,
    no event queued behind them."""
    sources.add(81, rate=100)
    sources.add(82, rate=100)
    batches = run(sources.batcher("batch", "--batch-size", "2", "--count", "6", "--hold-sources", held), 6)
    assert all(b["batcher_waits_for_sources"] is (held == "busy") for b in batches), batches
    assert all(not b["wrong"] for b in batches), batches


@pytest.mark.parametrize("count", [1, 2])
def test_subscribers_closed_before_the_batcher(sources, count):
    """The subscribers closed first (their streams go with them), a batch still out: the
    batcher's close and that batch's release say nothing (the batcher never queued its work on
    a subscriber's own stream, one subscriber alone included)."""
    for seed in range(count):
        sources.add(90 + seed, rate=100)
    batches = run(sources.batcher("batch", "--batch-size", str(count), "--count", "3", "--close-sources-first"), 3)
    assert all(b["size"] >= 1 for b in batches)


def test_a_dropped_batcher_leaves_no_stream_and_a_forked_child_leaves_the_parents_alone(sources):
    """Batchers dropped without close() (a batch out) leave no CUDA stream or buffer behind; in a
    forked child, next() raises UsageError, and so does a new Batcher of the parent's subscribers
    (saying they are the parent's, not that they are not connected), and the release of a batch
    handed to a stream and close() make no driver call (the stream and the buffers are the
    parent's); the parent's next batch is whole. A closed batcher, and a batch it held out, name
    no stream once the batcher is closed. A batch read on another thread as the batcher closes:
    each read returns or raises ClosedError, never the driver's error for a stream destroyed
    under it, and the batcher's stream goes with the batch."""
    sources.add(95, rate=100)
    sources.add(96, rate=100)
    peer = sources.batcher("lifecycle", "--batch-size", "2")
    try:
        report = peer.wait_for(lambda m: m["event"] == "lifecycle")
    finally:
        peer.stop()
    assert report["dropped"] == report["before"], report
    assert report["child"]["raised"][0] == "UsageError" and "forked child" in report["child"]["raised"][1], report
    made = report["child"]["made"]
    assert made[0] == "UsageError" and "forked child" in made[1] and "wait_for_publisher" not in made[1], report
    assert report["child"]["driver_calls"] is False and report["child"]["released"] == "", report
    assert report["wrong"] == [], report
    assert report["streams_after_close"] == [True, None, None], report
    assert report["read_during_close"] == {"ClosedError": 30}, report
    assert report["read_leftovers"] == [0, 0], report


def test_a_source_joined_again_behind_the_batcher_counts_its_skips_from_its_new_publisher(sources):
    """Source 0's publisher killed and replaced; the program drains that subscriber and calls
    wait_for_publisher() itself, so the batcher never sees the source end. Its frames from the new
    publisher are batched whole, with skipped counted from that publisher's frames (0 for each
    of an 'every' source), never from the old publisher's seqs (which gave a negative count)."""
    sources.add(75, rate=100)
    sources.add(76, rate=100)
    peer = sources.batcher("rejoin", "--batch-size", "2", "--count", "20")
    try:
        formed = peer.wait_for(lambda m: m["event"] == "formed")
        assert formed["seqs"][0] > 10, formed
        sources.replace(0, seed=77, rate=100)
        peer.send("go 77")
        report = peer.wait_for(lambda m: m["event"] == "rejoined")
    finally:
        peer.stop()
    assert report["ended"] == "StreamDisconnected" and report["left"] == [], report
    assert report["wrong"] == [], report
    seqs = [seq for seq, _ in report["after"]]
    assert [skipped for _, skipped in report["after"]] == [0] * len(seqs), report
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), report


def test_a_source_joined_again_to_a_publisher_of_another_format_leaves_the_rotation(sources):
    """As above, the new publisher sends BGRA where the batch is ARGB: planes of the same shape,
    other bytes. The source leaves the rotation with MismatchedSource; none of its frames is
    batched as ARGB, and the other source's frames stay whole."""
    sources.add(85, rate=100, fmt="ARGB")
    sources.add(86, rate=100, fmt="ARGB")
    peer = sources.batcher("rejoin", "--batch-size", "2", "--count", "10")
    try:
        peer.wait_for(lambda m: m["event"] == "formed")
        sources.replace(0, seed=87, rate=100, fmt="BGRA")
        peer.send("go 87")
        report = peer.wait_for(lambda m: m["event"] == "rejoined")
    finally:
        peer.stop()
    assert report["left"] == [0] and report["why"] == {"0": "MismatchedSource"}, report
    assert report["after"] == [] and report["wrong"] == [], report


def test_bad_input_is_refused_with_the_reason(sources):
    sources.add(61, rate=100)
    sources.add(62, rate=100, width=32)
    peer = sources.batcher("misuse")
    try:
        results = peer.wait_for(lambda m: m["event"] == "misuse")["results"]
    finally:
        peer.stop()
    expected = {
        "batch_size_0": ("UsageError", "batch_size is an int"),
        "batch_size_bool": ("UsageError", "batch_size is an int"),
        "no_subscribers": ("UsageError", "at least one subscriber"),
        "not_a_subscriber": ("UsageError", "not an eglcuda.Subscriber"),
        "one_subscriber_not_a_list": ("UsageError", "got one Subscriber"),
        "twice": ("UsageError", "give each source once"),
        "pool_0": ("UsageError", "pool is an int"),
        "formation_negative": ("UsageError", "formation_timeout"),
        "mixed": ("MismatchedSource", "32x48 NV12"),
        "pool_exhausted": ("UsageError", "release one first"),
        "released_batch": ("ClosedError", "released"),
        "closed_subscriber": ("ClosedError", "is closed"),
        "set_batch_size": ("AttributeError", ""),  # (the buffers were made for it: fixed)
        "set_formation_negative": ("UsageError", "formation_timeout"),
        "set_timeout_text": ("UsageError", "timeout"),
        "formation_set": ("ok", ""),
    }
    for label, (kind, words) in expected.items():
        assert results[label][0] == kind and words in results[label][1], (label, results[label])


def test_a_source_that_closes_leaves_the_rotation_and_the_others_go_on(sources):
    """Source 0's publisher closes its topic after 5 s, source 1's after 8 s: the batcher goes
    on with source 1 alone, sleeping between its frames (no busy loop on the ended source's
    descriptor), loses none of its frames, and once both closed says every source ended."""
    sources.add(71, rate=100, frames=500)
    sources.add(72, rate=50, frames=400)
    peer = sources.batcher("batch", "--batch-size", "2", "--count", "100000", "--formation-ms", "30")
    try:
        peer.wait_for(lambda m: m["event"] == "batcher")
        for publisher in sources.peers:
            publisher.send("bye")  # topics_peer.py's publisher closes its topic after its frames
        done = peer.wait_for(lambda m: m["event"] == "done")
        ended = peer.wait_for(lambda m: m["event"] == "ended")
    finally:
        peer.stop()
    batches = [m for m in peer.messages if m.get("event") == "batch"]
    assert all(not b["wrong"] for b in batches)
    assert any(0 in b["sources"] for b in batches), (batches[:3], done, peer.stderr())
    last_of_0 = max(i for i, b in enumerate(batches) if 0 in b["sources"])
    later = batches[last_of_0 + 1:]
    assert len(later) >= 50 and all(set(b["sources"]) == {1} for b in later), later
    seqs = [seq for b in batches for source, seq in zip(b["sources"], b["seqs"]) if source == 1]
    assert seqs == list(range(seqs[0], 400)), seqs
    assert done["ended"] == {"0": "Dropped", "1": "Dropped"} and "every source" in ended["error"], (done, ended)
    assert done["cpu_s"] < 0.5 * done["wall_s"], done


def test_close_from_another_thread_ends_a_waiting_next_at_once_and_leaves_no_descriptor(sources):
    """A source at 1 frame/s, the batcher in step with it: close() from another thread 0.1 s into
    a next() ends it with ClosedError at once (with a 10 s and an infinite timeout alike, where
    it slept until its timeout or the next frame), next() after it raises ClosedError too; a
    forked child's close() does not wake the parent's next(); a signal handler's close() inside a
    release(), and a forked child's close() while another thread is inside a release(), return;
    and the process holds no descriptor more than before the batchers."""
    sources.add(81, rate=1)
    peer = sources.batcher("interrupt", "--batch-size", "2")
    try:
        result = peer.wait_for(lambda m: m["event"] == "interrupt", timeout=60)
    finally:
        peer.stop()
    outcomes = result["outcomes"]
    for kind, seconds, closed in outcomes[0::2]:
        assert kind == "ClosedError" and 0.05 <= seconds < 0.6 and closed, outcomes
    assert [kind for kind, _, _ in outcomes[1::2]] == ["ClosedError", "ClosedError"], outcomes
    # A forked child's close() leaves the parent's next() to time out as it would have, asleep
    # (the child's wake of the shared descriptor made it spin until the source's next frame).
    kind, seconds, cpu = result["after_child_close"]
    assert kind == "Timeout" and 0.25 <= seconds < 0.8 and cpu < 0.15, result
    # A signal handler inside a waiting next(): its next() is refused, its close() returns, and
    # the waiting next() ends with ClosedError at once (the buffers went as it returned).
    in_next = result["signal_in_next"]
    assert in_next["seen"] == ["UsageError", "closed", "ClosedError"] and in_next["seconds"] < 0.6, in_next
    assert in_next["closed"], in_next
    # A signal handler's close() inside a release() (in its ordering call) returns, and so does
    # the release: the batch is released and the batcher closed (they waited for each other).
    signalled = result["signal_close"]
    assert signalled["seen"] == ["handler", "closed", "released"], signalled
    assert signalled["batch_released"] and signalled["closed"] and signalled["next_after"] == "ClosedError", signalled
    # fork() while another thread is inside a release(): the child's release and close return at
    # once; the parent's batcher goes on, every byte right.
    forked = result["fork_beside_release"]
    assert forked == {"child": 0, "parent_released": True, "wrong": []}, forked
    assert result["fds_after"] == result["fds_before"], result


def test_frames_taken_before_a_source_raised_come_in_the_next_batch(sources):
    """Two flat-out sources; the second's subscriber holds its queue's worth of messages, so
    each pass's receive from it raises UsageError after the first source's frame was taken and
    copied. That frame is not lost: once the messages are released, the next batch starts with
    it (the seq after the one received before the batcher), and each source's seqs run on
    without a gap (every), every byte right."""
    sources.add(91, rate=200)
    sources.add(92, rate=200)
    peer = sources.batcher("interrupt", "--hold-second", "--batch-size", "4", "--queue", "4", "--count", "6",
                           "--formation-ms", "200")
    try:
        result = peer.wait_for(lambda m: m["event"] == "interrupt", timeout=60)
    finally:
        peer.stop()
    assert result["raised"] == ["UsageError", "UsageError"], result
    batches = result["batches"]
    assert all(not b["wrong"] for b in batches), batches
    first = [seq for b in batches for source, seq in zip(b["sources"], b["seqs"]) if source == 0]
    assert batches[0]["sources"][0] == 0, batches
    assert first == list(range(result["before"] + 1, result["before"] + 1 + len(first))), (first, result["before"])
    assert all(skipped == 0 for b in batches for source, skipped in zip(b["sources"], b["skipped"])
               if source == 0), batches
    second = [seq for b in batches for source, seq in zip(b["sources"], b["seqs"]) if source == 1]
    assert second[0] == result["held"][-1] + 1 and second == list(range(second[0], second[0] + len(second))), \
        (second, result["held"])


@pytest.mark.parametrize("close_after", [1, 3], ids=["first-frame", "later-frame"])
def test_a_subscriber_closed_by_another_thread_under_a_copy_leaves_the_rotation(sources, close_after):
    """Source 0's subscriber is closed by another thread after its receive handed the batcher a
    frame and before the copy (its first frame: the slot's geometry is checked through the
    planes; a later one: copied from the slot's address). The close waits until that frame is
    copied and released (it unmaps nothing under the copy), no next() raises, the source leaves
    the rotation with ClosedError and the other goes on, every byte right."""
    sources.add(101, rate=100)
    sources.add(102, rate=100)
    peer = sources.batcher("close-source", "--close-after", str(close_after), "--batch-size", "2",
                           "--count", "6", "--formation-ms", "100")
    try:
        result = peer.wait_for(lambda m: m["event"] == "closed-source", timeout=60)
    finally:
        peer.stop()
    assert result["taken"] == close_after and result["raised"] == [], result
    # The close waited for the batcher: it could unmap nothing its copies were about to read.
    assert result["closed_under_copy"] == [False], result
    assert result["ended"] == {"0": "ClosedError"} and result["wrong"] == [], result
    assert len(result["sources"]) == 6 and all(b == [1] * len(b) for b in result["sources"][-3:]), result


def test_a_signal_handlers_close_of_a_source_during_its_copy_is_finished_as_the_copy_ends(sources):
    """A signal handler of the batching thread closes source 0's subscriber right after its
    receive handed the batcher a frame (the batcher holds the source's receive lock until the
    frame is released behind its copies): the close is put off, and finished as the batcher lets
    go of the source, within that next(). It was left pending (the subscriber open, the publisher
    not told) when the batch filled in that pass, with no later look at the source."""
    sources.add(111, rate=100)
    sources.add(112, rate=100)
    peer = sources.batcher("close-source", "--closer", "handler", "--close-after", "1", "--batch-size", "2",
                           "--count", "4", "--formation-ms", "100", "--prefill-ms", "300")
    try:
        result = peer.wait_for(lambda m: m["event"] == "closed-source", timeout=60)
    finally:
        peer.stop()
    assert result["taken"] == 1 and result["raised"] == [], result
    assert result["closed_as_returned"] == [True], result
    assert result["ended"] == {"0": "ClosedError"} and result["wrong"] == [], result


def test_a_daemon_thread_inside_next_at_exit_lets_the_interpreter_end(sources):
    """A daemon thread forms batches in a loop and the main thread ends. The exit hooks close the
    sources; one of them was inside the batcher's pass, which holds the source's receive lock
    around its receive: the receive then waited for good at exit with the lock held, and the
    exit's close() waited for the lock (the process never ended). Here the pass is held at
    that point while the exit begins, every time."""
    import os
    import subprocess
    import sys

    for seed in (61, 62):
        sources.add(seed, rate=0)
    paths = [spec.split(":")[1] for spec in sources.specs]
    code = ("import atexit, threading, time\n"
            "import eglcuda\n"
            "exit_begun, paused = threading.Event(), threading.Event()\n"
            "class Held(eglcuda.Subscriber):\n"
            "    def receive(self, timeout=None):\n"
            "        if exit_begun.is_set() and not paused.is_set():\n"
            "            paused.set()\n"
            "            time.sleep(0.3)  # (inside the pass, the receive lock held)\n"
            "        return super().receive(timeout)\n"
            f"subs = [Held(f'cam{{i}}', qos='every', path=p, timeout=20) for i, p in enumerate({paths!r})]\n"
            "batcher = eglcuda.Batcher(subs, 4, formation_timeout=0.01)\n"
            "def forming():\n"
            "    while True:\n"
            "        with batcher.next(5):\n"
            "            pass\n"
            "threading.Thread(target=forming, daemon=True).start()\n"
            "time.sleep(0.3)\n"
            "def before_eglcuda_s_hooks():  # (registered last: runs first)\n"
            "    exit_begun.set()\n"
            "    paused.wait(5)\n"
            "atexit.register(before_eglcuda_s_hooks)\n"
            "print('ending', flush=True)\n")
    for _ in range(2):
        child = subprocess.run([sys.executable, "-c", code], env=sources.env, capture_output=True, text=True,
                               timeout=30, cwd=os.path.dirname(paths[0]))
        assert (child.returncode, child.stdout.strip(), child.stderr) == (0, "ending", "")


_DROPPED_AFTER_AN_END = r"""
import ctypes, gc, json, os, signal, sys, time, weakref
import eglcuda
count = ctypes.CDLL("libcuda.so.1").fake_cuda_count
count.argtypes, count.restype = [ctypes.c_char_p], ctypes.c_int
publisher_pid = int(sys.argv[1])
subs = [eglcuda.Subscriber(name, qos="every", path=path, timeout=10) for name, path in
        (spec.split(":")[:2] for spec in sys.argv[2:])]
for sub in subs:
    sub.fileno()  # (made before the count)
gc.disable()  # (what a drop leaves must go at once, not at the cycle collector's next pass)
before = count(b"device_allocations")
report = {}
for how in ("closed", "publisher gone"):
    batcher = eglcuda.Batcher(subs, 2, formation_timeout=0.05)
    batcher.next().release()
    if how == "closed":
        subs[0].close()
    else:
        os.kill(publisher_pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while 0 not in batcher.ended and time.monotonic() < deadline:
        batcher.next().release()
    ended = type(batcher.ended.get(0)).__name__
    gone = weakref.ref(batcher)
    del batcher
    report[how] = [ended, gone() is None, count(b"device_allocations") - before]
    if how == "closed":
        subs[0] = eglcuda.Subscriber(subs[0].name, qos="every", path=subs[0].path, timeout=10)
print(json.dumps(report), flush=True)
"""


def test_a_batcher_dropped_after_a_source_ended_goes_at_once(sources, env):  # noqa: F811
    """A source that ended (its subscriber closed, its publisher killed) is kept in
    ``batcher.ended`` with its error. The error's traceback held the frame of the batcher's
    collection pass, and so the batcher: one dropped without close() stayed, with its buffers and
    stream, until the cycle collector ran, and as long as the source's subscriber (which keeps a
    lost publisher's error) lived. It goes at once, as a batcher without an ended source does."""
    import json
    import subprocess
    import sys

    from ...gpu.batcher_kit import ROOT

    sources.add(101, rate=100)
    sources.add(102, rate=100)
    out = subprocess.run([sys.executable, "-c", _DROPPED_AFTER_AN_END, str(sources.peers[0].process.pid),
                          *sources.specs], env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout.splitlines()[-1])
    assert report == {"closed": ["ClosedError", True, 0], "publisher gone": ["StreamDisconnected", True, 0]}, report
