"""Nothing grows before the key: a peer without it that opens connection after connection and
sends tagged messages on tags no connection has leaves the relay's memory where it was, and an
honest remote subscriber at its rate (TCP loopback, stand-in libcuda).

``EGLCUDA_FLOOD_S`` sets how long the flood lasts (12 s by default; 600 for the 10-minute run of
docs/remote.md), ``EGLCUDA_FLOOD_MBS`` its rate (20 MB/s by default)."""
from __future__ import annotations

import os
import pathlib
import socket
import sys
import time

from ...json_peer import JsonPeer
from .conftest import REMOTE_PEER, ROOT, Peer

RATE = 60.0


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS: process {pid} ended")


def test_a_keyless_flood_grows_nothing_and_costs_an_honest_remote_nothing(cluster, env):
    seconds = float(os.environ.get("EGLCUDA_FLOOD_S", "12"))
    rate = float(os.environ.get("EGLCUDA_FLOOD_MBS", "20"))
    cluster.publisher(rate=RATE)
    relay, address = cluster.relay("--qos", "latest", "--timeout", "2")
    honest = cluster.subscriber(address, "--qos", "every", "--queue", "4", "--count", "0")
    honest.wait_for(lambda m: m["event"] == "got", timeout=30)
    time.sleep(1.0)
    pid = relay.process.pid
    before = _rss_mib(pid)
    mark = len(honest.got())
    keyless = {**env, "EGLCUDA_REMOTE_KEY": ""}
    flood = Peer(keyless, REMOTE_PEER, "flood", "--name", "t", "--remote", address, "--seconds", str(seconds),
                 "--rate", str(rate), "--every", "0.2")
    cluster.peers.append(flood)
    peak = before
    started = time.monotonic()
    while flood.process.poll() is None and time.monotonic() - started < seconds + 30:
        assert relay.process.poll() is None, relay.stderr()
        peak = max(peak, _rss_mib(pid))
        time.sleep(0.25)
    done = flood.wait_for(lambda m: m["event"] == "done", timeout=30)
    assert done["messages"] > rate * 1e6 / 4096 * seconds * 0.3, done  # (the flood did flood)
    time.sleep(1.0)
    after = _rss_mib(pid)
    seqs = [m["seq"] for m in honest.got()[mark:]]
    published = seqs[-1] - seqs[0] + 1
    assert max(peak, after) - before < 50, (before, peak, after, done)
    # (95 % is the goal; on this tier's two shared cores the flooding process takes CPU the
    # honest one needs, and other work more: 75 % here)
    assert len(seqs) >= 0.75 * published and seqs == sorted(set(seqs)), (len(seqs), published)
    assert all(m["ok"] for m in honest.got()), [m for m in honest.got() if not m["ok"]][:2]
    relay.messages.clear()
    relay.send("remotes")
    remotes = relay.wait_for(lambda m: m["event"] == "remotes")["remotes"]
    assert len([r for r in remotes if r["connected"]]) == 1, remotes


# Runs the command after it with this process's descriptors limited (to 256: as a relay started
# with a low RLIMIT_NOFILE, reached with fewer connections).
_NOFILE = ("import os, resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)); "
           "os.execv(sys.argv[1], sys.argv[1:])")


