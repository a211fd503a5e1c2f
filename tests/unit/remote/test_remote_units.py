"""The remote layer without a network: keys, the wire format's checks, the missing-ucxx line."""
from __future__ import annotations

import os
import random
import subprocess
import sys
import time

import pytest

import eglcuda
from eglcuda.errors import UsageError
from eglcuda.remote import keys, wire
from eglcuda.remote.session import AuthenticationFailed, FrameMode, Handshake
from eglcuda.topics.protocol import Qos

from ... import remote_extra
from .conftest import ROOT


def test_keys_from_argument_file_and_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(keys.KEY_FILE_VARIABLE, raising=False)
    monkeypatch.delenv(keys.KEY_VARIABLE, raising=False)
    monkeypatch.setattr(keys, "_from_environment", None)
    with pytest.raises(UsageError, match="EGLCUDA_REMOTE_KEY_FILE.*EGLCUDA_REMOTE_KEY"):
        keys.load_key(None)
    secret = os.urandom(32)
    assert keys.load_key(secret) == secret
    with pytest.raises(UsageError):
        keys.load_key(b"short")
    with pytest.raises(UsageError):
        keys.load_key("a text key")  # type: ignore[arg-type]
    monkeypatch.setenv(keys.KEY_VARIABLE, secret.hex())
    assert keys.load_key(None) == secret
    # Read once, the variable leaves the environment (children do not inherit it); this process keeps it.
    assert keys.KEY_VARIABLE not in os.environ
    assert keys.load_key(None) == secret
    monkeypatch.setenv(keys.KEY_VARIABLE, "not hex at all, not hex at all")
    with pytest.raises(UsageError, match="hex"):
        keys.load_key(None)
    path = tmp_path / "key"
    path.write_bytes(secret + b"\n")
    path.chmod(0o644)
    monkeypatch.setenv(keys.KEY_FILE_VARIABLE, str(path))
    with pytest.raises(UsageError, match="read by others"):  # the file wins over the hex variable
        keys.load_key(None)
    path.chmod(0o600)
    assert keys.load_key(None) == secret
    # A file named by the variable that is refused says where its name came from; a link to the
    # key says it is a link (O_NOFOLLOW's "too many levels of symbolic links" said neither).
    link = tmp_path / "link"
    link.symlink_to(path)
    monkeypatch.setenv(keys.KEY_FILE_VARIABLE, str(link))
    with pytest.raises(UsageError, match=f"^{keys.KEY_FILE_VARIABLE}: key file {link} is a symbolic link: name"):
        keys.load_key(None)
    with pytest.raises(UsageError, match=f"^key file {link} is a symbolic link"):
        keys.read_key_file(str(link))
    monkeypatch.setenv(keys.KEY_FILE_VARIABLE, str(tmp_path / "missing"))
    with pytest.raises(UsageError, match=f"^{keys.KEY_FILE_VARIABLE}: key file .*missing: No such file"):
        keys.load_key(None)


