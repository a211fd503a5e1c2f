/* Research record (see research/README.md): runs against the current package (floor_probe.py gives it only a public stream handle). */
/* Probe: the thinnest binding a Python loop can call the serial round trip's driver calls through.
 * setup() connects its own CUDA producer and consumer to an EGLStream eglcuda created (only the
 * stream's public handle crosses over) and allocates two pitched ARGB frames, as the C reference
 * (bench/c/stream_roundtrip.c) does. Each step function then makes its driver call(s) with no
 * argument checks and no bookkeeping; with keep_gil it does not release the GIL around the call.
 * What a loop of these costs over the C program is what any Python library pays for being called
 * from Python. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <string.h>
#include "../../csrc/egl_core.h"
#include "../../csrc/egl_stream.h"
#include "../../csrc/cuda_egl.h"

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

static CUeglStreamConnection producer, consumer;
static CUeglFrame frames[2];
static unsigned long long memory[2];
static CUstream consumer_stream, producer_stream;
static CUgraphicsResource resource;
static CUeglFrame mapped, back;
static int keep_gil, check_context, connected;

#define CALL(status, expr)                                                                       \
    do {                                                                                         \
        if (keep_gil) { status = (expr); }                                                       \
        else { Py_BEGIN_ALLOW_THREADS status = (expr); Py_END_ALLOW_THREADS }                    \
    } while (0)

static CUresult context_check(void)
{
    CUcontext current;
    return check_context ? d_current(&current) : CUDA_SUCCESS;
}

static PyObject *failed(const char *what, CUresult status)
{
    return PyErr_Format(PyExc_RuntimeError, "%s failed: %d", what, (int)status);
}

static void *symbol(void *lib, const char *name)
{
    void *found = dlsym(lib, name);
    if (!found)
        PyErr_Format(PyExc_RuntimeError, "the CUDA driver library has no %s", name);
    return found;
}

/* setup(libcuda, egl_stream, width, height, keep_gil, check_context), with eglcuda's CUDA context
 * current; libcuda is the library eglcuda loaded (its EGLCUDA_LIBCUDA test hook, or libcuda.so.1). */
static PyObject *setup(PyObject *self, PyObject *args)
{
    const char *library;
    unsigned long long egl_stream;
    unsigned int width, height;
    CUresult status;
    if (connected)
        return PyErr_Format(PyExc_RuntimeError, "setup twice without teardown");
    if (!PyArg_ParseTuple(args, "sKIIii", &library, &egl_stream, &width, &height, &keep_gil, &check_context))
        return NULL;
    void *cuda = dlopen(library, RTLD_NOW);
    if (!cuda)
        return PyErr_Format(PyExc_RuntimeError, "dlopen %s: %s", library, dlerror());
    if (!(d_present = symbol(cuda, "cuEGLStreamProducerPresentFrame"))
        || !(d_acquire = symbol(cuda, "cuEGLStreamConsumerAcquireFrame"))
        || !(d_map = symbol(cuda, "cuGraphicsResourceGetMappedEglFrame"))
        || !(d_release = symbol(cuda, "cuEGLStreamConsumerReleaseFrame"))
        || !(d_return = symbol(cuda, "cuEGLStreamProducerReturnFrame"))
        || !(d_consumer_connect = symbol(cuda, "cuEGLStreamConsumerConnect"))
        || !(d_producer_connect = symbol(cuda, "cuEGLStreamProducerConnect"))
        || !(d_consumer_disconnect = symbol(cuda, "cuEGLStreamConsumerDisconnect"))
        || !(d_producer_disconnect = symbol(cuda, "cuEGLStreamProducerDisconnect"))
        || !(d_current = symbol(cuda, "cuCtxGetCurrent"))
        || !(d_alloc = (mem_alloc_fn)symbol(cuda, "cuMemAlloc_v2"))
        || !(d_free = (mem_free_fn)symbol(cuda, "cuMemFree_v2"))
        || !(d_stream_create = (stream_create_fn)symbol(cuda, "cuStreamCreate"))
        || !(d_stream_destroy = (stream_destroy_fn)symbol(cuda, "cuStreamDestroy_v2")))
        return NULL;
    EGLStreamKHR stream = (EGLStreamKHR)(uintptr_t)egl_stream;
    if ((status = d_consumer_connect(&consumer, stream)))
        return failed("cuEGLStreamConsumerConnect", status);
    if ((status = d_producer_connect(&producer, stream, width, height))) {
        d_consumer_disconnect(&consumer);
        return failed("cuEGLStreamProducerConnect", status);
    }
    unsigned int pitch = (width * 4 + 255) / 256 * 256;
    for (int i = 0; i < 2; i++) {
        if ((status = d_alloc(&memory[i], (size_t)pitch * height)))
            return failed("cuMemAlloc", status);
        memset(&frames[i], 0, sizeof frames[i]);
        frames[i].frame.pPitch[0] = (void *)(uintptr_t)memory[i];
        frames[i].width = width, frames[i].height = height, frames[i].depth = 1, frames[i].pitch = pitch;
        frames[i].planeCount = 1, frames[i].numChannels = 4, frames[i].frameType = CU_EGL_FRAME_TYPE_PITCH;
        frames[i].eglColorFormat = CU_EGL_COLOR_FORMAT_ARGB, frames[i].cuFormat = CU_AD_FORMAT_UNSIGNED_INT8;
    }
    if ((status = d_stream_create(&consumer_stream, 0)))
        return failed("cuStreamCreate", status);
    producer_stream = NULL;
    connected = 1;
    Py_RETURN_NONE;
}

