"""Misuse the way users make it, on the fake driver: closing a frame whose memory another library
still points into, DLPack's reserved stream values, uploads of the wrong shape, bad pitch
alignments, owners of wrapped memory, fork with a frame held, unbounded timeouts. Each case says
what a user gets: a clear exception before the driver, or memory that stays valid while it is
used."""
from __future__ import annotations

import gc
import os
import threading
import time

import numpy as np
import pytest

import eglcuda
from eglcuda import ClosedError, ColorFormat, UsageError
from eglcuda import cuda_device
from eglcuda._bind import cuda

from .harness import fake, fake_driver_test
from .kit import connected, display, rng, stream_of


@fake_driver_test
def test_closing_a_frame_leaves_its_memory_to_live_views():
    """close() makes the frame unusable at once; its memory is freed only when nothing points into
    it: a DLPack capsule (a tensor of PyTorch or CuPy keeps one), a Plane held elsewhere (a CuPy
    array made through __cuda_array_interface__ holds its plane). Without views, close frees."""
    before = fake.live_allocations()
    for view in ("dlpack", "versioned dlpack", "plane", "host view"):
        frame = eglcuda.Frame.allocate(8, 4, format="NV12", memory="pinned" if view == "host view" else "device")
        plane = frame.planes[0]
        held = {"dlpack": lambda: plane.__dlpack__(stream=None),
                "versioned dlpack": lambda: plane.__dlpack__(max_version=(1, 0)),
                "plane": lambda: plane,
                "host view": lambda: frame.host_array(0)}[view]()
        del plane
        assert len(frame.planes) == 2  # plane 1 made again; plane 0, still held, is the same one
        frame.close()
        assert frame.closed
        with pytest.raises(ClosedError):
            frame.planes
        assert fake.live_allocations() == before + 1, f"{view}: freed under a live view"
        del held  # the frame object lives on: its memory goes with the last view all the same
        assert fake.live_allocations() == before, f"{view}: not freed once the view went"
        del frame
        gc.collect()
        assert fake.live_allocations() == before
    frame = eglcuda.Frame.allocate(8, 4)
    assert frame.planes[0].pointer  # a plane made and dropped is no view
    frame.close()
    assert fake.live_allocations() == before


@fake_driver_test
def test_dlpack_reserved_streams_and_bad_arguments():
    """stream=-1 asks for no ordering (the protocol's value); a float, a bool or another negative
    number, and malformed max_version or dl_device, are refused with UsageError."""
    with stream_of(8, 4) as (_, stream, producer, consumer):
        frame = producer.allocate_frame()
        producer.present(frame)
        acquired = consumer.acquire(timeout_us=1_000_000)
        plane = acquired.planes[0]
        waits = fake.calls("cuStreamWaitEvent")
        plane.__dlpack__(stream=-1)
        assert fake.calls("cuStreamWaitEvent") == waits  # nothing ordered
        plane.__dlpack__()  # None: the legacy default stream waits for the frame (the protocol's default)
        assert fake.calls("cuStreamWaitEvent") == waits + 1
        for bad in (1.5, True, -2, "1", 2**64):
            with pytest.raises(UsageError, match="DLPack stream"):
                plane.__dlpack__(stream=bad)
        with pytest.raises(UsageError, match="max_version"):
            plane.__dlpack__(max_version=1)
        with pytest.raises(UsageError, match="dl_device"):
            plane.__dlpack__(dl_device=5)
        acquired.release()


@fake_driver_test
def test_copy_from_refuses_data_of_the_wrong_shape():
    """A transposed image has the plane's size and the wrong rows: refused, not uploaded scrambled.
    The plane's own shape, and (height, row bytes), are taken."""
    random = rng()
    frame = eglcuda.Frame.allocate(4, 2)
    plane = frame.planes[0]  # (2, 4, 4)
    with pytest.raises(UsageError, match=r"shape \(2, 4, 4\)"):
        plane.copy_from(random.integers(0, 256, (4, 2, 4), dtype=np.uint8))
    data = random.integers(0, 256, (2, 4, 4), dtype=np.uint8)
    plane.copy_from(data.reshape(2, 16))
    assert np.array_equal(plane.to_numpy(), data)
    frame.close()


@fake_driver_test
def test_an_image_upload_of_the_wrong_shape_is_refused():
    """MappedImage.copy_from took any array of the right number of texels: a transposed
    (width, height, channels) image or a flat array was uploaded scrambled. Only the texels'
    shape, or one row per line, is taken. (The fake has no graphics registration: the view is a
    pitch-linear mapping, the native path's kind, over fake device memory.)"""
    from types import SimpleNamespace

    from eglcuda.cuda_device import get_device
    from eglcuda.images.image import TEXTURE_FORMATS, MappedImage

    random = rng()
    width, height = 6, 4
    memory = eglcuda.Frame.allocate(width, height)  # ARGB: 4 bytes a texel, like RGBA8
    mapped = MappedImage.__new__(MappedImage)
    mapped.format, mapped.width, mapped.height, mapped.cuda_stream = TEXTURE_FORMATS[0x8058], width, height, 0
    mapped._kind, mapped._where, mapped._pitch = "device", memory.planes[0].pointer, memory.pitch
    mapped._registration = SimpleNamespace(device=get_device(0))
    for bad in ((width, height, 4), (height * width * 4,), (height, width, 2, 2)):
        with pytest.raises(UsageError, match=r"shape \(4, 6, 4\)"):
            mapped.copy_from(random.integers(0, 256, bad, dtype=np.uint8))
    texels = random.integers(0, 256, (height, width, 4), dtype=np.uint8)
    mapped.copy_from(texels)
    assert np.array_equal(mapped.to_numpy(), texels)
    mapped.copy_from(texels[::-1].reshape(height, width * 4))  # one row per line: the same bytes
    assert np.array_equal(mapped.to_numpy(), texels[::-1])
    memory.close()


@fake_driver_test
def test_pitch_alignment_is_checked_before_allocating():
    before = fake.live_allocations()
    for bad in (0, 3, 2**32, 1.0, "256", True, -256):
        with pytest.raises(UsageError, match="pitch_alignment"):
            eglcuda.Frame.allocate(16, 16, pitch_alignment=bad)
    gc.collect()
    assert fake.live_allocations() == before
    frame = eglcuda.Frame.allocate(16, 16, pitch_alignment=1024)
    assert frame.pitch == 1024
    frame.close()


@fake_driver_test
def test_wrapped_memory_owner_is_only_kept_alive():
    """from_pointer(owner=...) keeps the owner alive with the frame and calls nothing on it."""
    class Owner:
        released = 0

        def release(self) -> None:  # a name many buffer types have; eglcuda must not call it
            Owner.released += 1

    memory = eglcuda.Frame.allocate(8, 4)
    owner = Owner()
    frame = eglcuda.Frame.from_pointer(memory.planes[0].pointer, 8, 4, memory.pitch, owner=owner)
    frame.close()
    del frame
    gc.collect()
    assert Owner.released == 0
    memory.close()


