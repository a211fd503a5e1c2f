/* A fake libEGL for testing eglcuda without a GPU: the EGL device platform with CUDA devices
 * (EGL_EXT_device_*, EGL_NV_device_cuda) and EGLStreams (EGL_KHR_stream, _fifo,
 * _cross_process_fd within one process, EGL_NV_stream_reset's reuse attribute). It also holds the
 * state libfake_cuda.so shares (fake_common.h): the lock, call counts, fault injection, the
 * stream model, and the test controls below. A test tool, not a driver: nothing is rendered, no
 * GL context can be made (eglChooseConfig finds no config).
 *
 * Built by the tests themselves (tests/fake/conftest.py, tests/fakes/build.py):
 *   gcc -shared -fPIC -pthread -Wl,-Bsymbolic -Wl,-soname,libfake_egl.so -o libfake_egl.so fake_egl.c
 * and loaded through eglcuda's test hook EGLCUDA_LIBEGL=/path/to/libfake_egl.so.
 *
 * ---- the EGLStream model ---------------------------------------------------------------------
 * Written after NVIDIA's EGLStream as the CUDA/EGL interop guide (section 4.1) and eglcuda's
 * measurements on NVIDIA GPUs (docs/platforms.md) describe it; every frame a stream knows is one struct
 * fake_frame, in present order, with a status (fake_common.h):
 *   present    -> PENDING. Mailbox (FIFO length 0): an older PENDING frame is dropped (RETURNABLE).
 *                 Every older LATCHED frame becomes RETURNABLE (it is no longer the newest).
 *                 FIFO: a present into a full FIFO (FIFO length PENDING frames) waits for room
 *                 (see FAKE_FIFO_WAIT_MS in fake_cuda.c), it never drops.
 *   acquire    -> the oldest PENDING frame (FIFO) or the only one (mailbox) becomes HELD and
 *                 EGL_CONSUMER_FRAME_KHR its number. With none, wait up to the timeout; then, with
 *                 reuse on (EGL_SUPPORT_REUSE_NV, the default), the newest frame if it is LATCHED
 *                 is re-acquired (the same frame, the counter unchanged); else the acquire fails.
 *                 A consumer may hold several frames (the real driver's rule is not known here).
 *   release    -> HELD -> LATCHED when it is the newest and reuse is on, else RETURNABLE.
 *   return     -> the oldest RETURNABLE frame is handed back and forgotten; with none, the call
 *                 waits about 1 ms (as the real driver does) and fails with
 *                 CUDA_ERROR_LAUNCH_TIMEOUT (702). So the first return after the first present
 *                 gives 702: the stream keeps its newest frame.
 *   producer disconnect -> state DISCONNECTED for good; PENDING and RETURNABLE frames are
 *                 forgotten; the consumer keeps its HELD/LATCHED frame (an acquire re-acquires it
 *                 at once instead of waiting).
 *   consumer disconnect -> state DISCONNECTED; every frame the consumer had or would have got is
 *                 LOST: ReturnFrame answers 702 for ever (RETURNABLE ones still come back).
 * States: CREATED (no consumer) -> CONNECTING (consumer, no producer) -> EMPTY (both, no frame) ->
 * NEW_FRAME_AVAILABLE (a PENDING frame) / OLD_FRAME_AVAILABLE (none pending, a frame held or
 * latched) -> DISCONNECTED (an endpoint left, or the last handle was destroyed).
 * Frame numbers start at FAKE_EGL_FRAME_BASE + 1 (environment, default 0).
 *
 * Cross-process: eglGetStreamFileDescriptorKHR hands out a memfd and
 * eglCreateStreamFromFileDescriptorKHR opens the stream behind it IN THIS PROCESS only (a second
 * handle on the same stream, e.g. on another fake device's display). A descriptor from another
 * process fails with EGL_BAD_STREAM_KHR: frame memory is this process's malloc memory.
 *
 * ---- test controls (exported, called through ctypes) -----------------------------------------
 *   int fake_fail(const char *name, int nth, int code)
 *       The nth next call of `name` (1 = the very next) fails with `code`: a CUresult for CUDA
 *       calls; for EGL calls the failure value (EGL_FALSE, NULL, -1) with eglGetError() == code.
 *       nth == 0: every call fails until fake_reset(); nth < 0: disarm. The failing call does
 *       nothing else. Returns 0. Also from the environment: FAKE_FAIL="name:nth:code,...".
 *   unsigned long long fake_calls(const char *name)   calls of `name` since load or fake_reset
 *   void fake_reset(void)          disarm every fault, zero the call counts and the misuse log
 *   int fake_misuse_count(void)    driver misuse seen (bad handles, double frees, out-of-bounds)
 *   const char *fake_misuse_first(void), *fake_misuse_last(void)
 *   long fake_egl_count(const char *what)   "streams", "stream_handles", "connections", "frames",
 *       "held" (frames acquired and not released), "terminated_handles"
 *   (libfake_cuda.so adds fake_live_allocations() and fake_cuda_count().)
 * FAKE_TRACE=1 in the environment traces every call and misuse to stderr.
 */
#define _GNU_SOURCE
#include "fake_common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- the lock and the wake-up ------------------------------------------------------------- */
static pthread_mutex_t big_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake;
static int tracing;

