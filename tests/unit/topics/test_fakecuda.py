"""The topic layer's real CUDA code paths (the cuda-ipc transport, pool frames from
Frame.allocate, SlotView planes, plane copies) on a machine without a GPU: every process loads
tests/fakes/driver/fake_cuda.c instead of libcuda.so.1, whose "device memory" is shared memory and
whose CUDA IPC maps it between processes. The GPU peers of tests/gpu/topics_peer.py run unchanged
and check every byte. This checks the Python side of the GPU path (not the driver's behaviour,
timing or asynchrony, which tests/gpu/test_topics.py checks on a GPU)."""
from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest

from eglcuda.topics.protocol import Reason

from ...json_peer import JsonPeer

ROOT = pathlib.Path(__file__).resolve().parents[3]
PEER = ROOT / "tests" / "gpu" / "topics_peer.py"


@pytest.fixture
def env(fake_env):
    return fake_env  # (no EGL: cuda-ipc and cuda-vmm only)


@pytest.fixture
def path():
    with tempfile.TemporaryDirectory(prefix="eglcuda-fake-topics-") as folder:
        os.chmod(folder, 0o700)
        yield os.path.join(folder, "t.topic")


class Peer(JsonPeer):
    """A spawned tests/gpu/topics_peer.py on the stand-in libcuda of ``env``."""

    def __init__(self, env, role: str, path: str, *args: str) -> None:
        super().__init__([str(PEER), role, "--name", "t", "--path", path, *args], env=env, cwd=str(ROOT))


PUBLISH = ("--width", "64", "--height", "48", "--format", "NV12")


@pytest.mark.parametrize("busy_every", [0, 1, 3], ids=["streams-idle", "streams-busy", "streams-mixed"])
def test_cuda_ipc_fanout_every_byte(env, path, busy_every):
    """busy_every N: every Nth event query finds the writer's work still running (the reader's
    stream then waits for it), and every Nth release after such a wait finds the subscriber's
    stream still busy, so that release records its done event; the others (all when idle) send
    no event. Mixed: a slot's event is first made at a later release. (With N = 1 no done event
    ever completes: the pool grows instead. tests/unit/topics/test_gpu_reading.py covers the
    publisher's wait for the reading to end.)"""
    stats = tempfile.mkdtemp(prefix="eglcuda-fakecuda-stats-")
    env = {**env, "FAKE_CUDA_STATS_DIR": stats}
    if busy_every:
        env["FAKE_CUDA_BUSY_AFTER_WAIT"] = str(busy_every)
    publisher = Peer(env, "publish", path, *PUBLISH, "--frames", "0", "--rate", "400", "--seed", "5")
    subscribers = []
    try:
        publisher.wait_for(lambda m: m["event"] == "ready")
        every = Peer(env, "subscribe", path, "--transport", "cuda-ipc", "--seed", "5", "--count", "40", "--hold", "3")
        latest = Peer(env, "subscribe", path, "--qos", "latest", "--sleep-ms", "10", "--seed", "5", "--count", "10")
        subscribers = [every, latest]
        for peer in subscribers:
            assert peer.wait_for(lambda m: m["event"] == "ready")["transport"] == "cuda-ipc"
        for peer in subscribers:
            peer.wait_for(lambda m: m["event"] == "done")
            assert all(m["ok"] for m in peer.got()), [m for m in peer.got() if not m["ok"]][:2]
        seqs = [m["seq"] for m in every.got()]
        assert seqs == list(range(seqs[0], seqs[0] + 40))
        seqs = [m["seq"] for m in latest.got()]
        assert seqs == sorted(set(seqs)) and sum(m["skipped"] for m in latest.got()) > 0
        # Which ordering ran: a subscriber's stream waits only for a pending frame event, and a
        # release records a done event only while its stream is busy.
        calls = {}
        for name in os.listdir(stats):
            words = pathlib.Path(stats, name).read_text().split()
            calls[int(name.split(".")[0])] = {"records": int(words[1]), "waits": int(words[3])}
        every_calls = calls.get(every.process.pid, {"records": 0, "waits": 0})
        publisher_calls = calls.get(publisher.process.pid, {"records": 0, "waits": 0})
        if busy_every:
            assert every_calls["waits"] > 0 and every_calls["records"] > 0, calls
        else:
            assert every_calls == {"records": 0, "waits": 0}, calls
        # The publisher's stream never waits for a subscriber's event (it waits on the host for
        # a slot whose readers finished), and its frames were written and finished before each
        # publish (host copies): a publish from an idle stream records no event.
        assert publisher_calls == {"records": 0, "waits": 0}, calls
    finally:
        for peer in [publisher, *subscribers]:
            peer.stop()
        shutil.rmtree(stats, ignore_errors=True)


