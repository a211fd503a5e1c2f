/* eglcuda._hotpath: the per-frame calls of the CUDA stream endpoints as CPython methods.
 *
 * Why C: on the stream's serial round trip every microsecond of Python between two driver calls
 * costs at least a microsecond per frame (docs/benchmarks.md), and the interpreter work of a
 * Python method (call, lock, attribute loads, checks, the result object) is most of what
 * separated eglcuda from the C reference. The base types here hold the per-frame state and make
 * the common case without running Python code; everything rare (first present of a frame, bad
 * input, driver failures, closing) calls back into the Python subclass in eglcuda/_stream.py,
 * which keeps the checks, the messages and the documentation.
 *
 * The driver calls go through the fused helpers of csrc/helpers.c, compiled into the cffi module
 * eglcuda._native; their addresses are handed over once by bind(). Handles are void * here: the
 * helpers take pointers (CUcontext, CUeglStreamConnection *, boxes) and return CUresult, an int. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

typedef int (*present_fn)(void *ctx, void *conn, const void *frame, void *stream_box);
typedef int (*return_fn)(void *ctx, void *conn, void *frame, void *stream_box, unsigned long long timeout_us,
                         unsigned long long *plane0);
typedef int (*present_return_fn)(void *ctx, void *conn, const void *presented, void *present_stream_box, void *back,
                                 void *return_stream_box, unsigned long long timeout_us, unsigned long long *plane0,
                                 int *failed_call);
typedef int (*acquire_fn)(void *ctx, void *conn, void *resource_box, void *stream_box, unsigned int timeout_us,
                          void *frame, void *dpy, void *egl_stream, uint64_t *consumer_frame, int *failed_call);
typedef int (*next_fn)(void *ctx, void *conn, void *held, void *resource_box, void *stream_box, unsigned int timeout_us,
                       void *frame, void *dpy, void *egl_stream, uint64_t *consumer_frame, int *failed_call);
typedef int (*release_fn)(void *ctx, void *conn, void *resource, void *stream_box);
typedef int (*counter_fn)(void *dpy, void *egl_stream, uint64_t *consumer_frame);

static struct {
    present_fn present;
    return_fn return_frame;
    present_return_fn present_return;
    acquire_fn acquire;
    next_fn next;
    release_fn release;
    counter_fn counter;
} driver;

/* The helpers' failed_call codes (csrc/helpers.c). */
enum { CALL_MAP = 2, CALL_COUNTER = 3, CALL_RELEASE = 4, CALL_PRESENT = 5 };
#define MAX_FRAMES_IN_FLIGHT 64
#define RECENT_FRAMES 8
#define SPARE_FRAMES 2
#define MAX_TIMEOUT_US 0x7FFFFFFFLL

/* Names of the Python subclass's slow-path methods and attributes, interned once. */
static PyObject *s_key, *s_egl_address, *s_check_frame, *s_stream_handle, *s_present_failed, *s_first_present,
    *s_return_failed, *s_returned_unknown, *s_fail_closed, *s_timeout, *s_fail_held, *s_wait_for_producer,
    *s_counter_failed, *s_release_failed, *s_acquire_failed, *s_check_disconnected, *s_fail_released,
    *s_fail_foreign;

static int bound(void)
{
    if (driver.present != NULL)
        return 1;
    PyErr_SetString(PyExc_RuntimeError, "eglcuda._hotpath.bind() was not called (import eglcuda first)");
    return 0;
}

/* ---- small helpers ------------------------------------------------------------------------- */

/* The endpoint gate: one thread at a time inside an endpoint's per-frame call, which releases the
 * GIL for its driver call. The common case (nobody inside) is a flag read and written with the
 * GIL held, no atomic instruction and no clock read; a PyThread lock cost two atomics and a clock
 * read per call (its timed acquire reads the monotonic clock even when not waiting), which on the
 * GPU machine was a measurable part of a frame. A thread that finds the gate busy waits on the
 * condition variable without the GIL; the thread inside wakes it when it leaves. */
typedef struct {
    int busy;       /* someone is inside; written with the GIL held, read by waiters without it */
    int waiters;    /* threads waiting to enter; only touched with the GIL held */
    pthread_mutex_t mutex;
    pthread_cond_t cond;
} Gate;

static int gate_init(Gate *gate)
{
    if (pthread_mutex_init(&gate->mutex, NULL) != 0)
        return -1;
    if (pthread_cond_init(&gate->cond, NULL) != 0) {
        pthread_mutex_destroy(&gate->mutex);
        return -1;
    }
    return 0;
}

static void gate_destroy(Gate *gate)
{
    pthread_cond_destroy(&gate->cond);
    pthread_mutex_destroy(&gate->mutex);
}

/* Enter the gate (GIL held); when another thread is inside, wait for it without the GIL. */
static void gate_enter(Gate *gate)
{
    if (!__atomic_load_n(&gate->busy, __ATOMIC_RELAXED)) {
        __atomic_store_n(&gate->busy, 1, __ATOMIC_RELAXED);
        return;
    }
    gate->waiters++;
    do {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&gate->mutex);
        while (__atomic_load_n(&gate->busy, __ATOMIC_ACQUIRE))
            pthread_cond_wait(&gate->cond, &gate->mutex);
        pthread_mutex_unlock(&gate->mutex);
        Py_END_ALLOW_THREADS
        /* Another waiter may have taken the GIL, and the gate, first. */
    } while (__atomic_load_n(&gate->busy, __ATOMIC_RELAXED));
    gate->waiters--;
    __atomic_store_n(&gate->busy, 1, __ATOMIC_RELAXED);
}

/* Leave the gate (GIL held) and wake the waiters, if any. A waiter checks the flag with the mutex
 * held before it sleeps, and the wake-up is sent with the mutex held, so none is missed. */
static void gate_leave(Gate *gate)
{
    __atomic_store_n(&gate->busy, 0, __ATOMIC_RELEASE);
    if (gate->waiters) {
        pthread_mutex_lock(&gate->mutex);
        pthread_cond_broadcast(&gate->cond);
        pthread_mutex_unlock(&gate->mutex);
    }
}

/* Call a slow-path method that must raise (it reports a failure). Always returns NULL. */
static PyObject *raise_via(PyObject *self, PyObject *name, PyObject *arg1, PyObject *arg2, PyObject *arg3)
{
    PyObject *result = PyObject_CallMethodObjArgs(self, name, arg1, arg2, arg3, NULL);
    if (result != NULL) {
        Py_DECREF(result);
        PyErr_Format(PyExc_SystemError, "eglcuda: %U returned instead of raising", name);
    }
    return NULL;
}

/* Call a slow-path method that raises the error for a driver status (plus up to two numbers of
 * context: count says how many of extra1, extra2 are passed). Always returns NULL. */
