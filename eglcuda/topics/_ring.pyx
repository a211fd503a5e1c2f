# cython: language_level=3
"""A subscriber's announcement ring: shared memory through which a publisher announces frames to
one subscriber and takes its releases back, without a system call per frame on either side.

Before it, each frame cost a ``sendmsg`` per subscriber (the FRAME message) and a read of each
subscriber's RELEASE on the publisher's side, the same again on the subscriber's. Now the
publisher writes the frame into the subscriber's ring and the subscriber writes its release into
the ring beside it; the socket carries a one-byte WAKE only when the reader said it sleeps.

One ``memfd`` per subscriber, made by the publisher at the handshake, sealed against shrinking and
growing (a subscriber that truncated it would make the publisher's reads fault), passed with READY
(``SCM_RIGHTS``) and closed on both sides once mapped. Layout (host byte order, one host)::

    0      u32 magic "ECRG", u32 layout version, u32 frame entries, u32 entry size, u32 release entries
    64     u64 frames announced        (publisher writes)
    128    u64 frames read             (subscriber writes)
    192    u32 subscriber sleeps       (subscriber sets before it sleeps; publisher clears, then wakes it)
    256    u64 releases written        (subscriber writes)
    320    u64 releases read           (publisher writes)
    384    u32 publisher sleeps        (publisher sets before it sleeps; subscriber clears, then wakes it)
    448    u64 socket releases sent    (subscriber writes, after each release it sent on the socket)
    512    u32 subscriber dropped      (publisher sets before it frees the frames it announced to it)
    4096   256 frame entries of 512 bytes:
             u8 kind (1 FRAME, 2 SOCKET: the next message on the socket comes here in order),
             u8 0, u16 slot, u16 payload length, u16 0, u64 seq, u64 timestamp, payload (488 bytes)
    135168 256 release entries of 16 bytes: u64 seq, u64 flags (RELEASE_TAKEN or 0)

Each ring has one writer and one reader. The writer fills an entry, then stores its count
(sequentially consistent); the reader loads the count, then reads the entry. The wake-up is an
eventcount: a reader about to sleep sets its "sleeps" flag, reads the count again, and sleeps in
``poll`` on its socket only if nothing came; a writer, after storing its count, swaps the flag to 0
and sends a WAKE if it was set. Both sides use sequentially consistent operations, so either the
reader sees the new count or the writer sees the flag: no wake-up is lost.

The releases that go by socket (those with a done event) are counted in the ring as well: a
publisher asks that count, a load, before it reads a subscriber's socket for a release, instead of
a system call per frame that finds nothing.

Everything else stays on the socket (SLOT, NOTICE, DROP, BYE, a frame whose payload does not fit an
entry, releases with a done event), in order: after sending one, the publisher puts a SOCKET entry
in the ring, and the subscriber hands out the socket's next message when it reads that entry. The
end of the connection (its process died) is seen on the socket as before. Counts written by the
other side are checked (no going back, never more than the ring holds); a bad one ends that
subscriber with a reason, and a release is honoured only for a frame the publisher handed it.
"""
from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.exc cimport PyErr_CheckSignals
from cpython.pythread cimport PyThread_get_thread_ident
from libc.errno cimport EINTR, errno
from libc.math cimport isfinite
from libc.stdint cimport uint16_t, uint32_t, uint64_t, uint8_t
from libc.string cimport memcpy
from posix.mman cimport MAP_FAILED, MAP_SHARED, PROT_READ, PROT_WRITE, mmap, munmap
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

import collections
import fcntl
import os
import threading

from . import _wire, protocol

cdef extern from *:
    """
    #include <stdint.h>
    static inline uint64_t ring_load(volatile uint64_t *at) { return __atomic_load_n(at, __ATOMIC_SEQ_CST); }
    static inline void ring_store(volatile uint64_t *at, uint64_t value) { __atomic_store_n(at, value, __ATOMIC_SEQ_CST); }
    static inline void flag_set(volatile uint32_t *at, uint32_t value) { __atomic_store_n(at, value, __ATOMIC_SEQ_CST); }
    static inline uint32_t flag_load(volatile uint32_t *at) { return __atomic_load_n(at, __ATOMIC_SEQ_CST); }
    static inline uint32_t flag_take(volatile uint32_t *at) {
        return __atomic_load_n(at, __ATOMIC_SEQ_CST) ? __atomic_exchange_n(at, 0, __ATOMIC_SEQ_CST) : 0;
    }
    """
    uint64_t ring_load(uint64_t *at) noexcept nogil
    void ring_store(uint64_t *at, uint64_t value) noexcept nogil
    void flag_set(uint32_t *at, uint32_t value) noexcept nogil
    uint32_t flag_load(uint32_t *at) noexcept nogil
    uint32_t flag_take(uint32_t *at) noexcept nogil

