"""What a production pipeline must be able to trust: a peer killed at any step of the hand-over,
threads racing close() against per-frame calls, re-entry from a signal handler, fork, interpreter
exit with calls in flight, and a frame presented on several producers at once."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import eglcuda

from .streamkit import connected, fill_random
from . import test_crossprocess
from .test_crossprocess import Peer, check

# test_crossprocess's fixtures, bound in this module so that pytest finds them here too.
display = test_crossprocess.display
sock_path = test_crossprocess.sock_path


def run_script(body: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """A fresh interpreter running ``body``; fails the test if it hangs."""
    script = "import os, sys, threading, time\nimport numpy as np\nimport eglcuda\n" + textwrap.dedent(body)
    try:
        return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, PYTHONFAULTHANDLER="1"))
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the script hung for {timeout} s: {exc.stdout!r} {exc.stderr!r}") from None


# ---- a peer killed with SIGKILL at each step of the hand-over ------------------------------------

@pytest.mark.parametrize("step", ["received", "connected", "presented"])
def test_a_producer_killed_at_each_step_leaves_the_consumer_a_clear_error(display, sock_path, step):
    stream = display.create_stream(fifo_length=4, cross_process=True)
    consumer = stream.connect_cuda_consumer()
    peer = Peer("producer", "--socket", sock_path, "--frames", "20", "--seed", "5", "--die-at", step)
    try:
        eglcuda.serve_stream(stream, sock_path, timeout=30)
        peer.process.wait(30)
        assert peer.process.returncode == -signal.SIGKILL
        started = time.monotonic()
        outcome = None
        while time.monotonic() - started < 15:
            try:
                with consumer.acquire(timeout_us=500_000) as acquired:
                    check(acquired, 5)  # a frame presented before the crash arrives intact
            except (eglcuda.StreamDisconnected, eglcuda.Timeout) as exc:
                outcome = exc
                if isinstance(exc, eglcuda.StreamDisconnected) or step == "received":
                    break
        assert outcome is not None, f"killed at {step!r}: the consumer heard nothing"
        if step != "received":  # the producer had connected: its death disconnects the stream
            assert isinstance(outcome, eglcuda.StreamDisconnected), repr(outcome)
        assert time.monotonic() - started < 10
    finally:
        stream.close()
        if peer.process.poll() is None:
            peer.kill()


@pytest.mark.parametrize("step", ["connected", "served"])
def test_a_consumer_killed_at_each_step_leaves_the_producer_a_clear_error(display, sock_path, step):
    peer = Peer("consumer", "--socket", sock_path, "--die-at", step)
    stream = None
    started = time.monotonic()
    try:
        if step == "connected":  # it died before serving: nobody answers on the socket
            with pytest.raises(eglcuda.Timeout):
                eglcuda.receive_stream(display, sock_path, timeout=3)
            assert time.monotonic() - started < 8
            return
        stream = eglcuda.receive_stream(display, sock_path, timeout=30)
        peer.process.wait(30)
        outcome = None
        try:
            producer = stream.connect_cuda_producer(64, 48)
            frames = [producer.allocate_frame() for _ in range(3)]
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                for frame in frames:
                    if producer.in_flight < 3:
                        producer.present(frame)
                producer.return_frame(timeout_us=200_000)
        except eglcuda.EglCudaError as exc:
            outcome = exc
        assert isinstance(outcome, (eglcuda.StreamDisconnected, eglcuda.CUDAError, eglcuda.UsageError)), repr(outcome)
    finally:
        if stream is not None:
            stream.close()
        if peer.process.poll() is None:
            peer.kill()


# ---- threads, signals ------------------------------------------------------------------------------

def test_close_from_another_thread_stops_presenting_threads_with_closed_error(display):
    errors: list[BaseException] = []
    stop = threading.Event()
    with connected(display, 64, 48, fifo_length=0) as (stream, producer, consumer):
        pool = [producer.allocate_frame() for _ in range(12)]

        def present_loop(frames) -> None:
            try:
                while not stop.is_set():
                    for frame in frames:
                        if frame not in producer._in_flight.values():
                            producer.present(frame)
                    producer.return_frame(timeout_us=1000)
            except eglcuda.ClosedError:
                return
            except eglcuda.UsageError as exc:  # another thread presented the same frame first
                if "already in flight" not in str(exc):
                    errors.append(exc)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=present_loop, args=(pool[i::3],), daemon=True) for i in range(3)]
        for thread in threads:
            thread.start()
        time.sleep(0.3)
        started = time.monotonic()
        try:
            producer.close(timeout=5)  # waits its turn behind the threads' calls, however busy they keep it
            closed_in = time.monotonic() - started
        finally:
            stop.set()
            for thread in threads:
                thread.join(10)
        assert not any(thread.is_alive() for thread in threads), "a thread hung after close()"
        assert not errors, errors
        assert closed_in < 5
        with pytest.raises(eglcuda.ClosedError):
            producer.present(pool[0])


def test_close_waits_for_a_present_into_a_full_fifo_only_up_to_its_timeout(display):
    with connected(display, 64, 48, fifo_length=1) as (stream, producer, consumer):
        frames = [producer.allocate_frame() for _ in range(3)]
        blocked = threading.Event()

        def fill() -> None:
            producer.present(frames[0])
            producer.present(frames[1])  # the FIFO (1) is full now: this waits for the consumer
            blocked.set()

        worker = threading.Thread(target=fill, daemon=True)
        worker.start()
        time.sleep(0.3)
        assert not blocked.is_set(), "the driver did not wait: the test's premise is gone"
        started = time.monotonic()
        with pytest.raises(eglcuda.Timeout, match="present"):
            producer.close(timeout=0.5)
        assert 0.4 < time.monotonic() - started < 3
        consumer.acquire(timeout_us=1_000_000).release()  # room in the FIFO: the present returns
        worker.join(10)
        assert blocked.is_set()
        producer.close()
        assert producer.closed


def test_closing_the_stream_ends_a_present_that_waits_on_a_full_fifo(display):
    """stream.close() closed the producer first, which waited 10 s for the present (it waits for
    the consumer, still connected) and raised Timeout, leaving the stream open: the consumer
    goes first now, and the whole close takes no time."""
    with connected(display, 64, 48, fifo_length=1) as (stream, producer, consumer):
        frames = [producer.allocate_frame() for _ in range(2)]
        ended = []

        def fill() -> None:
            producer.present(frames[0])
            try:
                producer.present(frames[1])  # the FIFO (1) is full: this waits for the consumer
                ended.append("presented")
            except eglcuda.EglCudaError as exc:
                ended.append(exc)

        worker = threading.Thread(target=fill, daemon=True)
        worker.start()
        time.sleep(0.3)
        assert not ended, "the driver did not wait: the test's premise is gone"
        started = time.monotonic()
        stream.close()
        assert time.monotonic() - started < 3
        assert stream.closed and producer.closed and consumer.closed
        worker.join(10)
        assert not worker.is_alive() and len(ended) == 1, ended


def test_reentry_from_a_signal_handler_raises_instead_of_hanging(display):
    with display.create_stream() as stream:
        consumer = stream.connect_cuda_consumer()  # no producer: acquire waits in its slow path

        def handler(signum, frame) -> None:
            consumer.close()

        previous = signal.signal(signal.SIGALRM, handler)
        try:
            signal.setitimer(signal.ITIMER_REAL, 0.2)
            started = time.monotonic()
            with pytest.raises(eglcuda.UsageError, match="called again from inside"):
                consumer.acquire(timeout_us=5_000_000)
            assert time.monotonic() - started < 2
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        consumer.close()  # outside the call it works
        assert consumer.closed


# ---- one frame on several producers -----------------------------------------------------------------

def test_a_frame_presented_on_two_producers_stays_open_until_both_disconnect(display):
    rng = np.random.default_rng()
    streams = [display.create_stream() for _ in range(2)]
    try:
        consumers = [s.connect_cuda_consumer() for s in streams]
        producers = [s.connect_cuda_producer(64, 48) for s in streams]
        frame = eglcuda.Frame.allocate(64, 48)
        expected = fill_random(frame, rng)
        for producer in producers:
            producer.present(frame)
        for consumer in consumers:
            with consumer.acquire(timeout_us=1_000_000) as acquired:
                assert np.array_equal(acquired.planes[0].to_numpy(), expected[0])
        producers[0].close()
        assert frame.presented
        with pytest.raises(eglcuda.UsageError, match="still connected"):
            frame.close()
        # The other producer still passes the frame to the driver: its memory must be intact.
        with consumers[1].acquire(timeout_us=100_000) as acquired:
            assert np.array_equal(acquired.planes[0].to_numpy(), expected[0])
        producers[1].close()
        assert not frame.presented
        frame.close()
        assert frame.closed
    finally:
        for s in streams:
            s.close()


# ---- fork and exit ----------------------------------------------------------------------------------

def test_a_forked_child_exits_cleanly_and_cannot_use_the_parents_endpoints(display):
    rng = np.random.default_rng()
    with connected(display, 64, 48, fifo_length=2) as (stream, producer, consumer):
        frames = [producer.allocate_frame() for _ in range(2)]
        expected = fill_random(frames[0], rng)
        pid = os.fork()
        if pid == 0:  # the child: inherited handles are the parent's; nothing may touch them
            code = 0
            try:
                try:
                    producer.present(frames[0])
                    code = 3
                except eglcuda.ClosedError:
                    pass
                if not (stream.closed and frames[0].closed):
                    code = 4
            finally:
                sys.stdout.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # The parent's endpoints are untouched by the child.
        producer.present(frames[0])
        with consumer.acquire(timeout_us=1_000_000) as acquired:
            assert np.array_equal(acquired.planes[0].to_numpy(), expected[0])


def test_a_forked_child_that_exits_through_the_interpreter_leaves_the_parent_working(display):
    out = run_script("""
        display = eglcuda.Display.for_cuda_device(0)
        stream = display.create_stream(fifo_length=2)
        consumer = stream.connect_cuda_consumer()
        producer = stream.connect_cuda_producer(64, 48)
        frame = producer.allocate_frame()
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # atexit handlers and finalizers of the child: none may touch the parent's handles
        _, status = os.waitpid(pid, 0)
        producer.present(frame)
        with consumer.acquire(timeout_us=1_000_000) as acquired:
            print("child", os.waitstatus_to_exitcode(status), "parent acquired", acquired.is_new)
    """)
    assert out.returncode == 0, out.stderr
    assert "child 0 parent acquired True" in out.stdout


def test_a_child_forked_after_cuda_was_used_is_refused_with_the_reason_before_the_driver(display):
    # (display: the fixture that skips without a GPU; the script makes its own)
    out = run_script("""
        frame = eglcuda.Frame.allocate(64, 48)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            words = []
            for call in (lambda: eglcuda.get_device(0), lambda: eglcuda.Frame.allocate(64, 48),
                         lambda: eglcuda.Display.for_cuda_device(0).create_stream()):
                try:
                    call()
                    words.append("worked")
                except eglcuda.UsageError as exc:
                    words.append("spawn" if "'spawn'" in str(exc) else str(exc))
                except Exception as exc:
                    words.append(f"{type(exc).__name__}: {exc}")
            print("child", *words, flush=True)
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print("parent", os.waitstatus_to_exitcode(status), eglcuda.Frame.allocate(64, 48).closed, frame.closed)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["child spawn spawn spawn", "parent 0 False False"], out.stdout


