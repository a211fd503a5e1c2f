# cython: language_level=3
"""CUDA endpoints of an EGLStream (section 4.1 of NVIDIA's EGL interop guide): :class:`CudaProducer`,
:class:`CudaConsumer` and the :class:`AcquiredFrame` a consumer lends out.

The whole frame path reads top to bottom here. A frame goes
``present`` -> driver (``producer_present``) -> ``acquire`` (``consumer_acquire``: acquire, map,
number) -> ``AcquiredFrame.release`` -> ``return_frame`` (the driver hands the buffer back).
Every driver step is one call into the fused C helpers of csrc/helpers.c, reached through the
table declared in csrc/hot_api.h; this module and the helpers compile the same declarations, so a
changed signature or constant fails at build time. The per-frame calls release the GIL for the
driver and allocate nothing in the common case; checks, messages and rare paths are ordinary
methods below.
"""
cimport cython
from cpython.exc cimport PyErr_CheckSignals
from cpython.list cimport PyList_GET_ITEM, PyList_SET_ITEM
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.pystate cimport PyThreadState_Get
from cpython.ref cimport Py_INCREF, Py_XDECREF, PyObject, _Py_REFCNT
from libc.stdint cimport uint64_t, uintptr_t
from libc.string cimport memset
from posix.time cimport CLOCK_MONOTONIC, CLOCK_REALTIME, clock_gettime, timespec

from eglcuda._resource cimport Resource
from eglcuda.frames._core cimport CU_EGL_FRAME_TYPE_ARRAY, CUeglFrame, FrameCore, ProducerLink

import time
import weakref

from .._bind import cuda
from .._bind.cuda import cuda_error
from .._bind import cuda_egl as _driver
from .._bind.egl import address, clear_error as clear_egl_error
from .._bind.hot import table_address
from .._integers import as_int, check_flag
from .._resource import abandon, exiting
from .._unix import wait_seconds
from ..errors import ClosedError, EglCudaError, StreamDisconnected, Timeout, Unsupported, UsageError
from ..frames.formats import (ColorFormat, Layout, _plane_geometry, check_size, color_format, layout_of,
                              producer_format)
from ..frames.frame import Frame, FrameBase, Plane, note_users, order_after
from ..frames.interop import stream_handle
from .stream import ResourceLocation, StreamState, check_microseconds

from eglcuda._hot cimport (
    CUDA_ERROR_LAUNCH_TIMEOUT, CUDA_SUCCESS, EGLCUDA_CALL_ACQUIRE, EGLCUDA_CALL_CONTEXT, EGLCUDA_CALL_COUNTER,
    EGLCUDA_CALL_MAP, EGLCUDA_CALL_PRESENT, EGLCUDA_CALL_RELEASE, EGLCUDA_CALL_RETURN, EGLCUDA_CALL_SYNCHRONIZE,
    EGLCUDA_DEFAULT_ACQUIRE_TIMEOUT_US, EGLCUDA_MAX_FRAMES_IN_FLIGHT, CUcontext, CUeglStreamConnection,
    CUgraphicsResource, CUresult, CUstream, EGLDisplay, EGLStreamKHR, EGLuint64KHR, eglcuda_hot_api, hot_table)

# A weak reference list is what keeps an acquired frame from being reused (see _frame_for).
cdef extern from *:
    """
    static int eglcuda_has_weakrefs(PyObject *o)
    {
        Py_ssize_t offset = Py_TYPE(o)->tp_weaklistoffset;
        return offset > 0 && *(PyObject **)((char *)o + offset) != NULL;
    }
    """
    bint has_weakrefs "eglcuda_has_weakrefs" (PyObject *o)

# FAST_CALLS: the per-frame methods are compiled as plain method descriptors (binding False),
# not Cython function objects: CPython specialises a call of a method descriptor into a direct
# C call, which saves the generic call path on every frame (docs/benchmarks.md, callgrind).
# Their signatures stay readable (inspect.signature, Sphinx): embedsignature writes them into
# the docstrings in the form CPython reads for built-in functions.
MAX_FRAMES_IN_FLIGHT = EGLCUDA_MAX_FRAMES_IN_FLIGHT
DEFAULT_ACQUIRE_TIMEOUT_US = EGLCUDA_DEFAULT_ACQUIRE_TIMEOUT_US
# acquire and acquire_next spell it as a literal: a signature CPython reads from a docstring
# (FAST_CALLS) takes literals only.
assert EGLCUDA_DEFAULT_ACQUIRE_TIMEOUT_US == 1000000, "acquire's default timeout_us is written out below"
cdef enum:
    MAX_TIMEOUT_US = 0x7FFFFFFF  # what the driver's unsigned int microseconds take, kept positive
    FLIGHT_MASK = EGLCUDA_MAX_FRAMES_IN_FLIGHT - 1  # the in-flight ring's slots (a power of two)
    # A return_frame wait longer than this asks the driver in slices of it: a close() of another
    # thread, Ctrl-C or a consumer gone ends the wait between two (_return_in_slices)
    RETURN_SLICE_US = 50000
assert EGLCUDA_MAX_FRAMES_IN_FLIGHT & FLIGHT_MASK == 0, "the in-flight ring needs a power of two slots"

cdef class CudaConsumer

# Which call a fused helper says failed, for messages.
CALL_NAMES = {EGLCUDA_CALL_CONTEXT: "cuCtxSetCurrent", EGLCUDA_CALL_ACQUIRE: "cuEGLStreamConsumerAcquireFrame",
              EGLCUDA_CALL_MAP: "cuGraphicsResourceGetMappedEglFrame", EGLCUDA_CALL_COUNTER: "eglQueryStreamu64KHR",
              EGLCUDA_CALL_RELEASE: "cuEGLStreamConsumerReleaseFrame",
              EGLCUDA_CALL_PRESENT: "cuEGLStreamProducerPresentFrame",
              EGLCUDA_CALL_RETURN: "cuEGLStreamProducerReturnFrame",
              EGLCUDA_CALL_SYNCHRONIZE: "cuStreamSynchronize"}


cdef inline bint is_legacy(CUstream stream) noexcept nogil:
    """NULL or CU_STREAM_LEGACY: the legacy default stream."""
    return <uintptr_t>stream <= 1


cdef inline CUresult legacy_first(bint needed, CUcontext ctx, int *failed_call) noexcept nogil:
    """The host wait an endpoint of a shared stream makes before a present or release named on
    the legacy default stream (csrc/helpers.c, eglcuda_legacy_sync), when ``needed``."""
    return hot.legacy_sync(ctx, failed_call) if needed else CUDA_SUCCESS

# ---- the helper table ---------------------------------------------------------------------------

cdef const eglcuda_hot_api *hot = hot_table(table_address())

# ---- the endpoint gate --------------------------------------------------------------------------
# One thread at a time inside an endpoint's calls, which release the GIL for the driver. The common
# case (nobody inside, nobody waiting) is a flag read and written with the GIL held, no atomic
# instruction and no clock read; a thread that finds the gate busy waits on a condition variable
# without the GIL. A thread leaving while others wait hands the gate over (it stays busy until a
# waiter claims it), so a thread calling in a tight loop cannot keep taking it back: close() from
# another thread gets in. The thread inside is remembered, so that re-entry from it (a signal
# handler, a weak reference callback, a garbage collector finalizer calling into the same endpoint)
# raises instead of waiting forever for itself.

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    int pthread_mutex_init(pthread_mutex_t *, const void *)
    int pthread_mutex_destroy(pthread_mutex_t *)
    int pthread_mutex_lock(pthread_mutex_t *)
    int pthread_mutex_unlock(pthread_mutex_t *)
    int pthread_cond_init(pthread_cond_t *, const void *)
    int pthread_cond_destroy(pthread_cond_t *)
    int pthread_cond_wait(pthread_cond_t *, pthread_mutex_t *)
    int pthread_cond_timedwait(pthread_cond_t *, pthread_mutex_t *, const timespec *)
    int pthread_cond_broadcast(pthread_cond_t *)

cdef extern from *:
    """
    #define eglcuda_load(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
    #define eglcuda_store(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
    """
    int atomic_load "eglcuda_load" (int *) nogil
    void atomic_store "eglcuda_store" (int *, int) nogil

cdef struct Gate:
    int busy         # someone is inside, or the gate is being handed to a waiter
    int handoff      # busy only because it is being handed over: the first earlier waiter takes it
    int leaves       # how many times a thread left with others waiting (handoffs made)
    int waiters      # threads waiting to enter; only touched with the GIL held
    uintptr_t owner  # the thread inside (its thread state: one per thread, cheaper to read than its id)
    pthread_mutex_t mutex
    pthread_cond_t cond


cdef int gate_init(Gate *gate) except -1:
    memset(gate, 0, sizeof(Gate))
    if pthread_mutex_init(&gate.mutex, NULL) != 0:
        raise MemoryError("initializing an endpoint's gate")
    if pthread_cond_init(&gate.cond, NULL) != 0:
        pthread_mutex_destroy(&gate.mutex)
        raise MemoryError("initializing an endpoint's gate")
    return 0


cdef void gate_init_noexcept(Gate *gate) noexcept:
    memset(gate, 0, sizeof(Gate))
    pthread_mutex_init(&gate.mutex, NULL)
    pthread_cond_init(&gate.cond, NULL)


