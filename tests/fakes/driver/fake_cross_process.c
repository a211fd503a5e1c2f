/* A fake libEGL + libcuda (one library under both names) for running bench/c/cross_gpu.c on a
 * machine without a GPU (tests/unit/test_bench_c.py). It has exactly the calls cross_gpu.c makes.
 * "Device" memory and the streams live in one MAP_SHARED region made when the library is loaded,
 * which cross_gpu does before it forks, so its processes share them at the same addresses, and a
 * stream's descriptor is a memfd holding the stream's index. Streams follow what eglcuda measured
 * on NVIDIA's driver: FIFO with a present that waits for room, the consumer's last frame kept
 * until a newer one is acquired (then it comes back), a return with nothing to give back that
 * waits up to about a millisecond, DISCONNECTED once a consumer's process exits. Misuse (a frame
 * presented while still in flight on that stream, an acquire with a frame held, a copy or memset
 * outside an allocation, ...) answers CUDA_ERROR_UNKNOWN and prints "FAKE MISUSE" on stderr.
 * FAKE_FAIL_STREAM=i FAKE_FAIL_AT=n: the n-th acquire on stream i fails. FAKE_SKIP_FILL_AT=n: the
 * n-th 32-bit memset (counted from 0) of the process writes nothing. FAKE_WANT_STREAM_FLAGS=n: a
 * CUDA stream created with other flags is misuse. FAKE_STATS=1: counts at each producer disconnect. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "egl_core.h"
#include "egl_stream.h"
#include "cuda_egl.h"

enum { MAXS = 64, QMAX = 64, REGION = 256 << 20 };
struct fstream {
    int used, state, fifo_len, destroyed;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    CUeglFrame fifo[QMAX]; int fifo_n;
    CUeglFrame acquired; int has_acquired;
    CUeglFrame kept; int has_kept;
    CUeglFrame ret[QMAX]; int ret_n;
    CUeglFrame inflight[QMAX]; int inflight_n; /* presented, not yet returned */
    long presents, acquires, releases, returns, returns_waited, returns_missed;
};
struct header { size_t next; int nstreams; struct fstream s[MAXS]; long misuse; };
static unsigned char *region;
static struct header *H;

