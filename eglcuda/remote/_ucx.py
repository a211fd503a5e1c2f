"""UCX through UCXX's core API: the one engine of this process (a daemon thread, ``eglcuda-ucx``)
that every relay and remote subscriber runs its connections on, and the one-line install hint
when ucxx is missing.

The engine thread owns a UCX context and worker (``ucxx._lib.libucxx``) and an asyncio loop that
schedules the connections' coroutines and runs every completion callback. Who moves the bytes is
the progress mode (``EGLCUDA_UCX_PROGRESS``, read when the engine starts):

- ``thread`` (the default): UCXX's C++ progress thread progresses the worker (the kernel's TCP
  copies of every frame happen there, without the GIL); requests are handed to it (UCXX's
  delayed submission), and the engine's loop sleeps in UCXX's request notifier instead of epoll
  (:class:`_NotifiedSelector`): a request that finished wakes the loop itself, its future is set
  there and its callback runs in that loop iteration, in the order requests finished (no thread
  between, no scan of the pending requests). The engine thread spends its time on Python only,
  beside the copies instead of before them. Nothing Python runs on the progress thread but
  UCXX's connection-request callback, which hands the request to the loop: the progress thread
  holds UCXX's locks while it calls back, so a closed endpoint is noticed by asking (:meth:`Endpoint.check_alive`, each
  fallback pass) and by its requests failing. A send posted on a connection that failed while it
  was being made never ends in this mode (UCX retries it forever on the progress thread): a
  subscriber therefore sends nothing before the relay spoke first (wire.encode_relay).
- ``loop``: the engine thread progresses the worker itself: it runs in UCX's blocking mode, its
  epoll descriptor is a reader of the loop, and after each progress pass (progress until idle,
  complete the finished requests) the worker is armed, so the thread sleeps in the loop's epoll
  until UCX has an event, another thread hands it work, or a timer is due.

Neither spins (UCXX's asyncio API does): a fallback pass each ``FALLBACK_S`` makes a missed
event a delay, never a hang; the progress thread looks at least every ``PROGRESS_EPOLL_MS``.
Measured, and why thread mode: docs/remote.md, "The engine" and "Two progress modes".

Tags: UCX matches a tag receive on the whole worker, not per endpoint. A message's tag is its
receiver's prefix and its kind (wire.py); both sides derive a connection's two prefixes from its
session (session.py), so they never travel, and each side registers the prefix of what it
*receives* (:meth:`Engine.claim_prefix`: unique in this process) before its peer may send on it.
Two connections of one process never match each other's messages, a peer cannot guess another
connection's tags, and the sweep of unreceived messages (:meth:`Engine._sweep`) spares only the
registered prefixes.

The engine starts with the first relay or remote subscriber and stays until the interpreter exits
(then open relays and remote subscribers are closed first): one context and worker for the
process's life costs its threads (one in loop mode, two in thread mode) and a fixed few
descriptors, however often subscribers come and go. A forked child cannot use its parent's engine
(UCX is not fork-safe): it gets a :class:`UsageError`."""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import ctypes
import ctypes.util
import gc
import importlib
import ipaddress
import logging
import os
import queue
import secrets
import selectors
import threading
import time
import weakref
from typing import Any, Awaitable, Callable, Coroutine, TypeVar

import numpy as np

from .._lifecycle import exiting, mark_exiting
from ..errors import EglCudaError, Timeout, Unsupported, UsageError
from .unheard import Unheard, host_of

T = TypeVar("T")
log = logging.getLogger("eglcuda.remote")
INSTALL = "pip install -e '.[remote-cu12]' in a checkout (CUDA 12; remote-cu13 for CUDA 13)"
FALLBACK_S = 0.1  # a progress pass at least this often (UCX may miss an event once armed late)
PROGRESS_MODES = ("thread", "loop")  # EGLCUDA_UCX_PROGRESS (the module's docstring)
PROGRESS_EPOLL_MS = 10  # the progress thread's longest sleep (a post wakes it; 1 ms: 2 % of a core idle)
NOTIFY_WAIT_NS = 100_000_000  # thread mode: the loop's longest sleep in UCXX's request notifier
FUTURES_REFILL = 32  # thread mode: refill UCXX's pool of futures (about 100) every this many posts
PASS_ROUNDS = 4  # progress rounds of one pass before the loop runs its other work
PREFIX_BITS = 56  # a tag is (prefix << 8) | kind
CLOSE_NS = 100_000_000  # how long the closer thread waits for UCX to close one endpoint
KINDS = (1, 2, 3)  # the kinds of tagged message (wire.FRAME_TAG, NOTE_TAG, CONTROL_TAG)
SWEEP_MAX = 4096  # unexpected tagged messages dropped in one go (then the loop's other work, then more)
UNCLAIMED_S = 1.0  # a message of one of our connections not received within this is dropped too
PENDING_MAX = 64  # connections in their handshake at once, in all (more are closed at once)
PENDING_PER_ADDRESS = 8  # ... and from one address
ENDPOINTS_END_S = 1.0  # how long Listener.drop waits for what was posted on the connections it reset
LOOK_S = 0.5  # how often a relay's listener looks for connections that never made a request (unheard.py)

_lock = threading.Lock()
_engine: "Engine | None" = None
_ucxx: Any = None
# Relays and remote subscribers to close at exit, each with its turn (lower first).
_open: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()


def ucxx_missing() -> str | None:
    """One line saying what to install when ucxx cannot be imported (None: it can)."""
    try:
        importlib.import_module("ucxx")
    except Exception as exc:  # noqa: BLE001 - any import failure means the same to the user
        why = f" ({exc})" if not isinstance(exc, ModuleNotFoundError) else ""
        return f"remote topics need ucxx, which is not installed{why}: {INSTALL}"
    return None


