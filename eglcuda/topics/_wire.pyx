# cython: language_level=3
"""A topic's per-frame path, compiled: reading a connection's messages and the ``cuda-ipc``
transport's driver steps.

Measured on an H100 (driver 580), the Python form of these steps cost both ends of a topic about
30 us per frame, three times a six-line CUDA IPC ring. What made up most of it: an exception for
every empty non-blocking read, a poll object between reads, a decode through ``struct``, and two
Python layers around each driver call to make the context current. Here each is one C call:

- :class:`Inbox` reads one connection (``recv`` without blocking, ``poll`` with the GIL released
  while it waits) and decodes the two per-frame messages, FRAME and RELEASE, into
  :class:`eglcuda.topics.protocol.Frame` / ``Release`` tuples; any other message comes back as
  its bytes for :func:`eglcuda.topics.protocol.decode`, whose checks stay the only ones for them;
- :func:`drain` reads every connection an ``epoll`` set says is readable (the publisher's
  releases);
- ``ipc_*`` are the CUDA IPC steps, each one call into csrc/helpers.c through the helper table of
  csrc/hot_api.h (context check and driver call, no Python between).

The wire layout comes from protocol.py (``FRAME_HEAD`` and the RELEASE struct), checked at import:
a changed layout fails here, before any message is read.
"""
from cpython.exc cimport PyErr_CheckSignals
from cpython.pythread cimport PyThread_get_thread_ident
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.errno cimport EAGAIN, ECONNRESET, EINTR, errno
from libc.math cimport isfinite
from libc.stdint cimport uint8_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc
from libc.string cimport memcpy, memset
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

import os
import threading

from .._bind.cuda import cuda_error
from .._bind.hot import table_address
from . import protocol

cdef extern from "<sys/socket.h>" nogil:
    # (Python.h defines _GNU_SOURCE, which recvmmsg and struct mmsghdr need)
    struct iovec:
        void *iov_base
        size_t iov_len
    struct msghdr:
        void *msg_name
        unsigned int msg_namelen
        iovec *msg_iov
        size_t msg_iovlen
        void *msg_control
        size_t msg_controllen
        int msg_flags
    struct mmsghdr:
        msghdr msg_hdr
        unsigned int msg_len
    struct cmsghdr:
        size_t cmsg_len
        int cmsg_level
        int cmsg_type
    cmsghdr *CMSG_FIRSTHDR(msghdr *message)
    cmsghdr *CMSG_NXTHDR(msghdr *message, cmsghdr *header)
    unsigned char *CMSG_DATA(cmsghdr *header)
    size_t CMSG_SPACE(size_t length)
    size_t CMSG_LEN(size_t length)
    int recvmmsg(int fd, mmsghdr *messages, unsigned int count, int flags, timespec *timeout)
    ssize_t send(int fd, const void *buf, size_t n, int flags)
    int MSG_DONTWAIT
    int MSG_NOSIGNAL
    int MSG_CMSG_CLOEXEC
    int SOL_SOCKET
    int SCM_RIGHTS

cdef extern from "<unistd.h>" nogil:
    int close(int fd)

cdef extern from "<poll.h>" nogil:
    struct pollfd:
        int fd
        short events
        short revents
    int poll(pollfd *fds, unsigned long nfds, int timeout)
    short POLLIN

cdef extern from "<sys/epoll.h>" nogil:
    ctypedef union epoll_data_t:
        void *ptr
        int fd
        uint32_t u32
        uint64_t u64
    struct epoll_event:
        uint32_t events
        epoll_data_t data
    int epoll_wait(int epfd, epoll_event *events, int maxevents, int timeout)

from eglcuda._hot cimport (
    EGLCUDA_CALL_CONTEXT, EGLCUDA_CALL_EVENT_QUERY, EGLCUDA_CALL_EVENT_RECORD,
    EGLCUDA_CALL_STREAM_QUERY, EGLCUDA_CALL_STREAM_WAIT_EVENT, CUcontext, CUevent, CUresult, CUstream,
    eglcuda_hot_api, hot_table)