def test_cuda_vmm_fanout_every_byte_with_one_descriptor_per_slot(env, path):
    """A publisher offering cuda-vmm: its pool is VMM memory (offered alone), each slot's
    descriptor reaches a subscriber once, with its SLOT message, and two subscribers (every,
    latest) check every byte of every frame they get; auto picks cuda-vmm there."""
    publisher = Peer(env, "publish", path, *PUBLISH, "--frames", "0", "--rate", "400", "--seed", "6",
                     "--offer", "cuda-vmm", "--pool", "4")
    subscribers = []
    try:
        publisher.wait_for(lambda m: m["event"] == "ready")
        every = Peer(env, "subscribe", path, "--transport", "cuda-vmm", "--seed", "6", "--count", "40", "--hold", "3")
        latest = Peer(env, "subscribe", path, "--qos", "latest", "--sleep-ms", "10", "--seed", "6", "--count", "10")
        subscribers = [every, latest]
        for peer in subscribers:
            assert peer.wait_for(lambda m: m["event"] == "ready")["transport"] == "cuda-vmm"
        for peer in subscribers:
            peer.wait_for(lambda m: m["event"] == "done")
            assert all(m["ok"] for m in peer.got()), [m for m in peer.got() if not m["ok"]][:2]
        seqs = [m["seq"] for m in every.got()]
        assert seqs == list(range(seqs[0], seqs[0] + 40))
        assert sum(m["skipped"] for m in latest.got()) > 0
        for peer in subscribers:  # no descriptor left open once it closed: mapped, then closed
            done = peer.wait_for(lambda m: m["event"] == "done")
            assert done["got"] in (40, 10)
    finally:
        for peer in [publisher, *subscribers]:
            peer.stop()


_ASK = """
import json, sys, time, eglcuda
out = {}
for transport in sys.argv[2:]:
    started = time.monotonic()
    try:
        with eglcuda.Subscriber("t", path=sys.argv[1], transport=transport, timeout=10) as sub:
            out[transport] = ["joined", sub.info.transport, 0, time.monotonic() - started]
    except eglcuda.EglCudaError as exc:
        out[transport] = [type(exc).__name__, str(exc), getattr(exc, "code", None), time.monotonic() - started]
print(json.dumps(out))
"""


