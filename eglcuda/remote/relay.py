"""The relay: a local subscriber of a topic that serves remote subscribers over UCX.

Threads: the *local* thread receives the topic's frames (an ordinary
:class:`eglcuda.Subscriber`), copies each one device -> page-locked host staging on its own stream
and releases it at once (the publisher gets its pool slot back after one D2H copy); the shared
UCX engine (_ucx.py) runs every connection (serving.py: the handshake, one sender and one credit
reader per remote subscriber, and a watchdog). A staging buffer is reused once every send of it ended. The
publisher's frame path never waits on the network: with no free staging buffer a 'latest' relay
skips the frame (an 'every' relay waits, as a local 'every' subscriber would).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import queue as _queue
import secrets
import signal
import threading
import time
from dataclasses import asdict
from typing import Any, Iterable


from .._bind import cuda
from .._unix import positive_seconds
from ..cuda_device import get_device
from ..errors import ClosedError, Dropped, EglCudaError, Refused, StreamDisconnected, Timeout, UsageError
from ..topics import naming, registry
from ..topics.protocol import Qos
from ..topics.subscriber import Subscriber
from . import _ucx, keys, wire
from .buffers import Pinned
from .serving import RemoteInfo, Serving, _Remote
from .session import frame_mode
from .wire import DISCONNECTED, parse_address

__all__ = ["Relay", "RemoteInfo", "parse_address"]

log = logging.getLogger("eglcuda.remote")

STAGING = 12  # staging buffers of a relay (frames between its D2H copy and the end of their sends)


class Relay(Serving):
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
        subscriber may stay silent (a stalled one) before it is dropped, and a handshake's limit.
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
                 trusted_uids: Iterable[int] | str | None = None, max_remotes: int = 16,
                 every_timeout: float = 1.0, frames: str = "plain") -> None:
        self.name = naming.check_name(name)
        self._frames = wire.frame_seal(secrets.token_bytes(32), frame_mode(frames))
        host, port = parse_address(listen, "listen")
        _ucx.require()  # (what to install is the first thing to say)
        _ucx.check_fork()
        self._listen_ip = _ucx.host_ip(host)  # (UsageError for an address that is not this host's)
        try:
            _ucx.check_port(port)  # (before waiting for the publisher)
        except UsageError as exc:
            raise UsageError(f"relay {self.name!r} cannot listen on {host}:{port}: {exc}") from None
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
        # Set while some remote subscriber can take a frame now (an 'every' one, or a 'latest' one
        # with credit to spare beyond the frames already staged for it), waited on by the local
        # thread. Under _room_lock: _room (the most frames one remote can take now: the engine's
        # count) and _staged (frames the local thread copied or is copying, not yet dispatched):
        # a frame is copied only when room is left for it, never only to be skipped.
        self._wanted = threading.Event()
        self._room_lock = threading.Lock()
        self._room = 0
        self._staged = 0
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
            except UsageError as exc:  # (the port is in use: said with the whole address)
                self._loop = None
                _ucx.release()
                raise UsageError(f"relay {self.name!r} cannot listen on {host}:{port}: {exc}") from None
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
        if self._staging is not None and self._staging.size == wire.message_bytes(size):
            return  # (a restarted publisher of the same frame size: the ring serves as it is)
        old, self._staging = self._staging, None
        if old is not None:
            old.close()
        self._staging = Pinned(self._device, STAGING, wire.message_bytes(size),
                               f"staging {info.width}x{info.height} frames of a relay")
        self._free = _queue.Queue()
        self._refs = {}
        for index in range(STAGING):
            self._free.put(index)

    def _local(self) -> None:
        """The local thread: frames in, copied to staging, released, handed to the UCX engine.
        A 'latest' relay receives only when a remote subscriber can take the frame (the newest
        then): it never copies a frame only to skip it, and sleeps instead of taking every frame
        of a publisher that runs flat out (CPU and GIL the local subscribers and the engine need).
        Otherwise it looks every 0.25 s whether the publisher is still there."""
        sub = self._sub
        while not self._closing:
            look = self.qos is Qos.LATEST and not self._wanted.wait(0.25)
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
                index = None if look else self._stage(message)
            finally:
                message.release()
            if index is not None:
                self._call(self._dispatch, index, seq)

    def _reserve(self) -> bool:
        """Count one more frame staged, if some remote subscriber has room left for it."""
        with self._room_lock:
            if self._room - self._staged <= 0:
                self._wanted.clear()
                return False
            self._staged += 1
            if self._room - self._staged <= 0:
                self._wanted.clear()
            return True

    def _unreserve(self) -> None:
        """A reserved frame was not staged after all."""
        with self._room_lock:
            self._staged -= 1
            if self._room - self._staged > 0:
                self._wanted.set()

    def _stage(self, message: Any) -> int | None:
        """Copy the frame into a free staging buffer (None: skipped). A staged frame is reserved
        (:meth:`_reserve`) until the engine dispatches it."""
        if not self._reserve():
            return None  # nobody to send it to now: no copy
        try:
            if self.qos is Qos.LATEST:
                index = self._free.get_nowait()
            else:
                # (An 'every' relay waits, as a local 'every' subscriber would: the publisher's
                # every_timeout decides; the watchdog drops the remote subscribers that keep it.)
                index = self._free.get(timeout=self.timeout)
        except _queue.Empty:
            self._unreserve()
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
            self._frames.seal(out)  # (the frame's seal: header always; its bytes too, or encrypted: frames=)
        except BaseException:
            self._free.put(index)
            self._unreserve()
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
            while not self._closing and not self._sends_ended(STAGING, 0.25):
                pass
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
                if self._sends_ended(len(staging), 2.0):
                    staging.close()
                else:  # (leaked, not freed under a send UCX may still read from)
                    log.warning("relay %s: a send did not end in 2 s: its staging buffers stay allocated", self.name)
            if self._status_path is not None:
                try:
                    os.unlink(self._status_path)
                except OSError:
                    pass

    def _sends_ended(self, count: int, timeout: float) -> bool:
        """Whether all ``count`` staging buffers came back (every send from them ended: the
        endpoints were aborted, so their requests complete) within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self._free.qsize() < count:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def __enter__(self) -> "Relay":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"on {self.address[0]}:{self.address[1]}"
        return f"<Relay {self.name!r} {state}>"
