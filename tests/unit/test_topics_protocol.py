"""The topic wire format (eglcuda.topics.protocol): every message round-trips, and anything
that is not exactly a valid message is refused with ProtocolError, and the compiled reader
(eglcuda/topics/_wire.pyx) decodes what it takes exactly as the decoder does (Hypothesis properties)."""
from __future__ import annotations

import json
import select
import socket
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from eglcuda.topics import _wire, protocol
from eglcuda.topics.protocol import ProtocolError

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
u64 = st.integers(0, 2**64 - 1)
transport_names = st.from_regex(r"[a-z0-9][a-z0-9-]{0,31}", fullmatch=True)
topic_names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}", fullmatch=True)
reasons = st.text(max_size=200)

hellos = st.builds(
    protocol.Hello,
    pid=u32,
    qos=st.sampled_from(list(protocol.Qos)),
    queue=st.integers(1, protocol.MAX_QUEUE),
    consumer=st.sampled_from(list(protocol.ConsumerKind)),
    device=st.integers(-1, 0x7FFFFFFF),
    gpu_uuid=st.binary(min_size=16, max_size=16),
    integrated=st.booleans(),
    wishes=st.lists(transport_names, min_size=1, max_size=protocol.MAX_WISHES, unique=True).map(tuple),
    topic=topic_names,
)
welcomes = st.builds(
    protocol.Welcome,
    publisher_pid=u32,
    instance=u64,
    width=st.integers(1, protocol.MAX_DIMENSION),
    height=st.integers(1, protocol.MAX_DIMENSION),
    format=u32,
    layout=st.just(0),
    pitch=st.integers(1, 0xFFFFFFFF),
    plane_offsets=st.lists(u64, min_size=1, max_size=3).map(tuple),
    fps=st.floats(0.0, 1e6, allow_nan=False),
    pool=st.integers(1, protocol.MAX_POOL),
    next_seq=u64,
    transport=transport_names,
    topic=topic_names,
    extra=st.binary(max_size=300),
)
frames = st.builds(protocol.Frame, seq=u64, slot=st.integers(0, protocol.MAX_POOL - 1), timestamp_ns=u64,
                   number=u64, payload=st.binary(max_size=600))
releases = st.builds(protocol.Release, seq=u64, flags=st.sampled_from([0, 1, 2, 3]),
                     extra=st.binary(max_size=protocol.MAX_RELEASE_EXTRA))
messages = st.one_of(
    hellos,
    welcomes,
    frames,
    releases,
    st.builds(protocol.StatusRequest),
    st.builds(protocol.Attach, extra=st.binary(max_size=200)),
    st.builds(protocol.Ready, extra=st.binary(max_size=200)),
    st.builds(protocol.Refuse, code=u16, reason=reasons),
    st.builds(protocol.Drop, code=u16, reason=reasons),
    st.builds(protocol.Bye, code=u16, reason=reasons),
    st.builds(protocol.Slot, slot=st.integers(0, protocol.MAX_POOL - 1), extra=st.binary(max_size=200)),
    st.builds(protocol.Notice, seq=u64),
)


@SETTINGS
@given(messages)
def test_every_message_round_trips(message):
    data = protocol.encode(message)
    assert len(data) <= protocol.MAX_MESSAGE
    assert protocol.decode(data, 1 if isinstance(message, protocol.Attach) else 0) == message


@SETTINGS
@given(messages, st.data())
def test_a_cut_message_is_refused(message, data):
    encoded = protocol.encode(message)
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(ProtocolError):
        protocol.decode(encoded[:cut])


@SETTINGS
@given(messages, st.binary(min_size=1, max_size=16))
def test_trailing_bytes_are_refused(message, tail):
    with pytest.raises(ProtocolError):  # every kind has a length field or an exact size
        protocol.decode(protocol.encode(message) + tail)


@SETTINGS
@given(st.binary(max_size=400))
@example(b"")
@example(b"\x01ECTP\x01\x00")
@example(bytes([protocol.Kind.FRAME]) + bytes(30))
def test_random_bytes_are_refused_or_canonical(data):
    """Whatever decodes is exactly what encoding the result gives back: no two byte strings mean
    the same message, and nothing decodes partially."""
    try:
        message = protocol.decode(data)
    except ProtocolError:
        return
    if isinstance(message, protocol.Status):
        return  # JSON has more than one spelling
    assert protocol.encode(message) == data