def _ended(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:  # (reset)
        return True


def test_connections_that_never_make_a_request_are_shut_down_and_cost_a_joining_remote_nothing(cluster, env):
    """A peer without the key opens TCP connections to the relay's port and says nothing (or a
    few bytes): UCX's connection manager waits for each without a limit, out of sight of the
    caps on handshakes. Each is shut down once it said nothing for the relay's timeout, those
    beyond 8 from one address at once; before, they stayed, and with the relay's descriptors
    at 256, UCX's accept failed in a loop and no remote subscriber could join."""
    cluster.publisher(rate=RATE)
    relay = JsonPeer([str(REMOTE_PEER), "relay", "--name", "t", "--path", cluster.path, "--timeout", "2"], env=env,
                     cwd=str(ROOT), prefix=(sys.executable, "-c", _NOFILE))
    cluster.peers.append(relay)  # (stopped with the others)
    ready = relay.wait_for(lambda m: m["event"] == "ready")
    address, port = f"127.0.0.1:{ready['port']}", ready["port"]
    honest = cluster.subscriber(address, "--qos", "every", "--count", "0")
    honest.wait_for(lambda m: m["event"] == "got", timeout=30)
    fds = len(os.listdir(f"/proc/{relay.process.pid}/fd"))
    silent = []
    for index in range(300):
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        if index % 50 == 0:
            sock.sendall(os.urandom(3))  # (a few bytes of a request that never ends)
        sock.setblocking(False)
        silent.append(sock)
    try:
        late = cluster.subscriber(address, "--qos", "latest", "--count", "5", "--timeout", "10")
        done = late.wait_for(lambda m: m["event"] in ("done", "error"), timeout=30)
        assert done["event"] == "done" and done["got"] == 5, done
        assert all(m["ok"] for m in late.got()), late.got()
        deadline = time.monotonic() + 10  # (the relay's timeout, 2 s, and a look each 0.5 s)
        while not all(_ended(sock) for sock in silent):
            assert time.monotonic() < deadline, sum(not _ended(sock) for sock in silent)
            time.sleep(0.25)
    finally:
        for sock in silent:
            sock.close()
    assert relay.process.poll() is None, relay.stderr()
    assert len(os.listdir(f"/proc/{relay.process.pid}/fd")) <= fds + 2
    got = honest.got()
    assert got and all(m["ok"] for m in got), [m for m in got if not m["ok"]][:2]


def _cpu_s(pid: int) -> float:
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_garbage_on_a_plain_connection_is_cut_off_at_once_and_costs_no_core(cluster, env):
    """Kilobytes of garbage on a TCP connection to the relay's port, the connection kept open:
    UCX's connection manager reads part of it, leaves the rest, and its thread spun on the
    readable socket (a core) until the relay's timeout, and on the half-closed one after it
    until the peer closed. The relay resets such a connection within two of its looks (about a
    second), long before its timeout (30 s here), and its CPU stays low."""
    cluster.publisher(rate=RATE)
    relay, address = cluster.relay("--timeout", "30")
    port = int(address.rsplit(":", 1)[1])
    honest = cluster.subscriber(address, "--qos", "every", "--count", "0")
    honest.wait_for(lambda m: m["event"] == "got", timeout=30)
    # What serving the honest subscriber costs the relay alone, measured first: a loaded machine
    # makes it a good part of a core, which is not the garbage's.
    started, cpu = time.monotonic(), _cpu_s(relay.process.pid)
    time.sleep(2.0)
    serving = (_cpu_s(relay.process.pid) - cpu) / (time.monotonic() - started)
    started = time.monotonic()
    garbage = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(3)]
    try:
        for sock in garbage:
            sock.sendall(os.urandom(65536 if sock is garbage[0] else 8192))
            sock.setblocking(False)
        while not all(_ended(sock) for sock in garbage):
            assert time.monotonic() - started < 5, [_ended(sock) for sock in garbage]
            time.sleep(0.1)
        # Once they are cut off, the relay costs what serving costs (the spin before the cut, up
        # to a core for about a second, depends on how soon a loaded machine runs its look).
        started, cpu = time.monotonic(), _cpu_s(relay.process.pid)
        time.sleep(2.0)
        spent = _cpu_s(relay.process.pid) - cpu
        elapsed = time.monotonic() - started
    finally:
        for sock in garbage:
            sock.close()
    # (a thread spinning on a half-closed garbage connection would add about 1.0 x elapsed)
    assert spent - serving * elapsed < 0.5 * elapsed, (spent, serving, elapsed)
    assert relay.process.poll() is None, relay.stderr()
    got = honest.got()
    assert got and all(m["ok"] for m in got), [m for m in got if not m["ok"]][:2]
