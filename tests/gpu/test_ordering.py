"""The ordering race harness: a frame is never written while a reader's GPU work may still read
it, nor read before its writer's GPU work landed, whatever stream that work runs on, with nothing
named to eglcuda (docs/ordering.md).

Readers and writers are slow on purpose (a spin kernel before the copy, tests/gpu/ordering_kit.py)
on every kind of stream: PyTorch's default and a side stream, CuPy's default and a non-blocking
stream, CuPy through ``__cuda_array_interface__`` on both, a raw cuda-python stream and the
per-thread default stream. Pools are the smallest each endpoint allows, so a missing order shows
as wrong bytes: topics through both transports (readers in a subscriber process running the
documented loop, writers in the publisher), ``publish_from`` with a CuPy source, and one-process
EGLStreams (release, acquire_next, present, present_and_return).
"""
from __future__ import annotations

import os
import pathlib
import tempfile

import pytest

import eglcuda

from ..conftest import require_extension
from ..json_peer import JsonPeer
from .ordering_kit import READERS, WRITERS, Kit, as_numpy, missing
from .streamkit import connected
from .topics_peer import content, payload_of

ROOT = pathlib.Path(__file__).resolve().parents[2]
PEER = pathlib.Path(__file__).with_name("ordering_peer.py")
TOPICS_PEER = pathlib.Path(__file__).with_name("topics_peer.py")
FRAMES = 30
SPIN_MS = 12.0
WIDTH, HEIGHT = 640, 480
# The smallest pool each transport works with: an EGLStream consumer keeps its newest frame.
SMALLEST_POOL = {"cuda-ipc": 1, "cuda-vmm": 1, "eglstream": 2}


@pytest.fixture
def display(cuda_display):
    require_extension(cuda_display, "EGL_KHR_stream", "EGL_KHR_stream_fifo", "EGL_KHR_stream_cross_process_fd")
    return cuda_display


@pytest.fixture(params=["cuda-ipc", "cuda-vmm", "eglstream"])
def transport(request, display):
    if request.param == "cuda-ipc" and eglcuda.get_device(0).info.integrated:
        pytest.skip("CUDA IPC is not available on an integrated GPU (Tegra)")
    return request.param


@pytest.fixture
def topic():
    with tempfile.TemporaryDirectory(prefix="eglcuda-ordering-") as folder:
        os.chmod(folder, 0o700)
        yield "t", os.path.join(folder, "t.topic")


def needs(kind: str) -> None:
    lacking = missing(kind)
    if lacking:
        pytest.skip(f"the {kind} case needs {lacking}")


class Peer(JsonPeer):
    wait_timeout = 90.0


def publisher(name: str, path: str, transport: str) -> eglcuda.Publisher:
    pool = SMALLEST_POOL[transport]
    offer = {"transports": ["cuda-vmm"]} if transport == "cuda-vmm" else {}  # (VMM memory: offered alone)
    return eglcuda.Publisher(name, WIDTH, HEIGHT, "NV12", pool=pool, max_pool=pool, every_timeout=30.0, path=path,
                             **offer)


@pytest.mark.parametrize("reader", [*READERS, "subscriber-stream"])
def test_topic_reader_on_any_stream_is_done_before_its_slot_is_written(display, transport, topic, reader):
    """The subscriber runs ``for message in sub: copy = read(message.frame.planes[0])`` with the
    read slow on ``reader``'s stream; the publisher writes each next frame as soon as a slot is
    free. Every copy must hold the frame it was taken from. (``subscriber-stream``: the stream
    given to ``Subscriber(cuda_stream=...)``, read through the plane's raw pointer.)"""
    needs(reader)
    name, path = topic
    seed = 7
    with publisher(name, path, transport) as pub:
        peer = Peer([str(PEER), "--name", name, "--path", path, "--transport", transport, "--reader", reader,
                     "--count", str(FRAMES), "--seed", str(seed), "--spin-ms", str(SPIN_MS)], cwd=str(ROOT))
        try:
            assert peer.wait_for(lambda m: m["event"] == "ready")["transport"] == transport
            seq = 0
            while not any(m.get("event") == "done" for m in peer.messages) and seq < FRAMES + 5:
                try:
                    frame = pub.next_frame(timeout=30)
                except eglcuda.Timeout:
                    break
                for plane, data in zip(frame.planes, content([p.shape for p in frame.planes], seed, seq)):
                    plane.copy_from(data)
                pub.publish(frame, payload=payload_of(seq, seed))
                seq += 1
            done = peer.wait_for(lambda m: m["event"] == "done")
            assert done["got"] == FRAMES
            assert done["wrong"] == [], f"{len(done['wrong'])} of {FRAMES} frames were written again while read"
        finally:
            peer.stop()


