"""EGLSync on any EGL (Mesa in CI): fences, reusable syncs, client and server waits, threads,
closed objects and bad input."""
from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import eglcuda

from ..conftest import gl_module, require_extension
from ..forking import answers_in_forked_child
from .test_leaks import grows


@pytest.fixture
def sync_display(display):
    require_extension(display, "EGL_KHR_fence_sync", "EGL_KHR_reusable_sync")
    return display


def test_fence_signals_after_gl_work(sync_display):
    GL = gl_module()

    rng = np.random.default_rng()
    with sync_display.create_context():
        texels = rng.integers(0, 256, (256, 256, 4), dtype=np.uint8)
        texture = int(GL.glGenTextures(1))
        GL.glBindTexture(GL.GL_TEXTURE_2D, texture)
        GL.glTexImage2D(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA8, 256, 256, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, texels)
        with eglcuda.Sync.fence(sync_display) as fence:
            assert fence.kind is eglcuda.SyncKind.FENCE
            assert fence.wait(timeout=5.0) is True
            assert fence.signaled
            assert fence.wait(timeout=0) is True  # stays signaled
            with pytest.raises(eglcuda.UsageError, match="reusable"):
                fence.signal()
        GL.glDeleteTextures([texture])


def test_fence_needs_a_current_context(sync_display):
    with pytest.raises(eglcuda.EGLError) as error:
        eglcuda.Sync.fence(sync_display)
    assert error.value.call == "eglCreateSyncKHR"


def test_reusable_signal_unsignal_and_timeouts(sync_display):
    sync = eglcuda.Sync.reusable(sync_display)
    assert not sync.signaled
    started = time.perf_counter()
    assert sync.wait(timeout=0.05) is False
    assert 0.04 < time.perf_counter() - started < 2.0
    sync.signal()
    assert sync.signaled and sync.wait(timeout=0) is True
    sync.unsignal()
    assert not sync.signaled and sync.wait(timeout=0) is False
    assert eglcuda.Sync.reusable(sync_display, signaled=True).signaled
    sync.close()
    sync.close()


def test_signal_from_another_thread_wakes_the_waiter(sync_display):
    sync = eglcuda.Sync.reusable(sync_display)
    delay = 0.2
    timer = threading.Timer(delay, sync.signal)
    started = time.perf_counter()
    cpu_started = time.process_time()
    timer.start()
    assert sync.wait(timeout=10) is True
    waited = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    timer.join()
    assert delay * 0.9 < waited < 5
    assert cpu < waited * 0.5  # the wait sleeps, it does not spin a core


def test_closing_a_sync_another_thread_waits_for_is_a_closed_error(sync_display):
    """A wait on a sync that another thread closes ended in an EGLError about reading the sync's
    status (Mesa), or returned True as if it were signaled (NVIDIA: EGL wakes the waiters of a
    destroyed sync). Either way the waiter now gets ClosedError, at once."""
    sync = eglcuda.Sync.reusable(sync_display)
    outcome: list[object] = []

    def waiter() -> None:
        try:
            outcome.append(sync.wait(timeout=3))
        except eglcuda.EglCudaError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=waiter)
    started = time.perf_counter()
    thread.start()
    time.sleep(0.2)
    sync.close()
    thread.join()
    assert len(outcome) == 1 and isinstance(outcome[0], eglcuda.ClosedError), outcome
    assert time.perf_counter() - started < 2.5


def test_server_wait_on_a_fence(sync_display):
    require_extension(sync_display, "EGL_KHR_wait_sync")
    GL = gl_module()

    with sync_display.create_context():
        with eglcuda.Sync.fence(sync_display) as fence:
            # The timeout only bounds a client wait, but a bad one is refused on every path (a
            # fence's server wait took -1 or NaN, which the client-wait path refuses).
            for bad in (-1, float("nan"), True, "1"):
                with pytest.raises(eglcuda.UsageError, match="timeout"):
                    fence.server_wait(timeout=bad)
            fence.server_wait()  # returns at once; the GL commands after it wait on the GPU
            GL.glFinish()
            assert fence.signaled


