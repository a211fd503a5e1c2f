/* Small C helpers for paths Python would otherwise walk call by call. */

/* Make ctx current on the calling thread unless it already is: one driver call in the common
 * case, instead of a Python round trip through cuCtxGetCurrent and cuCtxSetCurrent. Inlined into
 * each per-frame helper below; eglcuda_ensure_current is the same for Python. */
static inline CUresult ensure_current(CUcontext ctx)
{
    CUcontext current = NULL;
    CUresult status = cuCtxGetCurrent(&current);
    if (status != CUDA_SUCCESS || current == ctx)
        return status;
    return cuCtxSetCurrent(ctx);
}

CUresult eglcuda_ensure_current(CUcontext ctx)
{
    return ensure_current(ctx);
}

/* ---- the per-frame path ----------------------------------------------------------------
 * Each helper makes the context current and does one step of the stream protocol in a single
 * call from Python (one GIL release, no Python between driver calls). On failure *failed_call
 * says which driver call failed, for the error message. */

/* The steps themselves, for a caller that made the context current: the fused helpers below
 * check the context once per call from Python, not once per step (each check is a driver call,
 * about 0.15-0.3 us). */
static CUresult acquire_step(CUeglStreamConnection *conn, CUgraphicsResource *resource, CUstream *stream,
                             unsigned int timeout_us, CUeglFrame *frame, EGLDisplay dpy, EGLStreamKHR egl_stream,
                             EGLuint64KHR *consumer_frame, int *failed_call)
{
    CUresult status = cuEGLStreamConsumerAcquireFrame(conn, resource, stream, timeout_us);
    if (status != CUDA_SUCCESS) { *failed_call = EGLCUDA_CALL_ACQUIRE; return status; }
    status = cuGraphicsResourceGetMappedEglFrame(frame, *resource, 0, 0);
    if (status != CUDA_SUCCESS) {
        /* Acquired but not mapped: give the frame back, or the driver keeps it acquired for good. */
        cuEGLStreamConsumerReleaseFrame(conn, *resource, stream);
        *failed_call = EGLCUDA_CALL_MAP;
        return status;
    }
    if (dpy != NULL && !eglQueryStreamu64KHR(dpy, egl_stream, EGL_CONSUMER_FRAME_KHR, consumer_frame)) {
        *failed_call = EGLCUDA_CALL_COUNTER;
        return CUDA_ERROR_NOT_FOUND;
    }
    return CUDA_SUCCESS;
}

/* Take back a frame the consumer released. The driver answers CUDA_ERROR_LAUNCH_TIMEOUT while
 * none is ready (each such call waits about a millisecond inside the driver, so this loop does
 * not spin a core); retry until timeout_us has passed. timeout_us == 0: one try. On success
 * *plane0 is the frame's first plane (pointer or CUarray), the key Python finds its Frame by. */
static CUresult return_step(CUeglStreamConnection *conn, CUeglFrame *frame, CUstream *stream,
                            unsigned long long timeout_us, unsigned long long *plane0)
{
    struct timespec start, now;
    CUresult status;
    clock_gettime(CLOCK_MONOTONIC, &start);
    struct timespec call = start;
    for (;;) {
        status = cuEGLStreamProducerReturnFrame(conn, frame, stream);
        if (status == CUDA_SUCCESS)
            *plane0 = (unsigned long long)(uintptr_t)frame->frame.pPitch[0];
        if (status != CUDA_ERROR_LAUNCH_TIMEOUT || timeout_us == 0)
            return status;
        clock_gettime(CLOCK_MONOTONIC, &now);
        unsigned long long waited = (unsigned long long)(now.tv_sec - start.tv_sec) * 1000000ull
                                    + (unsigned long long)((now.tv_nsec - start.tv_nsec) / 1000);
        if (waited >= timeout_us)
            return status;
        long long call_ns = (now.tv_sec - call.tv_sec) * 1000000000ll + (now.tv_nsec - call.tv_nsec);
        if (call_ns < 20000) {
            /* The driver answered at once instead of waiting inside: pause so we never spin. */
            struct timespec pause = {0, 50000};
            nanosleep(&pause, NULL);
        }
        clock_gettime(CLOCK_MONOTONIC, &call);
    }
}

/* Acquire a frame, read its mapping into *frame, and (when dpy is not NULL) read the stream's
 * consumer frame counter, which tells a new frame from a re-acquired old one. */