cdef enum:
    CUDA_ERROR_NOT_READY = 600  # (csrc/cuda_ipc.h, which eglcuda_types.h leaves out)
    FRAME_HEAD_SIZE = 29  # kind u8, seq u64, slot u16, timestamp u64, number u64, payload length u16
    RELEASE_HEAD_SIZE = 11  # kind u8, seq u64, flags u8, extra length u8
    READY_EVENTS = 256  # epoll events taken per wait (more ready connections: the next wait)
    MAX_CARRIED = 2  # descriptors a message may bring: one more than any message carries, to notice extras
    RELEASE_EXTRA_ROOM = 128  # send_release's room for a RELEASE's extra bytes (protocol.MAX_RELEASE_EXTRA)
    # WAKEs read past in a row before the next one is handed out as a message: a peer sends one
    # only after the other said it sleeps, so a run this long is a flood, which its reader then
    # refuses as it refuses any message it may not get
    WAKE_RUN = 64
    # An Inbox that counts WAKEs (a publisher's, of a subscriber) hands out every this-many-th
    # instead, so that its owner holds them against the releases they must follow (a flood paced
    # to keep its runs short is caught too); a power of two
    WAKE_CHECK = 64

if (protocol.FRAME_HEAD.size != FRAME_HEAD_SIZE or protocol.RELEASE_HEAD.size != RELEASE_HEAD_SIZE
        or protocol.MAX_RELEASE_EXTRA > RELEASE_EXTRA_ROOM):
    raise ImportError("eglcuda.topics._wire was built for another wire layout than protocol.py's: rebuild eglcuda")

cdef const eglcuda_hot_api *hot = hot_table(table_address())

cdef uint8_t KIND_FRAME = <uint8_t>int(protocol.Kind.FRAME)
cdef uint8_t KIND_RELEASE = <uint8_t>int(protocol.Kind.RELEASE)
cdef uint8_t KIND_WAKE = <uint8_t>int(protocol.Kind.WAKE)
cdef uint64_t MAX_PAYLOAD = protocol.MAX_PAYLOAD
cdef uint64_t MAX_POOL = protocol.MAX_POOL
cdef uint64_t MAX_RELEASE_EXTRA = protocol.MAX_RELEASE_EXTRA
cdef unsigned int RELEASE_FLAGS = protocol.RELEASE_RECORDED | protocol.RELEASE_TAKEN
cdef unsigned int RELEASE_RECORDED = protocol.RELEASE_RECORDED
cdef object Frame = protocol.Frame
cdef object Release = protocol.Release
cdef object Carried = protocol.Carried
cdef object NO_BYTES = b""
cdef object tuple_new = tuple.__new__
cdef unsigned long main_thread_ident = threading.main_thread().ident  # (the thread that runs signal handlers)


def _forked() -> None:
    # A child made by fork() runs on the thread that forked, which is its main thread now.
    global main_thread_ident
    main_thread_ident = PyThread_get_thread_ident()


os.register_at_fork(after_in_child=_forked)


cdef inline uint64_t le(const uint8_t *at, int size) noexcept nogil:
    """A little-endian unsigned integer of ``size`` bytes (the wire's byte order on any host)."""
    cdef uint64_t value = 0
    cdef int i
    for i in range(size - 1, -1, -1):
        value = (value << 8) | at[i]
    return value


cdef inline double monotonic() noexcept nogil:
    cdef timespec now
    clock_gettime(CLOCK_MONOTONIC, &now)  # the clock of time.monotonic() on Linux
    return now.tv_sec + now.tv_nsec * 1e-9


cdef inline int wait_ms(double seconds) noexcept nogil:
    """A ``poll``/``epoll_wait`` timeout of at least ``seconds`` (rounded up, capped; 0 for none
    or a NaN)."""
    if not seconds > 0:
        return 0
    return 2000000000 if seconds > 2000000.0 else <int>(seconds * 1000.0) + 1


