"""EGLSync <-> CUDA on the NVIDIA display: ordering under load in both directions, the issuing
thread never blocked, timeouts, teardown with work in flight, and no threads or handles left."""
from __future__ import annotations

import gc
import time

import numpy as np
import pytest

import eglcuda
from eglcuda import ServerWaitPath, SyncPath
from eglcuda.syncs.sync import pending_waiters

from .test_stream import open_fds

KERNELS = r"""
extern "C" __global__ void spin_then_copy(const unsigned int *src, unsigned int *dst, int n, long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
    for (int i = threadIdx.x; i < n; i += blockDim.x) dst[i] = src[i];
}
"""


@pytest.fixture
def cupy():
    return pytest.importorskip("cupy")


@pytest.fixture
def spin(cupy):
    kernel = cupy.RawModule(code=KERNELS).get_function("spin_then_copy")
    rate = cupy.cuda.Device().attributes["ClockRate"] * 1000  # cycles per second

    def launch(stream, src, dst, seconds):
        with stream:
            kernel((1,), (256,), (src, dst, np.int32(src.size), np.int64(int(seconds * rate))))

    return launch


@pytest.fixture
def sync_display(cuda_display):
    from ..conftest import require_extension

    require_extension(cuda_display, "EGL_KHR_reusable_sync", "EGL_KHR_fence_sync")
    return cuda_display


def test_paths_on_this_platform(sync_display):
    paths = eglcuda.sync_paths(sync_display)
    assert paths.cuda_to_egl == (SyncPath.NATIVE if sync_display.supports("EGL_NV_cuda_event") else SyncPath.EMULATED)
    assert paths.egl_to_cuda in (SyncPath.NATIVE, SyncPath.EMULATED)
    assert paths.cuda_to_egl_reason and paths.egl_to_cuda_reason


def test_cuda_to_egl_long_kernel_orders_gl_after_it(sync_display, cupy, spin):
    rng = np.random.default_rng()
    stream = cupy.cuda.Stream(non_blocking=True)
    reader = cupy.cuda.Stream(non_blocking=True)
    for seconds in (0.3, 0.3, 0.3):
        src = cupy.asarray(rng.integers(0, 2**32, 1 << 16, dtype=np.uint32))
        dst = cupy.zeros_like(src)
        cupy.cuda.Device().synchronize()
        spin(stream, src, dst, seconds)
        started = time.perf_counter()
        sync = eglcuda.sync_after_cuda(sync_display, cuda_stream=stream)
        issued = time.perf_counter() - started
        assert issued < 0.05  # returned at once, the kernel is still running
        assert not sync.signaled
        assert sync.wait(timeout=10) is True
        waited = time.perf_counter() - started
        assert waited > seconds * 0.7
        # Read on a stream that is not ordered after the kernel: only the sync vouches for it.
        np.testing.assert_array_equal(cupy.asnumpy(dst, stream=reader), cupy.asnumpy(src, stream=reader))
        sync.close()


def test_cuda_to_egl_gl_server_wait(sync_display, cupy, spin):
    from OpenGL import GL

    rng = np.random.default_rng()
    stream = cupy.cuda.Stream(non_blocking=True)
    src = cupy.asarray(rng.integers(0, 2**32, 4096, dtype=np.uint32))
    dst = cupy.zeros_like(src)
    with sync_display.create_context():
        expected, why = eglcuda.gl_server_wait_path(sync_display)
        spin(stream, src, dst, 0.2)
        started = time.perf_counter()
        sync = eglcuda.sync_after_cuda(sync_display, cuda_stream=stream)
        blocked = sync.server_wait(timeout=10)  # GL's later commands wait for the sync
        assert sync.server_wait_path == expected, why
        assert blocked == (expected == ServerWaitPath.CLIENT_WAIT)
        if not blocked:
            assert time.perf_counter() - started < 0.05  # a real server wait: this thread went on
        GL.glFinish()  # returns only after the CUDA work the sync stands for
        assert sync.wait(timeout=1)  # its host-function signal follows within moments
        np.testing.assert_array_equal(cupy.asnumpy(dst), cupy.asnumpy(src))
        sync.close()


