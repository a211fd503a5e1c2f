/* Research record (see research/README.md): runs against the current package (xproc_probe.py gives it only a public stream handle). */
/* Probe helper: one end of a cross-process EGLStream, driven three ways from a Python process.
 * The end connects itself to a stream eglcuda created or received (only the stream's public
 * handle crosses over), as bench/c/cross_gpu.c twoproc's ends do: a consumer on a blocking CUDA
 * stream, or a producer owning POOL pitched ARGB frames. Then either
 *   - one call per driver step from a Python loop (present, try_return, acquire, release), the
 *     thinnest binding: no checks, no bookkeeping, the GIL released around the call, a
 *     cuCtxGetCurrent first (what any safe binding does); or
 *   - producer_loop / consumer_loop: the C reference's own loop, run inside the Python process
 *     with the GIL released for the whole loop.
 * Held against the standalone C program, the first says what being called from Python costs
 * between processes, the second what being a Python process costs. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <string.h>
#include <time.h>
#include "../../csrc/egl_core.h"
#include "../../csrc/egl_stream.h"
#include "../../csrc/cuda_egl.h"

enum { POOL = 4 };

typedef CUresult (*mem_alloc_fn)(unsigned long long *, size_t);
typedef CUresult (*mem_free_fn)(unsigned long long);
typedef CUresult (*stream_create_fn)(CUstream *, unsigned int);
typedef CUresult (*stream_destroy_fn)(CUstream);

static __typeof__(&cuEGLStreamProducerPresentFrame) d_present;
static __typeof__(&cuEGLStreamConsumerAcquireFrame) d_acquire;
static __typeof__(&cuGraphicsResourceGetMappedEglFrame) d_map;
static __typeof__(&cuEGLStreamConsumerReleaseFrame) d_release;
static __typeof__(&cuEGLStreamProducerReturnFrame) d_return;
static __typeof__(&cuEGLStreamConsumerConnect) d_consumer_connect;
static __typeof__(&cuEGLStreamProducerConnect) d_producer_connect;
static __typeof__(&cuEGLStreamConsumerDisconnect) d_consumer_disconnect;
static __typeof__(&cuEGLStreamProducerDisconnect) d_producer_disconnect;
static __typeof__(&cuCtxGetCurrent) d_current;
static mem_alloc_fn d_alloc;
static mem_free_fn d_free;
static stream_create_fn d_stream_create;
static stream_destroy_fn d_stream_destroy;

static int role; /* 0 none, 1 consumer, 2 producer */
static CUeglStreamConnection connection;
static CUstream own_stream;                /* created at connect (blocking), as the C reference's */
static CUstream cu_stream, return_stream;  /* what the calls pass: own_stream, or NULL (legacy default) */
static CUeglFrame frames[POOL];
static unsigned long long memory[POOL];
static CUgraphicsResource resource;
static CUeglFrame mapped, back;
/* The producer's returns: calls that gave a frame back and calls that found none, and the
 * nanoseconds each kind took (what the driver does while no frame is ready). */
static long long returns_ok, returns_none, ns_ok, ns_none;

static PyObject *failed(const char *what, CUresult status)
{
    return PyErr_Format(PyExc_RuntimeError, "%s failed: %d", what, (int)status);
}

static int load(const char *library)
{
    void *cuda = dlopen(library, RTLD_NOW);
    if (!cuda) {
        PyErr_Format(PyExc_RuntimeError, "dlopen %s: %s", library, dlerror());
        return -1;
    }
#define SYM(var, name)                                                                            \
    if (!(*(void **)&var = dlsym(cuda, name))) {                                                  \
        PyErr_Format(PyExc_RuntimeError, "the CUDA driver library has no %s", name);              \
        return -1;                                                                                \
    }
    SYM(d_present, "cuEGLStreamProducerPresentFrame");
    SYM(d_acquire, "cuEGLStreamConsumerAcquireFrame");
    SYM(d_map, "cuGraphicsResourceGetMappedEglFrame");
    SYM(d_release, "cuEGLStreamConsumerReleaseFrame");
    SYM(d_return, "cuEGLStreamProducerReturnFrame");
    SYM(d_consumer_connect, "cuEGLStreamConsumerConnect");
    SYM(d_producer_connect, "cuEGLStreamProducerConnect");
    SYM(d_consumer_disconnect, "cuEGLStreamConsumerDisconnect");
    SYM(d_producer_disconnect, "cuEGLStreamProducerDisconnect");
    SYM(d_current, "cuCtxGetCurrent");
    SYM(d_alloc, "cuMemAlloc_v2");
    SYM(d_free, "cuMemFree_v2");
    SYM(d_stream_create, "cuStreamCreate");
    SYM(d_stream_destroy, "cuStreamDestroy_v2");
#undef SYM
    return 0;
}

