"""The topic wire format (eglcuda.topics.protocol): every message round-trips, and anything
that is not exactly a valid message is refused with ProtocolError, and the compiled reader
(eglcuda/topics/_wire.pyx) decodes what it takes exactly as the decoder does (Hypothesis properties)."""
from __future__ import annotations

import json
import os
import random
import resource
import select
import signal
import socket
import threading
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from eglcuda.errors import ClosedError
from eglcuda.topics import _wire, protocol, sockets
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
    if isinstance(message, (protocol.Refuse, protocol.Drop, protocol.Bye)):  # (sent as printable text)
        message = type(message)(message.code, protocol.printable(message.reason))
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
@given(messages.filter(lambda m: not isinstance(m, (protocol.Attach, protocol.Slot, protocol.Ready))), st.integers(1, 2))
def test_descriptors_only_with_attach_slot_and_ready(message, fds):
    with pytest.raises(ProtocolError, match="descriptor"):
        protocol.decode(protocol.encode(message), fds)


@pytest.mark.parametrize("message", [protocol.Attach(b""), protocol.Slot(3, b"12345678"), protocol.Ready(b"")])
def test_attach_slot_and_ready_take_at_most_one_descriptor(message):
    data = protocol.encode(message)
    assert protocol.decode(data, 1) == message
    with pytest.raises(ProtocolError):
        protocol.decode(data, 2)