CUresult eglcuda_consumer_acquire(CUcontext ctx, CUeglStreamConnection *conn, CUgraphicsResource *resource,
                                  CUstream *stream, unsigned int timeout_us, CUeglFrame *frame,
                                  EGLDisplay dpy, EGLStreamKHR egl_stream, EGLuint64KHR *consumer_frame,
                                  int *failed_call)
{
    CUresult status = ensure_current(ctx);
    if (status != CUDA_SUCCESS) { *failed_call = EGLCUDA_CALL_CONTEXT; return status; }
    return acquire_step(conn, resource, stream, timeout_us, frame, dpy, egl_stream, consumer_frame, failed_call);
}

/* Read the stream's consumer frame counter: the number of the frame the consumer latched last. */
CUresult eglcuda_consumer_counter(EGLDisplay dpy, EGLStreamKHR egl_stream, EGLuint64KHR *consumer_frame)
{
    return eglQueryStreamu64KHR(dpy, egl_stream, EGL_CONSUMER_FRAME_KHR, consumer_frame) ? CUDA_SUCCESS
                                                                                         : CUDA_ERROR_NOT_FOUND;
}

CUresult eglcuda_consumer_release(CUcontext ctx, CUeglStreamConnection *conn, CUgraphicsResource resource,
                                  CUstream *stream, int *failed_call)
{
    CUresult status = ensure_current(ctx);
    if (status != CUDA_SUCCESS) { *failed_call = EGLCUDA_CALL_CONTEXT; return status; }
    *failed_call = EGLCUDA_CALL_RELEASE;
    return cuEGLStreamConsumerReleaseFrame(conn, resource, stream);
}

CUresult eglcuda_producer_present(CUcontext ctx, CUeglStreamConnection *conn, const CUeglFrame *frame,
                                  CUstream *stream, int *failed_call)
{
    CUresult status = ensure_current(ctx);
    if (status != CUDA_SUCCESS) { *failed_call = EGLCUDA_CALL_CONTEXT; return status; }
    *failed_call = EGLCUDA_CALL_PRESENT;
    return cuEGLStreamProducerPresentFrame(conn, *frame, stream);
}

CUresult eglcuda_producer_return(CUcontext ctx, CUeglStreamConnection *conn, CUeglFrame *frame, CUstream *stream,
                                 unsigned long long timeout_us, unsigned long long *plane0, int *failed_call)
{
    CUresult status = ensure_current(ctx);
    if (status != CUDA_SUCCESS) { *failed_call = EGLCUDA_CALL_CONTEXT; return status; }
    *failed_call = EGLCUDA_CALL_RETURN;
    return return_step(conn, frame, stream, timeout_us, plane0);
}

/* Wait for the legacy default stream's work on the host. Between processes the driver does not
 * order a present that names the legacy default stream (NULL) after that stream's work: measured
 * on driver 580 without MPS, a consumer in another process read frames whose writes had not
 * landed (docs/streams.md, "The legacy default stream between processes"). A release named there
 * is waited for too, as a precaution. */
static CUresult eglcuda_legacy_sync(CUcontext ctx, int *failed_call)
{
    CUresult status = ensure_current(ctx);
    if (status != CUDA_SUCCESS) { *failed_call = EGLCUDA_CALL_CONTEXT; return status; }
    *failed_call = EGLCUDA_CALL_SYNCHRONIZE;
    return cuStreamSynchronize(NULL);
}

/* ---- fused steps for frame loops ------------------------------------------------------------
 * A loop makes one call from Python per frame and side instead of two: each crossing costs more
 * than the driver's cheaper calls (see docs/benchmarks.md). */

/* Release the held frame (when held is not NULL), then acquire and map the next one. A failed
 * release stops before the acquire; *failed_call names the call that failed. */
CUresult eglcuda_consumer_next(CUcontext ctx, CUeglStreamConnection *conn, CUgraphicsResource held,
                               CUgraphicsResource *resource, CUstream *stream, unsigned int timeout_us,
                               CUeglFrame *frame, EGLDisplay dpy, EGLStreamKHR egl_stream,
                               EGLuint64KHR *consumer_frame, int *failed_call)
{
    CUresult status = ensure_current(ctx);
    if (status != CUDA_SUCCESS) { *failed_call = EGLCUDA_CALL_CONTEXT; return status; }
    if (held != NULL) {
        status = cuEGLStreamConsumerReleaseFrame(conn, held, stream);
        if (status != CUDA_SUCCESS) { *failed_call = EGLCUDA_CALL_RELEASE; return status; }
    }
    return acquire_step(conn, resource, stream, timeout_us, frame, dpy, egl_stream, consumer_frame, failed_call);
}

