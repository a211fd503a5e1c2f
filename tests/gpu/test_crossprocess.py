"""EGLStream across processes: producer and consumer in separate, freshly spawned interpreters,
connected through eglcuda's UNIX-socket hand-over. Data on every frame, peers killed with
SIGKILL, bad descriptors, and 200 hand-overs without leaks."""
from __future__ import annotations

import gc
import os
import pathlib
import tempfile
import threading
import time

import numpy as np
import pytest

import eglcuda
from eglcuda import ColorFormat

from ..conftest import _missing, require_extension
from .stream_peer import frame_content
from ..json_peer import JsonPeer

PEER = pathlib.Path(__file__).with_name("stream_peer.py")
# What the consumer is told for a format, where the driver's label differs (same bytes; also in
# one process, see docs/streams.md).
TOLD = {ColorFormat.NV12: ColorFormat.YVU420_SEMIPLANAR}


@pytest.fixture
def display(cuda_display):
    require_extension(cuda_display, "EGL_KHR_stream", "EGL_KHR_stream_fifo", "EGL_KHR_stream_cross_process_fd")
    return cuda_display


@pytest.fixture
def sock_path():
    with tempfile.TemporaryDirectory(prefix="eglcuda-") as folder:
        yield os.path.join(folder, "s")


class Peer(JsonPeer):
    """A spawned stream_peer.py."""

    def __init__(self, role: str, *args: str) -> None:
        super().__init__([str(PEER), role, *args])


def serve(display, path, fifo=4):
    stream = display.create_stream(fifo_length=fifo, cross_process=True)
    consumer = stream.connect_cuda_consumer()
    return stream, consumer


def check(acquired, seed: int) -> None:
    expected = frame_content(acquired, seed, acquired.number)
    for index, (got, want) in enumerate(zip(acquired.to_numpy(), expected)):
        assert got.shape == want.shape
        bad = int(np.count_nonzero(got != want))
        assert bad == 0, f"frame {acquired.number} plane {index}: {bad} of {got.size} bytes differ"


@pytest.mark.parametrize("size, fmt", [((640, 480), ColorFormat.ARGB), ((333, 97), ColorFormat.ARGB),
                                       ((1920, 1080), ColorFormat.NV12)], ids=["640x480-ARGB", "333x97-ARGB", "1080p-NV12"])
def test_every_frame_arrives_from_another_process(display, sock_path, size, fmt):
    seed = int(np.random.default_rng().integers(1, 2**31))
    frames = 40
    stream, consumer = serve(display, sock_path)
    peer = Peer("producer", "--socket", sock_path, "--width", str(size[0]), "--height", str(size[1]),
                "--format", fmt.name, "--frames", str(frames), "--seed", str(seed))
    try:
        pid = eglcuda.serve_stream(stream, sock_path, timeout=30)
        assert pid == peer.process.pid
        numbers = []
        while len(numbers) < frames:
            with consumer.acquire(timeout_us=5_000_000) as acquired:
                assert acquired.is_new, f"frame {acquired.number} acquired twice"
                check(acquired, seed)
                assert (acquired.width, acquired.height) == size
                assert acquired.format == TOLD.get(fmt, fmt), f"sent {fmt.name}, the consumer was told {acquired.format.name}"
                numbers.append(acquired.number)
        assert numbers == list(range(1, frames + 1))  # FIFO: every frame, in order
        assert peer.finish() == 0, peer.stderr()
    finally:
        stream.close()
        if peer.process.poll() is None:
            peer.kill()


FORMATS = [ColorFormat.ARGB, ColorFormat.ABGR, ColorFormat.RGBA, ColorFormat.BGRA, ColorFormat.Y,
           ColorFormat.YUV420_PLANAR, ColorFormat.NV12, ColorFormat.YUV444_PLANAR]


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.name)
def test_each_format_across_processes(display, sock_path, fmt):
    """Bytes and the format the consumer is told, for every format, from another process."""
    seed = int(np.random.default_rng().integers(1, 2**31))
    stream, consumer = serve(display, sock_path, fifo=2)
    peer = Peer("producer", "--socket", sock_path, "--width", "64", "--height", "48", "--format", fmt.name,
                "--frames", "3", "--seed", str(seed))
    try:
        eglcuda.serve_stream(stream, sock_path, timeout=30)
        for _ in range(3):
            with consumer.acquire(timeout_us=5_000_000) as acquired:
                check(acquired, seed)
                assert acquired.format == TOLD.get(fmt, fmt), f"sent {fmt.name}, the consumer was told {acquired.format.name}"
        assert peer.finish() == 0, peer.stderr()
    finally:
        stream.close()
        if peer.process.poll() is None:
            peer.kill()