cdef void gate_destroy(Gate *gate) noexcept:
    pthread_cond_destroy(&gate.cond)
    pthread_mutex_destroy(&gate.mutex)


cdef inline bint gate_free_for_me(Gate *gate, int arrived) noexcept nogil:
    # A handoff is for the threads that were already waiting when it was made (arrived before
    # it): the thread that just left cannot take its own handoff back.
    return not atomic_load(&gate.busy) or (atomic_load(&gate.handoff) and atomic_load(&gate.leaves) != arrived)


cdef bint gate_wait(Gate *gate, str endpoint, const timespec *deadline) except -1:
    """Enter (GIL held), waiting for the thread inside without the GIL; ``deadline`` (absolute,
    CLOCK_REALTIME) or NULL for no limit. False when the deadline passed first."""
    cdef uintptr_t me = <uintptr_t>PyThreadState_Get()
    cdef int timed_out = 0
    cdef int arrived
    if not gate.busy and not gate.waiters:
        gate.busy = 1
        gate.owner = me
        return True
    if gate.owner == me and not gate.handoff:
        raise UsageError(f"the {endpoint} was called again from inside one of its own calls on the same thread "
                         "(a signal handler, weak reference callback or finalizer): that call would wait for "
                         "itself forever; defer the work until the outer call returns")
    gate.waiters += 1
    arrived = gate.leaves
    while True:
        if gate_free_for_me(gate, arrived):  # checked with the GIL held, where the gate changes hands
            break
        with nogil:
            pthread_mutex_lock(&gate.mutex)
            while not gate_free_for_me(gate, arrived) and timed_out == 0:
                if deadline == NULL:
                    pthread_cond_wait(&gate.cond, &gate.mutex)
                else:
                    timed_out = pthread_cond_timedwait(&gate.cond, &gate.mutex, deadline)
            pthread_mutex_unlock(&gate.mutex)
        if timed_out and not gate_free_for_me(gate, arrived):
            gate.waiters -= 1
            return False
    gate.waiters -= 1
    gate.handoff = 0
    gate.busy = 1
    gate.owner = me
    return True


cdef inline int gate_enter(Gate *gate, str endpoint) except -1:
    """Enter (GIL held); when another thread is inside, wait for it without the GIL. The common
    case is inlined into every per-frame call: two flags read, two fields written."""
    if not gate.busy and not gate.waiters:
        gate.busy = 1
        gate.owner = <uintptr_t>PyThreadState_Get()
        return 0
    gate_wait(gate, endpoint, NULL)
    return 0


cdef bint gate_enter_within(Gate *gate, str endpoint, double timeout_s) except -1:
    """gate_enter, giving up after ``timeout_s`` seconds: False when another thread is still
    inside (a present into a full FIFO waits for the consumer, without limit)."""
    cdef timespec deadline
    if timeout_s > 1e9:  # infinity, or past any deadline a timespec holds: no limit
        return gate_wait(gate, endpoint, NULL)
    clock_gettime(CLOCK_REALTIME, &deadline)
    deadline.tv_sec += <long>timeout_s
    deadline.tv_nsec += <long>((timeout_s - <long>timeout_s) * 1e9)
    if deadline.tv_nsec >= 1000000000:
        deadline.tv_sec += 1
        deadline.tv_nsec -= 1000000000
    return gate_wait(gate, endpoint, &deadline)


cdef bint gate_enter_to_close(Gate *gate, int *closing, str endpoint, double timeout_s) except -1:
    """close()'s gate_enter_within: while it waits, ``closing`` counts it, which a wait of
    eglcuda's own inside another thread's call (a sliced return_frame, the wait for a producer)
    watches to end at once."""
    closing[0] += 1
    try:
        return gate_enter_within(gate, endpoint, timeout_s)
    finally:
        closing[0] -= 1


cdef inline bint gate_enter_for(Gate *gate, str endpoint, unsigned long long *wait_us) except -1:
    """gate_enter for a call that waits at most ``*wait_us``: while another thread is inside (a
    present into a full FIFO waits for the consumer, without limit), wait for the gate no longer
    than that and take the time it took from ``*wait_us``. False when the time ran out first."""
    if not gate.busy and not gate.waiters:
        gate.busy = 1
        gate.owner = <uintptr_t>PyThreadState_Get()
        return True
    return gate_wait_for(gate, endpoint, wait_us)


cdef bint gate_wait_for(Gate *gate, str endpoint, unsigned long long *wait_us) except -1:
    """gate_enter_for's wait for another thread."""
    cdef timespec start, now
    cdef long long spent
    clock_gettime(CLOCK_MONOTONIC, &start)
    if not gate_enter_within(gate, endpoint, wait_us[0] / 1e6):
        return False
    clock_gettime(CLOCK_MONOTONIC, &now)
    spent = (now.tv_sec - start.tv_sec) * 1000000 + (now.tv_nsec - start.tv_nsec) // 1000
    wait_us[0] = wait_us[0] - <unsigned long long>spent if <long long>wait_us[0] > spent else 0
    return True


cdef void gate_hand_over(Gate *gate) noexcept:
    """Leave with waiters (GIL held): hand the gate over instead of opening it, and wake them. A
    waiter checks the flags with the mutex held before it sleeps and the wake-up is sent with the
    mutex held, so none is missed."""
    atomic_store(&gate.leaves, gate.leaves + 1)
    atomic_store(&gate.handoff, 1)
    pthread_mutex_lock(&gate.mutex)
    pthread_cond_broadcast(&gate.cond)
    pthread_mutex_unlock(&gate.mutex)


cdef inline void gate_leave(Gate *gate) noexcept:
    """Leave (GIL held); with waiters, hand the gate over (gate_hand_over)."""
    gate.owner = 0
    if gate.waiters:
        gate_hand_over(gate)
    else:
        atomic_store(&gate.busy, 0)


# ---- small helpers ------------------------------------------------------------------------------

# What an endpoint's timeout cache holds before its first timeout: no caller can pass this object.
cdef object NO_TIMEOUT_SEEN = object()


cdef unsigned long long read_timeout(object value) except? 0xFFFFFFFFFFFFFFFF:
    """A timeout in microseconds: an int in 0..2**31-1 (int subclasses taken as ints)."""
    cdef int overflow = 0
    cdef long long us
    if type(value) is int:
        us = PyLong_AsLongLongAndOverflow(value, &overflow)
        if not overflow and 0 <= us <= MAX_TIMEOUT_US:
            return <unsigned long long>us
    check_microseconds("timeout_us", value)
    return <unsigned long long>int(value)


cdef inline void put_slot(list slots, Py_ssize_t at, object value) noexcept:
    """``slots[at] = value`` for an index known to be in range, without the checks of a list store.
    The value it replaces must not be the last reference to anything (its drop runs no code)."""
    cdef PyObject *old = PyList_GET_ITEM(slots, at)
    Py_INCREF(value)
    PyList_SET_ITEM(slots, at, value)
    Py_XDECREF(old)


cdef inline uintptr_t pointer(object handle) except? 0:
    """A native handle (an int address, or a cffi pointer) as an address."""
    return <uintptr_t>(handle if type(handle) is int else address(handle))


cdef double _close_timeout(object timeout) except? -1:
    """close()'s wait for another thread's call: as asked, else 10 s (0.5 s at interpreter exit,
    where a thread blocked in the driver may never come back)."""
    if timeout is None:
        return 0.5 if exiting() else 10.0
    # (Read as every other wait is: NumPy's numbers too, bools and NaN refused.)
    return wait_seconds(timeout)


cdef object _endpoint_busy(Resource endpoint, str what, double timeout):
    """close() found another thread inside the endpoint for ``timeout`` seconds. At interpreter
    exit the handle is left to the process's end (disconnecting under a thread that is inside the
    driver is not safe); otherwise the caller hears why."""
    if exiting():
        abandon(endpoint)
        return None
    calls = ("present (a present into a full FIFO waits for the consumer to acquire)" if what == "producer" else
             "acquire (it waits for the producer's next frame)")
    raise Timeout(f"another thread has been inside this {what}'s {calls} for {timeout} s: close it once that call "
                  "returns")


def _disconnect_producer(uintptr_t context, connection, ProducerLink link) -> None:
    """A producer's release (at close, collection or exit): disconnect, then tell the frames it
    presented that the driver is done with them. A producer collected without close() must free
    them too, or they could never be closed: no producer would be left to disconnect."""
    try:
        _driver.disconnect(context, "producer", connection, 0)
    finally:
        link.connected = False


# ==== producer =====================================================================================