/* Disconnect both ends and free what setup made; call before the stream is destroyed. */
static PyObject *teardown(PyObject *self, PyObject *unused)
{
    if (connected) {
        d_producer_disconnect(&producer);
        d_consumer_disconnect(&consumer);
        d_stream_destroy(consumer_stream);
        d_free(memory[0]);
        d_free(memory[1]);
        connected = 0;
    }
    Py_RETURN_NONE;
}

static PyObject *present(PyObject *self, PyObject *index)
{
    CUresult status;
    long i = PyLong_AsLong(index) & 1;
    CALL(status, context_check() ?: d_present(&producer, frames[i], &producer_stream));
    return status ? failed("present", status) : Py_NewRef(Py_None);
}

static PyObject *acquire(PyObject *self, PyObject *unused)
{
    CUresult status;
    CALL(status, context_check() ?: d_acquire(&consumer, &resource, &consumer_stream, 1000000)
                                     ?: d_map(&mapped, resource, 0, 0));
    return status ? failed("acquire", status) : Py_NewRef(Py_None);
}

static PyObject *release(PyObject *self, PyObject *unused)
{
    CUresult status;
    CALL(status, context_check() ?: d_release(&consumer, resource, &consumer_stream));
    return status ? failed("release", status) : Py_NewRef(Py_None);
}

static CUresult return_loop(void)
{
    CUresult status = context_check();
    if (status)
        return status;
    while ((status = d_return(&producer, &back, &producer_stream)) == CUDA_ERROR_LAUNCH_TIMEOUT) {}
    return status;
}

static PyObject *return_frame(PyObject *self, PyObject *unused)
{
    CUresult status;
    CALL(status, return_loop());
    return status ? failed("return", status) : Py_NewRef(Py_None);
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, NULL},
    {"teardown", teardown, METH_NOARGS, NULL},
    {"present", present, METH_O, NULL},
    {"acquire", acquire, METH_NOARGS, NULL},
    {"release", release, METH_NOARGS, NULL},
    {"return_frame", return_frame, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "floor_ext", NULL, -1, methods};
PyMODINIT_FUNC PyInit_floor_ext(void) { return PyModule_Create(&module); }
