"""The authenticated session of a relay and a remote subscriber: the Noise handshake
``Noise_NNpsk0_25519_ChaChaPoly_SHA256`` (the Noise Protocol Framework, revision 34) built from
pyca/cryptography's primitives, and what the handshake's keys protect afterwards. Pure protocol:
no UCX here (wire.py frames these bytes, serving.py and link.py move them).

    subscriber (initiator)                                   relay (responder)
    -> psk, e    (the HELLO as the payload, sealed under a key from the psk and e)
    <- e, ee     (an empty payload, sealed under the psk, both ephemerals and their DH)

The relay answers only a first message that opened under the key: a peer without the key gets
nothing keyed from it. Both sides then hold :class:`Session`: one key per direction (Noise's
``Split``), from which each *channel* (a kind of message in one direction) derives its own key
and counts its own nonces, so messages of one channel that arrive replayed, reordered, dropped
or from another connection fail to open. The frames have their own key and modes
(:class:`FrameSeal`).
"""
from __future__ import annotations

import enum
import hashlib
import hmac
import itertools
import struct
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ..errors import PeerError, Unsupported, UsageError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

PROTOCOL_NAME = b"Noise_NNpsk0_25519_ChaChaPoly_SHA256"
HASHLEN = 32
DHLEN = 32
TAG = 16  # bytes an AEAD adds to what it seals
PSK = 32  # bytes of a Noise pre-shared key
MAX_NONCE = (1 << 64) - 1  # reserved by Noise: a CipherState never uses it
PREFIX_BITS = 56  # a UCX tag prefix (wire.py: a tag is prefix << 8 | kind)


INSTALL = "pip install -e '.[remote-cu12]' in a checkout (or remote-cu13), or pip install cryptography"
_primitives: SimpleNamespace | None = None


def _crypto() -> Any:
    """pyca/cryptography's primitives, imported on first use (``import eglcuda`` does not need
    them); :class:`Unsupported` with the line to install it."""
    global _primitives
    if _primitives is None:
        try:
            from cryptography.exceptions import InvalidTag
            from cryptography.hazmat.primitives.asymmetric import x25519
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM, ChaCha20Poly1305
        except ImportError:
            raise Unsupported("cryptography", hint=INSTALL) from None
        _primitives = SimpleNamespace(InvalidTag=InvalidTag, private=x25519.X25519PrivateKey,
                                      public=x25519.X25519PublicKey, AESGCM=AESGCM, ChaCha20Poly1305=ChaCha20Poly1305)
    return _primitives


def require() -> None:
    """:class:`Unsupported` (with the line to install it) when pyca/cryptography is missing."""
    _crypto()


class AuthenticationFailed(PeerError):
    """A message did not open under the session's keys: the peer holds another key, or the
    message was forged, altered, replayed or reordered on its way."""


def _hmac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


def _hkdf(chaining_key: bytes, material: bytes, outputs: int) -> list[bytes]:
    """Noise's HKDF (section 4.3): HMAC-SHA256 extract, then ``outputs`` (2 or 3) expansions."""
    temp = _hmac(chaining_key, material)
    out = [_hmac(temp, b"\x01")]
    for i in range(2, outputs + 1):
        out.append(_hmac(temp, out[-1] + bytes([i])))
    return out


def _nonce(n: int) -> bytes:
    """ChaChaPoly's 96-bit nonce for counter ``n``: 32 zero bits, then ``n`` little-endian."""
    return b"\0\0\0\0" + struct.pack("<Q", n)


class _CipherState:
    """Noise's CipherState: a key (or none yet) and a counter that every message moves on."""

    def __init__(self, key: bytes | None = None) -> None:
        self._aead = _crypto().ChaCha20Poly1305(key) if key is not None else None
        self.n = 0

    @property
    def has_key(self) -> bool:
        return self._aead is not None

    def encrypt(self, ad: bytes, plaintext: bytes) -> bytes:
        if self._aead is None:
            return plaintext
        if self.n >= MAX_NONCE:
            raise PeerError("a session ran out of nonces: start a new one")
        out: bytes = self._aead.encrypt(_nonce(self.n), plaintext, ad)
        self.n += 1
        return out

    def decrypt(self, ad: bytes, ciphertext: bytes, what: str) -> bytes:
        if self._aead is None:
            return ciphertext
        if self.n >= MAX_NONCE:
            raise PeerError("a session ran out of nonces: start a new one")
        try:
            out: bytes = self._aead.decrypt(_nonce(self.n), ciphertext, ad)
        except _crypto().InvalidTag:
            raise AuthenticationFailed(f"{what} did not open: the peer holds another key, or the message was forged, "
                                       f"altered, replayed or reordered") from None
        self.n += 1  # (only a message that opened moves the counter on)
        return out


