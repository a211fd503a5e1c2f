/* The contract between the per-frame C helpers (csrc/helpers.c, compiled into eglcuda._bind._native)
 * and the CUDA stream endpoints (eglcuda/streams/cuda.pyx, a Cython extension).
 *
 * Both sides compile this header: the helpers fill one table of function pointers, the endpoints
 * read it through its address (eglcuda._bind.hot.table_address). A changed signature, constant or
 * field order fails when either side is built; a table from another build is refused at import by
 * its version and size. Not part of the cffi declarations: Python never calls these directly.
 *
 * Needs the types of egl_core.h, egl_stream.h and cuda_egl.h. */

#define EGLCUDA_HOT_API_VERSION 7

/* Which driver call a fused helper says failed (*failed_call). */
enum eglcuda_call {
    EGLCUDA_CALL_CONTEXT = 0,  /* cuCtxSetCurrent */
    EGLCUDA_CALL_ACQUIRE = 1,  /* cuEGLStreamConsumerAcquireFrame */
    EGLCUDA_CALL_MAP = 2,      /* cuGraphicsResourceGetMappedEglFrame */
    EGLCUDA_CALL_COUNTER = 3,  /* eglQueryStreamu64KHR (the consumer frame counter) */
    EGLCUDA_CALL_RELEASE = 4,  /* cuEGLStreamConsumerReleaseFrame */
    EGLCUDA_CALL_PRESENT = 5,  /* cuEGLStreamProducerPresentFrame */
    EGLCUDA_CALL_RETURN = 6,   /* cuEGLStreamProducerReturnFrame */
    EGLCUDA_CALL_EVENT_QUERY = 7,       /* cuEventQuery */
    EGLCUDA_CALL_STREAM_WAIT_EVENT = 8, /* cuStreamWaitEvent */
    EGLCUDA_CALL_EVENT_RECORD = 9,      /* cuEventRecord */
    EGLCUDA_CALL_STREAM_QUERY = 10,     /* cuStreamQuery */
    EGLCUDA_CALL_SYNCHRONIZE = 11       /* cuStreamSynchronize (the legacy default stream) */
};

/* The guide: CUDA cannot present more than 64 active frames on one stream. */
#define EGLCUDA_MAX_FRAMES_IN_FLIGHT 64
/* What a CUDA consumer's acquire waits for a frame unless told otherwise, microseconds. */
#define EGLCUDA_DEFAULT_ACQUIRE_TIMEOUT_US 1000000

struct eglcuda_hot_api {
    unsigned int version;  /* EGLCUDA_HOT_API_VERSION of the build that filled the table */
    unsigned int size;     /* sizeof(struct eglcuda_hot_api) in that build */
    CUresult (*ensure_current)(CUcontext ctx);
    CUresult (*producer_present)(CUcontext ctx, CUeglStreamConnection *conn, const CUeglFrame *frame,
                                 CUstream *stream, int *failed_call);
    CUresult (*producer_return)(CUcontext ctx, CUeglStreamConnection *conn, CUeglFrame *frame, CUstream *stream,
                                unsigned long long timeout_us, unsigned long long *plane0, int *failed_call);
    CUresult (*producer_present_return)(CUcontext ctx, CUeglStreamConnection *conn, const CUeglFrame *presented,
                                        CUstream *present_stream, CUeglFrame *back, CUstream *return_stream,
                                        unsigned long long timeout_us, unsigned long long *plane0,
                                        int *failed_call);
    CUresult (*consumer_acquire)(CUcontext ctx, CUeglStreamConnection *conn, CUgraphicsResource *resource,
                                 CUstream *stream, unsigned int timeout_us, CUeglFrame *frame, EGLDisplay dpy,
                                 EGLStreamKHR egl_stream, EGLuint64KHR *consumer_frame, int *failed_call);
    CUresult (*consumer_next)(CUcontext ctx, CUeglStreamConnection *conn, CUgraphicsResource held,
                              CUgraphicsResource *resource, CUstream *stream, unsigned int timeout_us,
                              CUeglFrame *frame, EGLDisplay dpy, EGLStreamKHR egl_stream,
                              EGLuint64KHR *consumer_frame, int *failed_call);
    CUresult (*consumer_release)(CUcontext ctx, CUeglStreamConnection *conn, CUgraphicsResource resource,
                                 CUstream *stream, int *failed_call);
    CUresult (*consumer_counter)(EGLDisplay dpy, EGLStreamKHR egl_stream, EGLuint64KHR *consumer_frame);
    /* Wait on the host for the work queued on the legacy default stream, ctx made current first:
     * what an endpoint of a stream shared with another process does before a present or release
     * that names that stream. The driver does not order such a present (measured); the release
     * is waited for as a precaution (docs/streams.md). */
    CUresult (*legacy_sync)(CUcontext ctx, int *failed_call);
    /* The cuda-ipc topic transport (eglcuda/topics/_wire.pyx), each with ctx made current first;
     * on failure *failed_call says which call failed. */
    /* The publisher's frame event. query: ask the stream first and record only while it has work
     * queued; *recorded says whether it recorded. */
    CUresult (*ipc_record)(CUcontext ctx, CUevent event, CUstream stream, int query, int *recorded,
                           int *failed_call);
    /* A subscriber's release: when stream still has work queued, record done on it (*recorded 1);
     * when it has finished, nothing (*recorded 0). done NULL: CUDA_ERROR_NOT_READY when it would
     * record (the caller makes the slot's event, then calls again). */
    CUresult (*ipc_release)(CUcontext ctx, CUstream stream, CUevent done, int *recorded, int *failed_call);
    /* Unless event has completed, make stream wait for it (on the GPU): a subscriber before it
     * reads a frame (the publisher's event). */
    CUresult (*ipc_order_after)(CUcontext ctx, CUstream stream, CUevent event, int *failed_call);
    /* cuEventQuery: CUDA_SUCCESS once event has completed, CUDA_ERROR_NOT_READY before. */
    CUresult (*ipc_event_done)(CUcontext ctx, CUevent event, int *failed_call);
};
