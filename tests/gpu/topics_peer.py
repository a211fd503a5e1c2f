"""The other processes of the GPU topic tests, each a fresh interpreter.

    python tests/gpu/topics_peer.py subscribe --name T [--qos every] [--transport cuda-ipc] ...
    python tests/gpu/topics_peer.py publish --name T --width W --height H --format F ...
    python tests/gpu/topics_peer.py gl --name T        (a GL texture subscriber, ARGB topics)
    python tests/gpu/topics_peer.py cycles --name T --count N

Frame content is a function of (seed, seq) (see :func:`content`), so a subscriber checks every
byte of every frame without the publisher sending data. Progress goes to stdout as JSON lines.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

import numpy as np  # noqa: E402

import eglcuda  # noqa: E402

_bases: dict = {}


def content(shapes, seed: int, seq: int) -> list[np.ndarray]:
    """The planes of frame ``seq``: a fixed random image per (seed, plane shape) plus a value
    that changes with every frame, so a frame mixing two frames' bytes never matches."""
    out = []
    for index, shape in enumerate(shapes):
        key = (seed, index, tuple(shape))
        base = _bases.get(key)
        if base is None:
            base = _bases[key] = np.random.default_rng([seed, index]).integers(0, 256, shape, dtype=np.uint8)
        out.append(base + np.uint8((seq * 37 + 11) % 256))
    return out


def payload_of(seq: int, seed: int) -> bytes:
    return f"seed={seed} seq={seq}".encode()


def say(**message) -> None:
    print(json.dumps(message), flush=True)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def check(message, seed: int) -> tuple[bool, str]:
    """Every byte of a received frame, and its payload."""
    if message.payload != payload_of(message.seq, seed):
        return False, f"payload {message.payload!r}"
    planes = message.frame.planes
    want = content([p.shape for p in planes], seed, message.seq)
    for index, (plane, expected) in enumerate(zip(planes, want)):
        got = plane.to_numpy()
        bad = int(np.count_nonzero(got != expected))
        if bad:
            return False, f"plane {index}: {bad} of {got.size} bytes differ"
    return True, ""


def _lie_about_done_events() -> None:
    """A hostile cuda-ipc subscriber: each release says its "done" event was recorded and hands
    the publisher, as that event, the publisher's own event of the slot (sent to every
    subscriber with the slot)."""
    from eglcuda.topics import protocol
    from eglcuda.topics.transports import cuda_ipc

    honest_on_slot = cuda_ipc.CudaIpcSubscriber.on_slot
    events: dict = {}

    def on_slot(self, slot, fds=()):
        events[slot.slot] = cuda_ipc._IPC_SLOT.unpack(slot.extra)[1]
        honest_on_slot(self, slot, fds)

    def release(self, obj, frame, cuda_stream):
        obj._released = True
        return protocol.RELEASE_RECORDED | protocol.RELEASE_TAKEN, events[frame.slot]

    cuda_ipc.CudaIpcSubscriber.on_slot = on_slot
    cuda_ipc.CudaIpcSubscriber.release = release


def subscribe(args) -> int:
    if args.lie_done_event:
        _lie_about_done_events()
    sub = eglcuda.Subscriber(args.name, qos=args.qos, queue=args.queue, device=args.device, timeout=args.timeout,
                             path=args.path, transport=args.transport)
    say(event="ready", pid=os.getpid(), transport=sub.info.transport, instance=sub.info.instance,
        info=[sub.info.width, sub.info.height, sub.info.format.name, sub.info.fps])
    held = []
    got = 0
    # An EGLStream consumer holds one frame at a time.
    hold = 0 if sub.info.transport == "eglstream" else args.hold
    try:
        while args.count == 0 or got < args.count:
            try:
                message = sub.receive(args.timeout)
            except eglcuda.StreamDisconnected as exc:
                say(event="disconnected", kind=type(exc).__name__, reason=str(exc))
                if not args.rejoin:
                    break
                info = sub.wait_for_publisher(args.timeout)
                say(event="rejoined", instance=info.instance, transport=info.transport)
                continue
            if args.late_copy_ms:
                # Read the frame on the GPU after a long kernel, release it at once, check later:
                # the publisher's next write into the slot must wait for this reading.
                ok, why = _check_late_copy(message, args.late_copy_ms, sub.cuda_stream, args.seed)
            else:
                ok, why = check(message, args.seed) if not args.no_check else (True, "")
            latency_us = (message.received_ns - message.timestamp_ns) / 1e3
            say(event="got", seq=message.seq, ok=ok, why=why, skipped=message.skipped, latency_us=latency_us)
            got += 1
            if args.kernel_ms:
                _queue_long_kernel(message, args.kernel_ms, sub.cuda_stream)
            held.append(message)
            if args.sleep_ms:
                time.sleep(args.sleep_ms / 1e3)
            while len(held) > hold:
                held.pop(0).release()
    finally:
        for message in held:
            message.release()
        sub.close()
    say(event="done", got=got)
    return 0


