"""The topic wire format: messages over a ``SOCK_SEQPACKET`` UNIX socket, one connection per
subscriber (and one per status query).

Each message is one datagram: a kind byte, then fixed little-endian fields, then length-prefixed
variable parts; the lengths must add up to the datagram's size exactly. :func:`decode` checks
every field (ranges, enum values, names, sizes, descriptors) and raises :class:`ProtocolError` on
anything else, so a peer that is not eglcuda, or is broken, is turned away at its first bad
message.

The exchange::

    subscriber                                    publisher
    HELLO (qos, queue, transports wished,  --->
           consumer kind, GPU, pid, topic)
                                           <---  WELCOME (size, format, layout, pitch, planes,
                                                          fps, pool, next seq, transport chosen,
                                                          transport data)   or REFUSE (why)
    ATTACH (transport data; the EGLStream  --->
            descriptor as SCM_RIGHTS)
                                           <---  READY (cuda-ipc, cuda-vmm: with the memfd of
                                                        this subscriber's frame ring), or REFUSE
                                           <---  SLOT (a pool slot's handles, before its first
                                                       use on this connection; cuda-ipc)
                                           <---  FRAME (seq, slot, timestamp, stream frame
                                                        number, payload; with a ring: a ring entry
                                                        unless the payload does not fit one)
    RELEASE (seq, flags, transport data;   --->
             with a ring: a ring entry unless it carries a done event)
    WAKE (one byte: the ring has news for  <-->
          a side that said it sleeps)
                                           <---  NOTICE (a newer frame was published that this
                                                         'latest' subscriber could not take)
                                           <---  DROP (why) / BYE (why)
    BYE (why)                              --->

    status client: STATUS_REQUEST  ---> ;  <--- STATUS (JSON, schema in registry.py)
"""
from __future__ import annotations

import enum
import json
import re
import struct
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Union

from ..errors import PeerError

VERSION = 2  # 2: frames and releases through a shared-memory ring (READY carries its memfd)
MAGIC = b"ECTP"  # eglcuda topic protocol

MAX_MESSAGE = 65536  # bytes in one datagram (STATUS is the largest)
MAX_PAYLOAD = 16384  # user bytes per frame
MAX_REASON = 1024  # bytes of UTF-8 in a DROP/REFUSE/BYE
MAX_EXTRA = 8192  # transport data in WELCOME, ATTACH, READY, SLOT
MAX_RELEASE_EXTRA = 128  # transport data in a RELEASE (cuda-ipc: one 64-byte event handle)
MAX_STATUS = MAX_MESSAGE - 8
MAX_WISHES = 8
MAX_POOL = 64  # pool slots (the EGLStream producer's in-flight limit)
MAX_QUEUE = 64
LATEST_HOLD = 2  # messages a 'latest' subscriber may hold: one in use, the newest waiting
# Frames a publisher lets a 'latest' subscriber on a message-only transport (CUDA IPC) have
# outstanding: held, announced and not received, or released with the release not read yet.
# Above LATEST_HOLD, so that the releases of one that keeps up are read every few frames, not
# before every frame (docs/topics.md, "Why a latest subscriber ... may keep four pool frames").
LATEST_CREDIT = 4
MAX_PLANES = 3
MAX_DIMENSION = 32768
_TRANSPORT = re.compile(rb"[a-z0-9][a-z0-9-]{0,31}\Z")
_TOPIC = re.compile(rb"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}\Z")


class ProtocolError(PeerError):
    """A peer sent something that is not a valid message here (or closed mid-exchange)."""


class VersionError(ProtocolError):
    """The peer speaks another version of the protocol (an older or newer eglcuda)."""


def _version(version: int) -> None:
    if version != VERSION:
        raise VersionError(f"protocol version {version}, this side speaks {VERSION}")


class Kind(enum.IntEnum):
    HELLO = 1
    STATUS_REQUEST = 2
    WELCOME = 3
    ATTACH = 4
    READY = 5
    REFUSE = 6
    FRAME = 7
    RELEASE = 8
    SLOT = 9
    NOTICE = 10
    BYE = 11
    STATUS = 12
    DROP = 13
    WAKE = 14  # one byte: the peer's ring has news and it said it sleeps (_ring.pyx); read past, never decoded


