"""Does an accepted UCX endpoint closed from this side with a receive still posted keep its
listener's port bound? One process listens (eglcuda's UCX engine, TCP loopback); a child
connects and says nothing; the listener's handler posts a stream receive (``recv``), a tagged
receive (``tag``) or none (``none``); then this side closes the endpoint and the listener and asks, once a second for 6 s,
whether the port can be bound again. ``reset``: the connection is first reset from this side
(``Unheard.reset``, as if the peer died), then the same.

Measured 2026-12-06 on a 2-core CPU machine (UCXX 0.52, UCX_TLS=tcp): ``none``: the port is free
within 1 s; ``recv``: the receive ends with an error, and the port stays bound for as long as the
process lives (also after the peer died); ``reset``: the receive ends with an error and the port is
free within 1 s. Measured again 2026-12-06 with ``tag``: the receive ends with an error and the
port is free within 1 s (only a stream receive holds it). eglcuda's relay therefore resets a connection still in its
handshake before it closes it (the handshake's time limit, the relay's close).

    python research/probes/ucx_pending_recv_probe.py [none|recv|tag|reset ...]
"""
from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time

from _needs import UCXX_HOW, answer_help, needs_module

for key, value in {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n",
                   "UCX_MODULES": "^cuda"}.items():
    os.environ.setdefault(key, value)

PEER = """
import asyncio, sys
from eglcuda.remote import _ucx
async def main():
    ep = _ucx.engine().connect('127.0.0.1', int(sys.argv[1]))  # (kept: a dropped endpoint closes)
    print('connected', flush=True)
    await asyncio.sleep(60)
_ucx.run(_ucx.acquire(), main(), 90)
"""


def port_free(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
            return True
        except OSError:
            return False


def one(mode: str) -> str:
    import numpy as np

    from eglcuda.remote import _ucx

    accepted: list = []
    ended: list[str] = []

    async def handler(ep) -> None:
        accepted.append(ep)
        if mode == "none":
            await asyncio.sleep(60)
            return
        try:
            if mode == "tag":
                ep.use_tags(12345, 54321)
                await ep.recv(np.zeros(64, np.uint8), 3)
            else:
                await ep.stream_recv(np.zeros(64, np.uint8))
            ended.append("completed")
        except Exception as exc:  # noqa: BLE001 - what ended it is the finding
            ended.append(type(exc).__name__)

    async def listen():
        return _ucx.engine().listen(0, handler, None)

    loop = _ucx.acquire()
    listener = _ucx.run(loop, listen(), 10)
    port = listener.port
    peer = subprocess.Popen([sys.executable, "-c", PEER, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        peer.stdout.readline()
        time.sleep(1.0)

        async def close() -> None:
            if mode == "reset":
                listener.unheard.reset({ep.peer for ep in accepted})
                await asyncio.sleep(0.5)
            for ep in accepted:
                ep.abort()
            listener.close()

        _ucx.run(loop, close(), 10)
        for second in range(1, 7):
            time.sleep(1.0)
            if port_free(port):
                return f"{mode}: port free after {second} s; the receive: {ended or ['still posted']}"
        return f"{mode}: port still bound after 6 s; the receive: {ended or ['still posted']}"
    finally:
        peer.kill()


def main() -> int:
    answer_help(__doc__)
    needs_module(__file__, "ucxx", UCXX_HOW)
    modes = sys.argv[1:] or ["none", "recv", "tag", "reset"]
    for mode in modes:
        if mode not in ("none", "recv", "tag", "reset"):
            print(f"ucx_pending_recv_probe.py: a mode is none, recv, tag or reset, got {mode!r}", file=sys.stderr)
            return 2
    for mode in modes:  # (each in a process of its own: a port left bound stays with its process)
        out = subprocess.run([sys.executable, __file__, "--one", mode], capture_output=True, text=True, timeout=120)
        lines = [line for line in out.stdout.splitlines() if line.strip()]
        print(lines[-1] if lines else f"{mode}: failed ({out.stderr.strip().splitlines()[-1:]})", flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        print(one(sys.argv[2]), flush=True)
        sys.exit(0)
    sys.exit(main())