@pytest.mark.parametrize("field, value", [
    ("qos", 2), ("queue", 0), ("queue", protocol.MAX_QUEUE + 1), ("consumer", 5), ("integrated", 2),
    ("device", -2), ("nwishes", 0), ("nwishes", protocol.MAX_WISHES + 1), ("version", protocol.VERSION + 1),
    ("version", protocol.VERSION - 1), ("magic", b"HTTP"),
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


@pytest.mark.parametrize("kind", [protocol.Kind.REFUSE, protocol.Kind.DROP, protocol.Kind.BYE])
@pytest.mark.parametrize("text", ["\x1b[2J\x1b[Hall clear", "line\nforged: line", "tab\there", "nul\x00", "\u2028",
                                  "bell\x07", "\ud800"])
def test_a_reason_that_could_rewrite_a_terminal_or_forge_a_log_line_is_refused_and_never_sent(kind, text):
    raw = text.encode("utf-8", "surrogatepass")
    forged = protocol._REASON.pack(kind, 3, len(raw)) + raw
    with pytest.raises(ProtocolError):
        protocol.decode(forged)
    message = {protocol.Kind.REFUSE: protocol.Refuse, protocol.Kind.DROP: protocol.Drop,
               protocol.Kind.BYE: protocol.Bye}[kind](3, f"ok {text} end")
    sent = protocol.decode(protocol.encode(message)).reason
    assert sent.isprintable() and sent.startswith("ok ") and sent.endswith(" end") and "?" in sent


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
    deep = b"[" * 2000 + b"]" * 2000  # (4 KB, a RecursionError in json.loads)
    for text in (b"[1, 2]", b"nope", b'{"a": NaN}', b'{"a": Infinity}', b'"x"', deep, b'{"a": ' + deep + b"}"):
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
        if data == bytes([int(protocol.Kind.WAKE)]):  # a WAKE did its work by waking the reader: not handed out
            assert inbox.next(time.monotonic() + 0.05) is None
            return
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


@settings(max_examples=60, deadline=None)
@given(seq=st.integers(0, 2**64 - 1), flags=st.sampled_from([0, protocol.RELEASE_TAKEN, protocol.RELEASE_RECORDED
                                                             | protocol.RELEASE_TAKEN]),
       extra=st.binary(max_size=protocol.MAX_RELEASE_EXTRA))
def test_the_compiled_release_sends_the_encoders_bytes(seq, flags, extra):
    """_wire.send_release puts on the wire exactly what protocol.encode_release makes; a full
    socket says 1 (the caller queues it), a closed connection -1; bad releases are refused."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        assert _wire.send_release(ours.fileno(), seq, flags, extra) == 0
        assert theirs.recv(4096) == protocol.encode_release(seq, flags, extra)
        sent = 0
        while (state := _wire.send_release(ours.fileno(), seq, flags, extra)) == 0:
            sent += 1
        assert state == 1 and sent > 0
        for _ in range(sent):  # what fitted arrived whole, in order
            assert theirs.recv(4096) == protocol.encode_release(seq, flags, extra)
        theirs.close()
        assert _wire.send_release(ours.fileno(), seq, flags, extra) == -1
    with pytest.raises(ValueError):
        _wire.send_release(-1, seq, flags, extra)
    with pytest.raises(ValueError):
        _wire.send_release(0, seq, 0x80, extra)
    with pytest.raises(ValueError):
        _wire.send_release(0, seq, flags, b"x" * (protocol.MAX_RELEASE_EXTRA + 1))


@pytest.mark.parametrize("waits", [False, True])
def test_a_goodbye_sent_before_a_reset_is_still_read(waits):
    """A peer that says goodbye and closes while a message of ours is still unread on its side
    resets the connection: the kernel reports ECONNRESET once, ahead of the goodbye. Both
    readers (the compiled one and sockets.receive_now) hand over the goodbye, then the end."""
    bye = protocol.encode(protocol.Bye(int(protocol.Reason.CLOSING), "leaving"))
    for reader in ("inbox", "receive_now"):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with ours:
            theirs.send(protocol.encode_release(4))
            theirs.send(bye)
            ours.send(protocol.encode_frame(1, 0, 0, 0, b""))  # never read by the peer
            theirs.close()
            if reader == "inbox":
                inbox = _wire.Inbox(ours.fileno())
                deadline = time.monotonic() + 5 if waits else None
                assert [inbox.next(deadline), inbox.next(deadline), inbox.next(deadline)] == \
                    [protocol.Release(4), bye, b""]
                inbox.close()
            else:
                ours.setblocking(False)
                got = [sockets.receive_now(ours) for _ in range(3)]
                assert got == [(protocol.encode_release(4), []), (bye, []), (b"", [])]


def test_the_compiled_reader_takes_what_is_waiting_with_one_read():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        inbox = _wire.Inbox(ours.fileno(), batch=4)
        for seq in range(5):
            theirs.send(protocol.encode_release(seq))
        assert inbox.next() == protocol.Release(0)
        assert inbox.queued_kinds() == bytes([protocol.Kind.RELEASE] * 3)  # read with it, not handed out yet
        assert [inbox.rest() for _ in range(3)] == [protocol.Release(s) for s in (1, 2, 3)]
        assert inbox.rest() == protocol.Release(4)  # that batch was full: there may be more, so it reads
        theirs.send(protocol.encode_release(5))
        assert inbox.rest() is None  # the last read emptied the socket: what came since is for next()
        assert inbox.next() == protocol.Release(5)
        theirs.send(protocol.encode(protocol.Bye(0, "leaving")))
        theirs.send(protocol.encode_release(6))
        theirs.shutdown(socket.SHUT_WR)
        first = inbox.next()
        assert isinstance(first, bytes) and first[0] == protocol.Kind.BYE
        assert inbox.queued_kinds() == bytes([protocol.Kind.RELEASE, 0])  # a release, then the end
        assert [inbox.rest(), inbox.rest()] == [protocol.Release(6), b""]
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        inbox = _wire.Inbox(ours.fileno(), batch=4)
        theirs.send(protocol.encode_release(1))
        assert inbox.next() == protocol.Release(1)  # a short batch: rest() would say "nothing more"
        inbox.close()
        assert inbox.rest() == b"" and inbox.next() == b""  # closed: the end, from either
    with pytest.raises(ValueError):
        _wire.Inbox(0, batch=0)


def test_a_closed_reader_closes_the_descriptors_it_read_and_never_handed_out():
    """Messages with descriptors (a SLOT of cuda-vmm; anything a hostile subscriber sends) read in
    one batch and not handed out when the connection closes: their descriptors are closed with it,
    also once the reader was closed before it went (a subscriber's close, a publisher's drop)."""
    def open_fds():
        return len(os.listdir("/proc/self/fd"))

    for close_first in (True, False):
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with ours, theirs:
            inbox = _wire.Inbox(ours.fileno(), batch=4)
            before = open_fds()
            for _ in range(3):
                read_end, write_end = os.pipe()
                socket.send_fds(theirs, [bytes([protocol.Kind.SLOT]) + b"slot"], [read_end, write_end])
                os.close(read_end)
                os.close(write_end)
            first = inbox.next()
            assert isinstance(first, protocol.Carried) and len(first.fds) == 2
            sockets.close_fds(first.fds)
            assert inbox.queued_kinds() == bytes([protocol.Kind.SLOT] * 2)  # two more, read with it
            if close_first:
                inbox.close()
            del inbox
            assert open_fds() == before


def test_the_compiled_reader_waits_then_reads_after_a_wait():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:
        inbox = _wire.Inbox(ours.fileno())
        assert inbox.next(time.monotonic() + 0.01) is None  # nothing came: the next wait polls first
        sender = threading.Timer(0.05, lambda: theirs.send(protocol.encode_release(7)))
        sender.start()
        assert inbox.next(time.monotonic() + 5) == protocol.Release(7)
        sender.join()
        for seq in range(8, 12):  # a backlog: read at once
            theirs.send(protocol.encode_release(seq))
        assert [inbox.next(time.monotonic() + 5) for _ in range(4)] == [protocol.Release(s) for s in range(8, 12)]
        assert inbox.next(time.monotonic() + 0.01) is None


def test_a_busy_wait_takes_a_message_without_sleeping_and_still_ends_every_wait():
    """With busy_wait, a wait asks without sleeping first: a message sent meanwhile arrives,
    one sent after it is still taken by the sleep that follows, an empty wait ends at its
    deadline (also one shorter than busy_wait, without sleeping), the wake descriptor ends it,
    and a signal's handler runs before the sleep. (Long waits and loose bounds: CI machines are
    slow and busy.)"""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    wake_r, wake_w = os.pipe()
    try:
        asking = _wire.Inbox(ours.fileno(), wake_fd=wake_r, busy_wait=3.0)
        assert asking.next(time.monotonic() + 0.01) is None  # nothing, and the wait ended by its deadline
        sender = threading.Timer(0.05, lambda: theirs.send(protocol.encode_release(1)))
        sender.start()
        started = time.monotonic()
        assert asking.next(started + 10) == protocol.Release(1)
        assert time.monotonic() - started < 2.5  # taken while asking, not after it
        sender.join()
        # An empty wait shorter than busy_wait asks until its deadline and never sleeps (no
        # voluntary context switch; three tries: another thread wanting the GIL back would count
        # as one); one with busy_wait 0 sleeps at once.
        switches = []
        for _ in range(3):
            sleeps = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
            started = time.monotonic()
            assert asking.next(started + 0.05) is None and 0.045 <= time.monotonic() - started < 2.0
            switches.append(resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw - sleeps)
        assert 0 in switches, f"it slept instead of asking: {switches} voluntary switches"
        sleeper = _wire.Inbox(ours.fileno())
        assert sleeper.next(time.monotonic() + 0.01) is None
        sleeps = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
        assert sleeper.next(time.monotonic() + 0.05) is None
        assert resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw > sleeps
        sleeper.close()
        # A signal while it asks: the handler runs at once (it landed in a poll, EINTR) or once
        # the asking ends (it landed between two), before the sleep, never at the deadline. Each
        # alarm lands between two polls about half the time: six of them.
        halfway = _wire.Inbox(ours.fileno(), busy_wait=0.3)
        assert halfway.next(time.monotonic() + 0.01) is None
        previous = signal.signal(signal.SIGALRM, _raise_alarm)
        try:
            for _ in range(6):
                signal.setitimer(signal.ITIMER_REAL, 0.05)
                started = time.monotonic()
                with pytest.raises(_Alarm):
                    halfway.next(started + 10)
                assert time.monotonic() - started < 5, "the handler ran only at the deadline"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
        halfway.close()
        threading.Timer(0.05, lambda: os.write(wake_w, b"x")).start()
        started = time.monotonic()
        assert asking.next(started + 10) == b""  # woken while asking: the owner is closing
        assert time.monotonic() - started < 2.5
        asking.close()
        os.read(wake_r, 1)
        brief = _wire.Inbox(ours.fileno(), wake_fd=wake_r, busy_wait=0.01)
        assert brief.next(time.monotonic() + 0.01) is None
        sender = threading.Timer(0.3, lambda: theirs.send(protocol.encode_release(2)))
        sender.start()
        assert brief.next(time.monotonic() + 10) == protocol.Release(2)  # (in the sleep after asking)
        sender.join()
        threading.Timer(0.3, lambda: os.write(wake_w, b"x")).start()
        started = time.monotonic()
        assert brief.next(started + 10) == b""  # woken while sleeping
        assert time.monotonic() - started < 5
        brief.close()
    finally:
        ours.close()
        theirs.close()
        os.close(wake_r)
        os.close(wake_w)
    with pytest.raises(ValueError, match="busy-waits"):
        _wire.Inbox(0, busy_wait=-1.0)
    with pytest.raises(ValueError, match="busy-waits"):
        _wire.Inbox(0, busy_wait=float("nan"))


def test_a_busy_wait_runs_signal_handlers_in_a_child_forked_from_a_thread():
    """A child forked from a thread other than the main one runs on that thread, which is its
    main thread now: a signal that lands while it asks has its handler run before the sleep
    there too (the main thread's identity is taken again after a fork)."""
    outcome = []

    def fork_here() -> None:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                inbox = _wire.Inbox(ours.fileno(), busy_wait=0.3)
                inbox.next(time.monotonic() + 0.01)
                signal.signal(signal.SIGALRM, _raise_alarm)
                code = 0
                for _ in range(6):
                    signal.setitimer(signal.ITIMER_REAL, 0.05)
                    started = time.monotonic()
                    try:
                        inbox.next(started + 10)
                        code = 3
                    except _Alarm:
                        if time.monotonic() - started > 5:
                            code = 4  # the handler ran at the deadline
            finally:
                os._exit(code)
        outcome.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))

    forker = threading.Thread(target=fork_here)
    forker.start()
    forker.join(60)
    assert outcome == [0]


