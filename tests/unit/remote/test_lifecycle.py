"""How a process with a relay and remote subscribers ends, and waits without a bound: each in a
fresh interpreter on the stand-in libcuda over TCP loopback."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from .conftest import ROOT

# A relay and a remote subscriber of it in one process, a message held, nothing closed: the
# interpreter's exit closes them. Timestamps say how long the exit took after the last line.
_OPEN_AT_EXIT = r'''
import json, sys, time
sys.path.insert(0, "tests/gpu")
import eglcuda
from topics_peer import check
relay = eglcuda.Relay("t", "127.0.0.1:0", path=sys.argv[1])
sub = eglcuda.Subscriber("t", remote=f"127.0.0.1:{relay.address[1]}", qos=sys.argv[2])
oks = []
for _ in range(10):
    with sub.receive(10) as message:
        oks.append(check(message, 5)[0])
held = sub.receive(10)
print(json.dumps({"ok": all(oks), "at": time.time()}), flush=True)
'''


@pytest.mark.parametrize("qos", ["latest", "every"])
def test_exit_with_a_relay_and_its_remote_subscriber_open_is_prompt_and_quiet(cluster, env, qos):
    """The exit closes this process's remote subscribers before its relays: a relay closed first
    waited 1.5 s for a remote that could no longer receive its goodbye. Nothing reaches stderr
    (UCXX warned, now and then, that its notifier was not stopped)."""
    cluster.publisher(rate=300)
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _OPEN_AT_EXIT, cluster.path, qos], env=env, cwd=str(ROOT),
                             capture_output=True, text=True, timeout=60)
        ended = time.time()
        assert out.returncode == 0, out.stderr[-2000:]
        said = json.loads(out.stdout.splitlines()[-1])
        assert said["ok"], said
        assert out.stderr == "", out.stderr[-2000:]
        assert ended - said["at"] < 1.0, ended - said["at"]  # (about 0.1 s; 1.6 s with the relay closed first)


_NO_BOUND = r'''
import asyncio, json, sys
sys.path.insert(0, "tests/gpu")
import eglcuda
from topics_peer import check
sub = eglcuda.Subscriber("t", remote=sys.argv[1], qos=sys.argv[2])
oks = []
for timeout in (float("inf"), 1e12, 1e10):
    with sub.receive(timeout) as message:
        oks.append(check(message, 5)[0])
with asyncio.run(sub.receive_async(float("inf"))) as message:
    oks.append(check(message, 5)[0])
sub.close()
print(json.dumps({"oks": oks}), flush=True)
'''


@pytest.mark.parametrize("qos", ["latest", "every"])
def test_receive_without_a_bound_waits_for_the_next_frame(cluster, env, qos):
    """receive(float('inf')) (or any timeout past what threading can wait at once) waits for the
    next frame, as a local subscriber's does; it raised OverflowError. (30 frames/s: each
    receive finds none waiting.)"""
    cluster.publisher(rate=30)
    _, address = cluster.relay()
    out = subprocess.run([sys.executable, "-c", _NO_BOUND, address, qos], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1]) == {"oks": [True] * 4}, out.stdout


_READER_AT_EXIT = r'''
import sys, threading, time
sys.path.insert(0, "tests/gpu")
import eglcuda
from topics_peer import check
sub = eglcuda.Subscriber("t", remote=sys.argv[1], qos=sys.argv[2])
oks = []
def reading():  # (a thread that never touched the device before its first receive)
    for message in sub:
        oks.append(check(message, 5)[0])
        message.release()
threading.Thread(target=reading, daemon=True).start()
started = time.monotonic()
while len(oks) < 5 and time.monotonic() - started < 20:
    time.sleep(0.01)
print(len(oks) >= 5 and all(oks), flush=True)
'''


_PLANE_READ_AFTER_EXIT_CLOSE = r'''
import atexit, sys, threading, time
atexit.register(time.sleep, 0.5)  # (registered before eglcuda's hooks: runs after them)
import eglcuda
sub = eglcuda.Subscriber("t", remote=sys.argv[1])
message = sub.receive(10)
frame = message.frame
def reading():
    while not sub.closed:
        time.sleep(0.001)
    frame.planes[0].to_numpy()
threading.Thread(target=reading, daemon=True).start()
print(frame.planes[0].to_numpy().size > 0, flush=True)
'''


def test_a_daemon_thread_reading_a_held_frame_as_the_exit_closes_its_subscriber_stops_without_a_traceback(
        cluster, env):
    """A daemon thread reads the planes of a frame it holds just after the exit hooks closed the
    remote subscriber (a hook of the program's, run after eglcuda's, gives it the time): the read
    waits to be stopped with the interpreter, as a receive() there does, with no traceback."""
    cluster.publisher(rate=100)
    _, address = cluster.relay()
    out = subprocess.run([sys.executable, "-c", _PLANE_READ_AFTER_EXIT_CLOSE, address], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout.strip(), out.stderr) == (0, "True", ""), out.stderr


@pytest.mark.parametrize("qos", ["latest", "every"])
def test_a_daemon_thread_reading_a_remote_subscriber_at_exit_stops_without_a_traceback(cluster, env, qos):
    """A thread of the program's reads a remote subscriber (every byte right: its first receive
    makes the device current there), and the exit closes the subscriber under it: the thread stops
    with the interpreter, as daemon threads do, without an exception's traceback."""
    cluster.publisher(rate=300)
    _, address = cluster.relay()
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", _READER_AT_EXIT, address, qos], env=env, cwd=str(ROOT),
                             capture_output=True, text=True, timeout=60)
        assert (out.returncode, out.stdout.strip(), out.stderr) == (0, "True", ""), out.stderr


