# The per-frame helper table (csrc/hot_api.h), declared once for every Cython module that calls
# through it: the stream endpoints (streams/cuda.pyx) and the topic wire (topics/_wire.pyx). The
# helpers themselves live in csrc/helpers.c, compiled into eglcuda._bind._native, which hands the
# table's address over (eglcuda._bind.hot.table_address); hot_table() takes it only from the same
# build (version and size), so a changed field fails at build time on both sides or at import.

from libc.stdint cimport uint64_t, uintptr_t

from eglcuda.frames._core cimport CUeglFrame

cdef extern from "eglcuda_types.h" nogil:
    ctypedef int CUresult
    ctypedef void *CUcontext
    ctypedef void *CUstream
    ctypedef void *CUevent
    ctypedef void *CUgraphicsResource
    ctypedef void *CUeglStreamConnection
    ctypedef void *EGLDisplay
    ctypedef void *EGLStreamKHR
    ctypedef uint64_t EGLuint64KHR

    struct eglcuda_hot_api:
        unsigned int version
        unsigned int size
        CUresult (*ensure_current)(CUcontext) noexcept nogil
        CUresult (*producer_present)(CUcontext, CUeglStreamConnection *, const CUeglFrame *,
                                     CUstream *, int *) noexcept nogil
        CUresult (*producer_return)(CUcontext, CUeglStreamConnection *, CUeglFrame *, CUstream *,
                                    unsigned long long, unsigned long long *, int *) noexcept nogil
        CUresult (*producer_present_return)(CUcontext, CUeglStreamConnection *, const CUeglFrame *, CUstream *,
                                            CUeglFrame *, CUstream *, unsigned long long, unsigned long long *,
                                            int *) noexcept nogil
        CUresult (*consumer_acquire)(CUcontext, CUeglStreamConnection *, CUgraphicsResource *, CUstream *,
                                     unsigned int, CUeglFrame *, EGLDisplay, EGLStreamKHR, EGLuint64KHR *,
                                     int *) noexcept nogil
        CUresult (*consumer_next)(CUcontext, CUeglStreamConnection *, CUgraphicsResource, CUgraphicsResource *,
                                  CUstream *, unsigned int, CUeglFrame *, EGLDisplay, EGLStreamKHR,
                                  EGLuint64KHR *, int *) noexcept nogil
        CUresult (*consumer_release)(CUcontext, CUeglStreamConnection *, CUgraphicsResource,
                                     CUstream *, int *) noexcept nogil
        CUresult (*consumer_counter)(EGLDisplay, EGLStreamKHR, EGLuint64KHR *) noexcept nogil
        CUresult (*legacy_sync)(CUcontext, int *) noexcept nogil
        CUresult (*ipc_record)(CUcontext, CUevent, CUstream, int, int *, int *) noexcept nogil
        CUresult (*ipc_release)(CUcontext, CUstream, CUevent, int *, int *) noexcept nogil
        CUresult (*ipc_order_after)(CUcontext, CUstream, CUevent, int *) noexcept nogil
        CUresult (*ipc_event_done)(CUcontext, CUevent, int *) noexcept nogil

    enum:
        EGLCUDA_HOT_API_VERSION
        EGLCUDA_CALL_CONTEXT
        EGLCUDA_CALL_ACQUIRE
        EGLCUDA_CALL_MAP
        EGLCUDA_CALL_COUNTER
        EGLCUDA_CALL_RELEASE
        EGLCUDA_CALL_PRESENT
        EGLCUDA_CALL_RETURN
        EGLCUDA_CALL_EVENT_QUERY
        EGLCUDA_CALL_STREAM_WAIT_EVENT
        EGLCUDA_CALL_EVENT_RECORD
        EGLCUDA_CALL_STREAM_QUERY
        EGLCUDA_CALL_SYNCHRONIZE
        EGLCUDA_MAX_FRAMES_IN_FLIGHT
        EGLCUDA_DEFAULT_ACQUIRE_TIMEOUT_US
        CUDA_ERROR_LAUNCH_TIMEOUT
        CUDA_SUCCESS


cdef inline const eglcuda_hot_api *hot_table(uintptr_t address) except NULL:
    """The table at ``address`` if it comes from this build; ImportError otherwise."""
    cdef const eglcuda_hot_api *table = <const eglcuda_hot_api *>address
    if table == NULL or table.version != EGLCUDA_HOT_API_VERSION or table.size != sizeof(eglcuda_hot_api):
        raise ImportError("eglcuda's compiled parts come from different builds (the per-frame helper table does not "
                          "match): reinstall eglcuda")
    return table
