"""The other process of the CPU topic tests (null transport), started as a fresh interpreter.

    python tests/topics_peer.py publish --path P [--frames N] [--rate HZ] [--ring]
    python tests/topics_peer.py subscribe --path P [--qos every] [--hold K]

A publisher fills each frame with ``pattern(payload)`` (payload = the frame's key); a subscriber
checks every frame it gets against it. Progress goes to stdout as JSON lines.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import eglcuda  # noqa: E402
from topics_null import NullPublisherBackend, NullSubscriberBackend, pattern  # noqa: E402


def say(**message) -> None:
    print(json.dumps(message), flush=True)


def publish(args) -> int:
    pub = eglcuda.Publisher(args.name, 64, 32, "Y", path=args.path, every_timeout=args.every_timeout,
                            _backend=NullPublisherBackend(message_only=args.ring))
    say(event="ready", pid=os.getpid(), instance=pub.instance)
    count = 0
    period = 1.0 / args.rate if args.rate else 0.0
    while args.frames == 0 or count < args.frames:
        frame = pub.next_frame()
        key = f"{pub.instance}:{count}".encode()
        frame.data[:] = pattern(key)
        pub.publish(frame, payload=key)
        count += 1
        if period:
            time.sleep(period)
    say(event="done", published=count)
    sys.stdin.readline()
    pub.close()
    return 0


def subscribe(args) -> int:
    sub = eglcuda.Subscriber(args.name, qos=args.qos, queue=args.queue, path=args.path, timeout=10,
                             _backend=NullSubscriberBackend())
    say(event="ready", pid=os.getpid(), transport=sub.info.transport)
    held = []
    while True:
        try:
            message = sub.receive(10)
        except eglcuda.StreamDisconnected as exc:
            say(event="disconnected", kind=type(exc).__name__, reason=str(exc))
            return 0
        ok = message.frame.data == pattern(message.payload)
        say(event="got", seq=message.seq, ok=ok)
        held.append(message)
        if len(held) > args.hold:
            held.pop(0).release()
        if len(held) >= args.queue:  # it may hold no more: wait, holding them, to be killed or told
            sys.stdin.readline()
            return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["publish", "subscribe"])
    parser.add_argument("--path", required=True)
    parser.add_argument("--name", default="t")
    parser.add_argument("--frames", type=int, default=0)
    parser.add_argument("--rate", type=float, default=0.0)
    parser.add_argument("--every-timeout", type=float, default=1.0)
    parser.add_argument("--qos", default="every")
    parser.add_argument("--queue", type=int, default=4)
    parser.add_argument("--hold", type=int, default=0)
    parser.add_argument("--ring", action="store_true", help="frames through the frame ring (as cuda-ipc)")
    args = parser.parse_args()
    return publish(args) if args.role == "publish" else subscribe(args)


if __name__ == "__main__":
    sys.exit(main())