FAKE_EXPORT void fake__lock(void) { pthread_mutex_lock(&big_lock); }
FAKE_EXPORT void fake__unlock(void) { pthread_mutex_unlock(&big_lock); }
FAKE_EXPORT void fake__wake_all(void) { pthread_cond_broadcast(&wake); }

FAKE_EXPORT long long fake__now_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000000000ll + now.tv_nsec;
}

FAKE_EXPORT int fake__wait_until(long long deadline_ns)
{
    struct timespec until = {deadline_ns / 1000000000ll, deadline_ns % 1000000000ll};
    return pthread_cond_timedwait(&wake, &big_lock, &until) == ETIMEDOUT;
}

/* ---- call counts, faults, misuse ---------------------------------------------------------- */
#define MAX_SLOTS 256

struct slot {
    char name[64];
    unsigned long long calls; /* atomic */
    int fail_nth;             /* calls to go until the failing one (0: none armed) */
    int fail_always;
    int fail_code;
};

static pthread_mutex_t slot_lock = PTHREAD_MUTEX_INITIALIZER;
static struct slot slots[MAX_SLOTS];
static int slot_count;  /* written under slot_lock, read atomically */
static int armed;       /* slots with a fault armed (atomic read on the fast path) */
static int misuse_count;
static char misuse_first[512], misuse_last[512];

static int find_slot_locked(const char *name)
{
    for (int i = 0; i < slot_count; i++)
        if (strcmp(slots[i].name, name) == 0)
            return i;
    if (slot_count == MAX_SLOTS || strlen(name) >= sizeof(slots[0].name))
        return -1;
    snprintf(slots[slot_count].name, sizeof(slots[0].name), "%s", name);
    __atomic_store_n(&slot_count, slot_count + 1, __ATOMIC_RELEASE);
    return slot_count - 1;
}

FAKE_EXPORT int fake__slot(const char *name)
{
    pthread_mutex_lock(&slot_lock);
    int slot = find_slot_locked(name);
    pthread_mutex_unlock(&slot_lock);
    return slot;
}

FAKE_EXPORT int fake__enter(int slot)
{
    if (slot < 0)
        return 0;
    __atomic_add_fetch(&slots[slot].calls, 1, __ATOMIC_RELAXED);
    if (!__atomic_load_n(&armed, __ATOMIC_ACQUIRE))
        return 0;
    int code = 0;
    pthread_mutex_lock(&slot_lock);
    struct slot *s = &slots[slot];
    if (s->fail_always) {
        code = s->fail_code;
    } else if (s->fail_nth > 0 && --s->fail_nth == 0) {
        code = s->fail_code;
        armed--;
    }
    pthread_mutex_unlock(&slot_lock);
    return code;
}

FAKE_EXPORT void fake__trace(const char *fmt, ...)
{
    if (!tracing)
        return;
    va_list args;
    va_start(args, fmt);
    fputs("[fake] ", stderr);
    vfprintf(stderr, fmt, args);
    fputc('\n', stderr);
    va_end(args);
}