# UCX settings eglcuda uses unless the environment names them: TCP segments big enough for a frame
# (UCX's 8 KiB send segments cost about 1.7x in rate for 3 MB frames over loopback: research/README.md).
TUNING = {"UCX_TCP_TX_SEG_SIZE": "256K", "UCX_TCP_RX_SEG_SIZE": "1M",
          # A relay restarted on its port binds at once: SO_REUSEADDR on UCX's listening socket
          # (without it the port stays taken while the old connections sit in TIME-WAIT, about a
          # minute). Two listeners on one port are still refused (Linux's SO_REUSEADDR).
          "UCX_CM_REUSEADDR": "y",
          # UCXX's own error lines (one per failed connection attempt while a relay is down, say)
          # repeat what eglcuda raises as named errors: off unless asked for (UCXX_LOG_LEVEL=ERROR).
          "UCXX_LOG_LEVEL": "FATAL"}


def progress_mode() -> str:
    """The UCX progress mode of this process's engine (``EGLCUDA_UCX_PROGRESS``: ``thread``, the
    default, or ``loop``); :class:`UsageError` for another value."""
    mode = os.environ.get("EGLCUDA_UCX_PROGRESS", "") or PROGRESS_MODES[0]
    if mode not in PROGRESS_MODES:
        raise UsageError(f"EGLCUDA_UCX_PROGRESS is one of {', '.join(PROGRESS_MODES)}, got {mode!r}")
    return mode


def require() -> Any:
    """The ucxx module, or :class:`Unsupported` with the line to install it."""
    global _ucxx
    if _ucxx is None:
        for name, value in TUNING.items():  # (read when the engine makes its context, after this)
            os.environ.setdefault(name, value)
        missing = ucxx_missing()
        if missing is not None:
            raise Unsupported("ucxx", hint=INSTALL)
        _ucxx = importlib.import_module("ucxx")
    return _ucxx


class LinkError(Exception):
    """A UCX request on a connection failed (the peer left, the link broke, a message did not fit)."""


class Truncated(LinkError):
    """A message longer than the receive's buffer came (UCX dropped it): the connection itself is
    fine. Anyone who saw a connection's tags on the wire can send one, so it ends nothing."""


def link_error(exc: BaseException) -> LinkError:
    """UCXX's exception of a failed request as a :class:`LinkError` (:class:`Truncated` for a
    message that did not fit)."""
    kind = Truncated if "Truncated" in type(exc).__name__ else LinkError
    return kind(f"{type(exc).__name__}: {exc}")


class Endpoint:
    """One UCX connection, used on the engine's thread only: the handshake over its stream,
    then tagged messages (``kind`` 1..255) under the prefixes both sides agreed on."""

    def __init__(self, engine: "Engine", ep: Any, peer: str = "?") -> None:
        self._engine = engine
        self._ep = ep
        self._closed = False
        self.peer = peer  # the peer's address as the connection request gave it ("?": unknown)
        self.handshaking = False  # an accepted connection whose handshake is not over (Listener's count)
        self.recv_prefix: int | None = None  # mine: what I receive
        self.send_prefix: int | None = None  # the peer's
        self._tags: dict[tuple[int, bool], Any] = {}
        self.session: Any = None  # the connection's session.Session, once its handshake made one
        self.lost = asyncio.Event()  # the peer closed, the link failed, or abort()
        self.posted = 0  # requests of stream_send/stream_recv/send/recv that UCX has not completed
        if engine.threaded:  # (no Python called from UCX's progress thread: it holds UCXX's locks meanwhile)
            engine._watched.add(self)  # (asked each fallback pass: check_alive)
        else:
            ep.set_close_callback(self._on_close)

    def _on_close(self, *_: Any) -> None:
        self.lost.set()

    def check_alive(self) -> None:
        """Thread mode: notice a closed or failed connection (the engine's fallback pass asks)."""
        if not self._closed and not self.lost.is_set():
            try:
                alive = self._ep.alive
            except Exception:  # noqa: BLE001 - gone
                alive = False
            if not alive:
                self.lost.set()

    @property
    def closed(self) -> bool:
        return self._closed or self.lost.is_set()

    def use_tags(self, recv_prefix: int, send_prefix: int) -> None:
        self.recv_prefix, self.send_prefix = recv_prefix, send_prefix
        self._tags.clear()

    def _tag(self, kind: int, sending: bool) -> Any:
        """The UCX tag of a message ``kind`` (made once per endpoint and kind)."""
        tag = self._tags.get((kind, sending))
        if tag is None:
            prefix = self.send_prefix if sending else self.recv_prefix
            assert prefix is not None, "tags before the handshake"
            tag = self._tags[(kind, sending)] = self._engine.api.UCXXTag((prefix << 8) | kind)
        return tag

    def send_now(self, array: Any, kind: int, done: Callable[[LinkError | None], None]) -> None:
        """Post a send of ``array`` (a UCXX ``Array``: ``Engine.arr``) and return: ``done``
        runs on the engine's thread when it ended (:meth:`Engine.post`). :class:`LinkError` at
        once when the endpoint is closed or UCX refused the request. The frame path: no task or
        future per message."""
        self._post(lambda: self._ep.tag_send(array, self._tag(kind, True)), done)

    def recv_now(self, array: Any, kind: int, done: Callable[[LinkError | None], None]) -> None:
        """Post a receive into ``array`` (a UCXX ``Array``); as :meth:`send_now`."""
        self._post(lambda: self._ep.tag_recv(array, self._tag(kind, False)), done)

    def _post(self, submit: Callable[[], Any], done: Callable[[LinkError | None], None]) -> None:
        if self._closed or self.lost.is_set():
            raise LinkError("the connection is closed")
        try:
            request = submit()
        except Exception as exc:  # noqa: BLE001 - UCXX raises its own exceptions for a failed endpoint
            raise LinkError(f"{type(exc).__name__}: {exc}") from None
        self._engine.post(request, done)

    async def stream_send(self, data: Any) -> None:
        await self._do(lambda arr: self._ep.stream_send(arr), data)

    async def stream_recv(self, buffer: np.ndarray) -> None:
        await self._do(lambda arr: self._ep.stream_recv(arr), buffer)

    async def send(self, data: Any, kind: int) -> None:
        tag = self._tag(kind, True)
        await self._do(lambda arr: self._ep.tag_send(arr, tag), data)

    async def recv(self, buffer: np.ndarray, kind: int) -> None:
        tag = self._tag(kind, False)
        await self._do(lambda arr: self._ep.tag_recv(arr, tag), buffer)

    async def _do(self, submit: Callable[[Any], Any], data: Any) -> None:
        if self._closed:
            raise LinkError("the endpoint is closed")
        if self.lost.is_set():
            raise LinkError("the connection is closed")
        array = np.frombuffer(data, np.uint8) if not isinstance(data, np.ndarray) else data
        try:
            request = [submit(self._engine.arr(array))]
        except Exception as exc:  # noqa: BLE001 - UCXX raises its own exceptions for a failed endpoint
            raise LinkError(f"{type(exc).__name__}: {exc}") from None
        # (No frame of a request's wait keeps the request: a LinkError's traceback holds the
        # frames it passed, and a request keeps its endpoint, which keeps the listener's port.
        # The buffer is kept until UCX is done with it, also when this wait is cancelled.)
        self.posted += 1
        await self._engine.wait(request.pop(), array, self._completed)

    def _completed(self) -> None:
        self.posted -= 1

    def forget_tags(self) -> None:
        """Receive nothing more on this connection's tags (a peer dropped for what it sent, while
        its goodbye is read): the sweep drops what it goes on sending there at once, not one
        message each ``UNCLAIMED_S``."""
        if self.recv_prefix is not None:
            self._engine.forget_prefix(self.recv_prefix)

    def abort(self) -> None:
        """Close at once, without waiting on UCX here (the engine's thread carries every frame):
        the closer thread closes the UCX endpoint (up to CLOSE_NS), and the requests still posted
        end with an error in the pass after. The peer hears of it as a closed connection."""
        if self._closed:
            return
        self._closed = True
        self.lost.set()
        self.handshaking = False
        prefix = self.recv_prefix
        try:
            if not self._engine.threaded:
                self._ep.remove_close_callback()
        except Exception:  # noqa: BLE001 - already gone
            pass
        # (Not kept here: an accepted endpoint holds UCX's listener, whose port stays bound until
        # the last of them went, however long this object is referred to.)
        ep, self._ep = self._ep, None
        self._engine.close_later(ep)
        if prefix is not None:
            self._engine.forget_prefix(prefix)