def test_wire_round_trips_and_refuses_what_it_does_not_allow():
    pytest.importorskip("cryptography", reason="pyca/cryptography is not installed: pip install -e '.[remote-cu12]' in a checkout")
    key = keys.noise_psk(os.urandom(32))
    first = wire.encode_relay()
    sub, relay = Handshake.initiator(key, wire.prologue(first)), Handshake.responder(key, wire.prologue(first))
    hello = wire.Hello(Qos.EVERY, 7, "cam.front", 1234, "host-a\x1b[2J")
    data = wire.encode_hello(sub, hello)
    assert len(data) == wire.HANDSHAKE
    kind, body = wire.handshake_kind(data)
    assert kind is wire.Kind.HELLO
    assert wire.decode_hello(relay, body) == wire.Hello(Qos.EVERY, 7, "cam.front", 1234, "host-a?[2J")
    assert b"cam.front" not in data and b"host-a" not in data  # (sealed: the topic does not travel in the clear)
    wire.decode_accept(sub, wire.handshake_kind(wire.encode_accept(relay))[1])
    relay_session, sub_session = relay.split(), sub.split()
    assert wire.decode_confirm(relay_session, wire.handshake_kind(wire.encode_confirm(sub_session))[1])
    welcome = wire.Welcome(1920, 1080, eglcuda.ColorFormat.NV12, 4, 8, 99, 5, 17, None,
                           wire.frame_bytes(eglcuda.ColorFormat.NV12, 1920, 1080), FrameMode.ENCRYPTED, os.urandom(32))
    assert welcome.frame_bytes == 1920 * 1080 * 3 // 2
    sealed = wire.encode_welcome(relay_session, welcome)
    assert wire.decode_welcome(sub_session, wire.handshake_kind(sealed)[1]) == welcome
    with pytest.raises(AuthenticationFailed):  # the same WELCOME again: its nonce is used
        wire.decode_welcome(sub_session, wire.handshake_kind(sealed)[1])
    with pytest.raises(wire.WireError, match="not an eglcuda"):
        wire.handshake_kind(b"X" * wire.HANDSHAKE)
    with pytest.raises(wire.WireError):
        wire.handshake_kind(b"\0" * (wire.HANDSHAKE - 1))
    old = bytearray(first)
    old[8] = 3
    with pytest.raises(wire.WireError, match="version 3, this side speaks 4"):
        wire.handshake_kind(old)
    note = wire.encode_note(relay_session, wire.Head.GONE, 3, "closing\x07", 9)
    assert len(note) == wire.NOTE
    assert wire.decode_note(sub_session, note) == (wire.Head.GONE, 9, 3, "closing?")
    with pytest.raises(AuthenticationFailed):  # replayed
        wire.decode_note(sub_session, note)
    frame = bytearray(wire.HEADER)
    frame[:4] = b"ECRH"
    frame[4] = int(wire.Head.FRAME)
    frame[24:28] = (wire.DATA_AT).to_bytes(4, "little")  # a payload longer than a frame may carry
    with pytest.raises(wire.WireError, match="length"):
        wire.decode_header(frame)
    with pytest.raises(wire.WireError, match="credit"):
        wire.decode_control(relay_session, wire.encode_control(sub_session, wire.Control.CREDIT, wire.MAX_WINDOW + 1))
    credit = wire.encode_control(sub_session, wire.Control.CREDIT, 2)
    assert len(credit) == wire.CONTROL
    assert wire.decode_control(relay_session, credit) == (wire.Control.CREDIT, 2)


@pytest.mark.parametrize("seed", range(4))
def test_a_latest_window_is_deeper_for_small_frames_and_bounded_in_bytes(seed):
    rng = random.Random(seed)
    nv12 = eglcuda.ColorFormat.NV12
    assert wire.latest_window(wire.frame_bytes(nv12, 320, 240)) == wire.MAX_WINDOW
    assert wire.latest_window(wire.frame_bytes(nv12, 1920, 1080)) == wire.LATEST_WINDOW
    for _ in range(200):
        size = wire.frame_bytes(nv12, 2 * rng.randint(1, 2048), 2 * rng.randint(1, 2048))
        window = wire.latest_window(size)
        assert wire.LATEST_WINDOW <= window <= wire.MAX_WINDOW
        if window > wire.LATEST_WINDOW:  # (beyond the fewest, a deeper window stays within its bytes)
            assert window * wire.message_bytes(size) <= wire.LATEST_WINDOW_BYTES


def test_local_subscriber_refuses_a_key_without_remote():
    with pytest.raises(UsageError, match="key needs remote"):
        eglcuda.Subscriber("t", key=b"0123456789abcdef0123")
    assert issubclass(eglcuda.RemoteSubscriber, eglcuda.Subscriber)


def test_the_remote_arguments_need_remote_and_subscriber_picks_no_class():
    with pytest.raises(UsageError, match="needs remote='HOST:PORT'"):
        eglcuda.Subscriber("t", frames="encrypted")
    with pytest.raises(UsageError, match="needs remote='HOST:PORT'"):
        eglcuda.RemoteSubscriber("t")
    # Subscriber(remote=...) is a Subscriber holding a remote feed: no class is chosen at construction.
    assert eglcuda.Subscriber.__new__ is object.__new__