FAKE_EXPORT void fake__misuse(const char *fmt, ...)
{
    char text[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(text, sizeof(text), fmt, args);
    va_end(args);
    pthread_mutex_lock(&slot_lock);
    if (misuse_count++ == 0)
        snprintf(misuse_first, sizeof(misuse_first), "%s", text);
    snprintf(misuse_last, sizeof(misuse_last), "%s", text);
    pthread_mutex_unlock(&slot_lock);
    if (tracing)
        fprintf(stderr, "[fake] MISUSE: %s\n", text);
}

FAKE_EXPORT int fake_fail(const char *name, int nth, int code)
{
    pthread_mutex_lock(&slot_lock);
    int slot = find_slot_locked(name);
    if (slot >= 0) {
        struct slot *s = &slots[slot];
        if (s->fail_always || s->fail_nth > 0)
            armed--;
        s->fail_always = nth == 0;
        s->fail_nth = nth > 0 ? nth : 0;
        s->fail_code = code;
        if (nth >= 0)
            armed++;
    }
    pthread_mutex_unlock(&slot_lock);
    return slot >= 0 ? 0 : -1;
}

FAKE_EXPORT unsigned long long fake_calls(const char *name)
{
    pthread_mutex_lock(&slot_lock);
    int slot = find_slot_locked(name);
    pthread_mutex_unlock(&slot_lock);
    return slot >= 0 ? __atomic_load_n(&slots[slot].calls, __ATOMIC_RELAXED) : 0;
}

FAKE_EXPORT void fake_reset(void)
{
    pthread_mutex_lock(&slot_lock);
    for (int i = 0; i < slot_count; i++) {
        slots[i].fail_nth = slots[i].fail_always = 0;
        __atomic_store_n(&slots[i].calls, 0, __ATOMIC_RELAXED);
    }
    armed = 0;
    misuse_count = 0;
    misuse_first[0] = misuse_last[0] = '\0';
    pthread_mutex_unlock(&slot_lock);
}

FAKE_EXPORT int fake_misuse_count(void)
{
    pthread_mutex_lock(&slot_lock);
    int count = misuse_count;
    pthread_mutex_unlock(&slot_lock);
    return count;
}

FAKE_EXPORT const char *fake_misuse_first(void) { return misuse_first; }
FAKE_EXPORT const char *fake_misuse_last(void) { return misuse_last; }

/* ---- devices and displays ----------------------------------------------------------------- */
#define MAX_DEVICES 4

struct fake_device {
    unsigned int magic;
    int cuda_ordinal;
};

struct fake_display {
    unsigned int magic;
    int index;
    int initialized;
};

#define MAGIC_DEVICE 0x44455643u
#define MAGIC_DISPLAY 0x4450594Cu
#define MAGIC_HANDLE 0x48444C45u

static int device_count = 1;
static uint64_t frame_base;
static struct fake_device devices[MAX_DEVICES];
static struct fake_display displays[MAX_DEVICES];
static __thread EGLint last_error = EGL_SUCCESS;
static __thread EGLenum bound_api = EGL_OPENGL_ES_API;

FAKE_EXPORT int fake__device_count(void) { return device_count; }

static void parse_faults(const char *spec)
{
    char *copy = strdup(spec), *save = NULL;
    for (char *item = strtok_r(copy, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        char name[64];
        int nth, code;
        if (sscanf(item, "%63[^:]:%d:%i", name, &nth, &code) == 3)
            fake_fail(name, nth, code);
        else
            fprintf(stderr, "[fake] FAKE_FAIL: cannot read '%s' (name:nth:code)\n", item);
    }
    free(copy);
}

__attribute__((constructor)) static void fake_egl_load(void)
{
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&wake, &attr);
    pthread_condattr_destroy(&attr);
    const char *value = getenv("FAKE_TRACE");
    tracing = value && *value && strcmp(value, "0") != 0;
    value = getenv("FAKE_CUDA_DEVICE_COUNT");
    if (value && atoi(value) >= 1)
        device_count = atoi(value) > MAX_DEVICES ? MAX_DEVICES : atoi(value);
    value = getenv("FAKE_EGL_FRAME_BASE");
    if (value)
        frame_base = strtoull(value, NULL, 0);
    /* EGL lists devices in another order than CUDA on multi-GPU hosts (docs/platforms.md): so here. */
    for (int i = 0; i < MAX_DEVICES; i++) {
        devices[i].magic = MAGIC_DEVICE;
        devices[i].cuda_ordinal = device_count - 1 - i;
        displays[i].magic = MAGIC_DISPLAY;
        displays[i].index = i;
    }
    value = getenv("FAKE_FAIL");
    if (value && *value)
        parse_faults(value);
}

static EGLBoolean fail_egl(EGLint code)
{
    last_error = code;
    return EGL_FALSE;
}

static struct fake_device *device_of(EGLDeviceEXT handle)
{
    for (int i = 0; i < device_count; i++)
        if (handle == (EGLDeviceEXT)&devices[i])
            return &devices[i];
    return NULL;
}

static struct fake_display *display_of(EGLDisplay dpy)
{
    for (int i = 0; i < device_count; i++)
        if (dpy == (EGLDisplay)&displays[i])
            return &displays[i];
    return NULL;
}

/* A display the caller may use: valid and initialized; sets the EGL error otherwise. */
static struct fake_display *ready_display(EGLDisplay dpy, const char *call)
{
    struct fake_display *display = display_of(dpy);
    if (display == NULL) {
        fake__misuse("%s: %p is not an EGLDisplay", call, dpy);
        last_error = EGL_BAD_DISPLAY;
        return NULL;
    }
    if (!display->initialized) {
        last_error = EGL_NOT_INITIALIZED;
        return NULL;
    }
    return display;
}

static const char CLIENT_EXTENSIONS[] =
    "EGL_EXT_client_extensions EGL_EXT_platform_base EGL_EXT_device_base EGL_EXT_device_enumeration "
    "EGL_EXT_device_query EGL_EXT_platform_device EGL_KHR_client_get_all_proc_addresses";
static const char DISPLAY_EXTENSIONS[] =
    "EGL_KHR_stream EGL_KHR_stream_fifo EGL_KHR_stream_cross_process_fd EGL_NV_stream_reset";
static const char DEVICE_EXTENSIONS[] = "EGL_NV_device_cuda EGL_EXT_device_query_name";
static const char VENDOR[] = "eglcuda fake driver";

FAKE_EXPORT EGLint eglGetError(void)
{
    EGLint error = last_error;
    last_error = EGL_SUCCESS;
    return error;
}

FAKE_EXPORT const char *eglQueryString(EGLDisplay dpy, EGLint name)
{
    FAKE_ENTER("eglQueryString", last_error = fake_fault_; return NULL);
    if (dpy == NULL) {
        if (name == EGL_EXTENSIONS)
            return CLIENT_EXTENSIONS;
        if (name == EGL_VERSION)
            return "1.5 eglcuda-fake";
        last_error = EGL_BAD_DISPLAY;
        return NULL;
    }
    if (ready_display(dpy, "eglQueryString") == NULL)
        return NULL;
    switch (name) {
    case EGL_VENDOR: return VENDOR;
    case EGL_VERSION: return "1.5 eglcuda-fake";
    case EGL_EXTENSIONS: return DISPLAY_EXTENSIONS;
    case EGL_CLIENT_APIS: return "OpenGL OpenGL_ES";
    default: last_error = EGL_BAD_PARAMETER; return NULL;
    }
}

FAKE_EXPORT EGLDisplay eglGetPlatformDisplay(EGLenum platform, void *native, const EGLAttrib *attribs)
{
    FAKE_ENTER("eglGetPlatformDisplay", last_error = fake_fault_; return NULL);
    if (platform != EGL_PLATFORM_DEVICE_EXT) {
        last_error = EGL_BAD_PARAMETER;
        return NULL;
    }
    struct fake_device *device = device_of(native);
    if (device == NULL) {
        fake__misuse("eglGetPlatformDisplay: %p is not an EGLDeviceEXT", native);
        last_error = EGL_BAD_PARAMETER;
        return NULL;
    }
    if (attribs != NULL && attribs[0] != EGL_NONE) {
        last_error = EGL_BAD_ATTRIBUTE;
        return NULL;
    }
    return &displays[device - devices];
}

FAKE_EXPORT EGLBoolean eglInitialize(EGLDisplay dpy, EGLint *major, EGLint *minor)
{
    FAKE_ENTER("eglInitialize", return fail_egl(fake_fault_));
    struct fake_display *display = display_of(dpy);
    if (display == NULL)
        return fail_egl(EGL_BAD_DISPLAY);
    fake__lock();
    display->initialized = 1;
    fake__unlock();
    if (major)
        *major = 1;
    if (minor)
        *minor = 5;
    return EGL_TRUE;
}

/* ---- streams: handles and the shared state -------------------------------------------------- */
struct fake_handle {
    unsigned int magic;
    struct fake_handle *next;
    struct fake_display *display;
    struct fake_stream *stream;
};

static struct fake_handle *handles;       /* live EGLStreamKHR handles */
static struct fake_stream *streams;       /* live streams */
static struct fake_conn *connections;     /* live connections */
static long terminated_handles;

static struct fake_handle *handle_of(EGLStreamKHR handle)
{
    for (struct fake_handle *h = handles; h; h = h->next)
        if (h == handle)
            return h;
    return NULL;
}

static int next_stream_id;

FAKE_EXPORT struct fake_stream *fake__stream_from_handle(void *handle)
{
    struct fake_handle *h = handle_of(handle);
    return h ? h->stream : NULL;
}

FAKE_EXPORT int fake__stream_state(struct fake_stream *s)
{
    if (s->disconnected)
        return EGL_STREAM_STATE_DISCONNECTED_KHR;
    if (s->consumer == NULL)
        return EGL_STREAM_STATE_CREATED_KHR;
    if (s->producer == NULL)
        return EGL_STREAM_STATE_CONNECTING_KHR;
    int old = 0;
    for (struct fake_frame *f = s->frames; f; f = f->next) {
        if (f->status == FRAME_PENDING)
            return EGL_STREAM_STATE_NEW_FRAME_AVAILABLE_KHR;
        if (f->status == FRAME_HELD || f->status == FRAME_LATCHED)
            old = 1;
    }
    return old ? EGL_STREAM_STATE_OLD_FRAME_AVAILABLE_KHR : EGL_STREAM_STATE_EMPTY_KHR;
}

static void free_stream_if_unused(struct fake_stream *s)
{
    if (s->handles > 0 || s->consumer != NULL || s->producer != NULL)
        return;
    for (struct fake_stream **p = &streams; *p; p = &(*p)->next_stream)
        if (*p == s) {
            *p = s->next_stream;
            break;
        }
    while (s->frames)
        fake__frame_unlink(s->frames);
    s->magic = 0;
    free(s);
}

FAKE_EXPORT void fake__frame_unlink(struct fake_frame *frame)
{
    struct fake_stream *s = frame->stream;
    for (struct fake_frame **p = &s->frames; *p; p = &(*p)->next)
        if (*p == frame) {
            *p = frame->next;
            break;
        }
    frame->magic = 0;
    free(frame);
}

FAKE_EXPORT struct fake_frame *fake__frame_new(void) { return calloc(1, sizeof(struct fake_frame)); }

/* Every process has its own memory here: the fake libcuda allocates it. */
FAKE_EXPORT void *fake__shared_alloc(size_t size) { (void)size; return NULL; }
FAKE_EXPORT int fake__shared_contains(uintptr_t address, size_t length) { (void)address; (void)length; return 0; }

FAKE_EXPORT struct fake_frame *fake__frame_lookup(void *resource)
{
    for (struct fake_stream *s = streams; s; s = s->next_stream)
        for (struct fake_frame *f = s->frames; f; f = f->next)
            if (f == resource)
                return f;
    return NULL;
}

FAKE_EXPORT struct fake_conn *fake__conn_new(struct fake_stream *stream, int producer, void *context)
{
    struct fake_conn *conn = calloc(1, sizeof(*conn));
    if (conn == NULL)
        return NULL;
    conn->magic = FAKE_MAGIC_CONN;
    conn->stream = stream;
    conn->producer = producer;
    conn->context = context;
    conn->next_conn = connections;
    connections = conn;
    if (producer)
        stream->producer = conn;
    else
        stream->consumer = conn;
    return conn;
}

FAKE_EXPORT struct fake_conn *fake__conn_lookup(void *pointer)
{
    for (struct fake_conn *c = connections; c; c = c->next_conn)
        if (c == pointer)
            return c;
    return NULL;
}

/* The endpoint leaves: the stream is DISCONNECTED for good (see the model at the top). */
FAKE_EXPORT void fake__conn_free(struct fake_conn *conn)
{
    struct fake_stream *s = conn->stream;
    for (struct fake_conn **p = &connections; *p; p = &(*p)->next_conn)
        if (*p == conn) {
            *p = conn->next_conn;
            break;
        }
    s->disconnected = 1;
    if (conn->producer) {
        s->producer = NULL;
        struct fake_frame *f = s->frames, *next;
        for (; f; f = next) {
            next = f->next;
            if (f->status == FRAME_PENDING || f->status == FRAME_RETURNABLE || f->status == FRAME_LOST)
                fake__frame_unlink(f);
        }
    } else {
        s->consumer = NULL;
        for (struct fake_frame *f = s->frames; f; f = f->next)
            if (f->status != FRAME_RETURNABLE)
                f->status = FRAME_LOST;
    }
    conn->magic = 0;
    free(conn);
    fake__wake_all();
    free_stream_if_unused(s);
}

static void destroy_handle_locked(struct fake_handle *h)
{
    for (struct fake_handle **p = &handles; *p; p = &(*p)->next)
        if (*p == h) {
            *p = h->next;
            break;
        }
    struct fake_stream *s = h->stream;
    h->magic = 0;
    free(h);
    if (--s->handles == 0) {
        s->disconnected = 1;
        fake__wake_all();
    }
    free_stream_if_unused(s);
}

FAKE_EXPORT EGLBoolean eglTerminate(EGLDisplay dpy)
{
    FAKE_ENTER("eglTerminate", return fail_egl(fake_fault_));
    struct fake_display *display = display_of(dpy);
    if (display == NULL)
        return fail_egl(EGL_BAD_DISPLAY);
    fake__lock();
    display->initialized = 0;
    /* EGL frees what was made on the display; eglcuda should have closed its streams first. */
    struct fake_handle *h = handles, *next;
    for (; h; h = next) {
        next = h->next;
        if (h->display == display) {
            terminated_handles++;
            destroy_handle_locked(h);
        }
    }
    fake__unlock();
    return EGL_TRUE;
}

static struct fake_handle *new_handle_locked(struct fake_display *display, struct fake_stream *s)
{
    struct fake_handle *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return NULL;
    h->magic = MAGIC_HANDLE;
    h->display = display;
    h->stream = s;
    h->next = handles;
    handles = h;
    s->handles++;
    return h;
}

static EGLStreamKHR eglCreateStreamKHR(EGLDisplay dpy, const EGLint *attribs)
{
    FAKE_ENTER("eglCreateStreamKHR", last_error = fake_fault_; return NULL);
    fake__lock();
    struct fake_display *display = ready_display(dpy, "eglCreateStreamKHR");
    struct fake_stream *s = NULL;
    struct fake_handle *h = NULL;
    if (display == NULL)
        goto out;
    int fifo = 0, latency = 0, reuse = 1;
    for (const EGLint *a = attribs; a && a[0] != EGL_NONE; a += 2) {
        switch (a[0]) {
        case EGL_STREAM_FIFO_LENGTH_KHR: fifo = a[1]; break;
        case EGL_CONSUMER_LATENCY_USEC_KHR: latency = a[1]; break;
        case EGL_SUPPORT_REUSE_NV: reuse = a[1] != 0; break;
        case EGL_SUPPORT_RESET_NV: break;
        default: last_error = EGL_BAD_ATTRIBUTE; goto out; /* incl. the GL consumer's timeout */
        }
    }
    if (fifo < 0 || latency < 0) {
        last_error = EGL_BAD_PARAMETER;
        goto out;
    }
    s = calloc(1, sizeof(*s));
    if (s == NULL) {
        last_error = EGL_BAD_ALLOC;
        goto out;
    }
    s->magic = FAKE_MAGIC_STREAM;
    s->id = next_stream_id++;
    s->fifo_length = fifo;
    s->latency_us = latency;
    s->reuse = reuse;
    s->producer_frame = s->consumer_frame = frame_base;
    s->next_stream = streams;
    streams = s;
    h = new_handle_locked(display, s);
    if (h == NULL) {
        last_error = EGL_BAD_ALLOC;
        free_stream_if_unused(s);
    }
out:
    fake__unlock();
    return h;
}

/* The stream behind a handle of `dpy`; sets the EGL error otherwise. Lock held. */
static struct fake_handle *ready_handle(EGLDisplay dpy, EGLStreamKHR stream, const char *call)
{
    struct fake_display *display = ready_display(dpy, call);
    if (display == NULL)
        return NULL;
    struct fake_handle *h = handle_of(stream);
    if (h == NULL || h->display != display) {
        fake__misuse("%s: %p is not a stream of display %p", call, stream, dpy);
        last_error = EGL_BAD_STREAM_KHR;
        return NULL;
    }
    return h;
}

static EGLBoolean eglDestroyStreamKHR(EGLDisplay dpy, EGLStreamKHR stream)
{
    FAKE_ENTER("eglDestroyStreamKHR", return fail_egl(fake_fault_));
    fake__lock();
    struct fake_handle *h = ready_handle(dpy, stream, "eglDestroyStreamKHR");
    if (h)
        destroy_handle_locked(h);
    fake__unlock();
    return h != NULL;
}

static EGLBoolean eglStreamAttribKHR(EGLDisplay dpy, EGLStreamKHR stream, EGLenum attribute, EGLint value)
{
    FAKE_ENTER("eglStreamAttribKHR", return fail_egl(fake_fault_));
    EGLBoolean ok = EGL_FALSE;
    fake__lock();
    struct fake_handle *h = ready_handle(dpy, stream, "eglStreamAttribKHR");
    if (h == NULL)
        goto out;
    if (attribute != EGL_CONSUMER_LATENCY_USEC_KHR) {
        last_error = EGL_BAD_ATTRIBUTE; /* the others are fixed at creation */
    } else if (h->stream->disconnected) {
        last_error = EGL_BAD_STATE_KHR;
    } else if (value < 0) {
        last_error = EGL_BAD_PARAMETER;
    } else {
        h->stream->latency_us = value;
        ok = EGL_TRUE;
    }
out:
    fake__unlock();
    return ok;
}

static EGLBoolean eglQueryStreamKHR(EGLDisplay dpy, EGLStreamKHR stream, EGLenum attribute, EGLint *value)
{
    FAKE_ENTER("eglQueryStreamKHR", return fail_egl(fake_fault_));
    EGLBoolean ok = EGL_FALSE;
    fake__lock();
    struct fake_handle *h = ready_handle(dpy, stream, "eglQueryStreamKHR");
    if (h == NULL)
        goto out;
    if (value == NULL) {
        last_error = EGL_BAD_PARAMETER;
        goto out;
    }
    ok = EGL_TRUE;
    switch (attribute) {
    case EGL_STREAM_STATE_KHR: *value = fake__stream_state(h->stream); break;
    case EGL_STREAM_FIFO_LENGTH_KHR: *value = h->stream->fifo_length; break;
    case EGL_CONSUMER_LATENCY_USEC_KHR: *value = h->stream->latency_us; break;
    case EGL_SUPPORT_REUSE_NV: *value = h->stream->reuse; break;
    case EGL_SUPPORT_RESET_NV: *value = 0; break;
    default: ok = EGL_FALSE; last_error = EGL_BAD_ATTRIBUTE;
    }
out:
    fake__unlock();
    return ok;
}

static EGLBoolean eglQueryStreamu64KHR(EGLDisplay dpy, EGLStreamKHR stream, EGLenum attribute, EGLuint64KHR *value)
{
    FAKE_ENTER("eglQueryStreamu64KHR", return fail_egl(fake_fault_));
    EGLBoolean ok = EGL_FALSE;
    fake__lock();
    struct fake_handle *h = ready_handle(dpy, stream, "eglQueryStreamu64KHR");
    if (h == NULL)
        goto out;
    if (value == NULL) {
        last_error = EGL_BAD_PARAMETER;
    } else if (attribute == EGL_PRODUCER_FRAME_KHR) {
        *value = h->stream->producer_frame;
        ok = EGL_TRUE;
    } else if (attribute == EGL_CONSUMER_FRAME_KHR) {
        *value = h->stream->consumer_frame;
        ok = EGL_TRUE;
    } else {
        last_error = EGL_BAD_ATTRIBUTE;
    }
out:
    fake__unlock();
    return ok;
}

static EGLBoolean eglQueryStreamTimeKHR(EGLDisplay dpy, EGLStreamKHR stream, EGLenum attribute, EGLTimeKHR *value)
{
    FAKE_ENTER("eglQueryStreamTimeKHR", return fail_egl(fake_fault_));
    EGLBoolean ok = EGL_FALSE;
    fake__lock();
    if (ready_handle(dpy, stream, "eglQueryStreamTimeKHR") == NULL)
        goto out;
    if (attribute != EGL_STREAM_TIME_NOW_KHR && attribute != EGL_STREAM_TIME_CONSUMER_KHR &&
        attribute != EGL_STREAM_TIME_PRODUCER_KHR) {
        last_error = EGL_BAD_ATTRIBUTE;
    } else if (value == NULL) {
        last_error = EGL_BAD_PARAMETER;
    } else {
        *value = (EGLTimeKHR)fake__now_ns();
        ok = EGL_TRUE;
    }
out:
    fake__unlock();
    return ok;
}

static EGLNativeFileDescriptorKHR eglGetStreamFileDescriptorKHR(EGLDisplay dpy, EGLStreamKHR stream)
{
    FAKE_ENTER("eglGetStreamFileDescriptorKHR", last_error = fake_fault_; return -1);
    int fd = -1;
    fake__lock();
    struct fake_handle *h = ready_handle(dpy, stream, "eglGetStreamFileDescriptorKHR");
    if (h == NULL)
        goto out;
    struct fake_stream *s = h->stream;
    if (s->fd_exported || s->consumer || s->producer || s->disconnected) {
        last_error = EGL_BAD_STATE_KHR; /* once, and only before any endpoint connects */
        goto out;
    }
    fd = memfd_create("eglcuda-fake-stream", MFD_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0)
            close(fd);
        fd = -1;
        last_error = EGL_BAD_ALLOC;
        goto out;
    }
    s->fd_exported = 1;
    s->fd_dev = st.st_dev;
    s->fd_ino = st.st_ino;
out:
    fake__unlock();
    return fd;
}

