"""The remote topic wire format, over UCX between a relay and a remote subscriber: the handshake
on the endpoint's stream, then tag messages, every one of them authenticated (session.py).

Every message has a size known before it arrives, and each receive is posted into a buffer of
exactly that size (a longer message is a UCX truncation error, which ends the connection): a
peer never makes us allocate what it says.

    remote subscriber                             relay
                                         <---  RELAY (versions)                  HANDSHAKE bytes each,
    HELLO (Noise -> psk, e; sealed: topic,                                         on the stream
           qos, queue, pid, host)        --->
                                         <---  ACCEPT (Noise <- e, ee)  or REFUSE (plain: the key
                                                                        did not open the HELLO)
    CONFIRM (sealed)                     --->
                                         <---  WELCOME (sealed: geometry, window, publisher, frame
                                                     mode and key)   or REFUSED (sealed, the reason)
    then                                 <---  FRAME (tag FRAME_TAG): header (seq, time, payload
                                                     length, counter), payload area, frame data,
                                                     tag: always message_bytes(frame bytes)
                                         <---  NOTE (tag NOTE_TAG, sealed): BEAT (idle) / GONE
                                                     (code, reason): always NOTE bytes
    CONTROL (tag CONTROL_TAG, sealed): CREDIT (n frames done) / BEAT / BYE  --->

The handshake is Noise NNpsk0 (session.py): the relay answers only a HELLO that opened under the
key, so a peer without it gets nothing keyed to test guesses against; the CONFIRM proves that
the subscriber holds the session (a recorded HELLO played again cannot take a slot). The
prologue binds the RELAY message (both versions) and the roles; the HELLO binds the topic.

A tag is ``(prefix << 8) | kind``, the prefix being derived from the session for each direction
(never sent): UCX matches tags on a whole worker, and every connection of a process has its own.
NOTE and CONTROL messages are sealed under their own channel of the session, with a counter
nonce: UCX matches one endpoint's messages of one tag in the order they were posted, so a
message replayed, reordered or taken from another connection does not open. FRAMEs are sealed
under the relay's frame key (sent in each WELCOME) with a relay-wide counter that must grow on
each link: the header always, the frame data too in the integrity and encrypted modes.

One message per frame (the header rides in front of the data) and the frames on a tag of their
own: a remote subscriber posts a receive for each free buffer of its window at once, and the
relay keeps a few sends in flight, so UCX's rendezvous round trips overlap.
"""
from __future__ import annotations

import enum
import ipaddress
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import PeerError, Refused, UsageError
from ..frames.formats import ColorFormat, check_size, color_format, plane_geometry
from ..topics import protocol
from .session import TAG, FrameMode, FrameSeal, Handshake, Session

VERSION = 4  # 3: the relay speaks first (RELAY); 4: the Noise NNpsk0 session, every message sealed
MAGIC = b"EGLCUDAR"
HANDSHAKE = 512  # bytes of every handshake message
HEADER = 64  # bytes of a FRAME's or NOTE's header
DATA_AT = HEADER + protocol.MAX_PAYLOAD  # where a FRAME's frame data starts
FRAME_TAG = 1
NOTE_TAG = 2
CONTROL_TAG = 3
MAX_PREFIX = (1 << 56) - 1  # a tag prefix: 1..MAX_PREFIX
NOTE_REASON = 400  # bytes of a NOTE's reason area
NOTE = HEADER + NOTE_REASON + TAG  # bytes of a NOTE on the wire (sealed)
MAX_REASON = NOTE_REASON
CONTROL = 32 + TAG  # bytes of a remote subscriber's control message on the wire (sealed)
MAX_NAME = 255
MAX_WINDOW = 16  # frames a relay may send ahead of a remote subscriber's credits
MAX_FRAME = 1 << 30  # bytes of one frame's data on the wire
SEND_AHEAD = 3  # frames a relay has in flight to one remote subscriber (overlaps UCX's round trips)
LATEST_WINDOW = 3  # the fewest frames a relay sends ahead of a 'latest' remote subscriber's credits
LATEST_WINDOW_BYTES = 4 << 20  # ... and as many more as fit in this (latest_window)
BEAT_S = 0.5  # a side that has said nothing for this long sends a beat
# A peer is taken as stalled after the timeout of the side that listens, and never before it
# missed two beats: a shorter timeout would drop a healthy link while the topic is idle.
SILENCE_LEAST_S = 2 * BEAT_S
# A handshake's limit is the relay's timeout, and never less than this: a timeout cut short to
# notice a stalled publisher soon would otherwise let no subscriber through its handshake.
HANDSHAKE_LEAST_S = 1.0
NO_PUBLISHER = 200  # REFUSE code: the relay has no publisher at the moment (the subscriber retries)
DISCONNECTED = 201  # GONE code: the relay lost its publisher without a goodbye (StreamDisconnected)
# The session's channels (session.Session: each its own key and nonces, per direction).
HANDSHAKE_CHANNEL = "handshake"
NOTE_CHANNEL = "note"
CONTROL_CHANNEL = "control"

