"""A subscriber process for tests/unit/topics/test_waitset.py: it subscribes to several topics
(``every``, sleeping at once in every wait), waits on them all in one thread through a
:class:`eglcuda.WaitSet`, ``selectors`` over ``fileno()`` or asyncio, receives with
``timeout=0`` (a random moment of work before each), checks each frame's bytes against its
payload, and prints one JSON line: per topic, the sequence numbers in the order they came, the
SHA-256 of the payloads in that order and how many frames were wrong.

    python waitset_peer.py MODE COUNT QUEUE PATH...      (MODE: waitset, selectors or async)
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import pathlib
import random
import selectors
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

import eglcuda  # noqa: E402
from topics_null import NullSubscriberBackend, pattern  # noqa: E402


class Tally:
    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.digest = hashlib.sha256()
        self.wrong = 0

    def take(self, message: eglcuda.Message) -> None:
        with message:
            self.seqs.append(message.seq)
            self.digest.update(len(message.payload).to_bytes(4, "little") + message.payload)
            self.wrong += message.frame.data != pattern(message.payload)


def drain(sub: eglcuda.Subscriber, tally: Tally, count: int, jitter: random.Random) -> None:
    """Receive what is there (timeout=0) until Timeout: the descriptor is quiet only then."""
    while len(tally.seqs) < count:
        for _ in range(jitter.randrange(2000)):  # (0-50 us: the moment this side arms sweeps across the writes)
            pass
        try:
            message = sub.receive(0)
        except eglcuda.Timeout:
            return
        tally.take(message)


def main() -> int:
    mode, count, queue, paths = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    subs = [eglcuda.Subscriber("t", qos="every", queue=queue, path=path, timeout=10, busy_wait=0,
                               _backend=NullSubscriberBackend()) for path in paths]
    tallies = [Tally() for _ in subs]
    jitter = random.Random(count)
    print(json.dumps({"event": "ready", "ring": [sub._conn.ring is not None for sub in subs]}), flush=True)
    try:
        if mode == "waitset":
            with eglcuda.WaitSet() as waits:
                index = {id(waits.attach(sub)): i for i, sub in enumerate(subs)}
                while any(len(t.seqs) < count for t in tallies):
                    events = waits.wait(10)
                    if not events:
                        raise eglcuda.Timeout("the wait set said nothing for 10 s (a lost wake-up)")
                    for event in events:
                        if event.kind != "message":
                            raise event.error or AssertionError(event)
                        i = index[id(event.attachment)]
                        drain(subs[i], tallies[i], count, jitter)
        elif mode == "selectors":
            with selectors.DefaultSelector() as selector:
                for i, sub in enumerate(subs):
                    selector.register(sub, selectors.EVENT_READ, i)
                while any(len(t.seqs) < count for t in tallies):
                    ready = selector.select(10)
                    if not ready:
                        raise eglcuda.Timeout("the selector said nothing for 10 s (a lost wake-up)")
                    for key, _ in ready:
                        drain(subs[key.data], tallies[key.data], count, jitter)
        else:
            async def one(sub: eglcuda.Subscriber, tally: Tally) -> None:
                while len(tally.seqs) < count:
                    tally.take(await sub.receive_async(10))

            async def every() -> None:
                await asyncio.gather(*(one(sub, tally) for sub, tally in zip(subs, tallies)))

            asyncio.run(every())
    except eglcuda.EglCudaError as exc:
        print(json.dumps({"event": "failed", "error": f"{type(exc).__name__}: {exc}",
                          "got": [len(t.seqs) for t in tallies]}), flush=True)
        return 1
    print(json.dumps({"event": "done", "seqs": [t.seqs for t in tallies],
                      "sha256": [t.digest.hexdigest() for t in tallies],
                      "wrong": sum(t.wrong for t in tallies)}), flush=True)
    for sub in subs:
        sub.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