cdef extern from "<sys/socket.h>" nogil:
    ssize_t send(int fd, const void *buf, size_t n, int flags)
    int MSG_DONTWAIT, MSG_NOSIGNAL

cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events, revents
    int poll(pollfd *fds, unsigned long nfds, int timeout)
    short POLLIN

cdef enum:
    MAGIC = 0x47524345  # "ECRG"
    LAYOUT = 2
    ENTRIES = 256  # frame entries (a power of two): more than a subscriber can have unread (see below)
    ENTRY = 512
    ENTRY_HEAD = 24
    INLINE = ENTRY - ENTRY_HEAD  # payload bytes an entry carries; a longer payload goes by socket
    RELEASES = 256  # release entries (a power of two)
    RELEASE_ENTRY = 16
    HEADER = 4096
    AT_FRAMES = 64
    AT_FRAMES_READ = 128
    AT_SUB_SLEEPS = 192
    AT_RELEASES = 256
    AT_RELEASES_READ = 320
    AT_PUB_SLEEPS = 384
    AT_SOCKET_RELEASES = 448
    AT_DROPPED = 512
    AT_RELEASE_ENTRIES = HEADER + ENTRIES * ENTRY
    SIZE = AT_RELEASE_ENTRIES + RELEASES * RELEASE_ENTRY
    KIND_FRAME_ENTRY = 1
    KIND_SOCKET_ENTRY = 2

# Unread entries at most: a subscriber's frames (its credit, at most MAX_QUEUE), one SOCKET entry per
# SLOT (MAX_POOL a connection), a NOTICE per frame plus one, a DROP and a BYE: 195 of 256.
assert ENTRIES > 2 * protocol.MAX_QUEUE + protocol.MAX_POOL + 3 and INLINE < protocol.MAX_PAYLOAD

BYTES = SIZE  # the mapping's size
INLINE_PAYLOAD = INLINE  # payload bytes that travel in the ring
cdef uint8_t KIND_WAKE = <uint8_t>int(protocol.Kind.WAKE)
cdef uint64_t RELEASE_TAKEN = protocol.RELEASE_TAKEN
cdef object Frame = protocol.Frame
cdef object tuple_new = tuple.__new__
cdef object NO_BYTES = b""
cdef object MALFORMED = b"\xfe"  # what a bad ring reads as: a message the decoder turns away
MARKER = object()  # a SOCKET entry (for the reader)
cdef unsigned long main_thread_ident = threading.main_thread().ident


def _forked() -> None:
    global main_thread_ident
    main_thread_ident = PyThread_get_thread_ident()


os.register_at_fork(after_in_child=_forked)


cdef inline double monotonic() noexcept nogil:
    cdef timespec now
    clock_gettime(CLOCK_MONOTONIC, &now)
    return now.tv_sec + now.tv_nsec * 1e-9


def create():
    """A new ring's memfd (sealed to its size), for the publisher: ``(Ring, fd)``. The descriptor
    is the caller's to send and close; the Ring keeps its own mapping."""
    fd = os.memfd_create("eglcuda-topic-ring", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, SIZE)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        return Ring(fd, True), fd
    except BaseException:
        os.close(fd)
        raise


def attach(int fd):
    """The subscriber's end of the ring in ``fd`` (READY's descriptor; the caller closes it).
    Raises ProtocolError when it is not a ring this side can map safely."""
    try:
        size = os.fstat(fd).st_size
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)
    except OSError as exc:
        raise protocol.ProtocolError(f"the frame ring is not a sealed memfd ({exc.strerror})") from None
    if size != SIZE or not seals & fcntl.F_SEAL_SHRINK:
        raise protocol.ProtocolError(f"the frame ring is {size} bytes (sealed: {bool(seals & fcntl.F_SEAL_SHRINK)}), "
                                     f"this side maps {SIZE} sealed")
    ring = Ring(fd, False)
    if (ring.u32(0) != MAGIC or ring.u32(4) != LAYOUT or ring.u32(8) != ENTRIES or ring.u32(12) != ENTRY
            or ring.u32(16) != RELEASES):
        ring.close()
        raise protocol.ProtocolError("the frame ring's header is not this side's layout")
    return ring