class Listener:
    """A listening port: each accepted connection runs ``handler(endpoint)`` as a task. With
    ``unheard_s``, a TCP connection to the port that made no connection request within it (or
    beyond the caps on handshakes) is shut down: UCX would hold it for ever (unheard.py)."""

    def __init__(self, engine: "Engine", port: int, handler: Callable[[Endpoint], Awaitable[None]],
                 host: str | None = None, unheard_s: float | None = None) -> None:
        self._engine = engine
        self._handler = handler
        self.host = host  # the one address connections are accepted to (None: every address)
        self.elsewhere = 0  # connections closed at once: made to another address of the host
        self._closing = False
        self.tasks: set[asyncio.Task[Any]] = set()
        self._handshaking: "weakref.WeakSet[Endpoint]" = weakref.WeakSet()  # accepted, handshake not over
        self.turned_away = 0  # connections closed at once: too many handshakes in all or from their address
        me = weakref.ref(self)

        def accept(conn_request: Any, *_: Any) -> None:  # (where UCX progresses: the loop or its progress thread)
            engine.on_loop_soon(accept_on_loop, conn_request)

        def accept_on_loop(conn_request: Any) -> None:
            listener = me()
            if listener is None or listener._listener is None:
                return
            if listener._closing:  # (came before the close, handed over after it: turned away, not left waiting)
                try:
                    Endpoint(engine, listener._listener.create_endpoint_from_conn_request(conn_request, True)).abort()
                except Exception:  # noqa: BLE001 - the peer left already
                    pass
                return
            peer = client_address(conn_request)
            listener.unheard.hear(peer)
            pending = [e for e in listener._handshaking if e.handshaking and not e.closed]
            crowded = len(pending) >= PENDING_MAX or (
                peer != "?" and sum(1 for e in pending if host_of(e.peer) == host_of(peer)) >= PENDING_PER_ADDRESS)
            try:
                ep = listener._listener.create_endpoint_from_conn_request(conn_request, True)
            except Exception:  # noqa: BLE001 - the peer left already
                return
            endpoint = Endpoint(engine, ep, peer)
            if listener.host is not None:
                to = local_address(ep)
                if host_of(to).strip("[]") != listener.host:  # (UCX listens on every address: not what was asked)
                    listener.elsewhere += 1
                    log.info("eglcuda remote: a connection from %s to %s closed: this relay listens on %s only", peer,
                             to, listener.host)
                    endpoint.abort()
                    return
            if crowded:  # (before the key nothing may grow: no task, no buffer, closed at once)
                listener.turned_away += 1
                if listener.turned_away in (1, 10, 100) or listener.turned_away % 1000 == 0:
                    log.warning("eglcuda remote: %d connection(s) turned away: too many handshakes at once (the last "
                                "from %s)", listener.turned_away, peer)
                endpoint.abort()
                return
            endpoint.handshaking = True
            listener._handshaking.add(endpoint)
            task = asyncio.ensure_future(listener._handler(endpoint))
            listener.tasks.add(task)
            task.add_done_callback(listener.tasks.discard)

        self._listener: Any = None
        self.unheard = Unheard(0, PENDING_PER_ADDRESS, PENDING_MAX)  # (its port once UCX listens)
        try:
            self._listener = engine.api.UCXListener.create(worker=engine.worker, port=port, cb_func=accept)
        except Exception as exc:  # noqa: BLE001 - UCXX's own exception types, said as ours
            if "busy" in str(exc).lower() or "in use" in str(exc).lower():
                raise UsageError(f"port {port} is in use (another relay or program listens on it): choose another "
                                 "port") from None
            raise EglCudaError(f"listening on port {port} failed: {type(exc).__name__}: {exc}") from None
        self.port = self.unheard.port = int(self._listener.port)
        self._unheard_s = unheard_s
        if unheard_s is not None:
            engine.loop.call_later(LOOK_S, self._look)

    def _look(self) -> None:
        if self._closing or self._listener is None or self._unheard_s is None:
            return
        try:
            shut = self.unheard.look(self._unheard_s)
        except Exception:  # noqa: BLE001 - the look is a guard: it never ends the listener
            log.exception("eglcuda remote: looking for unheard connections failed")
            shut = []
        total = self.unheard.shut  # (logged at the 1st, 10th, 100th and every 1000th, as those turned away)
        if any(n in (1, 10, 100) or n % 1000 == 0 for n in range(total - len(shut) + 1, total + 1)):
            log.warning("eglcuda remote: %d connection(s) to port %d shut down: no connection request in %.3g s "
                        "or too many at once (the last from %s)", total, self.port, self._unheard_s,
                        shut[-1])
        self._engine.loop.call_later(LOOK_S, self._look)

    def close(self) -> None:
        """Stop listening (the connections accepted stay, but for handshakes still under way,
        which end; those whose request has not come are reset); on the engine's thread.
        Connection requests already handed to the loop are turned away first."""
        self._closing = True
        task = self._engine.loop.create_task(self._close())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _close(self) -> None:
        # Handshakes under way end before the listener goes, as those past their time do: their
        # receives are posted (drop).
        await self.drop([e for e in self._handshaking if e.handshaking])
        self._release()

    async def drop(self, endpoints: list[Endpoint]) -> None:
        """End accepted ``endpoints`` whose peers are still there and may have receives posted on
        them (a handshake past its time, a remote subscriber that does not answer a closing
        relay): each connection is reset first, as if its peer died, and each endpoint closed
        once UCX failed it or ended what was posted on it (up to ENDPOINTS_END_S): closed with a
        receive posted, it would keep the listener's port bound for good (Unheard.reset)."""
        live = [e for e in endpoints if not e.closed]
        if live:
            try:
                self.unheard.reset({e.peer for e in live})
            except Exception:  # noqa: BLE001 - a guard: the endpoints are closed regardless
                log.exception("eglcuda remote: resetting connections failed")
            until = time.monotonic() + ENDPOINTS_END_S
            while any(e.posted and not e.closed for e in live) and time.monotonic() < until:
                await asyncio.sleep(0.02)
        for endpoint in endpoints:
            endpoint.abort()

    def _release(self) -> None:
        listener, self._listener = self._listener, None
        if listener is None:
            return
        if exiting():
            _keep_for_good(listener)
            return
        self._engine.keep_callback_data(listener)
        # (UCXX's listener ends with its last reference: on the closer thread, after the endpoints
        # it accepted that are closing there, once its port is sealed (Unheard.seal). Let go of
        # here while the closer let go of one of them, the two UCXX destructors at once crashed the
        # process now and then.)
        self._engine.close_later(listener, before=self.unheard.seal)
        del listener