def test_gl_server_wait_on_nvidia_needs_no_cpu_wait(sync_display):
    """On the NVIDIA display, CUDA -> GL server waits are GPU-side: natively or through the
    timeline semaphore. (Where this fails, eglcuda would fall back to blocking the thread.)"""
    with sync_display.create_context():
        path, why = eglcuda.gl_server_wait_path(sync_display)
    assert path in (ServerWaitPath.EGL, ServerWaitPath.SEMAPHORE), why


def test_gl_server_wait_holds_gl_back_on_the_gpu(sync_display, cupy, spin):
    """The order of events: GL work queued after the server wait does not complete before the
    CUDA kernel does, while the issuing thread never waited (server wait, GL fence and flush)."""
    from OpenGL import GL

    rng = np.random.default_rng()
    stream = cupy.cuda.Stream(non_blocking=True)
    with sync_display.create_context():
        if eglcuda.gl_server_wait_path(sync_display)[0] == ServerWaitPath.CLIENT_WAIT:
            pytest.skip("no GPU-side GL server wait on this platform")
        for _ in range(3):
            src = cupy.asarray(rng.integers(0, 2**32, 4096, dtype=np.uint32))
            dst = cupy.zeros_like(src)
            cupy.cuda.Device().synchronize()
            GL.glFinish()
            spin(stream, src, dst, 0.3)
            kernel_done = cupy.cuda.Event(disable_timing=True)
            kernel_done.record(stream)
            started = time.perf_counter()
            sync = eglcuda.sync_after_cuda(sync_display, cuda_stream=stream)
            assert sync.server_wait(timeout=10) is False
            # GL work issued after the wait: GL's own fence. (An EGL fence sync would not do: on
            # driver 580 eglCreateSyncKHR blocks while the GL queue waits on a semaphore.)
            after = GL.glFenceSync(GL.GL_SYNC_GPU_COMMANDS_COMPLETE, 0)
            GL.glFlush()
            issued = time.perf_counter() - started
            assert issued < 0.05, f"the issuing thread was held {issued * 1e3:.1f} ms"
            time.sleep(0.1)
            assert not kernel_done.done
            status = GL.glClientWaitSync(after, 0, 0)
            assert status == GL.GL_TIMEOUT_EXPIRED, "GL ran ahead of the CUDA kernel"
            status = GL.glClientWaitSync(after, GL.GL_SYNC_FLUSH_COMMANDS_BIT, 10_000_000_000)
            assert status in (GL.GL_ALREADY_SIGNALED, GL.GL_CONDITION_SATISFIED)
            assert kernel_done.done
            np.testing.assert_array_equal(cupy.asnumpy(dst), cupy.asnumpy(src))
            GL.glDeleteSync(after)
            sync.close()


