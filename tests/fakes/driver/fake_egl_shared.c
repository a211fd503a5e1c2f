/* A fake libEGL whose EGLStreams work between the processes of one fork tree, for running
 * bench/c/cross_gpu.c on a machine without a GPU (tests/unit/test_bench_c.py). The fake libcuda
 * (fake_cuda.c, the same source every fake test loads) links against it instead of
 * libfake_egl.so and finds here the services of fake_common.h: the lock, the wake-up and the
 * stream model, kept in one MAP_SHARED region made when the library loads, which cross_gpu does
 * before it forks, so its processes share them at the same addresses. Device memory comes from
 * the same region (fake__shared_alloc): a frame the producer's process allocated is readable in
 * the consumer's. The EGLStream rules are fake_cuda.c's endpoint calls on fake_egl.c's model
 * (FIFO with a present that waits for room, the consumer's last frame kept until a newer one is
 * acquired, a return with nothing to give back that waits about a millisecond); this file adds
 * what crossing processes needs: a stream's descriptor is a memfd holding the stream's index, and
 * a process that exits disconnects the streams it had an endpoint on (the driver notices a dead
 * peer), so the other side's calls fail instead of waiting for ever.
 *
 * Only the EGL calls cross_gpu makes are here: the device platform with FAKE_CUDA_DEVICE_COUNT
 * devices (default 1; EGL device i is CUDA device i), EGL_KHR_stream, _fifo, _cross_process_fd.
 * Misuse (what a real driver would refuse) prints "FAKE MISUSE" on stderr, which the bench tests
 * look for. No fault injection by call name here (FAKE_FAIL is fake_egl.c's): the per-stream
 * fault FAKE_FAIL_STREAM / FAKE_FAIL_AT and the other knobs are fake_cuda.c's.
 * Memory is never given back (at most REGION bytes in all, 256 MiB). */
#define _GNU_SOURCE
#include "fake_common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

enum { MAX_STREAMS = 64, MAX_CONNS = 2 * MAX_STREAMS, MAX_FRAMES = 64 * MAX_STREAMS, MAX_DEVICES = 4 };
#define REGION ((size_t)256 << 20)

struct region {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int streams_made;
    size_t next; /* the first free byte of device memory, from the region's start */
    struct fake_stream streams[MAX_STREAMS];
    struct fake_conn conns[MAX_CONNS];
    struct fake_frame frames[MAX_FRAMES];
};

static unsigned char *base;
static struct region *R;
static int device_count = 1;
static int tracing;
static __thread EGLint last_error = EGL_SUCCESS;
static struct fake_conn *mine[MAX_CONNS]; /* the endpoints this process connected (after the fork) */
static int mine_count;

__attribute__((constructor)) static void fake_egl_shared_load(void)
{
    base = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED)
        abort();
    R = (struct region *)base;
    R->next = (sizeof(*R) + 4095) / 4096 * 4096;
    pthread_mutexattr_t mutex;
    pthread_mutexattr_init(&mutex);
    pthread_mutexattr_setpshared(&mutex, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&mutex, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&R->lock, &mutex);
    pthread_condattr_t cond;
    pthread_condattr_init(&cond);
    pthread_condattr_setpshared(&cond, PTHREAD_PROCESS_SHARED);
    pthread_condattr_setclock(&cond, CLOCK_MONOTONIC);
    pthread_cond_init(&R->wake, &cond);
    const char *value = getenv("FAKE_CUDA_DEVICE_COUNT");
    if (value && atoi(value) >= 1)
        device_count = atoi(value) > MAX_DEVICES ? MAX_DEVICES : atoi(value);
    value = getenv("FAKE_TRACE");
    tracing = value && *value && strcmp(value, "0") != 0;
}

/* This process exits: the streams it had an endpoint on see DISCONNECTED, and the peers waiting
 * on them wake up. */
__attribute__((destructor)) static void fake_egl_shared_exit(void)
{
    if (mine_count == 0)
        return;
    fake__lock();
    for (int i = 0; i < mine_count; i++)
        mine[i]->stream->disconnected = 1;
    fake__wake_all();
    fake__unlock();
}

