"""The remote session without a network: the Noise handshake against published test vectors, what
the session refuses (another key, tampering, replay, reordering), the frame seal, and keys."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("cryptography", reason="pyca/cryptography is not installed: pip install -e '.[remote-cu12]' in a checkout")
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey  # noqa: E402
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305  # noqa: E402

from eglcuda.errors import UsageError  # noqa: E402
from eglcuda.remote import keys, wire  # noqa: E402
from eglcuda.remote.session import AuthenticationFailed, FrameMode, Handshake, Session  # noqa: E402

from .conftest import ROOT  # noqa: E402

VECTORS = ROOT / "tests" / "data" / "noise_nnpsk0_vectors.json"


def _pair(key: bytes, other: bytes | None = None, prologue: bytes = b"p") -> tuple[Session, Session]:
    sub = Handshake.initiator(keys.noise_psk(key), prologue)
    relay = Handshake.responder(keys.noise_psk(key if other is None else other), prologue)
    relay.read_message(sub.write_message(b"hello"))
    sub.read_message(relay.write_message(b""))
    return sub.split(), relay.split()


def test_the_handshake_matches_the_published_noise_vectors():
    """Noise_NNpsk0_25519_ChaChaPoly_SHA256 from the cacophony vectors: both handshake messages, the
    handshake hash, and the transport messages under Split()'s keys, byte for byte."""
    data = json.loads(VECTORS.read_text())
    assert data["vectors"]
    for vector in data["vectors"]:
        h = bytes.fromhex
        initiator = Handshake.initiator(h(vector["init_psks"][0]), h(vector["init_prologue"]),
                                        X25519PrivateKey.from_private_bytes(h(vector["init_ephemeral"])))
        responder = Handshake.responder(h(vector["resp_psks"][0]), h(vector["resp_prologue"]),
                                        X25519PrivateKey.from_private_bytes(h(vector["resp_ephemeral"])))
        messages = vector["messages"]
        sent = initiator.write_message(h(messages[0]["payload"]))
        assert sent.hex() == messages[0]["ciphertext"]
        assert responder.read_message(sent) == h(messages[0]["payload"])
        sent = responder.write_message(h(messages[1]["payload"]))
        assert sent.hex() == messages[1]["ciphertext"]
        assert initiator.read_message(sent) == h(messages[1]["payload"])
        assert initiator.handshake_hash.hex() == responder.handshake_hash.hex() == vector["handshake_hash"]
        to_responder, to_initiator = initiator.split(), responder.split()
        # Noise's own transport messages (one CipherState per direction, nonces 0, 1, ...): the
        # split keys are the vectors'; Session then derives its channels from them.
        counters = {True: 0, False: 0}
        for i, message in enumerate(messages[2:]):
            from_initiator = i % 2 == 0
            key = (to_responder if from_initiator else to_initiator)._sending
            nonce = b"\0\0\0\0" + counters[from_initiator].to_bytes(8, "little")
            counters[from_initiator] += 1
            assert ChaCha20Poly1305(key).encrypt(nonce, h(message["payload"]), b"").hex() == message["ciphertext"]


@pytest.mark.parametrize("change", ["other", "plus_nul", "truncated", "prologue"])
def test_another_key_or_prologue_never_authenticates(change):
    key = os.urandom(32)
    other = {"other": os.urandom(32), "plus_nul": key + b"\0", "truncated": key[:-1], "prologue": key}[change]
    sub = Handshake.initiator(keys.noise_psk(key), b"p")
    relay = Handshake.responder(keys.noise_psk(other), b"q" if change == "prologue" else b"p")
    with pytest.raises(AuthenticationFailed):
        relay.read_message(sub.write_message(b"hello"))
    assert keys.noise_psk(key) != keys.noise_psk(key + b"\0") != keys.noise_psk(key[:-1])


def test_the_relay_answers_nothing_keyed_to_a_peer_without_the_key():
    """A peer without the key: its first message does not open, and the relay's handshake cannot
    be moved on (nothing to answer that a guess could be checked against)."""
    relay = Handshake.responder(keys.noise_psk(os.urandom(32)), b"p")
    with pytest.raises(AuthenticationFailed):
        relay.read_message(Handshake.initiator(keys.noise_psk(os.urandom(32)), b"p").write_message(b"x"))
    with pytest.raises(AuthenticationFailed):
        relay.read_message(os.urandom(80))
    # What such a peer gets from a relay: its first message and a refusal, the same bytes for everyone.
    assert wire.encode_relay() == wire.encode_relay()
    assert wire.encode_refuse(1, "x") == wire.encode_refuse(1, "x")


def test_a_recorded_first_message_played_again_gets_a_session_it_cannot_use():
    key = os.urandom(32)
    sub = Handshake.initiator(keys.noise_psk(key), b"p")
    first = sub.write_message(b"hello")
    real = Handshake.responder(keys.noise_psk(key), b"p")
    real.read_message(first)
    sub.read_message(real.write_message(b""))
    genuine = sub.split()
    replayed = Handshake.responder(keys.noise_psk(key), b"p")  # (the attacker plays `first` to the relay again)
    assert replayed.read_message(first) == b"hello"
    replayed.write_message(b"")
    relay_side = replayed.split()
    # The attacker does not hold the initiator's ephemeral key: what the genuine session seals
    # (or anything else) does not open in the replayed one.
    with pytest.raises(AuthenticationFailed):
        relay_side.open("handshake", genuine.seal("handshake", b"ready"))


