"""A relay's door: :class:`Server` owns its UCX listener (whose caps bound the handshakes in
progress, in all and per address), runs the Noise handshake with each peer that connects, logs
failed key proofs (one line a minute per host), refuses with the reason, and asks its relay
about each peer that proved the key: why not to serve it (:data:`Refusal`), else to admit it
(:data:`Admit`: its :class:`~eglcuda.remote.sender.Sender`). Everything here runs on the UCX
engine's thread."""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from typing import Any, Callable, TypeVar

import numpy as np

from ..topics.protocol import Reason
from . import _ucx, keys, wire
from .sender import Sender
from .unheard import host_of
from .session import AuthenticationFailed, Handshake, Session

log = logging.getLogger("eglcuda.remote")
T = TypeVar("T")


# What a Server asks of its relay, on the engine's thread, with no wait between the two calls
# for one peer: why the peer that said this HELLO (and proved the key) is not served now (None:
# it is); then, to take it on (a slot of the relay's from now on), its sender, not yet started.
Refusal = Callable[[wire.Hello], "tuple[int, str] | None"]
Admit = Callable[[Any, str, wire.Hello], Sender]


class _FailedProofs:
    """Failed key proofs, logged with the peer's address: one line a minute per host at most,
    with the count since the last line (a peer guessing keys must not flood the log either; each
    of its connections comes from another port)."""

    EVERY_S = 60.0
    ADDRESSES = 1024  # the addresses remembered (the oldest forgotten first)

    def __init__(self) -> None:
        self._seen: collections.OrderedDict[str, tuple[float, int]] = collections.OrderedDict()

    def note(self, address: str) -> int:
        """Count a failure from ``address`` (``HOST:PORT``); the count of its host's to log now,
        or 0 (its host was logged within a minute)."""
        now = time.monotonic()
        host = host_of(address)
        logged, count = self._seen.pop(host, (-self.EVERY_S, 0))
        count += 1
        if now - logged >= self.EVERY_S:
            self._seen[host] = (now, 0)
        else:
            self._seen[host] = (logged, count)
            count = 0
        while len(self._seen) > self.ADDRESSES:
            self._seen.popitem(last=False)
        return count


_failed_proofs = _FailedProofs()  # (one log for the process: a guesser may try every relay of it)