@SETTINGS
@given(messages, st.data())
def test_a_flipped_byte_is_refused_or_canonical(message, data):
    encoded = bytearray(protocol.encode(message))
    at = data.draw(st.integers(0, len(encoded) - 1))
    encoded[at] ^= data.draw(st.integers(1, 255))
    try:
        decoded = protocol.decode(bytes(encoded), 1 if encoded[0] == protocol.Kind.ATTACH else 0)
    except ProtocolError:
        return
    assert protocol.encode(decoded) == bytes(encoded)


@SETTINGS
@given(messages.filter(lambda m: not isinstance(m, protocol.Attach)), st.integers(1, 2))
def test_descriptors_only_with_attach(message, fds):
    with pytest.raises(ProtocolError, match="descriptor"):
        protocol.decode(protocol.encode(message), fds)


def test_attach_takes_at_most_one_descriptor():
    data = protocol.encode(protocol.Attach(b""))
    assert protocol.decode(data, 1) == protocol.Attach(b"")
    with pytest.raises(ProtocolError):
        protocol.decode(data, 2)


@pytest.mark.parametrize("field, value", [
    ("qos", 2), ("queue", 0), ("queue", protocol.MAX_QUEUE + 1), ("consumer", 5), ("integrated", 2),
    ("device", -2), ("nwishes", 0), ("nwishes", protocol.MAX_WISHES + 1), ("version", 2), ("magic", b"HTTP"),
])
def test_hello_fields_out_of_range_are_refused(field, value):
    layout = ["kind", "magic", "version", "pid", "qos", "queue", "consumer", "device", "uuid", "integrated", "nwishes"]
    values = [protocol.Kind.HELLO, protocol.MAGIC, protocol.VERSION, 1, 0, 1, 0, 0, bytes(16), 0, 1]
    values[layout.index(field)] = value
    data = protocol._HELLO.pack(*values) + b"\x04null" + b"\x01t"
    with pytest.raises(ProtocolError):
        protocol.decode(data)


@pytest.mark.parametrize("wishes, topic", [
    ([b"NULL"], b"t"), ([b"-x"], b"t"), ([b"null", b"null"], b"t"), ([b"null"], b""), ([b"null"], b"../x"),
    ([b"a" * 33], b"t"),
])
def test_hello_names_are_checked(wishes, topic):
    head = protocol._HELLO.pack(protocol.Kind.HELLO, protocol.MAGIC, protocol.VERSION, 1, 0, 1, 0, 0, bytes(16), 0,
                                len(wishes))
    data = head + b"".join(bytes([len(w)]) + w for w in wishes) + bytes([len(topic)]) + topic
    with pytest.raises(ProtocolError):
        protocol.decode(data)


def test_unknown_kinds_and_oversized_messages_are_refused():
    for kind in (0, 14, 200, 255):
        with pytest.raises(ProtocolError, match="unknown"):
            protocol.decode(bytes([kind]) + bytes(20))
    with pytest.raises(ProtocolError):
        protocol.decode(b"\x07" + bytes(protocol.MAX_MESSAGE))
    with pytest.raises(ProtocolError):
        protocol.decode(protocol.FRAME_HEAD.pack(protocol.Kind.FRAME, 1, 0, 0, 0, protocol.MAX_PAYLOAD + 1)
                        + bytes(protocol.MAX_PAYLOAD + 1))


def test_bad_utf8_reason_and_bad_release_flags_are_refused():
    with pytest.raises(ProtocolError):
        protocol.decode(protocol._REASON.pack(protocol.Kind.DROP, 1, 2) + b"\xff\xfe")
    with pytest.raises(ProtocolError):
        protocol.decode(protocol._RELEASE.pack(protocol.Kind.RELEASE, 1, 0x80, 0))


def test_the_encoder_is_as_strict_as_the_decoder():
    with pytest.raises(ValueError):
        protocol.encode_frame(1, 0, 0, 0, bytes(protocol.MAX_PAYLOAD + 1))
    with pytest.raises(ValueError):
        protocol.encode(protocol.Hello(1, protocol.Qos.EVERY, 0, protocol.ConsumerKind.CUDA, 0, bytes(16), False,
                                       ("null",), "t"))
    with pytest.raises(ValueError):
        protocol.encode(protocol.Hello(1, protocol.Qos.EVERY, 1, protocol.ConsumerKind.CUDA, 0, bytes(16), False,
                                       ("Bad Name",), "t"))
    with pytest.raises(ValueError):
        protocol.encode_release(1, 0x10)
    # A reason longer than the limit is cut (on a character boundary), not refused.
    long = protocol.decode(protocol.encode(protocol.Drop(1, "é" * 2000)))
    assert len(long.reason.encode()) <= protocol.MAX_REASON and set(long.reason) == {"é"}