/* Present a frame, then take one back as eglcuda_producer_return does (timeout_us 0: one try).
 * A failed present stops before the return; *failed_call says which of the two failed. */
CUresult eglcuda_producer_present_return(CUcontext ctx, CUeglStreamConnection *conn, const CUeglFrame *presented,
                                         CUstream *present_stream, CUeglFrame *back, CUstream *return_stream,
                                         unsigned long long timeout_us, unsigned long long *plane0, int *failed_call)
{
    CUresult status = ensure_current(ctx);
    if (status != CUDA_SUCCESS) { *failed_call = EGLCUDA_CALL_CONTEXT; return status; }
    status = cuEGLStreamProducerPresentFrame(conn, *presented, present_stream);
    if (status != CUDA_SUCCESS) { *failed_call = EGLCUDA_CALL_PRESENT; return status; }
    *failed_call = EGLCUDA_CALL_RETURN;
    return return_step(conn, back, return_stream, timeout_us, plane0);
}

/* ---- CUDA stream -> EGLSync emulation ---------------------------------------------------
 * Where EGL_NV_cuda_event is missing, a reusable EGLSync is signaled by a host function queued
 * on the CUDA stream: it runs when the stream reaches that point. The host function may still be
 * queued when Python closes the Sync, so ownership is settled with one atomic state word: whoever
 * comes second (the callback after an abandon, or the abandon after the callback) cleans up. */

struct eglcuda_sync_signal {
    EGLDisplay dpy;
    EGLSyncKHR sync;
    int state; /* 0 queued, 1 ran, 2 abandoned by its owner */
};