/* consumer_connect(libcuda, egl_stream, null_stream), with eglcuda's CUDA context current;
 * null_stream: acquire and release on the legacy default stream instead of a created one. */
static PyObject *consumer_connect(PyObject *self, PyObject *args)
{
    const char *library;
    unsigned long long egl_stream;
    int null_stream;
    CUresult status;
    if (role)
        return PyErr_Format(PyExc_RuntimeError, "already connected");
    if (!PyArg_ParseTuple(args, "sKi", &library, &egl_stream, &null_stream) || load(library))
        return NULL;
    if ((status = d_consumer_connect(&connection, (EGLStreamKHR)(uintptr_t)egl_stream)))
        return failed("cuEGLStreamConsumerConnect", status);
    if ((status = d_stream_create(&own_stream, 0)))
        return failed("cuStreamCreate", status);
    cu_stream = null_stream ? NULL : own_stream;
    role = 1;
    Py_RETURN_NONE;
}

/* producer_connect(libcuda, egl_stream, width, height, present_null, return_null): POOL frames
 * of ARGB, pitch rounded up to 256 bytes; present_null / return_null: that call passes the legacy
 * default stream instead of a created one. */
static PyObject *producer_connect(PyObject *self, PyObject *args)
{
    const char *library;
    unsigned long long egl_stream;
    unsigned int width, height;
    int present_null, return_null;
    CUresult status;
    if (role)
        return PyErr_Format(PyExc_RuntimeError, "already connected");
    if (!PyArg_ParseTuple(args, "sKIIii", &library, &egl_stream, &width, &height, &present_null, &return_null)
        || load(library))
        return NULL;
    if ((status = d_producer_connect(&connection, (EGLStreamKHR)(uintptr_t)egl_stream, width, height)))
        return failed("cuEGLStreamProducerConnect", status);
    unsigned int pitch = (width * 4 + 255) / 256 * 256;
    for (int i = 0; i < POOL; i++) {
        if ((status = d_alloc(&memory[i], (size_t)pitch * height)))
            return failed("cuMemAlloc", status);
        memset(&frames[i], 0, sizeof frames[i]);
        frames[i].frame.pPitch[0] = (void *)(uintptr_t)memory[i];
        frames[i].width = width, frames[i].height = height, frames[i].depth = 1, frames[i].pitch = pitch;
        frames[i].planeCount = 1, frames[i].numChannels = 4, frames[i].frameType = CU_EGL_FRAME_TYPE_PITCH;
        frames[i].eglColorFormat = CU_EGL_COLOR_FORMAT_ARGB, frames[i].cuFormat = CU_AD_FORMAT_UNSIGNED_INT8;
    }
    if ((status = d_stream_create(&own_stream, 0)))
        return failed("cuStreamCreate", status);
    cu_stream = present_null ? NULL : own_stream;
    return_stream = return_null ? NULL : own_stream;
    role = 2;
    Py_RETURN_NONE;
}

static PyObject *disconnect(PyObject *self, PyObject *unused)
{
    if (role == 1)
        d_consumer_disconnect(&connection);
    if (role == 2) {
        d_producer_disconnect(&connection);
        for (int i = 0; i < POOL; i++)
            d_free(memory[i]);
    }
    if (role)
        d_stream_destroy(own_stream);
    role = 0;
    Py_RETURN_NONE;
}

static CUresult context_check(void)
{
    CUcontext current;
    return d_current(&current);
}

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000ll + t.tv_nsec;
}

/* One timed cuEGLStreamProducerReturnFrame, counted. */
static CUresult timed_return(void)
{
    long long t0 = now_ns();
    CUresult status = d_return(&connection, &back, &return_stream);
    long long took = now_ns() - t0;
    if (status == CUDA_ERROR_LAUNCH_TIMEOUT)
        returns_none++, ns_none += took;
    else
        returns_ok++, ns_ok += took;
    return status;
}

static PyObject *stats(PyObject *self, PyObject *unused)
{
    return Py_BuildValue("{s:L,s:L,s:d,s:d}", "returns_ok", returns_ok, "returns_none", returns_none,
                         "us_per_ok", returns_ok ? ns_ok / 1e3 / returns_ok : 0.0,
                         "us_per_none", returns_none ? ns_none / 1e3 / returns_none : 0.0);
}

/* ---- one call per step ---------------------------------------------------------------------- */
static PyObject *present(PyObject *self, PyObject *index)
{
    CUresult status;
    long i = PyLong_AsLong(index) % POOL;
    Py_BEGIN_ALLOW_THREADS
    status = context_check() ?: d_present(&connection, frames[i], &cu_stream);
    Py_END_ALLOW_THREADS
    return status ? failed("present", status) : Py_NewRef(Py_None);
}

