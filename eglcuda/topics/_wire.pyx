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
from cpython.bytes cimport PyBytes_FromStringAndSize
from libc.errno cimport EAGAIN, EINTR, errno
from libc.stdint cimport uint8_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport free, malloc
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec

from .._bind.cuda import cuda_error
from .._bind.hot import table_address
from . import protocol

cdef extern from "<sys/socket.h>" nogil:
    ssize_t recv(int fd, void *buf, size_t n, int flags)
    int MSG_DONTWAIT

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

cdef extern from "eglcuda_types.h" nogil:
    ctypedef int CUresult
    ctypedef void *CUcontext
    ctypedef void *CUstream
    ctypedef void *CUevent
    struct eglcuda_hot_api:
        unsigned int version
        unsigned int size
        CUresult (*ipc_record)(CUcontext, CUevent, CUstream, int *) noexcept nogil
        CUresult (*ipc_release)(CUcontext, CUstream, CUevent, int *, int *) noexcept nogil
        CUresult (*ipc_order_after)(CUcontext, CUstream, CUevent, int *) noexcept nogil
        CUresult (*ipc_event_done)(CUcontext, CUevent, int *) noexcept nogil
    enum:
        EGLCUDA_HOT_API_VERSION
        EGLCUDA_CALL_CONTEXT
        EGLCUDA_CALL_EVENT_QUERY
        EGLCUDA_CALL_STREAM_WAIT_EVENT
        EGLCUDA_CALL_EVENT_RECORD
        EGLCUDA_CALL_STREAM_QUERY

cdef enum:
    FRAME_HEAD_SIZE = 29  # kind u8, seq u64, slot u16, timestamp u64, number u64, payload length u16
    RELEASE_HEAD_SIZE = 11  # kind u8, seq u64, flags u8, extra length u8
    CUDA_ERROR_NOT_READY = 600
    READY_EVENTS = 256  # epoll events taken per wait (more ready connections: the next wait)

if protocol.FRAME_HEAD.size != FRAME_HEAD_SIZE or protocol.RELEASE_HEAD.size != RELEASE_HEAD_SIZE:
    raise ImportError("eglcuda.topics._wire was built for another wire layout than protocol.py's: rebuild eglcuda")

cdef const eglcuda_hot_api *hot = <const eglcuda_hot_api *><uintptr_t>table_address()
if hot == NULL or hot.version != EGLCUDA_HOT_API_VERSION or hot.size != sizeof(eglcuda_hot_api):
    raise ImportError("eglcuda's compiled parts come from different builds (the per-frame helper table does not "
                      "match): reinstall eglcuda")

cdef uint8_t KIND_FRAME = <uint8_t>int(protocol.Kind.FRAME)
cdef uint8_t KIND_RELEASE = <uint8_t>int(protocol.Kind.RELEASE)
cdef uint64_t MAX_PAYLOAD = protocol.MAX_PAYLOAD
cdef uint64_t MAX_POOL = protocol.MAX_POOL
cdef uint64_t MAX_RELEASE_EXTRA = protocol.MAX_RELEASE_EXTRA
cdef unsigned int RELEASE_FLAGS = protocol.RELEASE_RECORDED | protocol.RELEASE_TAKEN
cdef object Frame = protocol.Frame
cdef object Release = protocol.Release
cdef object NO_BYTES = b""
cdef object tuple_new = tuple.__new__


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