class Engine:
    """The process's UCX worker and the loop that drives it (see the module's docstring)."""

    def __init__(self) -> None:
        require()
        self.threaded = progress_mode() == "thread"
        self.loop: asyncio.AbstractEventLoop = (_NotifiedLoop(_NotifiedSelector()) if self.threaded
                                                else asyncio.new_event_loop())
        self.api: Any = None
        self.arr: Any = None
        self.worker: Any = None
        self.context: Any = None
        self._pending: dict[int, tuple[Any, Callable[[LinkError | None], None]]] = {}
        self._scheduled = False
        self._in_pass = False  # (a request posted meanwhile is progressed by the pass itself)
        self._posted = False
        self._prefixes: dict[int, tuple[int, ...]] = {}  # a connection's receive prefix: the kinds it receives
        self._pid = os.getpid()
        self._watched: "weakref.WeakSet[Endpoint]" = weakref.WeakSet()  # thread mode: asked whether alive
        self._posts = 0
        self._callback_data: list[dict[str, Any]] = []  # closed listeners' (keep_callback_data)
        self._unclaimed: tuple[int, float] | None = None  # (tag, since): the first unmatched message, ours
        self._scratch: Any = None  # where dropped messages are received (_sweep)
        self.swept = 0  # tagged messages dropped unread
        # UCXX's endpoint close waits for UCX (up to CLOSE_NS): on a thread of its own, not the
        # engine's (UCXX's non-blocking close crashed under many connections closed at once).
        self._to_close: "queue.SimpleQueue[Any]" = queue.SimpleQueue()
        self._closer: threading.Thread | None = None
        self._stopping = False
        self.thread = threading.Thread(target=self._main, name="eglcuda-ucx", daemon=True)
        self._started: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.thread.start()
        try:
            self._started.result(30)
        except EglCudaError:
            raise
        except Exception as exc:  # noqa: BLE001 - UCXX's own types (no usable transport or device), said as ours
            raise EglCudaError(f"UCX could not start: {type(exc).__name__}: {exc} (UCX_TLS and UCX_NET_DEVICES name "
                               "the transports and network devices it may use)") from None

    # ---- the engine's thread ------------------------------------------------------------------
    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            api = importlib.import_module("ucxx._lib.libucxx")
            self.arr = importlib.import_module("ucxx._lib.arr").Array
            self._scratch = self.arr(np.zeros(256, np.uint8))
            self.api = api
            self.context = api.UCXContext(feature_flags=(api.Feature.TAG, api.Feature.STREAM, api.Feature.WAKEUP))
            if self.threaded:
                self.worker = api.UCXWorker(self.context, enable_delayed_submission=True, enable_python_future=True)
                self.worker.populate_python_futures_pool()  # (UCXX's futures are made for this thread's loop)
                self.worker.start_progress_thread(polling_mode=False, epoll_timeout=PROGRESS_EPOLL_MS)
                assert isinstance(self.loop, _NotifiedLoop)
                self.loop.listen(self.worker)
            else:
                self.worker = api.UCXWorker(self.context)
                self.worker.init_blocking_progress_mode()
                self.loop.add_reader(self.worker.epoll_file_descriptor, self._pass)
        except BaseException as exc:  # noqa: BLE001 - said to the thread that started the engine
            self._started.set_exception(exc)
            self.loop.close()
            return
        self._started.set_result(None)
        self.loop.call_soon(self._fallback)
        try:
            self.loop.run_forever()
        finally:
            self._stop_on_thread()

    def _stop_on_thread(self) -> None:
        tasks = asyncio.all_tasks(self.loop)
        for task in tasks:
            task.cancel()
        if tasks:  # (let them end: a task destroyed while pending is a warning at exit)
            try:
                self.loop.run_until_complete(asyncio.wait(tasks, timeout=1.0))
            except Exception:  # noqa: BLE001 - exit goes on
                pass
        self._stopping = True
        if self._closer is not None:
            self._to_close.put(None)
            self._closer.join(1.0)
        try:
            if self.threaded:
                assert isinstance(self.loop, _NotifiedLoop)
                self.loop.listen(None)
                self.worker.stop_progress_thread()  # (before exit: it may call into Python)
                _stop_notifier(self.worker)
            else:
                self.loop.remove_reader(self.worker.epoll_file_descriptor)
                self.worker.progress()
        except Exception:  # noqa: BLE001 - exit goes on
            pass
        if self.threaded:
            for request, _ in self._pending.values():
                _consume_future(request)
        self._pending.clear()
        self.loop.close()  # (the worker and the context go with the process: UCXX's teardown order is its own)

    def _fallback(self) -> None:
        self.loop.call_later(FALLBACK_S, self._fallback)  # (first: a failing pass must not end the fallback)
        for endpoint in list(self._watched):
            endpoint.check_alive()
        self._sweep()
        self._pass()

    def _sweep(self) -> None:
        """Drop the tagged messages nobody will receive: UCX keeps an unmatched message in its
        unexpected queue for the worker's life, so a peer without the key (or any peer, on tags
        that are no connection's) could grow this process's memory for good. A message on one of
        our connections' tags, of a kind that connection receives, stays (its receive is being
        posted) unless it is still the first unmatched one UNCLAIMED_S later; one of another kind
        (a relay's own FRAME tag, say: anyone who saw it on the wire can send there) goes at once.
        Each is received into a small scratch buffer (a longer one ends truncated, which frees
        it too)."""
        api, worker = self.api, self.worker
        everything = api.UCXXTagMask(0)
        for round_ in range(SWEEP_MAX + 1):
            if round_ == SWEEP_MAX:  # (more waiting: go on after the loop's other work, not at the next fallback)
                self.loop.call_soon(self._sweep)
                return
            try:
                probe = worker.tag_probe(api.UCXXTag(0), everything, False)
            except Exception:  # noqa: BLE001 - a UCX refusal: try again next pass
                return
            if not probe.matched:
                self._unclaimed = None
                return
            tag = int(probe.sender_tag.value)
            if (tag & 0xFF) in self._prefixes.get(tag >> 8, ()):
                now = time.monotonic()
                first = self._unclaimed
                if first is None or first[0] != tag:
                    self._unclaimed = (tag, now)
                    return
                if now - first[1] < UNCLAIMED_S:
                    return
            # (the first unmatched message changes: a later one on a claimed tag starts its own
            # UNCLAIMED_S, however long a flood of others kept the queue from emptying)
            self._unclaimed = None
            try:
                taken = worker.tag_probe(api.UCXXTag(tag), api.UCXXTagMaskFull, True)
                if not taken.matched:
                    continue
                request = worker.tag_recv_with_handle(self._scratch, taken)
            except Exception:  # noqa: BLE001
                return
            self.swept += 1
            self.post(request, _ignore)

    def keep_callback_data(self, listener: Any) -> None:
        """Keep, for the engine's life, the data UCXX's C++ listener of ``listener`` (a UCXX
        ``UCXListener`` about to be let go of) calls its connection-request callback with. That
        data belongs to the Python object, but the C++ listener outlives it while an endpoint it
        accepted is open (a slow close, a frozen peer) and goes on taking requests: its callback
        then read freed memory ("KeyError: 'cb_func'" on stderr, or a crash). Kept, a late
        request reaches :class:`Listener`'s ``accept``, which finds the listener closed."""
        try:
            # (UCXX keeps it in a C attribute of its own: reached as what the object refers to)
            data = [d for d in gc.get_referents(listener) if isinstance(d, dict) and "cb_func" in d]
        except Exception:  # noqa: BLE001 - another UCXX's layout: nothing to keep
            data = []
        self._callback_data.extend(data)

    def close_later(self, ep: Any, before: Callable[[], None] | None = None) -> None:
        """Close UCXX endpoint ``ep`` on the closer thread (started on first use); a pass follows.
        A UCXX listener is let go of there too: UCXX's objects end on one thread, in order.
        ``before`` runs there first."""
        if self._closer is None:
            self._closer = threading.Thread(target=self._close_endpoints, name="eglcuda-ucx-close", daemon=True)
            self._closer.start()
        self._to_close.put((ep, before))

    def _close_endpoints(self) -> None:
        asyncio.set_event_loop(self.loop)  # (a UCXX future made here, the pool empty, is for the engine's loop)
        while True:
            item = self._to_close.get()
            if item is None:
                return
            ep, before = item
            del item
            if before is not None:
                try:
                    before()
                except Exception:  # noqa: BLE001 - the close goes on
                    log.exception("eglcuda remote: preparing a close failed")
            close = getattr(ep, "close_blocking", None)  # (None: a listener, only let go of)
            if close is not None:
                try:
                    close(period=CLOSE_NS, max_attempts=1)
                except Exception:  # noqa: BLE001 - already gone
                    pass
            del ep, close, before  # (UCXX's endpoint or listener ends here, off the engine's thread)
            if self._to_close.empty():
                self.on_loop_soon(self.schedule)  # (the cancelled requests complete in the next pass)

    def schedule(self) -> None:
        """A progress pass soon (after a UCX call on the engine's thread)."""
        if not self._scheduled:
            self._scheduled = True
            self.loop.call_soon(self._pass)

    def _pass(self) -> None:
        """Loop mode: progress until idle, complete the requests that finished, arm (or go
        again): up to PASS_ROUNDS rounds here before the loop's other work, so that the events
        of one frame (its TCP segments, the next send a completion posts) cost no loop iteration
        each. Thread mode (the fallback only: completions come by their futures): complete the
        requests that finished and whose notice did not come."""
        self._scheduled = False
        if self.threaded:
            self.worker.populate_python_futures_pool()
            self._complete()
            return
        self._in_pass = True
        worker = self.worker
        try:
            for _ in range(PASS_ROUNDS):
                self._posted = False
                worker.progress()
                self._complete()
                # (a request posted in this round is progressed in the next before the worker is armed)
                if not self._posted and worker.arm():
                    return
        finally:
            self._in_pass = False
        self.schedule()  # (UCX has events still: another pass after the loop's other work)

    def _complete(self) -> None:
        """Call the callbacks of the posted requests that finished (loop mode: each pass; thread
        mode: the fallback pass, for a notice that never came)."""
        pending = self._pending
        if not pending:
            return
        finished = [key for key, (request, _) in pending.items() if request.completed]
        for key in finished:
            request, done = pending.pop(key)
            try:
                request.check_error()
            except Exception as exc:  # noqa: BLE001 - UCXX's errors, said as one kind
                error: LinkError | None = link_error(exc)
            else:
                error = None
            if self.threaded:
                _consume_future(request)
            _call(done, error)

    def _noticed(self, future: Any) -> None:
        """Thread mode: the future of a posted request was set (by UCXX's request notifier, run
        on this thread by the loop's selector): call its callback, in the order they finished."""
        entry = self._pending.pop(id(future), None)
        if entry is None:  # (completed by the fallback pass already)
            return
        if future.cancelled():
            error: LinkError | None = LinkError("the request was cancelled")
        else:
            exc = future.exception()
            error = None if exc is None else link_error(exc)
            del exc  # (UCXX's exception holds frames that hold the request)
        _call(entry[1], error)

    async def wait(self, request: Any, buffer: Any = None, completed: Callable[[], None] | None = None) -> None:
        """Until ``request`` completed (:class:`LinkError` if it failed), without spinning.
        ``buffer`` (what UCX reads or writes) is kept until the request completed, not only while
        this waits: a wait cancelled (a time limit, an endpoint aborted) would otherwise free it
        under a send that UCX still reads or a receive that it still writes. ``completed`` is
        called once the request completed, also after a cancelled wait."""
        if request.completed:
            if completed is not None:
                completed()
            if self.threaded:
                _consume_future(request)
            try:
                request.check_error()
            except Exception as exc:  # noqa: BLE001
                raise link_error(exc) from None
            return
        future = self.loop.create_future()

        def done(error: LinkError | None, buffer: Any = buffer) -> None:
            if completed is not None:
                completed()
            if future.done():  # (its waiter was cancelled)
                return
            if error is None:
                future.set_result(None)
            else:
                future.set_exception(error)

        self.post(request, done)
        del request  # (see Endpoint._do)
        await future

    def post(self, request: Any, done: Callable[[LinkError | None], None]) -> None:
        """Call ``done(None)``, or ``done(LinkError)`` if it failed, on this thread once
        ``request`` completed (never from inside this call)."""
        if self.threaded:
            future = request.future
            if future is None:  # (none from UCXX: the fallback pass finds it completed)
                self._pending[id(request)] = (request, done)
                return
            self._pending[id(future)] = (request, done)
            future.add_done_callback(self._noticed)  # (set on this thread: the loop's selector runs UCXX's notifier)
            self._posts += 1
            if self._posts % FUTURES_REFILL == 0:  # (many posts in one step, e.g. a frame to many remotes)
                self.worker.populate_python_futures_pool()
            return
        self._pending[id(request)] = (request, done)
        self._posted = True
        if not self._in_pass:
            self.schedule()

    def on_loop_soon(self, function: Callable[..., Any], *args: Any) -> None:
        """``function(*args)`` on the engine's thread: now when called there, else soon (UCX's
        progress thread calls back in thread mode); nothing once the loop closed (exit)."""
        if threading.current_thread() is self.thread:
            function(*args)
            return
        try:
            self.loop.call_soon_threadsafe(function, *args)
        except RuntimeError:  # (the loop closed)
            pass

    def new_prefix(self, kinds: tuple[int, ...] = KINDS) -> int:
        """A tag prefix for what one connection receives (messages of ``kinds``): random, and
        unique in this process."""
        while True:
            prefix = secrets.randbits(PREFIX_BITS)
            if prefix and prefix not in self._prefixes:
                self._prefixes[prefix] = kinds
                return prefix

    def claim_prefix(self, prefix: int, kinds: tuple[int, ...] = KINDS) -> bool:
        """Take ``prefix`` (one a session derived) for one connection's receives of messages of
        ``kinds`` (the sweep drops any other kind on it at once); False when another connection
        of this process has it."""
        if not prefix or prefix in self._prefixes:
            return False
        self._prefixes[prefix] = kinds
        return True

    def forget_prefix(self, prefix: int) -> None:
        self._prefixes.pop(prefix, None)

    def connect(self, host: str, port: int) -> Endpoint:
        """An endpoint to ``host:port`` (it connects in the background: its first request says
        whether it could)."""
        ep = self.api.UCXEndpoint.create(self.worker, host, port, True)
        self.schedule()
        return Endpoint(self, ep)

    def listen(self, port: int, handler: Callable[[Endpoint], Awaitable[None]], host: str | None = None,
               unheard_s: float | None = None) -> Listener:
        """Accept connections on ``port``: UCX listens on every address of the host; those made
        to another address than ``host`` (an IP; None: any) are closed at once; with
        ``unheard_s``, TCP connections that make no request in it too (:class:`Listener`)."""
        listener = Listener(self, port, handler, host, unheard_s)
        self.schedule()
        return listener

    # ---- other threads ------------------------------------------------------------------------
    def stop(self) -> None:
        if self.thread.is_alive():
            try:
                self.loop.call_soon_threadsafe(self.loop.stop)
            except RuntimeError:  # (closed already)
                pass
            self.thread.join(5)


