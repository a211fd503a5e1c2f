"""UCX through UCXX: the one asyncio loop (a daemon thread, ``eglcuda-ucx``) that every relay and
remote subscriber of this process runs its connections on, and the one-line install hint when
ucxx is missing.

The loop and UCXX's context start with the first relay or remote subscriber and stay until the
interpreter exits (then open relays and remote subscribers are closed first, and the loop
stops). Not per user: UCXX's reset() lets go of the context but not of its worker's descriptors
(measured with ucxx 0.52: six per reset), so a process that joins and leaves often would leak;
one context for the process's life costs one thread and a fixed few descriptors, and nothing
grows however often subscribers come and go."""
from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import importlib
import os
import threading
import weakref
from typing import Any, Coroutine, TypeVar

from ..errors import Timeout, Unsupported

T = TypeVar("T")
INSTALL = "pip install 'eglcuda[remote-cu12]' (CUDA 12) or 'eglcuda[remote-cu13]' (CUDA 13)"

_lock = threading.Lock()
_users = 0
_loop: asyncio.AbstractEventLoop | None = None
_thread: threading.Thread | None = None
_ucxx: Any = None
_open: "weakref.WeakSet[Any]" = weakref.WeakSet()  # relays and remote subscribers to close at exit


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
TUNING = {"UCX_TCP_TX_SEG_SIZE": "256K", "UCX_TCP_RX_SEG_SIZE": "1M"}


def require() -> Any:
    """The ucxx module, or :class:`Unsupported` with the line to install it."""
    global _ucxx
    if _ucxx is None:
        for name, value in TUNING.items():  # (read when UCXX makes its context, after this)
            os.environ.setdefault(name, value)
        missing = ucxx_missing()
        if missing is not None:
            raise Unsupported("ucxx", hint=INSTALL)
        _ucxx = importlib.import_module("ucxx")
    return _ucxx


def acquire() -> asyncio.AbstractEventLoop:
    """Start (or share) the UCX loop; pair with :func:`release`."""
    global _users, _loop, _thread
    ucxx = require()
    with _lock:
        if _loop is None:
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="eglcuda-ucx", daemon=True)
            thread.start()
            # (blocking progress: UCX's descriptor in the asyncio loop, no polling thread burning a core)
            mode = os.environ.get("UCXPY_PROGRESS_MODE", "blocking")
            try:
                asyncio.run_coroutine_threadsafe(_init(ucxx, mode), loop).result(30)
            except BaseException:
                loop.call_soon_threadsafe(loop.stop)
                thread.join()
                loop.close()
                raise
            _loop, _thread = loop, thread
        _users += 1
        return _loop


async def _init(ucxx: Any, mode: str) -> None:
    ucxx.init(progress_mode=mode)


def release() -> None:
    """One user less (the loop stays: see the module's docstring)."""
    global _users
    with _lock:
        _users -= 1


def track(obj: Any) -> None:
    """Close ``obj`` (a relay or remote subscriber) at exit, before the loop stops."""
    _open.add(obj)


def untrack(obj: Any) -> None:
    _open.discard(obj)


def _at_exit() -> None:
    global _loop, _thread
    for obj in list(_open):
        try:
            obj.close()
        except Exception:  # noqa: BLE001 - exit goes on
            pass
    with _lock:
        loop, thread = _loop, _thread
        _loop = _thread = None
    if loop is None:
        return
    loop.call_soon_threadsafe(loop.stop)
    if thread is not None:
        thread.join(5)


atexit.register(_at_exit)  # (at import: runs after hooks registered later, and before none that need the loop)


def run(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
    """Run ``coro`` on the UCX loop from another thread, waiting up to ``timeout`` seconds
    (:class:`Timeout` then, and the coroutine is cancelled)."""
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result(timeout)
    except concurrent.futures.TimeoutError:
        future.cancel()
        raise Timeout(f"no answer within {timeout:.3g} s") from None


def on_loop() -> bool:
    return _thread is not None and threading.current_thread() is _thread