static EGLStreamKHR eglCreateStreamFromFileDescriptorKHR(EGLDisplay dpy, EGLNativeFileDescriptorKHR fd)
{
    FAKE_ENTER("eglCreateStreamFromFileDescriptorKHR", last_error = fake_fault_; return NULL);
    struct fake_handle *h = NULL;
    struct stat st;
    fake__lock();
    struct fake_display *display = ready_display(dpy, "eglCreateStreamFromFileDescriptorKHR");
    if (display == NULL)
        goto out;
    if (fd < 0 || fstat(fd, &st) != 0) {
        last_error = EGL_BAD_PARAMETER;
        goto out;
    }
    for (struct fake_stream *s = streams; s; s = s->next_stream) {
        if (s->fd_exported && s->fd_dev == st.st_dev && s->fd_ino == st.st_ino && s->handles > 0) {
            h = new_handle_locked(display, s);
            if (h == NULL)
                last_error = EGL_BAD_ALLOC;
            goto out;
        }
    }
    last_error = EGL_BAD_STREAM_KHR; /* not a stream of this process (see the notes at the top) */
out:
    fake__unlock();
    return h;
}

static EGLBoolean eglResetStreamNV(EGLDisplay dpy, EGLStreamKHR stream)
{
    FAKE_ENTER("eglResetStreamNV", return fail_egl(fake_fault_));
    fake__lock();
    struct fake_handle *h = ready_handle(dpy, stream, "eglResetStreamNV");
    fake__unlock();
    /* EGL_SUPPORT_RESET_NV is never on here: the extension says EGL_BAD_ACCESS. */
    return fail_egl(h ? EGL_BAD_ACCESS : last_error);
}