__attribute__((constructor)) static void setup(void)
{
    region = mmap(NULL, REGION, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (region == MAP_FAILED) abort();
    H = (struct header *)region;
    H->next = (sizeof *H + 4095) / 4096 * 4096;
}
static void misuse(const char *what, int s)
{
    __atomic_add_fetch(&H->misuse, 1, __ATOMIC_RELAXED);
    fprintf(stderr, "FAKE MISUSE pid %d stream %d: %s\n", getpid(), s, what);
}
static int64_t mono(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1000000000LL + t.tv_nsec; }
static int in_region(CUdeviceptr p, size_t n) { return p >= (CUdeviceptr)(uintptr_t)region && p + n <= (CUdeviceptr)(uintptr_t)(region + H->next); }

/* ---- EGL */
EGLint eglGetError(void) { return 0x3000; }
EGLDisplay eglGetPlatformDisplay(EGLenum platform, void *native_display, const EGLAttrib *attrib_list) { (void)platform; (void)native_display; (void)attrib_list; return (EGLDisplay)0x1234; }
EGLBoolean eglInitialize(EGLDisplay dpy, EGLint *major, EGLint *minor) { (void)dpy; if (major) *major = 1; if (minor) *minor = 5; return 1; }
const char *eglQueryString(EGLDisplay dpy, EGLint name) { (void)dpy; (void)name; return "EGL_KHR_stream EGL_KHR_stream_fifo EGL_KHR_stream_cross_process_fd"; }
EGLBoolean eglQueryDevicesEXT(EGLint max_devices, EGLDeviceEXT *devices, EGLint *num_devices) { if (max_devices > 0) devices[0] = (EGLDeviceEXT)0x77; *num_devices = 1; return 1; }
EGLBoolean eglQueryDeviceAttribEXT(EGLDeviceEXT device, EGLint attribute, EGLAttrib *value) { (void)device; if (attribute != EGL_CUDA_DEVICE_NV) return 0; *value = 0; return 1; }
EGLStreamKHR eglCreateStreamKHR(EGLDisplay dpy, const EGLint *attrib_list)
{
    (void)dpy;
    int i = __atomic_fetch_add(&H->nstreams, 1, __ATOMIC_RELAXED);
    struct fstream *s = &H->s[i];
    pthread_mutexattr_t ma; pthread_mutexattr_init(&ma); pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutex_init(&s->lock, &ma);
    pthread_condattr_t ca; pthread_condattr_init(&ca); pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cond, &ca);
    s->used = 1; s->state = EGL_STREAM_STATE_CREATED_KHR; s->fifo_len = 1;
    for (const EGLint *a = attrib_list; a && *a != EGL_NONE; a += 2)
        if (a[0] == EGL_STREAM_FIFO_LENGTH_KHR) s->fifo_len = a[1];
    return (EGLStreamKHR)s;
}
EGLBoolean eglDestroyStreamKHR(EGLDisplay dpy, EGLStreamKHR stream) { (void)dpy; ((struct fstream *)stream)->destroyed++; return 1; }
EGLBoolean eglQueryStreamKHR(EGLDisplay dpy, EGLStreamKHR stream, EGLenum attribute, EGLint *value)
{ (void)dpy; if (attribute != EGL_STREAM_STATE_KHR) return 0; struct fstream *s = stream; pthread_mutex_lock(&s->lock); *value = s->state; pthread_mutex_unlock(&s->lock); return 1; }
EGLNativeFileDescriptorKHR eglGetStreamFileDescriptorKHR(EGLDisplay dpy, EGLStreamKHR stream)
{
    (void)dpy;
    int fd = memfd_create("fakestream", 0);
    int index = (int)((struct fstream *)stream - H->s);
    if (pwrite(fd, &index, sizeof index, 0) != sizeof index) return -1;
    return fd;
}
EGLStreamKHR eglCreateStreamFromFileDescriptorKHR(EGLDisplay dpy, EGLNativeFileDescriptorKHR fd)
{ (void)dpy; int index; if (pread(fd, &index, sizeof index, 0) != sizeof index) return NULL; return (EGLStreamKHR)&H->s[index]; }
#define P(n) if (!strcmp(procname, #n)) return (void *)n
void *eglGetProcAddress(const char *procname)
{
    P(eglQueryDevicesEXT); P(eglQueryDeviceAttribEXT); P(eglCreateStreamKHR); P(eglDestroyStreamKHR); P(eglQueryStreamKHR);
    P(eglGetStreamFileDescriptorKHR); P(eglCreateStreamFromFileDescriptorKHR);
    return NULL;
}

/* ---- CUDA */
CUresult cuInit(unsigned int flags) { (void)flags; return 0; }
CUresult cuGetErrorName(CUresult error, const char **pStr) { *pStr = error == 702 ? "CUDA_ERROR_LAUNCH_TIMEOUT" : error == 999 ? "CUDA_ERROR_UNKNOWN" : "CUDA_ERROR_?"; return 0; }
CUresult cuDeviceGetCount(int *count) { *count = 1; return 0; }
CUresult cuDeviceGet(CUdevice *device, int ordinal) { *device = ordinal; return ordinal == 0 ? 0 : 101; }
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) { (void)dev; *pctx = (CUcontext)0x42; return 0; }
CUresult cuCtxSetCurrent(CUcontext ctx) { (void)ctx; return 0; }
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    size_t n = (bytesize + 255) / 256 * 256;
    size_t at = __atomic_fetch_add(&H->next, n, __ATOMIC_RELAXED);
    if (at + n > REGION) return 2;
    *dptr = (CUdeviceptr)(uintptr_t)(region + at);
    return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p) { (void)p; return 0; }