/* ---- the services of fake_common.h ------------------------------------------------------- */
FAKE_EXPORT void fake__lock(void)
{
    if (pthread_mutex_lock(&R->lock) == EOWNERDEAD) /* a process died holding it */
        pthread_mutex_consistent(&R->lock);
}

FAKE_EXPORT void fake__unlock(void) { pthread_mutex_unlock(&R->lock); }
/* Waiters poll (fake__wait_until) instead of sleeping on a process-shared condition variable:
 * glibc's pthread_cond_broadcast can block for good on one whose waiter died (a consumer process
 * that exits while another waits), which hung the producer's exit now and then. */
FAKE_EXPORT void fake__wake_all(void) {}

FAKE_EXPORT long long fake__now_ns(void)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000000000ll + now.tv_nsec;
}

FAKE_EXPORT int fake__wait_until(long long deadline_ns)
{
    long long step = deadline_ns - fake__now_ns();
    if (step > 100000)
        step = 100000; /* at most 0.1 ms between looks: what the caller waits for is checked again */
    fake__unlock();
    if (step > 0) {
        struct timespec pause = {0, step};
        nanosleep(&pause, NULL);
    }
    fake__lock();
    return fake__now_ns() >= deadline_ns;
}

FAKE_EXPORT int fake__slot(const char *name) { (void)name; return -1; }
FAKE_EXPORT int fake__enter(int slot) { (void)slot; return 0; }

FAKE_EXPORT void fake__trace(const char *fmt, ...)
{
    if (!tracing)
        return;
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "[fake %d] ", (int)getpid());
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
    fprintf(stderr, "FAKE MISUSE pid %d: %s\n", (int)getpid(), text);
}

FAKE_EXPORT int fake__device_count(void) { return device_count; }

FAKE_EXPORT void *fake__shared_alloc(size_t size)
{
    size_t rounded = (size + 4095) / 4096 * 4096;
    size_t at = __atomic_fetch_add(&R->next, rounded, __ATOMIC_RELAXED);
    return at + rounded <= REGION ? base + at : NULL;
}

FAKE_EXPORT int fake__shared_contains(uintptr_t address, size_t length)
{
    uintptr_t start = (uintptr_t)base + (sizeof(*R) + 4095) / 4096 * 4096;
    uintptr_t end = (uintptr_t)base + __atomic_load_n(&R->next, __ATOMIC_RELAXED);
    return address >= start && address <= end && length <= end - address;
}

