"""Frame topics on the GPU: a publisher and subscribers in fresh interpreters (tests/gpu/topics_peer.py),
every byte of every frame checked, through each transport in turn.

Covered: fan-out to several subscriber processes with every byte checked (NV12 1080p and other
formats), late join / leave / rejoin, SIGKILL of a subscriber (also with GPU work queued behind its
release) while others keep receiving, SIGKILL of the publisher and its restart with the subscriber
waiting, a subscriber on a second GPU, a GL subscriber, hostile peers, 1,000 join/leave cycles with
descriptors and device memory flat in both processes, the transport ``auto`` picks, the
``topics`` listing, what a publisher offers (combinations refused when it is made; a subscriber
asking for a transport not offered refused with the reason), and the last frame before a close
reaching 'latest' subscribers.
"""
from __future__ import annotations

import gc
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import pytest

import eglcuda
from eglcuda.topics import protocol

from ..conftest import require_extension
from .topics_peer import check, content, payload_of
from ..json_peer import JsonPeer

ROOT = pathlib.Path(__file__).resolve().parents[2]
PEER = pathlib.Path(__file__).with_name("topics_peer.py")
# Children inherit the environment: tests/conftest.py makes them import this eglcuda, and sets
# PYOPENGL_PLATFORM=egl.
TRANSPORTS = ["cuda-ipc", "cuda-vmm", "eglstream"]


@pytest.fixture
def display(cuda_display):
    require_extension(cuda_display, "EGL_KHR_stream", "EGL_KHR_stream_fifo", "EGL_KHR_stream_cross_process_fd")
    return cuda_display


@pytest.fixture(params=TRANSPORTS)
def transport(request, display):
    if request.param == "cuda-ipc" and eglcuda.get_device(0).info.integrated:
        pytest.skip("CUDA IPC is not available on an integrated GPU (Tegra)")
    return request.param


def offered(transport: str) -> dict:
    """The Publisher keywords that make it offer ``transport`` (cuda-vmm is offered when named,
    and alone: its pool is VMM memory, which the others cannot serve)."""
    return {"transports": ["cuda-vmm"]} if transport == "cuda-vmm" else {}


def offer_args(transport: str) -> list:
    """The same for a publishing topics_peer.py."""
    return ["--offer", "cuda-vmm"] if transport == "cuda-vmm" else []


@pytest.fixture
def topic():
    """A topic name and its socket path in a private temporary folder."""
    with tempfile.TemporaryDirectory(prefix="eglcuda-gpu-topics-") as folder:
        os.chmod(folder, 0o700)
        yield "t", os.path.join(folder, "t.topic")


class Peer(JsonPeer):
    """A spawned topics_peer.py."""

    wait_timeout = 60.0

    def __init__(self, role: str, name: str, path: str, *args: str) -> None:
        super().__init__([str(PEER), role, "--name", name, "--path", path, *args], cwd=str(ROOT))


def put(pub: eglcuda.Publisher, seq: int, seed: int) -> int:
    frame = pub.next_frame(timeout=30)
    for plane, data in zip(frame.planes, content([p.shape for p in frame.planes], seed, seq)):
        plane.copy_from(data)
    return pub.publish(frame, payload=payload_of(seq, seed))


class Feeder:
    """Publishes frames on a thread until stopped, remembering how long each publish took."""

    def __init__(self, pub: eglcuda.Publisher, seed: int, rate: float = 0.0) -> None:
        self.pub, self.seed, self.rate = pub, seed, rate
        self.count = 0
        self.durations: list[tuple[float, float]] = []  # (when, seconds)
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                assert put(self.pub, self.count, self.seed) == self.count
                self.durations.append((started, time.monotonic() - started))
                self.count += 1
                if self.rate:
                    time.sleep(1.0 / self.rate)
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.errors.append(exc)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(60)
        assert not self.errors, self.errors


def assert_all_ok(peer: Peer) -> None:
    bad = [m for m in peer.got() if not m["ok"]]
    assert not bad, bad[:3]


# ---- fan-out --------------------------------------------------------------------------------------

def test_fanout_every_byte_1080p_nv12(display, transport, topic):
    """Three 'every' subscribers and one slow 'latest' subscriber, each its own process: every
    'every' subscriber gets all frames in order, the 'latest' one a rising subset, every byte right."""
    name, path = topic
    seed, frames = 5, 60
    with eglcuda.Publisher(name, 1920, 1080, "NV12", fps=60.0, every_timeout=10.0, path=path, **offered(transport)) as pub:
        every = [Peer("subscribe", name, path, "--transport", transport, "--seed", str(seed)) for _ in range(3)]
        latest = Peer("subscribe", name, path, "--transport", transport, "--qos", "latest", "--sleep-ms", "50",
                      "--seed", str(seed))
        peers = every + [latest]
        try:
            for peer in peers:
                ready = peer.wait_for(lambda m: m["event"] == "ready")
                assert ready["transport"] == transport
                assert ready["info"] == [1920, 1080, "NV12", 60.0]
            for seq in range(frames):
                put(pub, seq, seed)
            for peer in every:
                peer.wait_for(lambda m: m["event"] == "got" and m["seq"] == frames - 1)
                assert [m["seq"] for m in peer.got()] == list(range(frames))
                assert_all_ok(peer)
            infos = {s.pid: s for s in pub.subscribers}
            assert {infos[p.process.pid].transport for p in peers} == {transport}
            assert infos[latest.process.pid].qos == "latest" and infos[latest.process.pid].skipped > 0
        finally:
            pub.close()
            for peer in peers:
                peer.wait_for(lambda m: m["event"] in ("disconnected", "done"), timeout=30)
                peer.stop()
        seqs = [m["seq"] for m in latest.got()]
        assert seqs and seqs == sorted(set(seqs)) and len(seqs) < frames
        assert_all_ok(latest)
        assert latest.wait_for(lambda m: m["event"] == "disconnected")["kind"] == "Dropped"