class Server:
    """The listener of the relay of topic ``topic`` (see the module's docstring): peers prove
    ``key``, each handshake within ``timeout`` seconds; ``refusal`` and ``admit`` are the relay's."""

    def __init__(self, topic: str, key: bytes, timeout: float, refusal: Refusal, admit: Admit) -> None:
        self._topic = topic
        self._key = key
        self._timeout = timeout
        self._refusal = refusal
        self._admit = admit
        self._listener: Any = None

    async def listen(self, port: int, ip: str | None) -> int:
        """Listen on ``port`` (0: any) of ``ip`` (None: every address); the port."""
        self._listener = _ucx.engine().listen(port, self._serve, ip, unheard_s=self._timeout)
        return int(self._listener.port)

    async def drop(self, endpoints: list[Any]) -> None:
        """End connections of this listener whose peers do not answer (Listener.drop)."""
        listener = self._listener
        if listener is not None:
            await listener.drop(endpoints)
        else:
            for ep in endpoints:
                ep.abort()

    def close(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()

    async def _serve(self, ep: Any) -> None:
        """A new connection (the listener's): handshake, then its sender serves it."""
        peer = ep.peer
        try:
            sender = await self._handshake(ep, time.monotonic() + self._timeout)
        except (asyncio.TimeoutError, TimeoutError):
            log.info("relay %s: a peer at %s did not finish its handshake in %.3g s", self._topic, peer,
                     self._timeout)
            await self.drop([ep])  # (its receive is still posted)
            return
        except Exception as exc:  # noqa: BLE001 - a broken peer is refused, nothing else changes
            log.info("relay %s: a peer at %s was refused: %s", self._topic, peer, exc)
            ep.abort()
            return
        finally:
            ep.handshaking = False  # (out of the listener's count of pending handshakes)
        if sender is not None:  # (one of the relay's from its admission on: run() ends it)
            await sender.run()

    async def _refuse(self, ep: Any, code: int, reason: str, session: Session | None = None) -> None:
        """Refuse the peer with ``reason``: in the clear before the session, sealed after it."""
        try:
            message = wire.encode_refuse(code, reason) if session is None else wire.encode_refused(session, code, reason)
            await asyncio.wait_for(ep.stream_send(message), 1.0)
            await asyncio.sleep(0.05)  # (let it leave before the endpoint goes)
        except Exception:  # noqa: BLE001 - the peer may be gone already
            pass
        ep.abort()

    async def _read_step(self, ep: Any, deadline: float, want: wire.Kind, decode: Callable[[memoryview], T]) -> T | None:
        """The peer's next handshake message, of kind ``want``, decoded (None: it was not one, or
        it did not open, and the peer was refused with the reason, in the clear)."""
        buf = np.zeros(wire.HANDSHAKE, np.uint8)
        await _before(ep.stream_recv(buf), deadline)
        try:
            return decode(wire.expect(buf.tobytes(), want))
        except AuthenticationFailed:
            count = _failed_proofs.note(ep.peer)
            if count:
                log.warning("relay of topic %r: %d failed key proof(s) from %s (a peer without the relay's key)",
                            self._topic, count, ep.peer)
            await self._refuse(ep, Reason.ACCESS, "authentication failed: the subscriber does not hold the relay's key")
            return None
        except wire.WireError as exc:
            await self._refuse(ep, Reason.PROTOCOL, str(exc))
            return None

    async def _handshake(self, ep: Any, deadline: float) -> Sender | None:
        """Check the peer (the Noise handshake: its HELLO opens under the key, it confirms the
        session; then it asks for this topic); on success it is one of the relay's at once (a
        slot taken, its sealed welcome still to send). Nothing keyed goes to a peer whose HELLO
        did not open."""
        first = wire.encode_relay()
        await _before(ep.stream_send(first), deadline)
        handshake = Handshake.responder(keys.noise_psk(self._key), wire.prologue(first))
        hello = await self._read_step(ep, deadline, wire.Kind.HELLO, lambda body: wire.decode_hello(handshake, body))
        if hello is None:
            return None
        await _before(ep.stream_send(wire.encode_accept(handshake)), deadline)
        session = handshake.split()
        confirmed = await self._read_step(ep, deadline, wire.Kind.CONFIRM,
                                          lambda body: wire.decode_confirm(session, body))
        if confirmed is None:
            return None
        if hello.name != self._topic:
            await self._refuse(ep, Reason.VERSION, f"this relay serves topic {self._topic!r}, not {hello.name!r}",
                               session)
            return None
        refusal = self._refusal(hello)
        if refusal is not None:
            await self._refuse(ep, refusal[0], refusal[1], session)
            return None
        engine = _ucx.engine()
        mine_tags = session.tag_prefix(receiving=True)
        if not engine.claim_prefix(mine_tags, (wire.CONTROL_TAG,)):  # (another connection has it: 2**-56)
            await self._refuse(ep, Reason.BUSY, "a tag collision: connect again", session)
            return None
        # From here on nothing waits: the deadline and the slot are decided together, so a
        # handshake that ends as its time runs out either took a slot (and its sender frees it) or not.
        if time.monotonic() >= deadline:
            engine.forget_prefix(mine_tags)
            raise TimeoutError
        ep.session = session
        ep.use_tags(mine_tags, session.tag_prefix(receiving=False))
        peer = f"{hello.client or '?'} pid {hello.pid}"
        if ep.peer != "?":  # (the address the connection came from; the HELLO's host and pid are the peer's word)
            log.info("relay %s: %s says it is %s", self._topic, ep.peer, peer)
            peer = ep.peer
        return self._admit(ep, peer, hello)


async def _before(step: Any, deadline: float) -> Any:
    """``step`` awaited until ``deadline`` (``time.monotonic()``; TimeoutError then)."""
    return await asyncio.wait_for(step, max(0.0, deadline - time.monotonic()))