class Handshake:
    """One side of the NNpsk0 handshake. ``key`` is the Noise PSK (exactly 32 bytes: see
    keys.noise_psk), ``prologue`` what both sides must agree on without sending it (protocol
    versions, roles). Make one with :meth:`initiator` (the subscriber) or :meth:`responder`
    (the relay); then the initiator writes, the responder reads, the responder writes, the
    initiator reads, and both :meth:`split`."""

    def __init__(self, key: bytes, prologue: bytes, initiator: bool, ephemeral: "X25519PrivateKey | None" = None) -> None:
        if len(key) != PSK:
            raise ValueError(f"a Noise pre-shared key is {PSK} bytes, got {len(key)}")
        self._initiator = initiator
        self._psk = bytes(key)
        self._e = ephemeral
        self._re: bytes | None = None
        # InitializeSymmetric: a name longer than HASHLEN is hashed.
        name = PROTOCOL_NAME
        self._h = name + bytes(HASHLEN - len(name)) if len(name) <= HASHLEN else hashlib.sha256(name).digest()
        self._ck = self._h
        self._cipher = _CipherState()
        self._mix_hash(prologue)
        self._step = 0  # 0: the initiator's message; 1: the responder's; 2: done

    @classmethod
    def initiator(cls, key: bytes, prologue: bytes, ephemeral: "X25519PrivateKey | None" = None) -> "Handshake":
        return cls(key, prologue, True, ephemeral)

    @classmethod
    def responder(cls, key: bytes, prologue: bytes, ephemeral: "X25519PrivateKey | None" = None) -> "Handshake":
        return cls(key, prologue, False, ephemeral)

    # ---- SymmetricState ---------------------------------------------------------------------
    def _mix_hash(self, data: bytes) -> None:
        self._h = hashlib.sha256(self._h + data).digest()

    def _mix_key(self, material: bytes) -> None:
        self._ck, key = _hkdf(self._ck, material, 2)
        self._cipher = _CipherState(key)

    def _mix_key_and_hash(self, material: bytes) -> None:
        self._ck, temp_h, key = _hkdf(self._ck, material, 3)
        self._mix_hash(temp_h)
        self._cipher = _CipherState(key)

    def _encrypt_and_hash(self, plaintext: bytes) -> bytes:
        out = self._cipher.encrypt(self._h, plaintext)
        self._mix_hash(out)
        return out

    def _decrypt_and_hash(self, ciphertext: bytes) -> bytes:
        out = self._cipher.decrypt(self._h, ciphertext, "the peer's handshake")
        self._mix_hash(ciphertext)
        return out

    # ---- the tokens -----------------------------------------------------------------------
    def _write_e(self) -> bytes:
        if self._e is None:
            self._e = _crypto().private.generate()
        public = self._e.public_key().public_bytes_raw()
        self._mix_hash(public)
        self._mix_key(public)  # (a psk pattern: the ephemeral is mixed into the key too)
        return public

    def _read_e(self, message: bytes) -> bytes:
        if len(message) < DHLEN:
            raise AuthenticationFailed("the peer's handshake is too short")
        self._re = bytes(message[:DHLEN])
        self._mix_hash(self._re)
        self._mix_key(self._re)
        return message[DHLEN:]

    def _ee(self) -> None:
        assert self._e is not None and self._re is not None
        try:
            shared = self._e.exchange(_crypto().public.from_public_bytes(self._re))
        except ValueError:  # (a low-order point: the shared secret would be all zeros)
            raise AuthenticationFailed("the peer's ephemeral key is not a usable X25519 key") from None
        self._mix_key(shared)

    # ---- the messages -----------------------------------------------------------------------
    def write_message(self, payload: bytes = b"") -> bytes:
        """This side's next handshake message carrying ``payload`` (sealed)."""
        if self._step == 0 and self._initiator:  # -> psk, e
            self._mix_key_and_hash(self._psk)
            out = self._write_e()
        elif self._step == 1 and not self._initiator:  # <- e, ee
            out = self._write_e()
            self._ee()
        else:
            raise RuntimeError("not this side's turn in the handshake")
        self._step += 1
        return out + self._encrypt_and_hash(bytes(payload))

    def read_message(self, message: bytes) -> bytes:
        """The payload of the peer's next handshake message; :class:`AuthenticationFailed` when
        it does not open (another key, another prologue, or tampering)."""
        message = bytes(message)
        if self._step == 0 and not self._initiator:  # -> psk, e
            self._mix_key_and_hash(self._psk)
            rest = self._read_e(message)
        elif self._step == 1 and self._initiator:  # <- e, ee
            rest = self._read_e(message)
            self._ee()
        else:
            raise RuntimeError("not the peer's turn in the handshake")
        if len(rest) < TAG:
            raise AuthenticationFailed("the peer's handshake is too short")
        payload = self._decrypt_and_hash(rest)
        self._step += 1
        return payload

    @property
    def handshake_hash(self) -> bytes:
        return self._h

    @property
    def done(self) -> bool:
        return self._step == 2

    def split(self) -> "Session":
        """The session, once both messages went (Noise's Split: a key per direction)."""
        if not self.done:
            raise RuntimeError("the handshake is not finished")
        first, second = _hkdf(self._ck, b"", 2)
        sending, receiving = (first, second) if self._initiator else (second, first)
        self._psk = b""
        return Session(sending, receiving, self._h)