def test_slot_not_written_while_a_subscriber_kernel_still_reads_it(display, topic):
    """A cuda-ipc subscriber queues a 30 ms kernel and then GPU copies of the frame, and releases
    it before they run; the publisher has one pool frame, so it writes the next frame into the same
    slot at once. Every copy must still hold the frame it was taken from (the publisher's write
    waits, on the GPU, for the subscriber's reading)."""
    pytest.importorskip("cupy")
    name, path = topic
    seed, frames = 9, 6
    with eglcuda.Publisher(name, 640, 480, "NV12", pool=1, max_pool=1, every_timeout=10.0, path=path) as pub:
        peer = Peer("subscribe", name, path, "--transport", "cuda-ipc", "--late-copy-ms", "30", "--seed", str(seed),
                    "--count", str(frames))
        try:
            assert peer.wait_for(lambda m: m["event"] == "ready")["transport"] == "cuda-ipc"
            for seq in range(frames):
                put(pub, seq, seed)
            peer.wait_for(lambda m: m["event"] == "done")
            assert [m["seq"] for m in peer.got()] == list(range(frames))
            assert_all_ok(peer)
        finally:
            peer.stop()


@pytest.mark.parametrize("pool", ["cuda-ipc", "cuda-vmm"], ids=["ipc-pool", "vmm-pool"])
@pytest.mark.parametrize("fmt, size", [("ARGB", (333, 97)), ("YUV420_PLANAR", (640, 480)),
                                       ("YUV444_PLANAR", (64, 48)), ("Y", (1000, 10))],
                         ids=["ARGB-333x97", "I420-640x480", "YUV444-64x48", "Y-1000x10"])
def test_formats_reach_both_transports(display, topic, fmt, size, pool):
    """One subscriber per transport the pool serves (CUDA IPC memory: cuda-ipc and an EGLStream;
    VMM memory: cuda-vmm, while an EGLStream subscriber is refused with the reason: the driver
    cannot present VMM memory) on the same topic, every byte, for each format."""
    name, path = topic
    seed = 9
    with eglcuda.Publisher(name, size[0], size[1], fmt, path=path, every_timeout=10.0, **offered(pool)) as pub:
        if pool == "cuda-vmm":
            with pytest.raises(eglcuda.Refused, match="cannot present"):
                eglcuda.Subscriber(name, path=path, transport="eglstream", timeout=10)
        peers = [Peer("subscribe", name, path, "--transport", t, "--seed", str(seed), "--count", "12")
                 for t in ((pool, "eglstream") if pool == "cuda-ipc" else (pool,))]
        try:
            for peer in peers:
                peer.wait_for(lambda m: m["event"] == "ready")
            for seq in range(12):
                put(pub, seq, seed)
            for peer in peers:
                peer.wait_for(lambda m: m["event"] == "done")
                assert [m["seq"] for m in peer.got()] == list(range(12))
                assert_all_ok(peer)
        finally:
            for peer in peers:
                peer.stop()


def test_latest_subscribers_get_the_last_frame_before_the_close(display, transport, topic):
    """400 frames to three 'latest' subscriber processes, then the publisher closes at once: each
    one's last frame is the last published, every byte right. The last frame and the goodbye
    come while the subscribers sleep on frame 398 (after a pause: none is behind, which 'latest'
    would let skip it): the receive that takes frame 399 reads past it to the goodbye, which
    used to lose the frame (a last frame of 398 through cuda-vmm)."""
    name, path = topic
    seed, frames = 21, 400
    with eglcuda.Publisher(name, 640, 480, "NV12", every_timeout=10.0, path=path, **offered(transport)) as pub:
        peers = [Peer("subscribe", name, path, "--transport", transport, "--qos", "latest", "--seed", str(seed),
                      "--sleep-ms", "200") for _ in range(3)]
        try:
            for peer in peers:
                assert peer.wait_for(lambda m: m["event"] == "ready")["transport"] == transport
            for seq in range(frames - 2):
                put(pub, seq, seed)
                time.sleep(0.001)
            time.sleep(1.0)
            assert [s.outstanding for s in pub.subscribers] == [0, 0, 0]  # caught up, all of them
            put(pub, frames - 2, seed)
            time.sleep(0.05)  # each subscriber takes it and sleeps on it while the last one comes
            put(pub, frames - 1, seed)
            pub.close(5.0)
            for peer in peers:
                ended = peer.wait_for(lambda m: m["event"] in ("disconnected", "done"), timeout=30)
                assert ended.get("kind") == "Dropped", ended
        finally:
            pub.close()
            for peer in peers:
                peer.stop()
    for peer in peers:
        seqs = [m["seq"] for m in peer.got()]
        assert seqs and seqs == sorted(set(seqs)) and seqs[-2:] == [frames - 2, frames - 1], seqs[-5:]
        assert_all_ok(peer)


