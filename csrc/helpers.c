/* Small C helpers for paths Python would otherwise walk call by call. */

/* Make ctx current on the calling thread unless it already is: one driver call in the common
 * case, instead of a Python round trip through cuCtxGetCurrent and cuCtxSetCurrent. */
CUresult eglcuda_ensure_current(CUcontext ctx)
{
    CUcontext current = NULL;
    CUresult status = cuCtxGetCurrent(&current);
    if (status != CUDA_SUCCESS || current == ctx)
        return status;
    return cuCtxSetCurrent(ctx);
}

/* ---- the per-frame path ----------------------------------------------------------------
 * Each helper makes the context current and does one step of the stream protocol in a single
 * call from Python (one GIL release, no Python between driver calls). On failure *failed_call
 * says which driver call failed, for the error message. */

enum { EGLCUDA_CALL_CONTEXT = 0, EGLCUDA_CALL_ACQUIRE = 1, EGLCUDA_CALL_MAP = 2, EGLCUDA_CALL_COUNTER = 3,
       EGLCUDA_CALL_RELEASE = 4, EGLCUDA_CALL_PRESENT = 5, EGLCUDA_CALL_RETURN = 6 };

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
    if (status != CUDA_SUCCESS) { *failed_call = EGLCUDA_CALL_MAP; return status; }
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
    CUresult status = eglcuda_ensure_current(ctx);
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
                                  CUstream *stream)
{
    CUresult status = eglcuda_ensure_current(ctx);
    if (status != CUDA_SUCCESS)
        return status;
    return cuEGLStreamConsumerReleaseFrame(conn, resource, stream);
}

CUresult eglcuda_producer_present(CUcontext ctx, CUeglStreamConnection *conn, const CUeglFrame *frame,
                                  CUstream *stream)
{
    CUresult status = eglcuda_ensure_current(ctx);
    if (status != CUDA_SUCCESS)
        return status;
    return cuEGLStreamProducerPresentFrame(conn, *frame, stream);
}

CUresult eglcuda_producer_return(CUcontext ctx, CUeglStreamConnection *conn, CUeglFrame *frame, CUstream *stream,
                                 unsigned long long timeout_us, unsigned long long *plane0)
{
    CUresult status = eglcuda_ensure_current(ctx);
    if (status != CUDA_SUCCESS)
        return status;
    return return_step(conn, frame, stream, timeout_us, plane0);
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
    CUresult status = eglcuda_ensure_current(ctx);
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
    CUresult status = eglcuda_ensure_current(ctx);
    if (status == CUDA_SUCCESS)
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

/* ---- DLPack export -------------------------------------------------------------------------
 * Layouts from dlpack.h (v1.0): DLManagedTensor for the "dltensor" capsule and
 * DLManagedTensorVersioned, which can say read-only, for "dltensor_versioned". The Python owner
 * of the memory stays alive until the consumer calls the deleter: the deleter hands the key back
 * to Python (eglcuda_dlpack_release), which drops its reference. */

typedef struct { int32_t device_type; int32_t device_id; } eglcuda_DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } eglcuda_DLDataType;
typedef struct {
    void *data;
    eglcuda_DLDevice device;
    int32_t ndim;
    eglcuda_DLDataType dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} eglcuda_DLTensor;
typedef struct eglcuda_DLManagedTensor {
    eglcuda_DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct eglcuda_DLManagedTensor *self);
} eglcuda_DLManagedTensor;
typedef struct { uint32_t major; uint32_t minor; } eglcuda_DLPackVersion;
typedef struct eglcuda_DLManagedTensorVersioned {
    eglcuda_DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct eglcuda_DLManagedTensorVersioned *self);
    uint64_t flags;
    eglcuda_DLTensor dl_tensor;
} eglcuda_DLManagedTensorVersioned;

#define EGLCUDA_DL_CUDA 2
#define EGLCUDA_DL_UINT 1
#define EGLCUDA_DL_FLAG_READ_ONLY 1ull

struct eglcuda_dlpack {
    eglcuda_DLManagedTensor legacy;
    eglcuda_DLManagedTensorVersioned versioned;
    int64_t shape[3];
    int64_t strides[3];
    long long key;
};

/* Defined by cffi from the extern "Python" declaration in build_ffi.py. */
static void eglcuda_dlpack_release(long long key);

static void eglcuda_dlpack_free(struct eglcuda_dlpack *holder)
{
    long long key = holder->key;
    free(holder);
    eglcuda_dlpack_release(key);
}

static void eglcuda_dlpack_legacy_deleter(eglcuda_DLManagedTensor *self)
{
    eglcuda_dlpack_free((struct eglcuda_dlpack *)self->manager_ctx);
}

static void eglcuda_dlpack_versioned_deleter(eglcuda_DLManagedTensorVersioned *self)
{
    eglcuda_dlpack_free((struct eglcuda_dlpack *)self->manager_ctx);
}

/* A managed tensor of uint8 elements; strides in elements (bytes here). Returns the address of
 * the struct the capsule must carry, or NULL when out of memory. */
void *eglcuda_dlpack_new(int versioned, unsigned long long data, int device_id, int ndim, const int64_t *shape,
                         const int64_t *strides, int read_only, long long key)
{
    struct eglcuda_dlpack *holder = calloc(1, sizeof(*holder));
    eglcuda_DLTensor *tensor;
    if (holder == NULL)
        return NULL;
    holder->key = key;
    for (int i = 0; i < ndim && i < 3; i++) {
        holder->shape[i] = shape[i];
        holder->strides[i] = strides[i];
    }
    tensor = versioned ? &holder->versioned.dl_tensor : &holder->legacy.dl_tensor;
    tensor->data = (void *)(uintptr_t)data;
    tensor->device.device_type = EGLCUDA_DL_CUDA;
    tensor->device.device_id = device_id;
    tensor->ndim = ndim;
    tensor->dtype.code = EGLCUDA_DL_UINT;
    tensor->dtype.bits = 8;
    tensor->dtype.lanes = 1;
    tensor->shape = holder->shape;
    tensor->strides = holder->strides;
    if (versioned) {
        holder->versioned.version.major = 1;
        holder->versioned.version.minor = 0;
        holder->versioned.manager_ctx = holder;
        holder->versioned.deleter = eglcuda_dlpack_versioned_deleter;
        holder->versioned.flags = read_only ? EGLCUDA_DL_FLAG_READ_ONLY : 0;
        return &holder->versioned;
    }
    holder->legacy.manager_ctx = holder;
    holder->legacy.deleter = eglcuda_dlpack_legacy_deleter;
    return &holder->legacy;
}

/* Capsule destructor: a capsule still named "dltensor"/"dltensor_versioned" was never consumed
 * (consumers rename it "used_..."), so its tensor is ours to delete. */
static void eglcuda_dlpack_capsule_destructor(PyObject *capsule)
{
    if (PyCapsule_IsValid(capsule, "dltensor")) {
        eglcuda_DLManagedTensor *tensor = PyCapsule_GetPointer(capsule, "dltensor");
        tensor->deleter(tensor);
    } else if (PyCapsule_IsValid(capsule, "dltensor_versioned")) {
        eglcuda_DLManagedTensorVersioned *tensor = PyCapsule_GetPointer(capsule, "dltensor_versioned");
        tensor->deleter(tensor);
    }
}

void *eglcuda_dlpack_capsule_destructor_address(void)
{
    return (void *)eglcuda_dlpack_capsule_destructor;
}
