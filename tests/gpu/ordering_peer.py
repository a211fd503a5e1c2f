"""A subscriber process of the ordering race harness (tests/gpu/test_ordering.py): the loop
docs/topics.md shows, with a slow GPU reader on one kind of stream (tests/gpu/ordering_kit.py).

    python tests/gpu/ordering_peer.py --name T --path P --transport cuda-ipc --reader torch-side --count 30

Each message's plane 0 is read on the reader's stream behind a spin kernel, and the loop goes on
(releasing the message) before the read ran. At the end every copy is checked against the frame
the publisher wrote (tests/gpu/topics_peer.py's content). Progress goes to stdout as JSON lines.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

import numpy as np  # noqa: E402

import eglcuda  # noqa: E402
from ordering_kit import Kit, as_numpy  # noqa: E402
from topics_peer import content, say  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--path", required=True)
    parser.add_argument("--transport", required=True)
    parser.add_argument("--reader", required=True)
    parser.add_argument("--count", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--spin-ms", type=float, default=12.0)
    args = parser.parse_args()
    kit = Kit(args.spin_ms)
    if args.reader.startswith("torch"):
        import torch

        torch.zeros(1, device="cuda")  # CUDA initialized: the reader's first frame is not the slow one
    own = kit.cupy_side.ptr if args.reader == "subscriber-stream" else None  # Subscriber(cuda_stream=...)
    sub = eglcuda.Subscriber(args.name, qos="every", queue=1, path=args.path, transport=args.transport, timeout=30,
                             cuda_stream=own)
    say(event="ready", transport=sub.info.transport)
    copies = []
    for message in sub:  # the documented loop: each step releases the previous message
        plane = message.frame.planes[0]
        if args.reader == "subscriber-stream":
            copies.append((message.seq, kit.read_raw(plane, message.frame.cuda_stream)))
        else:
            copies.append((message.seq, kit.read(args.reader, plane)))
        if len(copies) == args.count:
            message.release()
            break
    kit.finish()
    sub.close()
    wrong = []
    for seq, copy in copies:
        got = as_numpy(copy).reshape(-1)
        (want,) = content([(sub.info.height, sub.info.width)], args.seed, seq)
        if not np.array_equal(got, want.reshape(-1)):
            wrong.append(seq)
    say(event="done", got=len(copies), wrong=wrong)
    return 0


if __name__ == "__main__":
    sys.exit(main())