def ask(env, path, *wishes) -> dict:
    """Subscribe to the topic at ``path`` through each of ``wishes`` in turn, from another process:
    {transport: [outcome, transport or message, code, seconds]}."""
    out = subprocess.run([sys.executable, "-c", _ASK, path, *wishes], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def offered(env, path) -> list:
    """The transports ``python -m eglcuda topics --json`` lists for the topic at ``path``."""
    out = subprocess.run([sys.executable, "-m", "eglcuda", "topics", "--json", "--dir", os.path.dirname(path)],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    (topic,) = json.loads(out.stdout)["topics"]
    return topic["transports"]


def test_a_cuda_vmm_publisher_offers_it_alone_and_tells_others_why(env, path):
    """A publisher offering cuda-vmm lists it alone; subscribers asking for cuda-ipc or eglstream
    are refused at once with the publisher's reason (its pool is VMM memory, which neither can
    serve), never a driver error nor a silence; auto gets cuda-vmm, every byte right."""
    publisher = Peer(env, "publish", path, *PUBLISH, "--frames", "0", "--rate", "200", "--seed", "3",
                     "--offer", "cuda-vmm")
    try:
        publisher.wait_for(lambda m: m["event"] == "ready")
        assert offered(env, path) == ["cuda-vmm"]
        answers = ask(env, path, "cuda-ipc", "eglstream", "auto")
        for transport, why in (("cuda-ipc", "the legacy CUDA IPC calls export cuMemAlloc memory only"),
                               ("eglstream", "an EGLStream producer cannot present VMM memory")):
            kind, message, code, seconds = answers[transport]
            assert (kind, code) == ("Refused", int(Reason.UNSUPPORTED)), answers[transport]
            assert f"{transport}: not offered by this publisher (it offers cuda-vmm): the pool is VMM memory" in message
            assert why in message and "CUDA_ERROR" not in message and seconds < 5, message
        assert answers["auto"][:2] == ["joined", "cuda-vmm"]
        sub = Peer(env, "subscribe", path, "--seed", "3", "--count", "10")
        try:
            assert sub.wait_for(lambda m: m["event"] == "ready")["transport"] == "cuda-vmm"
            sub.wait_for(lambda m: m["event"] == "done")
            assert len(sub.got()) == 10 and all(m["ok"] for m in sub.got()), sub.got()[:2]
        finally:
            sub.stop()
    finally:
        publisher.stop()


@pytest.mark.parametrize("offer", ["cuda-ipc,cuda-vmm", "cuda-vmm,eglstream", "cuda-ipc,cuda-vmm,eglstream"])
def test_a_publisher_told_to_offer_transports_that_cannot_share_a_pool_refuses_to_start(env, path, offer):
    """Such a publisher used to start, list every transport and refuse some subscribers with a
    driver error (cuIpcGetMemHandle on VMM memory): it now refuses to be made, saying why and
    which transports to offer instead, and leaves no socket behind."""
    publisher = Peer(env, "publish", path, *PUBLISH, "--offer", offer)
    try:
        assert publisher.finish(60) != 0
        error = publisher.stderr().strip().splitlines()[-1]
    finally:
        publisher.stop()
    assert error.startswith("eglcuda.errors.UsageError: transports ") and "cannot be offered together" in error
    assert "one kind of memory" in error and "transports=['cuda-vmm']" in error
    assert not os.path.exists(path)


def test_a_publisher_of_cuda_arrays_does_not_offer_cuda_ipc(env, path):
    """layout='array': the default transports leave cuda-ipc out (it cannot share CUDA arrays):
    listed is eglstream alone, and a cuda-ipc subscriber is told why."""
    publisher = Peer(env, "publish", path, "--width", "64", "--height", "48", "--format", "ARGB", "--layout", "array",
                     "--frames", "1")
    try:
        publisher.wait_for(lambda m: m["event"] == "ready", timeout=60)
        assert offered(env, path) == ["eglstream"]
        kind, message, code, _ = ask(env, path, "cuda-ipc")["cuda-ipc"]
        assert kind == "Refused" and "CUDA-array frames cannot be shared through CUDA IPC" in message, message
    finally:
        publisher.stop()


_PUBLISH_AND_CLOSE = """
import json, sys, time, eglcuda
sys.path.insert(0, "tests/gpu")
from topics_peer import content, payload_of
path, offer, frames, subscribers = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
pub = eglcuda.Publisher("t", 64, 48, "NV12", path=path, every_timeout=10.0,
                        transports=None if offer == "default" else [offer])
print(json.dumps({"event": "ready"}), flush=True)
while len(pub.subscribers) < subscribers:
    pub.discard(pub.next_frame(5))
    time.sleep(0.01)

def put(seq):
    frame = pub.next_frame(timeout=30)
    for plane, data in zip(frame.planes, content([p.shape for p in frame.planes], 8, seq)):
        plane.copy_from(data)
    pub.publish(frame, payload=payload_of(seq, 8))

for seq in range(frames - 2):
    put(seq)
    time.sleep(0.001)
time.sleep(1.0)  # every subscriber catches up: none is at its credit for the last frame
behind = [s.outstanding for s in pub.subscribers if s.outstanding]
put(frames - 2)
time.sleep(0.05)  # each subscriber takes it and sleeps on it (--sleep-ms) while the last one comes
put(frames - 1)
pub.close(5.0)  # the goodbye right behind the last frame: both wait for the subscriber when it wakes
print(json.dumps({"event": "closed", "behind": behind}), flush=True)
"""


@pytest.mark.parametrize("transport", ["cuda-ipc", "cuda-vmm"])
def test_latest_subscribers_get_the_last_frame_before_the_close(env, path, transport):
    """400 frames to three 'latest' subscriber processes, the publisher closing right after the
    last one: each subscriber's last frame is the last published, every byte right. The last
    frame and the goodbye come while the subscribers sleep on frame 398: the receive that takes
    frame 399 reads past it to the goodbye (which used to lose the frame: a last frame of 398
    through cuda-vmm on the GPU)."""
    offer = "default" if transport == "cuda-ipc" else transport
    publisher = JsonPeer(["-c", _PUBLISH_AND_CLOSE, path, offer, "400", "3"], env=env, cwd=str(ROOT))
    subscribers = []
    try:
        publisher.wait_for(lambda m: m["event"] == "ready", timeout=60)
        subscribers = [Peer(env, "subscribe", path, "--transport", transport, "--qos", "latest", "--seed", "8",
                            "--sleep-ms", "200") for _ in range(3)]
        closed = publisher.wait_for(lambda m: m["event"] == "closed", timeout=120)
        assert closed["behind"] == []
        for peer in subscribers:
            ended = peer.wait_for(lambda m: m["event"] in ("disconnected", "done"), timeout=60)
            assert ended.get("kind") == "Dropped", ended
            seqs = [m["seq"] for m in peer.got()]
            assert seqs and seqs == sorted(set(seqs)) and seqs[-1] == 399, seqs[-5:]
            assert all(m["ok"] for m in peer.got()), [m for m in peer.got() if not m["ok"]][:2]
    finally:
        for peer in [publisher, *subscribers]:
            peer.stop()


def test_cuda_ipc_join_leave_cycles_and_two_subscribers_in_one_process(env, path):
    publisher = Peer(env, "publish", path, *PUBLISH, "--frames", "0", "--rate", "1000", "--seed", "7")
    try:
        publisher.wait_for(lambda m: m["event"] == "ready")
        cycles = Peer(env, "cycles", path, "--transport", "cuda-ipc", "--qos", "latest", "--seed", "7",
                      "--count", "150")
        done = cycles.wait_for(lambda m: m["event"] in ("done", "error"), timeout=60)
        cycles.stop()
        assert done["event"] == "done", done
        assert done["fds"][0] == done["fds"][1] and done["free_memory"][0] == done["free_memory"][1], done
        # Two subscribers of one topic in one process share the mapping of each pool slot (the
        # driver maps a handle once per process: the fake refuses a second mapping like it).
        script = (
            "import sys, eglcuda; sys.path.insert(0, 'tests/gpu'); from topics_peer import check\n"
            "subs = [eglcuda.Subscriber('t', path=sys.argv[1], qos='every', transport='cuda-ipc') for _ in range(2)]\n"
            "for _ in range(20):\n"
            "    for sub in subs:\n"
            "        with sub.receive(10) as m:\n"
            "            ok, why = check(m, 7); assert ok, why\n"
            "subs[0].close()\n"
            "for _ in range(5):\n"
            "    with subs[1].receive(10) as m:\n"
            "        ok, why = check(m, 7); assert ok, why\n"
            "subs[1].close(); print('ok')\n")
        out = subprocess.run([sys.executable, "-c", script, path], env=env, cwd=ROOT, capture_output=True, text=True,
                             timeout=60)
        assert out.stdout.strip() == "ok", out.stderr[-2000:]
    finally:
        publisher.stop()


COLLECTED_PUBLISHERS = """
import ctypes, gc, sys, eglcuda
cuda = ctypes.CDLL("libcuda.so.1")  # the stand-in of LD_LIBRARY_PATH, already loaded by eglcuda
cuda.fake_cuda_count.argtypes = [ctypes.c_char_p]
cuda.fake_cuda_count.restype = ctypes.c_long
for _ in range(3):
    pub = eglcuda.Publisher("t", 64, 48, "NV12", path=sys.argv[1], pool=4)
    pub.publish(pub.next_frame())
    del pub
gc.collect()
print(cuda.fake_cuda_count(b"events"), cuda.fake_cuda_count(b"device_allocations"))
"""


def test_a_cuda_ipc_publisher_collected_without_close_destroys_its_events(env, path):
    """A publisher dropped without close() frees its pool memory as it is collected; each pool
    slot's interprocess event went with it too, not only at close() (three such publishers of four
    slots kept twelve events until the process ended)."""
    done = subprocess.run([sys.executable, "-c", COLLECTED_PUBLISHERS, path], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["0", "0"], done.stdout


def test_cuda_ipc_publisher_killed_and_restarted(env, path):
    first = Peer(env, "publish", path, *PUBLISH, "--frames", "0", "--rate", "300", "--seed", "1")
    second = None
    subscriber = None
    try:
        first.wait_for(lambda m: m["event"] == "ready")
        subscriber = Peer(env, "subscribe", path, "--transport", "cuda-ipc", "--seed", "1", "--rejoin",
                          "--no-check", "--count", "60")
        subscriber.wait_for(lambda m: m["event"] == "got" and len(subscriber.got()) >= 10)
        first.kill()
        lost = subscriber.wait_for(lambda m: m["event"] == "disconnected")
        assert lost["kind"] == "StreamDisconnected"
        second = Peer(env, "publish", path, *PUBLISH, "--frames", "0", "--rate", "300", "--seed", "1")
        try:
            rejoined = subscriber.wait_for(lambda m: m["event"] == "rejoined")
        except AssertionError:
            second.kill()
            raise AssertionError(f"second publisher said {second.messages}, {second.stderr()}")
        assert rejoined["transport"] == "cuda-ipc"
        subscriber.wait_for(lambda m: m["event"] == "done")
    finally:
        for peer in (first, second, subscriber):
            if peer is not None:
                peer.stop()


# A subscriber process that keeps a message's frame past the subscriber's end (``with`` block
# left, or the publisher gone first), then reads it: the slot it viewed is unmapped by then.
KEPT_FRAME = """
import copy, os, signal, sys
import eglcuda
pid = int(sys.argv[2])
with eglcuda.Subscriber("t", path=sys.argv[1], timeout=10) as subscriber:
    message = subscriber.receive(timeout=10)
    frame, plane = message.frame, message.frame.planes[0]
    if sys.argv[3] == "publisher-gone":
        os.kill(pid, signal.SIGKILL)
        try:
            while True:
                subscriber.receive(timeout=10).release()
        except eglcuda.StreamDisconnected:
            pass
print("released", message.released, frame.released, flush=True)
print("true", bool(frame), flush=True)  # truth is not len(): it read the planes, and raised
try:  # a copy would not be released with its message: it would read the slot (or unmapped memory)
    copy.copy(frame)
    print("copied", flush=True)
except TypeError:
    print("not copied", flush=True)
for read in (lambda: frame.planes, plane.to_numpy, lambda: plane.pointer):
    try:
        read()
        print("read worked", flush=True)
    except eglcuda.ClosedError:
        print("closed", flush=True)
"""


@pytest.mark.parametrize("how", ["subscriber-closed", "publisher-gone"])
def test_a_frame_kept_past_its_subscriber_is_unusable(env, path, how):
    """Reading it raises ClosedError (it read unmapped memory: a segmentation fault)."""
    publisher = Peer(env, "publish", path, *PUBLISH, "--frames", "0", "--rate", "300", "--seed", "2")
    try:
        publisher.wait_for(lambda m: m["event"] == "ready")
        done = subprocess.run([sys.executable, "-c", KEPT_FRAME, path, str(publisher.process.pid), how],
                              env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-3000:]
        assert done.stdout.split("\n")[:6] == ["released True True", "true True", "not copied", "closed", "closed",
                                            "closed"], done.stdout
    finally:
        publisher.stop()


# Processes that fork children which leave as programs do (sys.exit runs the atexit hooks, which
# close every open publisher; a child also closes the Subscriber it inherited): the topic and the
# subscription must stay the parents'.
FORKING_SUBSCRIBER = """
import os, sys, eglcuda
with eglcuda.Subscriber("t", path=sys.argv[1], timeout=10, qos="every") as sub:
    print("joined", flush=True)
    for _ in range(10):
        sub.receive(timeout=10).release()
    pid = os.fork()
    if pid == 0:
        sub.close()
        sys.exit(0)
    os.waitpid(pid, 0)
    for _ in range(50):
        sub.receive(timeout=10).release()
    print("got all, connected", sub.connected, flush=True)
"""
FORKING_PUBLISHER = """
import os, subprocess, sys, time
import eglcuda
path, subscribe = sys.argv[1], sys.argv[2]
publisher = eglcuda.Publisher("t", 64, 48, "NV12", path=path)
reader = subprocess.Popen([sys.executable, "-c", subscribe, path], stdout=subprocess.PIPE, text=True)
assert reader.stdout.readline() == "joined\\n"
sent = 0
while reader.poll() is None and sent < 2000:
    publisher.publish(publisher.next_frame(timeout=10))
    sent += 1
    if sent == 5:
        pid = os.fork()
        if pid == 0:
            sys.exit(0)
        os.waitpid(pid, 0)
        print("socket file", os.path.exists(path), flush=True)
        try:
            eglcuda.Publisher("t", 64, 48, "NV12", path=path).close()
            print("a second publisher was let in", flush=True)
        except eglcuda.EglCudaError:
            print("a second publisher refused", flush=True)
    time.sleep(0.002)
print("reader:", reader.stdout.readline().strip(), "exit", reader.wait(timeout=30), flush=True)
publisher.close()
"""


def test_a_forked_child_leaves_the_parents_topic_alone(env, path):
    """A child's exit (atexit closes every open publisher) and its close() of an inherited
    subscriber used to remove the parent's socket and lock, tell the subscribers the topic closed,
    or end the parent's subscription."""
    done = subprocess.run([sys.executable, "-c", FORKING_PUBLISHER, path, FORKING_SUBSCRIBER], env=env,
                          cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["socket file True", "a second publisher refused",
                                        "reader: got all, connected True exit 0"], done.stdout + done.stderr[-2000:]


def test_the_topic_bench_measures_a_stopped_and_resumed_subscriber(env):
    """bench/topics.py --stall-pairs on the stand-in libcuda: the publisher's rate in each phase,
    a subscriber stopped (SIGSTOP) and resumed in turns, and every process ends (the stopped one
    is resumed). Checks that the measurement runs and reports what it says, not any figure."""
    import json

    with tempfile.TemporaryDirectory(prefix="eglcuda-bench-stall-") as out:
        done = subprocess.run([sys.executable, str(ROOT / "bench" / "topics.py"), "--sizes", "1080p-nv12",
                               "--subscribers", "2", "--transports", "cuda-ipc", "--qos", "latest", "--duration", "0.3",
                               "--stall-pairs", "2", "--stall-phase", "0.3", "--out", out],
                              env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        rows = json.loads(pathlib.Path(out, "results.json").read_text())["rows"]
    (paired,) = [r for r in rows if r.get("paired")]
    assert paired["stall_pairs"] == 2 and len(paired["changes"]) == 2
    assert len(paired["running_rates"]) == 3 and len(paired["stalled_rates"]) == 2
    assert all(rate > 0 for rate in paired["running_rates"] + paired["stalled_rates"])
    assert "stopped and resumed 2 times" in done.stdout


# An 'every' subscriber that stops reading is dropped (queue full); the publisher then
# exits before the subscriber reads again. What waits on its socket: the SLOT and FRAME messages
# sent before the drop, then the DROP. The SLOT's memory handle names the publisher's process, gone
# now, so mapping it fails; that must not hide the drop and its reason.
DROPPED_THEN_GONE_PUBLISHER = """
import sys, eglcuda
with eglcuda.Publisher("t", 64, 48, "NV12", path=sys.argv[1], pool=4, every_timeout=0.2) as pub:
    print("ready", flush=True)
    sys.stdin.readline()  # the subscriber has joined
    while not pub.dropped:
        pub.publish(pub.next_frame(timeout=5))
    print("dropped", pub.dropped[0].code, flush=True)
"""
DROPPED_SUBSCRIBER = """
import sys, eglcuda
sub = eglcuda.Subscriber("t", path=sys.argv[1], qos="every", queue=2, transport="cuda-ipc", timeout=10)
print("joined", flush=True)
sys.stdin.readline()  # dropped meanwhile, and its publisher has exited
try:
    sub.receive(timeout=5)
    print("received", flush=True)
except eglcuda.EglCudaError as exc:
    print(type(exc).__name__, exc, flush=True)
sub.close()
"""


def test_a_dropped_subscriber_hears_the_drop_after_its_publisher_exited(env, path):
    publisher = subprocess.Popen([sys.executable, "-c", DROPPED_THEN_GONE_PUBLISHER, path], env=env, cwd=str(ROOT),
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    subscriber = None
    try:
        assert publisher.stdout.readline() == "ready\n", publisher.stderr.read()[-2000:]
        subscriber = subprocess.Popen([sys.executable, "-c", DROPPED_SUBSCRIBER, path], env=env, cwd=str(ROOT),
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert subscriber.stdout.readline() == "joined\n", subscriber.stderr.read()[-2000:]
        publisher.stdin.write("go\n")
        publisher.stdin.flush()
        assert publisher.stdout.readline() == "dropped QUEUE_FULL\n", publisher.stderr.read()[-2000:]
        assert publisher.wait(timeout=30) == 0, publisher.stderr.read()[-2000:]
        subscriber.stdin.write("read\n")
        subscriber.stdin.flush()
        said = subscriber.stdout.readline()
        assert subscriber.wait(timeout=30) == 0, subscriber.stderr.read()[-2000:]
        assert said.startswith("Dropped ") and "every_timeout" in said, said
    finally:
        for process in (publisher, subscriber):
            if process is not None and process.poll() is None:
                process.kill()
                process.wait()


POOL_FRAME_CLOSED_READER = r"""
import sys, numpy as np, eglcuda
with eglcuda.Subscriber("t", path=sys.argv[1], timeout=10, qos="every") as subscriber:
    print("joined", flush=True)
    with subscriber.receive(timeout=10) as message:
        plane = message.frame.planes[0].to_numpy()
        print("read", int(plane.min()), int(plane.max()), flush=True)
"""
POOL_FRAME_CLOSED = r"""
import subprocess, sys, numpy as np, eglcuda
path, read = sys.argv[1], sys.argv[2]
with eglcuda.Publisher("t", 64, 48, "NV12", path=path, pool=2, max_pool=2) as publisher:
    reader = subprocess.Popen([sys.executable, "-c", read, path], stdout=subprocess.PIPE, text=True)
    assert reader.stdout.readline() == "joined\n"
    frame = publisher.next_frame(timeout=5)
    try:
        frame.close()
        print("closed")
    except eglcuda.UsageError as exc:
        print("refused", "the pool of publisher 't'" in str(exc))
    frame.planes[0].copy_from(np.full(frame.planes[0].shape, 7, np.uint8))
    publisher.publish(frame)
    print(reader.stdout.readline().strip())
    reader.wait(30)
print("after close", frame.closed)
"""


def test_a_pool_frame_cannot_be_closed_by_the_user(env, path):
    """next_frame()'s frame is the pool's: Frame.close() on it is a UsageError naming the
    publisher (it freed the exported memory, which publish() then handed to subscribers: they
    failed to open it, or on a GPU could read reused memory), and the frame goes on working; the
    publisher's close() frees it."""
    done = subprocess.run([sys.executable, "-c", POOL_FRAME_CLOSED, path, POOL_FRAME_CLOSED_READER], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:3] == ["refused True", "read 7 7", "after close True"], done.stdout


_LYING_SLOT_SIZE = """
import dataclasses, json, sys, time, eglcuda
import eglcuda.topics.transports.cuda_ipc as cuda_ipc
path = sys.argv[1]
pub = eglcuda.Publisher("t", 64, 48, "NV12", path=path, transports=["cuda-ipc"])
# The lie: frames 64 times taller than the pool holds, and each slot said to be 1 GiB, where the
# memory handle opens the real, smaller allocation.
honest = pub.welcome
def taller(hello, transport):
    welcome = honest(hello, transport)
    return dataclasses.replace(welcome, height=48 * 64, plane_offsets=(0, welcome.pitch * 48 * 64))
pub.welcome = taller
slot_extra = cuda_ipc.CudaIpcLink.slot_extra
def claim_a_gigabyte(link, slot):
    handle, event, size = cuda_ipc._IPC_SLOT.unpack(slot_extra(link, slot))
    return cuda_ipc._IPC_SLOT.pack(handle, event, 1 << 30)
cuda_ipc.CudaIpcLink.slot_extra = claim_a_gigabyte
print(json.dumps({"event": "ready"}), flush=True)
deadline = time.monotonic() + 30
while time.monotonic() < deadline and not pub.dropped:
    pub.discard(pub.next_frame(5)) if not pub.subscribers else pub.publish(pub.next_frame(5))
    time.sleep(0.01)
pub.close()
"""


def test_a_cuda_ipc_subscriber_refuses_a_slot_smaller_than_its_publisher_says(env, path):
    """A lying publisher: its WELCOME describes frames larger than its pool's, and each SLOT says
    the memory is large enough. The subscriber measures the memory the handle opened and leaves
    with the reason, before any frame is read outside it (which on a GPU is an illegal address,
    fatal to the subscriber's CUDA context)."""
    liar = JsonPeer(["-c", _LYING_SLOT_SIZE, path], env=env, cwd=str(ROOT))
    try:
        liar.wait_for(lambda m: m["event"] == "ready", timeout=60)
        sub = Peer(env, "subscribe", path, "--transport", "cuda-ipc", "--count", "3", "--timeout", "10")
        try:
            gone = sub.wait_for(lambda m: m["event"] in ("disconnected", "got"), timeout=60)
        finally:
            sub.stop()
    finally:
        liar.stop()
    assert gone["event"] == "disconnected" and "its memory holds" in gone["reason"], gone