def test_closed_objects_and_bad_input(sync_display):
    sync = eglcuda.Sync.reusable(sync_display)
    for bad in (-1, "1", float("nan"), True):
        with pytest.raises(eglcuda.UsageError):
            sync.wait(timeout=bad)
    sync.close()
    assert sync.closed
    with pytest.raises(eglcuda.ClosedError):
        sync.signaled
    with pytest.raises(eglcuda.ClosedError):
        sync.wait(0)
    with pytest.raises(eglcuda.ClosedError):
        sync.signal()
    other = eglcuda.Sync.reusable(sync_display)
    sync_display.close()  # closes its syncs first
    assert other.closed
    with pytest.raises(eglcuda.ClosedError):
        other.wait(0)


def test_flags_are_true_or_false_and_numpy_or_endless_timeouts_are_seconds(sync_display):
    """signaled="no" made a signaled sync and flush=0 skipped the flush; a NumPy number of
    seconds was refused, and inf (or an int beyond any float) is as good as forever."""
    for bad in ("no", 0, 1, None):
        with pytest.raises(eglcuda.UsageError, match="signaled is True or False"):
            eglcuda.Sync.reusable(sync_display, signaled=bad)
    assert not eglcuda.Sync.reusable(sync_display, signaled=np.bool_(False)).signaled
    sync = eglcuda.Sync.reusable(sync_display, signaled=np.bool_(True))
    try:
        assert sync.signaled
        with pytest.raises(eglcuda.UsageError, match="flush is True or False"):
            sync.wait(0, flush="no")
        for timeout in (np.int64(0), np.float32(0.25), float("inf"), 2**70, 10**9):
            assert sync.wait(timeout) is True
        sync.unsignal()
        assert sync.wait(np.float64(0.01)) is False
        timer = threading.Timer(0.2, sync.signal)
        timer.start()
        assert sync.wait(float("inf")) is True
        timer.join()
    finally:
        sync.close()


def test_create_close_cycles_are_flat(sync_display):
    def cycle():
        sync = eglcuda.Sync.reusable(sync_display)
        sync.signal()
        sync.close()

    assert grows(cycle) < 8 << 20

    def dropped():
        eglcuda.Sync.reusable(sync_display)  # never closed: garbage collection destroys it

    assert grows(dropped, warmup=20, cycles=300) < 8 << 20


def test_server_wait_on_a_reusable_sync_orders_gl_after_the_signal(sync_display):
    require_extension(sync_display, "EGL_KHR_wait_sync")
    GL = gl_module()

    with sync_display.create_context():
        honoured = eglcuda.syncs.paths.server_waits_reusable(sync_display)
        sync = eglcuda.Sync.reusable(sync_display)
        timer = threading.Timer(0.1, sync.signal)
        timer.start()
        blocked = sync.server_wait(timeout=5)
        assert blocked == (not honoured)
        GL.glFinish()
        assert sync.signaled  # either way, GL's later work ran after the signal
        timer.join()
        sync.close()


def test_a_forked_child_is_told_its_syncs_are_the_parents(sync_display):
    """In a child made by fork(), every call on a sync the parent made said "EGL device 0, ... is
    closed" (the display's words), though nothing was closed: it now names the fork. The parent
    goes on with the sync."""
    sync = eglcuda.Sync.reusable(sync_display)
    answers = answers_in_forked_child(
        (lambda: sync.wait(0), sync.signal, lambda: sync.signaled, sync.server_wait, lambda: sync.handle),
        eglcuda.ClosedError, "forked")
    assert answers == ["fork"] * 5, answers
    sync.signal()
    assert sync.wait(0) is True
    sync.close()