def _queue_long_kernel(message, milliseconds: float, stream: int) -> None:
    """Queue a kernel that reads the frame for ``milliseconds`` on the subscriber's stream (CuPy),
    so a release records the done event behind it."""
    import cupy

    spin = cupy.RawKernel(r'''
    extern "C" __global__ void spin(const unsigned char *frame, unsigned long long nanoseconds, unsigned int *sink) {
        unsigned long long start, now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
        unsigned int acc = 0;
        do {
            acc += frame[threadIdx.x];
            asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        } while (now - start < nanoseconds);
        if (acc == 0xFFFFFFFFu) { sink[0] = acc; }
    }''', "spin")
    sink = cupy.zeros(1, cupy.uint32)
    with cupy.cuda.ExternalStream(stream):
        spin((1,), (32,), (message.frame.planes[0].pointer, cupy.uint64(int(milliseconds * 1e6)), sink))


def _check_late_copy(message, milliseconds: float, stream: int, seed: int) -> tuple[bool, str]:
    """Queue a long kernel, then copies of every plane, on ``stream``; release the message before
    either ran; then wait for the copies and check every byte (CuPy)."""
    import cupy

    seq, payload = message.seq, message.payload
    planes = message.frame.planes
    shapes = [tuple(p.shape) for p in planes]
    copies = [cupy.empty((p.height, p.geometry.row_bytes), cupy.uint8) for p in planes]
    cupy.cuda.Device().synchronize()  # the allocations are done before the kernel is queued
    external = cupy.cuda.ExternalStream(stream)
    _queue_long_kernel(message, milliseconds, stream)
    # Driver copies (cuMemcpy2DAsync) queued behind the kernel: nothing to compile on the way.
    for plane, copy in zip(planes, copies):
        plane.copy_to_device(copy.data.ptr, plane.geometry.row_bytes, stream)
    busy = not external.done
    message.release()
    external.synchronize()
    if not busy:
        return False, "the stream finished the kernel before the release: the test proves nothing"
    if payload != payload_of(seq, seed):
        return False, f"payload {payload!r}"
    for index, (copy, expected) in enumerate(zip(copies, content(shapes, seed, seq))):
        bad = int(np.count_nonzero(copy.get().reshape(expected.shape) != expected))
        if bad:
            return False, f"plane {index}: {bad} of {expected.size} bytes differ (written again before it was read?)"
    return True, ""


def publish(args) -> int:
    pub = eglcuda.Publisher(args.name, args.width, args.height, args.format, layout=args.layout, fps=args.fps,
                            pool=args.pool, device=args.device, every_timeout=args.every_timeout, path=args.path,
                            transports=args.offer.split(",") if args.offer else None)
    say(event="ready", pid=os.getpid(), instance=pub.instance)
    told = threading.Event()  # --until-told: a line on stdin ends the publishing
    if args.until_told:
        threading.Thread(target=lambda: (sys.stdin.readline(), told.set()), daemon=True).start()
    seq = 0
    due = time.monotonic()
    try:
        while (args.frames == 0 or seq < args.frames) and not told.is_set():
            frame = pub.next_frame(timeout=30)
            for plane, data in zip(frame.planes, content([p.shape for p in frame.planes], args.seed, seq)):
                plane.copy_from(data)
            published = pub.publish(frame, payload=payload_of(seq, args.seed))
            assert published == seq
            seq += 1
            if args.rate and args.steady:  # (the rate itself, whatever making a frame took)
                due += 1.0 / args.rate
                time.sleep(max(0.0, due - time.monotonic()))
            elif args.rate:
                time.sleep(1.0 / args.rate)
        say(event="published", count=seq, subscribers=[s.transport for s in pub.subscribers])
        if not args.until_told:
            sys.stdin.readline()
    finally:
        pub.close()
    return 0