@cython.final  # no subclasses: its per-frame steps are direct C calls, not through a method table
cdef class CudaProducer(Resource):
    """CUDA as the producer of a stream. Made by :meth:`Stream.connect_cuda_producer`.

    :meth:`present` checks each frame against the connection (size, format, layout, device) the
    first time this producer sees it, before the driver does, because a mismatch is undefined
    behaviour there. Presented frames belong to the stream until :meth:`return_frame` gives them
    back (at most 64 in flight); the driver also keeps every frame ever presented associated with
    the stream until the producer disconnects, so this producer keeps them alive until then, and a
    frame cannot be closed while any producer it was presented on is connected.
    """

    cdef readonly object stream
    cdef readonly object device
    cdef readonly int width, height
    cdef object _format, _layout
    cdef object _connection
    cdef CUcontext ctx
    cdef CUeglStreamConnection *conn
    cdef CUstream default_stream, present_stream, return_stream
    cdef CUeglFrame returned
    cdef unsigned long long returned_key
    cdef int failed_call
    cdef bint reuse, connected
    cdef int closing  # close() calls waiting for another thread's call: a sliced wait ends (return_frame)
    cdef int fifo_length  # the stream's (0: mailbox)
    # The stream is shared with another process (or opened on another GPU's display): a present
    # naming the legacy default stream waits for that stream's work on the host first, because the
    # driver does not order it (see eglcuda_legacy_sync in csrc/helpers.c).
    cdef bint shared
    # Presents begun and presents done (successfully), each counted with the GIL held: a consumer
    # in this process reads them to number a new frame without asking EGL (see _derive_plan). A
    # failed present leaves them unequal for good.
    cdef long long presents_started
    cdef readonly long long frames_presented
    # The frames presented and not returned, in present order, in a ring of fixed length: the
    # oldest in slot ``flight_head``, the i-th after it in slot (flight_head + i) & FLIGHT_MASK, None
    # in the free slots; and their plane-0 addresses (what a returned CUeglFrame is matched by) at
    # the same slots. Taking back the oldest, the usual case, moves nothing; another moves the
    # later ones down a slot. Every frame in it is also in ``associated``.
    cdef list flight
    cdef int flying, flight_head
    cdef unsigned long long flight_key[EGLCUDA_MAX_FRAMES_IN_FLIGHT]
    # Every frame presented since connect, by key: the driver keeps them associated until disconnect.
    cdef dict associated
    # Frames made by allocate_frame: the ring a loop cycles, before all of it was presented.
    cdef Py_ssize_t allocated
    cdef ProducerLink link
    # The last timeout an int object gave and what it read as (see _timeout).
    cdef object timeout_seen
    cdef unsigned long long timeout_seen_us
    cdef Gate gate

    def __cinit__(self, *args, **kwargs):
        gate_init(&self.gate)
        self.timeout_seen = NO_TIMEOUT_SEEN
        self.flight = [None] * EGLCUDA_MAX_FRAMES_IN_FLIGHT
        self.associated = {}
        self.link = ProducerLink()
        self.link.connected = False

    def __dealloc__(self):
        gate_destroy(&self.gate)

    cdef void _forget_after_fork(self) noexcept:
        # A thread of the parent may have been inside the gate at fork: start afresh, closed.
        gate_init_noexcept(&self.gate)
        self.connected = False
        # The frames it presented are the parent's business: in this process none is in use.
        if self.link is not None:
            self.link.connected = False

    def __init__(self, stream, width, height, device=None, format=None, layout=None) -> None:
        self._format = None if format is None else producer_format(format)
        width, height = check_size(width, height, self._format)
        self._layout = None if layout is None else layout_of(layout)
        stream._check_producer_slot()
        self.stream = stream
        self.width = width
        self.height = height
        self.device = stream._device(device)
        handle = stream._handle_for(self.device)
        self.device.make_current()
        self._connection = _driver.producer_connect(handle, width, height)
        self.ctx = <CUcontext>pointer(self.device.context)
        self._own(_disconnect_producer, <uintptr_t>self.ctx, self._connection, self.link, parent=stream)
        self.conn = <CUeglStreamConnection *><uintptr_t>_driver.connection_address(self._connection)
        self.reuse = bool(stream.reuse_last_frame)
        self.fifo_length = stream.fifo_length
        self.shared = stream._shared()
        self.connected = True
        self.link.connected = True
        stream.producer = self
        consumer = stream.consumer
        if isinstance(consumer, CudaConsumer):
            # Both ends in this process: the consumer numbers frames from this producer's present
            # counts instead of an EGL query per frame, where that is exact (see _derive_plan).
            (<CudaConsumer>consumer)._link_producer(self, stream.fifo_length > 0)

    # ---- the per-frame calls --------------------------------------------------------------------
    cdef inline unsigned long long _timeout(self, object value) except? 0xFFFFFFFFFFFFFFFF:
        """read_timeout(value), read once per int object: a loop passes the same one every call."""
        if value is self.timeout_seen:
            return self.timeout_seen_us
        cdef unsigned long long us = read_timeout(value)
        if type(value) is int:  # an int is immutable; a subclass could answer differently each time
            self.timeout_seen = value
            self.timeout_seen_us = us
        return us

    @cython.binding(False)  # per-frame call: see FAST_CALLS
    @cython.embedsignature.format("clinic")
    def present(self, frame, cuda_stream=None) -> None:
        """Hand ``frame`` to the consumer. ``cuda_stream`` is where the work writing the frame was
        queued (None: the legacy default stream). The driver returns only once that work is done
        (measured on driver 580), and on a FIFO stream only once the queue has room; the wait
        releases the GIL. On a stream shared with another process, a present naming the legacy
        default stream (None, 0) first waits for that stream's work on the host: the driver does
        not order it there (docs/streams.md). Streams the frame was handed to since its last
        present (a DLPack consumer that wrote it) are waited for too, on the GPU
        (docs/ordering.md). The frame is checked against the connection (size, format, layout,
        device) the first time this producer sees it, before the driver does."""
        cdef FrameCore core
        cdef CUstream *stream_box
        cdef CUresult status
        cdef bint known
        gate_enter(&self.gate, "producer")
        try:
            known = self._ready(frame, cuda_stream)
            core = <FrameCore>frame
            stream_box = self._present_stream_box(core, cuda_stream)
            self._claim(core, known)
            self.presents_started += 1
            with nogil:
                status = legacy_first(self.shared and is_legacy(stream_box[0]), self.ctx, &self.failed_call)
                if status == CUDA_SUCCESS:
                    status = hot.producer_present(self.ctx, self.conn, &core.egl, stream_box, &self.failed_call)
            if status:
                self._unclaim(core, known)
                raise self._present_failure(status)
            self._presented(core, known)
        finally:
            gate_leave(&self.gate)

    @cython.binding(False)  # per-frame call: see FAST_CALLS
    @cython.embedsignature.format("clinic")
    def return_frame(self, timeout_us=0):
        """Take back a frame the consumer released: the same :class:`Frame` object that was
        presented, or None if none came back within ``timeout_us`` microseconds.

        None is also the documented answer while the stream keeps the newest frame for its consumer
        (reuse on, the default): that frame comes back only after another is presented, so with one
        frame in flight this returns None at once instead of waiting. The wait releases the GIL.
        Time spent waiting for another thread's call on this producer (a present into a full FIFO
        waits for the consumer) counts against ``timeout_us``."""
        cdef unsigned long long wait_us = self._timeout(timeout_us)
        cdef CUresult status
        if not gate_enter_for(&self.gate, "producer", &wait_us):
            return None
        try:
            if not self.connected:
                raise ClosedError("the producer is disconnected (or its stream closed)")
            if not self.flying:
                return None
            if self.reuse and self.flying == 1:
                # With reuse on, the stream keeps its newest frame: a single frame in flight cannot
                # come back, so one try answers at once.
                wait_us = 0
            if wait_us > RETURN_SLICE_US:
                return self._return_in_slices(wait_us)
            with nogil:
                status = hot.producer_return(self.ctx, self.conn, &self.returned, &self.return_stream, wait_us,
                                             &self.returned_key, &self.failed_call)
            if status:
                return self._return_failed(status, wait_us)
            return self._take_returned()
        finally:
            gate_leave(&self.gate)

    @cython.binding(False)  # per-frame call: see FAST_CALLS
    @cython.embedsignature.format("clinic")
    def present_and_return(self, frame, cuda_stream=None, timeout_us=0):
        """:meth:`present` ``frame``, then take a frame back (waiting up to ``timeout_us``), in a
        single call into the driver layer: the step of a producer that cycles a ring of frames,
        cheaper than the two calls. Returns the frame taken back, or None.

        With ``timeout_us=0`` a frame is asked for only when one is due: once every frame this
        producer presented or made with :meth:`allocate_frame` is in flight again, or more are in
        flight than the stream's FIFO holds (always in mailbox mode). Asking earlier takes frames back while the consumer is still busy
        with the ones before: on driver 580 that made a two-thread loop about 1.5x slower a frame.
        A frame not asked for comes back at a later step or from :meth:`return_frame`. With a
        ``timeout_us`` above 0 the call always waits for one, as :meth:`return_frame` does, but in
        one call into the driver: a close of another thread, or Ctrl-C, waits for its end (a long
        wait is :meth:`return_frame`'s, which ends at either)."""
        cdef unsigned long long wait_us = self._timeout(timeout_us)
        cdef FrameCore core
        cdef CUstream *stream_box
        cdef CUresult status
        cdef bint take_back, known
        gate_enter(&self.gate, "producer")
        try:
            known = self._ready(frame, cuda_stream)
            core = <FrameCore>frame
            stream_box = self._present_stream_box(core, cuda_stream)
            if self.reuse and not self.flying:
                # After this present the stream keeps the newest frame: with reuse on and nothing
                # else in flight nothing can come back.
                take_back = False
            else:
                take_back = wait_us != 0 or self._return_due(known)
            self._claim(core, known)
            self.presents_started += 1
            with nogil:
                status = legacy_first(self.shared and is_legacy(stream_box[0]), self.ctx, &self.failed_call)
                if status == CUDA_SUCCESS:
                    if take_back:
                        status = hot.producer_present_return(self.ctx, self.conn, &core.egl, stream_box,
                                                             &self.returned, &self.return_stream, wait_us,
                                                             &self.returned_key, &self.failed_call)
                    else:
                        status = hot.producer_present(self.ctx, self.conn, &core.egl, stream_box, &self.failed_call)
            if status and self.failed_call != EGLCUDA_CALL_RETURN:  # the synchronize, the context or the present
                self._unclaim(core, known)
                raise self._present_failure(status)
            self._presented(core, known)
            if not take_back:
                return None
            if status:
                return self._return_failed(status, wait_us)
            return self._take_returned()
        finally:
            gate_leave(&self.gate)

    cdef inline bint _return_due(self, bint known):
        """Whether a present that asks for no wait should also ask for a frame back (see
        :meth:`present_and_return`): counted as if the present being made had succeeded."""
        cdef Py_ssize_t in_flight = self.flying + 1
        cdef Py_ssize_t frames = len(self.associated) + (0 if known else 1)
        # A ring made by allocate_frame counts whole from its first present: counting only the
        # frames presented so far would ask at the second present and keep a ring of six cycling
        # two (a frame comes back at once from a consumer that keeps up), which serialises a
        # two-thread loop.
        if self.allocated > frames:
            frames = self.allocated
        return in_flight >= frames or in_flight > self.fifo_length

    # ---- the steps around the driver calls (inside the gate) -------------------------------------
    cdef bint _ready(self, frame, cuda_stream) except -1:
        """The checks before a present. Returns whether this producer presented the frame before
        (then it is open and matches the connection: a frame's geometry never changes)."""
        cdef FrameCore core
        cdef ProducerLink link
        cdef bint known = False
        cdef int i
        if not self.connected:
            raise ClosedError("the producer is disconnected (or its stream closed)")
        if not isinstance(frame, FrameCore):
            self._check_frame(frame)  # raises
        core = <FrameCore>frame
        if core.last_link is self.link:
            known = True
        else:
            for link in core.links:
                if link is self.link:
                    known = True
                    break
        for i in range(self.flying):
            if self.flight_key[(self.flight_head + i) & FLIGHT_MASK] == core.key:
                self._check_frame(frame)  # raises: already in flight
        if not known or self.flying >= EGLCUDA_MAX_FRAMES_IN_FLIGHT:
            self._check_frame(frame)
        elif core._sources:  # (a wrapper of lent planes: usable only while the frames it wraps are)
            frame._check_usable()
        if cuda_stream is not None:
            self.present_stream = <CUstream><uintptr_t>stream_handle(cuda_stream)
        return known

    cdef CUstream *_present_stream_box(self, FrameCore core, cuda_stream) except NULL:
        """Where a present of ``core`` is ordered (after :meth:`_ready` read ``cuda_stream``): the
        box of the legacy default stream or of the stream given, which the frame's writers joined."""
        cdef CUstream *stream_box = &self.default_stream if cuda_stream is None else &self.present_stream
        if core._handed_to is not None:
            self._join_writers(core, stream_box[0])
        return stream_box

    cdef int _join_writers(self, FrameCore core, CUstream target) except -1:
        """Order the present stream after every stream the frame was handed to since its last
        present (a DLPack consumer writing it, say): the driver waits for the present stream's
        work only (docs/ordering.md)."""
        self.device.make_current()
        cuda.join_streams(<uintptr_t>target, core._handed_to, "ordering a present after the streams that wrote the frame")
        core._handed_to = None
        return 0

    cdef int _presented(self, FrameCore core, bint known) except -1:
        """After a successful present: the frame is in flight; its first present on this producer
        fixes the connection's format and layout if they were open, and associates it."""
        cdef int slot = (self.flight_head + self.flying) & FLIGHT_MASK
        self.flight_key[slot] = core.key
        put_slot(self.flight, slot, core)  # replaces None
        self.flying += 1
        self.frames_presented += 1
        core.last_link = self.link
        if not known:
            if self._format is None:
                self._format = (<object>core).format
            if self._layout is None:
                self._layout = (<object>core).layout
            self.associated[core.key] = core  # (its link was added by _claim)
        return 0

    cdef inline void _claim(self, FrameCore core, bint known):
        """Before the driver call of a present: link a frame this producer has not presented
        before, so that it counts as presented from now on. The call releases the GIL and may wait
        (a full FIFO waits for the consumer): a Frame.close() on another thread meanwhile must not
        free memory the driver is being handed."""
        if not known:
            core.links.append(self.link)

    cdef void _unclaim(self, FrameCore core, bint known):
        """A present that failed: undo :meth:`_claim` (the driver did not take the frame)."""
        cdef Py_ssize_t i
        if not known:
            links = core.links
            for i in range(len(links) - 1, -1, -1):
                if links[i] is self.link:
                    del links[i]
                    break

    cdef object _take_returned(self):
        """The frame the driver just returned, taken out of the in-flight ring."""
        cdef int flying = self.flying
        cdef int head = self.flight_head
        cdef int at, slot = head, later
        cdef list flight = self.flight
        for at in range(flying):
            slot = (head + at) & FLIGHT_MASK
            if self.flight_key[slot] == self.returned_key:
                break
        else:
            raise UsageError(f"the driver returned a frame eglcuda did not present (plane 0 at "
                             f"0x{self.returned_key:x})")
        frame = <object>PyList_GET_ITEM(flight, slot)  # a new reference: the slots' drops free nothing
        if at == 0:
            self.flight_head = (head + 1) & FLIGHT_MASK
        else:
            for at in range(at, flying - 1):
                later = (slot + 1) & FLIGHT_MASK
                put_slot(flight, slot, <object>PyList_GET_ITEM(flight, later))
                self.flight_key[slot] = self.flight_key[later]
                slot = later
        put_slot(flight, slot, None)
        self.flying = flying - 1
        return frame

    cdef object _present_failure(self, CUresult status):
        """The error of a failed present (or of the synchronize before it)."""
        if self.failed_call == EGLCUDA_CALL_SYNCHRONIZE:
            # The legacy stream's own work failed (or its context did): not a sign of the consumer.
            return cuda_error(status, CALL_NAMES[EGLCUDA_CALL_SYNCHRONIZE], "presenting a frame")
        return self.stream._driver_failure(status, CALL_NAMES[self.failed_call], "presenting a frame", "consumer")

    cdef object _return_in_slices(self, unsigned long long wait_us):
        """return_frame's long wait (under the gate): the driver is asked in slices of
        RETURN_SLICE_US, and between them a close() of another thread (ClosedError), a signal's
        handler (Ctrl-C) or a consumer gone (StreamDisconnected) ends it, where the whole wait in
        one call would run to its end regardless."""
        cdef CUresult status
        cdef unsigned long long step
        cdef double left
        deadline = time.monotonic() + wait_us / 1e6
        while True:
            left = (deadline - time.monotonic()) * 1e6
            step = RETURN_SLICE_US if left > RETURN_SLICE_US else (<unsigned long long>left if left > 0 else 0)
            with nogil:
                status = hot.producer_return(self.ctx, self.conn, &self.returned, &self.return_stream, step,
                                             &self.returned_key, &self.failed_call)
            if status != CUDA_ERROR_LAUNCH_TIMEOUT or self.failed_call == EGLCUDA_CALL_CONTEXT or step == 0:
                break
            if self.closing:
                raise ClosedError("the producer was closed by another thread while return_frame waited")
            PyErr_CheckSignals()
            try:
                if self.stream.state is StreamState.DISCONNECTED:
                    break  # (_return_failed says so)
            except EglCudaError:
                break  # (the stream can no longer say: _return_failed asks again, and says why)
        if status:
            return self._return_failed(status, wait_us)
        return self._take_returned()

    cdef object _return_failed(self, CUresult status, unsigned long long waited_us):
        """A failed return: None for 'none came back yet', else the error."""
        if self.failed_call == EGLCUDA_CALL_CONTEXT:
            raise cuda_error(status, CALL_NAMES[EGLCUDA_CALL_CONTEXT], "taking back a frame")
        if status == CUDA_ERROR_LAUNCH_TIMEOUT:
            if waited_us and self.stream.state is StreamState.DISCONNECTED:
                # A consumer gone (its process may have died) never releases: say so.
                raise StreamDisconnected("the consumer disconnected from the stream: presented frames "
                                         "will not come back")
            return None
        raise self.stream._driver_failure(status, "cuEGLStreamProducerReturnFrame", "taking back a frame", "consumer")

    def _busy_at_close(self, double timeout) -> None:
        _endpoint_busy(self, "producer", timeout)

    def _check_frame(self, frame) -> None:
        """Raise the error for a frame that cannot be presented now."""
        if not isinstance(frame, Frame):
            raise UsageError(f"present takes an eglcuda.Frame, got {type(frame).__name__}")
        frame._check_usable()
        if frame.width != self.width or frame.height != self.height:
            raise UsageError(f"frame is {frame.width}x{frame.height} but the producer connected for "
                             f"{self.width}x{self.height}")
        if self._format is not None and frame.format != self._format:
            raise UsageError(f"frame format {frame.format.name} differs from the stream's {self._format.name}")
        if self._layout is not None and frame.layout is not self._layout:
            raise UsageError(f"frame layout {frame.layout.value} differs from the stream's {self._layout.value}")
        if frame.device.ordinal != self.device.ordinal:
            raise UsageError(f"frame lives on CUDA device {frame.device.ordinal}, the producer on "
                             f"{self.device.ordinal}")
        if frame._is_managed():
            # Measured: cuEGLStreamProducerPresentFrame crashes the process (SIGSEGV) on a managed
            # frame (H100 and H200, driver 580). Refuse before the driver sees it.
            raise Unsupported("presenting managed (unified) memory on an EGLStream",
                              where=f"CUDA device {self.device.ordinal}",
                              hint="the driver crashes on it; present device or pinned memory frames "
                                   "(copy the managed data into one)")
        if frame.key in self._in_flight:
            raise UsageError("this frame is already in flight: wait for return_frame() to give it back")
        if self.flying >= EGLCUDA_MAX_FRAMES_IN_FLIGHT:
            raise UsageError(f"{EGLCUDA_MAX_FRAMES_IN_FLIGHT} frames are in flight (the driver's limit): "
                             "return_frame() one before presenting another")

    # ---- state ----------------------------------------------------------------------------------
    @property
    def format(self) -> ColorFormat | None:
        """The color format every frame must have (None until the first present fixes it)."""
        return self._format

    @property
    def layout(self) -> Layout | None:
        """The layout every frame must have (None until the first present fixes it)."""
        return self._layout

    @property
    def in_flight(self) -> int:
        """Frames presented and not yet returned."""
        return self.flying

    @property
    def _in_flight(self) -> dict:
        """A new dict of the frames in flight, by key."""
        cdef int slot
        frames = {}
        for i in range(self.flying):
            slot = (self.flight_head + i) & FLIGHT_MASK
            frames[self.flight_key[slot]] = self.flight[slot]
        return frames

    def allocate_frame(self, format=None, layout=None) -> Frame:
        """A new frame of this connection's size (and format and layout, if fixed). Raises
        :class:`ClosedError` once the producer is disconnected (or its stream or display closed)."""
        if not self.connected:  # (a frame for a connection that is gone would only be leaked)
            raise ClosedError("the producer is disconnected (or its stream closed)")
        fmt = format if format is not None else (self._format if self._format is not None else ColorFormat.ARGB)
        lay = layout if layout is not None else (self._layout if self._layout is not None else Layout.PITCH)
        frame = Frame.allocate(self.width, self.height, fmt, lay, self.device)
        self.allocated += 1
        return frame

    @cython.annotation_typing(False)  # a str or a bool reaches _close_timeout, which says what it takes
    def close(self, timeout: float | None = None) -> None:
        """Disconnect; every frame presented is then free to close (unless another producer it was
        presented on is still connected). Safe to call twice. A :meth:`return_frame` of another
        thread waiting longer than 50 ms ends with :class:`eglcuda.ClosedError` within 50 ms;
        for another call (a present into a full FIFO waits for the consumer in the driver) it waits
        up to ``timeout`` seconds (default 10) and raises :class:`Timeout` if it does not leave."""
        if self._inherited() or (self.closed and not self.connected):
            return
        timeout = _close_timeout(timeout)
        if not gate_enter_to_close(&self.gate, &self.closing, "producer", timeout):  # (a sliced return_frame ends)
            self._busy_at_close(timeout)
            return
        try:
            self.connected = False
        finally:
            gate_leave(&self.gate)
        Resource.close(self)  # disconnects
        self.link.connected = False
        frames = self.flight
        self.flight = [None] * EGLCUDA_MAX_FRAMES_IN_FLIGHT
        self.flying = self.flight_head = 0
        associated = self.associated
        self.associated = {}
        for frame in associated.values():
            (<FrameCore>frame)._drop_disconnected_links()
        consumer = self.stream.consumer
        if isinstance(consumer, CudaConsumer):
            (<CudaConsumer>consumer)._keep_what_held_reads(frames, associated)
        del frames, associated  # dropped after the tables are consistent: callbacks may run

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.flying} in flight"
        return f"<CudaProducer {self.width}x{self.height} on CUDA {self.device.ordinal}: {state}>"