@pytest.mark.parametrize("writer", WRITERS)
def test_topic_writer_on_any_stream_lands_before_subscribers_read(display, transport, topic, writer):
    """The publisher writes each frame slowly on ``writer``'s stream through a DLPack or CAI view of
    the pool frame and publishes it with no stream named; the subscriber checks every byte."""
    needs(writer)
    kit = Kit(SPIN_MS)
    name, path = topic
    seed = 11
    with publisher(name, path, transport) as pub:
        peer = Peer([str(TOPICS_PEER), "subscribe", "--name", name, "--path", path, "--transport", transport,
                     "--seed", str(seed), "--count", str(FRAMES), "--queue", "1"], cwd=str(ROOT))
        try:
            assert peer.wait_for(lambda m: m["event"] == "ready")["transport"] == transport
            for seq in range(FRAMES):
                frame = pub.next_frame(timeout=30)
                planes = frame.planes
                for plane, data in zip(planes, content([p.shape for p in planes], seed, seq)):
                    kit.write(writer, plane, data)
                pub.publish(frame, payload=payload_of(seq, seed))
            peer.wait_for(lambda m: m["event"] == "done")
            bad = [m for m in peer.got() if not m["ok"]]
            assert len(peer.got()) == FRAMES
            assert not bad, f"{len(bad)} of {FRAMES} frames read before their write landed: {bad[:3]}"
        finally:
            peer.stop()
            kit.finish()


