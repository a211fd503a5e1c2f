"""The processes of the remote-subscriber tests (tests/unit/test_remote.py on the stand-in
libcuda, tests/gpu/test_remote.py on GPUs), each a fresh interpreter; progress as JSON lines.

    python tests/remote_peer.py relay --name T --path P [--qos every] [--listen 127.0.0.1:0]
    python tests/remote_peer.py subscribe --name T --remote HOST:PORT [--qos every] [--count N] ...

Frames are tests/gpu/topics_peer.py's (content is a function of seed and seq), so a remote
subscriber checks every byte. The key comes from the environment (EGLCUDA_REMOTE_KEY).
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu"))

import eglcuda  # noqa: E402
from topics_peer import _check_late_copy, check, say  # noqa: E402


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def relay(args) -> int:
    with eglcuda.Relay(args.name, args.listen, qos=args.qos, queue=args.queue, device=args.device,
                       timeout=args.timeout, path=args.path, every_timeout=args.every_timeout,
                       max_remotes=args.max_remotes) as server:
        say(event="ready", pid=os.getpid(), port=server.address[1], host=server.address[0])

        def commands() -> None:
            for line in sys.stdin:
                if line.strip() == "remotes":
                    say(event="remotes", remotes=[r.__dict__ for r in server.remotes])
                elif line.strip() == "bye":
                    break
            server.close()

        threading.Thread(target=commands, daemon=True).start()
        server.serve_forever()
    say(event="closed", threads=threading.active_count())
    return 0


def subscribe(args) -> int:
    threads, fds = threading.active_count(), open_fds()
    try:
        sub = eglcuda.Subscriber(args.name, qos=args.qos, queue=args.queue, device=args.device, timeout=args.timeout,
                                 remote=args.remote)
    except eglcuda.EglCudaError as exc:
        say(event="error", kind=type(exc).__name__, reason=str(exc), code=getattr(exc, "code", None),
            threads=threading.active_count() - threads, fds=open_fds() - fds)
        return 0
    say(event="ready", pid=os.getpid(), transport=sub.info.transport, instance=sub.info.instance,
        subscriber=isinstance(sub, eglcuda.Subscriber), info=[sub.info.width, sub.info.height, sub.info.format.name])
    held = []
    got = 0
    started = time.monotonic()
    try:
        while args.count == 0 or got < args.count:
            try:
                message = sub.receive(args.receive_timeout or args.timeout)
            except eglcuda.Timeout as exc:
                say(event="timeout", reason=str(exc))
                if args.stop_on_timeout:
                    break
                continue
            except eglcuda.StreamDisconnected as exc:
                say(event="disconnected", kind=type(exc).__name__, reason=str(exc),
                    code=getattr(exc, "code", None))
                if not args.rejoin:
                    break
                for message in held:
                    message.release()
                held.clear()
                try:
                    info = sub.wait_for_publisher(args.timeout)
                except eglcuda.EglCudaError as exc2:
                    say(event="rejoin-failed", kind=type(exc2).__name__, reason=str(exc2))
                    break
                say(event="rejoined", instance=info.instance, transport=info.transport)
                continue
            if args.late_copy_ms:
                # A long kernel reads the frame, then copies of it, all queued on the subscriber's
                # stream; the release comes before they ran: the slot's next H2D copy must wait.
                ok, why = _check_late_copy(message, args.late_copy_ms, sub.cuda_stream, args.seed)
            else:
                ok, why = check(message, args.seed) if not args.no_check else (True, "")
            say(event="got", seq=message.seq, ok=ok, why=why, skipped=message.skipped,
                latency_us=(message.received_ns - message.timestamp_ns) / 1e3)
            got += 1
            if message.released:
                continue
            held.append(message)
            if args.sleep_ms:
                time.sleep(args.sleep_ms / 1e3)
            while len(held) > args.hold:
                held.pop(0).release()
    finally:
        for message in held:
            message.release()
        sub.close()
    say(event="done", got=got, threads=threading.active_count() - threads, fds=open_fds() - fds,
        fps=got / max(1e-9, time.monotonic() - started))
    if args.wait_bye:
        sys.stdin.readline()
    return 0


def cycles(args) -> int:
    """Join, check a few frames, leave, ``--count`` times (plus a refused join and a timed-out
    one each cycle); threads and descriptors after the first cycle and after the last."""
    marks = []
    for cycle in range(args.count):
        with eglcuda.Subscriber(args.name, qos=args.qos, queue=args.queue, device=args.device, timeout=args.timeout,
                                remote=args.remote) as sub:
            for _ in range(3):
                with sub.receive(args.timeout) as message:
                    ok, why = check(message, args.seed)
                    if not ok:
                        say(event="bad", why=why)
        try:
            eglcuda.Subscriber(args.name, remote=args.remote, timeout=args.timeout, key=b"another key, 16+ bytes")
        except eglcuda.Refused:
            pass
        try:
            eglcuda.Subscriber(args.name, remote="127.0.0.1:9", timeout=0.3)
        except eglcuda.Timeout:
            pass
        if cycle in (0, args.count - 1):
            device = eglcuda.get_device(args.device)
            device.make_current()
            free = eglcuda._bind.cuda.mem_get_info()[0]  # device memory: the pool and window freed
            marks.append([threading.active_count(), open_fds(), free])
    say(event="done", marks=marks)
    return 0


def garbage(args) -> int:
    """A UCX peer that is no eglcuda subscriber: ``--mode`` magic (a HELLO with a wrong magic),
    silent (connects, says nothing), big (a message longer than a HELLO), wrongkey (a HELLO,
    then a PROOF made with another key). Says what the relay answered."""
    import asyncio

    import numpy as np
    import ucxx

    from eglcuda.remote import keys, wire

    async def run(mode: str) -> dict:
        host, port = args.remote.rsplit(":", 1)
        ep = await ucxx.create_endpoint(host, int(port))
        answer = np.zeros(wire.HANDSHAKE, np.uint8)
        if mode == "silent":
            try:
                await asyncio.wait_for(ep.recv(answer), args.timeout)
                return {"answer": "message"}
            except asyncio.TimeoutError:
                return {"answer": "none"}
            except Exception as exc:  # noqa: BLE001
                return {"answer": "closed", "error": type(exc).__name__}
        if mode == "magic":
            data = bytearray(wire.HANDSHAKE)
            data[:8] = b"NOTMAGIC"
        elif mode == "big":
            data = bytearray(np.random.default_rng(3).integers(0, 256, wire.HANDSHAKE * 4, dtype=np.uint8).tobytes())
        else:
            data = wire.encode_hello(wire.Hello(eglcuda.topics.protocol.Qos.EVERY, 4, keys.nonce(), args.name))
        await ep.send(np.frombuffer(bytes(data), np.uint8))
        try:
            await asyncio.wait_for(ep.recv(answer), args.timeout)
        except Exception as exc:  # noqa: BLE001
            return {"answer": "closed", "error": type(exc).__name__}
        kind, body = wire.handshake_kind(answer.tobytes())
        if kind is wire.Kind.REFUSE:
            code, reason = wire.decode_refuse(body)
            return {"answer": "refused", "code": code, "reason": reason}
        if mode == "wrongkey":
            await ep.send(np.frombuffer(wire.encode_proof(bytes(32)), np.uint8))
            answer[:] = 0
            try:
                await asyncio.wait_for(ep.recv(answer), args.timeout)
            except Exception as exc:  # noqa: BLE001
                return {"answer": "closed", "error": type(exc).__name__}
            kind, body = wire.handshake_kind(answer.tobytes())
            if kind is wire.Kind.REFUSE:
                code, reason = wire.decode_refuse(body)
                return {"answer": "refused", "code": code, "reason": reason}
        return {"answer": kind.name}

    async def all_modes() -> list:
        ucxx.init(progress_mode="blocking")
        return [dict(mode=mode, **await run(mode)) for mode in args.mode.split(",")]

    for answer in asyncio.run(all_modes()):
        say(event="answer", **answer)
    return 0


def main() -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # (a hung peer's stacks, for debugging)
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["relay", "subscribe", "garbage", "cycles"])
    parser.add_argument("--mode", default="magic")
    parser.add_argument("--name", required=True)
    parser.add_argument("--path", default=None)
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--remote", default=None)
    parser.add_argument("--qos", default="every")
    parser.add_argument("--queue", type=int, default=4)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--receive-timeout", type=float, default=0.0)
    parser.add_argument("--stop-on-timeout", action="store_true")
    parser.add_argument("--every-timeout", type=float, default=1.0)
    parser.add_argument("--max-remotes", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--hold", type=int, default=0)
    parser.add_argument("--sleep-ms", type=float, default=0.0)
    parser.add_argument("--rejoin", action="store_true")
    parser.add_argument("--late-copy-ms", type=float, default=0.0)
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--wait-bye", action="store_true")
    args = parser.parse_args()
    return {"relay": relay, "subscribe": subscribe, "garbage": garbage, "cycles": cycles}[args.role](args)


if __name__ == "__main__":
    sys.exit(main())
