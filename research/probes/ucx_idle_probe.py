"""What a UCXX connection costs while it waits: one process, a listener and an endpoint to it over
TCP loopback, one receive posted and no traffic for --seconds; prints the process's CPU use and
how many 0.5 ms sleeps another Python thread of the process fit in meanwhile (a GIL check).

- ``core``: the core API (``UCXWorker.init_blocking_progress_mode``) and one thread that loops
  ``progress_worker_event(100)`` (sleeps in epoll);
- ``asyncio-blocking`` / ``asyncio-thread`` / ``asyncio-polling``: the asyncio API on an event
  loop in its own thread (as eglcuda/remote/_ucx.py runs it), ``ucxx.init(progress_mode=...)``,
  an ``await ep.recv(...)`` pending.

Measured 2026-11-28 on a 2-core CPU machine (shared, load 2-7): core 2-4 % of a core;
asyncio blocking 55-99 %, thread 37-101 % (as much as the machine lets it: UCXX awaits a request
with ``while not completed: await asyncio.sleep(0)``). The other thread's 0.5 ms sleeps: 3,300-
3,500 in 2 s beside the core API, 1,900-3,400 beside asyncio (fewer when the machine is loaded).

    python research/probes/ucx_idle_probe.py MODE [--seconds 2]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import threading
import time

for key, value in {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n"}.items():
    os.environ.setdefault(key, value)

import numpy as np  # noqa: E402


def core() -> threading.Event:
    import ucxx._lib.libucxx as api
    from ucxx._lib.arr import Array

    context = api.UCXContext(feature_flags=(api.Feature.TAG, api.Feature.WAKEUP))
    worker = api.UCXWorker(context)
    worker.init_blocking_progress_mode()
    accepted: dict = {}
    listener = api.UCXListener.create(worker=worker, port=0, cb_func=lambda request: accepted.setdefault(
        "ep", listener.create_endpoint_from_conn_request(request, True)))
    endpoint = api.UCXEndpoint.create(worker, "127.0.0.1", listener.port, True)
    while "ep" not in accepted:
        worker.progress_worker_event(100)
    buffer = Array(np.empty(16, np.uint8))
    request = accepted["ep"].tag_recv(buffer, tag=api.UCXXTag(1))  # never completes: nothing is sent
    stop = threading.Event()
    alive = (endpoint, listener, context, buffer, request)  # kept by the pump thread's closure

    def pump() -> None:
        while not stop.is_set():
            worker.progress_worker_event(100)
        assert alive

    threading.Thread(target=pump, daemon=True).start()
    return stop


def asyncio_mode(mode: str) -> threading.Event:
    import ucxx

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def setup():
        ucxx.init(progress_mode=mode)

        async def serve(ep) -> None:
            await ep.recv(np.empty(16, np.uint8))

        listener = ucxx.create_listener(serve)
        endpoint = await ucxx.create_endpoint("127.0.0.1", listener.port)
        return listener, endpoint

    _alive.append(asyncio.run_coroutine_threadsafe(setup(), loop).result(10))  # dropped, the receive would go
    return threading.Event()


_alive: list = []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["core", "asyncio-blocking", "asyncio-thread", "asyncio-polling"])
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    stop = core() if args.mode == "core" else asyncio_mode(args.mode.split("-", 1)[1])
    time.sleep(0.3)
    started, cpu, sleeps = time.monotonic(), time.process_time(), 0
    while time.monotonic() - started < args.seconds:
        time.sleep(0.0005)
        sleeps += 1
    span = time.monotonic() - started
    print(f"{args.mode}: one receive pending, no traffic: CPU {100 * (time.process_time() - cpu) / span:.0f} % of a "
          f"core; another thread did {sleeps} sleeps of 0.5 ms in {span:.1f} s", flush=True)
    stop.set()
    os._exit(0)  # (UCXX's teardown of a pending receive is not what is measured)


if __name__ == "__main__":
    raise SystemExit(main())