static int pool_index(void)
{
    for (int i = 0; i < POOL; i++)
        if (back.frame.pPitch[0] == frames[i].frame.pPitch[0])
            return i;
    return -2;
}

/* One cuEGLStreamProducerReturnFrame: the pool index of the frame that came back, -1 for none. */
static PyObject *try_return(PyObject *self, PyObject *unused)
{
    CUresult status;
    Py_BEGIN_ALLOW_THREADS
    status = context_check() ?: timed_return();
    Py_END_ALLOW_THREADS
    if (status == CUDA_ERROR_LAUNCH_TIMEOUT)
        return PyLong_FromLong(-1);
    if (status)
        return failed("return", status);
    int i = pool_index();
    return i < 0 ? PyErr_Format(PyExc_RuntimeError, "a frame not in the pool came back") : PyLong_FromLong(i);
}

static PyObject *acquire(PyObject *self, PyObject *unused)
{
    CUresult status;
    Py_BEGIN_ALLOW_THREADS
    status = context_check() ?: d_acquire(&connection, &resource, &cu_stream, 2000000) ?: d_map(&mapped, resource, 0, 0);
    Py_END_ALLOW_THREADS
    return status ? failed("acquire", status) : Py_NewRef(Py_None);
}

static PyObject *release(PyObject *self, PyObject *unused)
{
    CUresult status;
    Py_BEGIN_ALLOW_THREADS
    status = context_check() ?: d_release(&connection, resource, &cu_stream);
    Py_END_ALLOW_THREADS
    return status ? failed("release", status) : Py_NewRef(Py_None);
}

/* ---- the C reference's loops, inside this process ---------------------------------------------- */
static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* producer_loop(total): present `total` frames from the pool, spinning on the return while none
 * is free (bench/c/cross_gpu.c's producer, without the timestamps). */
static PyObject *producer_loop(PyObject *self, PyObject *arg)
{
    long total = PyLong_AsLong(arg);
    int free_list[POOL], free_count = POOL, bad = 0;
    CUresult status = CUDA_SUCCESS;
    for (int i = 0; i < POOL; i++)
        free_list[i] = i;
    Py_BEGIN_ALLOW_THREADS
    for (long k = 0; k < total && !status && !bad; k++) {
        while (free_count == 0) {
            status = timed_return();
            if (status == CUDA_ERROR_LAUNCH_TIMEOUT) { status = CUDA_SUCCESS; continue; }
            if (status) break;
            int i = pool_index();
            if (i < 0) { bad = 1; break; }
            free_list[free_count++] = i;
        }
        if (!status && !bad)
            status = d_present(&connection, frames[free_list[--free_count]], &cu_stream);
    }
    Py_END_ALLOW_THREADS
    if (bad)
        return PyErr_Format(PyExc_RuntimeError, "a frame not in the pool came back");
    return status ? failed("producer loop", status) : Py_NewRef(Py_None);
}

/* consumer_loop(total, warmup): acquire (and map) and release `total` frames; the seconds from
 * the acquire of frame `warmup` to the release of the last. */
static PyObject *consumer_loop(PyObject *self, PyObject *args)
{
    long total, warmup;
    double start = 0.0, end = 0.0;
    CUresult status = CUDA_SUCCESS;
    if (!PyArg_ParseTuple(args, "ll", &total, &warmup))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    for (long k = 0; k < total && !status; k++) {
        if (k == warmup)
            start = now_s();
        status = d_acquire(&connection, &resource, &cu_stream, 2000000) ?: d_map(&mapped, resource, 0, 0)
                 ?: d_release(&connection, resource, &cu_stream);
    }
    end = now_s();
    Py_END_ALLOW_THREADS
    return status ? failed("consumer loop", status) : PyFloat_FromDouble(end - start);
}

static PyMethodDef methods[] = {
    {"consumer_connect", consumer_connect, METH_VARARGS, NULL},
    {"producer_connect", producer_connect, METH_VARARGS, NULL},
    {"disconnect", disconnect, METH_NOARGS, NULL},
    {"present", present, METH_O, NULL},
    {"try_return", try_return, METH_NOARGS, NULL},
    {"acquire", acquire, METH_NOARGS, NULL},
    {"release", release, METH_NOARGS, NULL},
    {"producer_loop", producer_loop, METH_O, NULL},
    {"consumer_loop", consumer_loop, METH_VARARGS, NULL},
    {"stats", stats, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "xproc_ext", NULL, -1, methods};
PyMODINIT_FUNC PyInit_xproc_ext(void) { return PyModule_Create(&module); }