static void eglcuda_sync_signal_run(void *data)
{
    struct eglcuda_sync_signal *signal = data;
    int expected = 0;
    eglSignalSyncKHR(signal->dpy, signal->sync, EGL_SIGNALED_KHR);
    if (!__atomic_compare_exchange_n(&signal->state, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
        eglDestroySyncKHR(signal->dpy, signal->sync); /* abandoned: the sync is ours to destroy */
        free(signal);
    }
}

/* Queue the signal of a reusable sync on stream. Returns the token for
 * eglcuda_sync_signal_abandon, or NULL with *status set when the host function was refused. */
void *eglcuda_sync_signal_queue(EGLDisplay dpy, EGLSyncKHR sync, CUstream stream, CUresult *status)
{
    struct eglcuda_sync_signal *signal = calloc(1, sizeof(*signal));
    if (signal == NULL) {
        *status = CUDA_ERROR_OUT_OF_MEMORY;
        return NULL;
    }
    signal->dpy = dpy;
    signal->sync = sync;
    *status = cuLaunchHostFunc(stream, eglcuda_sync_signal_run, signal);
    if (*status != CUDA_SUCCESS) {
        free(signal);
        return NULL;
    }
    return signal;
}

/* The owner is done with the sync. Returns 1 when the host function already ran (the caller
 * destroys the sync now), 0 when it has not (the host function destroys it when it runs). */
int eglcuda_sync_signal_abandon(void *token)
{
    struct eglcuda_sync_signal *signal = token;
    int expected = 0;
    if (__atomic_compare_exchange_n(&signal->state, &expected, 2, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
        return 0;
    free(signal);
    return 1;
}

/* Whether the queued host function has run (the sync was signaled from the stream). */
int eglcuda_sync_signal_ran(void *token)
{
    return __atomic_load_n(&((struct eglcuda_sync_signal *)token)->state, __ATOMIC_ACQUIRE) == 1;
}

/* ---- EGLSync -> CUDA stream emulation: the host side of the flag -----------------------------
 * The stream waits (cuStreamWaitValue32) on a word of mapped pinned memory; a waiter thread sets
 * it once the sync signals. The store must be a real, ordered store to memory the GPU polls. */
void eglcuda_store_flag(volatile uint32_t *flag, uint32_t value)
{
    __atomic_store_n(flag, value, __ATOMIC_RELEASE);
}

/* ---- the cuda-ipc topic transport's per-frame steps ----------------------------------------
 * One call from Cython each (eglcuda/topics/_wire.pyx): the context check and the driver call,
 * with no Python between them. */
/* A frame whose writing has finished needs no event: with query set, when the publish stream has
 * nothing queued the record is skipped, and the slot's event keeps its last record, which has
 * completed too (it was queued on a stream now idle), or, recorded on another stream still busy,
 * makes a reader wait longer than it must, never shorter. (The legacy default stream's query also
 * counts the work of the context's blocking streams, as its record waits for it: measured on
 * driver 580.) Without MPS an interprocess record is GPU work in the publisher's own time slice,
 * which each reader's query then waits for. */
static CUresult eglcuda_ipc_record(CUcontext ctx, CUevent event, CUstream stream, int query, int *recorded,
                                   int *failed_call)
{
    *recorded = 0;
    CUresult status = ensure_current(ctx);
    if (status != CUDA_SUCCESS) { *failed_call = EGLCUDA_CALL_CONTEXT; return status; }
    if (query) {
        *failed_call = EGLCUDA_CALL_STREAM_QUERY;
        status = cuStreamQuery(stream);
        if (status != CUDA_ERROR_NOT_READY)
            return status;
    }
    *failed_call = EGLCUDA_CALL_EVENT_RECORD;
    status = cuEventRecord(event, stream);
    if (status == CUDA_SUCCESS)
        *recorded = 1;
    return status;
}

/* Recording an interprocess event costs 4-7x an ordinary one (measured on an H100): record
 * only when the stream still has work that may read the frame. */
static CUresult eglcuda_ipc_release(CUcontext ctx, CUstream stream, CUevent done, int *recorded, int *failed_call)
{
    *recorded = 0;
    CUresult status = ensure_current(ctx);
    if (status != CUDA_SUCCESS) { *failed_call = EGLCUDA_CALL_CONTEXT; return status; }
    *failed_call = EGLCUDA_CALL_STREAM_QUERY;
    status = cuStreamQuery(stream);
    if (status != CUDA_ERROR_NOT_READY || done == NULL)
        return status;  /* NOT_READY with done NULL: the caller makes the slot's event first */
    *failed_call = EGLCUDA_CALL_EVENT_RECORD;
    status = cuEventRecord(done, stream);
    if (status == CUDA_SUCCESS)
        *recorded = 1;
    return status;
}

/* A stream left idle stays cheap for both sides: a subscriber whose stream has nothing queued
 * releases without a done event, so the publisher has none to wait for. A stream waiting on
 * another process's event is what costs (measured on an H100 without MPS: a topic at 26k frames/s
 * with the waits, 62-69k without), so the wait is queued only while the event is pending. */
static CUresult eglcuda_ipc_order_after(CUcontext ctx, CUstream stream, CUevent event, int *failed_call)
{
    CUresult status = ensure_current(ctx);
    if (status != CUDA_SUCCESS) { *failed_call = EGLCUDA_CALL_CONTEXT; return status; }
    *failed_call = EGLCUDA_CALL_EVENT_QUERY;
    status = cuEventQuery(event);
    if (status != CUDA_ERROR_NOT_READY)
        return status;
    *failed_call = EGLCUDA_CALL_STREAM_WAIT_EVENT;
    return cuStreamWaitEvent(stream, event, 0);
}

static CUresult eglcuda_ipc_event_done(CUcontext ctx, CUevent event, int *failed_call)
{
    CUresult status = ensure_current(ctx);
    if (status != CUDA_SUCCESS) { *failed_call = EGLCUDA_CALL_CONTEXT; return status; }
    *failed_call = EGLCUDA_CALL_EVENT_QUERY;
    return cuEventQuery(event);
}

/* ---- the table the stream endpoints call through (csrc/hot_api.h) ------------------------- */
static const struct eglcuda_hot_api eglcuda_hot_api_table = {
    EGLCUDA_HOT_API_VERSION,
    sizeof(struct eglcuda_hot_api),
    eglcuda_ensure_current,
    eglcuda_producer_present,
    eglcuda_producer_return,
    eglcuda_producer_present_return,
    eglcuda_consumer_acquire,
    eglcuda_consumer_next,
    eglcuda_consumer_release,
    eglcuda_consumer_counter,
    eglcuda_legacy_sync,
    eglcuda_ipc_record,
    eglcuda_ipc_release,
    eglcuda_ipc_order_after,
    eglcuda_ipc_event_done,
};

const void *eglcuda_hot_api(void)
{
    return &eglcuda_hot_api_table;
}