class _Alarm(Exception):
    pass


def _raise_alarm(signum, frame):
    raise _Alarm()


def test_drain_hands_out_the_rest_of_a_batch_it_read():
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    poller = select.epoll()
    try:
        poller.register(ours.fileno(), select.EPOLLIN)
        inboxes = {ours.fileno(): (_wire.Inbox(ours.fileno(), batch=4), "sub")}
        for seq in range(6):
            theirs.send(protocol.encode_release(seq))
        # The limit is 2, but the read took 4 off the socket: all 4 come out (epoll no longer sees them).
        assert _wire.drain(poller.fileno(), 0.0, inboxes, 2) == [("sub", protocol.Release(s)) for s in range(4)]
        assert _wire.drain(poller.fileno(), 0.0, inboxes, 2) == [("sub", protocol.Release(s)) for s in (4, 5)]
        assert _wire.drain(poller.fileno(), 0.0, inboxes, 2) == []
    finally:
        poller.close()
        ours.close()
        theirs.close()


def test_drain_reads_at_most_the_limit_per_connection():
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(2)]
    poller = select.epoll()
    try:
        inboxes = {}
        for key, (ours, theirs) in enumerate(pairs):
            poller.register(ours.fileno(), select.EPOLLIN)
            inboxes[ours.fileno()] = (_wire.Inbox(ours.fileno(), batch=1), key)
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