def _call(done: Callable[[LinkError | None], None], error: LinkError | None) -> None:
    try:
        done(error)
    except Exception:  # noqa: BLE001 - one connection's bug must not stop the engine
        log.exception("eglcuda remote: a completion callback failed")


class _NotifiedSelector(selectors.DefaultSelector):
    """Thread mode's selector: the engine's loop sleeps in UCXX's request notifier instead of
    epoll, so a request UCX's progress thread completed wakes the loop itself (no thread between)
    and its future is set here, on the loop's thread (its callback, :meth:`Engine._noticed`, runs
    in the same loop iteration). Descriptors (the loop's self-pipe) are looked at without waiting
    before and after; another thread wakes the sleep through :class:`_NotifiedLoop`."""

    worker: Any = None  # the engine's worker, once made (until then: a plain selector)
    ready: Any = None  # UCXX's "some requests finished" answer of a wait

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        worker = self.worker
        if worker is None:
            return super().select(timeout)
        ready = super().select(0)
        if ready or (timeout is not None and timeout <= 0):
            wait_ns = 1  # (only whether some finished: a request done while the loop was busy is not left waiting)
        else:
            wait_ns = NOTIFY_WAIT_NS if timeout is None else max(1, min(NOTIFY_WAIT_NS, int(timeout * 1e9)))
        try:
            if worker.wait_request_notifier(period_ns=wait_ns) == self.ready:
                worker.run_request_notifier()  # (sets the futures: their callbacks are queued on this loop)
        except Exception:  # noqa: BLE001 - the fallback pass completes requests still (each FALLBACK_S)
            log.exception("eglcuda remote: UCXX's request notifier failed; the engine's loop waits in epoll now")
            self.worker = None
            return super().select(timeout if timeout is None else min(timeout, FALLBACK_S))
        if not ready and wait_ns > 1:
            ready = super().select(0)
        return ready


