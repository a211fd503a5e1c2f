"""Devices, displays, the loader's test hook, several GPUs and in-process descriptors against the
fake driver; and the fake's own safety net (it notices driver misuse)."""
from __future__ import annotations

import os

import numpy as np
import pytest

import eglcuda
from eglcuda import StreamState

from .harness import fake, fake_driver_test, run_fake
from .kit import assert_frame_equals, connected, display, fill_random, rng


@fake_driver_test
def test_devices_displays_and_the_cuda_device():
    found = eglcuda.devices()
    assert [d.cuda_ordinal for d in found] == [0]
    assert found[0].vendor == "eglcuda fake driver" and not found[0].is_software
    with display() as opened:
        assert opened.version == (1, 5) and opened.cuda_ordinal == 0
        for name in ("EGL_KHR_stream", "EGL_KHR_stream_fifo", "EGL_KHR_stream_cross_process_fd",
                     "EGL_NV_stream_reset", "EGL_EXT_platform_device"):
            assert opened.supports(name), name
        assert not opened.supports("EGL_KHR_stream_consumer_gltexture")
        with pytest.raises(eglcuda.Unsupported, match="EGL_KHR_stream_consumer_gltexture"):
            opened.create_stream(acquire_timeout_us=1000)
        with pytest.raises(eglcuda.UsageError, match="no RGBA8"):  # no GL in the fake
            opened.create_context()
    device = eglcuda.get_device(0)
    assert device.info.name.startswith("Fake CUDA device 0") and device.info.compute_capability == (9, 0)
    assert eglcuda.driver_version() == 13000
    free, total = device.memory_info()
    frame = eglcuda.Frame.allocate(256, 256)
    assert device.memory_info()[0] == free - 256 * 4 * 256
    frame.close()
    with pytest.raises(eglcuda.Unsupported, match="CUDA device 1"):
        eglcuda.get_device(1)
    # EGL extension functions come from eglGetProcAddress, and only listed ones are bound.
    from eglcuda._bind import loader
    assert loader.is_bound("eglCreateStreamKHR") and not loader.is_bound("eglCreateImageKHR")
    assert fake.calls("eglGetProcAddress") > 0


@fake_driver_test
def test_a_cuda_ordinal_past_the_drivers_devices_is_named_as_such():
    # Not "CUDA devices need NVIDIA's EGL": the EGL here is NVIDIA's (fake); there is no device 3.
    with pytest.raises(eglcuda.Unsupported) as info:
        eglcuda.Display.for_cuda_device(3)
    assert str(info.value) == "CUDA device 3 is not available on this machine (the CUDA driver sees 1)"


@fake_driver_test(env={"FAKE_CUDA_DEVICE_COUNT": "2"})
def test_two_gpus_are_matched_by_cuda_ordinal_not_by_index():
    found = eglcuda.devices()
    assert [d.cuda_ordinal for d in found] == [1, 0]  # EGL's order is not CUDA's
    for ordinal in (0, 1):
        with eglcuda.Display.for_cuda_device(ordinal) as opened:
            assert opened.cuda_ordinal == ordinal and opened.device.index == 1 - ordinal


@fake_driver_test(env={"FAKE_CUDA_DEVICE_COUNT": "2"})
def test_a_producer_on_another_gpu_connects_through_its_own_display():
    """The stream on GPU 0's display (cross_process), the consumer on GPU 0, the producer on GPU 1:
    eglcuda opens the stream on GPU 1's display from its descriptor, frames live on GPU 1, every
    byte arrives, and closing the stream closes the sibling display and handle."""
    random = rng()
    fds = len(os.listdir("/proc/self/fd"))
    with display(0) as opened:
        with opened.create_stream(fifo_length=2, cross_process=True) as stream:
            consumer = stream.connect_cuda_consumer()
            producer = stream.connect_cuda_producer(48, 16, device=1)
            assert producer.device.ordinal == 1
            assert fake.count("stream_handles") == 2  # the stream, and the same stream on GPU 1's display
            ring = [producer.allocate_frame() for _ in range(2)]
            assert all(f.device.ordinal == 1 for f in ring)
            for round_ in range(6):
                frame = ring[round_] if round_ < 2 else producer.return_frame(1_000_000)
                expected = fill_random(frame, random)
                producer.present(frame)
                with consumer.acquire(timeout_us=1_000_000) as acquired:
                    assert acquired.device.ordinal == 0
                    assert acquired.number == round_ + 1
                    assert_frame_equals(acquired, expected)
        with opened.create_stream() as plain:
            with pytest.raises(eglcuda.UsageError, match="the consumer is on CUDA device 1"):
                plain.connect_cuda_consumer(device=1)
            plain.connect_cuda_consumer()
            with pytest.raises(eglcuda.UsageError, match="cross_process=True"):
                plain.connect_cuda_producer(16, 8, device=1)
    assert fake.count("stream_handles") == fake.count("connections") == 0
    for frame in ring:
        frame.close()
    assert len(os.listdir("/proc/self/fd")) == fds