def test_a_busy_cuda_ipc_publisher_records_without_asking_then_asks_again(monkeypatch):
    """The publisher's frame event: an idle publish stream is asked every frame (and then needs no
    record); once a publish found it busy, the next _ASK_AGAIN_AFTER frames are recorded without
    asking, then it asks again."""
    from types import SimpleNamespace

    from eglcuda.topics.transports import cuda_ipc as transports

    asked: list[bool] = []
    stream_busy = [True]

    def record(context: int, event: int, stream: int, query: bool = False) -> bool:
        assert (context, event, stream) == (11, 22, 33)
        asked.append(query)
        return stream_busy[0] or not query  # recorded: unless it asked and the stream was idle

    monkeypatch.setattr(transports._wire, "ipc_record", record)
    publisher = object.__new__(transports.CudaIpcPublisher)  # the bookkeeping alone: no device
    publisher.device = SimpleNamespace(context=11)
    publisher._slots = {0: SimpleNamespace(event=SimpleNamespace(address=22))}
    publisher._record_unasked = 0
    slot = SimpleNamespace(index=0)
    skipped = transports._ASK_AGAIN_AFTER

    for _ in range(2 * (skipped + 1)):
        publisher.on_publish(slot, 33)
    assert asked == ([True] + [False] * skipped) * 2
    publisher.on_publish(slot, 33)  # asks, finds it busy: the next frames record unasked
    stream_busy[0] = False  # the publisher's kernels stopped: after those frames, it asks each frame
    asked.clear()
    for _ in range(skipped + 4):
        publisher.on_publish(slot, 33)
    assert asked == [False] * skipped + [True] * 4