/* ---- devices ------------------------------------------------------------------------------ */
static EGLBoolean eglQueryDevicesEXT(EGLint max_devices, EGLDeviceEXT *out, EGLint *num_devices)
{
    FAKE_ENTER("eglQueryDevicesEXT", return fail_egl(fake_fault_));
    if (num_devices == NULL || (out != NULL && max_devices <= 0))
        return fail_egl(EGL_BAD_PARAMETER);
    if (out == NULL) {
        *num_devices = device_count;
        return EGL_TRUE;
    }
    int n = max_devices < device_count ? max_devices : device_count;
    for (int i = 0; i < n; i++)
        out[i] = &devices[i];
    *num_devices = n;
    return EGL_TRUE;
}

static EGLBoolean eglQueryDeviceAttribEXT(EGLDeviceEXT handle, EGLint attribute, EGLAttrib *value)
{
    FAKE_ENTER("eglQueryDeviceAttribEXT", return fail_egl(fake_fault_));
    struct fake_device *device = device_of(handle);
    if (device == NULL)
        return fail_egl(EGL_BAD_DEVICE_EXT);
    if (attribute != EGL_CUDA_DEVICE_NV)
        return fail_egl(EGL_BAD_ATTRIBUTE);
    *value = device->cuda_ordinal;
    return EGL_TRUE;
}