_NO_UCXX = ("import sys; sys.modules['ucxx'] = None\n"
            "import eglcuda\n"
            "print(eglcuda.remote.ucxx_missing())\n"
            "try:\n"
            "    eglcuda.Relay('t')\n"
            "except eglcuda.Unsupported as exc:\n"
            "    print('Unsupported:', exc)\n")


def test_without_ucxx_one_line_says_what_to_install(tmp_path):
    # (cwd outside the checkout: `python -m` and `-c` put the cwd first on sys.path, and CI runs
    # this against the installed package while the checkout's eglcuda has no built extensions)
    out = subprocess.run([sys.executable, "-c", _NO_UCXX], capture_output=True, text=True, cwd=str(tmp_path), timeout=60)
    lines = out.stdout.splitlines()
    assert "pip install -e '.[remote-cu12]'" in lines[0] and "remote-cu13" in lines[0], out
    # (the remote extra brings ucxx and pyca/cryptography: the first missing one is named)
    assert lines[1].startswith(("Unsupported: ucxx is not available", "Unsupported: cryptography is not available")), out
    assert "remote-cu12" in lines[1], out
    # The CLI exits 2 with that line (sitecustomize-free: a ucxx that fails to import).
    shim = ROOT / "tests" / "unit" / "remote" / "no_ucxx"
    env = {**os.environ, "PYTHONPATH": f"{shim}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "EGLCUDA_REMOTE_KEY": "00" * 16}
    out = subprocess.run([sys.executable, "-m", "eglcuda", "relay", "t"], capture_output=True, text=True,
                         cwd=str(tmp_path), env=env, timeout=60)
    assert out.returncode == 2, out
    assert len(out.stderr.strip().splitlines()) == 1 and "remote-cu12" in out.stderr, out.stderr


def test_the_progress_mode_is_read_from_the_environment(monkeypatch):
    from eglcuda.remote import _ucx
    monkeypatch.delenv("EGLCUDA_UCX_PROGRESS", raising=False)
    assert _ucx.progress_mode() == "thread"
    monkeypatch.setenv("EGLCUDA_UCX_PROGRESS", "loop")
    assert _ucx.progress_mode() == "loop"
    monkeypatch.setenv("EGLCUDA_UCX_PROGRESS", "polling")
    with pytest.raises(UsageError, match="EGLCUDA_UCX_PROGRESS is one of thread, loop, got 'polling'"):
        _ucx.progress_mode()


def test_peer_sent_text_reaches_exceptions_without_control_characters():
    """A relay's refusal (and a subscriber's label) is the peer's word: no newline, escape or
    other control character of it reaches an exception's text or a log line."""
    hostile = "refused\n\x1b[2J\x1b]0;owned\x07\r\x00 tail \u202e"
    body = wire.expect(wire.encode_refuse(5, hostile), wire.Kind.REFUSE)
    code, reason = wire.decode_refuse(body)
    assert code == 5 and reason.startswith("refused?") and reason.endswith(" tail ?")
    assert all(c.isprintable() for c in reason), repr(reason)
    with pytest.raises(eglcuda.Refused) as caught:
        wire.expect(wire.encode_refuse(5, hostile), wire.Kind.HELLO, refusal=True)
    assert all(c.isprintable() for c in str(caught.value)), repr(str(caught.value))
    assert wire.peer_text(b"\xff\xfeok\x7f") == "??ok?"


def test_the_relay_status_file_never_follows_a_link_planted_beside_it(tmp_path):
    """Links planted where the relay writes its status (the file, and a temporary name beside it
    as older versions used) are replaced or left alone, never written through."""
    from eglcuda.topics import registry

    victim = tmp_path / "victim"
    victim.write_text("precious")
    path = registry.relay_status_path(str(tmp_path / "t.topic"), 1234)
    os.symlink(victim, path)
    os.symlink(victim, path + ".tmp")
    registry.write_relay_status(path, {"version": 1, "pid": 1234, "remotes": []})
    assert victim.read_text() == "precious"
    assert not os.path.islink(path) and '"pid": 1234' in open(path).read()
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()] == []


