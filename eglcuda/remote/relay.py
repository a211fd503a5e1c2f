"""The relay: a local subscriber of a topic that serves remote subscribers over UCX.

Its parts, each with its own state: a :class:`Staging` ring (staging.py: page-locked buffers,
the D2H copies, the references of the sends), a :class:`Server` (server.py: the listener and the
handshake) and one :class:`Sender` per remote subscriber (sender.py: its window, credits, queue,
sends, beats and end). The :class:`Relay` owns them, the local subscription and what is true of
the topic for every remote (its welcome, whether a publisher is there); it admits remote
subscribers and decides which of them get each staged frame.

Threads: the *local* thread receives the topic's frames (an ordinary
:class:`eglcuda.Subscriber`), queues each one's copy device -> page-locked host staging on its
stream and releases it at once (the release is ordered after the copy on the GPU: the publisher
gets its pool slot back after one D2H copy), then goes back for the next frame without waiting
for the copy; the shared UCX engine (_ucx.py) runs every connection (the server, the senders, and
the relay's watchdog) and dispatches a staged frame to the senders once its copy is done.
A staging buffer is reused once every send of it ended. The publisher's frame path never waits
on the network: with no free staging buffer a 'latest' relay skips the frame (an 'every' relay
waits, as a local 'every' subscriber would).
"""
from __future__ import annotations

import asyncio
import collections
import gc
import logging
import os
import secrets
import signal
import threading
import time
from dataclasses import asdict
from typing import Any, Callable, Iterable


from .._integers import as_int
from .._lifecycle import exiting
from .._unix import positive_seconds
from ..cuda_device import get_device
from ..errors import ClosedError, Dropped, EglCudaError, Refused, StreamDisconnected, Timeout, UsageError
from ..topics import naming, registry
from ..topics.protocol import Qos, Reason
from ..topics.subscriber import Subscriber
from . import _ucx, keys, wire
from .sender import Limits, RemoteInfo, Sender
from .server import Server
from .session import frame_mode
from .staging import Staging
from .wire import DISCONNECTED, NO_PUBLISHER, parse_address

__all__ = ["Relay", "RemoteInfo", "parse_address"]

log = logging.getLogger("eglcuda.remote")
PORT_FREE_S = 3.0  # how long close() waits for UCX to let go of the listening port