static const char *eglQueryDeviceStringEXT(EGLDeviceEXT handle, EGLint name)
{
    FAKE_ENTER("eglQueryDeviceStringEXT", last_error = fake_fault_; return NULL);
    if (device_of(handle) == NULL) {
        last_error = EGL_BAD_DEVICE_EXT;
        return NULL;
    }
    if (name == EGL_EXTENSIONS)
        return DEVICE_EXTENSIONS;
    if (name == EGL_VENDOR)
        return VENDOR;
    last_error = EGL_BAD_PARAMETER;
    return NULL;
}

static EGLBoolean eglQueryDisplayAttribEXT(EGLDisplay dpy, EGLint attribute, EGLAttrib *value)
{
    FAKE_ENTER("eglQueryDisplayAttribEXT", return fail_egl(fake_fault_));
    struct fake_display *display = display_of(dpy);
    if (display == NULL)
        return fail_egl(EGL_BAD_DISPLAY);
    if (attribute != EGL_DEVICE_EXT)
        return fail_egl(EGL_BAD_ATTRIBUTE);
    *value = (EGLAttrib)&devices[display->index];
    return EGL_TRUE;
}

/* ---- the rest of EGL 1.5 core: no GL here ------------------------------------------------- */
FAKE_EXPORT EGLBoolean eglBindAPI(EGLenum api)
{
    FAKE_ENTER("eglBindAPI", return fail_egl(fake_fault_));
    if (api != EGL_OPENGL_API && api != EGL_OPENGL_ES_API)
        return fail_egl(EGL_BAD_PARAMETER);
    bound_api = api;
    return EGL_TRUE;
}