cdef class Ring:
    """One end of a subscriber's ring (see the module's text)."""

    def __cinit__(self, int fd, bint publisher):
        cdef void *at = mmap(NULL, SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
        if at == MAP_FAILED:
            raise OSError(errno, "mapping a topic's frame ring failed")
        self.base = <uint8_t *>at
        self.publisher = publisher
        if publisher:
            (<uint32_t *>self.base)[0] = MAGIC
            (<uint32_t *>self.base)[1] = LAYOUT
            (<uint32_t *>self.base)[2] = ENTRIES
            (<uint32_t *>self.base)[3] = ENTRY
            (<uint32_t *>self.base)[4] = RELEASES

    def __dealloc__(self):
        if self.base != NULL:
            munmap(self.base, SIZE)
            self.base = NULL

    def close(self):
        """Unmap (idempotent); every later step fails or finds nothing."""
        if self.base != NULL:
            munmap(self.base, SIZE)
            self.base = NULL

    def u32(self, Py_ssize_t at):
        if self.base == NULL or not 0 <= at <= SIZE - 4:
            raise ValueError("outside the ring")
        return (<uint32_t *>(self.base + at))[0]

    cdef uint64_t *count(self, int at) noexcept nogil:
        return <uint64_t *>(self.base + at)

    cdef uint32_t *flag(self, int at) noexcept nogil:
        return <uint32_t *>(self.base + at)

    # ---- the publisher's end -------------------------------------------------------------------------
    cdef int room(self) noexcept:
        """0 when an entry can be written, -1 when the ring is full, -2 when the subscriber's read
        count is not one it can have (it went back, or past what was written)."""
        cdef uint64_t read
        if self.mine - self.peer_taken < ENTRIES:
            return 0
        read = ring_load(self.count(AT_FRAMES_READ))
        if read < self.peer_taken or read > self.mine:
            return -2
        self.peer_taken = read
        return 0 if self.mine - read < ENTRIES else -1

    cdef int push_frame(self, uint64_t seq, int slot, uint64_t timestamp, const char *payload,
                        Py_ssize_t size) noexcept:
        """Announce a frame: 0, or 1 when its payload is too long for an entry (send it by
        socket), or room()'s -1 / -2."""
        cdef int free
        cdef uint8_t *entry
        if self.base == NULL or not self.publisher:
            return -2
        if size > INLINE:
            return 1
        free = self.room()
        if free:
            return free
        entry = self.base + HEADER + (self.mine & (ENTRIES - 1)) * ENTRY
        entry[0] = KIND_FRAME_ENTRY
        entry[1] = 0
        (<uint16_t *>(entry + 2))[0] = <uint16_t>slot
        (<uint16_t *>(entry + 4))[0] = <uint16_t>size
        (<uint16_t *>(entry + 6))[0] = 0
        (<uint64_t *>(entry + 8))[0] = seq
        (<uint64_t *>(entry + 16))[0] = timestamp
        if size:
            memcpy(entry + ENTRY_HEAD, payload, size)
        self.mine += 1
        ring_store(self.count(AT_FRAMES), self.mine)
        return 0

    cdef int push_marker(self) noexcept:
        cdef int free
        cdef uint8_t *entry
        if self.base == NULL or not self.publisher:
            return -2
        free = self.room()
        if free:
            return free
        entry = self.base + HEADER + (self.mine & (ENTRIES - 1)) * ENTRY
        entry[0] = KIND_SOCKET_ENTRY
        self.mine += 1
        ring_store(self.count(AT_FRAMES), self.mine)
        return 0

    cdef int take_release(self, uint64_t *seq) noexcept:
        """1 with the next release's frame in ``seq``, 0 when none is waiting, -1 when the
        subscriber's counts or entries are not ones it can have written."""
        cdef uint64_t written
        cdef uint8_t *entry
        if self.base == NULL or not self.publisher:
            return 0
        if self.taken == self.peer_mine:
            written = ring_load(self.count(AT_RELEASES))
            if written < self.taken or written - self.taken > RELEASES:
                return -1
            self.peer_mine = written
            if written == self.taken:
                return 0
        entry = self.base + AT_RELEASE_ENTRIES + (self.taken & (RELEASES - 1)) * RELEASE_ENTRY
        seq[0] = (<uint64_t *>entry)[0]
        if (<uint64_t *>(entry + 8))[0] & ~RELEASE_TAKEN:
            return -1
        self.taken += 1
        ring_store(self.count(AT_RELEASES_READ), self.taken)
        return 1

    cdef void wake(self, int fd) noexcept:
        """After writing: wake the other end if it said it sleeps (one WAKE byte on the socket)."""
        cdef uint8_t byte = KIND_WAKE
        if self.base != NULL and flag_take(self.flag(AT_SUB_SLEEPS if self.publisher else AT_PUB_SLEEPS)):
            send(fd, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL)  # (a full socket: the reader wakes anyway)

    def mark(self, int fd):
        """The publisher sent a message on the socket: put its SOCKET entry in the ring (and wake
        the subscriber). False when the ring is full or its read count is bad."""
        if self.push_marker() != 0:
            return False
        self.wake(fd)
        return True

    def frame(self, int fd, uint64_t seq, int slot, uint64_t timestamp, bytes payload):
        """Announce a frame through the ring (Python's door to push_frame, with the wake-up)."""
        cdef int done = self.push_frame(seq, slot, timestamp, payload, len(payload))
        if done == 0:
            self.wake(fd)
        return done

    def drop(self):
        """The publisher dropped this subscriber: said before the frames announced to it are freed
        (written again next), so that it hands out none of those it had not taken yet."""
        if self.base != NULL and self.publisher:
            flag_set(self.flag(AT_DROPPED), 1)

    cdef uint64_t releases_written(self) noexcept:
        """The subscriber's count of releases written into the ring (the publisher's end; as the
        subscriber wrote it, which take_release checks)."""
        return ring_load(self.count(AT_RELEASES)) if self.base != NULL else 0

    cdef bint released_since(self) noexcept:
        """Whether the subscriber released a frame the publisher has not read yet: one waits in
        the ring, or one was sent on the socket since :meth:`note_socket` (the publisher's end)."""
        return self.base != NULL and (ring_load(self.count(AT_RELEASES)) != self.taken
                                      or ring_load(self.count(AT_SOCKET_RELEASES)) != self.socket_count)

    def note_socket(self):
        """The publisher is about to read the subscriber's socket: the releases sent on it so far
        are read by that (a later one moves the count again: :meth:`released_since`)."""
        if self.base != NULL and self.publisher:
            self.socket_count = ring_load(self.count(AT_SOCKET_RELEASES))

    def sleeping(self, bint on):
        """The publisher is about to wait for releases (``on``) or waited: its "sleeps" flag. With
        ``on``, whether a release is already waiting (then it should not sleep)."""
        if self.base == NULL or not self.publisher:
            return False
        flag_set(self.flag(AT_PUB_SLEEPS), 1 if on else 0)
        return on and ring_load(self.count(AT_RELEASES)) != self.taken

    # ---- the subscriber's end --------------------------------------------------------------------------
    cdef object pop(self):
        """The next entry: a Frame tuple, MARKER, None when there is none, MALFORMED when the
        publisher's count or entry is not one it can have written."""
        cdef uint64_t written, length
        cdef uint8_t *entry
        cdef uint8_t kind
        cdef uint16_t slot
        if self.base == NULL:
            return None
        if self.taken == self.peer_mine:
            written = ring_load(self.count(AT_FRAMES))
            if written < self.taken or written - self.taken > ENTRIES:
                return MALFORMED
            self.peer_mine = written
            if written == self.taken:
                return None
        entry = self.base + HEADER + (self.taken & (ENTRIES - 1)) * ENTRY
        kind = entry[0]
        if kind == KIND_SOCKET_ENTRY:
            found = MARKER
        else:
            # (each field read once: the publisher's side of the mapping may change under us)
            length = (<uint16_t *>(entry + 4))[0]
            slot = (<uint16_t *>(entry + 2))[0]
            if kind != KIND_FRAME_ENTRY or length > INLINE or slot >= protocol.MAX_POOL:
                return MALFORMED
            found = tuple_new(Frame, ((<uint64_t *>(entry + 8))[0], slot,
                                      (<uint64_t *>(entry + 16))[0], 0,
                                      PyBytes_FromStringAndSize(<const char *>entry + ENTRY_HEAD, length)))
        self.taken += 1
        ring_store(self.count(AT_FRAMES_READ), self.taken)
        return found

    cdef int next_kind(self) noexcept:
        """The kind of the next entry without taking it (0: none, or a count ``pop`` will refuse)."""
        cdef uint64_t written
        if self.base == NULL:
            return 0
        if self.taken == self.peer_mine:
            written = ring_load(self.count(AT_FRAMES))
            if written <= self.taken or written - self.taken > ENTRIES:
                return 0
        return (self.base + HEADER + (self.taken & (ENTRIES - 1)) * ENTRY)[0]

    cdef bint waiting(self) noexcept nogil:
        return self.base != NULL and ring_load(self.count(AT_FRAMES)) != self.taken

    cdef bint is_dropped(self) noexcept nogil:
        return self.base != NULL and flag_load(self.flag(AT_DROPPED)) != 0

    def dropped(self):
        """Whether the publisher dropped this subscriber (its frames may be written again)."""
        return self.is_dropped()

    def sent_on_socket(self):
        """The subscriber sent a release on the socket (after the send: the publisher that sees
        the count move finds it there)."""
        if self.base != NULL and not self.publisher:
            self.socket_count += 1
            ring_store(self.count(AT_SOCKET_RELEASES), self.socket_count)

    def release(self, int fd, uint64_t seq, unsigned int flags):
        """The subscriber's plain release of frame ``seq``: True once in the ring (the publisher
        woken if it sleeps), False when it must go by socket (the ring is full, or closed)."""
        cdef uint64_t read
        cdef uint8_t *entry
        if self.base == NULL or self.publisher or flags & ~RELEASE_TAKEN:
            return False
        if self.mine - self.peer_taken >= RELEASES:
            read = ring_load(self.count(AT_RELEASES_READ))
            if read > self.mine or self.mine - read >= RELEASES:
                return False
            self.peer_taken = read
        entry = self.base + AT_RELEASE_ENTRIES + (self.mine & (RELEASES - 1)) * RELEASE_ENTRY
        (<uint64_t *>entry)[0] = seq
        (<uint64_t *>(entry + 8))[0] = flags
        self.mine += 1
        ring_store(self.count(AT_RELEASES), self.mine)
        self.wake(fd)
        return True


cdef class RingInbox:
    """A subscriber's reading of its publisher: the ring's entries in order, each SOCKET entry
    replaced by the socket's next message; the same answers as :class:`eglcuda.topics._wire.Inbox`
    (``next``, ``rest``, ``close``). A wait asks the ring ``busy_wait`` seconds without sleeping,
    then sleeps in ``poll`` on the socket (a WAKE, a message, its end) and ``wake_fd``."""

    cdef Ring ring
    cdef object inner  # the socket's Inbox
    cdef object early  # socket messages read while the ring was empty, before their SOCKET entry
    cdef bint overrun  # more messages came ahead of their SOCKET entries than the ring can hold entries
    cdef bint ended  # the socket said the connection ended
    cdef int fd
    cdef int wake_fd
    cdef double busy_wait

    def __cinit__(self, int fd, Ring ring, int wake_fd=-1, double busy_wait=0.0):
        if not (busy_wait >= 0 and isfinite(busy_wait)):
            raise ValueError(f"busy_wait is 0 or more seconds, got {busy_wait}")
        self.fd = fd
        self.ring = ring
        self.wake_fd = wake_fd
        self.busy_wait = busy_wait
        self.inner = _wire.Inbox(fd, wake_fd=wake_fd)
        self.early = collections.deque()

    def close(self):
        """Read nothing more (before the socket is closed); unmap the ring."""
        self.fd = -1
        self.inner.close()
        self.ring.close()
        self.forget_early()

    cdef void forget_early(self):
        """Let go of the messages read early, closing the descriptors any of them brought."""
        for message in self.early:
            if message.__class__ is protocol.Carried:
                for fd in message.fds:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
        self.early.clear()

    def queued_kinds(self):
        return b""

    def frame_next(self):
        """Whether the next thing to read is a frame's entry (a receive hands it out without
        asking the socket) and the publisher has not dropped this subscriber (then no frame
        announced before the drop is handed out); nothing is taken."""
        return (self.fd >= 0 and not self.early and not self.ended and not self.overrun
                and self.ring.next_kind() == KIND_FRAME_ENTRY
                and not self.ring.is_dropped())

    def arm(self):
        """For a watcher of the socket (``Subscriber.fileno()``): True when something is there to
        read now (an entry, a socket message read early, the connection's end). Else the socket's
        WAKE bytes are read, the "sleeps" flag is set, so that the publisher's next entry sends a
        WAKE (the socket becomes readable), and False. The eventcount's order: the flag is set
        before the count is read again, so an entry written meanwhile is seen here or wakes."""
        if self.fd < 0 or self.ended or self.early or self.overrun or self.ring.waiting():
            return True
        self.take_socket()  # (WAKEs that did their work, and what else came, kept in order)
        if self.ended or self.early or self.overrun:
            return True
        flag_set(self.ring.flag(AT_SUB_SLEEPS), 1)
        return self.ring.waiting()

    def quiet(self):
        """For a watcher of the socket while the subscriber can take nothing (it holds all it
        may): the socket's WAKE bytes are read (what else came is kept, in order) and the "sleeps"
        flag is not set, so that frames send no WAKE; True when something besides frames is there
        (a message read early, the connection's end)."""
        if self.fd < 0 or self.ended or self.early or self.overrun:
            return True
        self.take_socket()
        return bool(self.ended or self.early or self.overrun)

    def next(self, deadline=None):
        return self.read(deadline, False)

    def rest(self):
        return self.read(None, True)

    cdef int take_socket(self) except -1:
        """What the socket has now (no wait), kept for its SOCKET entry; its end noted."""
        message = self.inner.next(None)
        while message is not None:
            if message.__class__ is bytes and not message:
                self.ended = True
                return 0
            self.early.append(message)
            if len(self.early) > ENTRIES + 1:  # (a publisher marks each message it sends: a lie or a bug)
                self.overrun = True
                self.forget_early()
                return 0
            message = self.inner.rest()
        return 0

    cdef object read(self, object deadline, bint rest):
        cdef double until, busy_until, left
        cdef int ready, timeout_ms
        cdef pollfd watch[2]
        cdef bint asked = False
        cdef bint socket_read = False
        while True:
            if self.fd < 0:
                return NO_BYTES
            if self.overrun:
                return MALFORMED
            found = self.ring.pop()
            if found is MARKER:
                if self.early:
                    return self.early.popleft()
                found = self.inner.next(None)  # (sent before its entry was written: it is there)
                return MALFORMED if found is None else found
            if found is not None:
                return found
            if self.ended:  # (what a publisher that died sent without its entry, then the end)
                return self.early.popleft() if self.early else NO_BYTES
            if rest:
                return None
            if deadline is None:
                if asked:
                    return None
                self.take_socket()
                asked = True
                continue
            until = <double>deadline
            if self.busy_wait > 0 and not asked:
                asked = True
                with nogil:
                    busy_until = monotonic() + self.busy_wait
                    if busy_until > until:
                        busy_until = until  # (a deadline sooner than the asking)
                    while not self.ring.waiting() and monotonic() < busy_until:
                        pass
                if PyThread_get_thread_ident() == main_thread_ident:
                    PyErr_CheckSignals()  # (a signal that came meanwhile: its handler before the sleep)
                continue
            left = until - monotonic()
            if not left > 0:
                if not socket_read:  # (a deadline already past, receive(timeout=0): the socket is
                    socket_read = True  # asked once, for its end or a message that came without an entry)
                    self.take_socket()
                    continue
                return None
            flag_set(self.ring.flag(AT_SUB_SLEEPS), 1)
            if self.ring.waiting():
                flag_set(self.ring.flag(AT_SUB_SLEEPS), 0)
                continue
            watch[0].fd = self.fd
            watch[0].events = POLLIN
            watch[0].revents = 0
            watch[1].fd = self.wake_fd
            watch[1].events = POLLIN
            watch[1].revents = 0
            timeout_ms = 2000000000 if left > 2000000.0 else <int>(left * 1000.0) + 1
            with nogil:
                ready = poll(watch, 2 if self.wake_fd >= 0 else 1, timeout_ms)
            if self.ring.base != NULL:
                flag_set(self.ring.flag(AT_SUB_SLEEPS), 0)
            if ready < 0:
                if errno != EINTR:
                    return NO_BYTES
                PyErr_CheckSignals()
                continue
            if watch[1].revents:
                return NO_BYTES  # woken: the owner is closing (it checks why)
            if watch[0].revents and self.fd >= 0:
                self.take_socket()