def test_channels_refuse_tampering_replay_reordering_and_other_sessions():
    key = os.urandom(32)
    sub, relay = _pair(key)
    a, b, c = (sub.seal("control", bytes([i]) * 32) for i in range(3))
    assert relay.open("control", a) == bytes(32)
    with pytest.raises(AuthenticationFailed):
        relay.open("control", a)  # replayed
    with pytest.raises(AuthenticationFailed):
        relay.open("control", c)  # reordered (b not yet)
    altered = bytearray(b)
    altered[3] ^= 1
    with pytest.raises(AuthenticationFailed):
        relay.open("control", bytes(altered))
    with pytest.raises(AuthenticationFailed):
        relay.open("note", b)  # another channel
    other_sub, _ = _pair(key)
    with pytest.raises(AuthenticationFailed):
        relay.open("control", other_sub.seal("control", bytes([1]) * 32))  # another connection's, same key
    assert relay.open("control", b) == bytes([1]) * 32  # (refusals moved nothing on)
    assert relay.open("control", c) == bytes([2]) * 32
    assert sub.tag_prefix(receiving=True) == relay.tag_prefix(receiving=False)
    assert sub.tag_prefix(receiving=False) == relay.tag_prefix(receiving=True)
    assert sub.tag_prefix(True) != sub.tag_prefix(False) != other_sub.tag_prefix(False)


def test_frame_modes_are_named_in_any_case_as_qos_is():
    """``frames="PLAIN"`` was refused where ``qos="LATEST"`` and ``format="nv12"`` are taken."""
    from eglcuda.remote.session import frame_mode

    for name, mode in (("plain", FrameMode.PLAIN), ("PLAIN", FrameMode.PLAIN), ("Integrity", FrameMode.INTEGRITY),
                       ("ENCRYPTED", FrameMode.ENCRYPTED)):
        assert frame_mode(name) is mode
    for bad in ("", "plain ", "sealed", None, 0, FrameMode.PLAIN):
        with pytest.raises(UsageError, match="frames is one of plain, integrity, encrypted"):
            frame_mode(bad)


@pytest.mark.parametrize("mode", list(FrameMode))
def test_frame_seal_modes(mode):
    rng = np.random.default_rng(int(mode))
    frame_size = 64 * 48 * 3 // 2
    key = os.urandom(32)
    relay, sub = wire.frame_seal(key, mode), wire.frame_seal(key, mode)
    message = np.zeros(wire.message_bytes(frame_size), np.uint8)
    data = rng.integers(0, 256, frame_size, dtype=np.uint8)
    wire.pack_frame(message, 7, 123, b"meta")
    message[wire.DATA_AT:wire.DATA_AT + frame_size] = data
    first = relay.seal(message)
    if mode is FrameMode.ENCRYPTED:
        assert not np.array_equal(message[wire.DATA_AT:wire.DATA_AT + frame_size], data)
    received = message.copy()
    assert sub.open(received) == first
    assert wire.decode_header(received)[:4] == (wire.Head.FRAME, 7, 123, 4)
    assert np.array_equal(received[wire.DATA_AT:wire.DATA_AT + frame_size], data)
    for at in (9, wire.HEADER + 1, wire.DATA_AT + 5):  # the header, the payload, the frame's bytes
        altered = message.copy()
        altered[at] ^= 1
        if at >= wire.DATA_AT and mode is FrameMode.PLAIN:
            sub.open(altered)  # (plain: the frame's bytes are not covered)
            continue
        with pytest.raises(AuthenticationFailed):
            sub.open(altered)
    with pytest.raises(AuthenticationFailed):  # under another key
        wire.frame_seal(os.urandom(32), mode).open(message.copy())
    assert relay.seal(message) > first  # (the counter grows: a frame played again is found by it, link.py)


def test_weak_keys_are_refused_with_the_reason():
    for key, why in [(b"\0" * 32, "one byte value"), (b"correct horse battery staple!!", "text"),
                     (os.urandom(32).hex().encode(), "text"), (bytes(range(32)), "counting"),
                     (b"\x01\x92\xff\x80" * 8, "repeats"), (os.urandom(15), "16..4096"),
                     (bytes([1, 2, 200]) * 5 + b"\x90\x91\x92", "different byte values")]:
        with pytest.raises(UsageError, match=why):
            keys.check_key(key, "key=")
    assert keys.check_key(b"\xff" + os.urandom(31), "key=")


