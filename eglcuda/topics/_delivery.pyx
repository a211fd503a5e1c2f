# cython: language_level=3
"""A topic publisher's books and its per-frame delivery steps, compiled: the one place they are
kept.

:class:`Slot` (a pool frame and who holds it) and :class:`Member` (a subscriber after its
handshake) are typed in ``_delivery.pxd``. The steps every frame takes live here and nowhere else:

- :func:`hand_out`: the FRAME message of a slot to every subscriber whose link takes the message
  alone (``message_only``: ``cuda-ipc``, ``cuda-vmm``) and that may take it now; the rest go back
  to the publisher's Python path (another transport, at its credit, a new slot, a full socket);
- :func:`settle`: the plain releases of a batch of messages (no done event);
- :func:`full_every`: the ``every`` subscribers a publish waits for; :func:`take_free`: the
  free slot :meth:`~eglcuda.topics.delivery.Delivery.free_slot` hands out;
- :func:`delivered`, :func:`released`, :func:`free_if_unheld`, :func:`forget`: the same book
  entries for the publisher's Python path (SLOT messages, EGLStream presents, releases with a done
  event, drops), which calls them and never keeps books of its own.

Measured on an H100: the Python form of these steps cost the publisher about 1.6 us per subscriber
per frame, eight subscribers' worth a fifth of a frame's time.
"""
import time

from libc.stdint cimport uint64_t
from eglcuda.topics._ring cimport Ring

from .info import SubscriberInfo
from . import _wire, protocol

cdef extern from "<sys/socket.h>" nogil:
    ssize_t send(int fd, const void *buf, size_t n, int flags)
    int MSG_DONTWAIT
    int MSG_NOSIGNAL

FREE = SLOT_FREE
WRITING = SLOT_WRITING
PUBLISHED = SLOT_PUBLISHED
STATE_NAMES = {SLOT_FREE: "free", SLOT_WRITING: "writing", SLOT_PUBLISHED: "published"}

cdef object Release = protocol.Release
cdef object Carried = protocol.Carried
cdef object LATEST = protocol.Qos.LATEST
cdef unsigned int RELEASE_RECORDED = protocol.RELEASE_RECORDED
cdef int KIND_BYE = int(protocol.Kind.BYE)
cdef unsigned long long WAKE_ALLOWANCE = 8  # WAKEs past the releases counted (wakes_past_releases): no peer needs one


cdef class Slot:
    """One pool frame and who holds it."""

    def __init__(self, int index, object frame):
        self.index = index
        self.frame = frame
        self.state = SLOT_FREE
        self.holders = set()
        self.waiters = {}
        self.seq = -1
        self.published_at = 0.0

    def __repr__(self):
        return f"<Slot {self.index} {STATE_NAMES.get(self.state, self.state)} seq {self.seq}>"


cdef class Member:
    """A subscriber after its handshake, as the publishing thread tracks it."""

    def __init__(self, long long ident, object sock, object peer, object hello, object link, str transport,
                 int recv_limit, int read_batch, Ring ring=None):
        self.id = ident
        self.sock = sock
        self.fd = sock.fileno()
        self.inbox = _wire.Inbox(self.fd, recv_limit, read_batch)  # its messages, read by the publishing thread
        self.inbox.counts_wakes = True  # (its WAKEs are held against its releases: wakes_past_releases)
        self.peer = peer
        self.qos = hello.qos
        self.latest = hello.qos is LATEST
        self.queue = hello.queue
        self.link = link
        self.message_only = link.message_only
        self.plain_release = link.plain_release
        self.credit = protocol.credit(hello.qos, hello.queue, link.message_only)
        self.transport = transport
        self.outstanding = {}
        self.seen_slots = set()
        self.delivered = 0
        self.skipped = 0
        self.noticed = False
        self.since = time.time()
        self.alive = True
        self.leaving = False
        self.ring = ring

    def info(self):
        return SubscriberInfo(id=self.id, pid=self.peer.pid, uid=self.peer.uid, qos=self.qos.name.lower(),
                              queue=self.queue, transport=self.transport, delivered=self.delivered,
                              skipped=self.skipped, outstanding=len(self.outstanding), since=self.since)

    def __repr__(self):
        return f"<Member {self.id} pid {self.peer.pid} {self.transport}{'' if self.alive else ' gone'}>"