class Qos(enum.IntEnum):
    """A subscriber's quality of service (see :class:`eglcuda.Subscriber`)."""

    LATEST = 0
    EVERY = 1


def credit(qos: Qos, queue: int, message_only: bool = False) -> int:
    """How many frames the publisher lets a subscriber of ``qos`` (and ``queue``, for ``every``)
    have outstanding, whose transport is ``message_only`` or not: it sends it no more
    (``latest``: skips it; ``every``: waits)."""
    if qos is not Qos.LATEST:
        return queue
    return LATEST_CREDIT if message_only else LATEST_HOLD


def hold_limit(qos: Qos, queue: int) -> int:
    """How many received messages a subscriber of ``qos`` (and ``queue``) may hold at once."""
    return LATEST_HOLD if qos is Qos.LATEST else queue


class ConsumerKind(enum.IntEnum):
    CUDA = 0
    GL = 1


class Reason(enum.IntEnum):
    """Why a publisher turned a subscriber away, dropped it or closed (the ``code`` of
    :class:`eglcuda.Refused` and :class:`eglcuda.Dropped`, compared as ``exc.code ==
    Reason.UNSUPPORTED``), or why a subscriber left; the text that travels with the code
    (``exc.reason``) says the rest."""

    UNSPECIFIED = 0  #: no reason given
    QUEUE_FULL = 1  #: an 'every' subscriber did not release a frame within the publisher's every_timeout
    PROTOCOL = 2  #: a malformed or unexpected message
    CLOSING = 3  #: the publisher (or subscriber) is closing
    TRANSPORT = 4  #: the transport failed (a driver error, a stream disconnected)
    ACCESS = 5  #: the peer's uid is not allowed
    UNSUPPORTED = 6  #: no transport both sides can use, or a request this publisher cannot serve
    VERSION = 7  #: protocol version or topic name mismatch
    BUSY = 8  #: too many connections waiting for their handshake
    TIMEOUT = 9  #: a handshake step did not come in time


# Release flags.
RELEASE_RECORDED = 0x1  # the subscriber recorded its "done" event for the slot (cuda-ipc)
RELEASE_TAKEN = 0x2  # the subscriber used the frame (not set: it skipped it unread)
_RELEASE_FLAGS = RELEASE_RECORDED | RELEASE_TAKEN


@dataclass(frozen=True)
class Hello:
    pid: int
    qos: Qos
    queue: int
    consumer: ConsumerKind
    device: int  # the subscriber's CUDA ordinal (its own numbering), -1 for none
    gpu_uuid: bytes  # 16 bytes; zeros when unknown
    integrated: bool
    wishes: tuple[str, ...]  # transports the subscriber can use, best first
    topic: str
    version: int = VERSION


@dataclass(frozen=True)
class StatusRequest:
    version: int = VERSION


@dataclass(frozen=True)
class Welcome:
    publisher_pid: int
    instance: int  # random per publisher start: a restarted publisher has another
    width: int
    height: int
    format: int  # ColorFormat value
    layout: int  # 0 pitch, 1 array
    pitch: int
    plane_offsets: tuple[int, ...]  # bytes from the slot's base to each plane
    fps: float  # 0.0: unknown
    pool: int
    next_seq: int
    transport: str
    topic: str
    extra: bytes = b""
    version: int = VERSION


@dataclass(frozen=True)
class Attach:
    extra: bytes = b""


@dataclass(frozen=True)
class Ready:
    extra: bytes = b""


@dataclass(frozen=True)
class Refuse:
    code: int
    reason: str


@dataclass(frozen=True)
class Drop:
    code: int
    reason: str


@dataclass(frozen=True)
class Bye:
    code: int
    reason: str


class Frame(NamedTuple):  # the per-frame messages are tuples: cheaper to make than dataclasses
    seq: int
    slot: int
    timestamp_ns: int
    number: int  # the frame's number on the subscriber's EGLStream (0 for other transports)
    payload: bytes


class Carried(NamedTuple):
    """A message that came with descriptors (``SCM_RIGHTS``), as the compiled reader hands it out:
    its bytes (for :func:`decode`, with ``len(fds)``) and the descriptors, the receiver's to close."""

    data: bytes
    fds: list[int]


