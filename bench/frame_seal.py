"""What protecting a remote frame costs on this CPU: each of a relay's frame modes (``Relay(frames=
...)``: plain, integrity, encrypted), sealed by the relay and opened by the subscriber, per frame
of each size, in the same run as the MACs and AEADs one could use instead (pyca/cryptography's
ChaCha20-Poly1305 and Poly1305, the standard library's keyed BLAKE2b), each over the same buffer.

    python bench/frame_seal.py [--sizes 1080p-nv12,4k-argb] [--repeat 50]

Prints a table: milliseconds per frame (the fastest of --repeat runs) and the frames per second
one core could do at that cost. The end-to-end rate with each mode over UCX: ``python bench/remote.py
--frame-modes integrity,encrypted`` (docs/security.md). Exits 2 with one line without eglcuda or
pyca/cryptography.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import pathlib
import sys
import time
from typing import Callable

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _script import CRYPTOGRAPHY, listed, require, run  # noqa: E402

PROGRAM = "bench/frame_seal.py"
SIZES = {"1080p-nv12": 1920 * 1080 * 3 // 2, "4k-argb": 3840 * 2160 * 4}


def timed(step: Callable[[], object], repeat: int) -> float:
    """The fastest of ``repeat`` runs of ``step`` (after one warm-up), in seconds: on a shared
    machine the other runs measure the neighbours too."""
    step()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1080p-nv12,4k-argb", help=f"from {','.join(SIZES)}")
    parser.add_argument("--repeat", type=int, default=50, help="runs of each step (the median counts)")
    args = parser.parse_args()
    sizes = listed(parser, "--sizes", args.sizes, f"sizes from {','.join(SIZES)}", choices=SIZES)
    if args.repeat < 1:
        parser.error(f"--repeat is 1 or more, got {args.repeat}")
    require(PROGRAM, modules=[CRYPTOGRAPHY])
    import numpy as np
    from cryptography.hazmat.primitives import poly1305
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305

    from eglcuda.remote import wire
    from eglcuda.remote.session import FrameMode

    key = os.urandom(32)
    nonce = bytes(12)
    print(f"| size | what | ms per frame | frames/s on one core |\n|---|---|---:|---:|")
    for size in sizes:
        frame = SIZES[size]
        message = np.frombuffer(os.urandom(wire.message_bytes(frame)), np.uint8).copy()
        data = memoryview(message)[wire.DATA_AT:wire.DATA_AT + frame]
        rows: list[tuple[str, float]] = []
        for mode in FrameMode:
            sealer, opener = wire.frame_seal(key, mode), wire.frame_seal(key, mode)
            wire.pack_frame(message, 1, 0, b"")

            def both() -> None:
                sealer.seal(message)
                opener.open(message)

            rows.append((f"frames={mode.name.lower()}: seal + open", timed(both, args.repeat)))
        aes, chacha = AESGCM(key), ChaCha20Poly1305(key)
        rows += [("AES-256-GCM tag over the frame (GMAC)", timed(lambda: aes.encrypt(nonce, b"", data), args.repeat)),
                 ("AES-256-GCM encryption", timed(lambda: aes.encrypt(nonce, data, b""), args.repeat)),
                 ("ChaCha20-Poly1305 tag over the frame", timed(lambda: chacha.encrypt(nonce, b"", data), args.repeat)),
                 ("ChaCha20-Poly1305 encryption", timed(lambda: chacha.encrypt(nonce, data, b""), args.repeat)),
                 ("Poly1305 (one-time key)", timed(lambda: poly1305.Poly1305.generate_tag(key, data), args.repeat)),
                 ("BLAKE2b keyed", timed(lambda: hashlib.blake2b(data, key=key).digest(), args.repeat))]
        for what, seconds in rows:
            print(f"| {size} | {what} | {seconds * 1e3:.3f} | {1 / seconds:,.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