class _NotifiedLoop(asyncio.SelectorEventLoop):
    """Thread mode's event loop: work handed over from another thread (``call_soon_threadsafe``)
    also wakes a loop asleep in UCXX's request notifier (:class:`_NotifiedSelector`)."""

    def __init__(self, selector: _NotifiedSelector) -> None:
        super().__init__(selector)
        self._notified = selector
        self._wake: Callable[[], None] | None = None

    def listen(self, worker: Any) -> None:
        """Sleep in ``worker``'s request notifier from now on (None: in epoll again)."""
        if worker is not None:
            self._notified.ready = importlib.import_module("ucxx._lib.libucxx").PythonRequestNotifierWaitState.Ready
        self._notified.worker = worker
        # UCXX's "stop" of its notifier ends the one wait under way or the next (then waits go on as before).
        self._wake = None if worker is None else worker.stop_request_notifier_thread

    def _write_to_self(self) -> None:  # (asyncio's hook of call_soon_threadsafe)
        super()._write_to_self()  # type: ignore[misc]
        wake = self._wake
        if wake is not None:
            wake()


def _stop_notifier(worker: Any) -> None:
    """Leave UCXX's request notifier stopped, as its worker's destructor (at interpreter exit)
    expects: the loop's wakes left it "running", and the destructor then printed a UCXX WARN line
    to stderr. Completions still waiting are taken first (each wait takes one "ready" or a stop)."""
    timeout = importlib.import_module("ucxx._lib.libucxx").PythonRequestNotifierWaitState.Timeout
    for _ in range(8):
        if worker.wait_request_notifier(period_ns=1) == timeout:
            break
        worker.run_request_notifier()
    worker.stop_request_notifier_thread()