FAKE_EXPORT EGLenum eglQueryAPI(void) { return bound_api; }

FAKE_EXPORT EGLBoolean eglChooseConfig(EGLDisplay dpy, const EGLint *attribs, EGLConfig *configs, EGLint size,
                                       EGLint *count)
{
    (void)attribs, (void)configs, (void)size;
    FAKE_ENTER("eglChooseConfig", return fail_egl(fake_fault_));
    fake__lock();
    struct fake_display *display = ready_display(dpy, "eglChooseConfig");
    fake__unlock();
    if (display == NULL)
        return EGL_FALSE;
    if (count == NULL)
        return fail_egl(EGL_BAD_PARAMETER);
    *count = 0; /* no GL here */
    return EGL_TRUE;
}

FAKE_EXPORT EGLBoolean eglGetConfigAttrib(EGLDisplay dpy, EGLConfig config, EGLint attribute, EGLint *value)
{
    (void)dpy, (void)config, (void)attribute, (void)value;
    return fail_egl(EGL_BAD_CONFIG);
}

FAKE_EXPORT EGLContext eglCreateContext(EGLDisplay dpy, EGLConfig config, EGLContext share, const EGLint *attribs)
{
    (void)dpy, (void)config, (void)share, (void)attribs;
    last_error = EGL_BAD_CONFIG;
    return NULL;
}

