# A subscriber's announcement ring, typed: the shared memory through which a publisher announces
# frames to one subscriber and takes its releases back (_ring.pyx has the layout and the why).
from libc.stdint cimport uint8_t, uint32_t, uint64_t


cdef class Ring:
    cdef uint8_t *base  # the mapping (NULL once closed)
    cdef bint publisher  # which end this mapping is
    cdef uint64_t mine  # the count this end writes: frames announced (publisher), releases written (subscriber)
    cdef uint64_t taken  # the count this end reads up to: releases read (publisher), frames read (subscriber)
    cdef uint64_t peer_mine  # the other end's written count, as last read
    cdef uint64_t peer_taken  # the other end's read count, as last read
    cdef uint64_t socket_count  # releases sent on the socket: sent (subscriber), read up to (publisher)

    cdef uint64_t *count(self, int at) noexcept nogil
    cdef uint32_t *flag(self, int at) noexcept nogil
    cdef int room(self) noexcept
    cdef object pop(self)
    cdef int next_kind(self) noexcept
    cdef bint waiting(self) noexcept nogil
    cdef bint is_dropped(self) noexcept nogil
    cdef int push_frame(self, uint64_t seq, int slot, uint64_t timestamp, const char *payload,
                        Py_ssize_t size) noexcept
    cdef int push_marker(self) noexcept
    cdef int take_release(self, uint64_t *seq) noexcept
    cdef void wake(self, int fd) noexcept
    cdef uint64_t releases_written(self) noexcept
    cdef bint released_since(self) noexcept