_HS_HEAD = struct.Struct("<8sBB6x")  # magic, version, kind
_NOISE = struct.Struct("<H")  # a Noise message's length (then the message)
_HELLO = struct.Struct("<BBHI")  # qos, queue, name length, pid (then the name, then the client label)
MAX_CLIENT = 64
_WELCOME = struct.Struct("<IIIHHiQQdQB32s")  # width height format window pool pid instance next_seq fps frame_bytes
# frame_mode frame_key
_REFUSE = struct.Struct("<BxH")  # code, reason length (then the reason)
_HEADER = struct.Struct("<4sBxxxQQIIQQ")  # magic, kind, seq, timestamp, payload/reason length, code, skipped, counter
_COUNTER_AT = 40  # the header's counter (FrameSeal's nonce)
_CONTROL = struct.Struct("<4sBxxxI")  # magic, kind, count
_CONTROL_PLAIN = CONTROL - TAG
_NOTE_PLAIN = NOTE - TAG
_HEAD_MAGIC = b"ECRH"
_CONTROL_MAGIC = b"ECRC"
PROLOGUE = b"eglcuda remote topic: initiator remote subscriber, responder relay\0"


class Kind(enum.IntEnum):
    HELLO = 1
    ACCEPT = 2
    CONFIRM = 3
    WELCOME = 4
    REFUSE = 5  # in the clear: before the session (a HELLO that did not open, a wrong version)
    RELAY = 6  # the relay's first message: a subscriber sends nothing before it (see encode_relay)
    REFUSED = 7  # sealed: the relay refuses an authenticated subscriber (topic, busy, no publisher)


class Head(enum.IntEnum):
    FRAME = 1
    BEAT = 2
    GONE = 3


class Control(enum.IntEnum):
    CREDIT = 1
    BEAT = 2
    BYE = 3


class WireError(PeerError):
    """A remote peer's message is not what this protocol allows."""


