/* Research record (see research/README.md): frozen record (uses the old layout: floor_probe.py feeds it endpoint internals; ran at 0ec709e and 9e8cabf). */
/* Probe: the thinnest binding a Python loop can call the five driver calls through. Each function
 * makes its driver call(s) on connections eglcuda made, with no argument checks and no
 * bookkeeping; with keep_gil it does not release the GIL around the call. What a loop of these
 * costs over the C program is what any Python library pays for being called from Python. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include "../../csrc/egl_core.h"
#include "../../csrc/egl_stream.h"
#include "../../csrc/cuda_egl.h"

static __typeof__(&cuEGLStreamProducerPresentFrame) d_present;
static __typeof__(&cuEGLStreamConsumerAcquireFrame) d_acquire;
static __typeof__(&cuGraphicsResourceGetMappedEglFrame) d_map;
static __typeof__(&cuEGLStreamConsumerReleaseFrame) d_release;
static __typeof__(&cuEGLStreamProducerReturnFrame) d_return;
static __typeof__(&cuCtxGetCurrent) d_current;
static CUeglStreamConnection *producer, *consumer;
static CUeglFrame *frames;
static CUstream consumer_stream, producer_stream;
static CUgraphicsResource resource;
static CUeglFrame mapped, back;
static int keep_gil, check_context;

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

static PyObject *setup(PyObject *self, PyObject *args)
{
    unsigned long long p, c, f, s;
    if (!PyArg_ParseTuple(args, "KKKKii", &p, &c, &f, &s, &keep_gil, &check_context))
        return NULL;
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    d_present = dlsym(cuda, "cuEGLStreamProducerPresentFrame");
    d_acquire = dlsym(cuda, "cuEGLStreamConsumerAcquireFrame");
    d_map = dlsym(cuda, "cuGraphicsResourceGetMappedEglFrame");
    d_release = dlsym(cuda, "cuEGLStreamConsumerReleaseFrame");
    d_return = dlsym(cuda, "cuEGLStreamProducerReturnFrame");
    d_current = dlsym(cuda, "cuCtxGetCurrent");
    producer = (void *)(uintptr_t)p, consumer = (void *)(uintptr_t)c, frames = (void *)(uintptr_t)f;
    consumer_stream = (CUstream)(uintptr_t)s, producer_stream = NULL;
    Py_RETURN_NONE;
}

static PyObject *present(PyObject *self, PyObject *index)
{
    CUresult status;
    long i = PyLong_AsLong(index) & 1;
    CALL(status, context_check() ?: d_present(producer, frames[i], &producer_stream));
    return status ? failed("present", status) : Py_NewRef(Py_None);
}

static PyObject *acquire(PyObject *self, PyObject *unused)
{
    CUresult status;
    CALL(status, context_check() ?: d_acquire(consumer, &resource, &consumer_stream, 1000000)
                                     ?: d_map(&mapped, resource, 0, 0));
    return status ? failed("acquire", status) : Py_NewRef(Py_None);
}

static PyObject *release(PyObject *self, PyObject *unused)
{
    CUresult status;
    CALL(status, context_check() ?: d_release(consumer, resource, &consumer_stream));
    return status ? failed("release", status) : Py_NewRef(Py_None);
}

static CUresult return_loop(void)
{
    CUresult status = context_check();
    if (status)
        return status;
    while ((status = d_return(producer, &back, &producer_stream)) == CUDA_ERROR_LAUNCH_TIMEOUT) {}
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
    {"present", present, METH_O, NULL},
    {"acquire", acquire, METH_NOARGS, NULL},
    {"release", release, METH_NOARGS, NULL},
    {"return_frame", return_frame, METH_NOARGS, NULL},
    {NULL, NULL, 0, NULL},
};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "floor_ext", NULL, -1, methods};
PyMODINIT_FUNC PyInit_floor_ext(void) { return PyModule_Create(&module); }