FAKE_EXPORT EGLBoolean eglDestroyContext(EGLDisplay dpy, EGLContext ctx)
{
    (void)dpy, (void)ctx;
    return fail_egl(EGL_BAD_CONTEXT);
}

FAKE_EXPORT EGLSurface eglCreatePbufferSurface(EGLDisplay dpy, EGLConfig config, const EGLint *attribs)
{
    (void)dpy, (void)config, (void)attribs;
    last_error = EGL_BAD_CONFIG;
    return NULL;
}

FAKE_EXPORT EGLBoolean eglDestroySurface(EGLDisplay dpy, EGLSurface surface)
{
    (void)dpy, (void)surface;
    return fail_egl(EGL_BAD_SURFACE);
}

FAKE_EXPORT EGLBoolean eglMakeCurrent(EGLDisplay dpy, EGLSurface draw, EGLSurface read, EGLContext ctx)
{
    (void)dpy;
    if (draw == NULL && read == NULL && ctx == NULL)
        return EGL_TRUE; /* releasing: nothing is ever current */
    return fail_egl(EGL_BAD_CONTEXT);
}

FAKE_EXPORT EGLContext eglGetCurrentContext(void) { return NULL; }
FAKE_EXPORT EGLDisplay eglGetCurrentDisplay(void) { return NULL; }

FAKE_EXPORT EGLSurface eglGetCurrentSurface(EGLint readdraw)
{
    (void)readdraw;
    return NULL;
}

FAKE_EXPORT EGLBoolean eglSwapBuffers(EGLDisplay dpy, EGLSurface surface)
{
    (void)dpy, (void)surface;
    return fail_egl(EGL_BAD_SURFACE);
}

FAKE_EXPORT EGLBoolean eglReleaseThread(void)
{
    last_error = EGL_SUCCESS;
    return EGL_TRUE;
}

FAKE_EXPORT EGLSync eglCreateSync(EGLDisplay dpy, EGLenum type, const EGLAttrib *attribs)
{
    (void)dpy, (void)type, (void)attribs;
    last_error = EGL_BAD_PARAMETER; /* as NVIDIA's driver answers EGL_SYNC_CUDA_EVENT_NV */
    return NULL;
}

/* Extension functions are reachable only here, as with a real libEGL: eglcuda must not dlsym them. */
static const struct {
    const char *name;
    void *address;
} procs[] = {
    {"eglQueryDevicesEXT", (void *)eglQueryDevicesEXT},
    {"eglQueryDeviceAttribEXT", (void *)eglQueryDeviceAttribEXT},
    {"eglQueryDeviceStringEXT", (void *)eglQueryDeviceStringEXT},
    {"eglQueryDisplayAttribEXT", (void *)eglQueryDisplayAttribEXT},
    {"eglCreateStreamKHR", (void *)eglCreateStreamKHR},
    {"eglDestroyStreamKHR", (void *)eglDestroyStreamKHR},
    {"eglStreamAttribKHR", (void *)eglStreamAttribKHR},
    {"eglQueryStreamKHR", (void *)eglQueryStreamKHR},
    {"eglQueryStreamu64KHR", (void *)eglQueryStreamu64KHR},
    {"eglQueryStreamTimeKHR", (void *)eglQueryStreamTimeKHR},
    {"eglGetStreamFileDescriptorKHR", (void *)eglGetStreamFileDescriptorKHR},
    {"eglCreateStreamFromFileDescriptorKHR", (void *)eglCreateStreamFromFileDescriptorKHR},
    {"eglResetStreamNV", (void *)eglResetStreamNV},
};

FAKE_EXPORT void *eglGetProcAddress(const char *name)
{
    FAKE_ENTER("eglGetProcAddress", return NULL);
    for (size_t i = 0; name && i < sizeof(procs) / sizeof(procs[0]); i++)
        if (strcmp(procs[i].name, name) == 0)
            return procs[i].address;
    return NULL;
}

/* ---- counts for the tests ------------------------------------------------------------------ */
FAKE_EXPORT long fake_egl_count(const char *what)
{
    long n = 0;
    fake__lock();
    if (strcmp(what, "streams") == 0) {
        for (struct fake_stream *s = streams; s; s = s->next_stream)
            n++;
    } else if (strcmp(what, "stream_handles") == 0) {
        for (struct fake_handle *h = handles; h; h = h->next)
            n++;
    } else if (strcmp(what, "connections") == 0) {
        for (struct fake_conn *c = connections; c; c = c->next_conn)
            n++;
    } else if (strcmp(what, "frames") == 0 || strcmp(what, "held") == 0) {
        int held = what[0] == 'h';
        for (struct fake_stream *s = streams; s; s = s->next_stream)
            for (struct fake_frame *f = s->frames; f; f = f->next)
                n += !held || f->status == FRAME_HELD;
    } else if (strcmp(what, "terminated_handles") == 0) {
        n = terminated_handles;
    } else {
        n = -1;
    }
    fake__unlock();
    return n;
}