@pytest.mark.parametrize("remote, why", [
    ("127.0.0.1:0", "port of 1..65535"),  # (port 0 is for listening: a subscriber waited its timeout on it)
    ("127.0.0.1:+5555", "port of 1..65535"), ("127.0.0.1: 5555", "port of 1..65535"),
    ("127.0.0.1:\uff15\uff15\uff15\uff15", "port of 1..65535"),  # (full-width digits, which int() takes)
    ("127.0.0.1\x00:5555", "host name or address"),  # (UCX's C string ended at the NUL: 127.0.0.1)
    ("127.0.0 .1:5555", "host name or address"), ("\n:5555", "host name or address"),
    # (a host with a ':' that is no IPv6 address: "'127.0.0.1:5555' is an IPv6 address")
    ("127.0.0.1:5555:6666", "host name or address"), ("relayhost:5555:6666", "host name or address"),
    # (names the resolver's IDNA step refuses: a traceback from the lookup thread, then the whole timeout)
    ("relay..example:5555", "no valid host name"), ("x" * 64 + ".example:5555", "no valid host name"),
    (".:5555", "no valid host name"),
])
def test_a_malformed_remote_address_is_refused_before_any_connection(remote, why):
    started = time.monotonic()
    with pytest.raises(UsageError, match=why):
        eglcuda.Subscriber("t", remote=remote, key=os.urandom(32), timeout=30)
    assert time.monotonic() - started < 1


@pytest.mark.parametrize("busy_wait", [1e9, 0.5, -1, float("nan"), True])
def test_a_remote_subscribers_busy_wait_is_checked_as_a_local_ones(busy_wait):
    """busy_wait is refused out of range for a remote subscriber too (it was taken unchecked
    beyond the local bound), before any connection."""
    started = time.monotonic()
    with pytest.raises(UsageError, match="busy_wait"):
        eglcuda.Subscriber("t", remote="127.0.0.1:9", key=os.urandom(32), timeout=30, busy_wait=busy_wait)
    assert time.monotonic() - started < 1


def test_a_relay_listens_on_port_0_a_subscriber_connects_to_1_and_up():
    assert wire.parse_address("127.0.0.1:0", "listen", least_port=0) == ("127.0.0.1", 0)
    assert wire.parse_address("[::1]:65535", "remote") == ("::1", 65535)
    with pytest.raises(UsageError, match="1..65535"):
        wire.parse_address("127.0.0.1:0", "remote")
    with pytest.raises(UsageError, match="0..65535"):
        wire.parse_address("127.0.0.1:65536", "listen", least_port=0)
    with pytest.raises(UsageError, match="host name or address"):
        wire.parse_address("127.0.0.1:5555:6666", "listen", least_port=0)
    assert wire.parse_address("fe80::1%lo:5000", "remote") == ("fe80::1%lo", 5000)
    assert wire.parse_address("relay.example.:5000", "remote") == ("relay.example.", 5000)


@pytest.mark.parametrize("listen", ["relay..example:0", "x" * 64 + ":0", ".:0"])
def test_a_relay_refuses_a_malformed_host_name_as_a_usage_error(listen):
    # (the resolver's IDNA step raised a bare UnicodeError from Relay(), a traceback from the command)
    pytest.importorskip("cryptography", reason="pyca/cryptography is not installed: pip install -e '.[remote-cu12]' in a checkout")
    with pytest.raises(UsageError, match="no valid host name"):
        eglcuda.Relay("t", listen, key=os.urandom(32), timeout=30)


_EXIT_ORDER = r'''
import threading, time
from eglcuda.remote import _ucx
closed = []
class Open:
    def __init__(self, name, seconds): self.name, self.seconds = name, seconds
    def close(self):
        time.sleep(self.seconds)
        closed.append(self.name)
objects = [Open("relay-a", 0.01), Open("remote-1", 0), Open("relay-b", 0.01), Open("remote-2", 0)]
for obj in objects:
    _ucx.track(obj, turn=1 if obj.name.startswith("relay") else 0)
_ucx.untrack(objects[3])
_ucx._at_exit()
print(sorted(closed[:1]) + sorted(closed[1:]))
'''


