"""The relay: a local subscriber of a topic that serves remote subscribers over UCX.

Threads: the *local* thread receives the topic's frames (an ordinary
:class:`eglcuda.Subscriber`), copies each one device -> page-locked host staging on its own stream
and releases it at once (the publisher gets its pool slot back after one D2H copy); the shared
UCX engine (_ucx.py) runs every connection: the handshake, one sender and one credit reader per
remote subscriber, and a watchdog. A staging buffer is reused once every send of it ended. The
publisher's frame path never waits on the network: with no free staging buffer a 'latest' relay
skips the frame (an 'every' relay waits, as a local 'every' subscriber would).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import queue as _queue
import signal
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterable

import numpy as np

from .._bind import cuda
from .._unix import positive_seconds
from ..cuda_device import get_device
from ..errors import ClosedError, Dropped, EglCudaError, Refused, StreamDisconnected, Timeout, UsageError
from ..topics import naming, registry
from ..topics.protocol import Qos, Reason
from ..topics.subscriber import Subscriber
from . import _ucx, keys, wire
from .buffers import Pinned

log = logging.getLogger("eglcuda.remote")

STAGING = 12  # staging buffers of a relay (frames between its D2H copy and the end of their sends)
SEND_AHEAD = 3  # frames a relay has in flight to one remote subscriber (overlaps UCX's round trips)
LATEST_WINDOW = 3  # frames a relay sends ahead of a 'latest' remote subscriber's credits
BEAT_S = 0.5  # a side that has said nothing for this long sends a beat
NO_PUBLISHER = 200  # REFUSE code: the relay has no publisher at the moment (the subscriber retries)
DISCONNECTED = 201  # GONE code: the relay lost its publisher without a goodbye (StreamDisconnected)


@dataclass(frozen=True)
class RemoteInfo:
    """One remote subscriber as its relay sees it: ``peer`` its address, ``sent`` frames sent
    to it, ``skipped`` frames it missed while it had no credit ('latest'), ``dropped`` why the
    relay dropped it (None: it is connected, or it left by itself), ``since`` when it joined
    (``time.time()``)."""

    peer: str
    qos: str
    queue: int
    sent: int
    skipped: int
    dropped: str | None
    since: float
    connected: bool


def parse_address(text: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as (host, port)."""
    if not isinstance(text, str) or ":" not in text:
        raise UsageError(f"{what} is 'HOST:PORT', got {text!r}")
    host, _, port_text = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not host or not 0 <= port <= 65535:
        raise UsageError(f"{what} is 'HOST:PORT' with a port of 0..65535, got {text!r}")
    return host, port


class _Remote:
    """A connected remote subscriber (state of the UCX loop only)."""

    def __init__(self, ep: Any, peer: str, qos: Qos, queue: int, window: int, welcome: wire.Welcome) -> None:
        self.ep = ep
        self.welcome = welcome
        self.peer = peer
        self.qos = qos
        self.queue = queue
        self.window = window
        self.credits = window
        self.pending: collections.deque[int] = collections.deque()  # staging buffers to send
        self.wake = asyncio.Event()
        self.sent = 0
        self.skipped = 0
        self.dropped: str | None = None
        self.gone: tuple[int, str] | None = None  # (code, reason) to send, then close
        # After the publisher closed the topic: the frames still pending go out first, until then
        # (time.monotonic()), as a local subscriber gets every frame published before the close.
        self.flush_until = 0.0
        self.since = time.time()
        self.heard = time.monotonic()
        self.starved_since: float | None = None  # an 'every' remote waiting for credit since
        self.connected = True
        self.tasks: list[asyncio.Task[Any]] = []

    def info(self) -> RemoteInfo:
        return RemoteInfo(self.peer, self.qos.name.lower(), self.queue, self.sent, self.skipped, self.dropped,
                          self.since, self.connected)