class Relay:
    """Serve topic ``name`` to remote subscribers (``eglcuda.Subscriber(name, remote=...)``)
    over UCX, from a local subscription of it.

    :param listen: ``"HOST:PORT"``: the address and port to serve on (port 0: any free port;
        :attr:`address` says which). HOST is an address of this host (0.0.0.0 or ``::``: all of
        them; another one is a :class:`UsageError`). UCXX's listener takes a port only, so UCX
        accepts connections to that port on every address of the host: the relay closes those
        made to another address than HOST at once, before a word (docs/remote.md, "The
        address"). A port in use is a :class:`UsageError` naming it.
    :param key: the pre-shared key (random bytes, at least 16: ``python -m eglcuda keygen PATH``
        makes one; text and patterns are refused); None: from ``EGLCUDA_REMOTE_KEY_FILE`` or
        ``EGLCUDA_REMOTE_KEY`` (docs/security.md).
    :param qos: the relay's own local subscription: ``"latest"`` (never slows the publisher;
        remote subscribers then see skipped frames when the relay falls behind) or ``"every"``.
    :param queue: the local subscription's queue (``every``).
    :param device: the CUDA device the relay reads frames on.
    :param timeout: seconds to wait for the publisher at construction; also how long a remote
        subscriber may stay silent (a stalled one) before it is dropped (1 s at least: two of its
        beats), and a handshake's limit (1 s at least).
    :param path: an explicit topic socket path, as for a local :class:`eglcuda.Subscriber`.
    :param trusted_uids: the users whose publishers are accepted, as for a local subscriber.
    :param max_remotes: remote subscribers served at once (more are refused).
    :param every_timeout: seconds an ``every`` remote subscriber may go without releasing a frame
        while the relay has frames for it; then it is dropped (it gets :class:`eglcuda.Dropped`).
    :param frames: how the frames' bytes are protected on the wire: ``"plain"`` (the default: each
        frame's header is authenticated, its bytes are not), ``"integrity"`` (a MAC over the whole
        frame) or ``"encrypted"`` (AES-256-GCM); every other message is always authenticated
        (docs/security.md, with each mode's cost).

    Raises :class:`eglcuda.Timeout` when no publisher answered in ``timeout`` seconds, and
    :class:`eglcuda.Unsupported` (with what to install) without ucxx."""

    def __init__(self, name: str, listen: str = "127.0.0.1:0", *, key: bytes | None = None, qos: str = "latest",
                 queue: int = 4, device: Any = 0, timeout: float = 5.0, path: Any = None,
                 trusted_uids: int | Iterable[int] | str | None = None, max_remotes: int = 16,
                 every_timeout: float = 1.0, frames: str = "plain") -> None:
        self.name = naming.check_name(name)
        seal = wire.frame_seal(secrets.token_bytes(32), frame_mode(frames))
        host, port = parse_address(listen, "listen", least_port=0)
        _ucx.require()  # (what to install is the first thing to say)
        _ucx.check_fork()
        listen_ip = _ucx.host_ip(host)  # (UsageError for an address that is not this host's)
        try:
            _ucx.check_port(port)  # (before waiting for the publisher)
        except UsageError as exc:
            raise UsageError(f"relay {self.name!r} cannot listen on {host}:{port}: {exc}") from None
        psk = keys.load_key(key)
        self.timeout = positive_seconds(timeout, "timeout")
        self.every_timeout = positive_seconds(every_timeout, "every_timeout")
        most = as_int(max_remotes)
        if most is None or not 1 <= most <= 1024:
            raise UsageError(f"max_remotes is an int in 1..1024, got {max_remotes!r}")
        self.max_remotes = most
        self._limits = Limits(self.name, self.timeout, self.every_timeout)
        self._frames = seal
        self._closing = False
        self._closed = False
        # One close() tears down; another (serve_forever's own, the exit hook's) waits for it.
        self._close_lock = threading.Lock()
        self._senders: list[Sender] = []  # (engine's thread)
        self._history: collections.deque[RemoteInfo] = collections.deque(maxlen=64)  # those that left
        self._staging: Staging | None = None
        handshake_s = max(self.timeout, wire.HANDSHAKE_LEAST_S)
        self._server = Server(self.name, psk, handshake_s, self._refusal, self._admit)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._status_path: str | None = None
        self._pid = os.getpid()  # a forked child's close() leaves the parent's relay alone
        self._sub = Subscriber(self.name, qos=qos, queue=queue, device=device, timeout=self.timeout, path=path,
                               trusted_uids=trusted_uids)
        self.qos = self._sub.qos
        self._welcome: wire.Welcome | None = None
        self._live = True  # a publisher is there (engine's thread)
        self._thread: threading.Thread | None = None
        # Frames staged by the local thread for the engine's thread to dispatch, in order: one
        # wake-up of the loop for those staged until it runs (_handed: one is queued).
        self._staged: collections.deque[tuple[int, int]] = collections.deque()
        self._handed = False
        self._copy_since = 0.0  # when the loop first found the next staged frame's copy running
        try:
            if self._sub.info is None or self._sub.cuda_stream is None:  # pragma: no cover - a CUDA subscriber has both
                raise UsageError("the relay's subscriber has no CUDA stream")
            self._staging = Staging(get_device(device), self._sub.cuda_stream, seal,
                                    0.0 if self.qos is Qos.LATEST else self.timeout)
            self._set_up_staging()
            self._loop = _ucx.acquire()
            try:
                bound = _ucx.run(self._loop, self._server.listen(port, listen_ip), handshake_s)
            except UsageError as exc:  # (the port is in use: said with the whole address)
                self._loop = None
                _ucx.release()
                raise UsageError(f"relay {self.name!r} cannot listen on {host}:{port}: {exc}") from None
            except BaseException:
                self._loop = None
                _ucx.release()
                raise
            #: ``(host, port)`` the relay listens on: the port the system chose for ``listen="HOST:0"``.
            self.address: tuple[str, int] = (host, bound)
            self._watchdog = asyncio.run_coroutine_threadsafe(self._watch(), self._loop)
            self._thread = threading.Thread(target=self._local, name=f"eglcuda-relay-{self.name}", daemon=True)
            self._thread.start()
            self._write_status()
        except BaseException:
            self.close()
            raise
        _ucx.track(self, turn=1)

    # ---- the local thread -------------------------------------------------------------------------
    def _set_up_staging(self) -> None:
        info = self._sub.info
        staging = self._staging
        assert info is not None and staging is not None
        size = wire.frame_bytes(info.format, info.width, info.height)
        self._welcome = wire.Welcome(info.width, info.height, info.format, 1, info.pool, info.publisher_pid,
                                     info.instance, info.next_seq, info.fps, size)
        staging.allocate(size, f"staging {info.width}x{info.height} frames of a relay")

    def _local(self) -> None:
        """The local thread: frames in, copied to staging, released, handed to the UCX engine.
        A 'latest' relay receives only when a remote subscriber can take the frame (the newest
        then): it never copies a frame only to skip it, and sleeps instead of taking every frame
        of a publisher that runs flat out (CPU and GIL the local subscribers and the engine need).
        Otherwise it looks every 0.25 s whether the publisher is still there."""
        sub = self._sub
        staging = self._staging
        assert staging is not None
        while not self._closing:
            look = self.qos is Qos.LATEST and not staging.wanted.wait(0.25)
            try:
                message = sub.receive(timeout=0.001 if look else 0.25)
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
            seq = message.seq
            try:
                index = None if look else staging.stage(message)
            finally:
                message.release()
            if index is not None:
                self._hand_over(index, seq)

    def _hand_over(self, index: int, seq: int) -> None:
        """Give staged frame ``seq`` to the engine's thread: one wake-up of its loop for all the
        frames staged before it runs (the deque and the flag are safe between the two threads:
        the loop clears the flag before it takes the frames)."""
        self._staged.append((index, seq))
        if not self._handed:
            self._handed = True
            self._call(self._dispatch_staged)

    def _publisher_lost(self, exc: StreamDisconnected) -> None:
        code = exc.code if isinstance(exc, Dropped) else DISCONNECTED
        reason = exc.reason if isinstance(exc, Dropped) else str(exc)
        self._call(self._all_gone, code, f"topic {self.name!r} behind the relay: {reason}")

    def _reconnect(self) -> bool:
        """Wait for a publisher again (the relay outlives publisher restarts)."""
        staging = self._staging
        assert staging is not None
        while not self._closing:
            try:
                self._sub.wait_for_publisher(0.5)
            except (Timeout, StreamDisconnected, Refused):
                continue
            except ClosedError:
                return False
            # Frames of the same size: the ring serves as it is, at once (the old publisher's sends
            # keep their buffers until they end; the new frames take the free ones): a remote that
            # stopped, whose sends end only when its sender lets go, seconds from now, delays
            # nobody. Another size: a new ring once every send of the old ended (never sooner: UCX
            # may still read a buffer). Remotes that receive finish theirs (the last frames of the
            # old publisher, then its GONE); one whose send has not ended for a while does not
            # receive, and is ended now rather than waited for. A close ends the wait too.
            info = self._sub.info
            if info is not None and staging.reallocates(wire.frame_bytes(info.format, info.width, info.height)):
                while not self._closing and not staging.sends_ended(0.25):
                    self._call(self._end_stuck)
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

    # ---- the engine's thread ----------------------------------------------------------------------
    def _refusal(self, hello: wire.Hello) -> tuple[int, str] | None:
        """Why a peer that proved the key is not served now (the server asks)."""
        if self._closing:
            return Reason.CLOSING, "the relay is closing"
        if sum(1 for sender in self._senders if not sender.left) >= self.max_remotes:
            return Reason.BUSY, f"the relay serves {self.max_remotes} remote subscribers already"
        if not self._live or self._welcome is None:
            return NO_PUBLISHER, f"topic {self.name!r} has no publisher at the relay now"
        return None

    def _admit(self, ep: Any, peer: str, hello: wire.Hello) -> Sender:
        """Take a peer on, right after :meth:`_refusal` said nothing against it (the server
        asks): its sender, one of the relay's from now on."""
        welcome = self._welcome
        staging = self._staging
        assert welcome is not None and staging is not None
        window = (wire.latest_window(welcome.frame_bytes) if hello.qos is Qos.LATEST
                  else min(hello.queue, wire.MAX_WINDOW))
        info = self._sub.info
        next_seq = info.next_seq if info is not None else 0
        seal = self._frames
        reply = wire.Welcome(welcome.width, welcome.height, welcome.format, window, welcome.pool,
                             welcome.publisher_pid, welcome.instance, next_seq, welcome.fps, welcome.frame_bytes,
                             seal.mode, seal.key)
        sender = Sender(ep, peer, hello.qos, hello.queue, window, reply, staging, self._limits, self._want,
                        self._left)
        self._senders.append(sender)
        self._want()
        if self.qos is Qos.EVERY and hello.qos is Qos.EVERY:
            # (Frames staged before it came may still be dispatched to it, while a later one was
            # skipped for the others' want of room: it starts after that one, so that it never
            # sees a gap; from now on an 'every' relay skips nothing for want of room.)
            sender.start_after(staging.skipped())
        return sender

    def _left(self, sender: Sender) -> None:
        if sender in self._senders:
            self._senders.remove(sender)
        self._want()
        self._history.append(sender.info())

    def _end_stuck(self) -> None:
        """The senders holding staging buffers that do not receive (:meth:`Sender.stuck`): ended
        now (their sends end with the endpoint, and the buffers come back)."""
        now = time.monotonic()
        for sender in list(self._senders):
            if sender.stuck(now):
                sender.abort()

    def _set_live(self, live: bool) -> None:
        self._live = live

    def _dispatch_staged(self) -> None:
        """Dispatch the staged frames whose copies are done, in order (copies on one stream end
        in order: the first still running holds the rest). While one runs, the loop looks again
        at its next turn, after what else is ready (a copy takes 0.1-0.3 ms); after 2 ms of a
        copy, every millisecond (a stalled GPU costs no core)."""
        self._handed = False
        staged = self._staged
        staging = self._staging
        while staged:
            index, seq = staged[0]
            try:
                done = staging is None or staging.copied(index)
            except EglCudaError as exc:  # pragma: no cover - a driver failure: the frame goes nowhere
                log.error("relay %s: a staging copy failed: %s", self.name, exc)
                staged.popleft()
                if staging is not None:
                    staging.refer(index, 0)
                self._want(dispatched=1)
                continue
            if not done:
                now = time.monotonic()
                if not self._copy_since:
                    self._copy_since = now
                if not self._handed:
                    self._handed = True
                    loop = self._loop
                    if loop is not None:
                        if now - self._copy_since < 0.002:
                            loop.call_soon(self._dispatch_staged)
                        else:
                            loop.call_later(0.001, self._dispatch_staged)
                return
            self._copy_since = 0.0
            staged.popleft()
            self._dispatch(index, seq)

    async def _drop_staged(self) -> None:
        """The frames the local thread staged and nobody will send (closing): their buffers free."""
        staging = self._staging
        while self._staged:
            index, _ = self._staged.popleft()
            if staging is not None:
                staging.refer(index, 0)

    def _dispatch(self, index: int, seq: int) -> None:
        """A staged frame: queue it for each remote subscriber that has room for it."""
        staging = self._staging
        assert staging is not None
        every = self.qos is Qos.EVERY
        takers = [sender for sender in self._senders if sender.offer(index, seq, every)]
        try:
            staging.refer(index, len(takers))
            for sender in takers:
                sender.pump()
        finally:
            self._want(dispatched=1)

    def _want(self, dispatched: int = 0) -> None:
        """Tell the local thread how many frames some remote subscriber can take now (with
        ``dispatched``, that many of the frames it staged were dispatched)."""
        every = self.qos is Qos.EVERY
        room = max((sender.room(every) for sender in self._senders), default=0)
        staging = self._staging
        if staging is not None:
            staging.set_room(max(0, room), dispatched)

    def _all_gone(self, code: int, reason: str) -> None:
        self._live = False
        flush_until = time.monotonic() + self.every_timeout if code == Reason.CLOSING else 0.0
        for sender in list(self._senders):
            sender.end(code, reason, dropped=False, flush_until=flush_until)

    async def _watch(self) -> None:
        """Each sender's watchdog look every 0.1 s (the silent, the deaf and the slow are
        dropped); the status file each second."""
        rounds = 0
        while True:
            await asyncio.sleep(0.1)
            rounds += 1
            if rounds % 10 == 0:
                self._write_status()  # (what `python -m eglcuda topics` shows)
            now = time.monotonic()
            for sender in list(self._senders):
                sender.check(now)

    async def _shut_down(self) -> None:
        watchdog = getattr(self, "_watchdog", None)
        for sender in list(self._senders):
            sender.end(Reason.CLOSING, f"the relay of topic {self.name!r} closed", dropped=False)
        deadline = time.monotonic() + 2.0
        while self._senders and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        # Those still there did not answer the end (a stopped process, say): reset, not only
        # closed, so that nothing they left posted keeps the port bound.
        await self._server.drop([sender.ep for sender in self._senders])
        await asyncio.sleep(0.05)
        self._server.close()
        if watchdog is not None:
            watchdog.cancel()

    # ---- the user's side ----------------------------------------------------------------------------
    @property
    def remotes(self) -> list[RemoteInfo]:
        """The connected remote subscribers, then the last ones that left (up to 64). In a child
        made by ``fork()`` it raises :class:`UsageError`: the remotes are the parent's."""
        if os.getpid() != self._pid:  # (the loop is the parent's: here nothing would answer)
            raise self._forked_error()
        loop = self._loop
        if loop is None or self._closed:
            return list(self._history)
        if _ucx.on_loop():
            return [sender.info() for sender in self._senders] + list(self._history)
        try:
            return _ucx.run(loop, self._infos(), 2.0)
        except Timeout:  # pragma: no cover - the loop is busy for seconds
            return list(self._history)

    async def _infos(self) -> list[RemoteInfo]:
        return [sender.info() for sender in self._senders] + list(self._history)

    @property
    def closed(self) -> bool:
        return self._closed

    def serve_forever(self, ready: Callable[[], None] | None = None) -> None:
        """Block until :meth:`close` (from another thread) or, on the main thread, SIGINT/SIGTERM.
        ``ready`` is called once those signals close the relay (a line saying it serves, printed
        from there, tells a supervisor that a signal from then on is a clean stop). In a child
        made by ``fork()`` it raises :class:`UsageError`: the relay serves in its own process."""
        if ready is not None and not callable(ready):
            raise UsageError(f"ready is a callable (or None), got {type(ready).__name__}")
        if os.getpid() != self._pid:  # (the parent serves: here it would block, serving nothing, until a signal)
            raise self._forked_error()
        done = threading.Event()
        previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for number in (signal.SIGINT, signal.SIGTERM):
                previous[number] = signal.signal(number, lambda *_: done.set())
        try:
            if ready is not None:
                ready()
            while not done.is_set() and not self._closing:
                done.wait(0.25)
        finally:
            for signum, handler in previous.items():
                # None: a handler not installed from Python (an embedding application's), which
                # Python cannot put back; the default action is the nearest it can.
                signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        self.close()

    def _forked_error(self) -> UsageError:
        return UsageError(f"this relay of topic {self.name!r} belongs to process {self._pid}, not to this forked "
                          "child: it serves in that process (close() here only lets go of its copy)")

    def _write_status(self) -> None:
        """The relay's entry beside its topic's socket, for ``python -m eglcuda topics``."""
        if self._closed:
            return
        infos = [sender.info() for sender in self._senders] if _ucx.on_loop() else self.remotes
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
        local subscription ends, every buffer is freed, and the call returns once the listening
        port is free again (a relay made next on it binds at once; at most 3 s more). Safe to
        call twice, and from two threads at once (the second returns once the first is done)."""
        if os.getpid() != self._pid:  # (a forked child: the loop, the buffers and the status file are the parent's)
            _ucx.untrack(self)
            self._closed = True
            return
        with self._close_lock:  # (_closed is set before the teardown ends: the lock is what waits for it)
            if not self._closed:
                self._close()

    def _close(self) -> None:
        # (Untracked once torn down, not before: an exit while another thread's close() is under
        # way closes it again, which waits for that close, instead of stopping the engine under
        # it: its shutdown was cancelled and said so on stderr.)
        try:
            self._tear_down()
        finally:
            _ucx.untrack(self)

    def _tear_down(self) -> None:
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
        if loop is not None:
            try:
                _ucx.run(loop, self._drop_staged(), 2.0)
            except Exception as exc:  # noqa: BLE001 - teardown goes on
                log.warning("relay %s: giving back staged frames: %s", self.name, exc)
        self._closed = True
        if self._staging is not None:
            self._staging.settle()  # (its copies run on the local subscriber's stream)
        try:
            self._sub.close()
        finally:
            if loop is not None:
                self._loop = None
                _ucx.release()
            staging, self._staging = self._staging, None
            if staging is not None and not staging.close(2.0):  # (left allocated, not freed under a send UCX may read)
                log.warning("relay %s: a send did not end in 2 s: its staging buffers stay allocated", self.name)
            if self._status_path is not None:
                try:
                    os.unlink(self._status_path)
                except OSError:
                    pass
        self._wait_for_port()

    def _wait_for_port(self) -> None:
        """Return once the listening port is free again, so that a relay made next binds it:
        UCX's listener goes with the last endpoint it accepted, which the engine's closer thread
        lets go of after the close above (a connection to a stopped peer takes up to a second or
        two). An endpoint may still be held by a reference cycle (an exception's traceback that
        holds a request of it, which UCXX's futures can make): after 0.2 s one collection pass
        frees it. At most PORT_FREE_S; a port still taken then is left to whoever holds it."""
        if exiting():  # (the process ends: nobody binds the port after it here)
            return
        address: tuple[str, int] | None = getattr(self, "address", None)
        if address is None:  # (a construction that failed before it listened: no port of its own to wait for)
            return
        started = time.monotonic()
        collected = False
        while True:
            try:
                _ucx.check_port(address[1])
                return
            except UsageError:
                waited = time.monotonic() - started
                if not collected and waited >= 0.2:
                    collected = True
                    gc.collect()
                    continue
                if waited >= PORT_FREE_S:
                    log.debug("relay %s: port %d still taken %.1f s after close", self.name, address[1],
                              PORT_FREE_S)
                    return
                time.sleep(0.01)

    def __enter__(self) -> "Relay":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"on {self.address[0]}:{self.address[1]}"
        return f"<Relay {self.name!r} {state}>"
