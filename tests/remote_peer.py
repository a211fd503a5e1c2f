"""The processes of the remote-subscriber tests (tests/unit/test_remote.py on the stand-in
libcuda, tests/gpu/test_remote.py on GPUs), each a fresh interpreter; progress as JSON lines.

    python tests/remote_peer.py relay --name T --path P [--qos every] [--listen 127.0.0.1:0]
    python tests/remote_peer.py subscribe --name T --remote HOST:PORT [--qos every] [--count N] ...

Frames are tests/gpu/topics_peer.py's (content is a function of seed and seq), so a remote
subscriber checks every byte. The key comes from the environment (EGLCUDA_REMOTE_KEY).
"""
from __future__ import annotations

import argparse
import asyncio
import faulthandler
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu"))

import eglcuda  # noqa: E402
from topics_peer import _check_late_copy, check, say  # noqa: E402


CU_STREAM_PER_THREAD = 0x2  # (cuda.h: the calling thread's per-thread default stream)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def relay(args) -> int:
    if args.join_timeout:
        # (the relay's own join to its publisher gets this, its remotes' limits keep --timeout: a
        # test of a tiny timeout then does not depend on a local join finishing within it)
        import eglcuda.remote.relay as relay_module
        made = relay_module.Subscriber
        relay_module.Subscriber = lambda *a, **k: made(*a, **{**k, "timeout": args.join_timeout})  # type: ignore
    with eglcuda.Relay(args.name, args.listen, qos=args.qos, queue=args.queue, device=args.device,
                       timeout=args.timeout, path=args.path, every_timeout=args.every_timeout,
                       max_remotes=args.max_remotes, frames=args.frames) as server:
        say(event="ready", pid=os.getpid(), port=server.address[1], host=server.address[0],
            progress="thread" if eglcuda.remote._ucx.engine().threaded else "loop")

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


def _waiting_receive(sub, how: str):
    """``receive(timeout)`` done as a program that waits on many would: a wait on the subscriber
    (a WaitSet, or asyncio's receive_async), then ``receive(timeout=0)``; an error event raises."""
    if how == "asyncio":
        return lambda timeout: asyncio.run(sub.receive_async(timeout))
    waits = eglcuda.WaitSet()
    waits.attach(sub)

    def receive(timeout):
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise eglcuda.Timeout("no frame came through the wait set in time")
            for event in waits.wait(left):
                if event.kind == "error":
                    raise event.error
                try:
                    return sub.receive(0)
                except eglcuda.Timeout:
                    pass  # (a descriptor readable with nothing to receive: rare, and allowed)

    return receive


def subscribe(args) -> int:
    threads, fds = threading.active_count(), open_fds()
    try:
        sub = eglcuda.Subscriber(args.name, qos=args.qos, queue=args.queue, device=args.device, timeout=args.timeout,
                                 remote=args.remote, frames=args.frames,
                                 cuda_stream=CU_STREAM_PER_THREAD if args.per_thread_stream else None)
    except eglcuda.EglCudaError as exc:
        say(event="error", kind=type(exc).__name__, reason=str(exc), code=getattr(exc, "code", None),
            threads=threading.active_count() - threads, fds=open_fds() - fds)
        return 0
    feed = sub._remote  # (its receiver's tag prefixes: what an observer of its traffic would learn)
    link = feed._link if feed is not None else None
    say(event="ready", pid=os.getpid(), transport=sub.info.transport, instance=sub.info.instance,
        subscriber=isinstance(sub, eglcuda.Subscriber), info=[sub.info.width, sub.info.height, sub.info.format.name],
        tags=[link.ep.recv_prefix, link.ep.send_prefix] if link is not None else None)
    if args.wait_go:  # (joined, and receives nothing until told: a test looks at the relay meanwhile)
        sys.stdin.readline()
    held = []
    got = 0
    started = time.monotonic()
    receive = _waiting_receive(sub, args.wait) if args.wait else sub.receive
    try:
        while args.count == 0 or got < args.count:
            try:
                message = receive(args.receive_timeout or args.timeout)
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
                if args.close_during_rejoin_ms:  # another thread closes the subscriber while it waits
                    threading.Timer(args.close_during_rejoin_ms / 1e3, sub.close).start()
                began = time.monotonic()
                try:
                    info = sub.wait_for_publisher(args.rejoin_timeout or args.timeout)
                except eglcuda.EglCudaError as exc2:
                    say(event="rejoin-failed", kind=type(exc2).__name__, reason=str(exc2),
                        waited=time.monotonic() - began)
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
                latency_us=(message.received_ns - message.timestamp_ns) / 1e3, published_ns=message.timestamp_ns,
                received_ns=message.received_ns)
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
            eglcuda.Subscriber(args.name, remote=args.remote, timeout=args.timeout, key=os.urandom(32))
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