class Release(NamedTuple):
    seq: int
    flags: int = 0
    extra: bytes = b""


@dataclass(frozen=True)
class Slot:
    slot: int
    extra: bytes = b""


@dataclass(frozen=True)
class Notice:
    seq: int  # the newest frame published


@dataclass(frozen=True)
class Status:
    body: dict[str, Any]


Message = Union[Hello, StatusRequest, Welcome, Attach, Ready, Refuse, Drop, Bye, Frame, Release, Slot, Notice, Status]

# ---- layouts ------------------------------------------------------------------------------------
_HELLO = struct.Struct("<B4sHIBHBi16sBB")  # kind magic version pid qos queue consumer device uuid integrated nwishes
_STATUS_REQUEST = struct.Struct("<B4sH")
_WELCOME = struct.Struct("<BHIQIIIBIdHQB")  # kind version pid instance w h format layout pitch fps pool next nplanes
_EXTRA_ONLY = struct.Struct("<BH")  # kind, extra length
_REASON = struct.Struct("<BHH")  # kind, code, reason length
FRAME_HEAD = struct.Struct("<BQHQQH")  # kind seq slot timestamp number payload-length
RELEASE_HEAD = _RELEASE = struct.Struct("<BQBB")  # kind seq flags extra-length
_SLOT = struct.Struct("<BHH")  # kind slot extra-length
_NOTICE = struct.Struct("<BQ")
_STATUS = struct.Struct("<BI")
_FRAME_PACK = FRAME_HEAD.pack
_RELEASE_PACK = _RELEASE.pack
_KIND_FRAME_INT = int(Kind.FRAME)
_KIND_RELEASE_INT = int(Kind.RELEASE)
_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U64 = struct.Struct("<Q")

_U16_MAX = 0xFFFF
_U32_MAX = 0xFFFFFFFF
_U64_MAX = 0xFFFFFFFFFFFFFFFF


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise ProtocolError(what)


def _short_name(value: str, pattern: re.Pattern[bytes], what: str) -> bytes:
    data = value.encode("ascii", "strict") if isinstance(value, str) else b""
    if not pattern.match(data):
        raise ValueError(f"{what} {value!r} is not valid on the wire")
    return _U8.pack(len(data)) + data


def printable(text: str) -> str:
    """``text`` with each character that is not printable (a control character, a newline, an
    escape, a replacement character) as '?': what a peer's text may be before it reaches an
    exception or a log, where it could otherwise rewrite the terminal or forge lines."""
    if text.isprintable() and "\ufffd" not in text:
        return text
    return "".join(c if c.isprintable() and c != "\ufffd" else "?" for c in text)


def _reason_bytes(reason: str) -> bytes:
    data = printable(reason).encode("utf-8", "replace")
    if len(data) > MAX_REASON:  # cut on a character boundary
        data = data[:MAX_REASON].decode("utf-8", "ignore").encode("utf-8")
    return data


# ---- encoding -----------------------------------------------------------------------------------

