"""A relay's address: a relay restarted on its port binds at once, a port in use is said in one
line naming it, and a relay serves only on the address it was told (TCP loopback, stand-in
libcuda)."""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time

import pytest

from .conftest import ROOT


def test_a_relay_killed_under_a_receiving_remote_restarts_on_its_port_at_once(cluster):
    """SIGKILL of a relay that was sending leaves its connections in TIME-WAIT on its port: a new
    relay on the same port binds at once all the same, and serves."""
    cluster.publisher(rate=200)
    relay, address = cluster.relay()
    sub = cluster.subscriber(address, "--count", "0", "--qos", "latest")
    sub.wait_for(lambda m: m["event"] == "got")
    time.sleep(0.3)
    relay.kill()
    sub.wait_for(lambda m: m["event"] == "disconnected", timeout=15)
    started = time.monotonic()
    again, again_address = cluster.relay("--listen", address)
    assert again_address == address
    assert time.monotonic() - started < 10
    fresh = cluster.subscriber(address, "--count", "5")
    fresh.wait_for(lambda m: m["event"] == "done", timeout=30)
    got = fresh.got()
    assert len(got) == 5 and all(m["ok"] for m in got), got


# The start of a relay script: a key, a free port of the loopback address, the topic's path.
FREE_ADDRESS = """
import os, signal, socket, subprocess, sys, threading, time, eglcuda
path = sys.argv[1]
key = os.urandom(32)
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    address = f"127.0.0.1:{probe.getsockname()[1]}"
"""

# A relay that served a remote, closed while the program still refers to it (the name a `with`
# block binds): another relay of the same process binds its port at once.
SERVE_CLOSE_REBIND = FREE_ADDRESS + """
with eglcuda.Relay("t", address, key=key, path=path, timeout=5) as relay:
    serving = threading.Thread(target=relay.serve_forever)
    serving.start()
    for _ in range(2):
        sub = eglcuda.Subscriber("t", remote=address, key=key, timeout=10)
        sub.receive(5).release()
        sub.close()
serving.join(10)
started = time.monotonic()
again = eglcuda.Relay("t", address, key=key, path=path, timeout=5)
print("rebound", round(time.monotonic() - started, 3), relay.closed)
again.close()
"""