static PyObject *raise_status(PyObject *self, PyObject *name, int status, int count, long long extra1,
                              long long extra2)
{
    PyObject *a = PyLong_FromLong(status), *b = PyLong_FromLongLong(extra1), *c = PyLong_FromLongLong(extra2);
    if (a != NULL && b != NULL && c != NULL)
        raise_via(self, name, a, count > 0 ? b : NULL, count > 1 ? c : NULL);
    Py_XDECREF(a);
    Py_XDECREF(b);
    Py_XDECREF(c);
    return NULL;
}

/* A timeout in microseconds: an int in 0..2**31-1. Anything else goes to the subclass's _timeout,
 * which converts what it can (int subclasses) and raises the library's error for the rest. */
static int read_timeout(PyObject *self, PyObject *value, unsigned long long *out)
{
    if (PyLong_CheckExact(value)) {
        int overflow = 0;
        long long us = PyLong_AsLongLongAndOverflow(value, &overflow);
        if (!overflow && us >= 0 && us <= MAX_TIMEOUT_US) {
            *out = (unsigned long long)us;
            return 0;
        }
        PyErr_Clear();
    }
    PyObject *checked = PyObject_CallMethodOneArg(self, s_timeout, value);
    if (checked == NULL)
        return -1;
    long long us = PyLong_AsLongLong(checked);
    Py_DECREF(checked);
    if (us < 0 || us > MAX_TIMEOUT_US) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "timeout out of range");
        return -1;
    }
    *out = (unsigned long long)us;
    return 0;
}

/* Vectorcall arguments into out[0..count): positional first, then keywords by name. */
static int parse_args(const char *function, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                      const char *const *names, int count, int required, PyObject **out)
{
    if (nargs > count) {
        PyErr_Format(PyExc_TypeError, "%s() takes at most %d arguments (%zd given)", function, count, nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < nargs; i++)
        out[i] = args[i];
    Py_ssize_t keywords = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < keywords; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int i = 0;
        while (i < count && PyUnicode_CompareWithASCIIString(name, names[i]) != 0)
            i++;
        if (i == count) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", function, name);
            return -1;
        }
        if (out[i] != NULL) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", function, names[i]);
            return -1;
        }
        out[i] = args[nargs + k];
    }
    for (int i = 0; i < required; i++) {
        if (out[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", function, names[i]);
            return -1;
        }
    }
    return 0;
}

static int read_address(PyObject *value, void **out)
{
    *out = PyLong_AsVoidPtr(value);
    return (*out == NULL && PyErr_Occurred()) ? -1 : 0;
}

/* ==== producer ================================================================================ */

typedef struct {
    PyObject_HEAD
    void *ctx;               /* CUcontext */
    void *conn;              /* CUeglStreamConnection * (a cffi box the subclass keeps) */
    void *returned;          /* CUeglFrame * the driver writes a returned frame into (cffi box) */
    void *default_stream;    /* a CUstream box holding NULL: the legacy default stream */
    void *present_stream;    /* a CUstream box for a stream the caller names */
    void *return_stream;     /* a CUstream box holding NULL */
    unsigned long long returned_key;
    int failed_call;
    char reuse;              /* the stream keeps the newest frame (EGL's default) */
    char connected;
    /* Presents begun and presents done (successfully), each counted with the GIL held: a consumer
     * in this process reads them to know a new frame's number without asking EGL (see
     * derive_plan). A failed present leaves them unequal for good. */
    long long presents_started, frames_presented;
    /* The frames presented and not returned, in present order, with their plane-0 addresses (a
     * Frame's key, what a returned CUeglFrame is matched by); strong references. A C table, not a
     * dict: it holds at most 64 frames and is scanned, without hashing or allocation. */
    struct {
        PyObject *frame;
        unsigned long long plane0;
    } flight[MAX_FRAMES_IN_FLIGHT];
    int flying;
    PyObject *associated;    /* plane-0 address -> Frame, every frame presented since connect */
    /* The frames presented most recently, so a frame presented again skips two attribute reads
     * and a dict lookup (strong references, dropped at disconnect like the associated table's). */
    struct {
        PyObject *frame, *key;
        void *egl;                    /* its CUeglFrame */
        unsigned long long plane0;    /* the key's value */
    } recent[RECENT_FRAMES];
    int recent_next;
    Gate gate;
    char gate_ready;
} ProducerCore;