# ==== acquired frame ===============================================================================

@cython.final  # no subclasses: its per-frame steps are direct C calls, not through a method table
cdef class AcquiredFrame:
    """A frame the CUDA consumer acquired: a read-only view of the producer's data, valid until
    :meth:`release` (or the end of a ``with`` block). After release every access raises.

    ``number`` is the stream's consumer frame counter for this frame and ``is_new`` tells whether
    it is a frame not seen before: when no new frame arrives within the acquire timeout, the driver
    hands back the previous one again (``is_new`` False). Both are None when the consumer was
    connected with ``frame_numbers=False``.

    Only the consumer makes these. Once nothing but the consumer refers to a released frame (no
    reference, weak reference or plane of it left), the consumer may reuse the object for a later
    frame, so the per-frame path allocates nothing; for the same reason these objects take no
    attributes of their own.
    """

    cdef readonly CudaConsumer _consumer
    cdef object _planes_cache
    # The streams the frame was handed to (DLPack consumers, copies, CAI's likely readers): its
    # release is ordered after them (docs/ordering.md). None: none.
    cdef list _handed_to
    # The planes of the producer's frames this one reads, kept from being freed by their close()
    # once the producer (in this process) disconnected while this frame was held. None: none.
    cdef object _source
    cdef uint64_t _number
    cdef bint _numbered, _fresh, _released
    cdef object __weakref__

    read_only = True

    def __init__(self, *args, **kwargs):
        raise TypeError("acquired frames come from CudaConsumer.acquire()")

    def __reduce__(self):
        # Cython would copy and pickle the fields: a copy would never be released, and its planes
        # would read memory the stream had taken back.
        raise TypeError("an acquired frame cannot be copied or pickled: it is a loan from the stream until "
                        "release(); copy its planes' data (to_numpy, copy_to_device) instead")

    @property
    def number(self):
        """The stream's consumer frame counter for this frame (None without frame numbers)."""
        # Made when read: most loops never read it, and an int per frame is an allocation.
        return self._number if self._numbered else None

    @property
    def is_new(self):
        """Whether this frame was not seen before (False: the previous frame handed back again;
        None without frame numbers)."""
        return bool(self._fresh) if self._numbered else None

    @property
    def released(self) -> bool:
        return self._released

    @cython.binding(False)  # per-frame call: see FAST_CALLS
    @cython.embedsignature.format("clinic")
    def release(self) -> None:
        """Give the frame back to the stream. The driver returns only once the work queued on the
        frame's ``cuda_stream`` is done (measured on driver 580); that stream first waits, on the
        GPU, for every stream the frame was handed to (DLPack consumers'; see docs/ordering.md).
        The wait releases the GIL. Raises :class:`ClosedError` if already released."""
        self._consumer._release(self)

    def _check_usable(self) -> None:
        if self._released:
            raise ClosedError("the frame was released back to the stream; acquire a new one")

    @property
    def device(self):
        return self._consumer.device

    @property
    def cuda_stream(self) -> int:
        """The consumer's ``CUstream``: work on the frame must be ordered after it."""
        return self._consumer.cuda_stream

    @property
    def width(self) -> int:
        self._check_usable()
        return self._consumer.egl_frame.width

    @property
    def height(self) -> int:
        self._check_usable()
        return self._consumer.egl_frame.height

    @property
    def format(self) -> ColorFormat:
        self._check_usable()
        return color_format(self._consumer.egl_frame.eglColorFormat)

    @property
    def layout(self) -> Layout:
        self._check_usable()
        return Layout.ARRAY if self._consumer.egl_frame.frameType == CU_EGL_FRAME_TYPE_ARRAY else Layout.PITCH

    @property
    def pitch(self) -> int:
        """Bytes between plane 0's rows (0 for CUDA-array frames)."""
        return self._consumer.egl_frame.pitch if self.layout is Layout.PITCH else 0

    @property
    def planes(self) -> tuple:
        self._check_usable()
        return self._planes

    @property
    def _planes(self) -> tuple:
        if self._planes_cache is None:
            self._planes_cache = self._consumer._make_planes(self)
        return self._planes_cache

    def _hand_to(self, consumer_stream: int) -> None:
        """Make ``consumer_stream`` wait for the consumer's stream and remember it: the release
        waits for it too."""
        order_after(self.device, self._consumer.stream_value, consumer_stream)
        self._handed_to = note_users(self._handed_to, (consumer_stream,))

    def _note_users(self, streams) -> None:
        """Remember ``streams`` as readers of the frame: the release waits for them."""
        self._handed_to = note_users(self._handed_to, streams)

    def to_numpy(self) -> list:
        """Host copies of every plane (debugging)."""
        return [plane.to_numpy() for plane in self.planes]

    def __getitem__(self, index):
        # (Untyped: a C int would cut 2**32 to plane 0; the tuple reads any index as a Frame's does.)
        return self.planes[index]

    def __len__(self) -> int:
        """The number of planes (raises :class:`ClosedError` once released)."""
        return len(self.planes)

    def __bool__(self) -> bool:
        """Always True, held or released, as for any object: ``if frame:`` tells a frame from None
        (truth through __len__ would raise once released; test :attr:`released` for that)."""
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        if not self._released:
            self.release()

    def __repr__(self) -> str:
        if self._released:
            return f"<AcquiredFrame #{self.number} released>"
        state = {True: "new", False: "old", None: "unnumbered"}[self.is_new]
        return (f"<AcquiredFrame #{self.number} {self.width}x{self.height} {self.format.name} "
                f"{self.layout.value} {state}>")