def test_the_exit_closes_remote_subscribers_before_relays():
    # (A relay closed first waits for its remotes to take its goodbye: 1.5 s for one of this process.)
    out = subprocess.run([sys.executable, "-c", _EXIT_ORDER], capture_output=True, text=True, cwd=str(ROOT),
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[0] == "['remote-1', 'relay-a', 'relay-b']", out.stdout


def test_a_relay_refuses_an_ipv6_address_it_could_take_no_connection_on():
    # (UCXX's listener binds 0.0.0.0: a relay told '::1' took no connection, its remotes timed out)
    pytest.importorskip("ucxx", reason="ucxx is not installed: pip install -e '.[remote-cu12]' (or remote-cu13)")
    from eglcuda.remote import _ucx

    for host in ("::1", "fe80::1"):
        with pytest.raises(UsageError, match="IPv6 address.*IPv4 connections only"):
            _ucx.host_ip(host)
    assert _ucx.host_ip("::") is None and _ucx.host_ip("0.0.0.0") is None
    # (other spellings of 0.0.0.0 listen on every address too: taken as one address, a relay
    # closed every connection, none of which is made to 0.0.0.0)
    assert _ucx.host_ip("0") is None and _ucx.host_ip("0.0") is None
    assert _ucx.host_ip("127.0.0.1") == "127.0.0.1"
    started = time.monotonic()
    with pytest.raises(UsageError, match="IPv6 address"):  # (before it waits for a publisher)
        eglcuda.Relay("t", "[::1]:0", key=os.urandom(32), timeout=30)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("remote", ["[::1]:38773", "::1:38773", "[fe80::1%lo]:5000"])
def test_a_remote_subscriber_refuses_an_ipv6_relay_address_at_once(remote):
    # (a relay takes IPv4 connections only: such a subscriber waited out its whole timeout)
    pytest.importorskip("ucxx", reason="ucxx is not installed: pip install -e '.[remote-cu12]' (or remote-cu13)")
    started = time.monotonic()
    with pytest.raises(UsageError, match="IPv6 address.*IPv4 connections only"):
        eglcuda.Subscriber("t", remote=remote, key=os.urandom(32), timeout=30)
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("args, why", [
    ((), "the following arguments are required: name"),
    (("t", "--qos", "sometimes"), "argument --qos: invalid choice: 'sometimes'"),
    (("t", "--frames", "secret"), "argument --frames: invalid choice: 'secret'"),
    (("t", "--queue", "four"), "argument --queue: invalid int value: 'four'"),
    (("t", "--timeout", "soon"), "argument --timeout: invalid float value: 'soon'"),
    (("t", "--listen", "127.0.0.1:0", "--no-such-option"), "unrecognized arguments: --no-such-option"),
    (("t", "u"), "unrecognized arguments: u"),
])
def test_cli_relay_misuse_is_one_line_naming_the_command_and_status_2(args, why):
    # (argparse printed its usage block, eight lines, and an unknown option under 'python -m eglcuda')
    out = subprocess.run([sys.executable, "-m", "eglcuda", "relay", *args], capture_output=True, text=True,
                         cwd=str(ROOT), timeout=60)
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"python -m eglcuda relay: {why}"), lines


# A process given EGLCUDA_REMOTE_KEY makes a remote subscriber whose key comes from elsewhere,
# then starts a child: does the child see the hex key?
_INHERITED = r'''
import os, subprocess, sys
import eglcuda
from eglcuda.remote import keys
source = sys.argv[1]
if source == "file":
    os.environ[keys.KEY_FILE_VARIABLE] = sys.argv[2]
try:
    eglcuda.Subscriber("t", remote="127.0.0.1:9", key=os.urandom(32) if source == "key=" else None, timeout=0.2)
except eglcuda.Timeout:
    pass
child = subprocess.run(["sh", "-c", "echo ${EGLCUDA_REMOTE_KEY:-unset}"], capture_output=True, text=True)
os.environ.pop(keys.KEY_FILE_VARIABLE, None)
print(child.stdout.strip(), keys.load_key(None).hex())  # (still this process's key once the file is gone)
'''