static PyObject *producer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    ProducerCore *self = (ProducerCore *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->associated = PyDict_New();
    if (self->associated == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    if (gate_init(&self->gate) < 0) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->gate_ready = 1;
    return (PyObject *)self;
}

static int producer_traverse(ProducerCore *self, visitproc visit, void *arg)
{
    for (int i = 0; i < self->flying; i++)
        Py_VISIT(self->flight[i].frame);
    Py_VISIT(self->associated);
    for (int i = 0; i < RECENT_FRAMES; i++) {
        Py_VISIT(self->recent[i].frame);
        Py_VISIT(self->recent[i].key);
    }
    return 0;
}

static void forget_recent(ProducerCore *self)
{
    for (int i = 0; i < RECENT_FRAMES; i++) {
        Py_CLEAR(self->recent[i].frame);
        Py_CLEAR(self->recent[i].key);
    }
}

/* Empty the in-flight table; the frames are dropped after it is consistent (their weak reference
 * callbacks may run). */
static void drop_in_flight(ProducerCore *self)
{
    PyObject *frames[MAX_FRAMES_IN_FLIGHT];
    int count = self->flying;
    for (int i = 0; i < count; i++)
        frames[i] = self->flight[i].frame;
    self->flying = 0;
    for (int i = 0; i < count; i++)
        Py_DECREF(frames[i]);
}

static int producer_clear(ProducerCore *self)
{
    drop_in_flight(self);
    Py_CLEAR(self->associated);
    forget_recent(self);
    return 0;
}

static void producer_dealloc(ProducerCore *self)
{
    PyObject_GC_UnTrack(self);
    producer_clear(self);
    if (self->gate_ready)
        gate_destroy(&self->gate);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *producer_bind(ProducerCore *self, PyObject *args)
{
    PyObject *ctx, *conn, *returned;
    int reuse;
    if (!PyArg_ParseTuple(args, "OOOp:_bind", &ctx, &conn, &returned, &reuse))
        return NULL;
    if (read_address(ctx, &self->ctx) < 0 || read_address(conn, &self->conn) < 0
        || read_address(returned, &self->returned) < 0)
        return NULL;
    self->reuse = (char)reuse;
    self->connected = 1;
    Py_RETURN_NONE;
}

static PyObject *producer_shut(ProducerCore *self, PyObject *unused)
{
    gate_enter(&self->gate);
    self->connected = 0;
    forget_recent(self);
    gate_leave(&self->gate);
    Py_RETURN_NONE;
}

/* Where the frame with plane-0 address plane0 is in the in-flight table, or -1. */
static int find_in_flight(ProducerCore *self, unsigned long long plane0)
{
    for (int i = 0; i < self->flying; i++) {
        if (self->flight[i].plane0 == plane0)
            return i;
    }
    return -1;
}

/* Remember a frame this producer presented (it is in the associated table). */
static void remember_recent(ProducerCore *self, PyObject *frame, PyObject *key, void *egl, unsigned long long plane0)
{
    for (int i = 0; i < RECENT_FRAMES; i++) {
        if (self->recent[i].frame == frame)
            return;
    }
    int slot = self->recent_next;
    self->recent_next = (slot + 1) % RECENT_FRAMES;
    Py_XSETREF(self->recent[slot].frame, Py_NewRef(frame));
    Py_XSETREF(self->recent[slot].key, Py_NewRef(key));
    self->recent[slot].egl = egl;
    self->recent[slot].plane0 = plane0;
}

/* The checks before a present (inside the gate). Returns a new reference to the frame's key, with
 * its value (the plane-0 address), the frame's CUeglFrame, the stream box to pass and whether this
 * producer presented it before. */
static PyObject *before_present(ProducerCore *self, PyObject *frame, PyObject *cuda_stream, int *known,
                                unsigned long long *plane0, void **egl, void **stream_box)
{
    if (!self->connected)
        return raise_via((PyObject *)self, s_fail_closed, NULL, NULL, NULL);
    PyObject *key = NULL;
    *egl = NULL;
    for (int i = 0; i < RECENT_FRAMES && key == NULL; i++) {
        if (self->recent[i].frame == frame) {
            /* Presented before on this connection, so still open and matching it. */
            key = Py_NewRef(self->recent[i].key);
            *plane0 = self->recent[i].plane0;
            *egl = self->recent[i].egl;
            *known = 2; /* known, and remembered */
        }
    }
    int addressable = 1;
    if (key == NULL) {
        key = PyObject_GetAttr(frame, s_key);
        if (key == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_AttributeError))
                return NULL;
            PyErr_Clear(); /* not a Frame: _check_frame says so */
            key = Py_NewRef(Py_None);
        }
        PyObject *seen = PyDict_GetItemWithError(self->associated, key);
        if (seen == NULL && PyErr_Occurred())
            goto fail;
        *known = seen == frame;
        *plane0 = PyLong_Check(key) ? PyLong_AsUnsignedLongLong(key) : 0;
        if (!PyLong_Check(key) || PyErr_Occurred()) {
            PyErr_Clear();
            addressable = 0; /* not a Frame: _check_frame says so */
        }
    }
    int presented = addressable && find_in_flight(self, *plane0) >= 0;
    /* A frame's geometry never changes: it is checked in full the first time only. */
    if (!*known || !addressable || presented || self->flying >= MAX_FRAMES_IN_FLIGHT) {
        PyObject *checked = PyObject_CallMethodOneArg((PyObject *)self, s_check_frame, frame);
        if (checked == NULL)
            goto fail;
        Py_DECREF(checked);
        if (!addressable || presented || self->flying >= MAX_FRAMES_IN_FLIGHT) {
            PyErr_SetString(PyExc_SystemError, "eglcuda: _check_frame passed a frame that cannot be presented");
            goto fail;
        }
    }
    int bad;
    if (*egl == NULL) {
        PyObject *address = PyObject_GetAttr(frame, s_egl_address);
        if (address == NULL)
            goto fail;
        bad = read_address(address, egl);
        Py_DECREF(address);
        if (bad)
            goto fail;
    }
    if (cuda_stream == NULL || cuda_stream == Py_None) {
        *stream_box = &self->default_stream;
    } else {
        PyObject *handle = PyObject_CallMethodOneArg((PyObject *)self, s_stream_handle, cuda_stream);
        if (handle == NULL)
            goto fail;
        bad = read_address(handle, &self->present_stream);
        Py_DECREF(handle);
        if (bad)
            goto fail;
        *stream_box = &self->present_stream;
    }
    return key;
fail:
    Py_DECREF(key);
    return NULL;
}

/* After a successful present (inside the gate): the frame is in flight; its first present fixes
 * the connection's format and layout (in Python). */
static int after_present(ProducerCore *self, PyObject *frame, PyObject *key, int known, unsigned long long plane0,
                         void *egl)
{
    self->flight[self->flying].frame = Py_NewRef(frame);
    self->flight[self->flying].plane0 = plane0;
    self->flying++;
    self->frames_presented++;
    if (!known) {
        PyObject *done = PyObject_CallMethodObjArgs((PyObject *)self, s_first_present, frame, key, NULL);
        if (done == NULL)
            return -1;
        Py_DECREF(done);
    }
    if (known != 2)
        remember_recent(self, frame, key, egl, plane0);
    return 0;
}

/* The frame the driver just returned, taken out of the in-flight table (inside the gate). */
static PyObject *take_returned(ProducerCore *self)
{
    int at = find_in_flight(self, self->returned_key);
    if (at < 0)
        return raise_via((PyObject *)self, s_returned_unknown, NULL, NULL, NULL);
    PyObject *frame = self->flight[at].frame; /* its reference is the caller's now */
    self->flying--;
    memmove(&self->flight[at], &self->flight[at + 1], (size_t)(self->flying - at) * sizeof(self->flight[0]));
    return frame;
}

/* A failed return (inside the gate): None for "none came back yet", else the subclass raises. */
static PyObject *return_failed(ProducerCore *self, int status, unsigned long long waited_us)
{
    PyObject *a = PyLong_FromLong(status), *b = PyLong_FromUnsignedLongLong(waited_us);
    PyObject *result = NULL;
    if (a != NULL && b != NULL)
        result = PyObject_CallMethodObjArgs((PyObject *)self, s_return_failed, a, b, NULL);
    Py_XDECREF(a);
    Py_XDECREF(b);
    return result;
}

static const char *const present_names[] = {"frame", "cuda_stream"};

static PyObject *producer_present(ProducerCore *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *arg[2] = {NULL, NULL};
    if (parse_args("present", args, nargs, kwnames, present_names, 2, 1, arg) < 0 || !bound())
        return NULL;
    PyObject *result = NULL;
    int known, status;
    unsigned long long plane0;
    void *egl, *stream_box;
    gate_enter(&self->gate);
    PyObject *key = before_present(self, arg[0], arg[1], &known, &plane0, &egl, &stream_box);
    if (key != NULL) {
        self->presents_started++;
        Py_BEGIN_ALLOW_THREADS
        status = driver.present(self->ctx, self->conn, egl, stream_box);
        Py_END_ALLOW_THREADS
        if (status)
            raise_status((PyObject *)self, s_present_failed, status, 0, 0, 0);
        else if (after_present(self, arg[0], key, known, plane0, egl) == 0)
            result = Py_NewRef(Py_None);
        Py_DECREF(key);
    }
    gate_leave(&self->gate);
    return result;
}

static const char *const return_names[] = {"timeout_us"};

