"""The remote topic wire format, over UCX between a relay and a remote subscriber: the handshake
on the endpoint's stream, then tag messages.

Every message has a size known before it arrives, and each receive is posted into a buffer of
exactly that size (a longer message is a UCX truncation error, which ends the connection): a
peer never makes us allocate what it says.

    remote subscriber                             relay
    HELLO (nonce_s, topic, qos, queue,   --->                           HANDSHAKE bytes each,
           tags_s)                                                         on the stream
                                         <---  CHALLENGE (nonce_r, proof_r)   or REFUSE
    PROOF (proof_s)                      --->
                                         <---  WELCOME (geometry, window, publisher, tags_r)
                                                     or REFUSE
    then                                 <---  FRAME (tag FRAME_TAG): header (seq, time, payload
                                                     length), payload area, frame data: always
                                                     DATA_AT + the frame's bytes
                                         <---  NOTE (tag NOTE_TAG): BEAT (idle) / GONE (code,
                                                     reason): always NOTE bytes
    CONTROL (tag CONTROL_TAG): CREDIT (n frames done) / BEAT / BYE  --->

A tag is ``(prefix << 8) | kind``, the prefix being the one its receiver chose (tags_s for what
the subscriber receives, tags_r for the relay): UCX matches tags on a whole worker, and every
connection of a process has its own prefix (eglcuda/remote/_ucx.py).

One message per frame (the header rides in front of the data) and the frames on a tag of their
own: a remote subscriber posts a receive for each free buffer of its window at once, and the
relay keeps a few sends in flight, so UCX's rendezvous round trips overlap.

proof_r = HMAC(key, "relay" | nonce_s | nonce_r | topic); proof_s = HMAC(key, "subscriber" |
nonce_r | nonce_s | topic): each side proves it holds the key before the other says more.
"""
from __future__ import annotations

import enum
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import PeerError, Refused, UsageError
from ..frames.formats import ColorFormat, check_size, color_format, plane_geometry
from ..topics import protocol

VERSION = 3  # 2: the handshake on the stream, tag prefixes per connection; 3: the relay speaks first (RELAY)
MAGIC = b"EGLCUDAR"
HANDSHAKE = 512  # bytes of every handshake message
HEADER = 64  # bytes of a FRAME's or NOTE's header
DATA_AT = HEADER + protocol.MAX_PAYLOAD  # where a FRAME's frame data starts
FRAME_TAG = 1
NOTE_TAG = 2
CONTROL_TAG = 3
MAX_PREFIX = (1 << 56) - 1  # a tag prefix: 1..MAX_PREFIX
NOTE_REASON = 400  # bytes of a NOTE's reason area
NOTE = HEADER + NOTE_REASON
MAX_REASON = NOTE_REASON
CONTROL = 32  # bytes of a remote subscriber's control message
MAX_NAME = 255
MAX_WINDOW = 16  # frames a relay may send ahead of a remote subscriber's credits
MAX_FRAME = 1 << 30  # bytes of one frame's data on the wire
SEND_AHEAD = 3  # frames a relay has in flight to one remote subscriber (overlaps UCX's round trips)
LATEST_WINDOW = 3  # frames a relay sends ahead of a 'latest' remote subscriber's credits
BEAT_S = 0.5  # a side that has said nothing for this long sends a beat
NO_PUBLISHER = 200  # REFUSE code: the relay has no publisher at the moment (the subscriber retries)
DISCONNECTED = 201  # GONE code: the relay lost its publisher without a goodbye (StreamDisconnected)

_HS_HEAD = struct.Struct("<8sBB6x")  # magic, version, kind
_HELLO = struct.Struct("<BBHI32s")  # qos, queue, name length, pid, nonce (then the name)
_CLIENT_AT = 320  # a HELLO's client label: a length byte, then up to MAX_CLIENT bytes
MAX_CLIENT = 64
_TAGS_AT = 400  # a HELLO's tag prefix (8 bytes)
_PREFIX = struct.Struct("<Q")
_CHALLENGE = struct.Struct("<32s32s")
_PROOF = struct.Struct("<32s")
_WELCOME = struct.Struct("<IIIHHiQQdQQ")  # width height format window pool pid instance next_seq fps frame_bytes tags
_REFUSE = struct.Struct("<BxH")  # code, reason length (then the reason)
_HEADER = struct.Struct("<4sBxxxQQIIQ")  # magic, kind, seq, timestamp, payload/reason length, code, skipped
_CONTROL = struct.Struct("<4sBxxxI")  # magic, kind, count
_HEAD_MAGIC = b"ECRH"
_CONTROL_MAGIC = b"ECRC"