def gl(args) -> int:
    """A GL subscriber: frames land in an external texture; every texel is read back and checked
    (ARGB topics: memory order B, G, R, A, read as R, G, B, A)."""
    with eglcuda.Display.for_cuda_device(args.device) as display, display.create_context() as context:
        sub = eglcuda.Subscriber(args.name, qos=args.qos, queue=args.queue, timeout=args.timeout, path=args.path,
                                 gl_context=context)
        say(event="ready", pid=os.getpid(), transport=sub.info.transport)
        got = 0
        try:
            while got < args.count:
                with sub.receive(args.timeout) as message:
                    texels = message.frame.read(sub.info.width, sub.info.height)
                    (want,) = content([(sub.info.height, sub.info.width, 4)], args.seed, message.seq)
                    bad = int(np.count_nonzero(texels != want[..., [2, 1, 0, 3]]))
                    ok = bad == 0 and message.payload == payload_of(message.seq, args.seed)
                    say(event="got", seq=message.seq, ok=ok, why=f"{bad} bytes differ" if bad else "",
                        skipped=message.skipped)
                got += 1
        finally:
            sub.close()
    say(event="done", got=got)
    return 0


def cycles(args) -> int:
    """Join, check one frame, leave, ``count`` times; descriptors and free device memory after
    the first and the last cycle."""
    device = eglcuda.get_device(args.device)
    fds, free = [], []
    for cycle in range(args.count):
        sub = eglcuda.Subscriber(args.name, qos=args.qos, queue=args.queue, device=args.device, timeout=args.timeout,
                                 path=args.path, transport=args.transport)
        with sub.receive(args.timeout) as message:
            ok, why = check(message, args.seed)
            if not ok:
                say(event="error", message=f"cycle {cycle}: frame {message.seq}: {why}")
                return 1
        sub.close()
        if cycle in (9, args.count - 1):  # after a warm-up
            import gc

            gc.collect()
            fds.append(open_fds())
            free.append(device.memory_info()[0])
    say(event="done", fds=fds, free_memory=free)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["subscribe", "publish", "gl", "cycles"])
    parser.add_argument("--name", required=True)
    parser.add_argument("--path", default=None)
    parser.add_argument("--qos", default="every")
    parser.add_argument("--queue", type=int, default=4)
    parser.add_argument("--transport", default="auto")
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--count", type=int, default=0, help="frames to receive (0: until disconnected)")
    parser.add_argument("--hold", type=int, default=0, help="messages kept before releasing the oldest")
    parser.add_argument("--sleep-ms", type=float, default=0.0, help="time spent on each frame (a slow subscriber)")
    parser.add_argument("--kernel-ms", type=float, default=0.0, help="a GPU kernel reading each frame (CuPy)")
    parser.add_argument("--late-copy-ms", type=float, default=0.0,
                        help="copy each frame on the GPU behind a kernel of this length, release, then check (CuPy)")
    parser.add_argument("--rejoin", action="store_true", help="wait for a restarted publisher when it dies")
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--lie-done-event", action="store_true",
                        help="cuda-ipc: release with the publisher's own slot event as the done event")
    parser.add_argument("--width", type=int, default=1920)
    parser.add_argument("--height", type=int, default=1080)
    parser.add_argument("--format", default="NV12")
    parser.add_argument("--layout", default="pitch")
    parser.add_argument("--fps", type=float, default=None)
    parser.add_argument("--pool", type=int, default=8)
    parser.add_argument("--every-timeout", type=float, default=5.0)
    parser.add_argument("--frames", type=int, default=0)
    parser.add_argument("--until-told", action="store_true",
                        help="publisher: publish until a line comes on stdin (or --frames), then close")
    parser.add_argument("--offer", default="", help="publisher: the transports offered (comma-separated)")
    parser.add_argument("--rate", type=float, default=0.0)
    parser.add_argument("--steady", action="store_true", help="publish: --rate frames a second exactly "
                        "(a frame due every 1/rate s), not a pause of 1/rate s after each frame")
    args = parser.parse_args()
    return {"subscribe": subscribe, "publish": publish, "gl": gl, "cycles": cycles}[args.role](args)


if __name__ == "__main__":
    sys.exit(main())
