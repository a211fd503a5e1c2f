"""A subscriber process for tests/unit/topics/test_ring.py: it sleeps at once in every wait
(``busy_wait=0``), takes ``--count`` frames of an ``every`` topic (a random moment of work before
each), checks each frame's bytes against
its payload (tests/topics_null.py's pattern), and prints one JSON line: the sequence numbers in
the order they came, the SHA-256 of the payloads in that order, and how many frames were wrong.

    python ring_peer.py PATH COUNT QUEUE
"""
from __future__ import annotations

import hashlib
import json
import pathlib
import random
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import eglcuda  # noqa: E402
from topics_null import NullSubscriberBackend, pattern  # noqa: E402


def main() -> int:
    path, count, queue = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sub = eglcuda.Subscriber("t", qos="every", queue=queue, path=path, timeout=10, busy_wait=0,
                             _backend=NullSubscriberBackend())
    print(json.dumps({"event": "ready", "ring": sub._conn.ring is not None}), flush=True)
    seqs, wrong, digest, jitter = [], 0, hashlib.sha256(), random.Random(count)
    try:
        for _ in range(count):
            for _ in range(jitter.randrange(40)):  # (a few microseconds of work, random: the moments
                pass  # this side goes to sleep sweep across the publisher's writes)
            with sub.receive(10) as message:
                seqs.append(message.seq)
                digest.update(len(message.payload).to_bytes(4, "little") + message.payload)
                wrong += message.frame.data != pattern(message.payload)
    except eglcuda.EglCudaError as exc:
        print(json.dumps({"event": "failed", "error": f"{type(exc).__name__}: {exc}", "got": len(seqs)}), flush=True)
        return 1
    print(json.dumps({"event": "done", "seqs": seqs, "sha256": digest.hexdigest(), "wrong": wrong}), flush=True)
    sub.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