FrameBase.register(AcquiredFrame)


cdef inline bint _reusable(PyObject *candidate) noexcept:
    # Only the consumer's spare slot refers to it, nothing weakly, and it has no planes built.
    return (candidate != <PyObject *>None and _Py_REFCNT(candidate) == 1 and not has_weakrefs(candidate)
            and (<AcquiredFrame>candidate)._planes_cache is None)


# ==== consumer =====================================================================================

@cython.final  # no subclasses: its per-frame steps are direct C calls, not through a method table
cdef class CudaConsumer(Resource):
    """CUDA as the consumer of a stream. Made by :meth:`Stream.connect_cuda_consumer`.

    Holds at most one acquired frame at a time (the driver's rule): release it before the next
    :meth:`acquire`. Work on an acquired frame belongs on :attr:`cuda_stream`, which the driver
    orders after the producer's work on the frame (implicit synchronization). A consumer on the
    legacy default stream (``cuda_stream=0``) of a stream shared with another process waits for
    that stream's work on the host before each release: the driver does not order a present named
    on that stream between processes, and eglcuda does not rely on it for a release either
    (docs/streams.md).
    """

    cdef readonly object stream
    cdef readonly object device
    cdef readonly object location
    cdef uintptr_t stream_value  # (read through the cuda_stream property)
    cdef readonly bint frame_numbers
    cdef readonly long long frames_acquired
    cdef object _connection
    cdef bint own_stream
    cdef CUcontext ctx
    cdef CUeglStreamConnection *conn
    cdef CUgraphicsResource resource, held_resource
    cdef CUstream cu_stream
    cdef CUeglFrame egl_frame
    cdef EGLDisplay dpy
    cdef EGLStreamKHR egl_stream
    cdef uint64_t counter, last_number
    cdef int failed_call
    cdef bint use_counter, has_last, producer_seen, connected
    cdef int closing  # close() calls waiting for another thread's call: the wait for a producer ends
    # Without frame numbers: the last frame's first plane, and the in-process producer's presents
    # then (to tell a frame handed out again, once its producer is gone, from a new one).
    cdef void *last_plane
    cdef long long last_presented
    cdef object loop_release_error  # the failed release of a frames() loop's last frame, for the next acquire
    # Its stream is the legacy default stream and the EGLStream is shared with another process: a
    # release waits for that stream's work on the host first (as CudaProducer.shared).
    cdef bint sync_before_release
    # Frame numbers without the EGL query (see _derive_plan).
    cdef CudaProducer producer  # the stream's producer when it is in this process
    cdef bint fifo, last_latched, base_known, derive_off
    cdef uint64_t base  # the frame of the producer's n-th present has number base + n
    cdef long long numbers_derived
    cdef AcquiredFrame held
    # The frames made last, kept so an acquire can reuse one once nothing else refers to it: no
    # allocation and no garbage-collector bookkeeping per frame (see _frame_for). Two, because
    # `frame = consumer.acquire_next()` still holds the previous frame during the call.
    cdef AcquiredFrame spare0, spare1
    cdef int spare_next
    # What a call let go of inside the gate, dropped by the caller after it (see _acquire).
    cdef object dropped, evicted
    # The plane geometry of the last frame whose planes were asked for, and what it was made from:
    # a stream's frames keep one size and format, so each frame's planes reuse it.
    cdef tuple geometry
    cdef unsigned int geometry_format, geometry_width, geometry_height, geometry_pitch, geometry_planes
    # The last timeout an int object gave and what it read as (see _timeout).
    cdef object timeout_seen
    cdef unsigned long long timeout_seen_us
    cdef Gate gate

    def __cinit__(self, *args, **kwargs):
        gate_init(&self.gate)
        self.timeout_seen = NO_TIMEOUT_SEEN

    def __dealloc__(self):
        gate_destroy(&self.gate)

    @property
    def cuda_stream(self) -> int:
        """The ``CUstream`` acquired frames are ordered on (the one given at connection, or one the
        consumer made). One the consumer made is destroyed at its close: asking for it after the
        close raises :class:`ClosedError` rather than hand out a handle the driver may reuse."""
        if self.own_stream and self.closed:
            raise ClosedError("this consumer's CUDA stream was destroyed at its close")
        return self.stream_value

    cdef void _forget_after_fork(self) noexcept:
        # A thread of the parent may have been inside the gate at fork: start afresh, closed.
        gate_init_noexcept(&self.gate)
        self.connected = False
        # The frame the parent held is not this process's to read or release.
        if self.held is not None:
            self._let_go_of_held()

    def __init__(self, stream, device=None, cuda_stream=None, location=None, frame_numbers=True) -> None:
        frame_numbers = check_flag(frame_numbers, "frame_numbers")  # (a bint would take "no" for True)
        stream._check_consumer_slot()
        if location is not None:
            try:
                # An integer of any kind: an IntEnum takes True and 1.0 for 1 (VIDMEM), and NumPy's
                # bools and floats too.
                number = as_int(location)
                if number is None:
                    raise ValueError(location)
                location = ResourceLocation(number)
            except ValueError:
                raise UsageError(f"location is an eglcuda.ResourceLocation (SYSMEM or VIDMEM), got {location!r}") from None
        self.stream = stream
        self.device = stream._consumer_device(device)
        self.device.make_current()
        self.own_stream = cuda_stream is None
        self.stream_value = cuda.stream_create() if self.own_stream else stream_handle(cuda_stream)
        try:
            self._connection = _driver.consumer_connect(stream.handle, location)
        except BaseException:
            if self.own_stream:
                cuda.stream_destroy(self.stream_value)  # returns a status: the connect error stands
            raise
        self.location = location
        self.ctx = <CUcontext>pointer(self.device.context)
        self._own(_driver.disconnect, <uintptr_t>self.ctx, "consumer", self._connection,
                  self.stream_value if self.own_stream else 0, parent=stream)
        self.conn = <CUeglStreamConnection *><uintptr_t>_driver.connection_address(self._connection)
        self.cu_stream = <CUstream>self.stream_value
        self.sync_before_release = is_legacy(self.cu_stream) and stream._shared()
        self.dpy = <EGLDisplay>pointer(stream.display.handle)
        self.egl_stream = <EGLStreamKHR>pointer(stream.handle)
        self.frame_numbers = frame_numbers
        self.use_counter = frame_numbers
        self.connected = True
        stream.consumer = self

    cdef int _link_producer(self, CudaProducer producer, bint fifo) except -1:
        """The stream's producer connected in this process: its present counts can stand in for
        the EGL frame counter query (see _derive_plan)."""
        gate_enter(&self.gate, "consumer")
        self.producer = producer
        self.fifo = fifo
        gate_leave(&self.gate)
        return 0

    # ---- the per-frame calls --------------------------------------------------------------------
    cdef inline unsigned long long _timeout(self, object value) except? 0xFFFFFFFFFFFFFFFF:
        """read_timeout(value), read once per int object: a loop passes the same one every call."""
        if value is self.timeout_seen:
            return self.timeout_seen_us
        cdef unsigned long long us = read_timeout(value)
        if type(value) is int:  # an int is immutable; a subclass could answer differently each time
            self.timeout_seen = value
            self.timeout_seen_us = us
        return us

    @cython.binding(False)  # per-frame call: see FAST_CALLS
    @cython.embedsignature.format("clinic")
    def acquire(self, timeout_us=1000000) -> AcquiredFrame:
        """Acquire the next frame, waiting up to ``timeout_us`` microseconds for a new one.

        If none arrives in time but the stream holds an earlier frame, the driver hands that one
        back again: the result's ``is_new`` is False. With no frame at all, raises
        :class:`Timeout`; once the producer is gone, :class:`StreamDisconnected`. The wait
        releases the GIL."""
        return self._acquire(self._timeout(timeout_us), False)

    @cython.binding(False)  # per-frame call: see FAST_CALLS
    @cython.embedsignature.format("clinic")
    def acquire_next(self, timeout_us=1000000) -> AcquiredFrame:
        """Release the frame this consumer holds (if any), then :meth:`acquire` the next one, in a
        single call into the driver layer: the step of a consumer loop, cheaper than
        ``release()`` + ``acquire()``. The released frame is unusable afterwards, as after
        :meth:`AcquiredFrame.release`."""
        return self._acquire(self._timeout(timeout_us), True)

    def frames(self, timeout_us=EGLCUDA_DEFAULT_ACQUIRE_TIMEOUT_US):
        """Iterate over acquired frames until the producer disconnects. Each step releases the
        previous frame and acquires the next (:meth:`acquire_next`); leaving the loop releases
        the last one. A frame kept past its step is released by the next step all the same."""
        cdef unsigned long long wait_us = self._timeout(timeout_us)
        frame = None
        try:
            while True:
                try:
                    frame = self._acquire(wait_us, True)
                except StreamDisconnected:
                    return
                yield frame
        finally:
            # Only the frame this loop handed out: the consumer may hold another by now, acquired
            # outside the loop after that one was released (the loop then left behind, or dropped).
            if frame is not None and self.held is frame and self.connected:
                try:
                    frame.release()
                except EglCudaError as exc:
                    # The check above is made outside the consumer's gate: another thread's call
                    # inside it (an acquire_next, a release) may have released this frame meanwhile,
                    # and then there is nothing left to do.
                    if not (<AcquiredFrame>frame)._released:
                        # Raised here, it would only be printed ("Exception ignored") when the loop
                        # ends by break: the next acquire() says it, with the frame still held.
                        self.loop_release_error = exc
                        raise

    cdef AcquiredFrame _acquire(self, unsigned long long timeout_us, bint release_held):
        cdef AcquiredFrame frame
        gate_enter(&self.gate, "consumer")
        try:
            if not self.connected:
                raise ClosedError("the consumer is disconnected (or its stream closed)")
            if not release_held and self.held is not None:
                failed, self.loop_release_error = self.loop_release_error, None
                if failed is not None:
                    raise UsageError(f"the consumer still holds the last frame of a frames() loop, whose release "
                                     f"failed: {failed}; release it (or use acquire_next, which does both)") from failed
                raise UsageError("the consumer still holds a frame: release it before acquiring another "
                                 "(or use acquire_next, which does both)")
            if self.loop_release_error is not None:  # (said, or moot: acquire_next released the frame)
                self.loop_release_error = None
            frame = self._acquire_inside(timeout_us, release_held)
        finally:
            # What the call let go of is dropped after the gate: a weak reference callback of a
            # frame or plane could call into this consumer.
            dropped = evicted = None
            if self.dropped is not None:
                dropped, self.dropped = self.dropped, None
            if self.evicted is not None:
                evicted, self.evicted = self.evicted, None
            gate_leave(&self.gate)
        return frame

    cdef AcquiredFrame _acquire_inside(self, unsigned long long timeout_us, bint release_held):
        """acquire / acquire_next inside the gate."""
        cdef long long started = 0, done = 0
        cdef int derive
        cdef EGLDisplay dpy
        cdef unsigned int wait_us
        cdef CUresult status
        cdef CUgraphicsResource held_resource
        cdef uint64_t value
        cdef bint fresh = False
        cdef AcquiredFrame frame
        cdef unsigned long long asked_us = timeout_us  # (what a timeout's message says)
        if not self.producer_seen:
            # Until a producer connects, acquire must not reach the driver (see _wait_for_producer).
            timeout_us = self._wait_for_producer(timeout_us)
        derive = self._derive_plan(&started, &done)
        dpy = self.dpy if (self.use_counter and not derive) else NULL
        wait_us = <unsigned int>timeout_us
        if release_held and self.held is not None:
            if self.held._handed_to is not None:
                self._join_readers(self.held)
            held_resource = self.held_resource
            with nogil:
                status = legacy_first(self.sync_before_release, self.ctx, &self.failed_call)
                if status == CUDA_SUCCESS:
                    status = hot.consumer_next(self.ctx, self.conn, held_resource, &self.resource, &self.cu_stream,
                                               wait_us, &self.egl_frame, dpy, self.egl_stream, &self.counter,
                                               &self.failed_call)
            if not status or (self.failed_call != EGLCUDA_CALL_CONTEXT and self.failed_call != EGLCUDA_CALL_RELEASE
                              and self.failed_call != EGLCUDA_CALL_SYNCHRONIZE):
                self._let_go_of_held()  # released: the stream owns it from here on
            # else it was not released: it stays held and usable, and the error says why
        elif derive and started == done:
            # A frame newer than the last one is certainly in the stream (see _derive_plan) and no
            # present of the producer is under way, nor can one begin (it counts itself with the
            # GIL held): the driver latches that frame without waiting (docs/streams.md,
            # Synchronization), so the GIL stays held, which saves its release and reacquisition.
            status = hot.consumer_acquire(self.ctx, self.conn, &self.resource, &self.cu_stream, wait_us,
                                          &self.egl_frame, dpy, self.egl_stream, &self.counter, &self.failed_call)
        else:
            with nogil:
                status = hot.consumer_acquire(self.ctx, self.conn, &self.resource, &self.cu_stream, wait_us,
                                              &self.egl_frame, dpy, self.egl_stream, &self.counter,
                                              &self.failed_call)
        if status:
            self.last_latched = False
            if self.failed_call == EGLCUDA_CALL_MAP:
                self.derive_off = True  # a frame latched but not mapped: numbering is lost
            if self.failed_call == EGLCUDA_CALL_COUNTER:
                # The frame is acquired and mapped; only the counter query failed: go on without it.
                self._counter_failed()
            elif self.failed_call == EGLCUDA_CALL_RELEASE or self.failed_call == EGLCUDA_CALL_SYNCHRONIZE:
                raise cuda_error(status, CALL_NAMES[self.failed_call], "releasing a frame")
            else:
                raise self.stream._driver_failure(
                    status, CALL_NAMES.get(self.failed_call, "the acquire"), "acquiring a frame", "producer",
                    asked_us if self.failed_call == EGLCUDA_CALL_ACQUIRE else None)
        self.held_resource = self.resource
        value = self.counter
        if derive == 2 and self.producer.presents_started != started:
            # A present began during the acquire: the newest frame may be that one.
            derive = 0
            self._ask_counter(&value)
        if derive == 1:
            value = self.last_number + 1
        elif derive == 2:
            value = self.base + <uint64_t>done
        elif self.use_counter and self.producer is not None:
            self._learn_numbering(value, started, done)
        if self.use_counter:
            fresh = derive != 0 or not self.has_last or value != self.last_number
            if derive:
                self.numbers_derived += 1
            self.has_last = True
            self.last_latched = True
            self.last_number = value
            if not fresh:
                self._check_disconnected(value)
        elif self._repeated():
            self._check_disconnected(None)
        frame = self._frame_for()
        frame._numbered = self.use_counter
        frame._number = value
        frame._fresh = fresh
        self.held = frame
        self.frames_acquired += 1
        return frame

    cdef AcquiredFrame _frame_for(self):
        """The object for a frame just acquired. One made earlier is reused when nothing can tell:
        only this consumer refers to it (the caller dropped it after release), no weak reference,
        no planes built; every field is then set afresh. Otherwise a new one takes the place of
        the older spare, which goes to self.evicted for the caller to drop after the gate."""
        cdef AcquiredFrame frame
        if _reusable(<PyObject *>self.spare0):
            frame = self.spare0
        elif _reusable(<PyObject *>self.spare1):
            frame = self.spare1
        else:
            frame = AcquiredFrame.__new__(AcquiredFrame)
            frame._consumer = self
            if self.spare_next == 0:
                self.evicted = self.spare0
                self.spare0 = frame
            else:
                self.evicted = self.spare1
                self.spare1 = frame
            self.spare_next ^= 1
        frame._released = False
        frame._handed_to = None
        return frame

    cdef int _join_readers(self, AcquiredFrame frame) except -1:
        """Order the consumer's stream after every stream the frame was handed to: the driver's
        release waits for that one stream's work only (docs/ordering.md)."""
        self.device.make_current()
        cuda.join_streams(self.stream_value, frame._handed_to, "ordering a release after the streams that read the frame")
        frame._handed_to = None
        return 0

    cdef void _let_go_of_held(self) noexcept:
        """Mark the held frame released and stop holding it (its caller or the spares may still
        refer to it). Its planes go to self.dropped, for the caller to drop after the gate: a
        released frame's planes are unusable, and they refer back to the frame, which would keep
        it from being reused."""
        cdef AcquiredFrame held = self.held
        if held._source is None:
            self.dropped = held._planes_cache
        else:  # (the producer's frames it kept go too: a frame closed meanwhile is freed then)
            self.dropped = (held._planes_cache, held._source)
            held._source = None
        held._planes_cache = None
        held._handed_to = None
        held._released = True
        self.held = None

    cdef int _keep_what_held_reads(self, list flight, dict associated) except -1:
        """The producer, in this process, disconnected while this consumer holds a frame: that
        frame reads the producer's memory, so the producer's frame is kept from being freed by
        its close() until the held frame is released (close() then frees it). The frame is found
        by its address; where none matches, every frame still in flight is kept."""
        cdef AcquiredFrame held = self.held
        if held is None or held._released:
            return 0
        source = associated.get(<unsigned long long><uintptr_t>self.egl_frame.frame.pPitch[0])
        if source is not None:
            kept = (source.planes,)
        else:
            kept = tuple([frame.planes for frame in flight if frame is not None])
        if self.held is held and not held._released:  # (the planes ran Python: a release may have come)
            held._source = kept
        return 0

    cdef int _release(self, AcquiredFrame frame) except -1:
        """Release ``frame`` (AcquiredFrame.release)."""
        cdef CUresult status
        gate_enter(&self.gate, "consumer")
        try:
            if frame is not self.held:
                if frame._released:
                    raise ClosedError("the frame was already released")
                raise UsageError("this frame does not belong to this consumer")
            if not self.connected:
                raise ClosedError("the consumer is disconnected (or its stream closed)")
            if frame._handed_to is not None:
                self._join_readers(frame)
            with nogil:
                status = legacy_first(self.sync_before_release, self.ctx, &self.failed_call)
                if status == CUDA_SUCCESS:
                    status = hot.consumer_release(self.ctx, self.conn, self.held_resource, &self.cu_stream,
                                                  &self.failed_call)
            if status:
                # The frame stays held and usable: the caller may release it again.
                raise cuda_error(status, CALL_NAMES[self.failed_call], "releasing a frame")
            self._let_go_of_held()
        finally:
            dropped, self.dropped = self.dropped, None
            gate_leave(&self.gate)
        del dropped  # after the gate: see _let_go_of_held
        return 0

    cdef tuple _make_planes(self, AcquiredFrame frame):
        """The Plane objects of the frame now acquired (its planes' first use)."""
        cdef CUeglFrame *egl = &self.egl_frame
        cdef unsigned int pitch = 0 if egl.frameType == CU_EGL_FRAME_TYPE_ARRAY else egl.pitch
        cdef Py_ssize_t i
        if (self.geometry is None or egl.eglColorFormat != self.geometry_format or egl.width != self.geometry_width
                or egl.height != self.geometry_height or pitch != self.geometry_pitch
                or egl.planeCount != self.geometry_planes):
            self.geometry = _plane_geometry(color_format(egl.eglColorFormat), egl.width, egl.height,
                                            pitch)[:egl.planeCount]
            self.geometry_format, self.geometry_width, self.geometry_height = egl.eglColorFormat, egl.width, egl.height
            self.geometry_pitch, self.geometry_planes = pitch, egl.planeCount
        geometry = self.geometry
        return tuple([Plane(frame, i, geometry[i], <uintptr_t>egl.frame.pPitch[i]) for i in range(len(geometry))])

    # ---- frame numbers without asking EGL --------------------------------------------------------
    # An acquired frame's number, and whether it is new or the previous frame handed back again,
    # come from the stream's consumer frame counter: an EGL query that costs about as much as the
    # acquire itself (docs/benchmarks.md). When the stream's producer is a CudaProducer in this
    # process, its present counts (read and written with the GIL held) usually settle both without
    # EGL. The frame of the producer's n-th present has number base + n; so the frame latched last
    # is present number L = last_number - base, and if more than L presents are done when an
    # acquire begins, a newer frame is waiting and this acquire latches a new frame:
    # - FIFO: no frame is ever dropped, so it is the one after the previous: last_number + 1.
    # - Mailbox: it is the newest, base + frames_presented, provided no present was under way when
    #   the acquire began, nor began during it.
    # Every other case asks EGL, as does a consumer whose producer is in another process or has
    # disconnected. base is read from EGL once: FIFO's first frame is present 1; a mailbox acquire
    # with no present under way latches present frames_presented.

    cdef int _derive_plan(self, long long *started, long long *done) noexcept:
        """0: ask EGL; 1: FIFO, the previous number + 1; 2: mailbox, base + presents done."""
        cdef CudaProducer producer = self.producer
        if producer is None or not producer.connected:
            # Disconnected: the frames it presented that the consumer has not latched may have
            # gone with it (nothing says a disconnect keeps them), so its counts no longer say
            # what the stream holds.
            return 0
        started[0] = producer.presents_started
        done[0] = producer.frames_presented
        if not self.use_counter or self.derive_off or not self.base_known or not self.last_latched:
            return 0
        cdef long long latched = <long long>(self.last_number - self.base)
        if done[0] <= latched:
            return 0  # nothing newer is certainly there: the driver may hand back the old frame
        if self.fifo:
            return 1
        return 2 if started[0] == done[0] else 0

    cdef void _learn_numbering(self, uint64_t value, long long started, long long done) noexcept:
        """EGL gave the number of a frame just latched: measure base, or check it and FIFO's rule
        (turning derivation off for good if either fails)."""
        if self.fifo:
            if not self.has_last and not self.base_known:
                self.base = value - 1
                self.base_known = True
            elif self.has_last and value != self.last_number and value != self.last_number + 1:
                self.derive_off = True
        elif started == done and done > 0 and self.producer.presents_started == started:
            if not self.base_known:
                self.base = value - <uint64_t>done
                self.base_known = True
            elif value != self.base + <uint64_t>done:
                self.derive_off = True

    cdef bint _ask_counter(self, uint64_t *value) except -1:
        """Read the consumer frame counter now (the acquire is done; the gate keeps others out).
        False when the query failed and frame numbers are now off."""
        cdef CUresult status
        with nogil:
            status = hot.consumer_counter(self.dpy, self.egl_stream, value)
        if status == 0:
            return True
        self._counter_failed()
        return False

    cdef int _counter_failed(self) except -1:
        """The frame-counter query failed (the frame is acquired and mapped): go on without it."""
        clear_egl_error()
        self.use_counter = False
        return 0

    cdef bint _repeated(self):
        """Without frame numbers: whether the frame just acquired may be the last one again: its
        memory is the last frame's, and (a producer in this process) nothing was presented since.
        (A producer in another process presenting the same frame twice in a row, then leaving:
        that last frame reads as an old one.)"""
        cdef void *plane = <void *>self.egl_frame.frame.pPitch[0]
        cdef bint repeated = plane == self.last_plane
        if self.producer is not None:
            repeated = repeated and self.producer.frames_presented == self.last_presented
            self.last_presented = self.producer.frames_presented
        self.last_plane = plane
        return repeated

    cdef int _check_disconnected(self, object number) except -1:
        """A frame handed out again (not new): if the producer is gone, release it and say so."""
        cdef CUresult status
        try:
            state = self.stream.state
        except BaseException:
            # The driver refused the question: the frame (acquired and mapped) goes back to the
            # stream, and the error says why; one the driver will not take back stays held.
            with nogil:
                status = hot.consumer_release(self.ctx, self.conn, self.resource, &self.cu_stream, &self.failed_call)
            if status:
                self._hold_after_failure()
            raise
        if state is StreamState.DISCONNECTED:
            # The stream hands out its last frame forever once the producer is gone (its process
            # may have died): say so instead of repeating a frame that never changes.
            with nogil:
                status = hot.consumer_release(self.ctx, self.conn, self.resource, &self.cu_stream, &self.failed_call)
            last = f" (last frame {number})" if number is not None else ""
            raise StreamDisconnected(f"the producer disconnected from the stream{last}")
        return 0

    cdef int _hold_after_failure(self) except -1:
        """A frame acquired and mapped whose handing out failed after the driver's acquire: held, as
        a frame handed out is, so that a release (or the next acquire) gives it back to the stream."""
        cdef AcquiredFrame frame = self._frame_for()
        frame._numbered = False
        frame._number = 0
        frame._fresh = False
        self.held = frame
        return 0

    cdef unsigned long long _wait_for_producer(self, unsigned long long timeout_us) except? 0xFFFFFFFFFFFFFFFF:
        """Wait, without the driver, until a producer connects; returns the time left.

        Measured on NVIDIA 580: a consumer acquire issued while a cross-process stream still
        waits for its producer disconnects the stream (the producer's connect then fails with
        CUDA_ERROR_UNKNOWN). So the first acquire polls the state instead, every millisecond,
        which also gives a one-process consumer the plain timeout it would get anyway."""
        deadline = time.monotonic() + timeout_us / 1e6
        while True:
            state = self.stream.state
            if state is not StreamState.CONNECTING:
                self.producer_seen = True
                return <unsigned long long>max(0, int((deadline - time.monotonic()) * 1e6))
            left = deadline - time.monotonic()
            if left <= 0:
                raise Timeout(f"no producer connected within {timeout_us} us (stream CONNECTING)")
            if self.closing:
                raise ClosedError("the consumer was closed by another thread while acquire waited for a producer")
            time.sleep(min(0.001, left))

    # ---- state ----------------------------------------------------------------------------------
    def _busy_at_close(self, double timeout) -> None:
        _endpoint_busy(self, "consumer", timeout)

    @property
    def _held(self):
        return self.held

    @property
    def _numbers_derived(self) -> int:
        return self.numbers_derived

    @property
    def _derive_off(self) -> bool:
        return self.derive_off

    @cython.annotation_typing(False)  # a str or a bool reaches _close_timeout, which says what it takes
    def close(self, timeout: float | None = None) -> None:
        """Release a held frame and disconnect. Safe to call twice. An acquire of another thread
        still waiting for a producer to connect ends with :class:`eglcuda.ClosedError` within a
        millisecond; for an acquire in the driver (it waits up to its own timeout) it waits up to
        ``timeout`` seconds (default 10) and raises :class:`Timeout` if it does not leave."""
        if self._inherited() or (self.closed and not self.connected):
            return
        timeout = _close_timeout(timeout)
        if not gate_enter_to_close(&self.gate, &self.closing, "consumer", timeout):  # (a wait for a producer ends)
            self._busy_at_close(timeout)
            return
        try:
            self.connected = False
            if self.held is not None:
                self._let_go_of_held()
            spares = (self.spare0, self.spare1)
            self.spare0 = self.spare1 = None
        finally:
            dropped, self.dropped = self.dropped, None
            gate_leave(&self.gate)
        del dropped, spares  # after the gate: a weak reference callback could call into this consumer
        Resource.close(self)  # disconnects

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{self.frames_acquired} acquired"
        return f"<CudaConsumer on CUDA {self.device.ordinal}: {state}>"