class Session:
    """What the handshake agreed: a key per direction, and the handshake's hash. Each channel
    (a name: one kind of message in one direction) gets its own key, derived from its
    direction's key and its name, and counts its own nonces: :meth:`seal` and :meth:`open` must
    see one channel's messages in the order they were sent (UCX matches one endpoint's tagged
    messages of one tag in the order they were posted)."""

    def __init__(self, sending: bytes, receiving: bytes, handshake_hash: bytes) -> None:
        self._sending = sending
        self._receiving = receiving
        self.handshake_hash = handshake_hash
        self._out: dict[str, _CipherState] = {}
        self._in: dict[str, _CipherState] = {}
        self.frames: FrameSeal | None = None  # the relay's frames (a subscriber's, once welcomed)

    @staticmethod
    def _derive(key: bytes, label: str) -> bytes:
        return _hmac(key, b"eglcuda-remote channel\0" + label.encode())

    def seal(self, channel: str, plaintext: bytes | bytearray, aad: bytes = b"") -> bytes:
        """``plaintext`` sealed as the next message of ``channel`` (TAG bytes longer)."""
        state = self._out.get(channel)
        if state is None:
            state = self._out[channel] = _CipherState(self._derive(self._sending, channel))
        return state.encrypt(aad, bytes(plaintext))

    def open(self, channel: str, message: bytes, aad: bytes = b"") -> bytes:
        """The plaintext of the peer's next message on ``channel``; :class:`AuthenticationFailed`
        when it is not exactly that message (forged, altered, replayed, reordered)."""
        state = self._in.get(channel)
        if state is None:
            state = self._in[channel] = _CipherState(self._derive(self._receiving, channel))
        return state.decrypt(aad, bytes(message), f"a {channel} message")

    def tag_prefix(self, receiving: bool) -> int:
        """The UCX tag prefix of what this side receives (``receiving``) or sends: derived from
        the session, so it never travels; both sides agree (one's receiving is the other's
        sending). Never 0."""
        key = self._receiving if receiving else self._sending
        value = int.from_bytes(self._derive(key, "tag prefix")[:8], "little") & ((1 << PREFIX_BITS) - 1)
        return value or 1