def _keep_for_good(listener: Any) -> None:
    """Never let go of UCXX listener ``listener``: at exit, the process ends with it. UCX's TCP
    connection manager (1.21) gives a connection it accepted a pointer to the listener and reads
    it when that connection's request arrives; a listener destroyed in between leaves the pointer
    dangling, and UCX's async thread crashed the process on it (a client connecting while this
    process exits: one exit in about a hundred with a thread of it joining in a loop). After the
    exit hooks nothing progresses the worker, so a request arriving then is never handed on."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(listener))  # (module teardown at finalization drops everything else)


def _ignore(error: LinkError | None) -> None:
    """The completion of a dropped message's receive (truncated or not: nothing to do)."""


class _SockaddrStorage(ctypes.Structure):
    _fields_ = [("family", ctypes.c_ushort), ("data", ctypes.c_ubyte * 126)]


class _ConnRequestAttr(ctypes.Structure):  # ucp_conn_request_attr_t (ucp.h)
    _fields_ = [("field_mask", ctypes.c_uint64), ("client_address", _SockaddrStorage), ("client_id", ctypes.c_uint64)]


class _EpAttr(ctypes.Structure):  # ucp_ep_attr_t (ucp.h), its first fields (UCP_ENTITY_NAME_MAX is 32)
    _fields_ = [("field_mask", ctypes.c_uint64), ("name", ctypes.c_char * 32), ("local", _SockaddrStorage),
                ("remote", _SockaddrStorage), ("rest", ctypes.c_ubyte * 256)]


_ucp: Any = None


def _libucp() -> Any:
    """The libucp this process loaded (through UCXX), with the two queries eglcuda makes."""
    global _ucp
    if _ucp is None:
        path = None
        try:
            with open("/proc/self/maps") as maps:
                for line in maps:
                    if "libucp.so" in line:
                        path = line.split()[-1]
                        break
        except OSError:
            pass
        library = ctypes.CDLL(path or ctypes.util.find_library("ucp") or "libucp.so.0")
        library.ucp_conn_request_query.restype = ctypes.c_int
        library.ucp_conn_request_query.argtypes = [ctypes.c_void_p, ctypes.POINTER(_ConnRequestAttr)]
        library.ucp_ep_query.restype = ctypes.c_int
        library.ucp_ep_query.argtypes = [ctypes.c_void_p, ctypes.POINTER(_EpAttr)]
        _ucp = library
    return _ucp


def _address_of(storage: _SockaddrStorage) -> str:
    raw = bytes(storage.data)
    port = int.from_bytes(raw[0:2], "big")
    if storage.family == 2:  # AF_INET: port, 4 address bytes
        return f"{ipaddress.IPv4Address(raw[2:6])}:{port}"
    if storage.family == 10:  # AF_INET6: port, flowinfo, 16 address bytes
        return f"[{ipaddress.IPv6Address(raw[6:22])}]:{port}"
    return "?"


def client_address(conn_request: Any) -> str:
    """``HOST:PORT`` of the peer of a connection request, as the connection says it (not as the
    peer says it); ``"?"`` when UCX cannot tell."""
    try:
        attr = _ConnRequestAttr()
        attr.field_mask = 1  # UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR
        if _libucp().ucp_conn_request_query(int(conn_request), ctypes.byref(attr)) == 0:
            return _address_of(attr.client_address)
    except Exception:  # noqa: BLE001 - the address is for listings and limits only
        pass
    return "?"