cdef object decode(const uint8_t *data, ssize_t size):
    """A FRAME or RELEASE as its tuple when well formed; any other message as its bytes (the
    generic decoder checks those, and rejects a malformed FRAME or RELEASE with its reason)."""
    cdef uint64_t length, flags
    if size >= FRAME_HEAD_SIZE and data[0] == KIND_FRAME:
        length = le(data + 27, 2)
        if length == <uint64_t>(size - FRAME_HEAD_SIZE) and length <= MAX_PAYLOAD and le(data + 9, 2) < MAX_POOL:
            return tuple_new(Frame, (le(data + 1, 8), le(data + 9, 2), le(data + 11, 8), le(data + 19, 8),
                                     PyBytes_FromStringAndSize(<const char *>data + FRAME_HEAD_SIZE, length)))
    elif size >= RELEASE_HEAD_SIZE and data[0] == KIND_RELEASE:
        length = data[10]
        flags = data[9]
        if length == <uint64_t>(size - RELEASE_HEAD_SIZE) and length <= MAX_RELEASE_EXTRA and not flags & ~RELEASE_FLAGS:
            return tuple_new(Release, (le(data + 1, 8), flags,
                                       PyBytes_FromStringAndSize(<const char *>data + RELEASE_HEAD_SIZE, length)
                                       if length else NO_BYTES))
    return PyBytes_FromStringAndSize(<const char *>data, size)


cdef list carried(msghdr *header):
    """The descriptors a message brought (SCM_RIGHTS), as a list of ints."""
    cdef list fds = []
    cdef cmsghdr *cmsg = CMSG_FIRSTHDR(header)
    cdef int *data
    cdef size_t count, k
    while cmsg != NULL:
        if cmsg.cmsg_level == SOL_SOCKET and cmsg.cmsg_type == SCM_RIGHTS:
            data = <int *>CMSG_DATA(cmsg)
            count = (cmsg.cmsg_len - CMSG_LEN(0)) // sizeof(int)
            for k in range(count):
                fds.append(data[k])
        cmsg = CMSG_NXTHDR(header, cmsg)
    return fds


cdef void close_carried(msghdr *header) noexcept:
    cdef cmsghdr *cmsg
    cdef int *data
    cdef size_t count, k
    if header.msg_controllen == 0 or header.msg_control == NULL:
        return
    cmsg = CMSG_FIRSTHDR(header)
    while cmsg != NULL:
        if cmsg.cmsg_level == SOL_SOCKET and cmsg.cmsg_type == SCM_RIGHTS:
            data = <int *>CMSG_DATA(cmsg)
            count = (cmsg.cmsg_len - CMSG_LEN(0)) // sizeof(int)
            for k in range(count):
                close(data[k])
        cmsg = CMSG_NXTHDR(header, cmsg)
    header.msg_controllen = 0