def test_producer_killed_mid_stream(display, sock_path):
    seed = 7
    stream, consumer = serve(display, sock_path)
    peer = Peer("producer", "--socket", sock_path, "--frames", "0", "--pace-ms", "2", "--seed", str(seed))
    try:
        eglcuda.serve_stream(stream, sock_path, timeout=30)
        for _ in range(10):
            with consumer.acquire(timeout_us=5_000_000) as acquired:
                check(acquired, seed)
        peer.kill()
        started = time.monotonic()
        outcome = None
        while time.monotonic() - started < 10:
            try:
                with consumer.acquire(timeout_us=200_000) as acquired:
                    check(acquired, seed)  # frames already in the FIFO may still come: intact
            except eglcuda.StreamDisconnected as exc:
                outcome = exc
                break
            except eglcuda.Timeout:
                continue
        assert isinstance(outcome, eglcuda.StreamDisconnected), "the consumer never learned the producer died"
        assert time.monotonic() - started < 5
        consumer.close()
    finally:
        stream.close()
        if peer.process.poll() is None:
            peer.kill()
    # The consumer's process carries on: a new stream to a new producer works.
    stream, consumer = serve(display, sock_path)
    peer = Peer("producer", "--socket", sock_path, "--frames", "5", "--seed", "11")
    try:
        eglcuda.serve_stream(stream, sock_path, timeout=30)
        for number in range(1, 6):
            with consumer.acquire(timeout_us=5_000_000) as acquired:
                assert acquired.number == number
                check(acquired, 11)
        assert peer.finish() == 0, peer.stderr()
    finally:
        stream.close()


def test_consumer_killed_mid_stream(display, sock_path):
    peer = Peer("consumer", "--socket", sock_path)
    stream = None
    try:
        stream = eglcuda.receive_stream(display, sock_path, timeout=30)
        assert stream.imported and stream.fifo_length == 4
        with pytest.raises(eglcuda.UsageError, match="only"):  # a received stream is not passed on
            stream.export_fd()
        with pytest.raises(eglcuda.UsageError, match="only its creator"):
            eglcuda.serve_stream(stream, sock_path + "2", timeout=1)
        producer = stream.connect_cuda_producer(640, 480)
        free = [producer.allocate_frame() for _ in range(6)]
        rng = np.random.default_rng()
        for _ in range(10):
            while not free:
                back = producer.return_frame(timeout_us=2_000_000)
                assert back is not None, "the live consumer released nothing for 2 s"
                free.append(back)
            frame = free.pop()
            frame.planes[0].copy_from(rng.integers(0, 256, frame.planes[0].shape, dtype=np.uint8))
            producer.present(frame)
        peer.wait_for(lambda m: m.get("event") == "acquired" and m["number"] >= 5)
        peer.kill()
        started = time.monotonic()
        outcome = None
        while time.monotonic() - started < 10:
            try:
                if free:
                    producer.present(free.pop())
                back = producer.return_frame(timeout_us=200_000)
                if back is not None:
                    free.append(back)
            except eglcuda.StreamDisconnected as exc:
                outcome = exc
                break
        assert isinstance(outcome, eglcuda.StreamDisconnected), "the producer never learned the consumer died"
        assert time.monotonic() - started < 5
    finally:
        if stream is not None:
            stream.close()
        if peer.process.poll() is None:
            peer.kill()


def test_bad_descriptors_and_order(display, sock_path):
    read_end, write_end = os.pipe()
    os.close(write_end)
    with pytest.raises(eglcuda.UsageError, match="not open"):
        eglcuda.Stream.from_fd(display, write_end)
    with pytest.raises(eglcuda.UsageError):
        eglcuda.Stream.from_fd(display, -1)
    with open(os.devnull, "rb") as garbage:  # open, but not a stream
        for fd in (read_end, garbage.fileno()):
            with pytest.raises(eglcuda.EGLError) as info:
                eglcuda.Stream.from_fd(display, fd)
            assert info.value.call == "eglCreateStreamFromFileDescriptorKHR" and info.value.name.startswith("EGL_BAD")
    os.close(read_end)

    with display.create_stream() as plain:  # not cross-process
        plain.connect_cuda_consumer()
        with pytest.raises(eglcuda.UsageError, match="cross_process=True"):
            plain.export_fd()
        with pytest.raises(eglcuda.UsageError, match="cross_process=True"):
            eglcuda.serve_stream(plain, sock_path, timeout=1)
    with display.create_stream(cross_process=True) as shared:
        with pytest.raises(eglcuda.UsageError, match="connect the consumer"):
            eglcuda.serve_stream(shared, sock_path, timeout=1)
        fds = [shared.export_fd(), shared.export_fd()]  # each the caller's own
        assert len(set(fds)) == 2
        for fd in fds:
            os.close(fd)
    with pytest.raises(eglcuda.ClosedError):
        shared.export_fd()
    assert not os.path.exists(sock_path)


