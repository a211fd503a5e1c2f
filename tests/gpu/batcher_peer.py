"""The batching process of the batcher tests (tests/gpu/test_batcher.py on a GPU,
tests/unit/topics/test_batcher_fakecuda.py on the stand-in libcuda), a fresh interpreter:

    python tests/gpu/batcher_peer.py batch --source NAME:PATH:SEED ... --batch-size B --count N
    python tests/gpu/batcher_peer.py misuse --source NAME:PATH:SEED ...

The publishers are tests/gpu/topics_peer.py processes, whose frames are a function of (seed,
seq): every byte of every image of every batch is checked against that. Each batch is reported
as a JSON line on stdout ("batch": sources, seqs, skipped, timings, what differed).
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import signal
import sys
import threading
import time

import numpy as np

import eglcuda
from eglcuda._bind import cuda

# Started with PYTHONSAFEPATH (tests/conftest.py), this script's folder is not on sys.path:
# topics_peer.py beside it holds the frame content both sides agree on.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from topics_peer import content, payload_of, say  # noqa: E402


def subscribers(args) -> list:
    out = []
    for spec in args.source:
        name, path, _ = spec.split(":")
        if args.remote:  # (a remote subscriber of the relay there; PATH is not used)
            sub = eglcuda.Subscriber(name, qos=args.qos, queue=args.queue, timeout=args.timeout, remote=args.remote)
            sub.wait_for_publisher()
            out.append(sub)
            continue
        out.append(eglcuda.Subscriber(name, qos=args.qos, queue=args.queue, timeout=args.timeout, path=path,
                                      transport=args.transport))
    return out


def seeds(args) -> list[int]:
    return [int(spec.split(":")[2]) for spec in args.source]


def check_batch(batch, source_seeds: list[int]) -> list[str]:
    """Every byte of every image, and each payload: what differed (empty: nothing)."""
    wrong = []
    planes = [plane.to_numpy() for plane in batch.planes]
    for item in batch.frames:
        seed = source_seeds[item.source]
        if item.payload != payload_of(item.seq, seed):
            wrong.append(f"image {item.index}: payload {item.payload!r}")
        want = content([p.shape[1:] for p in planes], seed, item.seq)
        for index, (plane, expected) in enumerate(zip(planes, want)):
            bad = int(np.count_nonzero(plane[item.index] != expected))
            if bad:
                wrong.append(f"image {item.index} (source {item.source} seq {item.seq}) plane {index}: "
                             f"{bad} of {expected.size} bytes differ")
    return wrong


class SlowReader:
    """Reads each batch on a side stream behind a spin kernel, copies it out there, releases the
    batch before the GPU ran either, and checks the copy later: the batcher must not write the
    buffer again before the reading ended (CuPy; a raw-pointer reader that names its stream)."""

    def __init__(self, milliseconds: float) -> None:
        import cupy

        self.cupy = cupy
        self.nanoseconds = int(milliseconds * 1e6)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.spin = cupy.RawKernel(r'''
        extern "C" __global__ void spin(const unsigned char *data, unsigned long long nanoseconds, unsigned int *sink) {
            unsigned long long start, now;
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
            unsigned int acc = 0;
            do {
                acc += data[threadIdx.x];
                asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
            } while (now - start < nanoseconds);
            if (acc == 0xFFFFFFFFu) { sink[0] = acc; }
        }''', "spin")
        self.sink = cupy.zeros(1, cupy.uint32)

    def read_and_release(self, batch, via: str) -> tuple[list, bool]:
        """Copies of the batch's planes, queued behind the spin on the side stream; the batch is
        released before they ran. Returns (copies, whether the stream was still busy at release)."""
        cupy = self.cupy
        with self.stream:
            if via == "dlpack":
                views = [cupy.from_dlpack(plane) for plane in batch.planes]  # the stream is remembered
            else:
                views = [cupy.asarray(plane) for plane in batch.planes]
            self.spin((1,), (32,), (views[0], cupy.uint64(self.nanoseconds), self.sink))
            copies = [view.copy() for view in views]
        busy = not self.stream.done
        batch.release(cuda_stream=None if via == "dlpack" else self.stream.ptr)
        return copies, busy


def batch(args) -> int:
    if args.torch:  # (imported first: their start-up, seconds, would leave the 'every' sources unread)
        import cupy  # noqa: F401
        import torch  # noqa: F401
        torch.zeros(1, device="cuda")
    subs = subscribers(args)
    source_seeds = seeds(args)
    say(event="ready", transports=[s.transport for s in subs])
    if args.prefill_ms:
        time.sleep(args.prefill_ms / 1e3)  # the sources' queues fill meanwhile
    reader = SlowReader(args.slow_reader_ms) if args.slow_reader_ms else None
    fake = ctypes.CDLL("libcuda.so.1") if args.fake_hold or args.hand_to_held or args.hold_sources else None
    batcher = eglcuda.Batcher(subs, args.batch_size, formation_timeout=args.formation_ms / 1e3, pool=args.pool,
                              timeout=args.timeout)
    if args.fake_hold:
        fake.fake_cuda_hold(ctypes.c_void_p(batcher.cuda_stream), 1)
    say(event="batcher", stream=batcher.cuda_stream, own_stream=batcher._stream is not None)
    made = 0
    pending = None  # (report, copies, frames) of the slow reader's batch not checked yet
    wall, cpu = time.monotonic(), time.process_time()
    try:
        while made < args.count:
            started = time.monotonic_ns()
            if args.hold_sources == "busy":  # the frames' streams "still run" work before them
                for sub in subs:
                    fake.fake_cuda_hold(ctypes.c_void_p(sub.cuda_stream), 1)
            try:
                b = batcher.next()
            except eglcuda.StreamDisconnected as exc:
                say(event="ended", error=str(exc), ended={str(k): str(v) for k, v in batcher.ended.items()})
                break
            returned = time.monotonic_ns()
            waits_for_sources = None
            if args.hold_sources:
                waits_for_sources = not _idle(fake, batcher.cuda_stream)
                for sub in subs:
                    fake.fake_cuda_hold(ctypes.c_void_p(sub.cuda_stream), 0)
            report = dict(event="batch", size=b.size, sources=[f.source for f in b.frames],
                          seqs=[f.seq for f in b.frames], skipped=[f.skipped for f in b.frames],
                          timestamps=[f.timestamp_ns for f in b.frames],
                          shapes=[list(p.shape) for p in b.planes],
                          call_ms=(returned - started) / 1e6,
                          formed_ms=(returned - b.frames[0].received_ns) / 1e6,
                          received_ms=[(f.received_ns - b.frames[0].received_ns) / 1e6 for f in b.frames],
                          batcher_waits_for_sources=waits_for_sources)
            if args.fake_hold:
                # Sources released before this returned, on the batcher's stream: the done event
                # each publisher waits for is pending behind the copies (held: they "still run");
                # those of frames of earlier batches completed when their copies "ran".
                report["sources_wait_for_copies"] = [_waits_for_copies(fake, s) for s in subs]
            if args.torch:
                report["torch"] = _torch_views(b)
            if reader is not None:
                # The previous batch's reading is checked only now, after this batch's copies
                # were queued into the same buffer (pool 1): they must have waited for it.
                if pending is not None:
                    _finish_reading(reader, pending, source_seeds)
                    made += 1
                copies, busy = reader.read_and_release(b, args.via)
                report["busy_at_release"] = busy
                pending = (report, copies, list(b.frames))
                continue
            else:
                report["wrong"] = [] if args.no_check else check_batch(b, source_seeds)
                if args.hand_to_held:
                    _hand_to_held(fake, b, report)
                b.release()
            say(**report)
            made += 1
            if args.fake_hold:  # the copies "ran": the publishers may write those slots again
                fake.fake_cuda_hold(ctypes.c_void_p(batcher.cuda_stream), 0)
                fake.fake_cuda_hold(ctypes.c_void_p(batcher.cuda_stream), 1)
            if args.sleep_ms:
                time.sleep(args.sleep_ms / 1e3)
        if pending is not None:  # (one batch more than counted: no batch came after it)
            reader.stream.synchronize()
    finally:
        if fake is not None:
            fake.fake_cuda_hold(ctypes.c_void_p(batcher.cuda_stream), 0)
        ended = dict(batcher.ended)
        if args.close_sources_first:  # (a batch still out, released after the batcher's close)
            last = batcher.next()
            for sub in subs:
                sub.close()
            batcher.close()
            last.release()
        else:
            batcher.close()
        for sub in subs:
            sub.close()
    say(event="done", batches=made, wall_s=time.monotonic() - wall, cpu_s=time.process_time() - cpu,
        ended={str(k): type(v).__name__ for k, v in ended.items()})
    return 0


def _torch_views(b) -> dict:
    """PyTorch and CuPy take each batch plane without a copy: same address, shape [B, H, W(, C)],
    and the bytes the batch holds."""
    import cupy
    import torch

    out = {"same_memory": True, "same_bytes": True}
    for plane in b.planes:
        tensor = torch.from_dlpack(plane)
        array = cupy.asarray(plane)
        out["same_memory"] &= tensor.data_ptr() == plane.pointer == array.data.ptr
        out["same_memory"] &= tuple(tensor.shape) == tuple(array.shape) == plane.shape
        out["same_bytes"] &= bool(np.array_equal(tensor.cpu().numpy(), plane.to_numpy()))
    return out


def _idle(fake, stream) -> bool:
    return fake.cuStreamQuery(ctypes.c_void_p(stream)) == 0


def _waits_for_copies(fake, sub) -> bool:
    """Whether a done event that ``sub`` sent with a release is still pending (its publisher
    then waits before writing that frame again)."""
    done = sub._conn.transport._done.values()
    return any(fake.cuEventQuery(ctypes.c_void_p(event.address)) != 0 for event in done)


def _hand_to_held(fake, b, report) -> None:
    """Hand the batch to a stream held busy (DLPack's stream=); its release must leave the
    batcher's stream waiting for it (fake libcuda)."""
    stream = eglcuda._bind.cuda.stream_create(non_blocking=True)
    try:
        fake.fake_cuda_hold(ctypes.c_void_p(stream), 1)
        b.planes[0].__dlpack__(stream=stream)
        fake.fake_cuda_hold(ctypes.c_void_p(b.cuda_stream), 0)
        before = not _idle(fake, b.cuda_stream)
        b.release()
        report["batcher_waits_for_reader"] = (not before) and not _idle(fake, b.cuda_stream)
        fake.fake_cuda_hold(ctypes.c_void_p(stream), 0)
    finally:
        eglcuda._bind.cuda.stream_destroy(stream)


def _finish_reading(reader, pending, source_seeds) -> None:
    """Wait for the slow reader's copies of a batch, check them, report the batch."""
    report, copies, frames = pending
    reader.stream.synchronize()
    report["wrong"] = _check_copies(copies, frames, source_seeds)
    say(**report)


def _check_copies(copies, frames, source_seeds) -> list[str]:
    wrong = []
    host = [c.get() for c in copies]
    for item in frames:
        want = content([h.shape[1:] for h in host], source_seeds[item.source], item.seq)
        for index, (plane, expected) in enumerate(zip(host, want)):
            bad = int(np.count_nonzero(plane[item.index] != expected))
            if bad:
                wrong.append(f"image {item.index} (source {item.source} seq {item.seq}) plane {index}: {bad} bytes "
                             "differ (written again before it was read?)")
    return wrong


def misuse(args) -> int:
    """Bad input: what each call raised (type and message), before any batch."""
    subs = subscribers(args)
    results = {}

    def attempt(label, call):
        try:
            made = call()
        except Exception as exc:  # the test asserts on the type and the words
            results[label] = [type(exc).__name__, str(exc)]
        else:
            made.close()
            results[label] = ["ok", ""]

    attempt("batch_size_0", lambda: eglcuda.Batcher(subs[:1], 0))
    attempt("batch_size_bool", lambda: eglcuda.Batcher(subs[:1], True))
    attempt("no_subscribers", lambda: eglcuda.Batcher([], 4))
    attempt("not_a_subscriber", lambda: eglcuda.Batcher(["topic"], 4))
    attempt("one_subscriber_not_a_list", lambda: eglcuda.Batcher(subs[0], 4))
    attempt("twice", lambda: eglcuda.Batcher([subs[0], subs[0]], 4))
    attempt("pool_0", lambda: eglcuda.Batcher(subs[:1], 4, pool=0))
    attempt("formation_negative", lambda: eglcuda.Batcher(subs[:1], 4, formation_timeout=-1))
    attempt("mixed", lambda: eglcuda.Batcher(subs, 4))
    with eglcuda.Batcher(subs[:1], 2, pool=1) as b:
        for label, name, value in (("set_batch_size", "batch_size", 64), ("set_formation_negative", "formation_timeout", -5),
                                   ("set_timeout_text", "timeout", "x")):
            try:
                setattr(b, name, value)
            except Exception as exc:
                results[label] = [type(exc).__name__, str(exc)]
            else:
                results[label] = ["ok", ""]
        b.formation_timeout = 0.01  # (a valid value is taken)
        results["formation_set"] = ["ok" if b.formation_timeout == 0.01 and b.batch_size == 2 else "wrong", ""]
        first = b.next()
        try:
            b.next()
        except Exception as exc:
            results["pool_exhausted"] = [type(exc).__name__, str(exc)]
        first.release()
        try:
            first.planes
        except Exception as exc:
            results["released_batch"] = [type(exc).__name__, str(exc)]
    closed = subs[0]
    closed.close()
    attempt("closed_subscriber", lambda: eglcuda.Batcher([closed], 4))
    for sub in subs:
        sub.close()
    say(event="misuse", results=results)
    return 0


def lifecycle(args) -> int:
    """(Stand-in libcuda only.) The CUDA streams and device buffers left after batchers dropped
    without close(); in a forked child, what next() raises and what close() changed there; the
    parent's batches after the child is gone."""
    fake = ctypes.CDLL("libcuda.so.1")
    fake.fake_cuda_count.restype = ctypes.c_long

    def counts() -> list[int]:
        return [fake.fake_cuda_count(what) for what in (b"cuda_streams", b"device_allocations")]

    subs = subscribers(args)
    with eglcuda.Batcher(subs, args.batch_size) as first:  # (the subscribers' readiness descriptors made)
        first.next().release()
        own_stream = first.cuda_stream  # (the subscribers made their own: the batcher makes one too)
        out_at_close = first.next()
    streams_after_close = [own_stream is not None, first.cuda_stream, out_at_close.cuda_stream]
    del out_at_close
    # A batch out, read on another thread (to_numpy() again and again) as this thread closes the
    # batcher: each read returns or raises ClosedError (the stream the batcher made for itself
    # went under a read in progress: the driver's invalid handle), and the stream goes with the batch.
    gc.collect()
    ahead = counts()
    read_during_close: dict[str, int] = {}
    for _ in range(30):
        batcher = eglcuda.Batcher(subs, args.batch_size)
        plane = batcher.next().planes[0]
        reading = threading.Event()

        def read() -> None:
            while True:
                try:
                    plane.to_numpy()
                    reading.set()
                except Exception as exc:  # noqa: BLE001 - what it raised is the report
                    name = type(exc).__name__
                    read_during_close[name] = read_during_close.get(name, 0) + 1
                    reading.set()
                    return

        reader = threading.Thread(target=read)
        reader.start()
        reading.wait(5)
        batcher.close()
        reader.join(5)
        del batcher, plane
    gc.collect()
    read_leftovers = [now - then for now, then in zip(counts(), ahead)]
    before = counts() + [descriptors()]
    gc.disable()  # (what a drop leaves must go at once, not at the cycle collector's next pass)
    try:
        for _ in range(3):
            batcher = eglcuda.Batcher(subs, args.batch_size)
            batcher.next()  # (its batch is dropped with it, unreleased)
            with batcher.next() as released:  # (released, its planes viewed, kept past the batcher's drop)
                [plane.shape for plane in released.planes]
            del batcher
            del released
        dropped = counts() + [descriptors()]
    finally:
        gc.enable()
    batcher = eglcuda.Batcher(subs, args.batch_size)
    batcher.next().release()
    held = batcher.next()  # (out across the fork: the child releases its copy, naming a reader stream)
    reader = cuda.stream_create(non_blocking=True)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            in_child = counts()
            try:
                batcher.next()
                raised = ["", ""]
            except Exception as exc:  # the test asserts on the type and the words
                raised = [type(exc).__name__, str(exc)]
            try:
                eglcuda.Batcher(subs, args.batch_size).close()
                made = ["", ""]
            except Exception as exc:  # the test asserts on the type and the words
                made = [type(exc).__name__, str(exc)]
            try:
                held.release(cuda_stream=reader)
                released = ""
            except Exception as exc:  # the test asserts there is none
                released = f"{type(exc).__name__}: {exc}"
            batcher.close()
            os.write(write, json.dumps({"raised": raised, "made": made, "released": released,
                                        "driver_calls": counts() != in_child}).encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = json.loads(os.read(read, 65536))
    os.close(read)
    held.release(cuda_stream=reader)
    cuda.stream_destroy(reader)
    with batcher.next() as after:
        wrong = check_batch(after, seeds(args))
    batcher.close()
    for sub in subs:
        sub.close()
    say(event="lifecycle", before=before, dropped=dropped, child=child, wrong=wrong,
        streams_after_close=streams_after_close, read_during_close=read_during_close,
        read_leftovers=read_leftovers)
    return 0


def interrupt(args) -> int:
    """close() from another thread while next() waits for a quiet source (a finite and an
    infinite timeout): what next() raised and after how long, and the descriptors left after.
    With ``--hold-second``: the second source's subscriber holds its queue's worth of messages,
    so its receive raises in the middle of a pass; the frames taken before it must come in the
    next batch (every byte checked)."""
    subs = subscribers(args)
    source_seeds = seeds(args)
    say(event="ready")
    report: dict = {}
    if args.hold_second:
        time.sleep(0.5)  # (both queues fill)
        held = [subs[1].receive(5) for _ in range(args.queue)]
        with subs[0].receive(5) as probe:  # (every: the batcher's first frame of it is the next seq)
            before = probe.seq
        batcher = eglcuda.Batcher(subs, args.batch_size, formation_timeout=args.formation_ms / 1e3)
        raised = []
        for _ in range(2):
            try:
                batcher.next(2).release()
                raised.append("")
            except eglcuda.EglCudaError as exc:
                raised.append(type(exc).__name__)
        firsts = [m.seq for m in held]
        for message in held:
            message.release()
        batches = []
        for _ in range(args.count):
            with batcher.next(5) as b:
                batches.append({"sources": [f.source for f in b.frames], "seqs": [f.seq for f in b.frames],
                                "skipped": [f.skipped for f in b.frames], "wrong": check_batch(b, source_seeds)})
        batcher.close()
        report.update(raised=raised, held=firsts, before=before, batches=batches)
    else:
        for sub in subs:
            sub.fileno()  # (made once, kept for the subscriber's life: not the batcher's)
        fds = len(os.listdir("/proc/self/fd"))
        outcomes = []
        for wait in (10.0, float("inf")):
            batcher = eglcuda.Batcher(subs, args.batch_size, formation_timeout=0.0, timeout=wait)
            batcher.next().release()  # (in step with the source: its next frame is a period away)
            closer = threading.Timer(0.1, batcher.close)
            started = time.monotonic()
            closer.start()
            try:
                batcher.next().release()
                outcomes.append(["returned", time.monotonic() - started, batcher.closed])
            except Exception as exc:  # the test asserts on the type
                outcomes.append([type(exc).__name__, time.monotonic() - started, batcher.closed])
            closer.join()
            try:
                batcher.next()
                outcomes.append(["next after close returned", 0.0, True])
            except Exception as exc:
                outcomes.append([type(exc).__name__, 0.0, batcher.closed])
        # A forked child closing its copy must leave the parent's waiting alone (the wake
        # descriptor is shared across fork): the parent's next() times out as it would have.
        batcher = eglcuda.Batcher(subs, args.batch_size, formation_timeout=0.0)
        batcher.next().release()
        pid = os.fork()
        if pid == 0:
            try:
                batcher.close()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        started, cpu = time.monotonic(), time.process_time()
        try:
            batcher.next(0.3).release()
            after_child = ["returned"]
        except Exception as exc:  # the test asserts on the type
            after_child = [type(exc).__name__]
        after_child += [time.monotonic() - started, time.process_time() - cpu]
        batcher.close()
        report.update(outcomes=outcomes, after_child_close=after_child, signal_in_next=_signal_in_next(subs),
                      signal_close=_signal_close_in_release(subs),
                      fork_beside_release=_fork_beside_release(subs, args), fds_before=fds,
                      fds_after=len(os.listdir("/proc/self/fd")))
    for sub in subs:
        sub.close()
    say(event="interrupt", **report)
    return 0


def _signal_in_next(subs) -> dict:
    """A signal handler runs while next() waits for a quiet source: its own next() raises
    UsageError, its close() returns at once; the waiting next() then raises ClosedError."""
    batcher = eglcuda.Batcher(subs, 1, formation_timeout=0.0, timeout=10)
    batcher.next().release()  # (in step with the source: its next frame is a period away)
    seen: list[str] = []

    def handler(signum, frame) -> None:
        try:
            batcher.next(0)
            seen.append("nested next returned")
        except Exception as exc:  # the test asserts on the type
            seen.append(type(exc).__name__)
        batcher.close()
        seen.append("closed")

    previous = signal.signal(signal.SIGALRM, handler)
    started = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, 0.1)
    try:
        batcher.next().release()
        seen.append("returned")
    except Exception as exc:  # the test asserts on the type
        seen.append(type(exc).__name__)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    return {"seen": seen, "seconds": time.monotonic() - started, "closed": batcher.closed}


def _signal_close_in_release(subs) -> dict:
    """A signal handler calls close() while its thread is inside a batch's release(), in the
    call that orders the buffer after the batch's reader (the signal is raised there): both
    must return, the batch released, the batcher closed."""
    batcher = eglcuda.Batcher(subs, 1, formation_timeout=0.0)
    held = batcher.next()
    reader = cuda.stream_create(non_blocking=True)
    join = cuda.join_streams
    seen: list[str] = []

    def handler(signum, frame) -> None:
        seen.append("handler")
        batcher.close()
        seen.append("closed")

    def signalled_join(*args):
        os.kill(os.getpid(), signal.SIGUSR1)  # (the handler runs inside this call, the release's lock held)
        return join(*args)

    previous = signal.signal(signal.SIGUSR1, handler)
    cuda.join_streams = signalled_join
    try:
        held.release(cuda_stream=reader)
        seen.append("released")
    finally:
        cuda.join_streams = join
        signal.signal(signal.SIGUSR1, previous)
    try:
        batcher.next(0.5)
        after = "returned"
    except Exception as exc:  # the test asserts on the type
        after = type(exc).__name__
    cuda.stream_destroy(reader)
    released, closed = held.released, batcher.closed
    # (Closed while the batch was still out, its buffer goes with the batch and the batcher: they
    # and the planes refer to each other, so with the collector.)
    del held, batcher
    gc.collect()
    return {"seen": seen, "batch_released": released, "closed": closed, "next_after": after}


def _fork_beside_release(subs, args) -> dict:
    """fork() while another thread is inside a batch's release(): the child's close() and its
    release of another batch must return at once (the lock that thread held is the parent's)."""
    batcher = eglcuda.Batcher(subs, 1, formation_timeout=0.0, pool=2)
    first, second = batcher.next(), batcher.next()
    reader = cuda.stream_create(non_blocking=True)
    join = cuda.join_streams
    inside, go_on = threading.Event(), threading.Event()

    def held_join(*a):
        inside.set()
        go_on.wait(10)
        return join(*a)

    cuda.join_streams = held_join
    releasing = threading.Thread(target=first.release, kwargs={"cuda_stream": reader})
    releasing.start()
    try:
        inside.wait(5)
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                second.release()
                batcher.close()
                code = 0
            finally:
                os._exit(code)
        deadline, status = time.monotonic() + 5, None
        while status is None and time.monotonic() < deadline:
            done, raw = os.waitpid(pid, os.WNOHANG)
            if done:
                status = os.waitstatus_to_exitcode(raw)
            else:
                time.sleep(0.01)
        if status is None:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = "hung"
    finally:
        go_on.set()
        releasing.join(10)
        cuda.join_streams = join
    parent_released = first.released and not second.released  # (the child's release was its copy's)
    with batcher.next(5) as b:  # (the parent's batcher goes on: both buffers came back)
        wrong = check_batch(b, seeds(args))
    batcher.close()
    cuda.stream_destroy(reader)
    del first, second, batcher  # (the second batch was out at the close: its buffer goes with it)
    gc.collect()
    return {"child": status, "parent_released": parent_released, "wrong": wrong}


def descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def rejoin(args) -> int:
    """Source 0's publisher replaced while the batcher runs, the program receiving from its
    subscriber and calling wait_for_publisher() itself (the batcher never sees the source end):
    the (seq, skipped) of source 0's frames batched after the join, and every byte of those
    batches against the new publisher's seed (read from stdin with "go SEED")."""
    subs = subscribers(args)
    source_seeds = seeds(args)
    batcher = eglcuda.Batcher(subs, args.batch_size, formation_timeout=args.formation_ms / 1e3)
    for _ in range(args.count):
        batcher.next().release()
    say(event="formed", seqs=batcher._last_seq)
    line = sys.stdin.readline().split()
    source_seeds[0] = int(line[1])
    try:
        while True:
            subs[0].receive(5.0).release()  # (what was queued, then the publisher's end)
    except eglcuda.StreamDisconnected as exc:
        ended = type(exc).__name__
    subs[0].wait_for_publisher(20.0)
    after: list[list[int]] = []
    wrong: list[str] = []
    while len(after) < 6 and 0 not in batcher.ended:  # (a publisher of another format: the source ends)
        with batcher.next() as formed:
            after += [[f.seq, f.skipped] for f in formed.frames if f.source == 0]
            wrong += check_batch(formed, source_seeds)
    batcher.close()
    for sub in subs:
        sub.close()
    say(event="rejoined", ended=ended, after=after, wrong=wrong[:3], left=sorted(batcher.ended),
        why={str(k): type(v).__name__ for k, v in batcher.ended.items()})
    return 0


def close_source(args) -> int:
    """Source 0's subscriber closed by another thread right after its receive handed a frame to
    the batcher, before the copy (its ``--close-after``-th frame: the first checks the slot's
    geometry, later ones are copied from the slot's address): whether the close finished before
    the copy (it must wait), what each next() raised, the sources of the batches formed, and why
    each source ended."""
    subs = subscribers(args)
    source_seeds = seeds(args)
    target = subs[0]
    taken = [0]
    receive = target.receive

    closers: list[threading.Thread] = []
    closed_under_copy: list[bool] = []

    if args.closer == "handler":  # (a signal handler of this thread closes it, as the batcher copies its frame)
        signal.signal(signal.SIGUSR1, lambda *_: target.close())

    def receive_then_close(timeout=None):
        message = receive(timeout)
        taken[0] += 1
        if taken[0] == args.close_after and args.closer == "handler":
            signal.raise_signal(signal.SIGUSR1)
        elif taken[0] == args.close_after:
            closer = threading.Thread(target=target.close)
            closer.start()
            closer.join(0.5)  # (it must wait for the batcher: the frame is not yet copied)
            closed_under_copy.append(not closer.is_alive())
            closers.append(closer)
        return message

    target.receive = receive_then_close
    raised: list[list[str]] = []
    sources: list[list[int]] = []
    wrong: list[str] = []
    closed_as_returned: list[bool] = []  # target.closed as the next() that took the frame returned (handler)
    with eglcuda.Batcher(subs, args.batch_size, formation_timeout=args.formation_ms / 1e3) as batcher:
        if args.prefill_ms:
            time.sleep(args.prefill_ms / 1e3)  # the sources' queues fill meanwhile
        while len(sources) < args.count and len(raised) < 3:
            try:
                with batcher.next() as formed:
                    if taken[0] >= args.close_after and not closed_as_returned:
                        closed_as_returned.append(target.closed)
                    sources.append(formed.sources)
                    wrong += check_batch(formed, source_seeds)
            except Exception as exc:  # the test asserts on what was raised
                raised.append([type(exc).__name__, str(exc)])
        ended = {index: type(error).__name__ for index, error in batcher.ended.items()}
    for closer in closers:
        closer.join(10)
    for sub in subs:
        sub.close()
    say(event="closed-source", taken=taken[0], raised=raised, sources=sources, ended=ended, wrong=wrong[:3],
        closed_under_copy=closed_under_copy, closed_as_returned=closed_as_returned)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["batch", "misuse", "lifecycle", "interrupt", "rejoin", "close-source"])
    parser.add_argument("--source", action="append", required=True, help="NAME:PATH:SEED of a topic")
    parser.add_argument("--remote", default=None, help="HOST:PORT: the sources are remote subscribers of that relay")
    parser.add_argument("--qos", default="every")
    parser.add_argument("--queue", type=int, default=4)
    parser.add_argument("--transport", default="auto")
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--formation-ms", type=float, default=40.0)
    parser.add_argument("--pool", type=int, default=2)
    parser.add_argument("--count", type=int, default=10, help="batches to form")
    parser.add_argument("--prefill-ms", type=float, default=0.0, help="sleep this long before the first batch")
    parser.add_argument("--sleep-ms", type=float, default=0.0, help="time spent on each batch")
    parser.add_argument("--close-sources-first", action="store_true",
                        help="close the subscribers before the batcher, a batch out meanwhile")
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--slow-reader-ms", type=float, default=0.0,
                        help="read each batch on a side stream behind a kernel this long, release, check (CuPy)")
    parser.add_argument("--via", default="dlpack", choices=["dlpack", "cai"], help="how the slow reader takes views")
    parser.add_argument("--torch", action="store_true", help="take each batch's planes with PyTorch and CuPy")
    parser.add_argument("--fake-hold", action="store_true", help="stand-in libcuda: keep the batcher's stream busy")
    parser.add_argument("--hand-to-held", action="store_true", help="stand-in libcuda: hand each batch to a busy stream")
    parser.add_argument("--hold-sources", choices=["busy", "idle"], default=None,
                        help="stand-in libcuda: the subscribers' streams busy (or idle) while a batch forms")
    parser.add_argument("--hold-second", action="store_true",
                        help="interrupt: the second source's subscriber holds its queue's worth of messages")
    parser.add_argument("--close-after", type=int, default=1,
                        help="close-source: close source 0's subscriber after this many of its frames")
    parser.add_argument("--closer", choices=["thread", "handler"], default="thread",
                        help="close-source: who closes it (another thread, or a signal handler of the batcher's)")
    args = parser.parse_args()
    roles = {"batch": batch, "misuse": misuse, "lifecycle": lifecycle, "interrupt": interrupt, "rejoin": rejoin,
             "close-source": close_source}
    return roles[args.role](args)


if __name__ == "__main__":
    sys.exit(main())