cdef class Inbox:
    """The receiving side of one ``SOCK_SEQPACKET`` connection after its handshake.

    Each read asks the kernel for up to ``batch`` messages at once (``recvmmsg``) and hands them
    out one by one, so a publisher reading a subscriber's four releases makes one system call,
    not five (four reads and the empty one that says there is no more). Each message has a buffer
    one byte longer than the longest valid message, so a longer one arrives cut and fails to
    decode. A wait asks ``busy_wait`` seconds without sleeping before it sleeps in ``poll``.
    A message that brought descriptors (``SCM_RIGHTS``, made close-on-exec as they arrive: a
    transport's SLOT) comes as a :class:`eglcuda.topics.protocol.Carried` of its bytes and the
    descriptors, which are then the caller's to close."""

    cdef int fd
    cdef uint8_t *buffer
    cdef ssize_t capacity
    cdef unsigned int batch
    cdef mmsghdr *headers
    cdef iovec *vectors
    cdef unsigned char *control  # each message's room for descriptors
    cdef size_t control_space
    cdef unsigned int count  # messages of the last batch
    cdef unsigned int at  # the next of them to hand out
    cdef bint short  # the last batch was not full: the socket had nothing more then
    cdef bint waited  # the last wait found nothing: the next one polls before it reads
    cdef bint fresh  # the message handed out last came from a read made for it (not an earlier batch)
    cdef int wake_fd  # readable: stop waiting (another thread is closing the owner); -1: none
    cdef double busy_wait  # seconds a wait asks without sleeping before it sleeps in poll()
    cdef public unsigned long long wakes  # WAKE messages read so far
    cdef public bint counts_wakes  # every WAKE_CHECK-th WAKE is handed out, none for a run (see WAKE_CHECK)

    def __cinit__(self, int fd, ssize_t capacity=protocol.MAX_MESSAGE + 1, unsigned int batch=4, int wake_fd=-1,
                  double busy_wait=0.0):
        cdef unsigned int i
        if fd < 0 or capacity < FRAME_HEAD_SIZE + 1 or not 1 <= batch <= 64 or not (busy_wait >= 0 and isfinite(busy_wait)):
            raise ValueError(f"an Inbox reads a descriptor (got {fd}) into buffers longer than a FRAME head "
                             f"(got {capacity} bytes), 1 to 64 messages at a time (got {batch}), and "
                             f"busy-waits 0 or more seconds (got {busy_wait})")
        self.fd = fd
        self.wake_fd = wake_fd
        self.busy_wait = busy_wait
        self.capacity = capacity
        self.batch = batch
        self.buffer = <uint8_t *>malloc(capacity * batch)
        self.headers = <mmsghdr *>malloc(sizeof(mmsghdr) * batch)
        self.vectors = <iovec *>malloc(sizeof(iovec) * batch)
        self.control_space = CMSG_SPACE(sizeof(int) * MAX_CARRIED)
        self.control = <unsigned char *>malloc(self.control_space * batch)
        if self.buffer == NULL or self.headers == NULL or self.vectors == NULL or self.control == NULL:
            raise MemoryError()
        memset(self.headers, 0, sizeof(mmsghdr) * batch)
        for i in range(batch):
            self.vectors[i].iov_base = self.buffer + i * capacity
            self.vectors[i].iov_len = capacity
            self.headers[i].msg_hdr.msg_iov = &self.vectors[i]
            self.headers[i].msg_hdr.msg_iovlen = 1

    def __dealloc__(self):
        cdef unsigned int i
        for i in range(self.at, self.count):  # descriptors read but never handed out: ours to close
            close_carried(&self.headers[i].msg_hdr)
        free(self.buffer)
        free(self.headers)
        free(self.vectors)
        free(self.control)

    cdef void make_room(self) noexcept:
        """Room for each message's descriptors before a read (the kernel shrinks msg_controllen
        to what it wrote)."""
        cdef unsigned int i
        for i in range(self.batch):
            self.headers[i].msg_hdr.msg_control = self.control + i * self.control_space
            self.headers[i].msg_hdr.msg_controllen = self.control_space
            self.headers[i].msg_hdr.msg_flags = 0

    cdef object message(self, unsigned int i):
        """Message ``i`` of the last batch, decoded; a Carried when it brought descriptors."""
        cdef msghdr *header = &self.headers[i].msg_hdr
        if header.msg_controllen == 0:
            return decode(self.buffer + i * self.capacity, self.headers[i].msg_len)
        fds = carried(header)
        header.msg_controllen = 0  # (handed out: __dealloc__ must not close them)
        return tuple_new(Carried, (PyBytes_FromStringAndSize(<const char *>self.buffer + i * self.capacity,
                                                              self.headers[i].msg_len), fds))

    def close(self):
        """Read nothing more (call it before the socket is closed: its number may be reused).
        Descriptors that came with messages read but not handed out are closed."""
        cdef unsigned int i
        for i in range(self.at, self.count):
            close_carried(&self.headers[i].msg_hdr)
        self.fd = -1
        self.wake_fd = -1
        self.count = self.at = 0
        self.short = False  # (so rest() too says the end, not "nothing waiting")

    def next(self, deadline=None):
        """The next message: a ``Frame`` or ``Release`` tuple, the bytes of any other message,
        ``b""`` once the connection ended (closed, or failed), or None when none came: at once
        with ``deadline`` None, else by ``deadline`` (``time.monotonic()`` seconds; the wait
        releases the GIL). A wait also ends, with ``b""``, once the ``wake_fd`` given at
        construction is readable."""
        return self.read(deadline, False)

    def rest(self):
        """The next message of what the last read found waiting, or None once that is handed
        out: as ``next()`` without a deadline, but after a read that emptied the socket it asks
        the kernel nothing (what came since is for the next ``next()``). For loops that take what
        is waiting after a read."""
        return self.read(None, True)

    def frame_next(self):
        """Whether the next message, read earlier and waiting here, is a FRAME (nothing is taken)."""
        return (self.fd >= 0 and self.at < self.count and self.headers[self.at].msg_len > 0
                and self.buffer[self.at * self.capacity] == KIND_FRAME)

    def arm(self):
        """For a watcher of the socket (``Subscriber.fileno()``): True when messages read
        earlier are waiting here (the socket may have nothing more), else False: the socket's own
        readiness then says when the next one comes."""
        return self.fd < 0 or self.at < self.count

    def quiet(self):
        """As :meth:`arm`, for a subscriber that can take nothing (it holds all it may): its
        frames come as messages, which a watcher sees on the socket."""
        return self.fd < 0 or self.at < self.count

    def queued_kinds(self):
        """The kind byte of each message read from the socket but not handed out yet (0 for the
        connection's end), as bytes: whether a goodbye is already on its way."""
        cdef unsigned int i
        cdef bytearray kinds = bytearray()
        for i in range(self.at, self.count):
            if self.headers[i].msg_len == 0:
                kinds.append(0)
                break  # (past the end, recvmmsg fills every entry left with one)
            kinds.append(self.buffer[i * self.capacity])
        return bytes(kinds)

    cdef object read(self, object deadline, bint rest):
        # next()'s and rest()'s body, which drain() calls without a Python method lookup. A WAKE
        # (the peer's shared-memory ring has news, _ring.pyx) has done its work by waking a wait.
        cdef int wakes = 0
        message = self.read_one(deadline, rest)
        while message.__class__ is bytes and len(<bytes>message) == 1 and (<bytes>message)[0] == KIND_WAKE:
            wakes += 1
            self.wakes += 1
            if self.counts_wakes:
                if not self.wakes & (WAKE_CHECK - 1):
                    return message
            elif wakes > WAKE_RUN:
                return message
            # (without a deadline, after a read made just now: what it found, no read of the socket
            # it emptied; a WAKE left from an earlier batch says nothing about the socket now)
            message = self.read_one(None, rest or self.fresh) if deadline is None else self.read_one(deadline, rest)
        return message

    cdef object read_one(self, object deadline, bint rest):
        cdef int got, error, ready
        cdef unsigned int i
        cdef double left, busy_until, until
        cdef int watched
        cdef bint check_signals
        cdef pollfd watch[2]
        cdef bint reset_seen = False
        cdef bint tried = False  # the socket was read in this call
        self.fresh = False
        if self.at < self.count:
            i = self.at
            self.at += 1
            if self.headers[i].msg_len == 0:
                self.at = self.count  # (past the end, recvmmsg fills every entry left with one)
                return NO_BYTES
            return self.message(i)
        if rest and self.short:
            self.short = False
            return None
        self.short = False
        watch[0].fd = self.fd
        watch[0].events = POLLIN
        watch[1].fd = self.wake_fd
        watch[1].events = POLLIN
        watch[1].revents = 0
        while True:
            if self.fd < 0:
                return NO_BYTES
            if deadline is not None and self.waited and (tried or <double>deadline > monotonic()):
                # Nothing was waiting last time either: wait first, then read (two calls, not three).
                # (A deadline already past reads once first: receive(timeout=0) sees what is there.)
                until = <double>deadline
                left = until - monotonic()
                if not left > 0:  # (a NaN deadline too)
                    return None
                watched = 2 if watch[1].fd >= 0 else 1
                # Ask without sleeping first: a message that comes meanwhile is taken without a
                # sleep and a wake-up, which the sender pays for too (measured on an H100, 8
                # subscribers: p50 latency 23-30 us sleeping at once, 16-24 us with 20 us asked).
                # A signal that lands between the asking polls (not inside one, which returns
                # EINTR) interrupts no sleep, so on the main thread (the only one that runs
                # handlers) its handler runs before the sleep; other threads ask and sleep
                # without taking the GIL between.
                check_signals = self.busy_wait > 0 and PyThread_get_thread_ident() == main_thread_ident
                ready = 0
                with nogil:
                    if self.busy_wait > 0:
                        busy_until = monotonic() + (self.busy_wait if self.busy_wait < left else left)
                        while True:
                            ready = poll(watch, watched, 0)
                            if ready != 0 or monotonic() >= busy_until:
                                break
                    if ready == 0 and not check_signals:
                        left = until - monotonic()
                        if left > 0:
                            ready = poll(watch, watched, wait_ms(left))
                if ready == 0 and check_signals:
                    PyErr_CheckSignals()
                    if self.fd < 0:
                        return NO_BYTES  # (closed by the handler)
                    left = until - monotonic()
                    if left > 0:
                        with nogil:
                            ready = poll(watch, watched, wait_ms(left))
                if ready < 0:
                    if errno != EINTR:
                        return NO_BYTES  # (poll fails only on a bad descriptor or no memory)
                    PyErr_CheckSignals()
                    continue
                if ready == 0:
                    continue  # (the deadline check above ends it)
                if watch[1].revents:
                    return NO_BYTES  # woken: the owner is closing (it checks why)
            self.make_room()
            tried = True
            got = recvmmsg(self.fd, self.headers, self.batch, MSG_DONTWAIT | MSG_CMSG_CLOEXEC, NULL)
            if got > 0:
                self.fresh = True
                self.count = got
                self.at = 1
                self.short = <unsigned int>got < self.batch
                if <unsigned int>got == self.batch:
                    self.waited = False  # a backlog: read first next time
                if self.headers[0].msg_len == 0:
                    self.at = self.count
                    return NO_BYTES
                return self.message(0)
            if got == 0:
                return NO_BYTES
            error = errno
            if error == EINTR:
                PyErr_CheckSignals()
                continue
            if error == ECONNRESET and not reset_seen:
                # The peer closed with messages of ours unread: the kernel says so once, before
                # what the peer sent last (a goodbye, a drop with its reason), which is still
                # queued. Read on: those messages, then the end.
                reset_seen = True
                continue
            if error != EAGAIN:  # (EWOULDBLOCK is EAGAIN on Linux)
                return NO_BYTES
            if deadline is None:
                return None
            if self.waited:
                continue  # poll said readable, the read found nothing (a spurious wake-up): wait again
            self.waited = True