static PyObject *producer_return_frame(ProducerCore *self, PyObject *const *args, Py_ssize_t nargs,
                                       PyObject *kwnames)
{
    PyObject *arg[1] = {NULL};
    unsigned long long timeout_us = 0;
    if (parse_args("return_frame", args, nargs, kwnames, return_names, 1, 0, arg) < 0 || !bound())
        return NULL;
    if (arg[0] != NULL && read_timeout((PyObject *)self, arg[0], &timeout_us) < 0)
        return NULL;
    PyObject *result = NULL;
    gate_enter(&self->gate);
    if (!self->connected) {
        raise_via((PyObject *)self, s_fail_closed, NULL, NULL, NULL);
    } else {
        int in_flight = self->flying;
        if (in_flight == 0) {
            result = Py_NewRef(Py_None);
        } else {
            /* With reuse on, the stream keeps its newest frame: a single frame in flight cannot
             * come back, so one try answers at once. */
            unsigned long long wait_us = (self->reuse && in_flight == 1) ? 0 : timeout_us;
            int status;
            Py_BEGIN_ALLOW_THREADS
            status = driver.return_frame(self->ctx, self->conn, self->returned, &self->return_stream, wait_us,
                                         &self->returned_key);
            Py_END_ALLOW_THREADS
            result = status ? return_failed(self, status, wait_us) : take_returned(self);
        }
    }
    gate_leave(&self->gate);
    return result;
}

static const char *const present_return_names[] = {"frame", "cuda_stream", "timeout_us"};

static PyObject *producer_present_and_return(ProducerCore *self, PyObject *const *args, Py_ssize_t nargs,
                                             PyObject *kwnames)
{
    PyObject *arg[3] = {NULL, NULL, NULL};
    unsigned long long timeout_us = 0;
    if (parse_args("present_and_return", args, nargs, kwnames, present_return_names, 3, 1, arg) < 0 || !bound())
        return NULL;
    if (arg[2] != NULL && read_timeout((PyObject *)self, arg[2], &timeout_us) < 0)
        return NULL;
    PyObject *result = NULL;
    int known, status;
    unsigned long long plane0;
    void *egl, *stream_box;
    gate_enter(&self->gate);
    PyObject *key = before_present(self, arg[0], arg[1], &known, &plane0, &egl, &stream_box);
    if (key != NULL) {
        /* After this present the stream keeps the newest frame: with reuse on and nothing else in
         * flight nothing can come back, so one try is enough. */
        unsigned long long wait_us = (self->reuse && self->flying == 0) ? 0 : timeout_us;
        self->presents_started++;
        Py_BEGIN_ALLOW_THREADS
        status = driver.present_return(self->ctx, self->conn, egl, stream_box, self->returned, &self->return_stream,
                                       wait_us, &self->returned_key, &self->failed_call);
        Py_END_ALLOW_THREADS
        if (status && self->failed_call == CALL_PRESENT)
            raise_status((PyObject *)self, s_present_failed, status, 0, 0, 0);
        else if (after_present(self, arg[0], key, known, plane0, egl) == 0)
            result = status ? return_failed(self, status, wait_us) : take_returned(self);
        Py_DECREF(key);
    }
    gate_leave(&self->gate);
    return result;
}

/* The in-flight table as a dict (key -> Frame), for the subclass's rare paths. */
static PyObject *producer_in_flight_dict(ProducerCore *self, void *closure)
{
    PyObject *table = PyDict_New();
    for (int i = 0; table != NULL && i < self->flying; i++) {
        PyObject *key = PyLong_FromUnsignedLongLong(self->flight[i].plane0);
        if (key == NULL || PyDict_SetItem(table, key, self->flight[i].frame) < 0)
            Py_CLEAR(table);
        Py_XDECREF(key);
    }
    return table;
}

static PyObject *producer_drop_in_flight(ProducerCore *self, PyObject *unused)
{
    drop_in_flight(self);
    Py_RETURN_NONE;
}

static PyGetSetDef producer_getset[] = {
    {"_in_flight", (getter)producer_in_flight_dict, NULL, "A new dict of the frames in flight, by key.", NULL},
    {NULL}};

static PyMethodDef producer_methods[] = {
    {"present", (PyCFunction)(void (*)(void))producer_present, METH_FASTCALL | METH_KEYWORDS,
     "present(frame, cuda_stream=None)\n--\n\n"
     "Hand ``frame`` to the consumer. ``cuda_stream`` is where the work writing the frame was queued\n"
     "(None: the legacy default stream). The driver returns only once that work is done (measured\n"
     "on driver 580), and on a FIFO stream only once the queue has room; the wait releases the GIL.\n"
     "The frame is checked against the connection (size, format, layout, device) the first time\n"
     "this producer sees it, before the driver does."},
    {"return_frame", (PyCFunction)(void (*)(void))producer_return_frame, METH_FASTCALL | METH_KEYWORDS,
     "return_frame(timeout_us=0)\n--\n\n"
     "Take back a frame the consumer released: the same :class:`Frame` object that was presented,\n"
     "or None if none came back within ``timeout_us`` microseconds.\n\n"
     "None is also the documented answer while the stream keeps the newest frame for its consumer\n"
     "(reuse on, the default): that frame comes back only after another is presented, so with one\n"
     "frame in flight this returns None at once instead of waiting. The wait releases the GIL."},
    {"present_and_return", (PyCFunction)(void (*)(void))producer_present_and_return, METH_FASTCALL | METH_KEYWORDS,
     "present_and_return(frame, cuda_stream=None, timeout_us=0)\n--\n\n"
     ":meth:`present` ``frame``, then :meth:`return_frame` (waiting up to ``timeout_us``), in a\n"
     "single call into the driver layer: the step of a producer that cycles a ring of frames,\n"
     "cheaper than the two calls. Returns the frame taken back, or None."},
    {"_bind", (PyCFunction)producer_bind, METH_VARARGS, "Set the connection's handles (addresses) and reuse flag."},
    {"_shut", (PyCFunction)producer_shut, METH_NOARGS, "Mark the producer disconnected, inside its gate."},
    {"_drop_in_flight", (PyCFunction)producer_drop_in_flight, METH_NOARGS,
     "Forget the frames in flight (after disconnect: the driver holds none of them any more)."},
    {NULL}};

static PyMemberDef producer_members[] = {
    {"frames_presented", T_LONGLONG, offsetof(ProducerCore, frames_presented), READONLY,
     "Frames this producer presented."},
    {"_connected", T_BOOL, offsetof(ProducerCore, connected), 0, NULL},
    {"in_flight", T_INT, offsetof(ProducerCore, flying), READONLY, "Frames presented and not yet returned."},
    {"_associated", T_OBJECT, offsetof(ProducerCore, associated), READONLY, NULL},
    {"_returned_key", T_ULONGLONG, offsetof(ProducerCore, returned_key), READONLY, NULL},
    {NULL}};