@fake_driver_test
def test_a_frame_held_at_fork_is_not_the_childs():
    """In a child made by fork(), the acquired frame the parent holds is released from the child's
    point of view (no read, no driver release), and the frames the parent presented may be closed
    (the child's copies of them are not in use). The parent goes on with its frame."""
    with stream_of(8, 4) as (_, stream, producer, consumer):
        frame = producer.allocate_frame()
        producer.present(frame)
        held = consumer.acquire(timeout_us=1_000_000)
        releases = fake.calls("cuEGLStreamConsumerReleaseFrame")
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                for attempt in (lambda: held.planes, held.to_numpy, held.release):
                    try:
                        attempt()
                    except ClosedError:
                        continue
                    os.write(2, f"child: {attempt} worked on the parent's frame\n".encode())
                    break
                else:
                    if fake.calls("cuEGLStreamConsumerReleaseFrame") == releases:
                        frame.close()
                        status = 0
            except BaseException as exc:  # noqa: BLE001 - reported through the exit status
                os.write(2, f"child: {exc!r}\n".encode())
            os._exit(status)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert held.planes[0].to_numpy().shape == (4, 8, 4)
        held.release()


@pytest.mark.parametrize("timeout", [float("inf"), 1e30])
@fake_driver_test
def test_close_with_an_unbounded_timeout_waits_for_the_call_inside(timeout):
    """close(timeout=inf) while another thread is inside acquire: close waits for it (here the
    acquire gives up after 0.6 s) instead of giving up at once."""
    with eglcuda.Display.for_cuda_device(0) as display, display.create_stream() as stream:
        consumer = stream.connect_cuda_consumer()
        producer = stream.connect_cuda_producer(4, 4)
        inside = threading.Event()

        def acquire() -> None:
            inside.set()
            try:
                consumer.acquire(timeout_us=600_000)
            except eglcuda.EglCudaError:
                pass

        thread = threading.Thread(target=acquire)
        thread.start()
        inside.wait()
        time.sleep(0.1)
        started = time.monotonic()
        consumer.close(timeout=timeout)
        assert time.monotonic() - started > 0.3
        assert consumer.closed
        thread.join()
        producer.close()


@pytest.mark.parametrize("timeout", [float("inf"), 1e30, float("nan")])
@fake_driver_test
def test_sharing_refuses_timeouts_no_socket_can_hold(timeout):
    with eglcuda.Display.for_cuda_device(0) as display, display.create_stream(cross_process=True) as stream:
        consumer = stream.connect_cuda_consumer()
        path = f"/tmp/eglcuda-misuse-{os.getpid()}.sock"
        with pytest.raises(UsageError, match="timeout"):
            eglcuda.serve_stream(stream, path, timeout=timeout)
        with pytest.raises(UsageError, match="timeout"):
            eglcuda.receive_stream(display, path, timeout=timeout)
        assert not os.path.exists(path)
        consumer.close()


@fake_driver_test
def test_closing_the_stream_while_it_is_served_hands_over_nothing(tmp_path):
    """stream.close() by another thread while serve_stream waits for its receiver: the serving
    stops with ClosedError, and the receiver never gets a descriptor. (serve_stream sent the
    stream's descriptor by number: once close() had closed it, the next file the process opened
    took the number, and the receiver got that file.)"""
    path = str(tmp_path / "s.sock")
    secret = tmp_path / "secret"
    secret.write_bytes(b"not the stream")
    outcome: dict = {}
    with eglcuda.Display.for_cuda_device(0) as display:
        stream = display.create_stream(fifo_length=4, cross_process=True)
        stream.connect_cuda_consumer()
        number = stream._fd_box[0]

        def serve() -> None:
            try:
                outcome["pid"] = eglcuda.serve_stream(stream, path, timeout=10)
            except BaseException as exc:  # noqa: BLE001 - inspected below
                outcome["error"] = exc

        thread = threading.Thread(target=serve)
        thread.start()
        deadline = time.monotonic() + 10
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.005)
        stream.close()
        opened = [os.open(secret, os.O_RDONLY)]
        while opened[-1] != number and len(opened) < 64:  # (lowest free numbers first: up to the stream's)
            opened.append(os.open(secret, os.O_RDONLY))
        try:
            assert opened[-1] == number, (opened, number)  # (the file took the number the stream held)
            with pytest.raises(eglcuda.EglCudaError):
                fd, _, conn = eglcuda.receive_fd(path, timeout=5)
                eglcuda.acknowledge(conn, True)
                got = os.pread(fd, 64, 0)
                os.close(fd)
                raise AssertionError(f"the receiver got a descriptor: {got!r}")
            thread.join(10)
            assert not thread.is_alive()
            assert isinstance(outcome.get("error"), ClosedError), outcome
            assert not os.path.exists(path)
        finally:
            for fd in opened:
                os.close(fd)


class _Foreign:
    """A foreign CUDA array (as CuPy or PyTorch describe theirs) over eglcuda-allocated memory."""

    def __init__(self, pointer: int, shape: tuple, strides: tuple, read_only: bool = False,
                 stream: int | None = None) -> None:
        self.__cuda_array_interface__ = {"shape": shape, "strides": strides, "typestr": "|u1",
                                         "data": (pointer, read_only), "version": 3, "stream": stream}


@fake_driver_test
def test_from_arrays_takes_the_layout_and_read_only_flag_it_is_given():
    """Pixels that overlap (strides (pitch, 1, 1) for four channels) are refused; a read-only
    array makes a read-only frame: eglcuda writes none of it and its views say so."""
    memory = eglcuda.Frame.allocate(8, 4)
    pointer, pitch = memory.planes[0].pointer, memory.pitch
    with pytest.raises(UsageError, match="one after the other"):
        eglcuda.Frame.from_arrays(_Foreign(pointer, (4, 8, 4), (pitch, 1, 1)))
    frame = eglcuda.Frame.from_arrays(_Foreign(pointer, (4, 8, 4), (pitch, 4, 1), read_only=True))
    assert frame.read_only
    plane = frame.planes[0]
    assert plane.__cuda_array_interface__["data"] == (pointer, True)
    with pytest.raises(UsageError, match="read-only"):
        plane.copy_from(np.zeros((4, 8, 4), np.uint8))
    writable = eglcuda.Frame.from_arrays(_Foreign(pointer, (4, 8, 4), (pitch, 4, 1)))
    assert not writable.read_only
    one_channel = eglcuda.Frame.allocate(8, 4, format="Y")
    for shape, strides in (((4, 8), (one_channel.pitch, 1)), ((4, 8, 1), (one_channel.pitch, 1, 1))):
        assert eglcuda.Frame.from_arrays(_Foreign(one_channel.planes[0].pointer, shape, strides), format="Y").width == 8
    del frame, plane, writable
    memory.close()
    one_channel.close()