def drain(int epoll_fd, double timeout, dict inboxes, int limit):
    """Wait up to ``timeout`` seconds (0: not at all; the wait releases the GIL) for any of an
    ``epoll`` set's connections to be readable, then read up to ``limit`` messages from each
    readable one, and the rest of the batch its last read took (a level-triggered set reports
    what is left on the socket at the next call).

    ``inboxes`` maps a descriptor to ``(inbox, key)``; returns ``[(key, message), ...]`` in the
    order read (messages as :meth:`Inbox.next` gives them). Descriptors not in ``inboxes`` are
    skipped."""
    cdef epoll_event ready[READY_EVENTS]
    cdef int count, i, waiting, taken
    cdef list found = []
    cdef Inbox inbox
    waiting = wait_ms(timeout)
    while True:
        with nogil:
            count = epoll_wait(epoll_fd, ready, READY_EVENTS, waiting)
        if count < 0:
            if errno == EINTR:
                PyErr_CheckSignals()
                return found
            raise OSError(errno, "epoll_wait failed")
        for i in range(count):
            entry = inboxes.get(ready[i].data.fd)
            if entry is None:
                continue
            inbox = <Inbox>entry[0]
            key = entry[1]
            taken = 0
            # Up to ``limit`` messages, and the rest of the last batch read: what an Inbox has
            # taken off its socket must come out now (the socket no longer reports it).
            while taken < limit or inbox.at < inbox.count:
                message = inbox.read(None, taken > 0)
                if message is None:
                    break
                found.append((key, message))
                taken += 1
                if message is NO_BYTES:
                    break
        if count < READY_EVENTS:
            return found
        waiting = 0