static PyTypeObject ProducerCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "eglcuda._hotpath.ProducerCore",
    .tp_doc = "Per-frame state and calls of a CUDA stream producer (base of eglcuda.CudaProducer).",
    .tp_basicsize = sizeof(ProducerCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = producer_new,
    .tp_dealloc = (destructor)producer_dealloc,
    .tp_traverse = (traverseproc)producer_traverse,
    .tp_clear = (inquiry)producer_clear,
    .tp_methods = producer_methods,
    .tp_members = producer_members,
    .tp_getset = producer_getset,
};

/* ==== acquired frame ========================================================================== */

typedef struct {
    PyObject_HEAD
    PyObject *consumer;      /* the ConsumerCore that acquired it */
    PyObject *planes_cache;  /* built by the subclass on first use */
    PyObject *weakrefs;      /* the weak reference list (a reused frame must have none) */
    uint64_t number;         /* the stream's consumer frame counter for it, when numbered */
    char numbered;           /* the consumer has frame numbers on: number and is_new are set */
    char is_new;
    char released;
} AcquiredCore;

static int acquired_traverse(AcquiredCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->consumer);
    Py_VISIT(self->planes_cache);
    return 0;
}

static int acquired_clear(AcquiredCore *self)
{
    Py_CLEAR(self->consumer);
    Py_CLEAR(self->planes_cache);
    return 0;
}

static void acquired_dealloc(AcquiredCore *self)
{
    PyObject_GC_UnTrack(self);
    if (self->weakrefs != NULL)
        PyObject_ClearWeakRefs((PyObject *)self);
    acquired_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* number and is_new are made when read: most loops never read them, and an int per frame is an
 * allocation on the per-frame path. */
static PyObject *acquired_number(AcquiredCore *self, void *closure)
{
    return self->numbered ? PyLong_FromUnsignedLongLong(self->number) : Py_NewRef(Py_None);
}

static PyObject *acquired_is_new(AcquiredCore *self, void *closure)
{
    return self->numbered ? PyBool_FromLong(self->is_new) : Py_NewRef(Py_None);
}

static PyObject *consumer_release_frame(PyObject *consumer, PyObject *frame);

static PyObject *acquired_release(AcquiredCore *self, PyObject *unused)
{
    if (self->consumer == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "an acquired frame made outside its consumer");
        return NULL;
    }
    return consumer_release_frame(self->consumer, (PyObject *)self);
}

static PyMethodDef acquired_methods[] = {
    {"release", (PyCFunction)acquired_release, METH_NOARGS,
     "release()\n--\n\nGive the frame back to the stream. The driver returns only once the work queued on\n"
     "the frame's ``cuda_stream`` is done (measured on driver 580); the wait releases the GIL.\n"
     "Raises :class:`ClosedError` if already released."},
    {NULL}};

static PyMemberDef acquired_members[] = {
    {"_consumer", T_OBJECT, offsetof(AcquiredCore, consumer), READONLY, NULL},
    {"_planes_cache", T_OBJECT, offsetof(AcquiredCore, planes_cache), 0, NULL},
    {"_released", T_BOOL, offsetof(AcquiredCore, released), 0, NULL},
    {NULL}};

static PyGetSetDef acquired_getset[] = {
    {"number", (getter)acquired_number, NULL,
     "The stream's consumer frame counter for this frame (None without frame numbers).", NULL},
    {"is_new", (getter)acquired_is_new, NULL,
     "Whether this frame was not seen before (False: the previous frame handed back again; None\n"
     "without frame numbers).", NULL},
    {NULL}};

static PyTypeObject AcquiredCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "eglcuda._hotpath.AcquiredCore",
    .tp_doc = "State of a frame a CUDA consumer acquired (base of eglcuda.AcquiredFrame); made only by acquire.",
    .tp_basicsize = sizeof(AcquiredCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_dealloc = (destructor)acquired_dealloc,
    .tp_traverse = (traverseproc)acquired_traverse,
    .tp_clear = (inquiry)acquired_clear,
    .tp_weaklistoffset = offsetof(AcquiredCore, weakrefs),
    .tp_methods = acquired_methods,
    .tp_members = acquired_members,
    .tp_getset = acquired_getset,
};

/* ==== consumer ================================================================================ */

typedef struct {
    PyObject_HEAD
    void *ctx;               /* CUcontext */
    void *conn;              /* CUeglStreamConnection * (cffi box) */
    void *resource_box;      /* CUgraphicsResource * the driver writes an acquired frame's resource to */
    void *stream_box;        /* CUstream * of the consumer's CUDA stream */
    void *egl_frame;         /* CUeglFrame * the mapping is read into */
    void *dpy, *egl_stream;  /* for the frame counter query */
    void *held_resource;     /* the resource of the held frame */
    uint64_t counter, last_number;
    int failed_call;
    char use_counter, has_last, producer_seen, connected;
    /* Frame numbers without the EGL query (see derive_plan). */
    ProducerCore *producer;  /* the stream's producer when it is in this process, or NULL */
    char fifo;               /* FIFO stream, else mailbox */
    char last_latched;       /* last_number is the number of the frame the driver latched last */
    char base_known, derive_off;
    uint64_t base;           /* the frame of the producer's n-th present has number base + n */
    long long numbers_derived;
    long long frames_acquired;
    PyObject *held;          /* the AcquiredCore held, or NULL */
    /* The frames made last, kept so an acquire can reuse one once nothing else refers to it: no
     * allocation and no garbage-collector bookkeeping per frame (see reuse_or_make_frame). Two,
     * because `frame = consumer.acquire_next()` still holds the previous frame during the call. */
    PyObject *spares[SPARE_FRAMES];
    int spare_next;
    PyTypeObject *frame_type;
    Gate gate;
    char gate_ready;
} ConsumerCore;

static PyObject *consumer_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    ConsumerCore *self = (ConsumerCore *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    if (gate_init(&self->gate) < 0) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->gate_ready = 1;
    return (PyObject *)self;
}

static int consumer_traverse(ConsumerCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->held);
    for (int i = 0; i < SPARE_FRAMES; i++)
        Py_VISIT(self->spares[i]);
    Py_VISIT(self->frame_type);
    Py_VISIT(self->producer);
    return 0;
}

static int consumer_clear(ConsumerCore *self)
{
    Py_CLEAR(self->held);
    for (int i = 0; i < SPARE_FRAMES; i++)
        Py_CLEAR(self->spares[i]);
    Py_CLEAR(self->frame_type);
    Py_CLEAR(self->producer);
    return 0;
}