def test_gl_reads_what_cuda_wrote_hundred_rounds(sync_display, cupy, spin):
    """GL copies on the GPU, after a server wait, a buffer a slow CUDA kernel has just written,
    and the copy holds the kernel's data: 100 rounds of random data. The buffer stays mapped to
    CUDA throughout, so map/unmap cannot order anything: only the sync does. (The copy is GPU
    work queued after the wait; glGetBufferSubData on the shared buffer itself may be served by
    the CPU without waiting for the GL queue.)"""
    from OpenGL import GL

    from eglcuda._bind.cuda import check
    from eglcuda._bind._native import ffi, lib

    rng = np.random.default_rng()
    count = 1 << 14
    stream = cupy.cuda.Stream(non_blocking=True)
    with sync_display.create_context():
        if eglcuda.gl_server_wait_path(sync_display)[0] == ServerWaitPath.CLIENT_WAIT:
            pytest.skip("no GPU-side GL server wait on this platform")
        buffer, copy = (int(name) for name in GL.glGenBuffers(2))
        GL.glBindBuffer(GL.GL_COPY_WRITE_BUFFER, copy)
        GL.glBufferData(GL.GL_COPY_WRITE_BUFFER, 4 * count, None, GL.GL_DYNAMIC_COPY)
        GL.glBindBuffer(GL.GL_COPY_READ_BUFFER, buffer)
        GL.glBufferData(GL.GL_COPY_READ_BUFFER, 4 * count, None, GL.GL_DYNAMIC_COPY)
        GL.glFinish()

        def gl_copy_then_read() -> np.ndarray:
            GL.glCopyBufferSubData(GL.GL_COPY_READ_BUFFER, GL.GL_COPY_WRITE_BUFFER, 0, 0, 4 * count)
            return np.frombuffer(GL.glGetBufferSubData(GL.GL_COPY_WRITE_BUFFER, 0, 4 * count), dtype=np.uint32)
        resource = ffi.new("CUgraphicsResource *")
        sync_display.cuda_device().make_current()
        check(lib.cuGraphicsGLRegisterBuffer(resource, buffer, 0), "cuGraphicsGLRegisterBuffer")
        check(lib.cuGraphicsMapResources(1, resource, ffi.NULL), "cuGraphicsMapResources")
        pointer, size = ffi.new("CUdeviceptr *"), ffi.new("size_t *")
        check(lib.cuGraphicsResourceGetMappedPointer(pointer, size, resource[0]), "cuGraphicsResourceGetMappedPointer")
        memory = cupy.cuda.UnownedMemory(int(pointer[0]), int(size[0]), None)
        dst = cupy.ndarray((count,), dtype=cupy.uint32, memptr=cupy.cuda.MemoryPointer(memory, 0))
        cupy.cuda.Device().synchronize()
        try:
            # Control: without the wait, GL reads the buffer before a slow kernel has written it.
            src = cupy.asarray(rng.integers(0, 2**32, count, dtype=np.uint32))
            spin(stream, src, dst, 0.2)
            seen = gl_copy_then_read()
            assert not np.array_equal(seen, cupy.asnumpy(src)), "GL waited for CUDA by itself: the test proves nothing"
            stream.synchronize()
            wrong_rounds = 0
            for round_ in range(100):
                src = cupy.asarray(rng.integers(0, 2**32, count, dtype=np.uint32))
                spin(stream, src, dst, 0.02 if round_ % 10 == 0 else 0.002)
                with eglcuda.sync_after_cuda(sync_display, cuda_stream=stream) as sync:
                    assert sync.server_wait(timeout=10) is False
                    seen = gl_copy_then_read()
                    if not np.array_equal(seen, cupy.asnumpy(src)):
                        wrong_rounds += 1
                    stream.synchronize()
            assert wrong_rounds == 0, f"{wrong_rounds} of 100 rounds: GL read before CUDA's write landed"
        finally:
            lib.cuGraphicsUnmapResources(1, resource, ffi.NULL)
            lib.cuGraphicsUnregisterResource(resource[0])
            GL.glDeleteBuffers(2, [buffer, copy])


def test_cuda_to_egl_hundred_rounds_random_data(sync_display, cupy, spin):
    rng = np.random.default_rng()
    stream = cupy.cuda.Stream(non_blocking=True)
    reader = cupy.cuda.Stream(non_blocking=True)
    for _ in range(100):
        src = cupy.asarray(rng.integers(0, 2**32, 1024, dtype=np.uint32))
        dst = cupy.zeros_like(src)
        spin(stream, src, dst, 0.002)
        with eglcuda.sync_after_cuda(sync_display, cuda_stream=stream) as sync:
            assert sync.wait(timeout=10)
            np.testing.assert_array_equal(cupy.asnumpy(dst, stream=reader), cupy.asnumpy(src, stream=reader))