def test_publish_from_a_cupy_array_written_on_a_side_stream(display, topic):
    """``publish_from`` of a CuPy array written slowly on a non-blocking stream, called inside that
    stream's ``with`` (CuPy's ``__cuda_array_interface__`` names it): the copy waits for it."""
    needs("cupy-nonblocking")
    kit = Kit(SPIN_MS)
    cupy = kit.cupy
    name, path = topic
    seed = 13
    with publisher(name, path, "cuda-ipc") as pub:
        peer = Peer([str(TOPICS_PEER), "subscribe", "--name", name, "--path", path, "--transport", "cuda-ipc",
                     "--seed", str(seed), "--count", str(FRAMES), "--queue", "1"], cwd=str(ROOT))
        try:
            peer.wait_for(lambda m: m["event"] == "ready")
            shapes = [(HEIGHT, WIDTH), (HEIGHT // 2, WIDTH)]  # NV12 as one (H*3/2, W) array
            source = cupy.empty((HEIGHT * 3 // 2, WIDTH), cupy.uint8)
            for seq in range(FRAMES):
                staged = cupy.asarray(cupy.concatenate([cupy.asarray(p.reshape(s)) for p, s in
                                                        zip(content([(HEIGHT, WIDTH), (HEIGHT // 2, WIDTH // 2, 2)],
                                                                    seed, seq), shapes)]))
                cupy.cuda.Device().synchronize()
                with kit.cupy_side:
                    kit.spin()
                    source[...] = staged
                    pub.publish_from(source, payload=payload_of(seq, seed))
            peer.wait_for(lambda m: m["event"] == "done")
            bad = [m for m in peer.got() if not m["ok"]]
            assert len(peer.got()) == FRAMES and not bad, bad[:3]
        finally:
            peer.stop()
            kit.finish()


@pytest.mark.parametrize("step", ["release", "acquire_next"])
@pytest.mark.parametrize("reader", READERS)
def test_stream_reader_on_any_stream_is_done_before_the_frame_comes_back(display, reader, step):
    """One process, a FIFO EGLStream with two frames: the consumer reads each acquired frame
    slowly on ``reader``'s stream and releases it at once (``release()`` or the next
    ``acquire_next()``); the producer writes each frame that comes back at once."""
    needs(reader)
    kit = Kit(SPIN_MS)
    seed = 17
    shape = (HEIGHT, WIDTH, 4)
    with connected(display, WIDTH, HEIGHT, fifo_length=1) as (_stream, producer, consumer):
        free = [producer.allocate_frame() for _ in range(2)]
        copies = []
        for seq in range(FRAMES):
            frame = free.pop() if free else producer.return_frame(timeout_us=5_000_000)
            assert frame is not None, "no frame came back"
            (data,) = content([shape], seed, seq)
            frame.planes[0].copy_from(data)
            producer.present(frame)
            acquired = consumer.acquire_next() if step == "acquire_next" else consumer.acquire()
            copies.append((seq, kit.read(reader, acquired.planes[0])))
            if step == "release":
                acquired.release()
        if step == "acquire_next":
            acquired.release()
        kit.finish()
        wrong = [seq for seq, copy in copies
                 if not (as_numpy(copy).reshape(-1) == content([shape], seed, seq)[0].reshape(-1)).all()]
        assert wrong == [], f"{len(wrong)} of {FRAMES} frames were written again while read"


def test_a_frame_wrapping_cupy_arrays_written_on_a_side_stream_lands_before_the_consumer_reads(display):
    """A CuPy array written slowly on a non-blocking stream, wrapped with ``Frame.from_arrays``
    inside that stream's ``with`` (its ``__cuda_array_interface__`` names the stream), the stream
    dropped (destroyed) and the frame presented with no stream named: what was written before the
    wrap is what the consumer reads. Two buffers in turn, a fresh stream and frame each time (a
    decoder's output wrapped as it comes); every byte checked."""
    needs("cupy-nonblocking")
    kit = Kit(SPIN_MS)
    cupy = kit.cupy
    seed = 29
    shape = (HEIGHT, WIDTH, 4)
    # Rows beyond the frame: room for what the driver may read past the last row.
    buffers = [cupy.zeros((HEIGHT + 16, WIDTH, 4), cupy.uint8)[:HEIGHT] for _ in range(2)]
    wrong = []
    with connected(display, WIDTH, HEIGHT, fifo_length=1, reuse_last_frame=False) as (_stream, producer, consumer):
        for seq in range(FRAMES):
            (data,) = content([shape], seed, seq)
            staged = cupy.asarray(data)
            cupy.cuda.Device().synchronize()
            side = cupy.cuda.Stream(non_blocking=True)
            with side:
                kit.spin()
                buffers[seq % 2][...] = staged
                frame = eglcuda.Frame.from_arrays(buffers[seq % 2], format="ARGB")
            del side
            producer.present(frame)
            with consumer.acquire(timeout_us=5_000_000) as acquired:
                if not (acquired.planes[0].to_numpy() == data).all():
                    wrong.append(seq)
            assert producer.return_frame(timeout_us=5_000_000) is frame
    kit.finish()
    assert wrong == [], f"{len(wrong)} of {FRAMES} wrapped frames were read before their write landed"


@pytest.mark.parametrize("step", ["present", "present_and_return"])
@pytest.mark.parametrize("writer", WRITERS)
def test_stream_writer_on_any_stream_lands_before_the_consumer_reads(display, writer, step):
    """One process, a FIFO EGLStream with two frames: the producer writes each frame slowly on
    ``writer``'s stream and presents it with no stream named; the consumer checks every byte."""
    needs(writer)
    kit = Kit(SPIN_MS)
    seed = 19
    shape = (HEIGHT, WIDTH, 4)
    with connected(display, WIDTH, HEIGHT, fifo_length=1) as (_stream, producer, consumer):
        free = [producer.allocate_frame() for _ in range(2)]
        wrong = []
        back = None
        for seq in range(FRAMES):
            frame = back or (free.pop() if free else producer.return_frame(timeout_us=5_000_000))
            assert frame is not None, "no frame came back"
            (data,) = content([shape], seed, seq)
            kit.write(writer, frame.planes[0], data)
            if step == "present":
                producer.present(frame)
                back = None
            else:
                back = producer.present_and_return(frame, timeout_us=0)
            with consumer.acquire() as acquired:
                if not (acquired.planes[0].to_numpy() == data).all():
                    wrong.append(seq)
        kit.finish()
        assert wrong == [], f"{len(wrong)} of {FRAMES} frames were read before their write landed"