CUresult cuStreamCreate(CUstream *s, unsigned int f)
{   /* FAKE_WANT_STREAM_FLAGS=n: a stream created with other flags is misuse */
    if (getenv("FAKE_WANT_STREAM_FLAGS") && f != (unsigned int)atoi(getenv("FAKE_WANT_STREAM_FLAGS"))) { misuse("stream flags", -1); return 1; }
    *s = (CUstream)0x99;
    return 0;
}
CUresult cuStreamSynchronize(CUstream s) { (void)s; return 0; }
CUresult cuMemsetD2D8Async(CUdeviceptr dst, size_t pitch, unsigned char uc, size_t width, size_t height, CUstream s)
{
    (void)s;
    if (!height || !in_region(dst, pitch * (height - 1) + width)) { misuse("memset out of bounds", -1); return 1; }
    for (size_t y = 0; y < height; y++) memset((void *)(uintptr_t)(dst + y * pitch), uc, width);
    return 0;
}
CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    (void)s;
    if (!n || !in_region(src, n)) { misuse("copy out of bounds", -1); return 1; }
    memcpy(dst, (const void *)(uintptr_t)src, n);
    return 0;
}
CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int ui, size_t n, CUstream s)
{
    (void)s;
    if (!n || (dst & 3) || !in_region(dst, n * 4)) { misuse("memset32 out of bounds", -1); return 1; }
    static long fills;
    if (getenv("FAKE_SKIP_FILL_AT") && fills++ == atol(getenv("FAKE_SKIP_FILL_AT"))) return 0;
    for (size_t i = 0; i < n; i++) ((unsigned int *)(uintptr_t)dst)[i] = ui;
    return 0;
}
CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *c, CUstream s)
{
    (void)s;
    if (c->srcMemoryType != CU_MEMORYTYPE_DEVICE || c->dstMemoryType != CU_MEMORYTYPE_HOST) { misuse("copy kind", -1); return 1; }
    if (!in_region(c->srcDevice, c->srcPitch * (c->Height - 1) + c->WidthInBytes)) { misuse("copy out of bounds", -1); return 1; }
    for (size_t y = 0; y < c->Height; y++)
        memcpy((char *)c->dstHost + y * c->dstPitch, (const char *)(uintptr_t)(c->srcDevice + y * c->srcPitch), c->WidthInBytes);
    return 0;
}
static struct fstream *S(CUeglStreamConnection *conn) { return (struct fstream *)*conn; }
static int idx(struct fstream *s) { return (int)(s - H->s); }
static struct fstream *mine[MAXS]; static int mine_n;
__attribute__((destructor)) static void gone(void)
{   /* this process exits: its consumers' streams see DISCONNECTED (the driver notices a dead peer) */
    for (int i = 0; i < mine_n; i++) { struct fstream *s = mine[i]; pthread_mutex_lock(&s->lock); s->state = EGL_STREAM_STATE_DISCONNECTED_KHR; pthread_cond_broadcast(&s->cond); pthread_mutex_unlock(&s->lock); }
}
CUresult cuEGLStreamConsumerConnect(CUeglStreamConnection *conn, void *stream)
{
    struct fstream *s = stream; mine[mine_n++] = s; pthread_mutex_lock(&s->lock);
    if (s->state != EGL_STREAM_STATE_CREATED_KHR) misuse("consumer connect not CREATED", idx(s));
    s->state = EGL_STREAM_STATE_CONNECTING_KHR; pthread_mutex_unlock(&s->lock);
    *conn = (CUeglStreamConnection)s; return 0;
}
CUresult cuEGLStreamProducerConnect(CUeglStreamConnection *conn, void *stream, EGLint w, EGLint h)
{
    (void)w; (void)h; struct fstream *s = stream; pthread_mutex_lock(&s->lock);
    if (s->state != EGL_STREAM_STATE_CONNECTING_KHR) { misuse("producer connect not CONNECTING", idx(s)); pthread_mutex_unlock(&s->lock); return 999; }
    s->state = EGL_STREAM_STATE_EMPTY_KHR; pthread_cond_broadcast(&s->cond); pthread_mutex_unlock(&s->lock);
    *conn = (CUeglStreamConnection)s; return 0;
}
static int same(const CUeglFrame *a, const CUeglFrame *b) { return a->frame.pPitch[0] == b->frame.pPitch[0]; }
CUresult cuEGLStreamProducerPresentFrame(CUeglStreamConnection *conn, CUeglFrame f, CUstream *ps)
{
    (void)ps; struct fstream *s = S(conn); pthread_mutex_lock(&s->lock);
    if (s->state == EGL_STREAM_STATE_DISCONNECTED_KHR) { pthread_mutex_unlock(&s->lock); return 999; }
    for (int i = 0; i < s->inflight_n; i++)
        if (same(&s->inflight[i], &f)) { misuse("present of a frame still in flight on this stream", idx(s)); pthread_mutex_unlock(&s->lock); return 999; }
    if (!in_region((CUdeviceptr)(uintptr_t)f.frame.pPitch[0], 1)) misuse("present of memory not allocated", idx(s));
    while (s->fifo_n >= s->fifo_len && s->state != EGL_STREAM_STATE_DISCONNECTED_KHR) pthread_cond_wait(&s->cond, &s->lock);
    if (s->state == EGL_STREAM_STATE_DISCONNECTED_KHR) { pthread_mutex_unlock(&s->lock); return 999; }
    s->fifo[s->fifo_n++] = f; s->inflight[s->inflight_n++] = f; s->presents++;
    s->state = EGL_STREAM_STATE_NEW_FRAME_AVAILABLE_KHR;
    pthread_cond_broadcast(&s->cond); pthread_mutex_unlock(&s->lock);
    if (getenv("FAKE_PRESENT_US")) usleep(atoi(getenv("FAKE_PRESENT_US")));
    return 0;
}
CUresult cuEGLStreamProducerReturnFrame(CUeglStreamConnection *conn, CUeglFrame *f, CUstream *ps)
{
    (void)ps; struct fstream *s = S(conn); pthread_mutex_lock(&s->lock);
    if (!s->ret_n) {  /* like the driver: wait up to about a millisecond for one */
        int64_t deadline = mono() + 1000000; struct timespec ts = {deadline / 1000000000LL, deadline % 1000000000LL};
        s->returns_waited++;
        while (!s->ret_n && s->state != EGL_STREAM_STATE_DISCONNECTED_KHR)
            if (pthread_cond_timedwait(&s->cond, &s->lock, &ts) == ETIMEDOUT) break;
        if (!s->ret_n) { s->returns_missed++; pthread_mutex_unlock(&s->lock); return CUDA_ERROR_LAUNCH_TIMEOUT; }
    }
    *f = s->ret[0]; memmove(s->ret, s->ret + 1, (size_t)--s->ret_n * sizeof *s->ret);
    int found = 0;
    for (int i = 0; i < s->inflight_n; i++)
        if (same(&s->inflight[i], f)) { memmove(s->inflight + i, s->inflight + i + 1, (size_t)(s->inflight_n - i - 1) * sizeof *f); s->inflight_n--; found = 1; break; }
    if (!found) misuse("returned a frame not in flight", idx(s));
    s->returns++; pthread_mutex_unlock(&s->lock); return 0;
}
CUresult cuEGLStreamConsumerAcquireFrame(CUeglStreamConnection *conn, CUgraphicsResource *res, CUstream *ps, unsigned int timeout)
{
    (void)ps; struct fstream *s = S(conn); pthread_mutex_lock(&s->lock);
    if (getenv("FAKE_FAIL_STREAM") && atoi(getenv("FAKE_FAIL_STREAM")) == idx(s) && s->acquires == atol(getenv("FAKE_FAIL_AT"))) { pthread_mutex_unlock(&s->lock); return 999; }
    if (s->has_acquired) { misuse("acquire with a frame held", idx(s)); pthread_mutex_unlock(&s->lock); return 999; }
    if (s->state == EGL_STREAM_STATE_CONNECTING_KHR) { misuse("acquire while CONNECTING", idx(s)); pthread_mutex_unlock(&s->lock); return 999; }
    int64_t deadline = mono() + (int64_t)timeout * 1000;
    struct timespec ts = {deadline / 1000000000LL, deadline % 1000000000LL};
    while (!s->fifo_n && s->state != EGL_STREAM_STATE_DISCONNECTED_KHR)
        if (pthread_cond_timedwait(&s->cond, &s->lock, &ts) == ETIMEDOUT) break;
    if (s->fifo_n) {
        if (s->has_kept) { s->ret[s->ret_n++] = s->kept; s->has_kept = 0; }
        s->acquired = s->fifo[0]; memmove(s->fifo, s->fifo + 1, (size_t)--s->fifo_n * sizeof *s->fifo);
        s->state = s->fifo_n ? EGL_STREAM_STATE_NEW_FRAME_AVAILABLE_KHR : EGL_STREAM_STATE_OLD_FRAME_AVAILABLE_KHR;
        pthread_cond_broadcast(&s->cond);
    } else if (s->has_kept) {
        s->acquired = s->kept; s->has_kept = 0;  /* the old frame again */
    } else {
        pthread_mutex_unlock(&s->lock); return s->state == EGL_STREAM_STATE_DISCONNECTED_KHR ? 999 : CUDA_ERROR_LAUNCH_TIMEOUT;
    }
    s->has_acquired = 1; s->acquires++; *res = (CUgraphicsResource)s;
    pthread_mutex_unlock(&s->lock); return 0;
}
CUresult cuGraphicsResourceGetMappedEglFrame(CUeglFrame *f, CUgraphicsResource r, unsigned int i, unsigned int m)
{ (void)i; (void)m; struct fstream *s = (struct fstream *)r; pthread_mutex_lock(&s->lock); if (!s->has_acquired) misuse("map without acquire", idx(s)); *f = s->acquired; pthread_mutex_unlock(&s->lock); return 0; }
CUresult cuEGLStreamConsumerReleaseFrame(CUeglStreamConnection *conn, CUgraphicsResource r, CUstream *ps)
{
    (void)ps; (void)r; struct fstream *s = S(conn); pthread_mutex_lock(&s->lock);
    if (!s->has_acquired) { misuse("release without acquire", idx(s)); pthread_mutex_unlock(&s->lock); return 999; }
    s->kept = s->acquired; s->has_kept = 1; s->has_acquired = 0; s->releases++;
    pthread_mutex_unlock(&s->lock);
    if (getenv("FAKE_RELEASE_US")) usleep(atoi(getenv("FAKE_RELEASE_US")));
    return 0;
}
CUresult cuEGLStreamConsumerDisconnect(CUeglStreamConnection *conn)
{ struct fstream *s = S(conn); pthread_mutex_lock(&s->lock); s->state = EGL_STREAM_STATE_DISCONNECTED_KHR; pthread_cond_broadcast(&s->cond); pthread_mutex_unlock(&s->lock); return 0; }
CUresult cuEGLStreamProducerDisconnect(CUeglStreamConnection *conn)
{ struct fstream *s = S(conn); if (getenv("FAKE_STATS")) fprintf(stderr, "stream %d: presents=%ld returns=%ld waited=%ld missed=%ld\n", idx(s), s->presents, s->returns, s->returns_waited, s->returns_missed); pthread_mutex_lock(&s->lock); s->state = EGL_STREAM_STATE_DISCONNECTED_KHR; pthread_cond_broadcast(&s->cond); pthread_mutex_unlock(&s->lock); return 0; }