# ---- the book entries ------------------------------------------------------------------------------

cdef int record_delivery(Member sub, Slot slot, object seq) except -1:
    sub.outstanding[seq] = slot
    slot.holders.add(sub)
    sub.delivered += 1
    sub.noticed = False
    return 0


cdef int maybe_free(Slot slot, object free) except -1:
    if slot.state == SLOT_PUBLISHED and not slot.holders:
        slot.state = SLOT_FREE
        free.append(slot)
    return 0


cdef int let_go(Member sub, Slot slot, bint recorded, double now, object free) except -1:
    slot.holders.discard(sub)
    if recorded:
        slot.waiters[sub] = now
    maybe_free(slot, free)
    return 0


def delivered(Member sub, Slot slot, object seq):
    """``sub`` got frame ``seq`` of ``slot``: it holds the slot until it releases the frame."""
    record_delivery(sub, slot, seq)


def released(Member sub, Slot slot, bint recorded, double now, object free):
    """``sub``'s link let go of ``slot``; ``recorded``: its GPU work may still read it (a done event
    recorded at ``now``). A published slot nobody holds any more goes to the end of ``free``."""
    let_go(sub, slot, recorded, now, free)


def free_if_unheld(Slot slot, object free):
    """A published slot nobody holds becomes free (the end of ``free``)."""
    maybe_free(slot, free)


def forget(Member sub, list pool, object free):
    """``sub`` is gone: it holds nothing, and no slot waits for its GPU work any more."""
    cdef Slot slot
    sub.outstanding.clear()
    for slot in pool:
        slot.holders.discard(sub)
        slot.waiters.pop(sub, None)
    for slot in pool:
        maybe_free(slot, free)


# ---- the per-frame steps ---------------------------------------------------------------------------

def hand_out(list subs, Slot slot, object seq, bytes data, object stream, set recorded, unsigned long long
             timestamp_ns=0, bytes payload=b"", double now=-1.0, double read_at=0.0, double interval=0.0):
    """Send the FRAME message ``data`` of ``slot`` (sequence ``seq``) to each live subscriber whose
    link is message-only and which may take it now: a ``latest`` subscriber below its credit, a
    slot it was described. Before a transport's first send, ``transport.on_publish(slot, stream)``
    runs once (unless the transport is in ``recorded``, to which it is added). A subscriber with a
    ring gets the frame (``timestamp_ns``, ``payload``) as a ring entry instead, when it fits one.

    With ``now`` (``time.monotonic()``; the last read of the subscribers' messages at ``read_at``,
    one due every ``interval``), a ``latest`` subscriber with a ring, at its credit, told of a skip
    already, with no release in its ring or on its socket and no read due, skips the frame here
    (its ``skipped`` count goes up): one that takes few frames of a fast topic costs the
    publisher no Python and no system call a frame.

    Returns the live subscribers this did not serve, in order (another kind of link, at its
    credit, a new slot, a full or failed socket, a failed record: the publisher's Python path
    serves them)."""
    cdef list others = []
    cdef set failed = None
    cdef const char *raw = data
    cdef Py_ssize_t size = len(data)
    cdef const char *extra = payload
    cdef Py_ssize_t extra_size = len(payload)
    cdef ssize_t sent
    cdef Ring ring
    cdef Member sub
    cdef int index = slot.index
    for sub in subs:
        if not sub.alive:
            continue
        if sub.latest and len(sub.outstanding) >= sub.credit:
            ring = sub.ring
            if (ring is None or now < 0 or not sub.noticed or now - read_at >= interval
                    or ring.released_since()):
                others.append(sub)
            else:
                sub.skipped += 1
            continue
        if not sub.message_only or index not in sub.seen_slots:
            others.append(sub)
            continue
        transport = sub.link.transport
        if transport not in recorded:
            if failed is not None and transport in failed:
                others.append(sub)
                continue
            try:
                transport.on_publish(slot, stream)
            except Exception:  # the Python path meets it again, and drops with the reason
                if failed is None:
                    failed = set()
                failed.add(transport)
                others.append(sub)
                continue
            recorded.add(transport)
        ring = sub.ring
        if ring is not None:
            if ring.push_frame(seq, index, timestamp_ns, extra, extra_size) != 0:
                others.append(sub)  # (too long for an entry, or a full or bad ring: the Python path)
                continue
            ring.wake(sub.fd)
        else:
            sent = send(sub.fd, raw, size, MSG_DONTWAIT | MSG_NOSIGNAL)
            if sent != size:  # (a full socket or a broken connection: the Python path decides)
                others.append(sub)
                continue
        record_delivery(sub, slot, seq)
    return others