def forked(args) -> int:
    """A remote subscriber receives, the process forks: the child's close() of it leaves the
    parent's alone, and a new one in the child is a UsageError; the parent goes on receiving."""
    sub = eglcuda.Subscriber(args.name, qos="every", timeout=args.timeout, remote=args.remote)
    with sub.receive(args.timeout) as message:
        first = check(message, args.seed)[0]
    held = sub.receive(args.timeout)  # (held across the fork: the child's release leaves it to the parent)
    pid = os.fork()
    if pid == 0:  # the child: no Python exit handlers (the parent's engine is not ours)
        code = 5
        try:
            held.release()
            sub.close()
            try:
                eglcuda.Subscriber(args.name, timeout=1.0, remote=args.remote)
                code = 3
            except eglcuda.UsageError as exc:
                code = 0 if "fork" in str(exc) else 4
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    oks = [first, check(held, args.seed)[0]]
    held.release()
    for _ in range(args.count):
        with sub.receive(args.timeout) as message:
            oks.append(check(message, args.seed)[0])
    sub.close()
    say(event="done", child=os.waitstatus_to_exitcode(status), ok=all(oks), got=len(oks))
    return 0


def hold_limit(args) -> int:
    """Hold as many messages as a remote subscriber may (``--count``), ask for one more (a
    UsageError, nothing lost), release one, receive again; every message's bytes checked."""
    with eglcuda.Subscriber(args.name, qos=args.qos, queue=args.queue, timeout=args.timeout,
                            remote=args.remote) as sub:
        held = [sub.receive(args.timeout) for _ in range(args.count)]
        try:
            sub.receive(args.timeout)
            refused = ""
        except eglcuda.UsageError as exc:
            refused = str(exc)
        oks = [check(message, args.seed)[0] for message in held]
        held.pop(0).release()
        held.append(sub.receive(args.timeout))
        oks.append(check(held[-1], args.seed)[0])
        seqs = [message.seq for message in held]
        for message in held:
            message.release()
        after = sub.receive(args.timeout)
        oks.append(check(after, args.seed)[0])
        after.release()
    say(event="done", refused=refused, ok=all(oks), seqs=seqs)
    return 0


def dropped(args) -> int:
    """A remote subscriber receives a frame and is dropped without close(); once collected, it
    leaves the relay (the relay's listing says so) while this process lives on. ``--message``:
    what becomes of its message: ``released`` first, or ``kept``: still held, every byte checked
    again after the test's first line, then released."""
    import gc

    sub = eglcuda.Subscriber(args.name, qos=args.qos, timeout=args.timeout, remote=args.remote)
    message = sub.receive(args.timeout)
    ok = check(message, args.seed)[0]
    kept = message if args.message == "kept" else None
    if kept is None:
        message.release()
    del sub, message
    gc.collect()
    say(event="dropped", ok=ok)
    sys.stdin.readline()  # (alive until the test looked at the relay)
    if kept is not None:
        time.sleep(0.2)
        ok = check(kept, args.seed)[0]
        kept.release()
        say(event="released", ok=ok)
        sys.stdin.readline()
    return 0


def pair(args) -> int:
    """Two remote subscribers in this one process, on two relays (``--remote`` and ``--remote2``,
    publishers seeded ``--seed`` and ``--seed2``), received in turn: every byte of ``--count``
    frames of each is checked against its own publisher's seed."""
    subs = [eglcuda.Subscriber(args.name, qos="every", queue=args.queue, timeout=args.timeout, remote=remote)
            for remote in (args.remote, args.remote2)]
    try:
        say(event="ready")
        seqs: list[list[int]] = [[], []]
        bad = []
        while min(len(s) for s in seqs) < args.count:
            for index, (sub, seed) in enumerate(zip(subs, (args.seed, args.seed2))):
                if len(seqs[index]) >= args.count:
                    continue
                with sub.receive(args.timeout) as message:
                    ok, why = check(message, seed)
                    seqs[index].append(message.seq)
                    if not ok:
                        bad.append([index, message.seq, why])
        say(event="done", seqs=seqs, bad=bad)
    finally:
        for sub in subs:
            sub.close()
    return 0


