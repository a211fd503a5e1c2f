"""A remote subscriber used from two threads: each call keeps its own time limit. Each case in a
fresh interpreter on the stand-in libcuda over TCP loopback."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

from .conftest import ROOT

# The publisher is stopped: a receive on a helper thread waits its 3 s for a frame meanwhile.
_BESIDE_A_WAITING_RECEIVE = r'''
import asyncio, json, sys, threading, time
import eglcuda
sub = eglcuda.Subscriber("t", remote=sys.argv[1], timeout=5)
try:
    while True:
        sub.receive(0.3).release()
except eglcuda.Timeout:
    pass
def another_receive():
    try:
        sub.receive(3)
    except eglcuda.Timeout:
        pass
def timed(call):
    helper = threading.Thread(target=another_receive)
    helper.start()
    time.sleep(0.2)
    started = time.monotonic()
    try:
        outcome = type(call()).__name__
    except Exception as exc:
        outcome = type(exc).__name__
    took = time.monotonic() - started
    helper.join()
    return outcome, took
async def waited_async():
    ticks = 0
    async def tick():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.05)
            ticks += 1
    ticking = asyncio.ensure_future(tick())
    try:
        await sub.receive_async(0.3)
    finally:
        ticking.cancel()
        said["ticks"] = ticks
said = {"receive": timed(lambda: sub.receive(0.2)), "wait_for_publisher": timed(lambda: sub.wait_for_publisher(0.2))}
said["receive_async"] = timed(lambda: asyncio.run(waited_async()))
sub.close()
print(json.dumps(said), flush=True)
'''


def test_a_call_beside_another_threads_waiting_receive_keeps_its_own_timeout(cluster, env):
    """receive(0.2), wait_for_publisher(0.2) and receive_async(0.3) on one thread while another
    thread's receive(3) waits: each returns within its own time (a receive raises Timeout, the
    connected subscriber's wait_for_publisher returns its info), and the event loop runs
    meanwhile. They waited out the other thread's whole receive, the event loop stopped."""
    publisher = cluster.publisher(rate=100)
    _, address = cluster.relay()
    publisher.process.send_signal(signal.SIGSTOP)
    try:
        out = subprocess.run([sys.executable, "-c", _BESIDE_A_WAITING_RECEIVE, address], env=env, cwd=str(ROOT),
                             capture_output=True, text=True, timeout=60)
    finally:
        publisher.process.send_signal(signal.SIGCONT)
    assert out.returncode == 0, out.stderr[-2000:]
    said = json.loads(out.stdout.splitlines()[-1])
    assert said["receive"][0] == "Timeout" and said["receive"][1] < 1.0, said
    assert said["wait_for_publisher"][0] == "TopicInfo" and said["wait_for_publisher"][1] < 1.0, said
    assert said["receive_async"][0] == "Timeout" and said["receive_async"][1] < 1.0, said
    assert said["ticks"] >= 3, said  # (the loop ran while it waited)