def parse_address(text: str, what: str, least_port: int = 1) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as (host, port): PORT decimal digits in
    ``least_port``..65535 (0, any free port, is for an address to listen on), HOST without
    whitespace or control characters (a NUL would cut it short in UCX's C string), and a name the
    resolver can encode (no empty label, none over 63 bytes)."""
    if not isinstance(text, str) or ":" not in text:
        raise UsageError(f"{what} is 'HOST:PORT', got {text!r}")
    host, _, port_text = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    port = int(port_text) if port_text.isascii() and port_text.isdigit() else -1
    if not host or not least_port <= port <= 65535:
        raise UsageError(f"{what} is 'HOST:PORT' with a port of {least_port}..65535, got {text!r}")
    if not host.isprintable() or any(c.isspace() for c in host) or (":" in host and not _is_ipv6(host)):
        # (a host with a ':' that is no IPv6 address is a malformed string, '127.0.0.1:5555:6666')
        raise UsageError(f"{what} is 'HOST:PORT' with a host name or address, got {text!r}")
    try:
        host.encode("idna")  # (what the resolver does first: an empty label, or one over 63 bytes, fails there)
    except UnicodeError as exc:
        raise UsageError(f"{what}: {host!r} is no valid host name ({exc.__cause__ or exc}), got {text!r}") from None
    return host, port


def _is_ipv6(host: str) -> bool:
    try:
        ipaddress.IPv6Address(host)
    except ValueError:
        return False
    return True


def peer_text(raw: bytes | bytearray | memoryview) -> str:
    """Text a peer sent (a reason, a label) as it may reach an exception or a log: UTF-8 with
    anything undecodable or unprintable (control characters, a newline, an escape) as '?'."""
    return protocol.printable(bytes(raw).decode(errors="replace"))


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise WireError(f"malformed message from the remote peer: {what}")


def _handshake(kind: Kind, body: bytes) -> bytearray:
    out = bytearray(HANDSHAKE)
    _HS_HEAD.pack_into(out, 0, MAGIC, VERSION, int(kind))
    out[_HS_HEAD.size:_HS_HEAD.size + len(body)] = body
    return out


def handshake_kind(data: bytes | bytearray | memoryview) -> tuple[Kind, memoryview]:
    """The kind of a handshake message and its body (raises :class:`WireError`)."""
    _check(len(data) == HANDSHAKE, "handshake size")
    magic, version, kind = _HS_HEAD.unpack_from(data, 0)
    _check(magic == MAGIC, "not an eglcuda remote topic peer")
    if version != VERSION:
        raise WireError(f"the peer speaks remote topic protocol version {version}, this side speaks {VERSION} "
                        f"(eglcuda {'older' if version < VERSION else 'newer'} than this one's): use the same eglcuda "
                        f"version on both hosts")
    _check(kind in Kind._value2member_map_, f"handshake kind {kind}")
    return Kind(kind), memoryview(data)[_HS_HEAD.size:]


def prologue(relay_message: bytes | bytearray) -> bytes:
    """What both sides mix into the handshake without sending it: the roles, and the relay's
    first message as it arrived (the protocol version it speaks)."""
    return PROLOGUE + bytes(relay_message)


def _noise_body(kind: Kind, message: bytes) -> bytearray:
    _check(_NOISE.size + len(message) <= HANDSHAKE - _HS_HEAD.size, "a handshake message too long")
    return _handshake(kind, _NOISE.pack(len(message)) + message)


def _noise_of(body: memoryview) -> bytes:
    (length,) = _NOISE.unpack_from(body, 0)
    _check(length <= len(body) - _NOISE.size, "handshake message length")
    return bytes(body[_NOISE.size:_NOISE.size + length])


@dataclass(frozen=True)
class Hello:
    qos: protocol.Qos
    queue: int
    name: str
    pid: int = 0
    client: str = ""  # the subscriber's host name (for listings only: it is the peer's word)


def encode_hello(handshake: Handshake, hello: Hello) -> bytearray:
    """The subscriber's first message: Noise's ``-> psk, e`` carrying ``hello``."""
    name = hello.name.encode()
    client = hello.client.encode()[:MAX_CLIENT]
    plain = _HELLO.pack(int(hello.qos), hello.queue, len(name), hello.pid) + name + bytes([len(client)]) + client
    return _noise_body(Kind.HELLO, handshake.write_message(plain))


def decode_hello(handshake: Handshake, body: memoryview) -> Hello:
    """The HELLO in ``body`` (:class:`AuthenticationFailed` when it does not open: another key)."""
    plain = handshake.read_message(_noise_of(body))
    _check(len(plain) >= _HELLO.size, "HELLO size")
    qos, queue, length, pid = _HELLO.unpack_from(plain, 0)
    _check(qos in (int(protocol.Qos.LATEST), int(protocol.Qos.EVERY)), f"qos {qos}")
    _check(1 <= queue <= protocol.MAX_QUEUE, f"queue {queue}")
    _check(1 <= length <= MAX_NAME and _HELLO.size + length < len(plain), f"topic name length {length}")
    raw = plain[_HELLO.size:_HELLO.size + length]
    try:
        name = raw.decode()
    except UnicodeDecodeError:
        raise WireError("malformed message from the remote peer: the topic name is not UTF-8") from None
    at = _HELLO.size + length
    size = plain[at]
    _check(size <= MAX_CLIENT and at + 1 + size == len(plain), "client label length")
    return Hello(protocol.Qos(qos), queue, name, pid, peer_text(plain[at + 1:at + 1 + size]))


def encode_relay() -> bytearray:
    """The relay's first message on a new connection. A subscriber sends only once it came: a
    connection that never got through (no relay at that address) never has a send posted on it,
    which UCXX's progress thread could not finish (docs/remote.md, "The engine")."""
    return _handshake(Kind.RELAY, b"")


def encode_accept(handshake: Handshake) -> bytearray:
    """The relay's answer to a HELLO that opened: Noise's ``<- e, ee``."""
    return _noise_body(Kind.ACCEPT, handshake.write_message(b""))


def decode_accept(handshake: Handshake, body: memoryview) -> None:
    """:class:`AuthenticationFailed` unless the relay holds the key (and saw this HELLO)."""
    _check(handshake.read_message(_noise_of(body)) == b"", "ACCEPT payload")


_CONFIRM = b"eglcuda remote subscriber ready"


def encode_confirm(session: Session) -> bytearray:
    """The subscriber's first sealed message: it holds the session (not a HELLO played again)."""
    return _noise_body(Kind.CONFIRM, session.seal(HANDSHAKE_CHANNEL, _CONFIRM))


def decode_confirm(session: Session, body: memoryview) -> bool:
    """True, or :class:`AuthenticationFailed` (the peer is not the subscriber of the session made)."""
    _check(session.open(HANDSHAKE_CHANNEL, _noise_of(body)) == _CONFIRM, "CONFIRM")
    return True


@dataclass(frozen=True)
class Welcome:
    width: int
    height: int
    format: ColorFormat
    window: int
    pool: int
    publisher_pid: int
    instance: int
    next_seq: int
    fps: float | None
    frame_bytes: int
    frame_mode: FrameMode = FrameMode.PLAIN
    frame_key: bytes = bytes(32)


def packed_planes(fmt: ColorFormat, width: int, height: int) -> list[tuple[int, int]]:
    """(row bytes, rows) of each plane as the wire carries a frame: planes one after the other,
    rows without padding."""
    return [(g.row_bytes, g.height) for g in plane_geometry(fmt, width, height, 0)]


def frame_bytes(fmt: ColorFormat, width: int, height: int) -> int:
    return sum(row * rows for row, rows in packed_planes(fmt, width, height))


def message_bytes(frame_size: int) -> int:
    """Bytes of a FRAME message carrying ``frame_size`` bytes of frame data."""
    return DATA_AT + frame_size + TAG


def latest_window(frame_size: int) -> int:
    """Frames a relay sends ahead of a 'latest' remote subscriber's credits, for frames of
    ``frame_size`` bytes: as many as LATEST_WINDOW_BYTES holds, LATEST_WINDOW to MAX_WINDOW. Small
    frames need the deeper window (a credit's round trip is longer than a small frame's send), and
    cost the subscriber little page-locked memory for it; the relay's sends in flight stay
    SEND_AHEAD, so no frame waits longer on the link for it."""
    return max(LATEST_WINDOW, min(MAX_WINDOW, LATEST_WINDOW_BYTES // message_bytes(frame_size)))


def frame_seal(key: bytes, mode: FrameMode) -> FrameSeal:
    """What seals (the relay) or opens (a subscriber) FRAME messages under ``key``."""
    return FrameSeal(key, mode, HEADER, _COUNTER_AT, DATA_AT)


def encode_welcome(session: Session, w: Welcome) -> bytearray:
    fps = math.nan if w.fps is None else float(w.fps)
    plain = _WELCOME.pack(w.width, w.height, int(w.format), w.window, w.pool, w.publisher_pid, w.instance, w.next_seq,
                          fps, w.frame_bytes, int(w.frame_mode), w.frame_key)
    return _noise_body(Kind.WELCOME, session.seal(HANDSHAKE_CHANNEL, plain))


def decode_welcome(session: Session, body: memoryview) -> Welcome:
    plain = session.open(HANDSHAKE_CHANNEL, _noise_of(body))
    _check(len(plain) == _WELCOME.size, "WELCOME size")
    width, height, fmt, window, pool, pid, instance, next_seq, fps, size, mode, key = _WELCOME.unpack(plain)
    try:
        fmt = color_format(fmt)
        check_size(width, height, fmt)
    except Exception as exc:  # noqa: BLE001 - any refusal of the geometry is the peer's fault
        raise WireError(f"malformed message from the remote peer: frame geometry ({exc})") from None
    _check(1 <= window <= MAX_WINDOW, f"window {window}")
    _check(0 <= pool <= protocol.MAX_POOL, f"pool {pool}")
    expected = frame_bytes(fmt, width, height)
    _check(size == expected and 0 < size <= MAX_FRAME, f"frame size {size} for {width}x{height} {fmt.name}")
    _check(mode in FrameMode._value2member_map_, f"frame mode {mode}")
    return Welcome(width, height, fmt, window, pool, pid, instance, next_seq, None if math.isnan(fps) else fps, size,
                   FrameMode(mode), bytes(key))


def _refusal(code: int, reason: str) -> bytes:
    text = reason.encode()[:MAX_REASON]
    return _REFUSE.pack(code, len(text)) + text


def encode_refuse(code: int, reason: str) -> bytearray:
    """A refusal in the clear (before the session: its reason is no secret, and the subscriber
    cannot tell it from anyone's)."""
    return _handshake(Kind.REFUSE, _refusal(code, reason))


def encode_refused(session: Session, code: int, reason: str) -> bytearray:
    """A refusal of an authenticated subscriber, sealed."""
    return _noise_body(Kind.REFUSED, session.seal(HANDSHAKE_CHANNEL, _refusal(code, reason)))


def expect(data: bytes | bytearray | memoryview, want: Kind, *, refusal: bool = False,
           session: Session | None = None) -> memoryview:
    """The body of handshake message ``data``, which must be of kind ``want`` (:class:`WireError`
    if not). ``refusal``: the peer may answer REFUSE instead (a relay does): :class:`Refused` with
    its reason and code; with ``session``, only a sealed REFUSED counts (a REFUSE in the clear is
    a :class:`WireError` then: anyone could have sent it)."""
    kind, body = handshake_kind(data)
    if refusal and session is None and kind is Kind.REFUSE:
        code, reason = decode_refuse(body)
        raise Refused(f"the relay refused: {reason}", code)
    if refusal and session is not None and kind is Kind.REFUSED:
        code, reason = decode_refuse(memoryview(session.open(HANDSHAKE_CHANNEL, _noise_of(body))))
        raise Refused(f"the relay refused: {reason}", code)
    if kind is not want:
        raise WireError(f"expected {want.name}, got {kind.name}")
    return body


def decode_refuse(body: memoryview) -> tuple[int, str]:
    code, length = _REFUSE.unpack_from(body, 0)
    _check(length <= MAX_REASON and _REFUSE.size + length <= len(body), "reason length")
    return code, peer_text(body[_REFUSE.size:_REFUSE.size + length])


# ---- the data phase ---------------------------------------------------------------------------

def pack_frame(out: Any, seq: int, timestamp_ns: int, payload: bytes) -> None:
    """Write a FRAME's header and payload in front of its data in ``out`` (a staging buffer; the
    relay's :class:`FrameSeal` seals it once the data is there)."""
    _HEADER.pack_into(out, 0, _HEAD_MAGIC, int(Head.FRAME), seq, timestamp_ns, len(payload), 0, 0, 0)
    out[HEADER:HEADER + len(payload)] = np.frombuffer(payload, np.uint8)


def encode_note(session: Session, kind: Head, code: int = 0, reason: str = "", sent: int = 0) -> bytes:
    """A BEAT or GONE note, sealed; a GONE's ``sent`` (in the header's seq field) is how many
    frames the relay sent on this connection: the subscriber ends once it received them all.
    Encode each note just before it is sent (its nonce is the next of its channel)."""
    text = reason.encode()[:NOTE_REASON]
    out = bytearray(_NOTE_PLAIN)
    _HEADER.pack_into(out, 0, _HEAD_MAGIC, int(kind), sent, 0, len(text), code, 0, 0)
    out[HEADER:HEADER + len(text)] = text
    return session.seal(NOTE_CHANNEL, out)


def decode_note(session: Session, data: bytes | bytearray | memoryview) -> tuple[Head, int, int, str]:
    """(kind, sent, code, reason) of the relay's next note (:class:`AuthenticationFailed` if it
    is not that note)."""
    plain = session.open(NOTE_CHANNEL, bytes(data))
    kind, sent, _, length, code, _ = decode_header(plain)
    _check(kind is not Head.FRAME, "a FRAME as a note")
    return kind, sent, code, peer_text(plain[HEADER:HEADER + length])


def decode_header(data: bytes | bytearray | memoryview) -> tuple[Head, int, int, int, int, int]:
    """(kind, seq, timestamp_ns, length, code, skipped); the length is checked against its kind's
    bound. A FRAME's header is to be read only after :meth:`FrameSeal.open` (link.py)."""
    magic, kind, seq, ts, length, code, skipped, _ = _HEADER.unpack_from(data, 0)
    _check(magic == _HEAD_MAGIC, "header magic")
    _check(kind in Head._value2member_map_, f"header kind {kind}")
    kind = Head(kind)
    _check(length <= (protocol.MAX_PAYLOAD if kind is Head.FRAME else MAX_REASON), f"length {length}")
    return kind, seq, ts, length, code, skipped


def encode_control(session: Session, kind: Control, count: int = 0) -> bytes:
    """A CREDIT, BEAT or BYE, sealed: encode each just before it is posted (its nonce is the next
    of its channel, and UCX keeps their order only as posted)."""
    out = bytearray(_CONTROL_PLAIN)
    _CONTROL.pack_into(out, 0, _CONTROL_MAGIC, int(kind), count)
    return session.seal(CONTROL_CHANNEL, out)


def decode_control(session: Session, data: bytes | bytearray | memoryview) -> tuple[Control, int]:
    plain = session.open(CONTROL_CHANNEL, bytes(data))
    magic, kind, count = _CONTROL.unpack_from(plain, 0)
    _check(magic == _CONTROL_MAGIC, "control magic")
    _check(kind in Control._value2member_map_, f"control kind {kind}")
    _check(count <= MAX_WINDOW, f"credit {count}")
    return Control(kind), count