def settle(list batch, object free):
    """Handle the plain releases of ``batch`` (``[(member, message), ...]`` from
    :func:`eglcuda.topics._wire.drain`): a ``Release`` with no done event (neither recorded nor
    sent), from a live subscriber whose link frees a slot on such a release, for a frame it holds.
    A subscriber whose goodbye (or end of connection: ``b""``) is in the batch is marked
    ``leaving`` (a release before it that fails to take frames back is its leaving).

    Returns what is left, in order: every other message, and all that follow one of them from the
    same subscriber (its messages keep their order). Of a subscriber dropped already, only the
    messages that brought descriptors are left (for the caller to close them)."""
    cdef list rest = []
    cdef set held_back = set()  # subscribers with a message in ``rest``: their later ones follow it
    cdef Member sub
    cdef Slot slot
    cdef bytes data
    for entry in batch:
        sub = <Member>entry[0]
        message = entry[1]
        if message.__class__ is bytes:
            data = <bytes>message
            if not data or data[0] == KIND_BYE:
                sub.leaving = True  # (read when the publisher's path handles the rest)
        if not sub.alive and message.__class__ is not Carried:  # (descriptors go on, to be closed)
            continue
        if (message.__class__ is Release and sub.plain_release and sub not in held_back and not message[2]
                and not <unsigned int>message[1] & RELEASE_RECORDED):
            found = sub.outstanding.pop(message[0], None)
            if found is not None:
                slot = <Slot>found
                let_go(sub, slot, False, 0.0, free)
                continue
            # (not a frame it holds: the publisher's path drops it with the reason)
        rest.append(entry)
        held_back.add(sub)
    return rest


def collect(list subs, object free):
    """Take the releases the live subscribers of ``subs`` wrote into their rings (no system call):
    each one's frame is let go of as a plain release. Returns ``[(member, reason), ...]`` for those
    whose ring holds what a subscriber cannot have written (a bad count, a frame it does not
    hold): the publisher's path drops them. Nothing is freed for a frame not handed to it."""
    cdef list bad = None
    cdef Member sub
    cdef Ring ring
    cdef uint64_t seq
    cdef int got
    for sub in subs:
        ring = sub.ring
        if ring is None or not sub.alive:
            continue
        while True:
            got = ring.take_release(&seq)
            if got == 0:
                break
            found = sub.outstanding.pop(seq, None) if got == 1 else None
            if found is None:
                if bad is None:
                    bad = []
                bad.append((sub, f"its ring released frame {seq}, which it does not hold" if got == 1 else
                            "its ring's release count or entry is not one it can have written"))
                break
            let_go(sub, <Slot>found, False, 0.0, free)
    return bad or []


def wakes_past_releases(Member sub):
    """Whether ``sub`` sent more WAKEs than its releases explain: a subscriber sends one only after
    counting a release written into its ring, and only when the publisher said it sleeps (a
    subscriber without a ring has nothing to wake the publisher for)."""
    written = 0 if sub.ring is None else sub.ring.releases_written()
    return sub.inbox.wakes > written + WAKE_ALLOWANCE