def test_a_closed_relay_still_referred_to_frees_its_port_at_once(cluster, env, path):
    """The port was held until the cycle collector freed the requests of the closed connections
    (a failed request's traceback kept it, and it kept its endpoint and UCX's listener)."""
    cluster.publisher()
    out = subprocess.run([sys.executable, "-c", SERVE_CLOSE_REBIND, path], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[0] == "rebound" and out.stdout.split()[2] == "True", out.stdout


# A key-less peer that opens a connection, reads the relay's first message and says nothing.
SILENT_PEER = """
import asyncio, sys
import numpy as np
from eglcuda.remote import _ucx, wire
async def main():
    host, port = sys.argv[1].rsplit(":", 1)
    ep = _ucx.engine().connect(host, int(port))
    await asyncio.wait_for(ep.stream_recv(np.zeros(wire.HANDSHAKE, np.uint8)), 10)
    print("heard", flush=True)
    await asyncio.sleep(120)
_ucx.run(_ucx.acquire(), main(), 200)
"""

# A relay closed with such a peer in its handshake, or after the peer's handshake ran out of time
# (the peer still there): another relay of the same process binds its port at once.
SILENT_CLOSE_REBIND = FREE_ADDRESS + """
wait, peer_code = float(sys.argv[2]), sys.argv[3]
relay = eglcuda.Relay("t", address, key=key, path=path, timeout=1.0)
peer = subprocess.Popen([sys.executable, "-c", peer_code, address], stdout=subprocess.PIPE, text=True)
try:
    assert peer.stdout.readline().strip() == "heard"
    time.sleep(wait)
    started = time.monotonic()
    relay.close()
    closed = time.monotonic() - started
    again = eglcuda.Relay("t", address, key=key, path=path, timeout=5)
    print("rebound", round(closed, 3), round(time.monotonic() - started, 3), flush=True)
    again.close()
finally:
    peer.kill()
"""


@pytest.mark.parametrize("wait", [0.2, 2.5], ids=["in-handshake", "handshake-timed-out"])
def test_a_relay_closed_beside_a_silent_peer_frees_its_port_at_once(cluster, env, path, wait):
    """A receive posted on an accepted connection that is closed from this side (the relay's
    close, or the handshake's time limit) kept UCX's listener, and the port stayed bound as
    long as the process lived: the next relay on it failed with "port in use"."""
    cluster.publisher()
    out = subprocess.run([sys.executable, "-c", SILENT_CLOSE_REBIND, path, str(wait), SILENT_PEER], env=env,
                         cwd=str(ROOT), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    words = out.stdout.split()
    assert words[0] == "rebound" and float(words[1]) < 2.0, out.stdout


# A relay closed while its one remote subscriber is stopped (SIGSTOP): it cannot take the
# relay's goodbye, and the relay of the same process made next binds the port at once.
STOPPED_CLOSE_REBIND = FREE_ADDRESS + """
relay = eglcuda.Relay("t", address, key=key, path=path, timeout=5)
receiving = (
    "import sys, eglcuda\\n"
    "sub = eglcuda.Subscriber('t', remote=sys.argv[1], key=bytes.fromhex(sys.argv[2]), qos='every', timeout=10)\\n"
    "sub.receive(10).release()\\n"
    "print('got', flush=True)\\n"
    "while True:\\n"
    "    sub.receive(10).release()\\n")
remote = subprocess.Popen([sys.executable, "-c", receiving, address, key.hex()], stdout=subprocess.PIPE, text=True)
try:
    assert remote.stdout.readline().strip() == "got"
    os.kill(remote.pid, signal.SIGSTOP)
    time.sleep(0.5)
    started = time.monotonic()
    relay.close()
    closed = time.monotonic() - started
    again = eglcuda.Relay("t", address, key=key, path=path, timeout=5)
    print("rebound", round(closed, 3), flush=True)
    again.close()
finally:
    remote.kill()
"""


def test_a_relay_closed_under_a_stopped_remote_frees_its_port_at_once(cluster, env, path):
    """The stopped remote's connection, closed from the relay's side with its receives still
    posted, kept UCX's listener: the port stayed bound as long as the process lived."""
    cluster.publisher()
    out = subprocess.run([sys.executable, "-c", STOPPED_CLOSE_REBIND, path], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    words = out.stdout.split()
    assert words[0] == "rebound" and float(words[1]) < 4.0, out.stdout


def test_a_port_in_use_is_named_in_one_line(cluster, env, path):
    cluster.publisher()
    _, address = cluster.relay()
    out = subprocess.run([sys.executable, "-m", "eglcuda", "relay", "t", "--path", path, "--listen", address,
                          "--timeout", "3"], env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    ours = [line for line in out.stderr.splitlines() if line.startswith("python -m eglcuda relay:")]
    assert len(ours) == 1 and address in ours[0] and "in use" in ours[0], out.stderr[-2000:]
    assert "Traceback" not in out.stderr, out.stderr[-2000:]
    assert len([line for line in out.stderr.splitlines() if line.strip()]) == 1, out.stderr[-2000:]  # (no UCX log line)

# A relay waiting for its publisher (port free when it was made) whose port another program
# takes meanwhile: when the publisher comes, the relay cannot listen.
PORT_TAKEN_WHILE_WAITING = """
import os, socket, sys, threading, time, eglcuda
path = sys.argv[1]
with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
raised = []
def make():
    try:
        eglcuda.Relay("t", f"127.0.0.1:{port}", key=os.urandom(32), path=path, timeout=60).close()
    except BaseException as exc:
        raised.append(exc)
making = threading.Thread(target=make)
making.start()
time.sleep(1.0)  # (past its look at the port: it waits for the publisher)
squatter = socket.socket()
squatter.bind(("0.0.0.0", port))
squatter.listen()
print("taken", port, flush=True)
making.join(60)
print("raised", type(raised[0]).__name__ if raised else None, raised[0] if raised else "", flush=True)
"""


def test_a_port_taken_while_the_relay_waits_for_its_publisher_is_named(cluster, env, path):
    """The port was free when the relay was made and taken before its publisher came: the relay
    raised AttributeError ('address') from its own cleanup instead of the UsageError naming the
    port."""
    child = subprocess.Popen([sys.executable, "-c", PORT_TAKEN_WHILE_WAITING, path], env=env, cwd=str(ROOT),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        taken = child.stdout.readline().split()
        assert taken[:1] == ["taken"], (taken, child.stderr.read() if child.poll() is not None else "")
        cluster.publisher()
        out, err = child.communicate(timeout=90)
    finally:
        child.kill()
    assert child.returncode == 0, err[-2000:]
    said = [line for line in out.splitlines() if line.startswith("raised")]  # (UCX logs its bind failure there too)
    assert said and said[0].startswith("raised UsageError") and f"port {taken[1]} is in use" in said[0], (out, err)


def _host_address() -> str | None:
    """This host's address on its default route (None: it has none)."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("198.51.100.7", 9))  # (no packet is sent: the route picks the address)
            address = probe.getsockname()[0]
    except OSError:
        return None
    return None if address.startswith("127.") else address


def test_a_relay_serves_only_on_the_address_it_was_told(cluster, env):
    """UCX listens on every address of the host: a relay told this host's network address
    closes a connection made to 127.0.0.1 (same port) before a word, serves one made to that
    address, and lists the address each remote connected from, not what it says of itself."""
    address = _host_address()
    if address is None:
        pytest.skip("this host has no address besides loopback")
    env = {key: value for key, value in env.items() if key != "UCX_NET_DEVICES"}  # (UCX over that address too)
    cluster.publisher()
    relay, _ = cluster.relay("--listen", f"{address}:0", env=env)
    port = relay.wait_for(lambda m: m["event"] == "ready")["port"]
    wrong = cluster.subscriber(f"127.0.0.1:{port}", "--count", "3", "--timeout", "2", env=env)
    answer = wrong.wait_for(lambda m: m["event"] in ("ready", "error"), timeout=30)
    assert answer["event"] == "error" and answer["kind"] == "Timeout", answer
    right = cluster.subscriber(f"{address}:{port}", "--count", "0", env=env)
    right.wait_for(lambda m: m["event"] == "got", timeout=30)
    relay.send("remotes")
    remotes = relay.wait_for(lambda m: m["event"] == "remotes")["remotes"]
    assert [r["peer"].rsplit(":", 1)[0] for r in remotes if r["connected"]] == [address], remotes
    assert all(m["ok"] for m in right.got())


def test_an_address_not_of_this_host_is_refused_in_one_line(cluster, env, path):
    cluster.publisher()
    out = subprocess.run([sys.executable, "-m", "eglcuda", "relay", "t", "--path", path, "--listen", "198.51.100.7:5555",
                          "--timeout", "3"], env=env, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert "not an address of this host" in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]


def test_wait_for_publisher_rejoins_a_relay_restarted_meanwhile(cluster):
    """A remote subscriber waits (wait_for_publisher, 30 s) while its relay is dead; a relay
    started on the same address 3 s later is joined within a second or two of being up."""
    cluster.publisher(rate=100)
    relay, address = cluster.relay("--qos", "latest")
    sub = cluster.subscriber(address, "--count", "0", "--qos", "latest", "--rejoin", "--rejoin-timeout", "30",
                             "--timeout", "2")
    sub.wait_for(lambda m: m["event"] == "got")
    relay.kill()
    sub.wait_for(lambda m: m["event"] == "disconnected", timeout=15)
    time.sleep(3.0)
    cluster.relay("--listen", address, "--qos", "latest")
    up = time.monotonic()
    rejoined = sub.wait_for(lambda m: m["event"] in ("rejoined", "rejoin-failed"), timeout=40)
    assert rejoined["event"] == "rejoined", rejoined
    assert time.monotonic() - up < 2.5
    count = len(sub.got())
    sub.wait_for(lambda m: len(sub.got()) >= count + 5, timeout=10)
    assert all(m["ok"] for m in sub.got())


def test_wait_for_publisher_that_times_out_names_the_time_it_was_given(cluster):
    """wait_for_publisher(1) with no relay up raises Timeout after its 1 s, and says 1 s (it
    said the subscriber's own timeout)."""
    cluster.publisher(rate=100)
    relay, address = cluster.relay("--qos", "latest")
    sub = cluster.subscriber(address, "--count", "0", "--qos", "latest", "--rejoin", "--rejoin-timeout", "1",
                             "--timeout", "7")
    sub.wait_for(lambda m: m["event"] == "got")
    relay.kill()
    sub.wait_for(lambda m: m["event"] == "disconnected", timeout=15)
    failed = sub.wait_for(lambda m: m["event"] in ("rejoined", "rejoin-failed"), timeout=30)
    assert failed["event"] == "rejoin-failed" and failed["kind"] == "Timeout", failed
    assert "within 1 s" in failed["reason"] and "7 s" not in failed["reason"], failed


def test_wait_for_publisher_waits_through_a_relay_closing_and_joins_its_successor(cluster):
    """A relay closed (as SIGTERM or close() do) drops its remotes with the reason; one that then
    waits for a publisher (15 s) reaches the relay while it still closes, and is refused "the
    relay is closing": that is a wait, not the end (it raised Refused at once). A relay started
    on the address a second later is joined, its frames checked."""
    cluster.publisher(rate=100)
    relay, address = cluster.relay("--qos", "latest")
    sub = cluster.subscriber(address, "--count", "0", "--qos", "latest", "--rejoin", "--rejoin-timeout", "15",
                             "--timeout", "2")
    sub.wait_for(lambda m: m["event"] == "got")
    relay.send("bye")
    gone = sub.wait_for(lambda m: m["event"] == "disconnected", timeout=15)
    assert gone["kind"] == "Dropped" and "closed" in gone["reason"], gone
    relay.wait_for(lambda m: m["event"] == "closed", timeout=15)
    time.sleep(1.0)
    cluster.relay("--listen", address, "--qos", "latest")
    rejoined = sub.wait_for(lambda m: m["event"] in ("rejoined", "rejoin-failed"), timeout=30)
    assert rejoined["event"] == "rejoined", rejoined
    count = len(sub.got())
    sub.wait_for(lambda m: len(sub.got()) >= count + 5, timeout=10)
    assert all(m["ok"] for m in sub.got())


_WAIT_FOR_A_DEAD_RELAY = r'''
import os, sys, eglcuda
try:
    eglcuda.Subscriber("t", remote=f"127.0.0.1:{sys.argv[1]}", key=os.urandom(32), timeout=2)
except eglcuda.Timeout:
    print("timeout", flush=True)
'''


def test_waiting_for_a_relay_that_is_down_prints_nothing(env):
    """A remote subscriber retries its connection to a relay that is down for its whole wait;
    each failed attempt printed a UCXX ERROR line on stderr: the wait ends in eglcuda.Timeout
    and says nothing else."""
    with socket.socket() as probe:  # (a port nobody listens on)
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {k: v for k, v in env.items() if k != "UCXX_LOG_LEVEL"}
    out = subprocess.run([sys.executable, "-c", _WAIT_FOR_A_DEAD_RELAY, str(port)], capture_output=True, text=True,
                         env=env, cwd=str(ROOT), timeout=60)
    assert out.returncode == 0 and out.stdout == "timeout\n", (out.stdout, out.stderr[-2000:])
    assert out.stderr == "", out.stderr[-2000:]


def test_a_privileged_port_the_process_may_not_bind_is_named_in_one_line(env, path):
    """A port below 1024 without CAP_NET_BIND_SERVICE: the relay waited for its publisher, then UCX
    printed two ERROR lines of its own and the relay raised 'listening on port 80 failed:
    UCXXIOError: Input/output error', naming neither the port's privilege nor a remedy. It is a
    UsageError naming the port at once, before the wait and with no UCX line."""
    setpriv = shutil.which("setpriv")
    drop = [setpriv, "--bounding-set", "-net_bind_service", "--inh-caps", "-net_bind_service"] if setpriv else []
    probe = subprocess.run([*drop, sys.executable, "-c", "import socket; socket.socket().bind(('0.0.0.0', 80))"],
                           capture_output=True, text=True, timeout=30)
    if "Permission denied" not in probe.stderr:
        pytest.skip("this process can bind port 80 (or setpriv cannot take the capability away)")
    started = time.monotonic()
    out = subprocess.run([*drop, sys.executable, "-m", "eglcuda", "relay", "t", "--path", path, "--listen",
                          "127.0.0.1:80", "--timeout", "20"], env=env, cwd=str(ROOT), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "port 80" in lines[0] and "privileged" in lines[0], out.stderr[-2000:]
    assert time.monotonic() - started < 10  # (no publisher: it did not wait for one first)