class Kind(enum.IntEnum):
    HELLO = 1
    CHALLENGE = 2
    PROOF = 3
    WELCOME = 4
    REFUSE = 5
    RELAY = 6  # the relay's first message: a subscriber sends nothing before it (see encode_relay)


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


def parse_address(text: str, what: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` too) as (host, port)."""
    if not isinstance(text, str) or ":" not in text:
        raise UsageError(f"{what} is 'HOST:PORT', got {text!r}")
    host, _, port_text = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not host or not 0 <= port <= 65535:
        raise UsageError(f"{what} is 'HOST:PORT' with a port of 0..65535, got {text!r}")
    return host, port


def peer_text(raw: bytes | bytearray | memoryview) -> str:
    """Text a peer sent (a reason, a label) as it may reach an exception or a log: UTF-8 with
    anything undecodable or unprintable (control characters, a newline, an escape) as '?'."""
    text = bytes(raw).decode(errors="replace")
    return "".join(c if c.isprintable() and c != "\ufffd" else "?" for c in text)


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
    _check(version == VERSION, f"protocol version {version}, this side speaks {VERSION}")
    _check(kind in Kind._value2member_map_, f"handshake kind {kind}")
    return Kind(kind), memoryview(data)[_HS_HEAD.size:]


@dataclass(frozen=True)
class Hello:
    qos: protocol.Qos
    queue: int
    nonce: bytes
    name: str
    pid: int = 0
    client: str = ""  # the subscriber's host name (for listings only: it is the peer's word)
    tags: int = 1  # the tag prefix of what the subscriber receives


def encode_hello(hello: Hello) -> bytearray:
    name = hello.name.encode()
    client = hello.client.encode()[:MAX_CLIENT]
    out = _handshake(Kind.HELLO, _HELLO.pack(int(hello.qos), hello.queue, len(name), hello.pid, hello.nonce) + name)
    at = _HS_HEAD.size + _CLIENT_AT
    out[at] = len(client)
    out[at + 1:at + 1 + len(client)] = client
    _PREFIX.pack_into(out, _HS_HEAD.size + _TAGS_AT, hello.tags)
    return out


def decode_hello(body: memoryview) -> Hello:
    qos, queue, length, pid, nonce = _HELLO.unpack_from(body, 0)
    _check(qos in (int(protocol.Qos.LATEST), int(protocol.Qos.EVERY)), f"qos {qos}")
    _check(1 <= queue <= protocol.MAX_QUEUE, f"queue {queue}")
    _check(1 <= length <= MAX_NAME and _HELLO.size + length <= _CLIENT_AT, f"topic name length {length}")
    raw = bytes(body[_HELLO.size:_HELLO.size + length])
    try:
        name = raw.decode()
    except UnicodeDecodeError:
        raise WireError("malformed message from the remote peer: the topic name is not UTF-8") from None
    size = body[_CLIENT_AT]
    _check(size <= MAX_CLIENT, "client label length")
    client = peer_text(body[_CLIENT_AT + 1:_CLIENT_AT + 1 + size])
    tags = _PREFIX.unpack_from(body, _TAGS_AT)[0]
    _check(1 <= tags <= MAX_PREFIX, "tag prefix")
    return Hello(protocol.Qos(qos), queue, nonce, name, pid, client, tags)


def encode_relay() -> bytearray:
    """The relay's first message on a new connection. A subscriber sends only once it came: a
    connection that never got through (no relay at that address) never has a send posted on it,
    which UCXX's progress thread could not finish (docs/remote.md, "The engine")."""
    return _handshake(Kind.RELAY, b"")


def encode_challenge(nonce: bytes, proof: bytes) -> bytearray:
    return _handshake(Kind.CHALLENGE, _CHALLENGE.pack(nonce, proof))


def decode_challenge(body: memoryview) -> tuple[bytes, bytes]:
    nonce, proof = _CHALLENGE.unpack_from(body, 0)
    return bytes(nonce), bytes(proof)


def encode_proof(proof: bytes) -> bytearray:
    return _handshake(Kind.PROOF, _PROOF.pack(proof))


def decode_proof(body: memoryview) -> bytes:
    return bytes(_PROOF.unpack_from(body, 0)[0])


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
    tags: int = 1  # the tag prefix of what the relay receives


def packed_planes(fmt: ColorFormat, width: int, height: int) -> list[tuple[int, int]]:
    """(row bytes, rows) of each plane as the wire carries a frame: planes one after the other,
    rows without padding."""
    return [(g.row_bytes, g.height) for g in plane_geometry(fmt, width, height, 0)]


def frame_bytes(fmt: ColorFormat, width: int, height: int) -> int:
    return sum(row * rows for row, rows in packed_planes(fmt, width, height))


def encode_welcome(w: Welcome) -> bytearray:
    fps = math.nan if w.fps is None else float(w.fps)
    return _handshake(Kind.WELCOME, _WELCOME.pack(w.width, w.height, int(w.format), w.window, w.pool,
                                                  w.publisher_pid, w.instance, w.next_seq, fps, w.frame_bytes,
                                                  w.tags))


def decode_welcome(body: memoryview) -> Welcome:
    width, height, fmt, window, pool, pid, instance, next_seq, fps, size, tags = _WELCOME.unpack_from(body, 0)
    try:
        fmt = color_format(fmt)
        check_size(width, height, fmt)
    except Exception as exc:  # noqa: BLE001 - any refusal of the geometry is the peer's fault
        raise WireError(f"malformed message from the remote peer: frame geometry ({exc})") from None
    _check(1 <= window <= MAX_WINDOW, f"window {window}")
    _check(0 <= pool <= protocol.MAX_POOL, f"pool {pool}")
    expected = frame_bytes(fmt, width, height)
    _check(size == expected and 0 < size <= MAX_FRAME, f"frame size {size} for {width}x{height} {fmt.name}")
    _check(1 <= tags <= MAX_PREFIX, "tag prefix")
    return Welcome(width, height, fmt, window, pool, pid, instance, next_seq, None if math.isnan(fps) else fps, size,
                   tags)


def encode_refuse(code: int, reason: str) -> bytearray:
    text = reason.encode()[:MAX_REASON]
    return _handshake(Kind.REFUSE, _REFUSE.pack(code, len(text)) + text)


def expect(data: bytes | bytearray | memoryview, want: Kind, *, refusal: bool = False) -> memoryview:
    """The body of handshake message ``data``, which must be of kind ``want`` (:class:`WireError`
    if not). ``refusal``: the peer may answer REFUSE instead (a relay does): :class:`Refused` with
    its reason and code."""
    kind, body = handshake_kind(data)
    if refusal and kind is Kind.REFUSE:
        code, reason = decode_refuse(body)
        raise Refused(f"the relay refused: {reason}", code)
    if kind is not want:
        raise WireError(f"expected {want.name}, got {kind.name}")
    return body


def decode_refuse(body: memoryview) -> tuple[int, str]:
    code, length = _REFUSE.unpack_from(body, 0)
    _check(length <= MAX_REASON, "reason length")
    return code, peer_text(body[_REFUSE.size:_REFUSE.size + length])


# ---- the data phase ---------------------------------------------------------------------------

def pack_frame(out: Any, seq: int, timestamp_ns: int, payload: bytes) -> None:
    """Write a FRAME's header and payload in front of its data in ``out`` (a staging buffer)."""
    _HEADER.pack_into(out, 0, _HEAD_MAGIC, int(Head.FRAME), seq, timestamp_ns, len(payload), 0, 0)
    out[HEADER:HEADER + len(payload)] = np.frombuffer(payload, np.uint8)


def encode_note(kind: Head, code: int = 0, reason: str = "", sent: int = 0) -> bytearray:
    """A BEAT or GONE note; a GONE's ``sent`` (in the header's seq field) is how many frames the
    relay sent on this connection: the subscriber ends once it received them all."""
    text = reason.encode()[:NOTE_REASON]
    out = bytearray(NOTE)
    _HEADER.pack_into(out, 0, _HEAD_MAGIC, int(kind), sent, 0, len(text), code, 0)
    out[HEADER:HEADER + len(text)] = text
    return out


def decode_header(data: bytes | bytearray | memoryview) -> tuple[Head, int, int, int, int, int]:
    """(kind, seq, timestamp_ns, length, code, skipped); the length is checked against its kind's bound."""
    magic, kind, seq, ts, length, code, skipped = _HEADER.unpack_from(data, 0)
    _check(magic == _HEAD_MAGIC, "header magic")
    _check(kind in Head._value2member_map_, f"header kind {kind}")
    kind = Head(kind)
    _check(length <= (protocol.MAX_PAYLOAD if kind is Head.FRAME else MAX_REASON), f"length {length}")
    return kind, seq, ts, length, code, skipped


def encode_control(kind: Control, count: int = 0) -> bytearray:
    out = bytearray(CONTROL)
    _CONTROL.pack_into(out, 0, _CONTROL_MAGIC, int(kind), count)
    return out


def decode_control(data: bytes | bytearray | memoryview) -> tuple[Control, int]:
    magic, kind, count = _CONTROL.unpack_from(data, 0)
    _check(magic == _CONTROL_MAGIC, "control magic")
    _check(kind in Control._value2member_map_, f"control kind {kind}")
    _check(count <= MAX_WINDOW, f"credit {count}")
    return Control(kind), count