@fake_driver_test
def test_wrapping_arrays_waits_for_their_exporters_stream_and_publish_from_for_a_frames_writers():
    """``__cuda_array_interface__`` names the stream the array's data is ordered on (CuPy's and
    PyTorch's current stream) and leaves the wait to the consumer: ``from_arrays`` over an array
    whose stream still has work queued (the stand-in libcuda's held stream) waits for it, and
    over one whose stream is idle waits for nothing. A stream of 0, which the protocol forbids, is
    refused. ``publish_from`` of a frame a DLPack consumer wrote on a stream still busy copies
    behind that stream: the legacy default stream the copy is queued on is left waiting for it."""
    import ctypes
    import tempfile

    library = ctypes.CDLL(os.environ["EGLCUDA_LIBCUDA"])
    library.fake_cuda_hold.argtypes = [ctypes.c_void_p, ctypes.c_int]
    library.cuStreamQuery.argtypes = [ctypes.c_void_p]
    not_ready = 600
    memory = eglcuda.Frame.allocate(8, 4)
    pointer, pitch = memory.planes[0].pointer, memory.pitch
    eglcuda.get_device(0).make_current()
    held = cuda.stream_create(non_blocking=True)
    with pytest.raises(UsageError, match="stream"):
        eglcuda.Frame.from_arrays(_Foreign(pointer, (4, 8, 4), (pitch, 4, 1), stream=0))
    syncs = fake.calls("cuStreamSynchronize")
    eglcuda.Frame.from_arrays(_Foreign(pointer, (4, 8, 4), (pitch, 4, 1), stream=held))
    assert fake.calls("cuStreamSynchronize") == syncs, "an idle stream was waited for"
    library.fake_cuda_hold(held, 1)
    eglcuda.Frame.from_arrays(_Foreign(pointer, (4, 8, 4), (pitch, 4, 1), stream=held))
    assert fake.calls("cuStreamSynchronize") == syncs + 1, "the exporter's busy stream was not waited for"
    library.fake_cuda_hold(held, 0)

    path = os.path.join(tempfile.mkdtemp(), "topic")
    source = eglcuda.Frame.allocate(64, 48, format="NV12")
    with eglcuda.Publisher("t", 64, 48, "NV12", path=path) as publisher:
        source.planes[0].__dlpack__(stream=held)  # a consumer that writes the frame on `held`
        library.fake_cuda_hold(held, 1)
        publisher.publish_from(source)
        assert library.cuStreamQuery(None) == not_ready, "publish_from copied before the frame's writer ran"
        library.fake_cuda_hold(held, 0)
    memory.close()
    source.close()


@fake_driver_test
def test_raw_arguments_get_usage_errors_before_the_driver():
    """Addresses, pitches, stream handles and plane indexes of the wrong kind: UsageError, not an
    OverflowError or TypeError from deep inside, and nothing reaches the driver."""
    with stream_of(8, 4) as (_, stream, producer, consumer):
        frame = producer.allocate_frame()
        plane = frame.planes[0]
        target = eglcuda.Frame.allocate(8, 4)
        copies = fake.calls("cuMemcpy2DAsync")
        for pointer, pitch in (("x", 64), (0, 64), (target.planes[0].pointer, -1),
                               (target.planes[0].pointer, 8), (target.planes[0].pointer, True)):
            with pytest.raises(UsageError):
                plane.copy_to_device(pointer, pitch)
            with pytest.raises(UsageError):
                plane.copy_from_device(pointer, pitch)
        assert fake.calls("cuMemcpy2DAsync") == copies
        plane.copy_to_device(target.planes[0].pointer, target.pitch)  # (the count does count)
        assert fake.calls("cuMemcpy2DAsync") == copies + 1
        with pytest.raises(UsageError, match="CUDA stream"):
            producer.present(frame, cuda_stream=-1)
        pinned = eglcuda.Frame.allocate(8, 4, memory="pinned")
        for bad in (True, 1, -1, "0"):
            with pytest.raises(UsageError, match="plane is an index"):
                pinned.host_array(bad)
        assert pinned.host_array(0).shape == (4, 8, 4)
        target.close()


def test_frames_with_live_views_at_exit_are_freed_before_their_context():
    """A pinned or managed frame whose host view, or a device frame whose plane, lives until the
    interpreter exits is freed in eglcuda's exit order, while its CUDA context is still there
    (deferred to the view, the free came after the context's release: driver misuse)."""
    from .harness import run_fake

    out = run_fake("""
        import atexit, ctypes, os

        def report():  # registered first: runs after every exit hook of eglcuda
            egl = ctypes.CDLL(os.environ["EGLCUDA_LIBEGL"])
            egl.fake_misuse_first.restype = ctypes.c_char_p
            print("misuse", egl.fake_misuse_count(), (egl.fake_misuse_first() or b"").decode(), flush=True)

        atexit.register(report)
        import eglcuda
        pinned = eglcuda.Frame.allocate(4, 4, memory="pinned")
        pinned_view = pinned.host_array()
        managed = eglcuda.Frame.allocate(4, 4, memory="managed")
        managed_view = managed.host_array()
        device = eglcuda.Frame.allocate(4, 4)
        plane = device.planes[0]
        print("exiting", flush=True)
    """)
    assert out.splitlines()[-2:] == ["exiting", "misuse 0 "], out


@fake_driver_test
def test_a_frames_loop_left_behind_releases_only_its_own_frame():
    """A frames() loop whose frame was released by hand, and the consumer then acquired another
    outside the loop: dropping (or closing) the loop leaves that other frame alone."""
    with stream_of(8, 4, fifo_length=2) as (_, stream, producer, consumer):
        for frame in [producer.allocate_frame() for _ in range(2)]:
            producer.present(frame)
        loop = consumer.frames(timeout_us=1_000_000)
        next(loop).release()
        mine = consumer.acquire(timeout_us=1_000_000)
        del loop
        gc.collect()
        assert not mine.released, "the loop released a frame it never handed out"
        assert mine.planes[0].to_numpy().shape == (4, 8, 4)
        loop = consumer.frames(timeout_us=1_000_000)
        mine.release()
        last = next(loop)
        loop.close()
        assert last.released  # its own frame, as before


@fake_driver_test
def test_frames_of_a_producer_collected_without_close_can_be_closed():
    """A stream and its endpoints dropped without close() are disconnected by the collector; the
    frames presented on them are then free to close (no producer is left to disconnect)."""
    before = fake.live_allocations()
    with eglcuda.Display.for_cuda_device(0) as display:
        def presented_on_a_dropped_stream() -> eglcuda.Frame:
            stream = display.create_stream(fifo_length=2)
            stream.connect_cuda_consumer()
            producer = stream.connect_cuda_producer(8, 4)
            frame = producer.allocate_frame()
            producer.present(frame)
            return frame

        frame = presented_on_a_dropped_stream()
        gc.collect()
        assert fake.count("connections") == 0
        assert not frame.presented
        frame.close()
        assert frame.closed and fake.live_allocations() == before


@fake_driver_test
def test_the_consumer_side_name_of_nv12_makes_frames_its_producer_takes():
    """YVU420_SEMIPLANAR (what a consumer is told for NV12, the same bytes) given to a producer or to
    a wrapped frame means NV12, as it does to Frame.allocate: a producer presents the frames its
    own allocate_frame makes, and frames made under either name."""
    with display() as opened, opened.create_stream(fifo_length=2) as stream:
        consumer = stream.connect_cuda_consumer()
        producer = stream.connect_cuda_producer(8, 4, format="YVU420_SEMIPLANAR")
        assert producer.format is ColorFormat.NV12
        own = producer.allocate_frame()
        memory = eglcuda.Frame.allocate(8, 4, format="NV12")
        wrapped = eglcuda.Frame.from_pointer([plane.pointer for plane in memory.planes], 8, 4, memory.pitch,
                                             format=ColorFormat.YVU420_SEMIPLANAR)
        assert wrapped.format is ColorFormat.NV12
        for frame in (own, wrapped):
            producer.present(frame)
            consumer.acquire(timeout_us=1_000_000).release()
        producer.close()
        consumer.close()
        wrapped.close()
        memory.close()


