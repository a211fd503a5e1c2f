"""A relay named by a host name: the name is looked up by the remote subscriber, off the UCX
engine's thread, for an IPv4 address. A stand-in resolver (tests/fakes/resolver/, preloaded into
the subscribers' process) answers ``slow.test`` after seconds and ``dual.test`` with ``::1``
before ``127.0.0.1``."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ...fakes import build as fake_build
from .conftest import ROOT

SUBSCRIBERS = r'''
import json, sys, threading, time
import eglcuda

address = sys.argv[1]
port = address.rsplit(":", 1)[1]
healthy = eglcuda.Subscriber("t", remote=address, timeout=10)
healthy.receive(10).release()
gaps, errors, stop = [], [], threading.Event()

def read():
    last = time.monotonic()
    while not stop.is_set():
        try:
            healthy.receive(5).release()
        except Exception as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            return
        now = time.monotonic()
        gaps.append(now - last)
        last = now

reader = threading.Thread(target=read)
reader.start()
time.sleep(0.3)
report = {}
for name, timeout in (("slow.test", 10), ("dual.test", 5)):
    started = time.monotonic()
    try:
        with eglcuda.Subscriber("t", remote=f"{name}:{port}", timeout=timeout) as sub:
            sub.receive(5).release()
        report[name] = round(time.monotonic() - started, 2)
    except Exception as exc:
        report[name] = f"{type(exc).__name__}: {exc}"
time.sleep(0.3)
stop.set()
reader.join(10)
healthy.close()
print(json.dumps({"joined": report, "frames": len(gaps), "longest_gap": max(gaps), "errors": errors}))
'''


@pytest.fixture(scope="module")
def resolver(tmp_path_factory):
    if fake_build.compiler() is None:
        pytest.skip("needs a C compiler (gcc or cc) for the stand-in resolver")
    return fake_build.build_resolver(tmp_path_factory.mktemp("resolver"))


def test_a_slow_or_dual_stack_relay_name_holds_no_other_link_and_joins_over_ipv4(cluster, env, resolver):
    """While one remote subscriber's relay name takes 3 s to resolve, another remote subscriber of
    the same process, joined by address, goes on receiving (the lookup ran on UCX's one engine
    thread: every link of the process stalled, and the relay dropped the healthy one as silent);
    the slow name joins once resolved. A name whose resolver answers IPv6 first joins over its
    IPv4 address (UCXX took the first address, where no relay listens: a Timeout)."""
    cluster.publisher(rate=100)
    _, address = cluster.relay("--timeout", "2")
    child_env = {**env, "LD_PRELOAD": str(resolver), "FAKE_RESOLVER_DELAY_S": "3"}
    done = subprocess.run([sys.executable, "-c", SUBSCRIBERS, address], env=child_env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert not report["errors"] and report["longest_gap"] < 1.0, report
    slow, dual = report["joined"]["slow.test"], report["joined"]["dual.test"]
    assert isinstance(slow, float) and 3.0 <= slow < 6.0, report
    assert isinstance(dual, float) and dual < 3.0, report
