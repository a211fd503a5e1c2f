# The publisher's books, typed: a pool slot and a subscriber after its handshake, shared by the
# compiled delivery steps (_delivery.pyx) and any Cython module that cimports them. Python code
# (publisher.py, pool.py, handshake.py) sees the same objects through their attributes.
from eglcuda.topics._ring cimport Ring

cdef enum:
    # A pool slot's state.
    SLOT_FREE = 0  # nobody holds it: next_frame may hand it out
    SLOT_WRITING = 1  # handed out by next_frame, not published yet
    SLOT_PUBLISHED = 2  # subscribers may hold it


cdef class Slot:
    cdef readonly int index
    cdef public object frame
    cdef public int state
    cdef readonly set holders  # the Members whose transport still holds the memory
    # Members that released it with a done event (their GPU work may still read it): when.
    cdef readonly dict waiters
    cdef public long long seq
    cdef public double published_at


cdef class Member:
    cdef readonly long long id
    cdef public object sock
    cdef readonly int fd
    cdef public object inbox
    cdef public object peer
    cdef public object qos
    cdef readonly bint latest  # qos is 'latest'
    cdef public int queue
    cdef public int credit  # frames it may have outstanding
    cdef public object link
    cdef readonly bint message_only  # the link's: the FRAME message is the whole hand-over
    cdef readonly bint plain_release  # the link's: a RELEASE without a done event frees its slot
    cdef public str transport
    cdef readonly dict outstanding  # seq -> Slot: delivered, not released
    cdef readonly set seen_slots  # slots it was described (SLOT messages sent)
    cdef public long long delivered
    cdef public long long skipped
    cdef public bint noticed  # a NOTICE went out since its last frame
    cdef public double since
    cdef public bint alive
    cdef public bint leaving  # its goodbye or end of connection was read, not handled yet
    cdef public Ring ring  # its frame ring (_ring.pyx); None: every message by socket (EGLStream)
    cdef object __weakref__


cdef int record_delivery(Member sub, Slot slot, object seq) except -1
cdef int let_go(Member sub, Slot slot, bint recorded, double now, object free) except -1
cdef int maybe_free(Slot slot, object free) except -1