def encode(message: Message) -> bytes:
    """The datagram for ``message``. Raises ValueError for a message this side must not send
    (fields out of range): the encoder is as strict as the decoder."""
    if isinstance(message, Frame):
        return encode_frame(message.seq, message.slot, message.timestamp_ns, message.number, message.payload)
    if isinstance(message, Release):
        return encode_release(message.seq, message.flags, message.extra)
    if isinstance(message, Hello):
        _range(message.pid, 0, _U32_MAX, "pid")
        _range(message.queue, 1, MAX_QUEUE, "queue")
        _range(message.device, -1, 0x7FFFFFFF, "device")
        if len(message.gpu_uuid) != 16:
            raise ValueError("gpu_uuid is 16 bytes")
        if not 1 <= len(message.wishes) <= MAX_WISHES:
            raise ValueError(f"1 to {MAX_WISHES} transport wishes")
        head = _HELLO.pack(Kind.HELLO, MAGIC, message.version, message.pid, Qos(message.qos),
                           message.queue, ConsumerKind(message.consumer), message.device, message.gpu_uuid,
                           int(bool(message.integrated)), len(message.wishes))
        wishes = b"".join(_short_name(w, _TRANSPORT, "transport") for w in message.wishes)
        return head + wishes + _short_name(message.topic, _TOPIC, "topic")
    if isinstance(message, StatusRequest):
        return _STATUS_REQUEST.pack(Kind.STATUS_REQUEST, MAGIC, message.version)
    if isinstance(message, Welcome):
        _range(message.width, 1, MAX_DIMENSION, "width")
        _range(message.height, 1, MAX_DIMENSION, "height")
        _range(message.pool, 1, MAX_POOL, "pool")
        if not 1 <= len(message.plane_offsets) <= MAX_PLANES or message.layout not in (0, 1):
            raise ValueError("1 to 3 planes, layout 0 or 1")
        if not message.fps >= 0.0 or message.fps > 1e6:
            raise ValueError("fps in 0..1e6")
        if len(message.extra) > MAX_EXTRA:
            raise ValueError("transport data too long")
        head = _WELCOME.pack(Kind.WELCOME, message.version, message.publisher_pid, message.instance, message.width,
                             message.height, message.format, message.layout, message.pitch, float(message.fps),
                             message.pool, message.next_seq, len(message.plane_offsets))
        offsets = b"".join(_U64.pack(o) for o in message.plane_offsets)
        return (head + offsets + _short_name(message.transport, _TRANSPORT, "transport")
                + _short_name(message.topic, _TOPIC, "topic") + _U16.pack(len(message.extra)) + message.extra)
    if isinstance(message, (Attach, Ready)):
        if len(message.extra) > MAX_EXTRA:
            raise ValueError("transport data too long")
        kind = Kind.ATTACH if isinstance(message, Attach) else Kind.READY
        return _EXTRA_ONLY.pack(kind, len(message.extra)) + message.extra
    if isinstance(message, (Refuse, Drop, Bye)):
        kind = {Refuse: Kind.REFUSE, Drop: Kind.DROP, Bye: Kind.BYE}[type(message)]
        _range(message.code, 0, _U16_MAX, "code")
        reason = _reason_bytes(message.reason)
        return _REASON.pack(kind, message.code, len(reason)) + reason
    if isinstance(message, Slot):
        _range(message.slot, 0, MAX_POOL - 1, "slot")
        if len(message.extra) > MAX_EXTRA:
            raise ValueError("transport data too long")
        return _SLOT.pack(Kind.SLOT, message.slot, len(message.extra)) + message.extra
    if isinstance(message, Notice):
        return _NOTICE.pack(Kind.NOTICE, message.seq)
    if isinstance(message, Status):
        body = json.dumps(message.body, separators=(",", ":"), allow_nan=False).encode()
        if len(body) > MAX_STATUS:
            raise ValueError("status too long")
        return _STATUS.pack(Kind.STATUS, len(body)) + body
    raise TypeError(f"not a topic message: {type(message).__name__}")


def _range(value: int, low: int, high: int, what: str) -> None:
    if not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{what} {value!r} outside {low}..{high}")


def encode_frame(seq: int, slot: int, timestamp_ns: int, number: int, payload: bytes) -> bytes:
    """The FRAME datagram (the per-frame message; struct packing without a dataclass)."""
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(f"a frame's payload is at most {MAX_PAYLOAD} bytes, got {len(payload)}")
    return _FRAME_PACK(_KIND_FRAME_INT, seq, slot, timestamp_ns, number, len(payload)) + payload


def encode_release(seq: int, flags: int = 0, extra: bytes = b"") -> bytes:
    if len(extra) > MAX_RELEASE_EXTRA or flags & ~_RELEASE_FLAGS:
        raise ValueError("bad release")
    return _RELEASE_PACK(_KIND_RELEASE_INT, seq, flags, len(extra)) + extra


# ---- decoding -----------------------------------------------------------------------------------