def local_address(ep: Any) -> str:
    """``HOST:PORT`` of this side of UCXX endpoint ``ep`` (the address a peer connected to);
    ``"?"`` when UCX cannot tell."""
    try:
        attr = _EpAttr()
        attr.field_mask = 2  # UCP_EP_ATTR_FIELD_LOCAL_SOCKADDR
        if _libucp().ucp_ep_query(int(ep.handle), ctypes.byref(attr)) == 0:
            return _address_of(attr.local)
    except Exception:  # noqa: BLE001 - then the connection is judged by nothing else
        pass
    return "?"


def check_port(port: int) -> None:
    """:class:`UsageError` when TCP ``port`` is taken on this host (a listener, as UCX's own would
    be: bound to every address, with SO_REUSEADDR), said before UCX tries (and logs its own
    error line); port 0 is always free."""
    import errno
    import socket

    if not port:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("0.0.0.0", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise UsageError(f"port {port} is in use (another relay or program listens on it): choose another "
                                 "port") from None
            if exc.errno == errno.EACCES:  # (UCX would log two lines of its own, then fail with EIO)
                first = _first_unprivileged_port()
                if port < first:
                    raise UsageError(f"port {port} is a privileged port, which this process may not listen on "
                                     f"({exc.strerror}; it takes CAP_NET_BIND_SERVICE): choose a port of {first} "
                                     "or more") from None
                raise UsageError(f"this process may not listen on port {port} ({exc.strerror}: a security "
                                 "policy of this host refuses it): choose another port") from None


def _first_unprivileged_port() -> int:
    """The lowest port a process without CAP_NET_BIND_SERVICE may listen on (Linux's
    ``net.ipv4.ip_unprivileged_port_start``, 1024 by default)."""
    try:
        with open("/proc/sys/net/ipv4/ip_unprivileged_port_start") as setting:
            return int(setting.read())
    except (OSError, ValueError):
        return 1024


def host_ip(host: str) -> str | None:
    """The address a relay told to listen on ``host`` accepts connections to (None: every
    address: 0.0.0.0, ::, *); :class:`UsageError` when ``host`` is no IPv4 address of this host.
    UCXX's listener binds 0.0.0.0 (IPv4 only): a relay told an IPv6 address would take no
    connection at all, and a name is taken by its IPv4 address."""
    import socket

    if host in ("", "*", "0.0.0.0", "::"):
        return None
    try:
        literal: ipaddress.IPv4Address | ipaddress.IPv6Address | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None and literal.version == 6:
        raise UsageError(f"listen: {host!r} is an IPv6 address, and a relay takes IPv4 connections only (UCXX's "
                         "listener binds 0.0.0.0): listen on an IPv4 address of this host, or 0.0.0.0 for all")
    try:
        infos = socket.getaddrinfo(host, None, family=socket.AF_INET, type=socket.SOCK_DGRAM)
    except OSError as exc:
        raise UsageError(f"listen: {host!r} is no IPv4 address ({exc}); a relay takes IPv4 connections only") from None
    for family, kind, proto, _, address in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind((address[0], 0))  # (only an address of this host can be bound)
        except OSError:
            continue
        found = ipaddress.ip_address(address[0])
        if found.is_unspecified:  # ("0", "0.0": other spellings of 0.0.0.0, every address)
            return None
        return str(found)
    raise UsageError(f"listen: {host!r} is not an address of this host: a relay can listen on its own addresses "
                     "only (or 0.0.0.0 for all)")


def _consume_future(request: Any) -> None:
    """Mark thread mode's unawaited UCXX future of a request seen, or cancel it if not set yet (UCXX
    then leaves it): an error must never be logged as "never retrieved" when it is collected."""
    try:
        future = request.future
        if future is None or future.cancelled():
            return
        if future.done():
            future.exception()
        else:
            future.cancel()
    except Exception:  # noqa: BLE001 - only bookkeeping
        pass


def check_fork() -> None:
    """:class:`UsageError` in a forked child of a process whose engine started (UCX, like CUDA,
    does not survive fork)."""
    current = _engine
    if current is not None and current._pid != os.getpid():
        raise UsageError("this process was forked from one that used remote topics: UCX cannot be used across "
                         "fork(); make relays and remote subscribers in a fresh process (spawn)")


def engine() -> Engine:
    """The process's engine (started by the first call); :class:`UsageError` in a forked child
    of a process that started one."""
    global _engine
    require()
    with _lock:
        check_fork()
        if _engine is None:
            _engine = Engine()
        return _engine


def acquire() -> asyncio.AbstractEventLoop:
    """The engine's loop (starting the engine); pair with :func:`release`."""
    return engine().loop


def release() -> None:
    """One user less (the engine stays: see the module's docstring)."""


def track(obj: Any, turn: int = 0) -> None:
    """Close ``obj`` (a relay or remote subscriber) at exit, before the engine stops; those of a
    lower ``turn`` first (a relay goes after this process's remote subscribers, which would
    otherwise keep its close waiting for them to take its goodbye, 1.5 s)."""
    _open[obj] = turn


def untrack(obj: Any) -> None:
    _open.pop(obj, None)


def _at_exit() -> None:
    global _engine
    mark_exiting()  # (a daemon thread of the program inside a remote subscriber's call stays: _lifecycle)
    for obj in sorted(list(_open), key=lambda obj: _open.get(obj, 0)):
        try:
            obj.close()
        except Exception:  # noqa: BLE001 - exit goes on
            pass
    with _lock:
        current, _engine = _engine, None
    if current is not None and current._pid == os.getpid():
        current.stop()


atexit.register(_at_exit)  # (at import: runs after hooks registered later, and before none that need the engine)


def run(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
    """Run ``coro`` on the engine's loop from another thread, waiting up to ``timeout`` seconds
    (:class:`Timeout` then, and the coroutine is cancelled)."""
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise Timeout(f"no answer within {timeout:.3g} s") from None


def on_loop() -> bool:
    current = _engine
    return current is not None and threading.current_thread() is current.thread