# ---- the cuda-ipc transport's driver steps (csrc/helpers.c) ---------------------------------------

CALL_NAMES = {EGLCUDA_CALL_CONTEXT: "cuCtxSetCurrent", EGLCUDA_CALL_EVENT_QUERY: "cuEventQuery",
              EGLCUDA_CALL_STREAM_WAIT_EVENT: "cuStreamWaitEvent", EGLCUDA_CALL_EVENT_RECORD: "cuEventRecord",
              EGLCUDA_CALL_STREAM_QUERY: "cuStreamQuery"}


cdef object failed(CUresult status, int call, str doing):
    return cuda_error(status, CALL_NAMES.get(call, "the CUDA driver"), doing)


def ipc_record(uintptr_t context, uintptr_t event, uintptr_t stream, bint query=False):
    """Record ``event`` on ``stream`` (the publisher, once per frame); with ``query``, only if
    ``stream`` still has work queued. Returns whether it recorded."""
    cdef CUresult status
    cdef int recorded = 0
    cdef int call = EGLCUDA_CALL_CONTEXT
    with nogil:
        status = hot.ipc_record(<CUcontext>context, <CUevent>event, <CUstream>stream, query, &recorded, &call)
    if status:
        raise failed(status, call, "recording the frame's event")
    return recorded != 0