@fake_driver_test
def test_an_acquired_frame_cannot_be_copied_past_its_release():
    """copy.copy or pickle of an acquired frame would make a second frame object that is never
    released, whose planes read memory the stream took back: refused."""
    import copy
    import pickle

    with stream_of(8, 4) as (_, stream, producer, consumer):
        producer.present(producer.allocate_frame())
        acquired = consumer.acquire(timeout_us=1_000_000)
        for duplicate in (copy.copy, copy.deepcopy, pickle.dumps):
            with pytest.raises(TypeError, match="cannot be copied"):
                duplicate(acquired)
        acquired.release()


@fake_driver_test(env={"FAKE_CUDA_DEVICE_COUNT": "2"})
def test_memory_of_another_device_is_not_wrapped_as_this_ones():
    """Frame.from_arrays and from_pointer ask the driver where each plane's memory is: another
    device's is a UsageError naming it (it was taken as device 0's: the frame's DLPack device
    said cuda:0 over GPU 1's memory, and a present handed the driver another GPU's memory);
    with device= that device, the same memory is wrapped, and host memory is left as it was."""
    class Foreign:  # what CuPy or PyTorch hands out (the interface names no device)
        def __init__(self, pointer, shape, strides):
            self.__cuda_array_interface__ = {"shape": shape, "strides": strides, "typestr": "|u1",
                                             "data": (pointer, False), "version": 3, "stream": None}

    other = eglcuda.Frame.allocate(8, 4, device=1)
    pointer, pitch = other.planes[0].pointer, other.pitch
    with pytest.raises(eglcuda.UsageError, match="plane 0 is memory of CUDA device 1, .* pass device=1"):
        eglcuda.Frame.from_arrays(Foreign(pointer, (4, 8, 4), (pitch, 4, 1)))
    with pytest.raises(eglcuda.UsageError, match="plane 0 is memory of CUDA device 1"):
        eglcuda.Frame.from_pointer(pointer, 8, 4, pitch)
    wrapped = eglcuda.Frame.from_pointer(pointer, 8, 4, pitch, device=1)
    assert wrapped.device.ordinal == 1 and wrapped.planes[0].__dlpack_device__() == (2, 1)
    wrapped.close()
    other.close()


@fake_driver_test
def test_a_display_stream_or_endpoint_cannot_be_copied_or_pickled():
    """copy.copy, deepcopy and pickle of an object that owns a driver handle are refused naming
    the object (they raised Cython's "no default __reduce__ due to non-trivial __cinit__")."""
    import copy
    import pickle

    with stream_of(8, 4) as (display, stream, producer, consumer):
        for owner in (display, stream, producer, consumer):
            for duplicate in (copy.copy, copy.deepcopy, pickle.dumps):
                with pytest.raises(TypeError, match=f"^a {type(owner).__name__} cannot be copied or pickled: it owns "
                                                    "a driver handle"):
                    duplicate(owner)


@fake_driver_test
def test_bools_and_floats_name_no_format_device_location_or_timeout():
    """An IntEnum takes True for 1 and 1.0 for 1: format=True would be NV12, location=True VIDMEM,
    Display.for_cuda_device(True) device 1. Each is a UsageError, and so is a close() timeout that
    is not a number of seconds (a str was a TypeError, a bool taken as 1 s)."""
    from eglcuda import ResourceLocation

    for bad in (True, False, 1.0, None, [1]):
        with pytest.raises(UsageError, match="color format"):
            eglcuda.Frame.allocate(8, 4, format=bad)
    assert eglcuda.Frame.allocate(8, 4, format=np.int64(ColorFormat.NV12)).format is ColorFormat.NV12
    with pytest.raises(UsageError, match="ordinal"):
        eglcuda.Display.for_cuda_device(True)
    with display() as opened:
        for bad in (True, 1.0):
            with opened.create_stream() as stream, pytest.raises(UsageError, match="location"):
                stream.connect_cuda_consumer(location=bad)
        with opened.create_stream() as stream:
            consumer = stream.connect_cuda_consumer(location=ResourceLocation.VIDMEM)
            producer = stream.connect_cuda_producer(8, 4)
            for endpoint in (producer, consumer):
                for bad in ("1", True, -1.0, float("nan")):
                    with pytest.raises(UsageError, match="timeout"):
                        endpoint.close(timeout=bad)
                assert not endpoint.closed
                endpoint.close(timeout=1)
                assert endpoint.closed


@fake_driver_test
def test_numpy_ordinals_names_in_any_case_and_malformed_array_interfaces():
    """A device ordinal that is a NumPy integer is the ordinal (bools and floats stay refused); a
    memory kind is its name in any case, as formats and layouts are; an object whose
    __cuda_array_interface__ lacks the protocol's keys is a UsageError, not a KeyError."""
    frame = eglcuda.Frame.allocate(8, 4, device=np.int64(0), memory="PINNED")
    assert frame.device.ordinal == 0 and frame.memory is eglcuda.MemoryKind.PINNED
    assert eglcuda.get_device(np.int32(0)) is eglcuda.get_device(0)
    with eglcuda.Display.for_cuda_device(np.int64(0)) as opened:
        assert opened.cuda_device() is eglcuda.get_device(0)
    for bad in (True, 0.0, "0", np.float64(0)):
        with pytest.raises(UsageError, match="ordinal"):
            eglcuda.get_device(bad)
    with pytest.raises(UsageError, match="memory"):
        eglcuda.Frame.allocate(8, 4, memory="vram")

    class Malformed:
        def __init__(self, interface):
            self.__cuda_array_interface__ = interface

    good = {"data": (frame.planes[0].pointer, False), "shape": (4, 8, 4), "typestr": "|u1", "version": 3}
    for broken in ({k: v for k, v in good.items() if k != "data"}, {**good, "data": 5},
                   {k: v for k, v in good.items() if k != "shape"}, {**good, "shape": None},
                   list(good.items()), tuple(good.values()), "data"):  # (not a mapping at all: was an AttributeError)
        with pytest.raises(UsageError, match="malformed"):
            eglcuda.Frame.from_arrays(Malformed(broken))
    frame.close()


