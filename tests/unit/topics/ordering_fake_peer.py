"""A publisher or subscriber that hands every frame to a stream the stand-in libcuda holds busy
(tests/fakes/driver/fake_cuda.c's fake_cuda_hold), for tests/unit/topics/test_ordering_fakecuda.py.

    python tests/unit/topics/ordering_fake_peer.py publish --path P --frames N [--hand dlpack]
    python tests/unit/topics/ordering_fake_peer.py subscribe --path P --count N [--hand dlpack|cai|none]

The publisher writes each frame with host copies (tests/gpu/topics_peer.py's content), then hands
plane 0 to the held stream as a DLPack consumer that writes it would, and publishes with no stream
named. The subscriber hands each message's plane 0 to the held stream (or through
``__cuda_array_interface__`` with the legacy default stream held) and lets the documented loop
release it. Each says, as JSON lines, whether the stream it published or released on was left
waiting for the held one.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "gpu"))

import eglcuda  # noqa: E402
from eglcuda._bind import cuda  # noqa: E402
from topics_peer import check, content, payload_of, say  # noqa: E402

NOT_READY = 600


def fake() -> ctypes.CDLL:
    library = ctypes.CDLL("libcuda.so.1")
    library.fake_cuda_hold.argtypes = [ctypes.c_void_p, ctypes.c_int]
    library.cuStreamQuery.argtypes = [ctypes.c_void_p]
    return library


def publish(args) -> int:
    library = fake()
    with eglcuda.Publisher("t", 64, 48, "NV12", pool=1, max_pool=1, path=args.path) as pub:
        say(event="ready")
        sys.stdin.readline()  # the subscriber has joined
        eglcuda.get_device(0).make_current()
        held = cuda.stream_create(non_blocking=True)
        for seq in range(args.frames):
            frame = pub.next_frame(timeout=10)
            for plane, data in zip(frame.planes, content([p.shape for p in frame.planes], args.seed, seq)):
                plane.copy_from(data)
            library.fake_cuda_hold(held, 1)
            if args.hand == "dlpack":
                frame.planes[0].__dlpack__(stream=held)  # a consumer that writes the frame on `held`
            pub.publish(frame, payload=payload_of(seq, args.seed))
            legacy_waits = library.cuStreamQuery(None) == NOT_READY
            library.fake_cuda_hold(held, 0)
            say(event="published", seq=seq, legacy_waits=legacy_waits)
        sys.stdin.readline()
    return 0


def subscribe(args) -> int:
    library = fake()
    sub = eglcuda.Subscriber("t", qos="every", queue=1, path=args.path, transport="cuda-ipc", timeout=10)
    say(event="ready")
    eglcuda.get_device(0).make_current()
    held = cuda.stream_create(non_blocking=True) if args.hand != "cai" else None  # cai: the legacy stream
    got = 0
    if args.hand == "close-behind":
        return close_behind(sub, library, held, args)
    for message in sub:
        ok, why = check(message, args.seed)
        library.fake_cuda_hold(held, 1)
        if args.hand == "dlpack":
            message.frame.planes[0].__dlpack__(stream=held)
        elif args.hand == "cai":
            message.frame.planes[0].__cuda_array_interface__
        message.release()
        own_waits = library.cuStreamQuery(sub.cuda_stream) == NOT_READY
        library.fake_cuda_hold(held, 0)
        say(event="got", seq=message.seq, ok=ok, why=why, own_waits=own_waits)
        got += 1
        if got == args.count:
            break
    sub.close()
    say(event="done", got=got)
    return 0


def close_behind(sub, library, held, args) -> int:
    """close-behind: one message, read on the held stream and released on it
    (``release(cuda_stream=held)``), then the subscriber closed at once while another thread lets
    the stream go after --hold-ms: the close must wait for it before unmapping the slot."""
    import threading
    import time
    with sub.receive(10) as message:
        ok, why = check(message, args.seed)
        library.fake_cuda_hold(held, 1)
        message.frame.planes[0].__dlpack__(stream=held)
        message.release(held)
    done_waits = library.cuStreamQuery(held) == NOT_READY
    threading.Timer(args.hold_ms / 1000, library.fake_cuda_hold, (held, 0)).start()
    started = time.monotonic()
    sub.close()
    say(event="done", ok=ok, why=why, done_waits=done_waits, close_s=time.monotonic() - started,
        held_after_close=library.cuStreamQuery(held) == NOT_READY)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["publish", "subscribe"])
    parser.add_argument("--path", required=True)
    parser.add_argument("--frames", type=int, default=5)
    parser.add_argument("--count", type=int, default=5)
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--hold-ms", type=float, default=500.0, help="close-behind: when the held stream is let go")
    parser.add_argument("--hand", default="dlpack", choices=["dlpack", "cai", "none", "close-behind"])
    args = parser.parse_args()
    return publish(args) if args.role == "publish" else subscribe(args)


if __name__ == "__main__":
    sys.exit(main())