def _queue_gl_work(GL, seconds: float) -> None:
    """Queue (and flush, without waiting) about ``seconds`` of GL work in the current context:
    draws of a costly fragment shader into a framebuffer of its own, as many as one timed draw says."""
    from OpenGL.GL import shaders

    size = 512
    texture = int(GL.glGenTextures(1))
    GL.glBindTexture(GL.GL_TEXTURE_2D, texture)
    GL.glTexImage2D(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA8, size, size, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, None)
    framebuffer = int(GL.glGenFramebuffers(1))
    GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, framebuffer)
    GL.glFramebufferTexture2D(GL.GL_FRAMEBUFFER, GL.GL_COLOR_ATTACHMENT0, GL.GL_TEXTURE_2D, texture, 0)
    GL.glViewport(0, 0, size, size)
    GL.glUseProgram(shaders.compileProgram(
        shaders.compileShader("#version 120\nvoid main() { gl_Position = gl_Vertex; }", GL.GL_VERTEX_SHADER),
        shaders.compileShader("#version 120\nvoid main() { float a = gl_FragCoord.x;"
                              " for (int i = 0; i < 2000; i++) { a = sin(a) * 1.0001 + cos(a * 0.5); }"
                              " gl_FragColor = vec4(a); }", GL.GL_FRAGMENT_SHADER)))

    def draw() -> None:
        GL.glBegin(GL.GL_TRIANGLE_STRIP)
        for x, y in ((-1, -1), (1, -1), (-1, 1), (1, 1)):
            GL.glVertex2f(x, y)
        GL.glEnd()

    GL.glFinish()
    started = time.perf_counter()
    draw()
    GL.glFinish()
    one = max(time.perf_counter() - started, 1e-5)
    for _ in range(min(5000, int(seconds / one) + 1)):
        draw()
    GL.glFlush()


def test_the_server_wait_probe_is_not_fooled_by_gl_work_queued_before_it(sync_display):
    """Whether the driver honours GL server waits on reusable syncs is tested once per display, in
    the caller's context: a fence queued after the wait must stay unsignaled. GL work queued
    before the probe made that fence late by itself, so a driver that ignores the wait was taken
    for one that honours it, and every later server wait on that display ordered nothing."""
    require_extension(sync_display, "EGL_KHR_wait_sync")
    GL = gl_module()
    verdicts = eglcuda.syncs.paths._server_wait_verdicts
    with sync_display.create_context():
        idle = eglcuda.syncs.paths._probe_server_wait(sync_display)
        verdicts.pop(sync_display._address, None)
        try:
            _queue_gl_work(GL, 0.5)
            assert eglcuda.syncs.paths.server_waits_reusable(sync_display) == idle
            GL.glFinish()
        finally:
            verdicts.pop(sync_display._address, None)


def test_the_path_queries_and_cuda_waits_check_what_they_are_given_first(sync_display):
    """sync_paths and gl_server_wait_path raised a bare AttributeError for what is not a display
    and answered for a closed one; cuda_wait_sync looked its path up before its timeout and its
    sync, so a bad timeout or a closed sync was told as "no path" (Unsupported) where there is
    none; CudaWait.join took a negative or NaN timeout as "not yet" and a string as a TypeError."""
    for query in (eglcuda.sync_paths, eglcuda.gl_server_wait_path):
        with pytest.raises(eglcuda.UsageError, match="takes an eglcuda.Display, got str"):
            query("display")
    sync = eglcuda.Sync.reusable(sync_display)
    for bad in (-1, float("nan"), "1", True):
        with pytest.raises(eglcuda.UsageError, match="timeout"):
            eglcuda.cuda_wait_sync(sync, timeout=bad)
    sync.close()
    with pytest.raises(eglcuda.ClosedError):
        eglcuda.cuda_wait_sync(sync)
    wait = eglcuda.CudaWait(eglcuda.SyncPath.EMULATED)
    for bad in (-1, float("nan"), "1", True, np.float64(-5)):
        with pytest.raises(eglcuda.UsageError, match="timeout"):
            wait.join(bad)
    assert wait.join(0) is False and wait.join(np.float64(0.01)) is False
    wait._released.set()  # (as its waiter thread does once the sync signals)
    assert wait.join(0) is True and wait.join(float("inf")) is True and wait.join() is True
    sync_display.close()
    for query in (eglcuda.sync_paths, eglcuda.gl_server_wait_path):
        with pytest.raises(eglcuda.ClosedError):
            query(sync_display)
