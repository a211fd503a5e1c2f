"""The UCX engine itself (eglcuda/remote/_ucx.py), in each progress mode, in a fresh process: the
completion contract the relay and the remote subscriber rely on, and the loop woken at once by
another thread."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import ROOT, UCX_ENV, ucxx_present

_PROGRAM = r'''
import asyncio, json, os, statistics, threading, time
import numpy as np
from eglcuda.remote import _ucx

engine = _ucx.engine()
rng = np.random.default_rng(int(os.environ["SEED"]))
SIZES = [int(n) for n in rng.integers(1, 300_000, 12)]
result = {"mode": _ucx.progress_mode()}


async def exchange():
    accepted = []
    engine.claim_prefix(11)
    engine.claim_prefix(22)

    async def serve(ep):
        ep.use_tags(22, 11)
        accepted.append(ep)

    listener = engine.listen(0, serve)
    sender = engine.connect("127.0.0.1", listener.port)
    sender.use_tags(11, 22)
    while not accepted:
        await asyncio.sleep(0.01)
    receiver = accepted[0]
    payloads = [rng.integers(0, 256, n, dtype=np.uint8) for n in SIZES]
    buffers = [np.zeros(n, np.uint8) for n in SIZES]
    seen, inside = [], [False]
    finished = asyncio.get_running_loop().create_future()

    def done(what):
        def call(error):
            seen.append((what, error is None, threading.current_thread() is engine.thread, inside[0]))
            if len(seen) == 2 * len(SIZES) and not finished.done():
                finished.set_result(None)
        return call

    for index, buffer in enumerate(buffers):  # (receives first on one side, sends on the other)
        inside[0] = True
        receiver.recv_now(engine.arr(buffer), 1, done(("recv", index)))
        inside[0] = False
    for index, payload in enumerate(payloads):
        inside[0] = True
        sender.send_now(engine.arr(payload), 1, done(("send", index)))
        inside[0] = False
    await asyncio.wait_for(finished, 30)
    result["all_ok"] = all(ok for _, ok, _, _ in seen)
    result["on_loop"] = all(on for _, _, on, _ in seen)
    result["inside_post"] = any(inside_ for _, _, _, inside_ in seen)
    result["bytes_equal"] = all(np.array_equal(a, b) for a, b in zip(payloads, buffers))
    receiver.abort()
    sender.abort()
    try:
        receiver.recv_now(engine.arr(buffers[0]), 1, done(("late", 0)))
        result["closed_refused"] = False
    except _ucx.LinkError:
        result["closed_refused"] = True
    listener.close()


_ucx.run(engine.loop, exchange(), 60)

# Another thread hands the idle loop work: it runs at once, not at the loop's next timeout.
delays = []
for _ in range(20):
    time.sleep(0.02)
    ran = threading.Event()
    start = time.monotonic()
    engine.loop.call_soon_threadsafe(ran.set)
    ran.wait(5)
    delays.append(time.monotonic() - start)
result["handoff_ms"] = 1e3 * statistics.median(delays)
cpu = time.process_time()
time.sleep(1.0)
result["idle_cpu"] = time.process_time() - cpu  # (seconds of CPU in one second: the engine sleeps, never spins)
print("RESULT " + json.dumps(result), flush=True)
'''


@pytest.mark.parametrize("mode", ["thread", "loop"])
def test_completions_run_on_the_loop_after_post_with_every_byte(mode):
    """Engine.post's contract in each progress mode: each ``done`` runs on the engine's thread,
    never inside the post that gave it; receives on one tag take the sends in the order both
    were posted, each exactly the bytes its send carried (random sizes up to 300 KB: eager and
    rendezvous); a closed endpoint refuses a post; work handed over from another thread runs at
    once (the loop is woken, not found at its next timeout); idle, the engine sleeps."""
    if not ucxx_present():
        pytest.skip("ucxx is not installed: pip install -e '.[remote-cu12]' (or remote-cu13)")
    seed = int.from_bytes(os.urandom(4), "little")
    env = {**os.environ, **UCX_ENV, "EGLCUDA_UCX_PROGRESS": mode, "SEED": str(seed)}
    out = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True, env=env,
                         cwd=str(ROOT), timeout=120)
    lines = [line[7:] for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, (seed, out.stderr[-2000:])
    result = json.loads(lines[0])
    assert result["mode"] == mode
    assert result["all_ok"] and result["bytes_equal"], (seed, result)
    assert result["on_loop"] and not result["inside_post"], (seed, result)
    assert result["closed_refused"], result
    assert result["handoff_ms"] < 20, result  # (a missed wake would cost the loop's longest sleep, 100 ms)
    assert result["idle_cpu"] < 0.2, result  # (about 0.005 here)


_STOP_WHILE_BUSY = r'''
import gc, time
from eglcuda.remote import _ucx
engine = _ucx.engine()
engine.loop.call_soon_threadsafe(time.sleep, 0.3)  # (the loop is busy when the exit's wake comes)
time.sleep(0.05)
_ucx._at_exit()
del engine
gc.collect()  # (UCXX's worker goes: its destructor says what it finds left running)
print("stopped", flush=True)
'''


def test_the_engine_stops_without_a_word_on_stderr():
    """Thread mode: the exit leaves UCXX's request notifier stopped, as its worker's destructor
    expects; it printed a UCXX WARN line at exit when the loop was busy as the exit came."""
    if not ucxx_present():
        pytest.skip("ucxx is not installed: pip install -e '.[remote-cu12]' (or remote-cu13)")
    env = {**os.environ, **UCX_ENV, "EGLCUDA_UCX_PROGRESS": "thread"}
    out = subprocess.run([sys.executable, "-c", _STOP_WHILE_BUSY], capture_output=True, text=True, env=env,
                         cwd=str(ROOT), timeout=60)
    assert out.returncode == 0 and out.stdout == "stopped\n", (out.stdout, out.stderr[-2000:])
    assert out.stderr == "", out.stderr[-2000:]