def decode(data: bytes | bytearray | memoryview, fds: int = 0) -> Message:
    """The message in one datagram ``data`` that came with ``fds`` descriptors. Raises
    :class:`ProtocolError` for anything that is not exactly a valid message (descriptors are
    allowed on ATTACH, SLOT and READY only, at most one)."""
    _check(isinstance(data, (bytes, bytearray, memoryview)), "not bytes")
    message = bytes(data)
    _check(0 < len(message) <= MAX_MESSAGE, f"a message of {len(message)} bytes")
    kind = message[0]
    _check(fds == 0 or (kind in (Kind.ATTACH, Kind.SLOT, Kind.READY) and fds <= 1),
           f"{fds} descriptor(s) with a message of kind {kind}")
    decoder = _DECODERS.get(kind)
    if decoder is None:
        raise ProtocolError(f"unknown message kind {kind}")
    try:
        return decoder(message)
    except ProtocolError:
        raise
    except (struct.error, ValueError, UnicodeDecodeError, IndexError) as exc:
        raise ProtocolError(f"malformed {Kind(kind).name}: {exc}") from None


def _name(data: bytes, at: int, pattern: re.Pattern[bytes], what: str) -> tuple[str, int]:
    _check(at < len(data), f"{what} missing")
    length = data[at]
    value = data[at + 1: at + 1 + length]
    _check(len(value) == length and pattern.match(value) is not None, f"bad {what} {value!r}")
    return value.decode("ascii"), at + 1 + length


def _end(data: bytes, at: int, what: str) -> None:
    _check(at == len(data), f"{what}: {len(data) - at} byte(s) left over")


def _decode_hello(data: bytes) -> Hello:
    (_, magic, version, pid, qos, queue, consumer, device, uuid, integrated,
     count) = _HELLO.unpack_from(data)
    _check(magic == MAGIC, "not an eglcuda topic greeting")
    _version(version)
    _check(qos in (Qos.LATEST, Qos.EVERY), f"qos {qos}")
    _check(1 <= queue <= MAX_QUEUE, f"queue {queue}")
    _check(consumer in (ConsumerKind.CUDA, ConsumerKind.GL), f"consumer kind {consumer}")
    _check(device >= -1, f"device {device}")
    _check(integrated in (0, 1), f"integrated {integrated}")
    _check(1 <= count <= MAX_WISHES, f"{count} transport wishes")
    at = _HELLO.size
    wishes = []
    for _ in range(count):
        wish, at = _name(data, at, _TRANSPORT, "transport")
        wishes.append(wish)
    _check(len(set(wishes)) == len(wishes), "a transport wished twice")
    topic, at = _name(data, at, _TOPIC, "topic")
    _end(data, at, "HELLO")
    return Hello(pid=pid, qos=Qos(qos), queue=queue, consumer=ConsumerKind(consumer), device=device, gpu_uuid=uuid,
                 integrated=bool(integrated), wishes=tuple(wishes), topic=topic, version=version)


def _decode_status_request(data: bytes) -> StatusRequest:
    _, magic, version = _STATUS_REQUEST.unpack_from(data)
    _check(magic == MAGIC, "not an eglcuda topic greeting")
    _version(version)
    _end(data, _STATUS_REQUEST.size, "STATUS_REQUEST")
    return StatusRequest(version)


def _decode_welcome(data: bytes) -> Welcome:
    (_, version, pid, instance, width, height, fmt, layout, pitch, fps, pool, next_seq,
     planes) = _WELCOME.unpack_from(data)
    _version(version)
    _check(1 <= width <= MAX_DIMENSION and 1 <= height <= MAX_DIMENSION, f"size {width}x{height}")
    _check(layout in (0, 1), f"layout {layout}")
    _check(fps == fps and 0.0 <= fps <= 1e6, f"fps {fps}")
    _check(1 <= pool <= MAX_POOL, f"pool {pool}")
    _check(1 <= planes <= MAX_PLANES, f"{planes} planes")
    _check(layout == 1 or pitch > 0, "a pitch-linear topic without a pitch")
    at = _WELCOME.size
    offsets = []
    for _ in range(planes):
        (offset,) = _U64.unpack_from(data, at)
        offsets.append(offset)
        at += 8
    transport, at = _name(data, at, _TRANSPORT, "transport")
    topic, at = _name(data, at, _TOPIC, "topic")
    (length,) = _U16.unpack_from(data, at)
    at += 2
    _check(length <= MAX_EXTRA, "transport data too long")
    extra = data[at: at + length]
    _check(len(extra) == length, "transport data cut short")
    _end(data, at + length, "WELCOME")
    return Welcome(publisher_pid=pid, instance=instance, width=width, height=height, format=fmt, layout=layout,
                   pitch=pitch, plane_offsets=tuple(offsets), fps=fps, pool=pool, next_seq=next_seq,
                   transport=transport, topic=topic, extra=extra, version=version)