def test_nobody_takes_the_stream(display, sock_path):
    stream, consumer = serve(display, sock_path)
    with stream:
        started = time.monotonic()
        with pytest.raises(eglcuda.Timeout, match="no receiver"):
            eglcuda.serve_stream(stream, sock_path, timeout=0.5)
        assert time.monotonic() - started < 3
        assert not os.path.exists(sock_path)


# ---- the legacy default stream between processes -----------------------------------------------

def cuda_driver():
    """cuda-python's driver module (``cuda.bindings`` since 12.6, ``cuda.cuda`` before); the GPU
    tier (EGLCUDA_REQUIRE_GPU=1) fails without it."""
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver  # type: ignore[no-redef]
        except ImportError:
            _missing("needs cuda-python (pip install -e '.[cuda]')", "EGLCUDA_REQUIRE_GPU")
    return driver


def read_words(driver, pointer: int, offsets, stream: int) -> list[int]:
    """32-bit words at ``offsets`` bytes from ``pointer``, copied on ``stream`` and waited for."""
    words = np.zeros(len(offsets), np.uint32)
    for index, offset in enumerate(offsets):
        status, = driver.cuMemcpyDtoHAsync(words.ctypes.data + 4 * index, pointer + offset, 4, driver.CUstream(stream))
        assert status == driver.CUresult.CUDA_SUCCESS, status
    status, = driver.cuStreamSynchronize(driver.CUstream(stream))
    assert status == driver.CUresult.CUDA_SUCCESS, status
    return [int(w) for w in words]


def legacy_writer(sock_path, frames, width=1920, height=1080):
    """A producer process that writes each frame on the legacy default stream without waiting and
    calls ``present(frame)`` (no cuda_stream): eight fills of plane 0 queued, the last one with the
    frame's number in every word."""
    return Peer("producer", "--socket", sock_path, "--width", str(width), "--height", str(height),
                "--frames", str(frames), "--write", "legacy-async", "--passes", "8")