@pytest.mark.parametrize("source", ["key=", "file"])
def test_the_hex_key_leaves_the_environment_also_when_another_key_is_used(source, fake_env, tmp_path):
    # EGLCUDA_REMOTE_KEY left os.environ only when it was the key used: with key= or
    # EGLCUDA_REMOTE_KEY_FILE, every child process inherited it.
    from .conftest import UCX_ENV

    remote_extra.skip_without()
    path = tmp_path / "k"
    keys.write_new_key(str(path))
    hex_key = os.urandom(32).hex()
    env = {**fake_env, **UCX_ENV, keys.KEY_VARIABLE: hex_key, keys.KEY_FILE_VARIABLE: ""}
    done = subprocess.run([sys.executable, "-c", _INHERITED, source, str(path)], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["unset", hex_key], done.stdout


# UCX that cannot start (no usable transport): what a remote subscriber raises, twice in one process.
_NO_TRANSPORT = r'''
import os
import eglcuda
for _ in range(2):
    try:
        eglcuda.Subscriber("t", remote="127.0.0.1:9", key=os.urandom(32), timeout=1)
    except Exception as exc:
        print(f"{type(exc).__module__}.{type(exc).__name__}: {exc}", flush=True)
'''


def test_ucx_that_cannot_start_is_an_eglcuda_error_naming_ucx(fake_env):
    # (UCXX's own UCXXNoDeviceError reached the caller, and a relay's command printed its traceback)
    from .conftest import UCX_ENV

    remote_extra.skip_without()
    env = {**fake_env, **UCX_ENV, "UCX_TLS": "no-such-transport", "UCX_LOG_LEVEL": "fatal", keys.KEY_FILE_VARIABLE: ""}
    out = subprocess.run([sys.executable, "-c", _NO_TRANSPORT], env=env, cwd=str(ROOT), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert len(lines) == 2, out.stdout
    for line in lines:
        assert line.startswith("eglcuda.errors.EglCudaError: UCX could not start"), line
        assert "UCXXNoDeviceError" in line and "UCX_TLS" in line, line


_FIRST_JOIN = r'''
import os, socket, threading, time
import eglcuda
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen(8)
held = []
threading.Thread(target=lambda: [held.append(server.accept()) for _ in iter(int, 1)], daemon=True).start()
for _ in range(2):
    started = time.monotonic()
    try:
        eglcuda.Subscriber("t", remote=f"127.0.0.1:{server.getsockname()[1]}", key=os.urandom(32), timeout=0.5)
    except eglcuda.Timeout as exc:
        print(round(time.monotonic() - started, 3), "within 0.5 s" in str(exc))
'''


def test_a_remote_subscriber_that_cannot_join_says_the_whole_time_it_was_given(fake_env):
    """In a fresh interpreter, the first remote subscriber (which imports UCXX and starts the
    engine first, about half a second that its timeout does not count) and the next one time out
    after their timeout and say that time (the first said the time left after the start)."""
    pytest.importorskip("ucxx", reason="ucxx is not installed: pip install -e '.[remote-cu12]' (or remote-cu13)")
    pytest.importorskip("cryptography", reason="pyca/cryptography is not installed: pip install -e '.[remote-cu12]'")
    env = {**fake_env, "UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n",
           "UCX_MODULES": "^cuda"}
    done = subprocess.run([sys.executable, "-c", _FIRST_JOIN], env=env, cwd=str(ROOT), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line.split() for line in done.stdout.splitlines()]
    assert len(lines) == 2 and all(said == "True" for _, said in lines), done.stdout
    assert 0.45 <= float(lines[1][0]) <= 0.7 and float(lines[0][0]) >= 0.45, done.stdout