def _decode_extra_only(data: bytes) -> Attach | Ready:
    kind, length = _EXTRA_ONLY.unpack_from(data)
    _check(length <= MAX_EXTRA, "transport data too long")
    _check(len(data) == _EXTRA_ONLY.size + length, "transport data length does not match")
    extra = data[_EXTRA_ONLY.size:]
    return Attach(extra) if kind == Kind.ATTACH else Ready(extra)


def _decode_reason(data: bytes) -> Refuse | Drop | Bye:
    kind, code, length = _REASON.unpack_from(data)
    _check(length <= MAX_REASON, "reason too long")
    _check(len(data) == _REASON.size + length, "reason length does not match")
    reason = data[_REASON.size:].decode("utf-8", "strict")
    _check(printable(reason) == reason, "reason with a character that is not printable")
    return _REASONED[Kind(kind)](code, reason)


_REASONED: dict[Kind, Callable[[int, str], Refuse | Drop | Bye]] = {Kind.REFUSE: Refuse, Kind.DROP: Drop, Kind.BYE: Bye}


def _decode_frame(data: bytes) -> Frame:
    _, seq, slot, timestamp, number, length = FRAME_HEAD.unpack_from(data)
    _check(slot < MAX_POOL, f"slot {slot}")
    _check(length <= MAX_PAYLOAD, "payload too long")
    _check(len(data) == FRAME_HEAD.size + length, "payload length does not match")
    return Frame(seq, slot, timestamp, number, data[FRAME_HEAD.size:])


def _decode_release(data: bytes) -> Release:
    _, seq, flags, length = _RELEASE.unpack_from(data)
    _check(not flags & ~_RELEASE_FLAGS, f"release flags 0x{flags:x}")
    _check(length <= MAX_RELEASE_EXTRA, "transport data too long")
    _check(len(data) == _RELEASE.size + length, "transport data length does not match")
    return Release(seq, flags, data[_RELEASE.size:])


def _decode_slot(data: bytes) -> Slot:
    _, slot, length = _SLOT.unpack_from(data)
    _check(slot < MAX_POOL, f"slot {slot}")
    _check(length <= MAX_EXTRA, "transport data too long")
    _check(len(data) == _SLOT.size + length, "transport data length does not match")
    return Slot(slot, data[_SLOT.size:])


def _decode_notice(data: bytes) -> Notice:
    _end(data, _NOTICE.size, "NOTICE")
    return Notice(_NOTICE.unpack_from(data)[1])


def _decode_status(data: bytes) -> Status:
    _, length = _STATUS.unpack_from(data)
    _check(length <= MAX_STATUS and len(data) == _STATUS.size + length, "status length does not match")
    try:
        body = json.loads(data[_STATUS.size:].decode("utf-8", "strict"),
                          parse_constant=lambda name: _fail(f"non-finite number {name}"))
    except (ValueError, RecursionError) as exc:  # (RecursionError: arrays nested thousands deep)
        raise ProtocolError(f"status is not JSON: {exc}") from None
    _check(isinstance(body, dict), "status is not a JSON object")
    return Status(body)


def _fail(what: str) -> Any:
    raise ProtocolError(what)


_DECODERS: dict[int, Callable[[bytes], Message]] = {
    Kind.HELLO: _decode_hello,
    Kind.STATUS_REQUEST: _decode_status_request,
    Kind.WELCOME: _decode_welcome,
    Kind.ATTACH: _decode_extra_only,
    Kind.READY: _decode_extra_only,
    Kind.REFUSE: _decode_reason,
    Kind.DROP: _decode_reason,
    Kind.BYE: _decode_reason,
    Kind.FRAME: _decode_frame,
    Kind.RELEASE: _decode_release,
    Kind.SLOT: _decode_slot,
    Kind.NOTICE: _decode_notice,
    Kind.STATUS: _decode_status,
}