@fake_driver_test
def test_numpy_integers_are_sizes_pitches_and_timeouts():
    """Sizes, pitches, plane indices, FIFO lengths and timeouts read from a config array or a
    shape's arithmetic are NumPy integers: each is taken as the int it holds (and kept as a plain
    int), while bools and floats stay refused."""
    width, height = np.int64(8), np.uint16(4)
    frame = eglcuda.Frame.allocate(width, height, format="NV12", pitch_alignment=np.int32(256), memory="pinned")
    assert (frame.width, frame.height) == (8, 4) and type(frame.width) is int and type(frame.height) is int
    data = rng().integers(0, 256, frame.planes[0].shape, dtype=np.uint8)
    frame.planes[0].copy_from(data)
    assert np.array_equal(frame.host_array(np.int64(0)), data)
    copy = eglcuda.Frame.allocate(8, 4, format="NV12")
    frame.planes[0].copy_to_device(np.uint64(copy.planes[0].pointer), np.int64(copy.planes[0].pitch))
    assert np.array_equal(copy.planes[0].to_numpy(), data)
    wrapped = eglcuda.Frame.from_pointer(np.uint64(copy.planes[0].pointer), np.int32(8), np.int32(4),
                                         np.int64(copy.pitch), format="NV12", owner=copy)
    assert type(wrapped.pitch) is int and np.array_equal(wrapped.planes[0].to_numpy(), data)
    for bad in (True, 8.0, np.float32(8), "8"):
        with pytest.raises(UsageError, match="width"):
            eglcuda.Frame.allocate(bad, 4)
        with pytest.raises(UsageError, match="pitch_alignment"):
            eglcuda.Frame.allocate(8, 4, pitch_alignment=bad)
    with display() as opened:
        with opened.create_stream(fifo_length=np.int64(2)) as stream:
            assert stream.fifo_length == 2
            consumer = stream.connect_cuda_consumer()
            producer = stream.connect_cuda_producer(np.int64(8), np.int64(4))
            assert type(producer.width) is int
            sent = eglcuda.Frame.allocate(8, 4)
            payload = rng().integers(0, 256, sent.planes[0].shape, dtype=np.uint8)
            sent.planes[0].copy_from(payload)
            producer.present(sent)
            with consumer.acquire(np.int64(1_000_000)) as got:
                assert np.array_equal(got.planes[0].to_numpy(), payload)
        for bad in (True, 2.0, np.float64(2)):
            with pytest.raises(UsageError, match="fifo_length"):
                opened.create_stream(fifo_length=bad)
    for each in (wrapped, copy, frame):
        each.close()


@fake_driver_test
def test_a_frame_closed_under_a_held_frame_is_freed_at_its_release():
    """close() of a presented frame after its producer disconnected, while the consumer in this
    process still holds it: that frame's memory stays (the held frame reads it) and goes at the
    release; with a FIFO, the frames presented and never acquired go at once."""
    before = fake.live_allocations()
    for fifo_length in (0, 3):
        with stream_of(16, 8, fifo_length=fifo_length) as (_, _, producer, consumer):
            frames = [eglcuda.Frame.allocate(16, 8) for _ in range(3)]
            data = rng().integers(0, 256, frames[0].planes[0].shape, dtype=np.uint8)
            frames[0].planes[0].copy_from(data)
            for frame in frames[:3 if fifo_length else 1]:
                producer.present(frame)
            held = consumer.acquire(1_000_000)
            producer.close()
            for frame in frames:
                frame.close()
            assert fake.live_allocations() == before + 1, "freed under the held frame, or more kept than it"
            assert np.array_equal(held.planes[0].to_numpy(), data)
            held.release()
            assert fake.live_allocations() == before


@fake_driver_test
def test_endpoint_close_takes_numpy_timeouts():
    """close(timeout=) of a CUDA producer or consumer takes NumPy numbers as every other timeout
    does (a Publisher's close took them, an endpoint's refused np.int64(5) and np.float32(1));
    bools, NaN, negative numbers and strings stay refused."""
    with display() as opened:
        for timeout in (np.int64(5), np.uint8(0), np.float32(1)):
            with opened.create_stream() as stream:
                consumer = stream.connect_cuda_consumer()
                producer = stream.connect_cuda_producer(8, 4)
                producer.close(timeout=timeout)
                consumer.close(timeout=timeout)
                assert producer.closed and consumer.closed
        with opened.create_stream() as stream:
            consumer = stream.connect_cuda_consumer()
            for bad in (True, np.bool_(True), float("nan"), np.float64("nan"), -1, np.int64(-1), "1"):
                with pytest.raises(UsageError, match="timeout"):
                    consumer.close(timeout=bad)
            assert not consumer.closed
            consumer.close()


@fake_driver_test
def test_an_array_interface_whose_address_is_no_int_is_malformed():
    """__cuda_array_interface__'s data pointer is an int: a string, a float or a bool there was
    turned into one by int() (True into address 1) and wrapped, or copied from by publish_from;
    it is a malformed interface now. A NumPy integer is an address like any other."""
    memory = eglcuda.Frame.allocate(8, 4)
    pointer, pitch = memory.planes[0].pointer, memory.pitch
    for bad in (str(pointer), float(pointer), True, np.float64(pointer), None):
        with pytest.raises(UsageError, match="malformed"):
            eglcuda.Frame.from_arrays(_Foreign(bad, (4, 8, 4), (pitch, 4, 1)))
    wrapped = eglcuda.Frame.from_arrays(_Foreign(np.uint64(pointer), (4, 8, 4), (pitch, 4, 1)))
    assert wrapped.planes[0].pointer == pointer and type(wrapped.planes[0].pointer) is int
    del wrapped
    memory.close()


@fake_driver_test
def test_a_masked_array_is_refused_and_a_mask_of_none_is_no_mask():
    """__cuda_array_interface__ may carry a mask (version 3: None or an object of its own); a
    consumer that reads every element refuses a masked array rather than reading masked-out
    elements as data. A mask of None is an array like any other."""
    memory = eglcuda.Frame.allocate(8, 4)
    pointer, pitch = memory.planes[0].pointer, memory.pitch
    masked = _Foreign(pointer, (4, 8, 4), (pitch, 4, 1))
    masked.__cuda_array_interface__["mask"] = _Foreign(pointer, (4, 8, 4), (pitch, 4, 1))
    with pytest.raises(UsageError, match="masked"):
        eglcuda.Frame.from_arrays(masked)
    unmasked = _Foreign(pointer, (4, 8, 4), (pitch, 4, 1))
    unmasked.__cuda_array_interface__["mask"] = None
    frame = eglcuda.Frame.from_arrays(unmasked)
    assert frame.planes[0].pointer == pointer
    del frame
    memory.close()


@fake_driver_test
def test_wrapped_planes_must_end_below_2_64():
    """Every wrapped plane ends below 2**64: from_pointer checked only the last plane of a list
    (a U plane at 2**64 - 1 was taken) and from_arrays none; such an address reached the driver."""
    memory = eglcuda.Frame.allocate(8, 4, format="YUV420_PLANAR")
    y, u, v = (plane.pointer for plane in memory.planes)
    with pytest.raises(UsageError, match="ends? below 2"):
        eglcuda.Frame.from_pointer([y, 2**64 - 1, v], 8, 4, memory.pitch, format="YUV420_PLANAR")
    with pytest.raises(UsageError, match="ends? below 2"):
        eglcuda.Frame.from_arrays(_Foreign(2**64 - 8, (4, 8, 4), (32, 4, 1)))
    wrapped = eglcuda.Frame.from_pointer([y, u, v], 8, 4, memory.pitch, format="YUV420_PLANAR", owner=memory)
    assert [plane.pointer for plane in wrapped.planes] == [y, u, v]
    del wrapped
    memory.close()