# serve_forever() on a thread, close() from the main thread while a remote is connected (its
# goodbye keeps the first close busy past serve_forever's next look at the flag).
_CLOSE_BESIDE_SERVE = r'''
import json, logging, sys, threading, time
import eglcuda
warnings = []
class Keep(logging.Handler):
    def emit(self, record):
        warnings.append(record.getMessage())
logging.getLogger("eglcuda").addHandler(Keep(logging.WARNING))
closes = []
for _ in range(3):
    relay = eglcuda.Relay("t", "127.0.0.1:0", path=sys.argv[1])
    sub_close = relay._sub.close
    relay._sub.close = lambda: (closes.append(threading.current_thread().name), sub_close())
    sub = eglcuda.Subscriber("t", remote=f"127.0.0.1:{relay.address[1]}")
    sub.receive(10).release()
    serving = threading.Thread(target=relay.serve_forever, name="serving")
    serving.start()
    time.sleep(0.3)
    relay.close()
    closed_at_return = relay._staging is None
    serving.join(10)
    sub.close()
    print(json.dumps({"closed_at_return": closed_at_return}), flush=True)
print(json.dumps({"closes": closes, "warnings": warnings}), flush=True)
'''


def test_close_from_another_thread_while_serve_forever_runs_tears_down_once(cluster, env):
    """serve_forever() ends by closing the relay too: it ran its own close() beside the caller's,
    both tearing the relay down at once (a relay's stream synchronized after the other close
    destroyed it: "staging copies did not end: ... INVALID_HANDLE", now and then). One close
    tears down; the other waits for it."""
    cluster.publisher(rate=300)
    out = subprocess.run([sys.executable, "-c", _CLOSE_BESIDE_SERVE, cluster.path], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert all(line["closed_at_return"] for line in lines[:-1]), lines
    assert lines[-1] == {"closes": ["MainThread"] * 3, "warnings": []}, lines[-1]


_READY_NOT_CALLABLE = r'''
import sys, eglcuda
relay = eglcuda.Relay("t", "127.0.0.1:0", path=sys.argv[1])
try:
    relay.serve_forever(ready="listening")
except eglcuda.UsageError as exc:
    print("refused" if "ready" in str(exc) else exc, relay.closed, flush=True)
relay.close()
'''


def test_serve_forever_refuses_a_ready_that_is_not_callable_before_serving(cluster, env):
    """A ``ready`` that cannot be called is a UsageError before the relay serves, and the relay
    stays open for its owner to close."""
    cluster.publisher(rate=100)
    out = subprocess.run([sys.executable, "-c", _READY_NOT_CALLABLE, cluster.path], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stdout.strip()) == (0, "refused False"), out.stderr[-2000:]


# A daemon thread of the program joins and leaves a relay over and over; the main thread ends.
_JOINING_AT_EXIT = r'''
import sys, threading, time
import eglcuda
relay = eglcuda.Relay("t", "127.0.0.1:0", path=sys.argv[1])
address = f"127.0.0.1:{relay.address[1]}"
joins = []
def joining():
    while True:
        eglcuda.Subscriber("t", remote=address).close()
        joins.append(1)
threading.Thread(target=joining, daemon=True).start()
while len(joins) < 3:
    time.sleep(0.01)
print(len(joins), flush=True)
'''


def test_a_daemon_thread_joining_a_relay_at_exit_stops_without_a_traceback(cluster, env):
    """The exit stops the UCX engine under a handshake of a daemon thread's Subscriber(remote=...):
    its constructor raised ClosedError ("the subscriber ... is closed") and the thread died with
    a traceback on stderr, about one exit in two. It stays to be stopped with the interpreter, as
    a daemon thread's receive() does."""
    cluster.publisher(rate=300)
    for _ in range(8):
        out = subprocess.run([sys.executable, "-c", _JOINING_AT_EXIT, cluster.path], env=env, cwd=str(ROOT),
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-2000:]
        # (UCX's and UCXX's own lines at the listener's end, a connection request in flight, are theirs)
        assert "Traceback" not in out.stderr and "eglcuda.errors" not in out.stderr, out.stderr[-2000:]


_LATE_REQUEST = r'''
import socket, struct, sys, time
import eglcuda
for _ in range(int(sys.argv[2])):
    relay = eglcuda.Relay("t", "127.0.0.1:0", path=sys.argv[1])
    raw = socket.create_connection(("127.0.0.1", relay.address[1]))
    time.sleep(0.1)  # (UCX accepted it: a connection waiting for its request)
    relay.close()
    time.sleep(0.1)  # (the relay's listener is gone)
    try:  # a request's header as UCX's TCP connection manager reads it (length, status), and its bytes
        raw.sendall(struct.pack("=QB7x", 16, 0) + bytes(16))
    except OSError:
        pass
    time.sleep(0.1)
    raw.close()
print("alive", flush=True)
'''


def test_a_connection_request_arriving_after_the_relay_closed_leaves_the_process_running(cluster, env):
    """A TCP connection the relay's port accepted, its UCX connection request sent only after
    the relay closed: UCX read the destroyed listener then (SIGSEGV on its async thread). The
    close resets such connections first."""
    cluster.publisher(rate=100)
    out = subprocess.run([sys.executable, "-c", _LATE_REQUEST, cluster.path, "5"], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "alive" in out.stdout, (out.returncode, out.stdout[-1000:], out.stderr[-2000:])


_LEAVE_SOON = r'''
import sys, time
import eglcuda
sub = eglcuda.Subscriber("t", remote=sys.argv[1])
sub.receive(10).release()
print("joined", flush=True)
time.sleep(0.5)
'''


def test_a_relay_that_wakes_to_find_its_remote_gone_says_nothing_on_stderr(cluster, env, path):
    """A relay stopped (SIGSTOP) while its remote subscriber left, woken: its beat to that
    connection fails, and the remote is forgotten quietly. asyncio printed 'Task exception was
    never retrieved' with the LinkError's traceback, once per remote."""
    import pathlib
    import signal

    from .conftest import Peer

    cluster.publisher(rate=100)
    relay = Peer(env, pathlib.Path("-m"), "eglcuda", "relay", "t", "--path", path, "--listen", "127.0.0.1:0")
    cluster.peers.append(relay)
    address = relay.wait_for(lambda m: m.get("event") == "noise" and "listening on" in m["line"])["line"].split()[-1]
    for _ in range(2):
        sub = subprocess.Popen([sys.executable, "-c", _LEAVE_SOON, address], env=env, cwd=str(ROOT),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert sub.stdout.readline().strip() == "joined", sub.communicate(timeout=30)
        relay.process.send_signal(signal.SIGSTOP)
        try:
            assert sub.wait(30) == 0, sub.stderr.read()
            sub.stdout.close()
            sub.stderr.close()
            time.sleep(0.3)
        finally:
            relay.process.send_signal(signal.SIGCONT)
        time.sleep(1.5)  # (its next beat, and the watchdog's look)
    relay.process.send_signal(signal.SIGTERM)
    assert relay.process.wait(15) == 0
    assert "Traceback" not in relay.stderr() and "never retrieved" not in relay.stderr(), relay.stderr()


_SERVE_IN_A_CHILD = r'''
import json, os, signal, sys
import eglcuda
relay = eglcuda.Relay("t", "127.0.0.1:0", path=sys.argv[1])
pid = os.fork()
if pid == 0:
    signal.alarm(10)  # (a child that blocks ends by itself)
    try:
        relay.serve_forever(ready=lambda: print(json.dumps({"child": "serving"}), flush=True))
        said = {"child": "returned"}
    except eglcuda.UsageError as exc:
        said = {"child": "UsageError", "why": str(exc)}
    print(json.dumps(said), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
sub = eglcuda.Subscriber("t", remote=f"127.0.0.1:{relay.address[1]}")
sub.receive(10).release()
sub.close()
relay.close()
print(json.dumps({"parent": "served"}), flush=True)
'''


def _said_by(script: str, cluster, env) -> list:
    """What ``script`` (run on the cluster's topic) printed, a JSON object a line."""
    out = subprocess.run([sys.executable, "-c", script, cluster.path], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr[-2000:]
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_serve_forever_in_a_forked_child_refuses_instead_of_serving_nothing(cluster, env):
    """The parent's relay in a child made by fork(): serve_forever() raises UsageError (it
    blocked until a signal, serving nothing, after its ready callback said it served); the
    parent's relay serves on."""
    cluster.publisher(rate=100)
    said = _said_by(_SERVE_IN_A_CHILD, cluster, env)
    assert said[0]["child"] == "UsageError" and "forked child" in said[0]["why"], said
    assert said[-1] == {"parent": "served"}, said


_REMOTES_IN_A_CHILD = r'''
import json, os, signal, sys, time
import eglcuda
relay = eglcuda.Relay("t", "127.0.0.1:0", path=sys.argv[1])
sub = eglcuda.Subscriber("t", remote=f"127.0.0.1:{relay.address[1]}")
sub.receive(10).release()
pid = os.fork()
if pid == 0:
    signal.alarm(10)
    started = time.monotonic()
    try:
        said = {"child": "returned", "remotes": len(relay.remotes)}
    except eglcuda.UsageError as exc:
        said = {"child": "UsageError", "why": str(exc)}
    said["took"] = time.monotonic() - started
    print(json.dumps(said), flush=True)
    os._exit(0)
os.waitpid(pid, 0)
print(json.dumps({"parent": len([r for r in relay.remotes if r.connected])}), flush=True)
sub.close()
relay.close()
'''


def test_remotes_in_a_forked_child_refuses_at_once_instead_of_saying_none(cluster, env):
    """The parent's relay in a child made by fork(): ``remotes`` raises UsageError at once (it
    waited 2 s for the parent's engine, which no thread runs in the child, then listed no
    remote while the parent served one)."""
    cluster.publisher(rate=100)
    said = _said_by(_REMOTES_IN_A_CHILD, cluster, env)
    assert said[0]["child"] == "UsageError" and "forked child" in said[0]["why"], said
    assert said[0]["took"] < 0.5, said
    assert said[-1] == {"parent": 1}, said


# Joins and leaves the relay at sys.argv[1] as fast as it can, until stdin closes.
_JOINING = r'''
import sys, threading, eglcuda
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
while not done.is_set():
    try:
        eglcuda.Subscriber("t", remote=sys.argv[1], timeout=1).close()
    except eglcuda.EglCudaError:
        pass
'''


def test_a_relay_stopped_while_remotes_come_and_one_is_frozen_says_nothing_on_stderr(cluster, env, path):
    """SIGTERM to ``python -m eglcuda relay`` while a remote subscriber is frozen (its connection
    closes slowly, which keeps UCX's listener alive) and others keep joining: UCXX called the
    listener's connection-request callback with its data already freed, and the relay printed
    "UCXPY ERROR <class 'KeyError'> when calling listener callback: 'cb_func'" (or worse: that
    memory is reused). The relay ends with status 0, nothing on stderr but UCX's own warning
    lines, and the remote that was receiving gets a named error."""
    import pathlib
    import signal

    from .conftest import Peer

    cluster.publisher(rate=300)
    for _ in range(2):
        relay = Peer(env, pathlib.Path("-m"), "eglcuda", "relay", "t", "--path", path, "--listen", "127.0.0.1:0")
        cluster.peers.append(relay)
        said = relay.wait_for(lambda m: m.get("event") == "noise" and "listening on" in m["line"])
        address = said["line"].split()[-1]
        frozen = cluster.subscriber(address, "--qos", "latest", "--no-check")
        frozen.wait_for(lambda m: m.get("event") == "got")
        receiving = cluster.subscriber(address, "--qos", "latest", "--no-check")
        receiving.wait_for(lambda m: m.get("event") == "got")
        joiners = [subprocess.Popen([sys.executable, "-c", _JOINING, address], env=env, cwd=str(ROOT),
                                    stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                   for _ in range(3)]
        try:
            frozen.process.send_signal(signal.SIGSTOP)
            time.sleep(1.0)
            relay.process.send_signal(signal.SIGTERM)
            assert relay.process.wait(30) == 0, relay.stderr()
        finally:
            frozen.process.send_signal(signal.SIGCONT)
            for joiner in joiners:
                joiner.stdin.close()
                joiner.wait(30)
        errors = relay.stderr()
        assert "cb_func" not in errors and "Traceback" not in errors and "UCXPY" not in errors, errors
        # (UCX's own lines, such as 'destroying listener ... with 1 unprocessed connection requests', are its)
        assert all(" UCX  " in line for line in errors.splitlines()), errors
        ended = receiving.wait_for(lambda m: m.get("event") == "disconnected")
        assert ended["kind"] == "Dropped" and "closed" in ended["reason"], ended
        receiving.stop()
        frozen.stop()


# A remote subscriber whose relay closed, asked again and again: the same error each time.
_LOST_ASKED_AGAIN = r"""
import json, sys, traceback
import eglcuda
relay = eglcuda.Relay("t", "127.0.0.1:0", path=sys.argv[1])
sub = eglcuda.Subscriber("t", remote=f"127.0.0.1:{relay.address[1]}")
sub.receive(10).release()
relay.close()
lengths, errors = [], set()
for _ in range(200):
    try:
        sub.receive(10).release()
    except eglcuda.StreamDisconnected as exc:
        errors.add(id(exc))
        lengths.append(len(traceback.extract_tb(exc.__traceback__)))
sub.close()
print(json.dumps({"lengths": lengths[-3:], "errors": len(errors)}), flush=True)
"""


def test_a_lost_remote_subscriber_asked_again_does_not_grow_its_errors_traceback(cluster, env):
    """Each receive of a remote subscriber whose relay is gone raises the same error, with that
    receive's traceback: not one that grew by every earlier receive's frames (and held them)."""
    cluster.publisher(rate=100)
    out = subprocess.run([sys.executable, "-c", _LOST_ASKED_AGAIN, cluster.path], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    line = json.loads(out.stdout.splitlines()[-1])
    assert line["errors"] == 1 and line["lengths"][0] == line["lengths"][-1] <= 20, line


_CLOSE_FROM_A_HANDLER = r'''
import json, signal, sys, time
sys.path.insert(0, "tests/gpu")
import eglcuda
from topics_peer import check
address, where = sys.argv[1], sys.argv[2]
sub = eglcuda.Subscriber("t", remote=address, qos="every")
with sub.receive(10) as first:
    out = {"first": check(first, 5)[0]}
def handler(signum, frame):  # (SIGALRM standing in for SIGINT/SIGTERM)
    started = time.monotonic()
    sub.close()
    out["handler_s"] = time.monotonic() - started
signal.signal(signal.SIGALRM, handler)
started = time.monotonic()
try:
    if where == "receive":  # a receive waiting for the next frame
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        sub.receive(5)
    else:  # a batcher copying, its turn on the subscriber held, as frames come
        batcher = eglcuda.Batcher([sub], batch_size=8, formation_timeout=0.05)
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        try:
            for batch in batcher:
                assert all(f.source == 0 for f in batch.frames)
                out["batches"] = out.get("batches", 0) + 1
        finally:
            batcher.close()
    out["ended"] = "returned"
except eglcuda.EglCudaError as exc:
    out["ended"] = type(exc).__name__
out["call_s"] = time.monotonic() - started
out["closed"] = sub.closed
print(json.dumps(out), flush=True)
'''


@pytest.mark.parametrize("where", ["receive", "batcher"])
def test_close_from_a_signal_handler_on_the_thread_inside_a_call_ends_that_call(cluster, env, where):
    """A signal handler closes a remote subscriber while its thread waits in receive(), or while a
    Batcher holds the subscriber's turn for its copies: the handler returns at once (the link's
    stop does not wait for the call it interrupted), the call ends with ClosedError (the batcher:
    its only source ended) well within a second, and the subscriber is closed."""
    cluster.publisher(rate=2 if where == "receive" else 400)
    _, address = cluster.relay()
    out = subprocess.run([sys.executable, "-c", _CLOSE_FROM_A_HANDLER, address, where], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.splitlines()[-1])
    assert result["first"] and result["closed"], result
    assert result["handler_s"] < 0.5 and result["call_s"] < 1.5, result
    assert result["ended"] in ("ClosedError", "StreamDisconnected"), result
    assert "did not end" not in out.stderr, out.stderr


# A SIGINT handler that Python did not install (an embedding application's, set before the
# interpreter started): signal.signal answers None for it, as simulated here.
_FOREIGN_HANDLER = r'''
import signal, sys, threading, eglcuda
real = signal.signal
def answering_none_for_sigint(number, handler):
    previous = real(number, handler)
    return None if number == signal.SIGINT and previous is signal.default_int_handler else previous
signal.signal = answering_none_for_sigint
relay = eglcuda.Relay("t", "127.0.0.1:0", path=sys.argv[1])
threading.Timer(0.3, relay.close).start()
relay.serve_forever()
print(relay.closed, signal.getsignal(signal.SIGINT) is signal.SIG_DFL, flush=True)
'''


def test_serve_forever_restores_a_handler_python_did_not_install_as_the_default(cluster, env):
    """serve_forever() puts back the SIGINT and SIGTERM handlers it found; one that Python cannot
    name (None) becomes the default action rather than a TypeError after the relay closed."""
    cluster.publisher(rate=100)
    out = subprocess.run([sys.executable, "-c", _FOREIGN_HANDLER, cluster.path], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=120)
    assert (out.returncode, out.stdout.strip()) == (0, "True True"), out.stderr[-2000:]


# A remote subscriber that holds all it may (qos latest: two messages) in a WaitSet, its relay's
# publisher going on at 300 frames/s: the set sleeps; a release makes it report a frame again.
_HOLDING_ALL = r'''
import json, resource, sys, time
sys.path.insert(0, "tests/gpu")
import eglcuda
from topics_peer import check
relay = eglcuda.Relay("t", "127.0.0.1:0", path=sys.argv[1])
sub = eglcuda.Subscriber("t", remote=f"127.0.0.1:{relay.address[1]}", qos="latest")
waits = eglcuda.WaitSet()
waits.attach(sub)
held = []
while len(held) < 2:
    if [e.kind for e in waits.wait(10)] == ["message"]:
        try:
            held.append(sub.receive(0))
        except eglcuda.Timeout:
            pass
def cpu():
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime
spent, started, made, events = cpu(), time.monotonic(), 0, []
while time.monotonic() - started < 1.0:
    events += waits.wait(1.0 - (time.monotonic() - started))
    made += 1
quiet = {"waits": made, "events": [e.kind for e in events], "cpu": cpu() - spent}
try:
    sub.receive(0)
    refused = None
except eglcuda.UsageError as exc:
    refused = str(exc)
held.pop(0).release()
after = [e.kind for e in waits.wait(5)]
with sub.receive(0) as message:
    ok = check(message, 5)[0]
for message in held:
    message.release()
waits.close()
sub.close()
relay.close()
print(json.dumps({"quiet": quiet, "refused": refused, "after": after, "ok": ok}), flush=True)
'''


def test_a_remote_subscriber_holding_all_it_may_leaves_its_wait_set_asleep(cluster, env):
    """A remote subscriber that holds all it may can be handed nothing while frames keep
    arriving: the wait set sleeps (it used to report a "message" at every wait that
    receive(timeout=0) refused: a spin); a release makes it report a frame, every byte right."""
    cluster.publisher(rate=300)
    out = subprocess.run([sys.executable, "-c", _HOLDING_ALL, cluster.path], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    said = json.loads(out.stdout.splitlines()[-1])
    assert said["quiet"]["events"] == [] and said["quiet"]["waits"] <= 3, said
    assert said["quiet"]["cpu"] < 0.2, said
    assert "as many as it may" in said["refused"], said
    assert said["after"] == ["message"] and said["ok"], said


_INTERRUPTED = r"""
import json, signal, sys
sys.path.insert(0, "tests/gpu")
import eglcuda
from topics_peer import check
sub = eglcuda.Subscriber("t", remote=sys.argv[1], qos=sys.argv[2], timeout=10)
out = {}
with sub.receive(5) as message:
    out["first"] = check(message, 5)[0]
# A Ctrl-C on the way out of receive(): the message is the caller's to release only once returned.
signal.signal(signal.SIGALRM, signal.default_int_handler)
remote = sub._remote
refresh = remote._refresh_ready
def interrupted() -> None:
    remote._refresh_ready = refresh
    raise KeyboardInterrupt
remote._ready = remote._ready or object()  # (so that receive() refreshes its readiness on the way out)
remote._refresh_ready = interrupted
try:
    sub.receive(5)
except KeyboardInterrupt:
    out["held_after_interrupt"] = remote.held
remote._ready = None
# Pool slots lost to interrupts that landed between a frame's arrival and its hand-over, all of
# them (frames copied on arrival, into slots free then, still come first):
for _ in range(50):
    with remote._state:
        remote._free_slots.clear()
    try:
        sub.receive(5).release()
    except eglcuda.StreamDisconnected as exc:
        out["no_slot"] = str(exc)
        break
sub.wait_for_publisher(10)  # (as the error says)
with sub.receive(5) as message:
    out["after"] = check(message, 5)[0]
sub.close()
print(json.dumps(out), flush=True)
"""


@pytest.mark.parametrize("qos", ["latest", "every"])
def test_receives_interrupted_halfway_never_leave_a_remote_subscriber_stuck(cluster, env, qos):
    """Ctrl-C (a KeyboardInterrupt from a signal handler, as in a notebook) on the way out of
    receive() leaves no message held that the program never got; and once interrupts that landed
    between a frame's arrival and its hand-over cost the subscriber every pool slot, the error
    says to join again and wait_for_publisher() does (it rejoined nothing: the link was alive)."""
    cluster.publisher(rate=300)
    _, address = cluster.relay("--timeout", "3")
    out = subprocess.run([sys.executable, "-c", _INTERRUPTED, address, qos], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    line = json.loads(out.stdout.splitlines()[-1])
    assert line["first"] is True and line["held_after_interrupt"] == 0, line
    assert "no pool slot is free" in line["no_slot"] and line["after"] is True, line


_CLOSED_HALFWAY = r"""
import json, sys, time
sys.path.insert(0, "tests/gpu")
import eglcuda
from topics_peer import check
sub = eglcuda.Subscriber("t", remote=sys.argv[1], qos="every", timeout=10)
out = {}
with sub.receive(5) as message:
    out["first"] = check(message, 5)[0]
remote = sub._remote
owner = remote if sys.argv[2] == "_views_of" else remote._link
step = getattr(owner, sys.argv[2])
def closed_first(*args):
    # (what a signal handler that closes the subscriber does when it lands just before this step;
    # in the link's take, while that call holds the link's lock, which the engine's thread takes too)
    setattr(owner, sys.argv[2], step)
    started = time.monotonic()
    if owner is remote:
        sub.close()
    else:
        with owner._cond:
            sub.close()
    out["close_s"] = round(time.monotonic() - started, 1)
    return step(*args)
setattr(owner, sys.argv[2], closed_first)
try:
    if sys.argv[3] == "batcher":  # (a Batcher holds the subscriber's turn across its receives)
        with eglcuda.Batcher([sub], batch_size=4, formation_timeout=0.05) as batcher:
            for batch in batcher:
                batch.release()
    else:
        sub.receive(5)
    out["ended"] = "returned"
except Exception as exc:
    out["ended"] = type(exc).__name__
out["closed"], out["held"] = sub.closed, remote.held
print(json.dumps(out), flush=True)
"""


@pytest.mark.parametrize("step, caller", [("_views_of", "receive"), ("take", "receive"), ("_views_of", "batcher")])
def test_a_close_landing_inside_a_receive_returns_at_once_and_ends_the_receive_with_closed_error(
        cluster, env, step, caller):
    """A signal handler on the receiving thread closes the subscriber inside receive(): between a
    frame's arrival and its hand-over (before its view is made), or in the link's take while it
    holds the lock the engine's thread needs to end the link. The handler's close returns at once
    (it waited 10 s for that lock), the receive ends with ClosedError (not an IndexError from a
    pool freed under it), and the subscriber is closed; also inside a Batcher's pass, which holds
    the subscriber's turn across its receives (the batcher ends: its only source did)."""
    cluster.publisher(rate=300)
    _, address = cluster.relay()
    out = subprocess.run([sys.executable, "-c", _CLOSED_HALFWAY, address, step, caller], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    line = json.loads(out.stdout.splitlines()[-1])
    assert line["close_s"] < 1.0, line  # (it waited 10 s for the link's lock)
    # (a batcher whose only source ended says so, as test_close_from_a_signal_handler... expects)
    assert line["ended"] == "ClosedError" or (caller == "batcher" and line["ended"] == "StreamDisconnected"), line
    assert line == {**line, "first": True, "closed": True, "held": 0}, line


_ENDED_CALL = r'''
import gc, json, sys, weakref
sys.path.insert(0, "tests/gpu")
import eglcuda
relay = eglcuda.Relay("t", "127.0.0.1:0", path=sys.argv[1])
sub = eglcuda.Subscriber("t", remote=f"127.0.0.1:{relay.address[1]}", qos=sys.argv[2])
sub.receive(10).release()
relay.close()

class Buffer:  # (stands for what the caller held: a tensor, a large host buffer)
    pass

kept = []

def step():
    work = Buffer()
    kept.append(weakref.ref(work))
    for _ in range(100):
        sub.receive(10).release()

raised = None
try:
    step()
except eglcuda.EglCudaError as exc:
    raised = type(exc).__name__
sub.close()
gc.collect()
print(json.dumps({"raised": raised, "kept": kept[0]() is not None}), flush=True)
'''


@pytest.mark.parametrize("qos", ["latest", "every"])
def test_a_closed_remote_subscriber_keeps_nothing_of_the_call_its_relay_ended(cluster, env, qos):
    """The error that ended a remote subscription (its relay closed) is raised with the frames of
    the caller's chain: once the subscriber is closed it keeps none of them (the caller's buffer
    goes with its function, the subscriber still referenced)."""
    cluster.publisher(rate=300)
    out = subprocess.run([sys.executable, "-c", _ENDED_CALL, cluster.path, qos], env=env, cwd=str(ROOT),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    said = json.loads(out.stdout.splitlines()[-1])
    assert said["raised"] is not None and not said["kept"], said


# A daemon thread of the program closes the relay (a remote subscriber of it connected) as the
# main thread ends: the exit finds that close under way.
_CLOSING_AT_EXIT = r'''
import json, sys, threading, time
import eglcuda
relay = eglcuda.Relay("t", "127.0.0.1:0", path=sys.argv[1])
sub = eglcuda.Subscriber("t", remote=f"127.0.0.1:{relay.address[1]}")
sub.receive(10).release()
threading.Thread(target=relay.close, daemon=True).start()
time.sleep(0.05)
print(json.dumps({"at": time.time()}), flush=True)
'''


def test_an_exit_while_another_thread_closes_the_relay_waits_for_that_close_and_says_nothing(cluster, env):
    """The relay left the exit's list as its close began: the exit stopped the UCX engine under
    that close, whose shutdown was cancelled, and said "relay t: shutting down its connections:"
    (an empty reason) on stderr, every time. The exit now waits for the close under way."""
    cluster.publisher(rate=300)
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", _CLOSING_AT_EXIT, cluster.path], env=env, cwd=str(ROOT),
                             capture_output=True, text=True, timeout=60)
        ended = time.time()
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stderr == "", out.stderr[-2000:]
        assert ended - json.loads(out.stdout.splitlines()[-1])["at"] < 3.0