def test_egl_to_cuda_stream_waits_without_blocking_the_thread(sync_display, cupy, spin):
    rng = np.random.default_rng()
    stream = cupy.cuda.Stream(non_blocking=True)
    reader = cupy.cuda.Stream(non_blocking=True)
    for _ in range(3):
        src = cupy.asarray(rng.integers(0, 2**32, 4096, dtype=np.uint32))
        dst = cupy.zeros_like(src)
        cupy.cuda.Device().synchronize()
        sync = eglcuda.Sync.reusable(sync_display)
        started = time.perf_counter()
        cpu_started = time.process_time()
        wait = eglcuda.cuda_wait_sync(sync, cuda_stream=stream)
        spin(stream, src, dst, 0.0)  # queued after the wait
        assert time.perf_counter() - started < 0.05
        time.sleep(0.3)
        assert not wait.done()
        assert not np.array_equal(cupy.asnumpy(dst, stream=reader), cupy.asnumpy(src, stream=reader))
        sync.signal()
        stream.synchronize()
        np.testing.assert_array_equal(cupy.asnumpy(dst), cupy.asnumpy(src))
        assert wait.join(5) and not wait.timed_out
        assert time.process_time() - cpu_started < 0.2  # the waiter sleeps, it does not spin
        sync.close()


def test_egl_to_cuda_after_a_gl_fence(sync_display, cupy, spin):
    from OpenGL import GL

    rng = np.random.default_rng()
    stream = cupy.cuda.Stream(non_blocking=True)
    with sync_display.create_context():
        texture = int(GL.glGenTextures(1))
        GL.glBindTexture(GL.GL_TEXTURE_2D, texture)
        for _ in range(20):  # a long GL job
            texels = rng.integers(0, 256, (1024, 1024, 4), dtype=np.uint8)
            GL.glTexImage2D(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA8, 1024, 1024, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, texels)
        fence = eglcuda.Sync.fence(sync_display)
        GL.glFlush()
        src = cupy.asarray(rng.integers(0, 2**32, 4096, dtype=np.uint32))
        dst = cupy.zeros_like(src)
        wait = eglcuda.cuda_wait_sync(fence, cuda_stream=stream)
        spin(stream, src, dst, 0.0)
        stream.synchronize()
        assert fence.signaled and wait.join(5)
        np.testing.assert_array_equal(cupy.asnumpy(dst), cupy.asnumpy(src))
        fence.close()
        GL.glDeleteTextures([texture])


def test_a_sync_that_never_signals_times_out(sync_display, cupy):
    stream = cupy.cuda.Stream(non_blocking=True)
    sync = eglcuda.Sync.reusable(sync_display)
    started = time.perf_counter()
    assert sync.wait(timeout=0.1) is False
    assert time.perf_counter() - started < 2
    wait = eglcuda.cuda_wait_sync(sync, cuda_stream=stream, timeout=0.2)
    assert wait.join(5) and wait.timed_out
    stream.synchronize()  # released, not hung
    sync.close()


def test_closing_a_cuda_sync_before_the_stream_reaches_it(sync_display, cupy, spin):
    stream = cupy.cuda.Stream(non_blocking=True)
    src = cupy.arange(256, dtype=cupy.uint32)
    dst = cupy.zeros_like(src)
    spin(stream, src, dst, 0.2)
    sync = eglcuda.sync_after_cuda(sync_display, cuda_stream=stream)
    sync.close()  # the host function still queued destroys the sync when it runs
    stream.synchronize()
    np.testing.assert_array_equal(cupy.asnumpy(dst), cupy.asnumpy(src))


def test_no_threads_or_handles_left(sync_display, cupy):
    stream = cupy.cuda.Stream(non_blocking=True)

    def cycle():
        sync = eglcuda.sync_after_cuda(sync_display, cuda_stream=stream)
        assert sync.wait(timeout=5)
        other = eglcuda.Sync.reusable(sync_display)
        wait = eglcuda.cuda_wait_sync(other, cuda_stream=stream)
        other.signal()
        assert wait.join(5)
        sync.close()

    for _ in range(20):
        cycle()
    stream.synchronize()
    fds = open_fds()
    for _ in range(300):
        cycle()
    for _ in range(50):  # dropped without close: garbage collection releases them
        eglcuda.sync_after_cuda(sync_display, cuda_stream=stream)
    stream.synchronize()
    gc.collect()
    deadline = time.time() + 5
    while pending_waiters() and time.time() < deadline:
        time.sleep(0.01)
    assert pending_waiters() == 0
    assert open_fds() - fds <= 2