@fake_driver_test
def test_dlpack_arguments_that_are_numpy_integers_mean_what_their_ints_mean():
    """A NumPy integer is the number it holds in __dlpack__ as everywhere else: stream -1 asks for
    no ordering (it was refused) and 0 is refused as ambiguous (it was taken as the legacy default
    stream); max_version and dl_device pairs of NumPy integers are taken (they were refused)."""
    with stream_of(8, 4) as (_, stream, producer, consumer):
        producer.present(producer.allocate_frame())
        acquired = consumer.acquire(timeout_us=1_000_000)
        plane = acquired.planes[0]
        waits = fake.calls("cuStreamWaitEvent")
        plane.__dlpack__(stream=np.int64(-1))
        assert fake.calls("cuStreamWaitEvent") == waits  # nothing ordered
        with pytest.raises(UsageError, match="ambiguous"):
            plane.__dlpack__(stream=np.int32(0))
        plane.__dlpack__(stream=np.int64(1))
        assert fake.calls("cuStreamWaitEvent") == waits + 1
        capsule = plane.__dlpack__(max_version=(np.int64(1), np.int64(0)), dl_device=(np.int32(2), np.int32(0)))
        assert "dltensor_versioned" in repr(capsule)
        with pytest.raises(BufferError):
            plane.__dlpack__(dl_device=(np.int32(2), np.int32(1)))
        for bad in ((1.0, 0), (True, 0), ("1", "0")):
            with pytest.raises(UsageError, match="max_version"):
                plane.__dlpack__(max_version=bad)
        del capsule
        acquired.release()


@fake_driver_test
def test_allocate_frame_on_a_closed_producer_is_refused():
    """allocate_frame() after the producer, its stream or its display closed raises ClosedError (it
    handed out a new frame of a connection that no longer exists), and allocates nothing."""
    before = fake.live_allocations()
    for closing in ("producer", "stream", "display"):
        with stream_of(8, 4) as (opened, stream, producer, consumer):
            {"producer": producer, "stream": stream, "display": opened}[closing].close()
            with pytest.raises(ClosedError, match="disconnected"):
                producer.allocate_frame()
            with pytest.raises(ClosedError, match="disconnected"):
                producer.allocate_frame(format="NV12", layout="array")
            assert "closed" in repr(producer)
        gc.collect()
        assert fake.live_allocations() == before, f"{closing}: a frame was allocated"


@fake_driver_test
def test_a_closed_or_released_frame_is_still_true():
    """``if frame:`` is True for every frame object, open or not, as for any object: it raised
    ClosedError on a closed Frame or a released AcquiredFrame (truth went through len(), which
    reads the planes)."""
    frame = eglcuda.Frame.allocate(8, 4, format="NV12")
    assert frame and len(frame) == 2
    frame.close()
    assert frame
    assert bool(frame) is True
    with pytest.raises(ClosedError):
        len(frame)  # the planes are gone all the same
    with stream_of(8, 4) as (_, stream, producer, consumer):
        producer.present(producer.allocate_frame())
        acquired = consumer.acquire(timeout_us=1_000_000)
        assert acquired and len(acquired) == 1
        acquired.release()
        assert acquired
        assert bool(acquired) is True
        with pytest.raises(ClosedError):
            len(acquired)


@pytest.mark.parametrize("fifo_length", [0, 2])
@fake_driver_test
def test_frames_after_the_producer_disconnected_are_not_numbered_from_its_presents(fifo_length):
    """A producer in this process presents a frame and disconnects before the consumer acquires it
    (the stream drops it). The consumer's next acquire hands back the frame it held: it was
    numbered as the dropped one and called new (from the producer's present counts), so a loop saw
    frames 1, 2, 1, each new. The stream's own counter is asked instead: no new frame, the producer
    is gone, StreamDisconnected; a frames() loop yields nothing."""
    with stream_of(8, 4, fifo_length=fifo_length) as (_, stream, producer, consumer):
        frames = [producer.allocate_frame() for _ in range(2)]
        producer.present(frames[0])
        held = consumer.acquire(timeout_us=1_000_000)
        assert (held.number, held.is_new) == (1, True)
        producer.present(frames[1])
        producer.close()
        with pytest.raises(eglcuda.StreamDisconnected, match="last frame 1"):
            consumer.acquire_next(timeout_us=1_000)
        assert held.released
        assert [(frame.number, frame.is_new) for frame in consumer.frames(timeout_us=1_000)] == []


@fake_driver_test
def test_a_copied_plane_is_the_plane_and_keeps_the_memory_alive():
    """copy.copy(plane) made a second plane object the frame did not know of: a DLPack tensor made
    from it outlived the memory (close() freed it under the tensor). The copy is the plane itself;
    a deep copy or a pickle, which would be a view of nothing, is refused."""
    import copy
    import pickle

    before = fake.live_allocations()
    frame = eglcuda.Frame.allocate(8, 4)
    duplicate = copy.copy(frame.planes[0])
    assert duplicate is frame.planes[0]
    capsule = duplicate.__dlpack__(stream=None)
    del duplicate
    frame.close()
    assert fake.live_allocations() == before + 1, "freed under a live DLPack capsule"
    del capsule
    assert fake.live_allocations() == before
    frame = eglcuda.Frame.allocate(8, 4)
    plane = frame.planes[0]
    for duplicate in (copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="plane cannot be"):
            duplicate(plane)
    for duplicate in (copy.copy, copy.deepcopy, pickle.dumps):  # the frame neither, in words of its own
        with pytest.raises(TypeError, match="Frame cannot be copied"):
            duplicate(frame)
    del plane
    frame.close()
    assert fake.live_allocations() == before


@fake_driver_test
def test_a_consumers_own_cuda_stream_is_not_handed_out_after_its_close():
    """A consumer made without ``cuda_stream=`` makes its own stream and destroys it at its close:
    ``consumer.cuda_stream`` then raised nothing and handed out the destroyed handle, which the
    driver may give to the next stream made. It raises ClosedError; a caller's stream is the
    caller's, and stays readable."""
    with display() as opened:
        stream = opened.create_stream()
        consumer = stream.connect_cuda_consumer()
        own = consumer.cuda_stream
        assert own and fake.count("cuda_streams") >= 1
        consumer.close()
        with pytest.raises(ClosedError, match="destroyed at its close"):
            consumer.cuda_stream
        stream.close()

        streams = fake.count("cuda_streams")
        mine = cuda.stream_create()
        try:
            stream = opened.create_stream()
            consumer = stream.connect_cuda_consumer(cuda_stream=mine)
            assert consumer.cuda_stream == mine
            stream.close()
            assert consumer.closed and consumer.cuda_stream == mine
            assert fake.count("cuda_streams") == streams + 1  # (the caller's, still there)
        finally:
            cuda.stream_destroy(mine)


@fake_driver_test
def test_frame_numbers_is_true_or_false():
    """``frame_numbers`` went into a C boolean: "no", "False" or 0.5 connected a consumer that
    numbered its frames. Anything but True or False is a UsageError, and connects nothing."""
    with display() as opened, opened.create_stream() as stream:
        for bad in ("no", "False", 0.5, None, 1):
            with pytest.raises(UsageError, match="frame_numbers is True or False"):
                stream.connect_cuda_consumer(frame_numbers=bad)
        assert stream.consumer is None
        consumer = stream.connect_cuda_consumer(frame_numbers=np.bool_(False))
        assert consumer.frame_numbers is False