@fake_driver_test
def test_a_stream_opened_from_its_descriptor_is_the_same_stream():
    random = rng()
    fds = len(os.listdir("/proc/self/fd"))
    with display() as opened:
        with opened.create_stream(fifo_length=1, cross_process=True) as stream:
            fd = stream.export_fd()
            imported = eglcuda.Stream.from_fd(opened, fd)
            os.close(fd)  # the stream keeps its own duplicate
            assert imported.imported and imported.fifo_length == 1 and imported.reuse_last_frame
            consumer = stream.connect_cuda_consumer()
            assert imported.state is StreamState.CONNECTING
            producer = imported.connect_cuda_producer(16, 8)
            frame = producer.allocate_frame()
            expected = fill_random(frame, random)
            producer.present(frame)
            with consumer.acquire() as acquired:
                assert_frame_equals(acquired, expected)
                assert imported.consumer_frame == stream.consumer_frame == 1
            with pytest.raises(eglcuda.UsageError, match="descriptor"):
                imported.export_fd()
            imported.close()
            assert stream.state is StreamState.DISCONNECTED  # the producer left with its handle
        with pytest.raises(eglcuda.UsageError, match="not open"):
            eglcuda.Stream.from_fd(opened, 987)
        for bad in (2**40, -1, 3.0, "3", True):  # (2**40 was a bare OverflowError from os.dup)
            with pytest.raises(eglcuda.UsageError, match="file descriptor is an int"):
                eglcuda.Stream.from_fd(opened, bad)
        with pytest.raises(eglcuda.EGLError, match="EGL_BAD_STREAM_KHR"):
            with open(os.devnull) as unrelated:
                eglcuda.Stream.from_fd(opened, unrelated.fileno())
    frame.close()  # the fake's device memory is a memfd: the frame's descriptor goes with it
    assert len(os.listdir("/proc/self/fd")) == fds


@fake_driver_test
def test_the_fake_catches_driver_misuse():
    """The safety net under the other tests: what a real driver would refuse is refused and noted."""
    from eglcuda._bind import cuda as driver

    eglcuda.get_device(0).make_current()
    pointer = driver.mem_alloc(1024, "a test buffer")
    assert driver.mem_free(pointer) == 0
    assert driver.mem_free(pointer) == 1  # CUDA_ERROR_INVALID_VALUE: freed twice
    count, first, _ = fake.misuse()
    assert count == 1 and "cuMemFree" in first
    pointer = driver.mem_alloc(1024, "a test buffer")
    with pytest.raises(eglcuda.CUDAError) as info:  # 32 rows of 64 bytes do not fit in 1 KiB
        driver.copy_2d(0, ("host", np.zeros(64 * 32, np.uint8), 64), ("device", pointer, 64), 64, 32, True)
    assert info.value.name == "CUDA_ERROR_ILLEGAL_ADDRESS"
    driver.mem_free(pointer)
    assert fake.misuse()[0] == 2
    fake.reset()


def test_the_loader_hook_names_the_file_it_could_not_open():
    out = run_fake("""
        import eglcuda
        try:
            eglcuda.devices()
        except eglcuda.Unsupported as exc:
            print("EGL:", exc)
        try:
            eglcuda.get_device(0)
        except eglcuda.Unsupported as exc:
            print("CUDA:", exc)
    """, env={"EGLCUDA_LIBEGL": "/nonexistent/libEGL-test.so", "EGLCUDA_LIBCUDA": "/nonexistent/libcuda-test.so"})
    assert "EGL: /nonexistent/libEGL-test.so is not available" in out
    assert "CUDA: /nonexistent/libcuda-test.so is not available" in out


def test_without_the_hook_eglcuda_opens_the_default_sonames():
    out = run_fake("""
        import os
        for name in ("EGLCUDA_LIBEGL", "EGLCUDA_LIBCUDA", "EGLCUDA_LIBVULKAN"):
            os.environ.pop(name)
        from eglcuda._bind import loader
        print(loader._egl.soname, loader._cuda.soname, loader._vulkan.soname)
    """)
    assert out.split() == ["libEGL.so.1", "libcuda.so.1", "libvulkan.so.1"]


@fake_driver_test
def test_a_forked_child_sees_the_parents_endpoints_closed():
    with display() as opened, connected(opened, 16, 8) as (stream, producer, consumer):
        producer.present(producer.allocate_frame())
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child reports through the pipe
            try:
                try:
                    consumer.acquire(timeout_us=0)
                    answer = b"acquired"
                except eglcuda.ClosedError:
                    answer = b"closed" if stream.closed and producer.closed else b"half"
            except BaseException:
                answer = b"error"
            os.write(write, answer)
            os._exit(0)
        os.close(write)
        assert os.read(read, 16) == b"closed"
        os.close(read)
        os.waitpid(pid, 0)
        with consumer.acquire() as acquired:  # the parent goes on
            assert acquired.number == 1