def test_server_waits_in_many_gl_contexts_leave_no_fds(sync_display, cupy, spin):
    """Each GL context imports its own fd of the semaphore; GL owns it and drops it with the
    context: 30 contexts x 10 server waits leave the process's fds flat."""
    from OpenGL import GL

    stream = cupy.cuda.Stream(non_blocking=True)
    src = cupy.arange(1024, dtype=cupy.uint32)
    dst = cupy.zeros_like(src)

    def round_in_a_new_context() -> None:
        with sync_display.create_context():
            for _ in range(10):
                spin(stream, src, dst, 0.0)
                with eglcuda.sync_after_cuda(sync_display, cuda_stream=stream) as sync:
                    sync.server_wait(timeout=10)
            GL.glFinish()

    round_in_a_new_context()  # the bridge and first-use state
    gc.collect()
    before = open_fds()
    for _ in range(30):
        round_in_a_new_context()
    gc.collect()
    stream.synchronize()
    assert open_fds() - before <= 2


def test_emulated_waits_go_on_past_the_flag_word_wrapping(sync_display, cupy, spin):
    """The emulated EGLSync -> CUDA wait makes the stream wait for a 32-bit word to reach one
    more than it held; after 2**32 - 1 waits on one word that is 2**32, which no word holds:
    the wait failed with a bare OverflowError, its slot was lost, and join() waited for good."""
    from eglcuda._bind import cuda
    from eglcuda.syncs import sync as syncs

    rng = np.random.default_rng()
    stream = cupy.cuda.Stream(non_blocking=True)
    pool = syncs._pool(sync_display.cuda_device())
    slot = pool.free[-1]  # the slot the next wait takes
    cuda.flag_store(pool.host + 4 * slot, 0xFFFFFFFF)  # where 2**32 - 1 waits on it leave it
    for _ in range(2):  # the wait that wraps, then the one after it
        src = cupy.asarray(rng.integers(0, 2**32, 4096, dtype=np.uint32))
        dst = cupy.zeros_like(src)
        cupy.cuda.Device().synchronize()
        sync = eglcuda.Sync.reusable(sync_display)
        wait = eglcuda.cuda_wait_sync(sync, cuda_stream=stream, path="emulated")
        spin(stream, src, dst, 0.0)  # queued after the wait
        time.sleep(0.2)
        assert not wait.done() and not np.array_equal(cupy.asnumpy(dst), cupy.asnumpy(src))
        sync.signal()
        assert wait.join(5) and not wait.timed_out
        stream.synchronize()
        np.testing.assert_array_equal(cupy.asnumpy(dst), cupy.asnumpy(src))
        sync.close()
    assert slot in pool.free


def test_a_sync_closed_while_a_stream_waits_on_it_says_so(sync_display, cupy):
    """Closing the sync that an emulated wait was waiting on released the stream as if the sync
    had signaled: the work after the wait ran unordered, and nothing on the CudaWait said so."""
    stream = cupy.cuda.Stream(non_blocking=True)
    sync = eglcuda.Sync.reusable(sync_display)
    wait = eglcuda.cuda_wait_sync(sync, cuda_stream=stream, path="emulated")
    time.sleep(0.15)
    assert not wait.done()
    sync.close()
    assert wait.join(5) and not wait.timed_out
    assert isinstance(wait.error, eglcuda.ClosedError)
    stream.synchronize()  # released, not hung
    signaled = eglcuda.Sync.reusable(sync_display)
    wait = eglcuda.cuda_wait_sync(signaled, cuda_stream=stream, path="emulated")
    signaled.signal()
    assert wait.join(5) and wait.error is None and not wait.timed_out
    signaled.close()