@fake_driver_test
def test_stream_options_are_true_or_false():
    """cross_process="no" exported the stream's descriptor and reuse_last_frame=0 asked the
    driver for a stream without reuse: a flag is True or False (NumPy's too), before EGL."""
    with display() as opened:
        for option in ("cross_process", "reuse_last_frame"):
            for bad in ("no", 0, None):
                with pytest.raises(UsageError, match=f"{option} is True or False"):
                    opened.create_stream(**{option: bad})
        with opened.create_stream(cross_process=np.bool_(False), reuse_last_frame=np.bool_(True)) as stream:
            assert stream.reuse_last_frame is True


def test_a_gl_frame_cannot_be_copied_past_its_release():
    """copy.copy of a GLFrame made a frame its consumer's release did not reach: it stayed
    unreleased, and its texture showed whichever frame the stream latched later. Refused, as for
    CUDA frames."""
    import copy
    import pickle

    from eglcuda.streams.gl import GLFrame

    frame = GLFrame(None, 1, True)  # type: ignore[arg-type]  # (no consumer is asked)
    for duplicate in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="GLFrame cannot be copied"):
            duplicate(frame)


@fake_driver_test(env={"FAKE_FIFO_WAIT_MS": "30000"})
def test_closing_the_stream_ends_a_present_that_waits_on_a_full_fifo():
    """stream.close() closed the producer first, which waited 10 s for a present into a full FIFO
    (it waits for the consumer) and raised Timeout, the stream left open: the consumer goes first."""
    with stream_of(8, 4, fifo_length=1) as (_, stream, producer, consumer):
        a, b = producer.allocate_frame(), producer.allocate_frame()
        producer.present(a)
        presenting = threading.Thread(target=producer.present, args=(b,), daemon=True)
        presenting.start()
        deadline = time.monotonic() + 5
        while fake.calls("cuEGLStreamProducerPresentFrame") < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.05)  # (inside the driver's wait for room)
        started = time.monotonic()
        stream.close()
        assert time.monotonic() - started < 2
        assert stream.closed and producer.closed and consumer.closed
        presenting.join(10)
        assert not presenting.is_alive()


@pytest.mark.parametrize("fused", [False, True], ids=["present", "present_and_return"])
@fake_driver_test(env={"FAKE_FIFO_WAIT_MS": "5000"})
def test_a_frame_is_not_freed_while_its_first_present_waits(fused):
    """A present into a full FIFO waits in the driver for the consumer, the GIL released. A
    Frame.close() on another thread meanwhile freed the frame's memory (it did not count as
    presented until the driver returned), and the present then handed the driver freed memory:
    the consumer read another allocation's bytes. close() refuses while the present is under
    way; a first present that fails leaves the frame free to close."""
    with stream_of(8, 4, fifo_length=1) as (_, stream, producer, consumer):
        a, b = producer.allocate_frame(), producer.allocate_frame()
        a[0].copy_from(np.full((4, 8, 4), 1, np.uint8))
        b[0].copy_from(np.full((4, 8, 4), 2, np.uint8))
        producer.present(a)
        failed = []

        def present_b() -> None:
            try:
                producer.present_and_return(b) if fused else producer.present(b)
            except BaseException as exc:  # pragma: no cover - reported below
                failed.append(exc)

        presenting = threading.Thread(target=present_b)
        presenting.start()
        deadline = time.monotonic() + 5
        while fake.calls("cuEGLStreamProducerPresentFrame") < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.05)  # (inside the driver's wait for room)
        assert presenting.is_alive()
        with pytest.raises(UsageError, match="presented on a producer"):
            b.close()
        assert not b.closed
        with consumer.acquire() as first:
            assert (first[0].to_numpy() == 1).all()
        presenting.join(10)
        assert not failed
        with consumer.acquire() as second:
            assert (second[0].to_numpy() == 2).all()
    with stream_of(8, 4) as (_, stream, producer, consumer):
        frame = producer.allocate_frame()
        fake.fail("cuEGLStreamProducerPresentFrame", 999)
        with pytest.raises(eglcuda.CUDAError):
            producer.present_and_return(frame) if fused else producer.present(frame)
        assert not frame.presented
        frame.close()  # a present the driver refused does not keep the frame
        assert frame.closed


@fake_driver_test
def test_closing_the_process_wide_device_keeps_its_context():
    """``with eglcuda.get_device(0) as device:`` (or ``device.close()``) released the primary
    context that every frame, stream and display of the device uses: the frames made in the block
    lost their memory, and every later allocation or stream of eglcuda failed with
    CUDA_ERROR_CONTEXT_IS_DESTROYED, since get_device() went on handing out the closed device. The
    device is the process's; it stays open until interpreter exit."""
    retained = fake.count("retained") + (0 if 0 in cuda_device._devices else 1)
    with eglcuda.get_device(0) as device:
        frame = eglcuda.Frame.allocate(8, 4, device=device)
        frame.planes[0].copy_from(np.full((4, 8, 4), 7, np.uint8))
    device.close()
    assert not device.closed and fake.count("retained") == retained
    assert (frame.planes[0].to_numpy() == 7).all()
    with stream_of(8, 4) as (_, stream, producer, consumer):
        later = producer.allocate_frame()
        later.planes[0].copy_from(np.full((4, 8, 4), 9, np.uint8))
        producer.present(later)
        with consumer.acquire() as acquired:
            assert (acquired[0].to_numpy() == 9).all()


@fake_driver_test
def test_an_acquired_frames_plane_index_is_not_cut_to_a_c_int():
    """``acquired[2**32]`` was plane 0 (the index was cut to a C int), ``acquired[2**63]`` an
    OverflowError: an index is read as a Frame's is, and one out of range is an IndexError."""
    with stream_of(8, 4, format="NV12") as (_, stream, producer, consumer):
        frame = producer.allocate_frame()
        producer.present(frame)
        with consumer.acquire(timeout_us=1_000_000) as acquired:
            assert acquired[np.int64(1)] is acquired.planes[1] and acquired[-1] is acquired.planes[1]
            for bad in (2, 2**32, 2**32 + 1, 2**63, -2**64):
                with pytest.raises(IndexError):
                    acquired[bad]
                with pytest.raises(IndexError):
                    frame[bad]


@fake_driver_test
def test_a_numpy_bool_names_no_cuda_stream():
    """``cuda_stream=np.True_`` named stream 1 and ``np.False_`` the legacy default stream (as a
    DLPack stream too, where 0 is refused as ambiguous) while ``True`` was refused: a NumPy bool
    is a flag passed by mistake, refused as Python's is, before the driver."""
    with stream_of(8, 4) as (_, stream, producer, consumer):
        frame = producer.allocate_frame()
        for bad in (np.True_, np.False_):
            with pytest.raises(UsageError, match="CUDA stream"):
                producer.present(frame, cuda_stream=bad)
        assert not frame.presented
        producer.present(frame, cuda_stream=np.uint64(0))  # (a NumPy integer is a handle as before)
        with consumer.acquire(timeout_us=1_000_000) as acquired:
            for bad in (np.True_, np.False_):
                with pytest.raises(UsageError, match="DLPack stream"):
                    acquired.planes[0].__dlpack__(stream=bad)