def test_present_on_the_legacy_stream_waits_for_its_writes_across_processes(display, sock_path):
    """``present(frame)`` names the legacy default stream; the driver does not order a present
    there after that stream's work when the consumer is another process (driver 580 without MPS:
    consumers read frames whose writes had not landed, about 10 in 600 through eglcuda). eglcuda
    waits for that stream on the host first, so every word the consumer reads right after its
    acquire is the frame's number."""
    driver = cuda_driver()
    frames = 1000
    stream, consumer = serve(display, sock_path)
    peer = legacy_writer(sock_path, frames)
    try:
        eglcuda.serve_stream(stream, sock_path, timeout=30)
        rng = np.random.default_rng()
        wrong, numbers = [], []
        while len(numbers) < frames:
            with consumer.acquire(timeout_us=5_000_000) as acquired:
                plane = acquired.planes[0]
                size = plane.pitch * acquired.height
                offsets = [0, size - 4] + [int(o) * 4 for o in rng.integers(0, size // 4, 6)]
                got = read_words(driver, plane.pointer, offsets, acquired.cuda_stream)
                if any(word != acquired.number for word in got):
                    wrong.append((acquired.number, got))
                numbers.append(acquired.number)
        assert numbers == list(range(1, frames + 1))
        assert not wrong, f"{len(wrong)} of {frames} frames read before their writes landed: {wrong[:3]}"
        assert peer.finish() == 0, peer.stderr()
    finally:
        stream.close()
        if peer.process.poll() is None:
            peer.kill()


def test_release_on_the_legacy_stream_waits_for_its_reads_across_processes(display, sock_path):
    """A consumer on the legacy default stream (``cuda_stream=0``) queues a copy of each frame
    there, held back on the GPU until a flag that a timer sets 20 ms later, and releases the frame
    at once, without waiting for anything itself. The release waits for that read (eglcuda
    synchronizes the legacy stream on the host before it). Had it not, the consumer would go on
    acquiring, the producer would have the buffer back within a few frames and write later frames
    into it while the copy is still held back. Every copy holds its own frame's number."""
    from eglcuda._bind import cuda as _cuda

    driver = cuda_driver()
    frames, width, height = 40, 1920, 1080
    stream = display.create_stream(fifo_length=4, cross_process=True)
    targets, numbers, timers, flag = [], [], [], None
    peer = None
    try:
        consumer = stream.connect_cuda_consumer(cuda_stream=0)
        flag = _cuda.host_alloc_mapped(4, "allocating the test's flag")
        _cuda.zero_host(flag[0], 4)
        peer = legacy_writer(sock_path, frames, width, height)
        eglcuda.serve_stream(stream, sock_path, timeout=30)
        size = 0
        for index in range(frames):
            with consumer.acquire(timeout_us=5_000_000) as acquired:
                plane = acquired.planes[0]
                if not targets:  # one copy target per frame
                    size = plane.pitch * height
                    for _ in range(frames):
                        status, target = driver.cuMemAlloc(size)
                        assert status == driver.CUresult.CUDA_SUCCESS, status
                        targets.append(target)
                _cuda.stream_wait_value_geq(0, flag[1], index + 1)  # the read waits for the timer
                try:
                    timers.append(threading.Timer(0.02, _cuda.flag_store, (flag[0], index + 1)))
                    timers[-1].start()
                    status, = driver.cuMemcpyDtoDAsync(targets[index], plane.pointer, size, driver.CUstream(0))
                    assert status == driver.CUresult.CUDA_SUCCESS, status
                except BaseException:
                    _cuda.flag_store(flag[0], 1 << 30)  # or the release's synchronize waits for good
                    raise
                numbers.append(acquired.number)
            # released here: with the wait, once the copy has run
        for timer in timers:
            timer.join()
        _cuda.flag_store(flag[0], frames + 1)  # timers may have fired out of order: free every copy
        _cuda.stream_synchronize(0)
        assert numbers == list(range(1, frames + 1))
        wrong = []
        for number, target in zip(numbers, targets):
            got = read_words(driver, int(target), [0, size // 2, size - 4], 0)
            if any(word != number for word in got):
                wrong.append((number, got))
        assert not wrong, f"{len(wrong)} of {frames} copies hold another frame's writes: {wrong[:3]}"
        assert peer.finish() == 0, peer.stderr()
    finally:
        try:
            if peer is not None:
                peer.stop()
            for timer in timers:
                timer.join()
            if flag is not None:
                _cuda.flag_store(flag[0], 1 << 30)  # nothing stays held back on the GPU
                _cuda.stream_synchronize(0)
        finally:
            for target in targets:
                driver.cuMemFree(target)
            if flag is not None:
                _cuda.host_free(flag[0])
            stream.close()


def test_two_hundred_cross_process_cycles_leak_nothing(display, sock_path):
    seed = 1  # what the peer's "cycles" role presents
    count = 200
    peer = Peer("cycles", "--socket", sock_path, "--count", str(count), "--seed", str(seed))
    device = display.cuda_device()
    fds = []
    free_memory = []
    gc.collect()  # earlier tests' peers close their pipes when collected: not during the count
    try:
        for cycle in range(count):
            stream = display.create_stream(cross_process=True)
            consumer = stream.connect_cuda_consumer()
            eglcuda.serve_stream(stream, sock_path, timeout=30)
            with consumer.acquire(timeout_us=5_000_000) as acquired:
                assert acquired.number == 1
                check(acquired, seed)
            stream.close()
            if cycle in (0, count - 1):
                gc.collect()
                fds.append(len(os.listdir("/proc/self/fd")))
                free_memory.append(device.memory_info()[0])
        done = peer.wait_for(lambda m: m.get("event") in ("done", "error"), timeout=60)
        assert done["event"] == "done", done
        assert peer.finish() == 0, peer.stderr()
    finally:
        if peer.process.poll() is None:
            peer.kill()
    assert fds[1] <= fds[0], f"this process: {fds[0]} descriptors after cycle 1, {fds[1]} after {count}"
    assert done["fds"][1] == done["fds"][0], f"peer process: descriptors {done['fds']}"
    # Free memory is the device's, shared by both processes: a leak shows as less of it at the end.
    for side, memory in (("this process", free_memory), ("peer", done["free_memory"])):
        assert memory[0] - memory[1] < 64 << 20, f"{side}: free GPU memory {memory} (cycle 1, cycle {count})"