class Relay:
    """Serve topic ``name`` to remote subscribers (``eglcuda.Subscriber(name, remote=...)``)
    over UCX, from a local subscription of it.

    :param listen: ``"HOST:PORT"``: the port to listen on (0: any free port; :attr:`address` says
        which). UCXX's listener (0.52) takes a port only and UCX then listens on every address
        of the host: HOST is what :attr:`address` reports, not a bind address; keep the port
        behind a firewall (docs/security.md).
    :param key: the pre-shared key (bytes, at least 16); None: from ``EGLCUDA_REMOTE_KEY_FILE``
        or ``EGLCUDA_REMOTE_KEY`` (docs/security.md).
    :param qos: the relay's own local subscription: ``"latest"`` (never slows the publisher;
        remote subscribers then see skipped frames when the relay falls behind) or ``"every"``.
    :param queue: the local subscription's queue (``every``).
    :param device: the CUDA device the relay reads frames on.
    :param timeout: seconds to wait for the publisher at construction; also how long a remote
        subscriber may stay silent (a stalled one) before it is dropped, and a handshake's limit.
    :param path: an explicit topic socket path, as for a local :class:`eglcuda.Subscriber`.
    :param trusted_uids: the users whose publishers are accepted, as for a local subscriber.
    :param max_remotes: remote subscribers served at once (more are refused).
    :param every_timeout: seconds an ``every`` remote subscriber may go without releasing a frame
        while the relay has frames for it; then it is dropped (it gets :class:`eglcuda.Dropped`).

    Raises :class:`eglcuda.Timeout` when no publisher answered in ``timeout`` seconds, and
    :class:`eglcuda.Unsupported` (with what to install) without ucxx."""

    def __init__(self, name: str, listen: str = "127.0.0.1:0", *, key: bytes | None = None, qos: str = "latest",
                 queue: int = 4, device: Any = 0, timeout: float = 5.0, path: Any = None,
                 trusted_uids: Iterable[int] | str | None = None, max_remotes: int = 16,
                 every_timeout: float = 1.0) -> None:
        self.name = naming.check_name(name)
        host, port = parse_address(listen, "listen")
        _ucx.require()  # (what to install is the first thing to say)
        self._key = keys.load_key(key)
        self.timeout = positive_seconds(timeout, "timeout")
        self.every_timeout = positive_seconds(every_timeout, "every_timeout")
        if not isinstance(max_remotes, int) or isinstance(max_remotes, bool) or not 1 <= max_remotes <= 1024:
            raise UsageError(f"max_remotes is an int in 1..1024, got {max_remotes!r}")
        self.max_remotes = max_remotes
        self._closing = False
        self._closed = False
        self._lock = threading.Lock()
        self._remotes: list[_Remote] = []
        self._history: collections.deque[RemoteInfo] = collections.deque(maxlen=64)  # those that left
        self._live_remotes = 0  # (read by the local thread without the loop: a hint only)
        self._staging: Pinned | None = None
        self._refs: dict[int, int] = {}
        self._free: _queue.Queue[int] = _queue.Queue()
        self._listener: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._status_path: str | None = None
        self._pid = os.getpid()  # a forked child's close() leaves the parent's relay alone
        self._sub = Subscriber(self.name, qos=qos, queue=queue, device=device, timeout=self.timeout, path=path,
                               trusted_uids=trusted_uids)
        self.qos = self._sub.qos
        self._welcome: wire.Welcome | None = None
        self._live = True  # a publisher is there
        self._thread: threading.Thread | None = None
        try:
            if self._sub.info is None or self._sub.cuda_stream is None:  # pragma: no cover - a CUDA subscriber has both
                raise UsageError("the relay's subscriber has no CUDA stream")
            self._device = get_device(device)
            self._stream: int = self._sub.cuda_stream
            self._set_up_staging()
            self._loop = _ucx.acquire()
            try:
                self._listener = _ucx.run(self._loop, self._listen(host, port), self.timeout)
            except BaseException:
                self._loop = None
                _ucx.release()
                raise
            self.address: tuple[str, int] = (host, int(self._listener.port))
            self._watchdog = asyncio.run_coroutine_threadsafe(self._watch(), self._loop)
            self._thread = threading.Thread(target=self._local, name=f"eglcuda-relay-{self.name}", daemon=True)
            self._thread.start()
            self._write_status()
        except BaseException:
            self.close()
            raise
        _ucx.track(self)

    # ---- the local side ---------------------------------------------------------------------------
    def _set_up_staging(self) -> None:
        info = self._sub.info
        assert info is not None
        size = wire.frame_bytes(info.format, info.width, info.height)
        self._welcome = wire.Welcome(info.width, info.height, info.format, 1, info.pool, info.publisher_pid,
                                     info.instance, info.next_seq, info.fps, size)
        if self._staging is not None and self._staging.size == wire.DATA_AT + size:
            return  # (a restarted publisher of the same frame size: the ring serves as it is)
        old, self._staging = self._staging, None
        if old is not None:
            old.close()
        self._staging = Pinned(self._device, STAGING, wire.DATA_AT + size,
                               f"staging {info.width}x{info.height} frames of a relay")
        self._free = _queue.Queue()
        self._refs = {}
        for index in range(STAGING):
            self._free.put(index)

    def _local(self) -> None:
        """The local thread: frames in, copied to staging, released, handed to the UCX loop."""
        sub = self._sub
        while not self._closing:
            try:
                message = sub.receive(timeout=0.25)
            except Timeout:
                continue
            except ClosedError:
                return
            except StreamDisconnected as exc:
                self._publisher_lost(exc)
                if not self._reconnect():
                    return
                continue
            except EglCudaError as exc:  # pragma: no cover - a driver failure: tell the remotes, stop
                log.error("relay %s: receiving failed: %s", self.name, exc)
                self._publisher_lost(StreamDisconnected(f"the relay failed to receive: {exc}"))
                return
            try:
                index = self._stage(message)
            finally:
                message.release()
            if index is not None:
                self._call(self._dispatch, index)

    def _stage(self, message: Any) -> int | None:
        """Copy the frame into a free staging buffer (None: skipped)."""
        if self._live_remotes == 0:
            return None  # nobody to send it to: no copy
        try:
            if self.qos is Qos.LATEST:
                index = self._free.get_nowait()
            else:
                # (An 'every' relay waits, as a local 'every' subscriber would: the publisher's
                # every_timeout decides; the watchdog drops the remote subscribers that keep it.)
                index = self._free.get(timeout=self.timeout)
        except _queue.Empty:
            return None  # every staging buffer is still being sent: this frame is skipped
        staging = self._staging
        assert staging is not None
        out = staging.arrays[index]
        at = wire.DATA_AT
        try:
            wire.pack_frame(out, message.seq, message.timestamp_ns, message.payload)
            frame = message.frame
            self._device.make_current()
            for plane in frame.planes:
                g = plane.geometry
                size = g.row_bytes * g.height
                cuda.copy_2d(self._stream, plane._location(), ("host", out[at:at + size], g.row_bytes), g.row_bytes,
                             g.height, False)
                at += size
            cuda.stream_synchronize(self._stream, "copying a frame to a relay's staging buffer")
        except BaseException:
            self._free.put(index)
            raise
        return index

    def _publisher_lost(self, exc: StreamDisconnected) -> None:
        code = exc.code if isinstance(exc, Dropped) else DISCONNECTED
        reason = exc.reason if isinstance(exc, Dropped) else str(exc)
        self._call(self._all_gone, code, f"topic {self.name!r} behind the relay: {reason}")

    def _reconnect(self) -> bool:
        """Wait for a publisher again (the relay outlives publisher restarts)."""
        while not self._closing:
            try:
                self._sub.wait_for_publisher(0.5)
            except (Timeout, StreamDisconnected, Refused):
                continue
            except ClosedError:
                return False
            # New frames may have another size: staging again once every send of the old ended
            # (never sooner: UCX may still read a buffer). Every remote was told GONE and its
            # sender aborts its endpoint, so they all come back; a close ends the wait too.
            while self._free.qsize() < STAGING and not self._closing:
                time.sleep(0.01)
            if self._closing:
                return False
            try:
                self._set_up_staging()
            except EglCudaError as exc:  # pragma: no cover - out of pinned memory
                log.error("relay %s: staging after the publisher's restart failed: %s", self.name, exc)
                return False
            self._call(self._set_live, True)
            return True
        return False

    def _call(self, function: Any, *args: Any) -> None:
        loop = self._loop
        if loop is not None and not self._closed:
            try:
                loop.call_soon_threadsafe(function, *args)
            except RuntimeError:  # pragma: no cover - the loop stopped meanwhile (closing)
                pass

    # ---- the UCX loop ---------------------------------------------------------------------------------
    async def _listen(self, host: str, port: int) -> Any:
        return _ucx.engine().listen(port, self._serve)

    def _set_live(self, live: bool) -> None:
        self._live = live

    def _unref(self, index: int) -> None:
        left = self._refs.get(index, 0) - 1
        if left <= 0:
            self._refs.pop(index, None)
            self._free.put(index)
        else:
            self._refs[index] = left

    def _dispatch(self, index: int) -> None:
        """A staged frame: queue it for each remote subscriber that has room for it."""
        item = index
        refs = 0
        for remote in self._remotes:
            if not remote.connected or remote.gone is not None:
                continue
            if remote.qos is Qos.LATEST and remote.credits - len(remote.pending) <= 0:
                remote.skipped += 1
                continue
            remote.pending.append(item)
            refs += 1
            remote.wake.set()
        if refs:
            self._refs[index] = refs
        else:
            self._free.put(index)

    def _all_gone(self, code: int, reason: str) -> None:
        self._live = False
        flush_until = time.monotonic() + self.every_timeout if code == Reason.CLOSING else 0.0
        for remote in self._remotes:
            if remote.gone is None:
                remote.flush_until = flush_until
            self._end(remote, code, reason, dropped=False)

    def _end(self, remote: _Remote, code: int, reason: str, dropped: bool) -> None:
        """Tell ``remote`` why it ends (its sender sends GONE between frames, then closes)."""
        if remote.gone is None:
            remote.gone = (code, reason)
            if dropped:
                remote.dropped = reason
            remote.wake.set()

    async def _serve(self, ep: Any) -> None:
        """A new connection (the listener's): handshake, then serve it."""
        peer = "?"
        try:
            remote = await self._handshake(ep, time.monotonic() + self.timeout)
        except (asyncio.TimeoutError, TimeoutError):
            log.info("relay %s: a peer did not finish its handshake in %.3g s", self.name, self.timeout)
            self._abort(ep)
            return
        except Exception as exc:  # noqa: BLE001 - a broken peer is refused, nothing else changes
            log.info("relay %s: a peer was refused: %s", self.name, exc)
            self._abort(ep)
            return
        if remote is None:
            return
        peer = remote.peer
        reader: asyncio.Future[Any] | None = None
        try:  # (the remote counts among the relay's from its handshake's last check on: this ends it)
            try:
                await asyncio.wait_for(ep.stream_send(wire.encode_welcome(remote.welcome)), self.timeout)
            except Exception as exc:  # noqa: BLE001 - it left, or said nothing in time
                log.info("relay %s: remote subscriber %s did not take its welcome: %s", self.name, peer, exc)
                return
            log.info("relay %s: remote subscriber %s joined (%s)", self.name, peer, remote.qos.name.lower())
            reader = asyncio.ensure_future(self._read_credits(remote))
            remote.tasks.append(reader)
            await self._send_frames(remote)
        finally:
            if reader is not None:
                reader.cancel()
            remote.connected = False
            self._abort(ep)
            while remote.pending:
                self._unref(remote.pending.popleft())
            if remote in self._remotes:
                self._remotes.remove(remote)
            self._live_remotes = len(self._remotes)
            self._history.append(remote.info())
            log.info("relay %s: remote subscriber %s left%s", self.name, peer,
                     f" (dropped: {remote.dropped})" if remote.dropped else "")

    async def _refuse(self, ep: Any, code: int, reason: str) -> None:
        try:
            await asyncio.wait_for(ep.stream_send(wire.encode_refuse(code, reason)), 1.0)
            await asyncio.sleep(0.05)  # (let it leave before the endpoint goes)
        except Exception:  # noqa: BLE001 - the peer may be gone already
            pass
        self._abort(ep)

    async def _handshake(self, ep: Any, deadline: float) -> _Remote | None:
        """Check the peer (it proves the key, asks for this topic); on success the remote
        subscriber is one of the relay's at once (a slot taken, its welcome still to send)."""
        buf = np.zeros(wire.HANDSHAKE, np.uint8)
        await _before(ep.stream_recv(buf), deadline)
        try:
            kind, body = wire.handshake_kind(buf.tobytes())
            if kind is not wire.Kind.HELLO:
                raise wire.WireError(f"expected HELLO, got {kind.name}")
            hello = wire.decode_hello(body)
        except wire.WireError as exc:
            await self._refuse(ep, Reason.PROTOCOL, str(exc))
            return None
        name = hello.name.encode()
        mine = keys.nonce()
        await _before(ep.stream_send(wire.encode_challenge(mine, keys.proof(self._key, b"relay", hello.nonce, mine, name))),
                      deadline)
        buf[:] = 0
        await _before(ep.stream_recv(buf), deadline)
        try:
            kind, body = wire.handshake_kind(buf.tobytes())
            if kind is not wire.Kind.PROOF:
                raise wire.WireError(f"expected PROOF, got {kind.name}")
            theirs = wire.decode_proof(body)
        except wire.WireError as exc:
            await self._refuse(ep, Reason.PROTOCOL, str(exc))
            return None
        if not keys.same(theirs, keys.proof(self._key, b"subscriber", mine, hello.nonce, name)):
            await self._refuse(ep, Reason.ACCESS, "authentication failed: the subscriber's key is not the relay's")
            return None
        if hello.name != self.name:
            await self._refuse(ep, Reason.VERSION, f"this relay serves topic {self.name!r}, not {hello.name!r}")
            return None
        if self._closing:
            await self._refuse(ep, Reason.CLOSING, "the relay is closing")
            return None
        if len(self._remotes) >= self.max_remotes:
            await self._refuse(ep, Reason.BUSY, f"the relay serves {self.max_remotes} remote subscribers already")
            return None
        welcome = self._welcome
        if not self._live or welcome is None:
            await self._refuse(ep, NO_PUBLISHER, f"topic {self.name!r} has no publisher at the relay now")
            return None
        # From here on nothing waits: the deadline and the slot are decided together, so a
        # handshake that ends as its time runs out either took a slot (and _serve frees it) or not.
        if time.monotonic() >= deadline:
            raise TimeoutError
        window = LATEST_WINDOW if hello.qos is Qos.LATEST else min(hello.queue, wire.MAX_WINDOW)
        info = self._sub.info
        next_seq = info.next_seq if info is not None else 0
        mine_tags = _ucx.engine().new_prefix()
        ep.use_tags(mine_tags, hello.tags)
        reply = wire.Welcome(welcome.width, welcome.height, welcome.format, window, welcome.pool,
                             welcome.publisher_pid, welcome.instance, next_seq, welcome.fps, welcome.frame_bytes,
                             mine_tags)
        peer = f"{hello.client or '?'} pid {hello.pid}"
        remote = _Remote(ep, peer, hello.qos, hello.queue, window, reply)
        self._remotes.append(remote)
        self._live_remotes = len(self._remotes)
        return remote

    async def _send_frames(self, remote: _Remote) -> None:
        """Send queued frames while there is credit, up to SEND_AHEAD at once; beats when idle;
        the GONE note when the remote subscriber's end was decided, then return."""
        ep = remote.ep
        inflight: collections.deque[asyncio.Future[Any]] = collections.deque()
        try:
            while True:
                while inflight and inflight[0].done():
                    inflight.popleft().result()  # (a failed send ends this remote subscriber)
                if remote.gone is not None and not self._flushing(remote):
                    if inflight:
                        await asyncio.wait(list(inflight), timeout=1.0)
                    code, reason = remote.gone
                    try:
                        await asyncio.wait_for(self._send_note(ep, wire.Head.GONE, code, reason), 1.0)
                    except Exception:  # noqa: BLE001 - it may be gone or stalled
                        pass
                    return
                if remote.pending and remote.credits > 0 and len(inflight) < SEND_AHEAD:
                    index = remote.pending.popleft()
                    remote.credits -= 1
                    task = asyncio.ensure_future(self._send_one(remote, index))
                    task.add_done_callback(lambda _: remote.wake.set())
                    task.add_done_callback(_quiet)
                    inflight.append(task)
                    continue
                remote.wake.clear()
                try:
                    await asyncio.wait_for(remote.wake.wait(), BEAT_S)
                except (asyncio.TimeoutError, TimeoutError):
                    if not inflight:
                        await self._send_note(ep, wire.Head.BEAT)
        finally:
            self._abort(ep)  # (ends the sends still in flight; their buffers come back below)
            for sending in inflight:
                sending.cancel()

    @staticmethod
    def _flushing(remote: _Remote) -> bool:
        """Whether ``remote``, whose end is decided, still gets its pending frames first (the
        publisher closed the topic: what it published before reaches everyone still keeping up)."""
        if not remote.connected or time.monotonic() >= remote.flush_until:
            return False
        return bool(remote.pending)

    async def _send_one(self, remote: _Remote, index: int) -> None:
        try:
            staging = self._staging
            assert staging is not None
            await remote.ep.send(staging.arrays[index], wire.FRAME_TAG)
            remote.sent += 1
        finally:
            self._unref(index)

    async def _send_note(self, ep: Any, kind: wire.Head, code: int = 0, reason: str = "") -> None:
        await ep.send(wire.encode_note(kind, code, reason), wire.NOTE_TAG)
        if kind is wire.Head.GONE:
            await asyncio.sleep(0.05)  # (let it leave before the endpoint goes)

    async def _read_credits(self, remote: _Remote) -> None:
        buf = np.zeros(wire.CONTROL, np.uint8)
        try:
            while True:
                await remote.ep.recv(buf, wire.CONTROL_TAG)
                remote.heard = time.monotonic()
                kind, count = wire.decode_control(buf.tobytes())
                if kind is wire.Control.CREDIT:
                    remote.credits += count
                    if remote.credits > remote.window:
                        raise wire.WireError(f"credit beyond the window of {remote.window}")
                    remote.starved_since = None
                    remote.wake.set()
                elif kind is wire.Control.BYE:
                    self._end(remote, Reason.CLOSING, "the subscriber closed", dropped=False)
                    return
        except asyncio.CancelledError:
            raise
        except wire.WireError as exc:
            self._end(remote, Reason.PROTOCOL, str(exc), dropped=True)
        except Exception as exc:  # noqa: BLE001 - the endpoint failed: the remote is gone
            remote.gone = remote.gone or (Reason.TRANSPORT, f"the connection failed: {exc}")
            remote.connected = False
            self._abort(remote.ep)  # (ends a send in progress)
            remote.wake.set()

    async def _watch(self) -> None:
        """Drop silent (stalled) remote subscribers and 'every' ones that keep no pace."""
        rounds = 0
        while True:
            await asyncio.sleep(0.1)
            rounds += 1
            if rounds % 10 == 0:
                self._write_status()  # (each second: what `python -m eglcuda topics` shows)
            now = time.monotonic()
            for remote in list(self._remotes):
                if remote.gone is not None:
                    if remote.dropped is not None and now - remote.heard > self.timeout + 2.0:
                        self._abort(remote.ep)  # a stalled peer does not even take the GONE
                    continue
                if now - remote.heard > self.timeout:
                    self._end(remote, Reason.TIMEOUT, f"the remote subscriber said nothing for {self.timeout:.3g} s",
                              dropped=True)
                    asyncio.get_running_loop().call_later(1.0, self._abort, remote.ep)
                elif remote.qos is Qos.EVERY and remote.pending and remote.credits <= 0:
                    if remote.starved_since is None:
                        remote.starved_since = now
                    elif now - remote.starved_since > self.every_timeout:
                        self._end(remote, Reason.QUEUE_FULL, f"the remote subscriber did not release a frame within "
                                  f"every_timeout ({self.every_timeout:.3g} s)", dropped=True)
                else:
                    remote.starved_since = None

    def _abort(self, ep: Any) -> None:
        ep.abort()  # (bounded: a dead peer must not hold the engine)

    # ---- the user's side ----------------------------------------------------------------------------
    @property
    def remotes(self) -> list[RemoteInfo]:
        """The connected remote subscribers, then the last ones that left (up to 64)."""
        loop = self._loop
        if loop is None or self._closed:
            return list(self._history)
        if _ucx.on_loop():
            return [remote.info() for remote in self._remotes] + list(self._history)
        try:
            return _ucx.run(loop, self._infos(), 2.0)
        except Timeout:  # pragma: no cover - the loop is busy for seconds
            return list(self._history)

    async def _infos(self) -> list[RemoteInfo]:
        return [remote.info() for remote in self._remotes] + list(self._history)

    @property
    def closed(self) -> bool:
        return self._closed

    def serve_forever(self) -> None:
        """Block until :meth:`close` (from another thread) or, on the main thread, SIGINT/SIGTERM."""
        done = threading.Event()
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGINT, signal.SIGTERM):
                previous[number] = signal.signal(number, lambda *_: done.set())
        try:
            while not done.is_set() and not self._closing:
                done.wait(0.25)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        self.close()

    def _write_status(self) -> None:
        """The relay's entry beside its topic's socket, for ``python -m eglcuda topics``."""
        if self._closed:
            return
        infos = [remote.info() for remote in self._remotes] if _ucx.on_loop() else self.remotes
        path = registry.relay_status_path(self._sub.path, os.getpid())
        body = {"version": 1, "name": self.name, "pid": os.getpid(), "address": f"{self.address[0]}:{self.address[1]}",
                "qos": self.qos.name.lower(), "remotes": [asdict(r) for r in infos if r.connected]}
        try:
            registry.write_relay_status(path, body)
            self._status_path = path
        except OSError as exc:  # the listing misses it; serving goes on
            log.debug("relay %s: status file: %s", self.name, exc)

    def close(self) -> None:
        """Stop serving: remote subscribers get :class:`eglcuda.Dropped` (the relay closed), the
        local subscription ends, every buffer is freed. Safe to call twice."""
        if self._closed:
            return
        _ucx.untrack(self)
        if os.getpid() != self._pid:  # (a forked child: the loop, the buffers and the status file are the parent's)
            self._closed = True
            return
        self._closing = True
        loop = self._loop
        if loop is not None:
            try:
                _ucx.run(loop, self._shut_down(), 5.0)
            except Exception as exc:  # noqa: BLE001 - teardown goes on
                log.warning("relay %s: shutting down its connections: %s", self.name, exc)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(10)
        self._closed = True
        try:
            self._sub.close()
        finally:
            if loop is not None:
                self._loop = None
                _ucx.release()
            staging, self._staging = self._staging, None
            if staging is not None:
                staging.close()
            if self._status_path is not None:
                try:
                    os.unlink(self._status_path)
                except OSError:
                    pass

    async def _shut_down(self) -> None:
        watchdog = getattr(self, "_watchdog", None)
        for remote in list(self._remotes):
            self._end(remote, Reason.CLOSING, f"the relay of topic {self.name!r} closed", dropped=False)
        deadline = time.monotonic() + 2.0
        while self._remotes and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        for remote in list(self._remotes):
            self._abort(remote.ep)
        await asyncio.sleep(0.05)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if watchdog is not None:
            watchdog.cancel()

    def __enter__(self) -> "Relay":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"on {self.address[0]}:{self.address[1]}"
        return f"<Relay {self.name!r} {state}>"


async def _before(step: Any, deadline: float) -> Any:
    """``step`` awaited until ``deadline`` (``time.monotonic()``; TimeoutError then)."""
    return await asyncio.wait_for(step, max(0.0, deadline - time.monotonic()))


def _quiet(task: "asyncio.Future[Any]") -> None:
    """Retrieve a finished task's exception (its owner already acted on the failure)."""
    if not task.cancelled():
        task.exception()