def ipc_release(uintptr_t context, uintptr_t stream, uintptr_t done):
    """A subscriber letting go of a frame read on ``stream``: 0 when the stream has finished
    (nothing to wait for), 1 when ``done`` was recorded behind its queued work, 2 when it would
    have been but ``done`` is 0 (make the slot's event, then call again)."""
    cdef CUresult status
    cdef int recorded = 0
    cdef int call = EGLCUDA_CALL_CONTEXT
    with nogil:
        status = hot.ipc_release(<CUcontext>context, <CUstream>stream, <CUevent>done, &recorded, &call)
    if recorded:
        return 1
    if status == 0:
        return 0
    if status == CUDA_ERROR_NOT_READY and done == 0:
        return 2
    raise failed(status, call, "letting go of a frame (the subscriber's done event)")


def ipc_event_done(uintptr_t context, uintptr_t event):
    """Whether ``event`` (another process's) has completed, asked without waiting."""
    cdef CUresult status
    cdef int call = EGLCUDA_CALL_CONTEXT
    with nogil:
        status = hot.ipc_event_done(<CUcontext>context, <CUevent>event, &call)
    if status == 0:
        return True
    if status == CUDA_ERROR_NOT_READY:
        return False
    raise failed(status, call, "asking whether a subscriber's reading finished")


def ipc_order_after(uintptr_t context, uintptr_t stream, uintptr_t event, str doing):
    """Unless ``event`` (another process's) has completed, make ``stream`` wait for it on the
    GPU; no host wait. A subscriber calls it before reading a frame."""
    cdef CUresult status
    cdef int call = EGLCUDA_CALL_CONTEXT
    with nogil:
        status = hot.ipc_order_after(<CUcontext>context, <CUstream>stream, <CUevent>event, &call)
    if status:
        raise failed(status, call, doing)


def send_release(int fd, uint64_t seq, unsigned int flags, bytes extra):
    """A subscriber's RELEASE of frame ``seq`` (``protocol.encode_release``'s bytes), sent on
    ``fd`` without blocking: 0 when sent, 1 when the socket is full (queue it), -1 when the
    connection failed (the next read says how). A signal that interrupts the send has its
    handler run (its exception raised), then the send is tried again."""
    cdef uint8_t data[RELEASE_HEAD_SIZE + RELEASE_EXTRA_ROOM]
    cdef Py_ssize_t length = len(extra)
    cdef ssize_t sent
    cdef int k
    if length > <Py_ssize_t>MAX_RELEASE_EXTRA or flags & ~RELEASE_FLAGS or fd < 0:
        raise ValueError("bad release")
    data[0] = KIND_RELEASE
    for k in range(8):
        data[1 + k] = <uint8_t>(seq >> (8 * k))
    data[9] = <uint8_t>flags
    data[10] = <uint8_t>length
    if length:
        memcpy(data + RELEASE_HEAD_SIZE, <const char *>extra, length)
    while True:
        with nogil:
            sent = send(fd, data, RELEASE_HEAD_SIZE + length, MSG_DONTWAIT | MSG_NOSIGNAL)
        if sent >= 0:
            return 0
        if errno == EAGAIN:
            return 1
        if errno != EINTR:
            return -1
        PyErr_CheckSignals()