def test_keygen_writes_a_new_private_key_and_never_overwrites(tmp_path):
    path = tmp_path / "camera.key"
    run = [sys.executable, "-m", "eglcuda", "keygen", str(path)]
    done = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    info = path.stat()
    assert stat.S_IMODE(info.st_mode) == 0o600 and info.st_uid == os.geteuid()
    key = path.read_bytes()
    assert len(key) == 32 and keys.read_key_file(str(path)) == key
    again = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "exists" in again.stderr and path.read_bytes() == key
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    refused = subprocess.run([sys.executable, "-m", "eglcuda", "keygen", str(shared / "k")], capture_output=True,
                             text=True, timeout=60)
    assert refused.returncode == 2 and "others may write" in refused.stderr and not (shared / "k").exists()
    empty = subprocess.run([sys.executable, "-m", "eglcuda", "keygen", ""], capture_output=True, text=True, timeout=60)
    assert empty.returncode == 2 and empty.stderr.splitlines() == [
        "python -m eglcuda keygen: the key file's path is empty or not a path: ''"], empty.stderr


def test_a_key_file_in_a_folder_others_may_write_is_refused(tmp_path):
    folder = tmp_path / "keys"
    folder.mkdir()
    keys.write_new_key(str(folder / "k"))
    folder.chmod(0o770)
    with pytest.raises(UsageError, match="others may write"):
        keys.read_key_file(str(folder / "k"))
    folder.chmod(0o700)
    assert len(keys.read_key_file(str(folder / "k"))) == 32


def test_a_new_key_reads_back_whole_even_when_random_bytes_end_in_a_newline(tmp_path, monkeypatch):
    # read_key_file drops one trailing newline (a hand-written key's): a key keygen drew ending
    # in one read back a byte short, once in 256 keys.
    first = bytes.fromhex("a54dca182530bb1d6d132cded6237b2ed91e3f721fcb1971174494d6493c9d") + b"\n"
    second = bytes.fromhex("5c3460be31201e69fedaa0eee8b9997f5c7c2999fdafe593253cd654af4dfad7")
    drawn = [first, second]
    monkeypatch.setattr(keys.secrets, "token_bytes", lambda n: drawn.pop(0))
    keys.write_new_key(str(tmp_path / "k"))
    assert keys.read_key_file(str(tmp_path / "k")) == second


def test_the_frame_seal_bench_prints_each_mode(tmp_path):
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "frame_seal.py"), "--sizes", "1080p-nv12", "--repeat",
                           "2"], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    for mode in ("plain", "integrity", "encrypted"):
        assert f"| 1080p-nv12 | frames={mode}: seal + open |" in done.stdout


def test_a_key_file_that_is_a_fifo_is_refused_at_once(tmp_path):
    # Opening a FIFO for reading waits for a writer: EGLCUDA_REMOTE_KEY_FILE or --key-file naming
    # one hung the relay or the subscriber for ever, before the check that a key file is regular.
    fifo = tmp_path / "k"
    os.mkfifo(fifo, 0o600)
    read = ("import sys; from eglcuda.errors import UsageError; from eglcuda.remote import keys\n"
            "try:\n    keys.read_key_file(sys.argv[1])\nexcept UsageError as exc:\n    print(exc)")
    done = subprocess.run([sys.executable, "-c", read, str(fifo)], capture_output=True, text=True, timeout=30,
                          cwd=str(ROOT))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"key file {fifo} is not a regular file", done.stdout


def test_a_key_file_holding_hex_text_is_refused_saying_it_holds_hex(tmp_path):
    # `echo $HEX > relay.key` (the form EGLCUDA_REMOTE_KEY takes) was refused as "text (a password
    # or hex), which a dictionary can guess": a hex key of random bytes is no guess, the file only
    # holds the key in the wrong form, and nothing said how to turn it into the right one.
    from ... import remote_extra

    remote_extra.skip_without()
    path = tmp_path / "relay.key"
    path.write_text(os.urandom(32).hex() + "\n")
    path.chmod(0o600)
    env = {**os.environ, "EGLCUDA_REMOTE_KEY_FILE": "", "EGLCUDA_REMOTE_KEY": ""}
    done = subprocess.run([sys.executable, "-m", "eglcuda", "relay", "camera", "--key-file", str(path)], env=env,
                          capture_output=True, text=True, timeout=60, cwd=str(ROOT))
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"python -m eglcuda relay: key file {path} holds hex text (64 hex digits): a key file holds the key's "
        f"bytes themselves; convert it with 'xxd -r -p {path} > NEWFILE', or give the hex in EGLCUDA_REMOTE_KEY"], \
        done.stderr


@pytest.mark.parametrize("ending", [b"", b"\n", b"\r\n"])
def test_a_key_file_ending_in_a_line_ending_reads_as_the_key_without_it(tmp_path, ending):
    # One trailing "\n" was dropped, but a "\r\n" (a file saved by an editor or a tool in CRLF
    # mode) left the "\r" in the key: the same key, written on two hosts, did not prove itself.
    key = bytes.fromhex("5c3460be31201e69fedaa0eee8b9997f5c7c2999fdafe593253cd654af4dfad7")
    path = tmp_path / "k"
    path.write_bytes(key + ending)
    path.chmod(0o600)
    assert keys.read_key_file(str(path)) == key