def test_releases_wait_in_order_while_the_publishers_socket_is_full():
    """A subscriber's releases never block: those the full socket does not take wait, and go
    out, in order and whole, once there is room (each later release first sends the waiting)."""
    from eglcuda.topics.connection import Connection
    from eglcuda.topics.joining import Joined

    rng = random.Random(43)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ours.setblocking(False)
    with ours, theirs:
        conn = Connection("t", Joined(ours, _wire.Inbox(ours.fileno()), None, None, 4),  # type: ignore[arg-type]
                          lambda: False, lambda: ClosedError("closed"))
        sent = []
        while not conn.unsent:  # until the socket is full and one waits
            release = (len(sent), rng.choice([0, protocol.RELEASE_TAKEN]), rng.randbytes(rng.randrange(65)))
            conn.send_release(*release)
            sent.append(release)
        for _ in range(5):  # more while some wait: queued behind them, not sent past them
            release = (len(sent), protocol.RELEASE_TAKEN, rng.randbytes(rng.randrange(65)))
            conn.send_release(*release)
            sent.append(release)
        assert len(conn.unsent) == 6
        got = []
        while len(got) < len(sent):
            got.append(protocol.decode(theirs.recv(4096)))
            conn.send_queued()
        assert not conn.unsent
        assert got == [protocol.Release(*release) for release in sent]


@pytest.mark.parametrize("offsets", [(12288, 12288), (0, 100), (1 << 40, 12288)],
                         ids=["planes-overlap", "chroma-inside-luma", "luma-after-chroma"])
def test_a_welcome_whose_planes_overlap_or_leave_the_slot_is_refused(offsets):
    """A lying publisher's WELCOME places a plane inside another, or past where the slot's size
    (the end of the last plane, which each SLOT is checked against) reaches: the subscriber
    refuses it before any frame, where such a plane read memory outside the slot."""
    from eglcuda.frames.formats import ColorFormat
    from eglcuda.topics.transports.base import Geometry

    welcome = protocol.Welcome(1, 2, 128, 96, int(ColorFormat.NV12), 0, 128, offsets, 30.0, 4, 0, "cuda-ipc", "t")
    with pytest.raises(protocol.ProtocolError, match="inside the plane before it"):
        Geometry.from_welcome(welcome)
    honest = protocol.Welcome(1, 2, 128, 96, int(ColorFormat.NV12), 0, 128, (0, 128 * 96), 30.0, 4, 0, "cuda-ipc", "t")
    assert Geometry.from_welcome(honest).plane_offsets == (0, 128 * 96)