static void consumer_dealloc(ConsumerCore *self)
{
    PyObject_GC_UnTrack(self);
    consumer_clear(self);
    if (self->gate_ready)
        gate_destroy(&self->gate);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *consumer_bind(ConsumerCore *self, PyObject *args)
{
    PyObject *ctx, *conn, *resource_box, *stream_box, *egl_frame, *dpy, *egl_stream, *frame_type;
    int use_counter;
    if (!PyArg_ParseTuple(args, "OOOOOOOpO!:_bind", &ctx, &conn, &resource_box, &stream_box, &egl_frame, &dpy,
                          &egl_stream, &use_counter, &PyType_Type, &frame_type))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject *)frame_type, &AcquiredCoreType)) {
        PyErr_SetString(PyExc_TypeError, "the frame type must derive from AcquiredCore");
        return NULL;
    }
    if (read_address(ctx, &self->ctx) < 0 || read_address(conn, &self->conn) < 0
        || read_address(resource_box, &self->resource_box) < 0 || read_address(stream_box, &self->stream_box) < 0
        || read_address(egl_frame, &self->egl_frame) < 0 || read_address(dpy, &self->dpy) < 0
        || read_address(egl_stream, &self->egl_stream) < 0)
        return NULL;
    self->use_counter = (char)use_counter;
    Py_XSETREF(self->frame_type, (PyTypeObject *)Py_NewRef(frame_type));
    self->connected = 1;
    Py_RETURN_NONE;
}

/* The stream's producer connected in this process: its present counts can stand in for the EGL
 * frame counter query (derive_plan). */
static PyObject *consumer_link_producer(ConsumerCore *self, PyObject *args)
{
    PyObject *producer;
    int fifo;
    if (!PyArg_ParseTuple(args, "O!p:_link_producer", &ProducerCoreType, &producer, &fifo))
        return NULL;
    gate_enter(&self->gate);
    Py_XSETREF(self->producer, (ProducerCore *)Py_NewRef(producer));
    self->fifo = (char)fifo;
    gate_leave(&self->gate);
    Py_RETURN_NONE;
}

/* ---- frame numbers without asking EGL ------------------------------------------------------
 * An acquired frame's number, and whether it is new or the previous frame handed back again, come
 * from the stream's consumer frame counter: an EGL query that costs about as much as the acquire
 * itself (docs/benchmarks.md). When the stream's producer is a CudaProducer in this process, its
 * present counts (read and written with the GIL held) usually settle both without EGL. The frame
 * of the producer's n-th present has number base + n; so the frame latched last is present
 * number L = last_number - base, and if more than L presents are done when an acquire begins, a
 * newer frame is waiting and this acquire latches a new frame:
 * - FIFO: no frame is ever dropped, so it is the one after the previous: last_number + 1.
 * - Mailbox: it is the newest, base + frames_presented, provided no present was under way when
 *   the acquire began, nor began during it.
 * Every other case asks EGL, as does a consumer whose producer is in another process. base is
 * read from EGL once: FIFO's first frame is present 1; a mailbox acquire with no present under
 * way latches present frames_presented. */
static int derive_plan(ConsumerCore *self, long long *started, long long *done)
{
    ProducerCore *producer = self->producer;
    if (producer == NULL)
        return 0;
    *started = producer->presents_started;
    *done = producer->frames_presented;
    if (!self->use_counter || self->derive_off || !self->base_known || !self->last_latched)
        return 0;
    long long latched = (long long)(self->last_number - self->base);
    if (*done <= latched)
        return 0; /* nothing newer is certainly there: the driver may hand back the old frame */
    if (self->fifo)
        return 1;
    return *started == *done ? 2 : 0;
}

/* EGL gave the number (value) of a frame just latched: measure base, or check it and FIFO's rule
 * (turning derivation off for good if either fails). */
static void learn_numbering(ConsumerCore *self, uint64_t value, long long started, long long done)
{
    if (self->fifo) {
        if (!self->has_last && !self->base_known) {
            self->base = value - 1;
            self->base_known = 1;
        } else if (self->has_last && value != self->last_number && value != self->last_number + 1) {
            self->derive_off = 1;
        }
    } else if (started == done && done > 0 && self->producer->presents_started == started) {
        if (!self->base_known) {
            self->base = value - (uint64_t)done;
            self->base_known = 1;
        } else if (value != self->base + (uint64_t)done) {
            self->derive_off = 1;
        }
    }
}

/* Read the consumer frame counter now (the acquire is done; the gate keeps others out).
 * 1: *value read; 0: the query failed and frame numbers are now off; -1: an exception. */
static int ask_counter(ConsumerCore *self, uint64_t *value)
{
    int status;
    Py_BEGIN_ALLOW_THREADS
    status = driver.counter(self->dpy, self->egl_stream, value);
    Py_END_ALLOW_THREADS
    if (status == 0)
        return 1;
    PyObject *done = PyObject_CallMethodNoArgs((PyObject *)self, s_counter_failed);
    if (done == NULL)
        return -1;
    Py_DECREF(done);
    return 0;
}

/* Mark the held frame released and stop holding it (its caller or the spares still refer to it).
 * Returns its planes cache (a reference for the caller to drop after leaving the gate: dropping
 * planes can run weak reference callbacks): a released frame's planes are unusable, and the
 * cache refers to planes that refer back to the frame, which would keep it from being reused. */
static PyObject *let_go_of_held(ConsumerCore *self)
{
    AcquiredCore *held = (AcquiredCore *)self->held;
    PyObject *planes = held->planes_cache;
    held->planes_cache = NULL;
    held->released = 1;
    Py_CLEAR(self->held);
    return planes;
}

/* Mark disconnected; a held frame counts as released from here on. */
static PyObject *consumer_shut(ConsumerCore *self, PyObject *unused)
{
    gate_enter(&self->gate);
    self->connected = 0;
    PyObject *planes = self->held != NULL ? let_go_of_held(self) : NULL;
    PyObject *spares[SPARE_FRAMES];
    for (int i = 0; i < SPARE_FRAMES; i++) {
        spares[i] = self->spares[i];
        self->spares[i] = NULL;
    }
    gate_leave(&self->gate);
    /* Dropped outside the gate: a weak reference callback could call into this consumer. */
    Py_XDECREF(planes);
    for (int i = 0; i < SPARE_FRAMES; i++)
        Py_XDECREF(spares[i]);
    Py_RETURN_NONE;
}

/* The object for a frame just acquired (a new reference). A frame made earlier is reused when
 * nothing can tell: only this consumer refers to it (the caller dropped it after release), no weak
 * reference, no planes built, the same type; every field is then set afresh. Otherwise a new one
 * takes the place of the oldest spare, which is handed back in *evicted for the caller to drop
 * after leaving the gate (its weak reference callbacks could call into this consumer). */
static AcquiredCore *reuse_or_make_frame(ConsumerCore *self, PyObject **evicted)
{
    for (int i = 0; i < SPARE_FRAMES; i++) {
        AcquiredCore *frame = (AcquiredCore *)self->spares[i];
        if (frame != NULL && Py_REFCNT(frame) == 1 && frame->weakrefs == NULL && frame->planes_cache == NULL
            && Py_TYPE(frame) == self->frame_type) {
            frame->released = 0;
            return (AcquiredCore *)Py_NewRef((PyObject *)frame);
        }
    }
    AcquiredCore *frame = (AcquiredCore *)self->frame_type->tp_alloc(self->frame_type, 0);
    if (frame == NULL)
        return NULL;
    frame->consumer = Py_NewRef((PyObject *)self);
    int slot = self->spare_next;
    self->spare_next = (slot + 1) % SPARE_FRAMES;
    *evicted = self->spares[slot];
    self->spares[slot] = Py_NewRef((PyObject *)frame);
    return frame;
}