@SETTINGS
@given(st.dictionaries(st.text(max_size=10), st.integers() | st.text(max_size=10) | st.none(), max_size=10))
def test_status_is_a_json_object(body):
    assert protocol.decode(protocol.encode(protocol.Status(body))).body == body


def test_status_refuses_non_objects_and_non_finite_numbers():
    for text in (b"[1, 2]", b"nope", b'{"a": NaN}', b'{"a": Infinity}', b'"x"'):
        with pytest.raises(ProtocolError):
            protocol.decode(protocol._STATUS.pack(protocol.Kind.STATUS, len(text)) + text)
    assert json.loads(b"{}") == protocol.decode(protocol._STATUS.pack(protocol.Kind.STATUS, 2) + b"{}").body


# ---- the compiled reader (eglcuda/topics/_wire.pyx) ---------------------------------------------

@SETTINGS
@given(data=st.binary(max_size=protocol.MAX_MESSAGE))
@example(data=protocol.encode_frame(7, 3, 11, 0, b"payload"))
@example(data=protocol.encode_release(9, protocol.RELEASE_TAKEN, b"x" * 64))
@example(data=protocol.encode_frame(7, 3, 11, 0, b"payload")[:-1])
@example(data=protocol.RELEASE_HEAD.pack(int(protocol.Kind.RELEASE), 9, 0x80, 0))  # unknown flags
def test_the_compiled_reader_agrees_with_the_decoder(data):
    """What _wire.Inbox decodes itself (FRAME, RELEASE) equals protocol.decode's result; anything
    else comes back as its bytes, for protocol.decode to accept or refuse."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        inbox = _wire.Inbox(ours.fileno())
        if not data:
            return  # an empty datagram reads as the end of the connection; no message is empty
        theirs.send(data)
        got = inbox.next(time.monotonic() + 5)
        if isinstance(got, bytes):
            assert got == data
            try:
                decoded = protocol.decode(data)
            except ProtocolError:
                return
            assert not isinstance(decoded, (protocol.Frame, protocol.Release)), decoded
        else:
            assert got == protocol.decode(data) and type(got) is type(protocol.decode(data))


def test_the_compiled_reader_says_nothing_end_and_closed():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours:
        inbox = _wire.Inbox(ours.fileno())
        assert inbox.next() is None  # nothing waiting, no wait
        started = time.monotonic()
        assert inbox.next(started + 0.05) is None and time.monotonic() - started >= 0.045
        assert inbox.next(float("nan")) is None
        theirs.send(protocol.encode_release(1))
        theirs.send(protocol.encode_release(2))
        theirs.close()
        assert [inbox.next(), inbox.next(), inbox.next()] == [protocol.Release(1), protocol.Release(2), b""]
        inbox.close()
        assert inbox.next(time.monotonic() + 1) == b""  # closed: reads nothing more, waits for nothing
    with pytest.raises(ValueError):
        _wire.Inbox(-1)


def test_drain_reads_at_most_the_limit_per_connection():
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(2)]
    poller = select.epoll()
    try:
        inboxes = {}
        for key, (ours, theirs) in enumerate(pairs):
            poller.register(ours.fileno(), select.EPOLLIN)
            inboxes[ours.fileno()] = (_wire.Inbox(ours.fileno()), key)
            for seq in range(3):
                theirs.send(protocol.encode_release(seq))
        first = _wire.drain(poller.fileno(), 0.0, inboxes, 2)
        assert sorted(first) == [(k, protocol.Release(s)) for k in (0, 1) for s in (0, 1)]
        rest = _wire.drain(poller.fileno(), 1.0, inboxes, 2)
        assert sorted(rest) == [(0, protocol.Release(2)), (1, protocol.Release(2))]
        assert _wire.drain(poller.fileno(), 0.0, inboxes, 2) == []
    finally:
        poller.close()
        for ours, theirs in pairs:
            ours.close()
            theirs.close()