/* ---- the stream model (lock held), as fake_egl.c keeps it ---------------------------------- */
FAKE_EXPORT struct fake_stream *fake__stream_from_handle(void *handle)
{
    struct fake_stream *s = handle;
    if (s < R->streams || s >= R->streams + MAX_STREAMS || s != &R->streams[s - R->streams] ||
        s->magic != FAKE_MAGIC_STREAM)
        return NULL;
    return s;
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

FAKE_EXPORT struct fake_frame *fake__frame_new(void)
{
    for (int i = 0; i < MAX_FRAMES; i++)
        if (R->frames[i].magic == 0) {
            memset(&R->frames[i], 0, sizeof(R->frames[i]));
            R->frames[i].magic = FAKE_MAGIC_FRAME;
            return &R->frames[i];
        }
    return NULL;
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
}

FAKE_EXPORT struct fake_frame *fake__frame_lookup(void *resource)
{
    struct fake_frame *f = resource;
    if (f < R->frames || f >= R->frames + MAX_FRAMES || f != &R->frames[f - R->frames] || f->magic != FAKE_MAGIC_FRAME)
        return NULL;
    return f;
}

FAKE_EXPORT struct fake_conn *fake__conn_new(struct fake_stream *stream, int producer, void *context)
{
    for (int i = 0; i < MAX_CONNS && mine_count < MAX_CONNS; i++)
        if (R->conns[i].magic == 0) {
            struct fake_conn *conn = &R->conns[i];
            memset(conn, 0, sizeof(*conn));
            conn->magic = FAKE_MAGIC_CONN;
            conn->stream = stream;
            conn->producer = producer;
            conn->context = context; /* the fake libcuda's, at the same address in every process */
            if (producer)
                stream->producer = conn;
            else
                stream->consumer = conn;
            mine[mine_count++] = conn;
            return conn;
        }
    return NULL;
}

FAKE_EXPORT struct fake_conn *fake__conn_lookup(void *pointer)
{
    struct fake_conn *c = pointer;
    if (c < R->conns || c >= R->conns + MAX_CONNS || c != &R->conns[c - R->conns] || c->magic != FAKE_MAGIC_CONN)
        return NULL;
    return c;
}

/* The endpoint leaves: the stream is DISCONNECTED for good (fake_egl.c's rule). */
FAKE_EXPORT void fake__conn_free(struct fake_conn *conn)
{
    struct fake_stream *s = conn->stream;
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
    for (int i = 0; i < mine_count; i++)
        if (mine[i] == conn) /* the slot may serve another process's endpoint next */
            mine[i] = mine[--mine_count];
    fake__wake_all();
}

/* ---- EGL ---------------------------------------------------------------------------------- */
static EGLDeviceEXT device_of(int ordinal) { return (EGLDeviceEXT)(uintptr_t)(0x7700 + ordinal); }
static EGLDisplay display_of(int ordinal) { return (EGLDisplay)(uintptr_t)(0x1200 + ordinal); }

static int display_ok(EGLDisplay dpy)
{
    uintptr_t value = (uintptr_t)dpy;
    if (value >= 0x1200 && value < 0x1200u + (unsigned)device_count)
        return 1;
    fake__misuse("%p is not an EGLDisplay", dpy);
    last_error = EGL_BAD_DISPLAY;
    return 0;
}

FAKE_EXPORT EGLint eglGetError(void)
{
    EGLint error = last_error;
    last_error = EGL_SUCCESS;
    return error;
}

FAKE_EXPORT EGLDisplay eglGetPlatformDisplay(EGLenum platform, void *native, const EGLAttrib *attribs)
{
    (void)attribs;
    uintptr_t value = (uintptr_t)native;
    if (platform != EGL_PLATFORM_DEVICE_EXT || value < 0x7700 || value >= 0x7700u + (unsigned)device_count) {
        last_error = EGL_BAD_PARAMETER;
        return NULL;
    }
    return display_of((int)(value - 0x7700));
}

FAKE_EXPORT EGLBoolean eglInitialize(EGLDisplay dpy, EGLint *major, EGLint *minor)
{
    if (!display_ok(dpy))
        return EGL_FALSE;
    if (major)
        *major = 1;
    if (minor)
        *minor = 5;
    return EGL_TRUE;
}

FAKE_EXPORT const char *eglQueryString(EGLDisplay dpy, EGLint name)
{
    (void)dpy;
    return name == EGL_EXTENSIONS ? "EGL_KHR_stream EGL_KHR_stream_fifo EGL_KHR_stream_cross_process_fd" : "";
}

static EGLBoolean eglQueryDevicesEXT(EGLint max_devices, EGLDeviceEXT *devices, EGLint *num_devices)
{
    if (num_devices == NULL)
        return EGL_FALSE;
    int n = devices == NULL ? device_count : (max_devices < device_count ? max_devices : device_count);
    for (int i = 0; devices && i < n; i++)
        devices[i] = device_of(i);
    *num_devices = n;
    return EGL_TRUE;
}

static EGLBoolean eglQueryDeviceAttribEXT(EGLDeviceEXT device, EGLint attribute, EGLAttrib *value)
{
    uintptr_t d = (uintptr_t)device;
    if (attribute != EGL_CUDA_DEVICE_NV || d < 0x7700 || d >= 0x7700u + (unsigned)device_count) {
        last_error = EGL_BAD_ATTRIBUTE;
        return EGL_FALSE;
    }
    *value = (EGLAttrib)(d - 0x7700);
    return EGL_TRUE;
}

static EGLStreamKHR eglCreateStreamKHR(EGLDisplay dpy, const EGLint *attribs)
{
    if (!display_ok(dpy))
        return NULL;
    int fifo = 0;
    for (const EGLint *a = attribs; a && *a != EGL_NONE; a += 2)
        if (a[0] == EGL_STREAM_FIFO_LENGTH_KHR)
            fifo = a[1];
    fake__lock();
    struct fake_stream *s = NULL;
    if (R->streams_made < MAX_STREAMS) {
        s = &R->streams[R->streams_made];
        memset(s, 0, sizeof(*s));
        s->magic = FAKE_MAGIC_STREAM;
        s->id = R->streams_made++;
        s->handles = 1;
        s->fifo_length = fifo;
        s->reuse = 1; /* EGL_SUPPORT_REUSE_NV's default */
    } else {
        last_error = EGL_BAD_ALLOC;
    }
    fake__unlock();
    return s;
}

static EGLBoolean eglDestroyStreamKHR(EGLDisplay dpy, EGLStreamKHR stream)
{
    if (!display_ok(dpy))
        return EGL_FALSE;
    fake__lock();
    struct fake_stream *s = fake__stream_from_handle(stream);
    if (s && s->handles > 0 && --s->handles == 0) {
        s->disconnected = 1;
        fake__wake_all();
    }
    fake__unlock();
    if (s == NULL)
        last_error = EGL_BAD_STREAM_KHR;
    return s != NULL;
}

static EGLBoolean eglQueryStreamKHR(EGLDisplay dpy, EGLStreamKHR stream, EGLenum attribute, EGLint *value)
{
    if (!display_ok(dpy))
        return EGL_FALSE;
    fake__lock();
    struct fake_stream *s = fake__stream_from_handle(stream);
    if (s && attribute == EGL_STREAM_STATE_KHR)
        *value = fake__stream_state(s);
    fake__unlock();
    if (s == NULL || attribute != EGL_STREAM_STATE_KHR) {
        last_error = s ? EGL_BAD_ATTRIBUTE : EGL_BAD_STREAM_KHR;
        return EGL_FALSE;
    }
    return EGL_TRUE;
}

static EGLNativeFileDescriptorKHR eglGetStreamFileDescriptorKHR(EGLDisplay dpy, EGLStreamKHR stream)
{
    if (!display_ok(dpy))
        return -1;
    fake__lock();
    struct fake_stream *s = fake__stream_from_handle(stream);
    int index = s ? (int)(s - R->streams) : -1;
    fake__unlock();
    int fd = index < 0 ? -1 : memfd_create("fake-egl-stream", MFD_CLOEXEC);
    if (fd >= 0 && pwrite(fd, &index, sizeof(index), 0) != (ssize_t)sizeof(index)) {
        close(fd);
        fd = -1;
    }
    if (fd < 0)
        last_error = s ? EGL_BAD_ALLOC : EGL_BAD_STREAM_KHR;
    return fd;
}

static EGLStreamKHR eglCreateStreamFromFileDescriptorKHR(EGLDisplay dpy, EGLNativeFileDescriptorKHR fd)
{
    if (!display_ok(dpy))
        return NULL;
    int index = -1;
    if (pread(fd, &index, sizeof(index), 0) != (ssize_t)sizeof(index) || index < 0 || index >= MAX_STREAMS) {
        last_error = EGL_BAD_STREAM_KHR;
        return NULL;
    }
    fake__lock();
    struct fake_stream *s = fake__stream_from_handle(&R->streams[index]);
    if (s)
        s->handles++;
    fake__unlock();
    if (s == NULL)
        last_error = EGL_BAD_STREAM_KHR;
    return s;
}

#define PROC(name)                   \
    if (strcmp(procname, #name) == 0) \
        return (void *)name
FAKE_EXPORT void *eglGetProcAddress(const char *procname)
{
    PROC(eglQueryDevicesEXT);
    PROC(eglQueryDeviceAttribEXT);
    PROC(eglCreateStreamKHR);
    PROC(eglDestroyStreamKHR);
    PROC(eglQueryStreamKHR);
    PROC(eglGetStreamFileDescriptorKHR);
    PROC(eglCreateStreamFromFileDescriptorKHR);
    return NULL;
}