@fake_driver_test
def test_numpy_bools_and_floats_name_no_resource_location():
    """``location=np.True_`` connected a VIDMEM consumer and ``np.float32(0)`` a SYSMEM one (an
    IntEnum takes them for 1 and 0) while True and 1.0 were refused: each is a UsageError and
    connects nothing; a NumPy integer is the location it holds."""
    from eglcuda import ResourceLocation

    with display() as opened:
        for bad in (np.True_, np.False_, np.float32(0), np.float64(1)):
            with opened.create_stream() as stream:
                with pytest.raises(UsageError, match="location"):
                    stream.connect_cuda_consumer(location=bad)
                assert stream.consumer is None
        with opened.create_stream() as stream:
            assert stream.connect_cuda_consumer(location=np.int64(1)).location is ResourceLocation.VIDMEM


@pytest.mark.parametrize("how", ["to_numpy", "copy_from", "copy_to_device", "copy_from_device"])
@fake_driver_test
def test_a_plane_copied_on_the_default_stream_waits_for_a_write_queued_on_another(how):
    """A producer frame written by a copy on a side stream (a PyTorch stream, say) that still has
    work queued: reading it back (``to_numpy``, ``copy_to_device`` on the frame's stream) or
    writing it again (``copy_from``, ``copy_from_device`` on the legacy stream) is ordered after
    that write, as a ``__cuda_array_interface__`` view is (docs/ordering.md): the legacy default
    stream is left waiting for the side stream."""
    import ctypes

    library = ctypes.CDLL(os.environ["EGLCUDA_LIBCUDA"])
    library.fake_cuda_hold.argtypes = [ctypes.c_void_p, ctypes.c_int]
    library.cuStreamQuery.argtypes = [ctypes.c_void_p]
    not_ready = 600
    eglcuda.get_device(0).make_current()
    side = cuda.stream_create(non_blocking=True)
    frame, source, target = (eglcuda.Frame.allocate(64, 48, "Y") for _ in range(3))
    source.planes[0].copy_from(rng().integers(0, 256, (48, 64), np.uint8))
    library.fake_cuda_hold(side, 1)
    frame.planes[0].copy_from_device(source.planes[0].pointer, source.pitch, cuda_stream=side)
    assert library.cuStreamQuery(None) != not_ready
    plane = frame.planes[0]
    if how == "to_numpy":
        plane.to_numpy()
    elif how == "copy_from":
        plane.copy_from(np.zeros((48, 64), np.uint8))
    elif how == "copy_to_device":
        plane.copy_to_device(target.planes[0].pointer, target.pitch)
    else:
        plane.copy_from_device(target.planes[0].pointer, target.pitch)
    assert library.cuStreamQuery(None) == not_ready, f"{how} did not wait for the write on the side stream"
    library.fake_cuda_hold(side, 0)
    for each in (frame, source, target):
        each.close()


@fake_driver_test
def test_a_consumer_without_frame_numbers_learns_that_its_producer_left():
    """``frame_numbers=False`` (mailbox): while the producer is connected, an acquire with no new
    frame hands out the last one again; once it disconnected, acquire raises StreamDisconnected
    (not the last frame, whose memory the producer may have freed) and a frames() loop ends."""
    random = rng()
    with display() as opened:
        stream = opened.create_stream()
        consumer = stream.connect_cuda_consumer(frame_numbers=False)
        producer = stream.connect_cuda_producer(64, 48, format="Y")
        frames = [producer.allocate_frame() for _ in range(2)]
        for frame in frames:
            sent = [random.integers(0, 256, (48, 64), np.uint8)]
            frame.planes[0].copy_from(sent[0])
            producer.present(frame)
            for _ in range(2):  # the new frame, then the same one again
                with consumer.acquire(1_000_000) as acquired:
                    assert acquired.number is None
                    assert np.array_equal(acquired.to_numpy()[0], sent[0])
        producer.close()
        for frame in frames:
            frame.close()
        with pytest.raises(eglcuda.StreamDisconnected):
            consumer.acquire(1_000_000)
        assert list(consumer.frames(1_000_000)) == []
        assert fake.count("held") == 0
        stream.close()


@fake_driver_test
def test_a_frame_wrapping_an_acquired_plane_is_unusable_after_its_release():
    """Frame.from_arrays over an acquired frame's plane: once that frame is released its memory is
    the stream's again, so the wrapping frame's planes raise ClosedError (they handed out the
    address: a dangling pointer through __cuda_array_interface__ and DLPack). A producer frame's
    plane keeps its memory alive, so a frame wrapping it stays usable after that frame's close."""
    with stream_of(8, 4) as (_, stream, producer, consumer):
        frame = producer.allocate_frame()
        producer.present(frame)
        acquired = consumer.acquire(timeout_us=1_000_000)
        wrapper = eglcuda.Frame.from_arrays(acquired.planes[0])
        assert wrapper.read_only and wrapper.planes[0].pointer == acquired.planes[0].pointer
        plane = wrapper.planes[0]
        acquired.release()
        with pytest.raises(ClosedError, match="released"):
            wrapper.planes
        for use in (lambda: plane.pointer, lambda: plane.__cuda_array_interface__, lambda: plane.__dlpack__(stream=-1),
                    plane.to_numpy):
            with pytest.raises(ClosedError, match="released"):
                use()
        wrapper.close()
        own = eglcuda.Frame.allocate(8, 4)
        kept = eglcuda.Frame.from_arrays(own.planes[0])
        own.close()
        assert kept.planes[0].to_numpy().shape == (4, 8, 4)
        kept.close()


@fake_driver_test
def test_a_wrapper_of_an_acquired_plane_presented_before_is_refused_once_that_frame_is_released():
    """A frame wrapping an acquired plane, presented on another stream and returned: once the
    acquired frame is released, presenting the wrapper again is refused (ClosedError) before the
    driver, though its producer knows it (a known frame skips the full checks). A wrapper of that
    wrapper is unusable too."""
    with stream_of(8, 4) as (opened, _, source_producer, source_consumer):
        with connected(opened, 8, 4) as (_, producer, consumer):
            frame = source_producer.allocate_frame()
            source_producer.present(frame)
            acquired = source_consumer.acquire(timeout_us=1_000_000)
            wrapper = eglcuda.Frame.from_arrays(acquired.planes[0])
            nested = eglcuda.Frame.from_arrays(wrapper.planes[0])
            other = producer.allocate_frame()
            for presented in (wrapper, other):  # (the next present gives the wrapper back)
                producer.present(presented)
                consumer.acquire(timeout_us=1_000_000).release()
            assert producer.return_frame(1_000_000) is wrapper
            acquired.release()
            with pytest.raises(ClosedError, match="released"):
                producer.present(wrapper)
            with pytest.raises(ClosedError, match="released"):
                nested.planes[0].pointer
        nested.close()
        wrapper.close()  # (once its producer is gone)