cdef class Inbox:
    """The receiving side of one ``SOCK_SEQPACKET`` connection after its handshake (no
    descriptors come any more). One buffer, one byte longer than the longest valid message, so a
    longer one arrives cut and fails to decode."""

    cdef int fd
    cdef uint8_t *buffer
    cdef ssize_t capacity

    def __cinit__(self, int fd, ssize_t capacity=protocol.MAX_MESSAGE + 1):
        if fd < 0 or capacity < FRAME_HEAD_SIZE + 1:
            raise ValueError(f"an Inbox reads a descriptor (got {fd}) into a buffer longer than a FRAME head "
                             f"(got {capacity} bytes)")
        self.fd = fd
        self.capacity = capacity
        self.buffer = <uint8_t *>malloc(capacity)
        if self.buffer == NULL:
            raise MemoryError()

    def __dealloc__(self):
        free(self.buffer)

    def close(self):
        """Read nothing more (call it before the socket is closed: its number may be reused)."""
        self.fd = -1

    def next(self, deadline=None):
        """The next message: a ``Frame`` or ``Release`` tuple, the bytes of any other message,
        ``b""`` once the connection ended (closed, or failed), or None when none came: at once
        with ``deadline`` None, else by ``deadline`` (``time.monotonic()`` seconds; the wait
        releases the GIL)."""
        return self.read(deadline)

    cdef object read(self, object deadline):
        # next()'s body, which drain() calls without a Python method lookup per message
        cdef ssize_t size
        cdef int error, wait_ms, ready
        cdef double left
        cdef pollfd watch
        watch.fd = self.fd
        watch.events = POLLIN
        while True:
            if self.fd < 0:
                return NO_BYTES
            size = recv(self.fd, self.buffer, self.capacity, MSG_DONTWAIT)
            if size > 0:
                return decode(self.buffer, size)
            if size == 0:
                return NO_BYTES
            error = errno
            if error == EINTR:
                PyErr_CheckSignals()
                continue
            if error != EAGAIN:  # (EWOULDBLOCK is EAGAIN on Linux)
                return NO_BYTES
            if deadline is None:
                return None
            left = <double>deadline - monotonic()
            if not left > 0:  # (a NaN deadline too)
                return None
            wait_ms = 2000000000 if left > 2000000.0 else <int>(left * 1000.0) + 1
            with nogil:
                ready = poll(&watch, 1, wait_ms)
            if ready < 0:
                if errno != EINTR:
                    return NO_BYTES  # (poll fails only on a bad descriptor or no memory)
                PyErr_CheckSignals()

def drain(int epoll_fd, double timeout, dict inboxes, int limit):
    """Wait up to ``timeout`` seconds (0: not at all; the wait releases the GIL) for any of an
    ``epoll`` set's connections to be readable, then read up to ``limit`` messages from each
    readable one (a level-triggered set reports the rest at the next call).

    ``inboxes`` maps a descriptor to ``(inbox, key)``; returns ``[(key, message), ...]`` in the
    order read (messages as :meth:`Inbox.next` gives them). Descriptors not in ``inboxes`` are
    skipped."""
    cdef epoll_event ready[READY_EVENTS]
    cdef int count, i, wait_ms, taken
    cdef list found = []
    cdef Inbox inbox
    if not timeout > 0:  # (a NaN too)
        wait_ms = 0
    else:
        wait_ms = 2000000000 if timeout > 2000000.0 else <int>(timeout * 1000.0) + 1
    while True:
        with nogil:
            count = epoll_wait(epoll_fd, ready, READY_EVENTS, wait_ms)
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
            for taken in range(limit):
                message = inbox.read(None)
                if message is None:
                    break
                found.append((key, message))
                if message is NO_BYTES:
                    break
        if count < READY_EVENTS:
            return found
        wait_ms = 0


# ---- the cuda-ipc transport's driver steps (csrc/helpers.c) ---------------------------------------

CALL_NAMES = {EGLCUDA_CALL_CONTEXT: "cuCtxSetCurrent", EGLCUDA_CALL_EVENT_QUERY: "cuEventQuery",
              EGLCUDA_CALL_STREAM_WAIT_EVENT: "cuStreamWaitEvent", EGLCUDA_CALL_EVENT_RECORD: "cuEventRecord",
              EGLCUDA_CALL_STREAM_QUERY: "cuStreamQuery"}


cdef object failed(CUresult status, int call, str doing):
    return cuda_error(status, CALL_NAMES.get(call, "the CUDA driver"), doing)


def ipc_record(uintptr_t context, uintptr_t event, uintptr_t stream):
    """Record ``event`` on ``stream`` (the publisher, once per frame)."""
    cdef CUresult status
    cdef int call = EGLCUDA_CALL_CONTEXT
    with nogil:
        status = hot.ipc_record(<CUcontext>context, <CUevent>event, <CUstream>stream, &call)
    if status:
        raise failed(status, call, "recording the frame's event")


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
    GPU; no host wait. A subscriber calls it before reading a frame, the publisher before writing
    a slot again."""
    cdef CUresult status
    cdef int call = EGLCUDA_CALL_CONTEXT
    with nogil:
        status = hot.ipc_order_after(<CUcontext>context, <CUstream>stream, <CUevent>event, &call)
    if status:
        raise failed(status, call, doing)