/* acquire / acquire_next inside the gate; with release_held, a held frame is released first
 * (in the same call into the driver layer). */
static PyObject *acquire_locked(ConsumerCore *self, unsigned long long timeout_us, int release_held,
                                PyObject **evicted, PyObject **planes)
{
    PyObject *self_obj = (PyObject *)self;
    if (!self->producer_seen) {
        /* Until a producer connects, acquire must not reach the driver (see _wait_for_producer). */
        PyObject *us = PyLong_FromUnsignedLongLong(timeout_us);
        if (us == NULL)
            return NULL;
        PyObject *left = PyObject_CallMethodOneArg(self_obj, s_wait_for_producer, us);
        Py_DECREF(us);
        if (left == NULL)
            return NULL;
        timeout_us = PyLong_AsUnsignedLongLong(left);
        Py_DECREF(left);
        if (PyErr_Occurred())
            return NULL;
    }
    long long started = 0, done = 0;
    int derive = derive_plan(self, &started, &done);
    void *dpy = (self->use_counter && !derive) ? self->dpy : NULL;
    unsigned int wait_us = (unsigned int)timeout_us;
    int status;
    if (release_held && self->held != NULL) {
        void *held_resource = self->held_resource;
        *planes = let_go_of_held(self); /* the stream owns it from here on */
        Py_BEGIN_ALLOW_THREADS
        status = driver.next(self->ctx, self->conn, held_resource, self->resource_box, self->stream_box, wait_us,
                             self->egl_frame, dpy, self->egl_stream, &self->counter, &self->failed_call);
        Py_END_ALLOW_THREADS
    } else {
        Py_BEGIN_ALLOW_THREADS
        status = driver.acquire(self->ctx, self->conn, self->resource_box, self->stream_box, wait_us, self->egl_frame,
                                dpy, self->egl_stream, &self->counter, &self->failed_call);
        Py_END_ALLOW_THREADS
    }
    if (status) {
        self->last_latched = 0;
        if (self->failed_call == CALL_MAP) /* a frame latched but not mapped: numbering lost */
            self->derive_off = 1;
        if (self->failed_call == CALL_COUNTER) {
            /* The frame is acquired and mapped; only the counter query failed: go on without it. */
            PyObject *done = PyObject_CallMethodNoArgs(self_obj, s_counter_failed);
            if (done == NULL)
                return NULL;
            Py_DECREF(done);
        } else if (self->failed_call == CALL_RELEASE) {
            return raise_status(self_obj, s_release_failed, status, 0, 0, 0);
        } else {
            return raise_status(self_obj, s_acquire_failed, status, 2, self->failed_call, (long long)timeout_us);
        }
    }
    self->held_resource = *(void **)self->resource_box;
    uint64_t value = self->counter;
    if (derive == 2 && self->producer->presents_started != started) {
        /* A present began during the acquire: the newest frame may be that one. */
        derive = 0;
        if (ask_counter(self, &value) < 0)
            return NULL;
    }
    if (derive == 1) {
        value = self->last_number + 1;
    } else if (derive == 2) {
        value = self->base + (uint64_t)done;
    } else if (self->use_counter && self->producer != NULL) {
        learn_numbering(self, value, started, done);
    }
    int fresh = 0;
    if (self->use_counter) {
        fresh = derive || !self->has_last || value != self->last_number;
        self->numbers_derived += derive != 0;
        self->has_last = 1;
        self->last_latched = 1;
        self->last_number = value;
        if (!fresh) {
            /* A frame handed out again: maybe because the producer is gone (the subclass checks,
             * and releases and raises if so). */
            PyObject *number = PyLong_FromUnsignedLongLong(value);
            if (number == NULL)
                return NULL;
            PyObject *checked = PyObject_CallMethodOneArg(self_obj, s_check_disconnected, number);
            Py_DECREF(number);
            if (checked == NULL)
                return NULL;
            Py_DECREF(checked);
        }
    }
    AcquiredCore *frame = reuse_or_make_frame(self, evicted);
    if (frame == NULL)
        return NULL;
    frame->numbered = self->use_counter;
    frame->number = value;
    frame->is_new = (char)fresh;
    self->held = Py_NewRef((PyObject *)frame);
    self->frames_acquired++;
    return (PyObject *)frame;
}

static const char *const acquire_names[] = {"timeout_us"};
#define DEFAULT_ACQUIRE_TIMEOUT_US 1000000ull

static PyObject *consumer_acquire_common(ConsumerCore *self, PyObject *const *args, Py_ssize_t nargs,
                                         PyObject *kwnames, const char *function, int next)
{
    PyObject *arg[1] = {NULL};
    unsigned long long timeout_us = DEFAULT_ACQUIRE_TIMEOUT_US;
    if (parse_args(function, args, nargs, kwnames, acquire_names, 1, 0, arg) < 0 || !bound())
        return NULL;
    if (arg[0] != NULL && read_timeout((PyObject *)self, arg[0], &timeout_us) < 0)
        return NULL;
    PyObject *result = NULL, *evicted = NULL, *planes = NULL;
    gate_enter(&self->gate);
    if (!self->connected)
        raise_via((PyObject *)self, s_fail_closed, NULL, NULL, NULL);
    else if (!next && self->held != NULL)
        raise_via((PyObject *)self, s_fail_held, NULL, NULL, NULL);
    else
        result = acquire_locked(self, timeout_us, next, &evicted, &planes);
    gate_leave(&self->gate);
    Py_XDECREF(evicted); /* after the gate: see reuse_or_make_frame */
    Py_XDECREF(planes);
    return result;
}

static PyObject *consumer_acquire(ConsumerCore *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    return consumer_acquire_common(self, args, nargs, kwnames, "acquire", 0);
}

static PyObject *consumer_acquire_next(ConsumerCore *self, PyObject *const *args, Py_ssize_t nargs,
                                       PyObject *kwnames)
{
    return consumer_acquire_common(self, args, nargs, kwnames, "acquire_next", 1);
}