async def send_raw(ep, prefix: int, kind: int, data) -> None:
    """Send ``data`` on the raw tag ``prefix << 8 | kind`` of endpoint ``ep`` (eglcuda.remote._ucx's):
    what a peer that learnt the tag from the wire could send."""
    import numpy as np

    from eglcuda.remote import _ucx

    engine = _ucx.engine()
    array = data if isinstance(data, np.ndarray) else np.frombuffer(bytes(data), np.uint8)
    await engine.wait(ep._ep.tag_send(engine.arr(array), engine.api.UCXXTag((prefix << 8) | kind)))


FLOOD_BYTES = 48_000_000  # (forge: what would stay in the relay's memory if nothing dropped it)


def forge(args) -> int:
    """A subscriber with the key that joins the relay, then sends, on another subscriber's tag
    (read from stdin: what an observer of the wire learns), a BYE and a credit sealed under its own
    session, random bytes, a control message too long for any buffer, and FLOOD_BYTES of messages
    of the kinds the relay never receives (FRAME, NOTE). Says when it did."""
    import numpy as np

    from eglcuda.remote import _ucx, wire

    sub = eglcuda.Subscriber(args.name, qos="every", queue=4, device=args.device, timeout=args.timeout,
                             remote=args.remote)
    say(event="ready")
    prefix = int(sys.stdin.readline())
    ep = sub._remote._link.ep  # (the remote feed's receiver)

    async def run() -> None:
        for data in (wire.encode_control(ep.session, wire.Control.BYE),
                     wire.encode_control(ep.session, wire.Control.CREDIT, wire.MAX_WINDOW), np.random.bytes(wire.CONTROL),
                     np.random.bytes(4096)):
            await send_raw(ep, prefix, wire.CONTROL_TAG, data)
        chunk = np.random.bytes(8000)
        for index in range(FLOOD_BYTES // len(chunk)):
            await send_raw(ep, prefix, (wire.FRAME_TAG, wire.NOTE_TAG)[index % 2], chunk)

    _ucx.run(_ucx.acquire(), run(), 10)
    say(event="forged")
    sys.stdin.readline()
    sub.close()
    return 0


def beats(args) -> int:
    """A subscriber with the key that joins, then sends ``--count`` BEATs sealed under its own
    session on its own control tag as fast as UCX takes them (each opens at the relay: only their
    number is wrong), going on for 3 s after it was dropped. Says how many it sent and how its
    link ended."""
    import numpy as np

    from eglcuda.remote import _ucx, wire

    sub = eglcuda.Subscriber(args.name, qos=args.qos, queue=4, device=args.device, timeout=args.timeout,
                             remote=args.remote)
    sub.receive(args.timeout).release()
    link = sub._remote._link  # (the remote feed's receiver)
    ep = link.ep
    say(event="ready", pid=os.getpid())
    engine = _ucx.engine()
    sent = 0

    async def run() -> None:
        nonlocal sent
        lost_at = None
        for _ in range(args.count):
            if link.lost is not None:  # (dropped: it floods on for 3 s, as a peer that ignores it would)
                lost_at = lost_at or time.monotonic()
                if time.monotonic() - lost_at > 3.0:
                    return
            sealed = wire.encode_control(ep.session, wire.Control.BEAT, 0)  # (sealed and posted in one step: in order)
            await engine.wait(ep._ep.tag_send(engine.arr(np.frombuffer(sealed, np.uint8)),
                                              engine.api.UCXXTag((ep.send_prefix << 8) | wire.CONTROL_TAG)))
            sent += 1

    try:
        _ucx.run(_ucx.acquire(), run(), 120)
    except Exception as exc:  # noqa: BLE001 - the relay cut it off
        say(event="send-failed", error=f"{type(exc).__name__}: {exc}")
    deadline = time.monotonic() + 30
    while link.lost is None and time.monotonic() < deadline:
        time.sleep(0.05)
    lost = link.lost
    say(event="done", sent=sent, kind=type(lost).__name__ if lost else None, reason=str(lost) if lost else None)
    sub.close()
    return 0


def deaf(args) -> int:
    """A remote subscriber with the key that beats and reads the relay's notes but never posts a
    frame receive (nor gives credit): the relay's sends to it never end once UCX needs the
    receiver for them (rendezvous). Stays until told on stdin; says what ended its link."""
    from eglcuda.remote import _ucx, receiver

    receiver.Receiver._post_receives = lambda self: None  # (the one thing it does not do)
    _ucx.Engine._sweep = lambda self: None  # (nor drops what waits unreceived: a plain UCXX peer)
    sub = eglcuda.Subscriber(args.name, qos=args.qos, queue=args.queue, timeout=args.timeout, remote=args.remote)
    say(event="ready", pid=os.getpid())
    sys.stdin.readline()
    link = sub._remote._link
    lost = link.lost if link is not None else None
    say(event="done", kind=type(lost).__name__ if lost else None, reason=str(lost) if lost else None)
    sub.close()
    return 0


def flood(args) -> int:
    """A peer without the key: for ``--seconds``, a new connection every ``--every`` seconds
    (the older ones left open until the relay closes them), each sending tagged messages on
    random tags (4 KiB, ``--rate`` MB/s in all) and never a handshake. Says how much it sent."""
    import asyncio
    import random

    import numpy as np

    from eglcuda.remote import _ucx

    engine = _ucx.engine()
    host, port = args.remote.rsplit(":", 1)
    data = engine.arr(np.frombuffer(os.urandom(4096), np.uint8))
    sent = [0, 0, 0]  # messages posted, failed, connections

    def done(error) -> None:
        if error is not None:
            sent[1] += 1

    async def run() -> None:
        endpoints: list = []
        started = time.monotonic()
        next_connection = started
        per_tick = max(1, int(args.rate * 1e6 / 4096 / 100))
        while time.monotonic() - started < args.seconds:
            now = time.monotonic()
            if now >= next_connection:
                next_connection = now + args.every
                ep = engine.connect(host, int(port))
                ep.use_tags(engine.new_prefix(), random.getrandbits(56) or 1)
                endpoints.append(ep)
                sent[2] += 1
                endpoints = [e for e in endpoints if not e.closed][-16:]
            for _ in range(per_tick):
                ep = random.choice(endpoints)
                if ep.closed:
                    continue
                ep.send_prefix = random.getrandbits(56) or 1  # (a tag no connection of the relay has)
                ep._tags.clear()
                try:
                    ep.send_now(data, random.randint(1, 255), done)
                    sent[0] += 1
                except _ucx.LinkError:
                    sent[1] += 1
            await asyncio.sleep(0.01)
        for ep in endpoints:
            ep.abort()
        await asyncio.sleep(0.2)

    _ucx.run(engine.loop, run(), None)
    say(event="done", messages=sent[0], failed=sent[1], connections=sent[2])
    return 0


def garbage(args) -> int:
    """A UCX peer that is no eglcuda subscriber: ``--mode`` magic (a HELLO with a wrong magic),
    old (a HELLO of protocol version 3), silent (connects, says nothing), big (a message longer
    than a HELLO), wrongkey (a HELLO under another key), late:S (a HELLO with the right key, its
    CONFIRM after S seconds; welcomed, it leaves at once). Says what the relay answered."""
    import asyncio

    import numpy as np

    from eglcuda.remote import _ucx, keys, wire
    from eglcuda.remote.session import Handshake

    key = keys.load_key(None)

    async def answer_of(ep, buffer) -> dict | None:
        try:
            await asyncio.wait_for(ep.stream_recv(buffer), args.timeout)
        except asyncio.TimeoutError:
            return {"answer": "none"}
        except Exception as exc:  # noqa: BLE001
            return {"answer": "closed", "error": type(exc).__name__}
        kind, body = wire.handshake_kind(buffer.tobytes())
        if kind is wire.Kind.REFUSE:
            code, reason = wire.decode_refuse(body)
            return {"answer": "refused", "code": code, "reason": reason}
        return None

    async def run(mode: str) -> dict:
        host, port = args.remote.rsplit(":", 1)
        ep = _ucx.engine().connect(host, int(port))
        try:
            answer = np.zeros(wire.HANDSHAKE, np.uint8)
            said = await answer_of(ep, answer)  # (the relay speaks first)
            if said is not None:
                return said
            first = answer.tobytes()
            kind, _ = wire.handshake_kind(first)
            if kind is not wire.Kind.RELAY:
                return {"answer": kind.name}
            answer[:] = 0
            if mode == "silent":
                return await answer_of(ep, answer) or {"answer": "message"}
            psk = keys.noise_psk(bytes(reversed(key)) if mode == "wrongkey" else key)
            handshake = Handshake.initiator(psk, wire.prologue(first))
            hello = wire.encode_hello(handshake, wire.Hello(eglcuda.topics.protocol.Qos.EVERY, 4, args.name))
            if mode == "magic":
                data = bytearray(hello)
                data[:8] = b"NOTMAGIC"
            elif mode == "old":
                data = bytearray(hello)
                data[8] = 3
            elif mode == "big":
                data = bytearray(np.random.default_rng(3).integers(0, 256, wire.HANDSHAKE * 4, dtype=np.uint8).tobytes())
            else:
                data = hello
            await ep.stream_send(data)
            said = await answer_of(ep, answer)
            if said is not None:
                return said
            kind, body = wire.handshake_kind(answer.tobytes())
            if mode.startswith("late:"):
                wire.decode_accept(handshake, body)
                session = handshake.split()
                await asyncio.sleep(float(mode.split(":", 1)[1]))
                try:
                    await ep.stream_send(wire.encode_confirm(session))
                except Exception as exc:  # noqa: BLE001 - the relay gave up on it first
                    return {"answer": "closed", "error": type(exc).__name__}
                answer[:] = 0
                said = await answer_of(ep, answer)
                if said is not None:
                    return said
                kind, body = wire.handshake_kind(answer.tobytes())
            return {"answer": kind.name}
        finally:
            ep.abort()

    async def all_modes() -> list:
        return [dict(mode=mode, **await run(mode)) for mode in args.mode.split(",")]

    loop = _ucx.acquire()
    for answer in _ucx.run(loop, all_modes(), None):
        say(event="answer", **answer)
    return 0


def mitm(args) -> int:
    """A relay-in-the-middle without the key: it listens where a subscriber connects, forwards the
    subscriber's handshake to the real relay (``--remote``) and the relay's answers back, then
    (``--mode``) welcome: sends its own WELCOME (a big frame geometry) instead of the relay's;
    replay: sends the victim the relay's ACCEPT of an earlier connection. Says what it did."""
    import asyncio

    import numpy as np

    from eglcuda.remote import _ucx, wire

    engine = _ucx.engine()
    host, port = args.remote.rsplit(":", 1)
    recorded: list[bytes] = []

    async def relay_message(ep) -> bytes:
        buf = np.zeros(wire.HANDSHAKE, np.uint8)
        await asyncio.wait_for(ep.stream_recv(buf), args.timeout)
        return buf.tobytes()

    async def serve(victim) -> None:
        real = engine.connect(host, int(port))
        try:
            await victim.stream_send(await relay_message(real))  # RELAY
            await real.stream_send(await relay_message(victim))  # the victim's HELLO
            accept = await relay_message(real)
            recorded.append(accept)
            if args.mode == "replay" and len(recorded) > 1:
                accept = recorded[0]
            await victim.stream_send(accept)
            confirm = await relay_message(victim)  # (sealed: the relay takes it, the attacker cannot read it)
            await real.stream_send(confirm)
            welcome = await relay_message(real)
            say(event="forwarded", kind=wire.handshake_kind(welcome)[0].name)
            if args.mode != "frame":  # (its own geometry in the relay's sealed WELCOME)
                forged = bytearray(welcome)
                forged[20:40] = np.random.default_rng(9).integers(0, 256, 20, dtype=np.uint8).tobytes()
                await victim.stream_send(forged)
                await asyncio.sleep(args.timeout)
                return
            await victim.stream_send(welcome)  # (the relay's, untouched: the victim is welcomed)
            prefix = int(await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline))
            # A GONE note and a frame of its own making, on the victim's tags (seen on the wire).
            note = bytearray(wire.NOTE)
            note[:5] = b"ECRH" + bytes([int(wire.Head.GONE)])
            note[24:28] = (9).to_bytes(4, "little")  # (its reason's length)
            note[wire.HEADER:wire.HEADER + 9] = b"mitm-note"
            await send_raw(victim, prefix, wire.NOTE_TAG, note)
            await asyncio.sleep(0.5)
            frame = np.zeros(wire.message_bytes(64 * 48 * 3 // 2), np.uint8)
            wire.pack_frame(frame, 10**6, 0, b"forged")
            await send_raw(victim, prefix, wire.FRAME_TAG, frame)
            say(event="forged")
            await asyncio.sleep(args.timeout)
        except Exception as exc:  # noqa: BLE001 - the victim or the relay hung up
            say(event="ended", error=f"{type(exc).__name__}: {exc}")
        finally:
            real.abort()
            victim.abort()

    loop = _ucx.acquire()

    async def listen():
        return engine.listen(0, serve)

    listener = _ucx.run(loop, listen(), 10)
    say(event="ready", port=listener.port)
    time.sleep(60)  # (stdin is the connection's: it reads the victim's tag prefix there)
    return 0


def main() -> int:
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # (a hung peer's stacks, for debugging)
    if os.environ.get("EGLCUDA_PEER_LOG"):  # (the library's log on stderr, for debugging)
        import logging
        logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(relativeCreated)d %(message)s")
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["relay", "subscribe", "garbage", "cycles", "pair", "forked", "mitm", "beats",
                                           "forge", "deaf", "flood", "dropped", "hold-limit"])
    parser.add_argument("--mode", default="magic")
    parser.add_argument("--message", choices=["released", "kept"], default="released",
                        help="dropped: what becomes of its message")
    parser.add_argument("--frames", default="plain")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=20.0, help="flood: MB/s")
    parser.add_argument("--every", type=float, default=0.2, help="flood: seconds between connections")
    parser.add_argument("--name", required=True)
    parser.add_argument("--path", default=None)
    parser.add_argument("--listen", default="127.0.0.1:0")
    parser.add_argument("--remote", default=None)
    parser.add_argument("--remote2", default=None)
    parser.add_argument("--seed2", type=int, default=2)
    parser.add_argument("--qos", default="every")
    parser.add_argument("--queue", type=int, default=4)
    parser.add_argument("--device", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=10.0)
    parser.add_argument("--receive-timeout", type=float, default=0.0)
    parser.add_argument("--stop-on-timeout", action="store_true")
    parser.add_argument("--every-timeout", type=float, default=1.0)
    parser.add_argument("--join-timeout", type=float, default=0.0, help="relay: its own join to the publisher (0: --timeout)")
    parser.add_argument("--max-remotes", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--hold", type=int, default=0)
    parser.add_argument("--sleep-ms", type=float, default=0.0)
    parser.add_argument("--rejoin", action="store_true")
    parser.add_argument("--wait", choices=["", "waitset", "asyncio"], default="",
                        help="subscribe: wait on the subscriber (a WaitSet, or receive_async), then receive(timeout=0)")
    parser.add_argument("--rejoin-timeout", type=float, default=0.0)
    parser.add_argument("--close-during-rejoin-ms", type=float, default=0.0)
    parser.add_argument("--late-copy-ms", type=float, default=0.0)
    parser.add_argument("--per-thread-stream", action="store_true",
                        help="subscribe: the subscriber's stream is this thread's per-thread default stream")
    parser.add_argument("--no-check", action="store_true")
    parser.add_argument("--wait-bye", action="store_true")
    parser.add_argument("--wait-go", action="store_true")
    args = parser.parse_args()
    return {"relay": relay, "subscribe": subscribe, "garbage": garbage, "cycles": cycles, "pair": pair, "forked": forked,
            "mitm": mitm, "forge": forge, "deaf": deaf, "beats": beats, "flood": flood, "dropped": dropped, "hold-limit": hold_limit}[args.role](args)


if __name__ == "__main__":
    sys.exit(main())