def test_exit_with_live_endpoints_and_daemon_threads_inside_calls(display):
    out = run_script("""
        display = eglcuda.Display.for_cuda_device(0)
        full = display.create_stream(fifo_length=1)
        full_consumer = full.connect_cuda_consumer()
        full_producer = full.connect_cuda_producer(64, 48)
        frames = [full_producer.allocate_frame() for _ in range(2)]
        empty = display.create_stream()
        waiting = empty.connect_cuda_consumer()
        empty_producer = empty.connect_cuda_producer(64, 48)

        def present_forever():
            full_producer.present(frames[0])
            full_producer.present(frames[1])  # blocks: nobody acquires

        def acquire_forever():
            waiting.acquire(timeout_us=30_000_000)  # blocks: nothing is presented

        for target in (present_forever, acquire_forever):
            threading.Thread(target=target, daemon=True).start()
        time.sleep(0.5)
        print("exiting", flush=True)
    """, timeout=60)
    assert "exiting" in out.stdout
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr


def test_exit_frees_frames_after_their_producer_disconnects(display):
    out = run_script("""
        display = eglcuda.Display.for_cuda_device(0)
        stream = display.create_stream()
        consumer = stream.connect_cuda_consumer()
        producer = stream.connect_cuda_producer(64, 48)
        frames = [producer.allocate_frame() for _ in range(3)]  # made after the producer: freed first at exit
        for frame in frames[:2]:
            producer.present(frame)
        consumer.acquire(timeout_us=1_000_000)  # still held at exit
        print("done", flush=True)
    """)
    assert out.returncode == 0, out.stderr
    assert "done" in out.stdout and "Exception ignored" not in out.stderr