class FrameMode(enum.IntEnum):
    """How a relay protects the frames it sends: the header (sequence, time, payload) is always
    authenticated; ``INTEGRITY`` authenticates the frame's bytes too, ``ENCRYPTED`` also hides
    them (both AES-256-GCM)."""

    PLAIN = 0
    INTEGRITY = 1
    ENCRYPTED = 2


FRAME_MODES = {"plain": FrameMode.PLAIN, "integrity": FrameMode.INTEGRITY, "encrypted": FrameMode.ENCRYPTED}


def frame_mode(name: str) -> FrameMode:
    """The :class:`FrameMode` called ``name``, in any case, as ``qos=`` and formats are
    (``frames=`` of a relay or remote subscriber)."""
    mode = FRAME_MODES.get(name.lower()) if isinstance(name, str) else None
    if mode is None:
        raise UsageError(f"frames is one of {', '.join(FRAME_MODES)}, got {name!r}")
    return mode


class FrameSeal:
    """The relay's frame key and mode. A sealed frame message is ``[header | payload area |
    frame bytes | TAG]``; :meth:`seal` writes a counter into the header (the nonce: never
    repeated under one key) and the trailing tag, over the header and payload area (PLAIN), the
    whole message (INTEGRITY), or the header with the rest encrypted in place (ENCRYPTED).
    ``header_end``: where the header ends; ``counter_at``: the counter's offset in it;
    ``data_at``: where the frame bytes start."""

    def __init__(self, key: bytes, mode: FrameMode, header_end: int, counter_at: int, data_at: int) -> None:
        if len(key) != 32:
            raise ValueError("a frame key is 32 bytes")
        self.key = bytes(key)
        self.mode = FrameMode(mode)
        self._aead = _crypto().AESGCM(self.key)
        self._header_end = header_end
        self._counter_at = counter_at
        self._data_at = data_at
        self._counter = itertools.count(1)
        # ENCRYPTED: where the frame bytes are encrypted or decrypted before they are copied back
        # (pyca/cryptography from 51 refuses an input and output that overlap, as in place would).
        self._scratch: memoryview | None = None

    def seal(self, message: Any) -> int:
        """Seal ``message`` (a writable buffer of the whole sealed message) in place; returns
        its counter."""
        view = memoryview(message).cast("B")
        end = len(view) - TAG
        counter = next(self._counter)
        struct.pack_into("<Q", view, self._counter_at, counter)
        nonce = struct.pack("<Q", counter) + b"\0\0\0\0"
        if self.mode is FrameMode.ENCRYPTED:
            sealed = self._scratch_of(len(view) - self._header_end)
            self._aead.encrypt_into(nonce, view[self._header_end:end], view[:self._header_end], sealed)
            view[self._header_end:] = sealed
        else:
            covered = view[:end] if self.mode is FrameMode.INTEGRITY else view[:self._data_at]
            self._aead.encrypt_into(nonce, b"", covered, view[end:])
        return counter

    def _scratch_of(self, size: int) -> memoryview:
        """``size`` bytes of this seal's scratch buffer (grown to the largest frame; one thread
        seals or opens at a time, as the relay's staging and a remote's receiver do)."""
        scratch = self._scratch
        if scratch is None or len(scratch) < size:
            scratch = self._scratch = memoryview(bytearray(size))
        return scratch[:size]

    def open(self, message: Any) -> int:
        """Check (and decrypt, in place) ``message`` as :meth:`seal` made it; its counter, or
        :class:`AuthenticationFailed`."""
        view = memoryview(message).cast("B")
        end = len(view) - TAG
        counter = struct.unpack_from("<Q", view, self._counter_at)[0]
        nonce = struct.pack("<Q", counter) + b"\0\0\0\0"
        try:
            if self.mode is FrameMode.ENCRYPTED:
                opened = self._scratch_of(end - self._header_end)
                self._aead.decrypt_into(nonce, view[self._header_end:], view[:self._header_end], opened)
                view[self._header_end:end] = opened
            else:
                covered = view[:end] if self.mode is FrameMode.INTEGRITY else view[:self._data_at]
                self._aead.decrypt_into(nonce, view[end:], covered, bytearray(0))
        except _crypto().InvalidTag:
            raise AuthenticationFailed("a frame did not open under the relay's frame key: forged or altered on its "
                                       "way") from None
        return int(counter)