# ---- what a publisher offers ----------------------------------------------------------------------------

_ASK = """
import json, sys, time, eglcuda
out = {}
for transport in sys.argv[3:]:
    started = time.monotonic()
    try:
        with eglcuda.Subscriber(sys.argv[1], path=sys.argv[2], transport=transport, timeout=10) as sub:
            out[transport] = ["joined", sub.info.transport, 0, time.monotonic() - started]
    except eglcuda.EglCudaError as exc:
        out[transport] = [type(exc).__name__, str(exc), getattr(exc, "code", None), time.monotonic() - started]
print(json.dumps(out))
"""


def ask(name: str, path: str, *wishes: str) -> dict:
    """Subscribe to topic ``name`` at ``path`` through each of ``wishes`` in turn, from another
    process: {transport: [outcome, transport or message, code, seconds]}."""
    out = subprocess.run([sys.executable, "-c", _ASK, name, path, *wishes], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def listed_transports(path: str) -> list:
    """The transports ``python -m eglcuda topics --json`` lists for the topic at ``path``."""
    out = subprocess.run([sys.executable, "-m", "eglcuda", "topics", "--json", "--dir", os.path.dirname(path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    (entry,) = json.loads(out.stdout)["topics"]
    return entry["transports"]


@pytest.mark.parametrize("offer", [["cuda-ipc", "cuda-vmm"], ["cuda-vmm", "eglstream"],
                                   ["cuda-ipc", "cuda-vmm", "eglstream"]], ids="+".join)
def test_transports_that_cannot_share_a_pool_are_refused_when_the_publisher_is_made(display, topic, offer):
    name, path = topic
    with pytest.raises(eglcuda.UsageError, match=r"cannot be offered together.*one kind of memory.*"
                                                 r"transports=\['cuda-vmm'\]"):
        eglcuda.Publisher(name, 640, 480, "NV12", path=path, transports=offer)
    assert not os.path.exists(path)


@pytest.mark.parametrize("case", ["cuda-vmm", "array", "one-frame"])
def test_a_publisher_lists_only_what_it_serves_and_tells_a_subscriber_why_not(display, topic, case):
    """What ``topics`` lists is what the publisher serves, and a subscriber (in another process,
    and in the publisher's own) asking for another transport is refused at once with the
    publisher's reason, never a driver error or a silence: a VMM pool (cuda-vmm alone), a pool
    of CUDA arrays (eglstream alone), a pool of one frame (cuda-ipc alone: an EGLStream would keep
    it). A subscriber of the transport offered gets every byte."""
    if case != "array" and eglcuda.get_device(0).info.integrated:
        pytest.skip("CUDA IPC is not available on an integrated GPU (Tegra)")
    name, path = topic
    seed = 6
    options, fmt, served, refused = {
        "cuda-vmm": ({"transports": ["cuda-vmm"]}, "NV12", "cuda-vmm",
                     {"cuda-ipc": "the legacy CUDA IPC calls export cuMemAlloc memory only",
                      "eglstream": "an EGLStream producer cannot present VMM memory"}),
        "array": ({"layout": "array"}, "ARGB", "eglstream",
                  {"cuda-ipc": "CUDA-array frames cannot be shared through CUDA IPC"}),
        "one-frame": ({"pool": 1, "max_pool": 1}, "NV12", "cuda-ipc", {"eglstream": r"max_pool >= 2"}),
    }[case]
    with eglcuda.Publisher(name, 320, 240, fmt, path=path, every_timeout=10.0, **options) as pub:
        assert listed_transports(path) == [served]
        answers = ask(name, path, *refused, "auto")
        for transport, why in refused.items():
            kind, message, code, seconds = answers[transport]
            assert (kind, code) == ("Refused", int(protocol.Reason.UNSUPPORTED)), answers[transport]
            assert f"{transport}: not offered by this publisher (it offers {served})" in message, message
            assert why in message and "CUDA_ERROR" not in message and seconds < 5, message
        if "eglstream" in refused:  # in the publisher's own process too
            started = time.monotonic()
            with pytest.raises(eglcuda.Refused, match=refused["eglstream"]) as raised:
                eglcuda.Subscriber(name, path=path, transport="eglstream", timeout=10)
            assert raised.value.code == protocol.Reason.UNSUPPORTED and time.monotonic() - started < 5
        assert answers["auto"][:2] == ["joined", served]
        if case == "array":
            return  # (topics_peer.py checks pitch-linear frames; tests/gpu/test_glstream.py reads arrays)
        peer = Peer("subscribe", name, path, "--seed", str(seed), "--count", "5")
        try:
            assert peer.wait_for(lambda m: m["event"] == "ready")["transport"] == served
            for seq in range(5):
                put(pub, seq, seed)
            peer.wait_for(lambda m: m["event"] == "done")
            assert [m["seq"] for m in peer.got()] == list(range(5))
            assert_all_ok(peer)
        finally:
            peer.stop()


# ---- joining and leaving ---------------------------------------------------------------------------

def test_late_join_leave_and_rejoin(display, transport, topic):
    name, path = topic
    seed = 3
    with eglcuda.Publisher(name, 640, 480, "NV12", path=path, every_timeout=10.0, **offered(transport)) as pub:
        feeder = Feeder(pub, seed, rate=200)
        try:
            for round_ in range(3):
                published_before = feeder.count
                peer = Peer("subscribe", name, path, "--transport", transport, "--seed", str(seed), "--count", "15")
                try:
                    peer.wait_for(lambda m: m["event"] == "done")
                    seqs = [m["seq"] for m in peer.got()]
                    assert seqs[0] >= published_before, (round_, seqs[0], published_before)
                    assert seqs == list(range(seqs[0], seqs[0] + 15))
                    assert_all_ok(peer)
                    assert peer.process.wait(30) == 0
                finally:
                    peer.stop()
        finally:
            feeder.stop()
        put(pub, feeder.count, seed)
        assert pub.subscribers == [] and pub.dropped == []  # each one left with a goodbye


# ---- crashes ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("qos", ["every", "latest"])
def test_subscriber_killed_while_others_receive(display, transport, topic, qos):
    name, path = topic
    seed = 4
    with eglcuda.Publisher(name, 1920, 1080, "NV12", path=path, every_timeout=5.0, **offered(transport)) as pub:
        victim = Peer("subscribe", name, path, "--transport", transport, "--qos", qos, "--hold", "1",
                      "--queue", "2", "--sleep-ms", "5", "--seed", str(seed))
        witness = Peer("subscribe", name, path, "--transport", transport, "--qos", qos, "--seed", str(seed))
        try:
            for peer in (victim, witness):
                peer.wait_for(lambda m: m["event"] == "ready")
            feeder = Feeder(pub, seed, rate=300)
            try:
                victim.wait_for(lambda m: m["event"] == "got" and m["seq"] >= 10)
                victim.kill()  # while holding frames
                killed_at = time.monotonic()
                target = feeder.count + 100
                witness.wait_for(lambda m: m["event"] == "got" and m["seq"] >= target, timeout=60)
            finally:
                feeder.stop()
            after = [d for when, d in feeder.durations if when > killed_at]
            assert max(after) < 1.0, f"a publish took {max(after):.2f} s after the kill"
            seqs = [m["seq"] for m in witness.got()]
            if qos == "every":
                assert seqs == list(range(len(seqs)))  # no gap across the kill
            else:
                assert seqs == sorted(set(seqs)) and seqs[-1] >= target  # still the newest frames
            assert_all_ok(witness)
            (record,) = [d for d in pub.dropped if d.pid == victim.process.pid]
            assert "killed" in record.reason
            assert [s.pid for s in pub.subscribers] == [witness.process.pid]
        finally:
            for peer in (victim, witness):
                peer.stop()


def test_a_subscriber_handing_back_the_publishers_own_event_as_its_done_event_costs_the_others_nothing(display, topic):
    """A cuda-ipc subscriber whose every release names, as its "done" event, the publisher's own
    event of that slot: the publisher goes on publishing (no publish waits a second), a witness
    beside it gets every frame in order and every byte right, and the liar is dropped with a
    reason or served as any other; the publisher never crashes or hangs on its own event."""
    name, path = topic
    seed = 6
    with eglcuda.Publisher(name, 640, 480, "NV12", path=path, pool=2, every_timeout=2.0) as pub:
        liar = Peer("subscribe", name, path, "--transport", "cuda-ipc", "--lie-done-event", "--seed", str(seed))
        witness = Peer("subscribe", name, path, "--transport", "cuda-ipc", "--seed", str(seed))
        try:
            for peer in (liar, witness):
                peer.wait_for(lambda m: m["event"] == "ready")
            feeder = Feeder(pub, seed, rate=300)
            try:
                witness.wait_for(lambda m: m["event"] == "got" and m["seq"] >= 300, timeout=60)
            finally:
                feeder.stop()
            assert max(d for _, d in feeder.durations) < 1.0
            seqs = [m["seq"] for m in witness.got()]
            assert seqs == list(range(len(seqs)))
            assert_all_ok(witness)
            liar_dropped = [d for d in pub.dropped if d.pid == liar.process.pid]
            served = [s.pid for s in pub.subscribers]
            assert witness.process.pid in served
            assert liar_dropped or liar.process.pid in served, (pub.dropped, served)
        finally:
            for peer in (liar, witness):
                peer.stop()


def test_subscriber_killed_with_gpu_work_queued_behind_its_release(display, topic):
    """cuda-ipc: the victim queues a 300 ms kernel reading each frame before releasing it (its
    done event is recorded behind the kernel), then dies. The publisher must not wait on it."""
    pytest.importorskip("cupy")
    if eglcuda.get_device(0).info.integrated:
        pytest.skip("CUDA IPC is not available on an integrated GPU")
    name, path = topic
    seed = 12
    with eglcuda.Publisher(name, 640, 480, "NV12", path=path, pool=4, every_timeout=5.0) as pub:
        victim = Peer("subscribe", name, path, "--transport", "cuda-ipc", "--kernel-ms", "300", "--seed", str(seed))
        witness = Peer("subscribe", name, path, "--transport", "cuda-ipc", "--seed", str(seed))
        try:
            for peer in (victim, witness):
                peer.wait_for(lambda m: m["event"] == "ready")
            feeder = Feeder(pub, seed, rate=200)
            try:
                victim.wait_for(lambda m: m["event"] == "got" and m["seq"] >= 3)
                victim.kill()
                target = feeder.count + 60
                witness.wait_for(lambda m: m["event"] == "got" and m["seq"] >= target, timeout=30)
            finally:
                feeder.stop()
            assert_all_ok(witness)
        finally:
            for peer in (victim, witness):
                peer.stop()


def test_publisher_killed_and_restarted_while_the_subscriber_waits(display, transport, topic):
    name, path = topic
    first = Peer("publish", name, path, "--width", "1280", "--height", "720", "--seed", "21", "--rate", "200",
                 *offer_args(transport))
    second = None
    try:
        first.wait_for(lambda m: m["event"] == "ready")
        sub = eglcuda.Subscriber(name, qos="every", path=path, transport=transport, timeout=20)
        try:
            old = sub.info.instance
            for _ in range(10):
                with sub.receive(10) as message:
                    ok, why = check(message, 21)
                    assert ok, why
            first.kill()
            started = time.monotonic()
            with pytest.raises(eglcuda.StreamDisconnected) as caught:
                while True:
                    with sub.receive(10) as message:  # frames already on their way may come: intact
                        ok, why = check(message, 21)
                        assert ok, why
            assert not isinstance(caught.value, eglcuda.Dropped)
            assert time.monotonic() - started < 10
            second = Peer("publish", name, path, "--width", "1280", "--height", "720", "--seed", "22", "--rate", "200",
                          *offer_args(transport))
            info = sub.wait_for_publisher(timeout=60)
            assert info.instance != old and info.publisher_pid == second.process.pid
            assert info.transport == transport
            for _ in range(10):
                with sub.receive(10) as message:
                    ok, why = check(message, 22)
                    assert ok, why
        finally:
            sub.close()
    finally:
        first.stop()
        if second is not None:
            second.stop()


# ---- other GPUs, GL ------------------------------------------------------------------------------------

@pytest.mark.parametrize("devices", [(0, 1), (1, 0)], ids=["pub0-sub1", "pub1-sub0"])
def test_subscriber_on_another_gpu(display, transport, topic, devices):
    if eglcuda._bind.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")
    if transport == "cuda-vmm":
        pytest.skip("cuda-vmm maps the pool on the publisher's GPU only (a subscriber elsewhere takes another transport)")
    publisher_device, subscriber_device = devices
    name, path = topic
    seed = 6
    with eglcuda.Publisher(name, 1920, 1080, "NV12", path=path, device=publisher_device, every_timeout=10.0) as pub:
        peer = Peer("subscribe", name, path, "--transport", transport, "--device", str(subscriber_device),
                    "--seed", str(seed), "--count", "30")
        try:
            assert peer.wait_for(lambda m: m["event"] == "ready")["transport"] == transport
            for seq in range(30):
                put(pub, seq, seed)
            peer.wait_for(lambda m: m["event"] == "done")
            assert [m["seq"] for m in peer.got()] == list(range(30))
            assert_all_ok(peer)
        finally:
            peer.stop()


@pytest.mark.parametrize("qos", ["every", "latest"])
def test_gl_texture_subscriber(display, topic, qos):
    require_extension(display, "EGL_KHR_stream_consumer_gltexture")
    name, path = topic
    seed = 8
    with eglcuda.Publisher(name, 640, 480, "ARGB", path=path, every_timeout=10.0) as pub:
        peer = Peer("gl", name, path, "--qos", qos, "--queue", "2", "--seed", str(seed), "--count", "10")
        try:
            assert peer.wait_for(lambda m: m["event"] == "ready")["transport"] == "eglstream"
            seq = 0
            while peer.process.poll() is None and not any(m["event"] == "done" for m in peer.messages):
                put(pub, seq, seed)
                seq += 1
                time.sleep(0.005)
                assert seq < 2000, "the GL subscriber never got 10 frames"
            peer.wait_for(lambda m: m["event"] == "done")
            assert_all_ok(peer)
            seqs = [m["seq"] for m in peer.got()]
            assert seqs == sorted(set(seqs))
            if qos == "every":
                assert seqs == list(range(10))
        finally:
            peer.stop()


def test_auto_picks_cuda_ipc_across_processes_and_eglstream_in_process(display, topic):
    if eglcuda.get_device(0).info.integrated:
        pytest.skip("on Tegra auto always picks eglstream")
    name, path = topic
    seed = 2
    with eglcuda.Publisher(name, 640, 480, "NV12", path=path) as pub:
        peer = Peer("subscribe", name, path, "--seed", str(seed), "--count", "5")
        local = eglcuda.Subscriber(name, qos="every", path=path, timeout=20)
        try:
            assert peer.wait_for(lambda m: m["event"] == "ready")["transport"] == "cuda-ipc"
            assert local.info.transport == "eglstream"  # its own process cannot open its IPC handles
            for seq in range(5):
                put(pub, seq, seed)
                with local.receive(10) as message:
                    ok, why = check(message, seed)
                    assert ok, why
                    assert message.number is not None
            peer.wait_for(lambda m: m["event"] == "done")
            assert_all_ok(peer)
            listing = subprocess.run([sys.executable, "-m", "eglcuda", "topics", "--json", "--dir",
                                      os.path.dirname(path)], cwd=ROOT, capture_output=True, text=True,
                                     timeout=60)
            assert listing.returncode == 0, listing.stderr
            (entry,) = json.loads(listing.stdout)["topics"]
            assert entry["pid"] == os.getpid() and entry["format"] == "NV12"
            assert "eglstream" in [s["transport"] for s in entry["subscribers"]]
        finally:
            local.close()
            peer.stop()


def test_close_from_another_thread_ends_a_waiting_receive(display, topic):
    """A reader thread waits in receive() on an in-process (EGLStream) subscriber; the main thread
    closes it: the receive ends with ClosedError at once, and the publisher goes on serving a
    second subscriber, every byte checked."""
    name, path = topic
    seed = 4
    with eglcuda.Publisher(name, 320, 240, "NV12", path=path) as pub:
        first = eglcuda.Subscriber(name, qos="every", path=path, timeout=20)
        second = eglcuda.Subscriber(name, qos="every", path=path, timeout=20)
        outcome: list = []

        def wait() -> None:
            try:
                first.receive(30)
                outcome.append("a frame")
            except eglcuda.ClosedError:
                outcome.append("closed")

        reader = threading.Thread(target=wait)
        reader.start()
        time.sleep(0.3)
        started = time.monotonic()
        first.close()
        reader.join(10)
        assert outcome == ["closed"] and time.monotonic() - started < 3
        try:
            for seq in range(5):
                put(pub, seq, seed)
                with second.receive(10) as message:
                    ok, why = check(message, seed)
                    assert ok, why
            deadline = time.monotonic() + 10
            while len(pub.subscribers) > 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert len(pub.subscribers) == 1 and pub.dropped == []
        finally:
            second.close()


# ---- hostile peers ----------------------------------------------------------------------------------------

def test_hostile_peers_are_turned_away_while_a_subscriber_receives(display, transport, topic):
    name, path = topic
    seed = 13
    with eglcuda.Publisher(name, 640, 480, "NV12", path=path, handshake_timeout=1.0, every_timeout=10.0,
                           **offered(transport)) as pub:
        witness = Peer("subscribe", name, path, "--transport", transport, "--seed", str(seed))
        try:
            witness.wait_for(lambda m: m["event"] == "ready")
            feeder = Feeder(pub, seed, rate=200)
            try:
                socks = []
                for data in (b"\x00" * 64, b"GET / HTTP/1.0\r\n\r\n", None,
                             protocol.encode(protocol.Hello(os.getpid(), protocol.Qos.EVERY, 2,
                                                            protocol.ConsumerKind.CUDA, 0, bytes(16), False,
                                                            ("eglstream",), "other"))):
                    sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                    sock.settimeout(10)
                    sock.connect(path)
                    if data is not None:
                        sock.send(data)
                    socks.append(sock)
                for sock in socks:
                    answer = protocol.decode(sock.recv(70000))
                    assert isinstance(answer, protocol.Refuse), answer
                    sock.close()
                if os.geteuid() == 0:
                    os.chmod(os.path.dirname(path), 0o755)
                    os.chmod(path, 0o666)
                    pid = os.fork()
                    if pid == 0:
                        code = 1
                        try:
                            os.setuid(65534)
                            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                            sock.settimeout(10)
                            sock.connect(path)
                            sock.send(protocol.encode(protocol.Hello(
                                os.getpid(), protocol.Qos.EVERY, 2, protocol.ConsumerKind.CUDA, 0, bytes(16), False,
                                ("eglstream",), name)))
                            answer = protocol.decode(sock.recv(70000))
                            code = 0 if isinstance(answer, protocol.Refuse) and "uid 65534" in answer.reason else 3
                        finally:
                            os._exit(code)
                    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
                target = feeder.count + 100
                witness.wait_for(lambda m: m["event"] == "got" and m["seq"] >= target, timeout=60)
            finally:
                feeder.stop()
            seqs = [m["seq"] for m in witness.got()]
            assert seqs == list(range(len(seqs)))
            assert_all_ok(witness)
            assert not pub.dropped
        finally:
            witness.stop()


# ---- leaks ---------------------------------------------------------------------------------------------

def test_a_thousand_join_leave_cycles_leave_descriptors_and_memory_flat(display, transport, topic):
    name, path = topic
    seed = 17
    device = eglcuda.get_device(0)
    with eglcuda.Publisher(name, 640, 480, "NV12", path=path, every_timeout=10.0, **offered(transport)) as pub:
        feeder = Feeder(pub, seed, rate=500)
        try:
            warm = Peer("cycles", name, path, "--transport", transport, "--qos", "latest", "--seed", str(seed),
                        "--count", "20")
            warm.wait_for(lambda m: m["event"] in ("done", "error"), timeout=300)
            warm.stop()
            gc.collect()
            fds = len(os.listdir("/proc/self/fd"))
            free = device.memory_info()[0]
            peer = Peer("cycles", name, path, "--transport", transport, "--qos", "latest", "--seed", str(seed),
                        "--count", "1000")
            try:
                done = peer.wait_for(lambda m: m["event"] in ("done", "error"), timeout=900)
                assert done["event"] == "done", done
                assert done["fds"][0] == done["fds"][1], done
                assert abs(done["free_memory"][0] - done["free_memory"][1]) < 16 << 20, done
            finally:
                peer.stop()
        finally:
            feeder.stop()
        put(pub, feeder.count, seed)
        put(pub, feeder.count + 1, seed)
        assert pub.subscribers == []
        assert len(pub.dropped) == 0, pub.dropped[:3]
        gc.collect()
        assert len(os.listdir("/proc/self/fd")) == fds
        assert abs(device.memory_info()[0] - free) < 16 << 20


def test_publish_from_cupy_arrays(display, topic):
    cupy = pytest.importorskip("cupy")
    name, path = topic
    seed = 30
    with eglcuda.Publisher(name, 1920, 1080, "NV12", path=path) as pub:
        local_check = Peer("subscribe", name, path, "--seed", str(seed), "--count", "5")
        try:
            local_check.wait_for(lambda m: m["event"] == "ready")
            for seq in range(5):
                y, uv = content([(1080, 1920), (540, 960, 2)], seed, seq)
                stacked = cupy.asarray(np.concatenate([y, uv.reshape(540, 1920)]))  # a decoder's (H*3/2, W) output
                stream = cupy.cuda.Stream()
                pub.publish_from(stacked, cuda_stream=stream.ptr, payload=payload_of(seq, seed))
                stream.synchronize()  # the copy out of `stacked` is queued on it
            local_check.wait_for(lambda m: m["event"] == "done")
            assert_all_ok(local_check)
        finally:
            local_check.stop()


_SPIN = r'''
extern "C" __global__ void spin(unsigned long long nanoseconds) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < nanoseconds);
}'''


def test_a_close_waits_for_a_kernel_reading_a_frame_released_on_the_users_stream(display, topic):
    """cuda-ipc: a subscriber reads a frame on a CuPy stream behind a 500 ms kernel, releases it on
    that stream (``release(cuda_stream=)``) and closes at once. The read is behind the release's
    done event, not the subscriber's own stream: the close waits for it before unmapping the slot,
    so the copy holds every byte of the frame, and the CUDA context stays usable."""
    cupy = pytest.importorskip("cupy")
    if eglcuda.get_device(0).info.integrated:
        pytest.skip("CUDA IPC is not available on an integrated GPU (Tegra)")
    name, path = topic
    seed = 23
    spin = cupy.RawKernel(_SPIN, "spin")
    publisher = Peer("publish", name, path, "--width", "640", "--height", "480", "--seed", str(seed),
                     "--rate", "100", "--until-told")
    try:
        publisher.wait_for(lambda m: m["event"] == "ready")
        sub = eglcuda.Subscriber(name, path=path, transport="cuda-ipc", qos="every", timeout=20)
        try:
            message = sub.receive(20)
            planes = message.frame.planes
            expected = content([p.shape for p in planes], seed, message.seq)
            reader = cupy.cuda.Stream(non_blocking=True)
            with reader:
                # Once first: CuPy builds its copy kernels at their first use, which can take
                # longer than the kernel below runs.
                [cupy.from_dlpack(plane).copy() for plane in planes]
                reader.synchronize()
                spin((1,), (1,), (cupy.uint64(500_000_000),))
                copies = [cupy.from_dlpack(plane).copy() for plane in planes]
            assert not reader.done, "the kernel finished before the close: the test proves nothing"
            message.release(reader.ptr)
            started = time.monotonic()
            sub.close()
            closed_in = time.monotonic() - started
        finally:
            sub.close()
        reader.synchronize()
        for index, (copy, want) in enumerate(zip(copies, expected)):
            got = cupy.asnumpy(copy).reshape(want.shape)
            assert np.array_equal(got, want), f"plane {index}: {np.count_nonzero(got != want)} bytes differ"
        assert closed_in > 0.1, f"the close returned after {closed_in:.3f} s, before the read ran"
        cupy.cuda.Device().synchronize()
    finally:
        publisher.stop()


@pytest.mark.parametrize("writer", ["own-stream", "legacy-stream", "blocking-stream-published-as-legacy"])
def test_subscribers_wait_for_a_write_still_running_at_publish(display, topic, writer):
    """cuda-ipc: the publisher queues a 20 ms kernel and then the copies writing each frame, and
    publishes at once. Its publish stream is busy, so the frame's event is recorded (a publish
    from an idle stream records none), and each subscriber reads the frame's own bytes.

    ``own-stream``: written and published on a CuPy stream; ``legacy-stream``: on the legacy default
    stream, published with None; ``blocking-stream-published-as-legacy``: written on a blocking
    stream, published with None (the legacy stream's query and record cover the blocking streams'
    work: measured on driver 580)."""
    cupy = pytest.importorskip("cupy")
    if eglcuda.get_device(0).info.integrated:
        pytest.skip("CUDA IPC is not available on an integrated GPU (Tegra)")
    name, path = topic
    seed, frames = 40, 6
    spin = cupy.RawKernel(_SPIN, "spin")
    work = cupy.cuda.Stream.null if writer == "legacy-stream" else cupy.cuda.Stream(non_blocking=False)
    published_on = work.ptr if writer == "own-stream" else None
    with eglcuda.Publisher(name, 1920, 1080, "NV12", path=path, pool=2) as pub:
        peer = Peer("subscribe", name, path, "--transport", "cuda-ipc", "--seed", str(seed), "--count", str(frames))
        try:
            assert peer.wait_for(lambda m: m["event"] == "ready")["transport"] == "cuda-ipc"
            for seq in range(frames):
                frame = pub.next_frame(timeout=30, cuda_stream=published_on)
                planes = frame.planes
                staged = [cupy.asarray(data.reshape(p.height, p.geometry.row_bytes))
                          for p, data in zip(planes, content([p.shape for p in planes], seed, seq))]
                cupy.cuda.Device().synchronize()  # staged before the kernel: only the kernel delays the copies
                with work:
                    spin((1,), (1,), (cupy.uint64(20_000_000),))
                for plane, source in zip(planes, staged):
                    plane.copy_from_device(source.data.ptr, plane.geometry.row_bytes, cuda_stream=work.ptr)
                assert not work.done, "the kernel finished before the publish: the test proves nothing"
                pub.publish(frame, cuda_stream=published_on, payload=payload_of(seq, seed))
            peer.wait_for(lambda m: m["event"] == "done")
            assert_all_ok(peer)
            assert len(peer.got()) == frames
        finally:
            peer.stop()
            cupy.cuda.Device().synchronize()


_HOLD_THROUGH_THE_DROP = r'''
import json, sys
import numpy as np
import eglcuda
name, path, transport = sys.argv[1:4]
sub = eglcuda.Subscriber(name, path=path, qos="every", transport=transport, timeout=20)
message = sub.receive(20)
print(json.dumps({"event": "held", "sum": int(message.frame.planes[0].to_numpy().sum(dtype=np.uint64))}), flush=True)
sys.stdin.readline()  # (the publisher has dropped this subscriber and written its slot again)
try:
    read = int(message.frame.planes[0].to_numpy().sum(dtype=np.uint64))
except eglcuda.ClosedError as exc:
    read = str(exc)
try:
    sub.receive(5)
    then = "a message"
except eglcuda.EglCudaError as exc:
    then = type(exc).__name__
message.release()
sub.close()
print(json.dumps({"event": "after", "read": read, "then": then}), flush=True)
'''


@pytest.mark.parametrize("pool", ["cuda-ipc", "cuda-vmm"])
def test_a_message_held_past_the_subscribers_drop_raises_instead_of_showing_the_next_frame(display, topic, pool):
    """An ``every`` subscriber in another process holds its only frame past the publisher's
    ``every_timeout`` (a pool of one): the publisher drops it and writes the slot again. The
    held message's plane then raises ClosedError (it used to read the next frame's bytes), and
    receive() raises Dropped."""
    name, path = topic
    rng = np.random.default_rng(7)
    with eglcuda.Publisher(name, 640, 480, "NV12", path=path, pool=1, max_pool=1, every_timeout=0.3,
                           **offered(pool)) as pub:
        sub = JsonPeer(["-c", _HOLD_THROUGH_THE_DROP, name, path, pool])
        try:
            while not pub.subscribers:
                time.sleep(0.01)
            first = [rng.integers(0, 256, (480, 640), np.uint8), rng.integers(0, 256, (240, 320, 2), np.uint8)]
            pub.publish_from(first)
            held = sub.wait_for(lambda m: m["event"] == "held", timeout=60)
            assert held["sum"] == int(first[0].sum(dtype=np.uint64))
            second = [rng.integers(0, 256, (480, 640), np.uint8), rng.integers(0, 256, (240, 320, 2), np.uint8)]
            pub.publish_from(second, timeout=10)  # (waits every_timeout, drops it, writes the slot)
            assert len(pub.dropped) == 1
            sub.send("go")
            after = sub.wait_for(lambda m: m["event"] == "after", timeout=60)
            assert isinstance(after["read"], str) and "dropped" in after["read"], after
            assert after["then"] == "Dropped", after
        finally:
            sub.stop()


def test_publish_from_a_frame_into_a_topic_of_cuda_arrays(display, topic):
    """A ``layout="array"`` topic's pool frames are CUDA arrays: publish_from(frame) copies a
    pitch-linear and a CUDA-array frame into them, and an EGLStream subscriber in this process
    receives every byte."""
    name, path = topic
    rng = np.random.default_rng(8)
    with eglcuda.Publisher(name, 640, 480, "NV12", layout="array", path=path) as pub, \
            eglcuda.Subscriber(name, path=path, qos="every", transport="eglstream", timeout=20) as sub:
        for layout in ("pitch", "array", "pitch", "array"):
            source = eglcuda.Frame.allocate(640, 480, "NV12", layout=layout)
            try:
                data = [rng.integers(0, 256, plane.shape, np.uint8) for plane in source.planes]
                for plane, values in zip(source.planes, data):
                    plane.copy_from(values)
                seq = pub.publish_from(source)
                with sub.receive(20) as message:
                    assert message.seq == seq
                    for plane, values in zip(message.frame.planes, data):
                        assert np.array_equal(plane.to_numpy(), values)
            finally:
                source.close()