def note_sockets(list subs):
    """The publisher is about to read its subscribers' sockets: each ring's count of releases
    sent by socket is read up to now (see ``Ring.note_socket``)."""
    cdef Member sub
    for sub in subs:
        if sub.ring is not None and sub.alive:
            sub.ring.note_socket()


def sleeping(list subs, bint on):
    """Set (``on``) or clear the publisher's "sleeps" flag in the live subscribers' rings; with
    ``on``, whether a release is already waiting in one (then it should not sleep)."""
    cdef Member sub
    cdef bint waiting = False
    for sub in subs:
        if sub.ring is not None and sub.alive and sub.ring.sleeping(on):
            waiting = True
    return waiting


def full_every(list subs):
    """The live ``every`` subscribers of ``subs`` whose queue is full (as many frames outstanding as
    their credit), in order: those a publish waits for. Empty when none is (every frame asks)."""
    cdef list full = []
    cdef Member sub
    for sub in subs:
        if sub.alive and not sub.latest and len(sub.outstanding) >= sub.credit:
            full.append(sub)
    return full


def take_free(object free, object settled):
    """The oldest free slot of the deque ``free`` that nobody released with a done event, else the
    oldest whose former readers' GPU work has all finished (``settled(slot)`` asks, for a slot
    released with done events), so that writing it needs no wait; None when there is none. A
    slot some reader may still read is asked about only when no other is free: a subscriber that
    releases with done events (its copy of the frame still running) beside one that does not
    costs the publisher no question to the driver a frame. Stale entries (taken or published
    since) are dropped; a free slot held again becomes published (free once released); the
    unsettled ones stay free, in order (also when ``settled`` raises)."""
    cdef list waiting = []  # free slots with done events to ask about, in order
    cdef Slot slot
    cdef Slot found = None
    cdef Py_ssize_t index
    try:
        while free:
            slot = <Slot>free.popleft()
            if slot.state != SLOT_FREE:
                continue  # a stale entry: the slot was taken or published since
            if slot.holders:  # (not expected: a free slot nobody holds) held again: free once released
                slot.state = SLOT_PUBLISHED
                continue
            if slot.waiters:
                waiting.append(slot)  # (put back below, in order)
                continue
            found = slot
            break
        if found is None:
            for index in range(len(waiting)):
                if settled(waiting[index]):
                    found = <Slot>waiting.pop(index)
                    break
    finally:
        if waiting:
            free.extendleft(reversed(waiting))
    return found


def worth_a_read(list subs, double now, double read_at, double interval):
    """Whether the messages of the live ``latest`` subscribers of ``subs`` at their credit are worth
    reading before a frame is handed out: when there is one, and the last read (``read_at``) is
    ``interval`` old, or one of them released a frame since (into its ring, or on its socket, as
    its ring counts), or, for one without a ring, keeps up (the oldest frame it holds is younger
    than ``interval``: its release may be on the way)."""
    cdef Member sub
    cdef Ring ring
    for sub in subs:
        if not (sub.alive and sub.latest and len(sub.outstanding) >= sub.credit):
            continue
        if now - read_at >= interval:
            return True
        ring = sub.ring
        if ring is not None:
            if ring.released_since():
                return True
            continue
        for slot in sub.outstanding.values():  # (the oldest first: entries are made in order)
            if now - (<Slot>slot).published_at < interval:
                return True
            break
    return False


def skip_full(list subs):
    """Skip the frame for every live ``latest`` subscriber of ``subs`` at its credit (its
    ``skipped`` count goes up). Returns ``(rest, notify)``: the other live subscribers, in order,
    and those skipped that were not told of a skip since their last frame (the publisher's path
    sends them a NOTICE)."""
    cdef list rest = []
    cdef list notify = []
    cdef Member sub
    for sub in subs:
        if not sub.alive:
            continue
        if sub.latest and len(sub.outstanding) >= sub.credit:
            sub.skipped += 1
            if not sub.noticed:
                notify.append(sub)
            continue
        rest.append(sub)
    return rest, notify