static PyObject *consumer_release_frame(PyObject *consumer, PyObject *frame)
{
    ConsumerCore *self = (ConsumerCore *)consumer;
    if (!bound())
        return NULL;
    PyObject *result = NULL, *planes = NULL;
    gate_enter(&self->gate);
    if (frame != self->held) {
        int released = PyObject_TypeCheck(frame, &AcquiredCoreType) && ((AcquiredCore *)frame)->released;
        raise_via(consumer, released ? s_fail_released : s_fail_foreign, NULL, NULL, NULL);
    } else {
        planes = let_go_of_held(self);
        int status;
        Py_BEGIN_ALLOW_THREADS
        status = driver.release(self->ctx, self->conn, self->held_resource, self->stream_box);
        Py_END_ALLOW_THREADS
        if (status)
            raise_status(consumer, s_release_failed, status, 0, 0, 0);
        else
            result = Py_NewRef(Py_None);
    }
    gate_leave(&self->gate);
    Py_XDECREF(planes); /* after the gate: see let_go_of_held */
    return result;
}

static PyMethodDef consumer_methods[] = {
    {"acquire", (PyCFunction)(void (*)(void))consumer_acquire, METH_FASTCALL | METH_KEYWORDS,
     "acquire(timeout_us=1000000)\n--\n\n"
     "Acquire the next frame, waiting up to ``timeout_us`` microseconds for a new one.\n\n"
     "If none arrives in time but the stream holds an earlier frame, the driver hands that one\n"
     "back again: the result's ``is_new`` is False. With no frame at all, raises\n"
     ":class:`Timeout`; once the producer is gone, :class:`StreamDisconnected`. The wait\n"
     "releases the GIL."},
    {"acquire_next", (PyCFunction)(void (*)(void))consumer_acquire_next, METH_FASTCALL | METH_KEYWORDS,
     "acquire_next(timeout_us=1000000)\n--\n\n"
     "Release the frame this consumer holds (if any), then :meth:`acquire` the next one, in a\n"
     "single call into the driver layer: the step of a consumer loop, cheaper than\n"
     "``release()`` + ``acquire()``. The released frame is unusable afterwards, as after\n"
     ":meth:`AcquiredFrame.release`."},
    {"_release", (PyCFunction)consumer_release_frame, METH_O, "Release ``frame`` (AcquiredFrame.release)."},
    {"_bind", (PyCFunction)consumer_bind, METH_VARARGS, "Set the connection's handles (addresses)."},
    {"_shut", (PyCFunction)consumer_shut, METH_NOARGS, "Mark the consumer disconnected, inside its gate."},
    {"_link_producer", (PyCFunction)consumer_link_producer, METH_VARARGS,
     "_link_producer(producer, fifo): the stream's producer, in this process (frame numbers without EGL)."},
    {NULL}};

static PyMemberDef consumer_members[] = {
    {"frames_acquired", T_LONGLONG, offsetof(ConsumerCore, frames_acquired), READONLY,
     "Frames this consumer acquired."},
    {"_held", T_OBJECT, offsetof(ConsumerCore, held), READONLY, NULL},
    {"_connected", T_BOOL, offsetof(ConsumerCore, connected), 0, NULL},
    {"_use_counter", T_BOOL, offsetof(ConsumerCore, use_counter), 0, NULL},
    {"_producer_seen", T_BOOL, offsetof(ConsumerCore, producer_seen), 0, NULL},
    {"_numbers_derived", T_LONGLONG, offsetof(ConsumerCore, numbers_derived), READONLY, NULL},
    {"_derive_off", T_BOOL, offsetof(ConsumerCore, derive_off), READONLY, NULL},
    {NULL}};

static PyTypeObject ConsumerCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "eglcuda._hotpath.ConsumerCore",
    .tp_doc = "Per-frame state and calls of a CUDA stream consumer (base of eglcuda.CudaConsumer).",
    .tp_basicsize = sizeof(ConsumerCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = consumer_new,
    .tp_dealloc = (destructor)consumer_dealloc,
    .tp_traverse = (traverseproc)consumer_traverse,
    .tp_clear = (inquiry)consumer_clear,
    .tp_methods = consumer_methods,
    .tp_members = consumer_members,
};

/* ==== module ================================================================================== */

static PyObject *module_bind(PyObject *module, PyObject *addresses)
{
    void *slots[7];
    if (!PyTuple_Check(addresses) || PyTuple_GET_SIZE(addresses) != 7) {
        PyErr_SetString(PyExc_TypeError, "bind() takes a tuple of the 7 helper addresses");
        return NULL;
    }
    for (int i = 0; i < 7; i++) {
        if (read_address(PyTuple_GET_ITEM(addresses, i), &slots[i]) < 0)
            return NULL;
        if (slots[i] == NULL) {
            PyErr_SetString(PyExc_ValueError, "bind(): a helper address is NULL");
            return NULL;
        }
    }
    driver.present = (present_fn)slots[0];
    driver.return_frame = (return_fn)slots[1];
    driver.present_return = (present_return_fn)slots[2];
    driver.acquire = (acquire_fn)slots[3];
    driver.next = (next_fn)slots[4];
    driver.release = (release_fn)slots[5];
    driver.counter = (counter_fn)slots[6];
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"bind", module_bind, METH_O,
     "bind((present, return, present_return, acquire, next, release, counter))\n--\n\n"
     "The addresses of eglcuda._native's per-frame helpers (csrc/helpers.c), in that order."},
    {NULL}};

static struct PyModuleDef hotpath_module = {
    PyModuleDef_HEAD_INIT, "eglcuda._hotpath",
    "The per-frame calls of eglcuda's CUDA stream endpoints, in C (see csrc/hotpath.c).", -1, module_methods,
};

static int intern_names(void)
{
    struct { PyObject **slot; const char *name; } names[] = {
        {&s_key, "key"}, {&s_egl_address, "_egl_address"}, {&s_check_frame, "_check_frame"},
        {&s_stream_handle, "_stream_handle"}, {&s_present_failed, "_present_failed"},
        {&s_first_present, "_first_present"}, {&s_return_failed, "_return_failed"},
        {&s_returned_unknown, "_returned_unknown"}, {&s_fail_closed, "_fail_closed"}, {&s_timeout, "_timeout"},
        {&s_fail_held, "_fail_held"}, {&s_wait_for_producer, "_wait_for_producer"},
        {&s_counter_failed, "_counter_failed"}, {&s_release_failed, "_release_failed"},
        {&s_acquire_failed, "_acquire_failed"}, {&s_check_disconnected, "_check_disconnected"},
        {&s_fail_released, "_fail_released"}, {&s_fail_foreign, "_fail_foreign"},
    };
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        *names[i].slot = PyUnicode_InternFromString(names[i].name);
        if (*names[i].slot == NULL)
            return -1;
    }
    return 0;
}

PyMODINIT_FUNC PyInit__hotpath(void)
{
    if (intern_names() < 0 || PyType_Ready(&ProducerCoreType) < 0 || PyType_Ready(&ConsumerCoreType) < 0
        || PyType_Ready(&AcquiredCoreType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&hotpath_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "ProducerCore", (PyObject *)&ProducerCoreType) < 0
        || PyModule_AddObjectRef(module, "ConsumerCore", (PyObject *)&ConsumerCoreType) < 0
        || PyModule_AddObjectRef(module, "AcquiredCore", (PyObject *)&AcquiredCoreType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
