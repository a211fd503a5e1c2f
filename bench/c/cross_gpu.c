/* C reference for EGLStreams between two GPUs: a CUDA producer on one GPU, a CUDA consumer on
 * another, each on the EGL display of its own GPU, with no Python.
 *
 *   cross_gpu MODE PRODUCER_GPU CONSUMER_GPU WIDTH HEIGHT FORMAT ITERATIONS [CONSUMERS]
 *
 * MODE    inprocess            both ends in one thread, a serial loop:
 *                              present -> acquire + map -> release -> return
 *         inprocess_pipelined  both ends in one process, producer and consumer threads
 *         twoproc              fork: the parent is the consumer, the child the producer
 *         fanout               fork CONSUMERS consumer processes (the argument, else the
 *                              environment variable CONSUMERS, else 1), each with its own stream
 *                              (FIFO 4); the parent is one producer that presents the SAME frame
 *                              (from a ring of 6) on every stream; ITERATIONS counts rounds
 * GPUs    CUDA ordinals (the EGL device of each is found through EGL_CUDA_DEVICE_NV: EGL's
 *         device order is not CUDA's). Equal ordinals run both ends on one GPU (a baseline).
 * FORMAT  argb (one plane, 4 bytes a pixel) or nv12 (CU_EGL_COLOR_FORMAT_YUV420_SEMIPLANAR: a Y
 *         plane of WIDTH x HEIGHT bytes and an interleaved UV plane of WIDTH/2 x HEIGHT/2 x 2
 *         bytes, pitch-linear, one pitch for both planes; even sizes only).
 *
 * The stream (FIFO of 4) is created on the consumer's display with eglCreateStreamKHR, its file
 * descriptor exported with eglGetStreamFileDescriptorKHR before any endpoint connects, the CUDA
 * consumer connected there, and the stream opened on the producer's display with
 * eglCreateStreamFromFileDescriptorKHR, where the CUDA producer connects. Measured on two H200
 * (driver 580, one process, 1080p): with each endpoint on its own display's stream object the
 * driver ran 23-26k frames/s; with the producer's context against the consumer's display's
 * stream object, 160-2,000 (eglcuda's Stream._handle_for follows the same rule).
 * The producer presents from a pool of 4 frames allocated with cuMemAlloc on its GPU.
 *
 * twoproc: the parent forks before any EGL display or CUDA context exists (CUDA must not be
 * initialized before a fork), then creates the stream, connects the consumer (EGL wants the
 * consumer first), and passes the descriptor to the child over a socketpair (SCM_RIGHTS); the
 * child opens it on its own GPU's display, connects the producer and presents. Present
 * timestamps travel through a MAP_SHARED ring made before the fork.
 *
 * Frames/s is counted over ITERATIONS frames after a warm-up of ITERATIONS/10 + 2 frames, at the
 * consumer (from the start of frame WARMUP to the release of the last frame). Latency is from a
 * CLOCK_MONOTONIC stamp taken just before each present to the return of the acquire that gets
 * the frame. present_us and release_us are the median durations of those two calls. The last
 * line printed is
 *   fps=<float> latency_p50_us=<float> latency_p99_us=<float> present_us=<float> release_us=<float>
 *
 * fanout: a round is one frame presented on every stream and acquired and released by every
 * consumer; fps is rounds/s (from the first consumer's start of round WARMUP to the last
 * consumer's release of the last round), the latencies and release_us are over every consumer's
 * frames, present_us over every present, and the line ends with consumers=N. One line per
 * consumer comes before it:
 *   consumer=<i> latency_p50_us=<float> latency_p99_us=<float> release_us=<float>
 *
 * Environment:
 *   CHECK=1      the producer fills every frame with a pattern of its number (cuMemsetD2D8Async
 *                on its CUDA stream, before the present), the consumer copies each acquired frame
 *                to the host (cuMemcpy2DAsync from its pitch or array planes) and checks every
 *                byte; prints "check=ok" or exits 1 at the first wrong byte. Slows the loop.
 *   PACE_US=N    the producer presents at most one frame each N microseconds (pipelined modes):
 *                latency without frames queueing in the FIFO.
 *   KERNELS=1    both ends queue a small memset per frame on their CUDA stream (64 KiB into a
 *                buffer of their own: the producer's before the present, the consumer's before
 *                the release), as a pipeline that runs GPU work does; between processes without
 *                MPS the GPU then time-slices between the two processes' contexts.
 *   PEEK=1       the consumer copies one 4-byte word of each acquired frame to the host on its
 *                CUDA stream and synchronizes it before the release (what the Python benchmarks'
 *                consumers do to check a frame: bench/cross_process.py, bench/fanout.py). twoproc's
 *                line then ends with acquire_us=<float> (the acquire and the map) and
 *                peek_us=<float> (the copy and the synchronize), medians. PEEK_1D=1 makes that
 *                copy with cuMemcpyDtoHAsync (a pitch frame) instead of cuMemcpy2DAsync.
 *   NONBLOCKING=1  both ends create their CUDA stream non-blocking (CU_STREAM_NON_BLOCKING), as
 *                bench/cross_process.py's ends do; by default it is a blocking stream.
 *   CALL_STREAM=own|legacy|per-thread  the CUDA stream the EGLStream calls (present, return,
 *                acquire, release) pass: each end's own stream (the default), the legacy default
 *                stream (NULL) or the per-thread default stream. The GPU work (FILL, KERNELS, CHECK,
 *                PEEK) stays on the end's own stream: a blocking one (without NONBLOCKING) is
 *                ordered with the legacy default stream, a non-blocking one is not.
 *                CALL_STREAM_PRODUCER / CALL_STREAM_CONSUMER: the same for one side only.
 *   HOST_SYNC=1  each end synchronizes its own stream on the host right before its present or
 *                release (inside the timed span: present_us and release_us include it).
 *   WORK_STREAM=legacy  each end's GPU work (and CALL_STREAM=own) uses the legacy default stream.
 *   FILL=1       the producer writes every byte of each frame before the present (one 32-bit
 *                memset of the frame's number over all its planes, on its CUDA stream), as
 *                bench/cross_process.py's producers do; with PEEK=1 the consumer checks that the
 *                word it copies holds that number (exit 1 at the first that does not).
 *   BREAKDOWN=1  twoproc only, without CHECK: the measured frames run in four equal phases, by
 *                which side queues that memset before its call: none, producer, consumer, both.
 *                A side that queues none synchronizes its CUDA stream first, outside the timed
 *                span (its stream is idle at the call). Extra fields, for each phase P:
 *                present_us_P release_us_P latency_p50_us_P fps_P (medians; fps over the phase).
 *   POLLUTE_KB=N twoproc only: after each frame, both ends read and write one byte in each 64-byte
 *                line of a private buffer of N KiB (what an interpreter's own work between two
 *                driver calls does to the CPU caches). It is outside the timed calls, so the
 *                medians (present_us, release_us, acquire_us) show what a cold cache costs the
 *                driver's own calls; fps includes the walk itself.
 *
 * Exit status: 0 done, 1 a driver call or the check failed, 2 usage, a library missing
 * (libEGL.so.1, libcuda.so.1), or fewer than two GPUs ("needs two GPUs: found N").
 *
 * Types come from eglcuda's own declarations (csrc/); libEGL and libcuda are opened at run time,
 * so the build needs neither headers nor link libraries:
 *   gcc -O2 -Wall -o cross_gpu bench/c/cross_gpu.c -ldl -lpthread */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../csrc/egl_core.h"
#include "../../csrc/egl_stream.h"
#include "../../csrc/cuda_egl.h"

/* Not in csrc/cuda_egl.h (eglcuda does not call it); written from the CUDA driver API reference.
 * Exported as "cuMemsetD2D8Async": the asynchronous memsets have no _v2 symbol. */
CUresult cuMemsetD2D8Async(CUdeviceptr dstDevice, size_t dstPitch, unsigned char uc, size_t Width, size_t Height,
                           CUstream hStream);
CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream);
/* Exported as "cuMemcpyDtoHAsync_v2". */
CUresult cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
/* Not in csrc/cuda_egl.h: cuInit's answer on a machine without a CUDA device (CUDA driver API). */
#define CUDA_ERROR_NO_DEVICE 100

#define FN(name) static __typeof__(&name) p_##name
/* libEGL core, through dlsym */
FN(eglGetProcAddress); FN(eglGetPlatformDisplay); FN(eglInitialize); FN(eglQueryString); FN(eglGetError);
/* EGL extensions, through eglGetProcAddress (after the fork in twoproc) */
FN(eglQueryDevicesEXT); FN(eglQueryDeviceAttribEXT); FN(eglCreateStreamKHR); FN(eglDestroyStreamKHR);
FN(eglQueryStreamKHR); FN(eglGetStreamFileDescriptorKHR); FN(eglCreateStreamFromFileDescriptorKHR);
/* libcuda, through dlsym */
FN(cuInit); FN(cuGetErrorName); FN(cuDeviceGetCount); FN(cuDeviceGet); FN(cuDevicePrimaryCtxRetain);
FN(cuCtxSetCurrent); FN(cuMemAlloc); FN(cuMemFree); FN(cuStreamCreate); FN(cuStreamSynchronize);
FN(cuMemsetD2D8Async); FN(cuMemsetD32Async); FN(cuMemcpy2DAsync); FN(cuMemcpyDtoHAsync);
FN(cuEGLStreamConsumerConnect); FN(cuEGLStreamProducerConnect); FN(cuEGLStreamConsumerAcquireFrame);
FN(cuGraphicsResourceGetMappedEglFrame); FN(cuEGLStreamConsumerReleaseFrame);
FN(cuEGLStreamProducerPresentFrame); FN(cuEGLStreamProducerReturnFrame);
FN(cuEGLStreamConsumerDisconnect); FN(cuEGLStreamProducerDisconnect);

enum {
    POOL = 4,                           /* frames the producer owns */
    FIFO_LENGTH = 4,                    /* EGL_STREAM_FIFO_LENGTH_KHR */
    RING = 256,                         /* present timestamps in flight (far more than POOL) */
    ACQUIRE_TIMEOUT_US = 2000000,       /* a frame that takes longer (plus 2 x PACE_US) is an error */
    FAN_POOL = 6,                       /* fanout: the producer's ring (FIFO 4 + held + kept) */
    MAX_CONSUMERS = 32,                 /* fanout */
    KERNEL_PITCH = 4096,                /* KERNELS, BREAKDOWN: a 64 KiB memset, 16 rows of 4 KiB */
    KERNEL_ROWS = 16,
};
static const int64_t RETURN_DEADLINE_NS = 10000000000LL;   /* waiting for a frame to come back */
static const int64_t CONNECT_DEADLINE_NS = 120000000000LL; /* waiting for the other process */
#define YVU420_SEMIPLANAR 0x15 /* how the driver labels an NV12 frame on the consumer side (eglcuda) */

/* ---- shared state ----------------------------------------------------------------------------- */
struct stamp { uint64_t seq; int64_t t_ns; };      /* seq = frame number + 1 once t_ns is written */
struct shared {
    struct stamp ring[RING];
    uint32_t consumer_done;       /* the consumer has released every frame */
    double present_median_us;     /* the producer's, for the consumer's report (twoproc) */
    double present_phase_us[4];   /* BREAKDOWN: the producer's median present of each phase */
};

struct geometry {
    int planes;
    unsigned int pitch;           /* bytes between rows, every plane */
    size_t row_bytes[2];          /* bytes of a plane's row that hold pixels */
    unsigned int rows[2];
    size_t offset[2];             /* plane start in the frame's allocation */
    size_t bytes;                 /* the allocation */
    unsigned int channels;        /* plane 0's, as the driver takes it */
    CUeglColorFormat format;
};

struct producer {
    CUcontext ctx;
    EGLDisplay dpy;
    EGLStreamKHR stream;          /* the stream object of the producer's display */
    CUeglStreamConnection conn;
    CUstream cu_stream;
    CUdeviceptr memory[POOL];
    CUeglFrame pool[POOL];
    int free_list[POOL], free_count;
    double *present_s;            /* duration of each present */
    CUdeviceptr scratch;          /* KERNELS, BREAKDOWN: what the memset writes */
};

struct consumer {
    CUcontext ctx;
    EGLDisplay dpy;
    EGLStreamKHR stream;          /* created on the consumer's display */
    int fd;                       /* its exported descriptor */
    CUeglStreamConnection conn;
    CUstream cu_stream;
    double *release_s, *latency_s;
    double *acquire_s, *peek_s;   /* PEEK: the acquire with its map, the copy with its synchronize */
    unsigned char *host[2], *want[2]; /* CHECK: the copied planes, an expected row */
    int64_t start_ns, end_ns;
    CUdeviceptr scratch;          /* KERNELS, BREAKDOWN: what the memset writes */
    int64_t *acquire_ns;          /* BREAKDOWN: when each acquire began */
};

static const char *role = "cross_gpu";  /* the prefix of error lines */
static pid_t child_pid = -1;
static struct geometry G;
static int width, height, iterations, warmup, total, check, same_gpu;
static int kernels, peek, peek_1d, fill, breakdown, consumers = 1;
static size_t pollute_bytes;          /* POLLUTE_KB */
static volatile unsigned char *pollute_buffer;

/* POLLUTE_KB: walk the buffer, one byte per cache line, between frames. */
static void pollute(void)
{
    for (size_t i = 0; i < pollute_bytes; i += 64)
        pollute_buffer[i] += 1;
}
static unsigned int stream_flags; /* NONBLOCKING */
enum { PRODUCER_SIDE, CONSUMER_SIDE };
static int call_own_stream[2] = {1, 1}; /* CALL_STREAM: an end's EGLStream calls pass its own stream */
static CUstream call_stream[2];         /* ... or this one: NULL (legacy) or CU_STREAM_PER_THREAD */
static int host_sync;                   /* HOST_SYNC */
static int work_on_legacy;              /* WORK_STREAM=legacy */

/* The stream an EGLStream call of one side passes, its own stream being *own (CALL_STREAM). */
static CUstream *call_stream_of(int side, CUstream *own)
{
    return call_own_stream[side] ? own : &call_stream[side];
}

/* CALL_STREAM's value for one side, or both (side < 0). */
static int set_call_stream(int side, const char *value)
{
    for (int i = 0; i < 2; i++) {
        if (side >= 0 && i != side)
            continue;
        if (strcmp(value, "legacy") == 0)
            call_own_stream[i] = 0, call_stream[i] = NULL;
        else if (strcmp(value, "per-thread") == 0)
            call_own_stream[i] = 0, call_stream[i] = (CUstream)(uintptr_t)0x2; /* CU_STREAM_PER_THREAD */
        else if (strcmp(value, "own") == 0)
            call_own_stream[i] = 1;
        else
            return -1;
    }
    return 0;
}
static pid_t fan_child[MAX_CONSUMERS];  /* fanout, in the producer: the consumer processes */
static int fan_children;
static int64_t pace_ns;
static unsigned int acquire_timeout_us;
static struct shared *shm;

/* ---- errors ------------------------------------------------------------------------------------ */
static void die(int status) __attribute__((noreturn));
static void die(int status)
{
    if (child_pid > 0) {        /* the parent of twoproc: take the producer process down with it */
        kill(child_pid, SIGKILL);
        waitpid(child_pid, NULL, 0);
        child_pid = -1;
    }
    for (int i = 0; i < fan_children; i++)  /* the producer of fanout: its consumer processes too */
        if (fan_child[i] > 0) {
            kill(fan_child[i], SIGKILL);
            waitpid(fan_child[i], NULL, 0);
            fan_child[i] = -1;
        }
    exit(status);
}

static void fail(const char *format, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *format, ...)
{
    va_list args;
    fprintf(stderr, "%s: ", role);
    va_start(args, format);
    vfprintf(stderr, format, args);
    va_end(args);
    fputc('\n', stderr);
    die(1);
}

static const char *cu_name(CUresult r)
{
    const char *name = NULL;
    if (p_cuGetErrorName && p_cuGetErrorName(r, &name) == CUDA_SUCCESS && name)
        return name;
    return "?";
}

#define CU(call) do { CUresult r_ = (call); if (r_ != CUDA_SUCCESS) fail("line %d: %s -> %d %s", __LINE__, #call, r_, cu_name(r_)); } while (0)

static void usage_exit(const char *why)
{
    if (why)
        fprintf(stderr, "cross_gpu: %s\n", why);
    else
        fprintf(stderr, "usage: cross_gpu inprocess|inprocess_pipelined|twoproc|fanout PRODUCER_GPU CONSUMER_GPU WIDTH HEIGHT argb|nv12 ITERATIONS [CONSUMERS]\n");
    exit(2);
}

/* ---- time -------------------------------------------------------------------------------------- */
static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static int by_value(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The q-quantile (0..1) of n values, in microseconds (the values are seconds); sorts them. */
static double quantile_us(double *values, int n, double q)
{
    qsort(values, n, sizeof *values, by_value);
    int at = (int)(q * n);
    if (at > n - 1)
        at = n - 1;
    return 1e6 * values[at];
}

/* ---- libraries --------------------------------------------------------------------------------- */
static void *lib_symbol(void *lib, const char *libname, const char *symbol)
{
    void *p = dlsym(lib, symbol);
    if (!p) {
        fprintf(stderr, "cross_gpu: %s has no %s\n", libname, symbol);
        exit(2);
    }
    return p;
}
#define LOAD(lib, libname, name, sym) p_##name = (__typeof__(p_##name))lib_symbol(lib, libname, sym)

/* Both libraries and their plain symbols. dlopen and dlsym run no driver code: safe before a fork. */
static void load_libraries(void)
{
    void *egl = dlopen("libEGL.so.1", RTLD_NOW);
    if (!egl) {
        fprintf(stderr, "cross_gpu: libEGL.so.1 is missing (%s)\n", dlerror());
        exit(2);
    }
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (!cuda) {
        fprintf(stderr, "cross_gpu: libcuda.so.1 is missing (%s)\n", dlerror());
        exit(2);
    }
    LOAD(egl, "libEGL.so.1", eglGetProcAddress, "eglGetProcAddress");
    LOAD(egl, "libEGL.so.1", eglGetPlatformDisplay, "eglGetPlatformDisplay");
    LOAD(egl, "libEGL.so.1", eglInitialize, "eglInitialize");
    LOAD(egl, "libEGL.so.1", eglQueryString, "eglQueryString");
    LOAD(egl, "libEGL.so.1", eglGetError, "eglGetError");
    LOAD(cuda, "libcuda.so.1", cuInit, "cuInit");
    LOAD(cuda, "libcuda.so.1", cuGetErrorName, "cuGetErrorName");
    LOAD(cuda, "libcuda.so.1", cuDeviceGetCount, "cuDeviceGetCount");
    LOAD(cuda, "libcuda.so.1", cuDeviceGet, "cuDeviceGet");
    LOAD(cuda, "libcuda.so.1", cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    LOAD(cuda, "libcuda.so.1", cuCtxSetCurrent, "cuCtxSetCurrent");
    LOAD(cuda, "libcuda.so.1", cuMemAlloc, "cuMemAlloc_v2");
    LOAD(cuda, "libcuda.so.1", cuMemFree, "cuMemFree_v2");
    LOAD(cuda, "libcuda.so.1", cuStreamCreate, "cuStreamCreate");
    LOAD(cuda, "libcuda.so.1", cuStreamSynchronize, "cuStreamSynchronize");
    LOAD(cuda, "libcuda.so.1", cuMemsetD2D8Async, "cuMemsetD2D8Async");
    LOAD(cuda, "libcuda.so.1", cuMemsetD32Async, "cuMemsetD32Async");
    LOAD(cuda, "libcuda.so.1", cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    LOAD(cuda, "libcuda.so.1", cuMemcpy2DAsync, "cuMemcpy2DAsync_v2");
    LOAD(cuda, "libcuda.so.1", cuEGLStreamConsumerConnect, "cuEGLStreamConsumerConnect");
    LOAD(cuda, "libcuda.so.1", cuEGLStreamProducerConnect, "cuEGLStreamProducerConnect");
    LOAD(cuda, "libcuda.so.1", cuEGLStreamConsumerAcquireFrame, "cuEGLStreamConsumerAcquireFrame");
    LOAD(cuda, "libcuda.so.1", cuGraphicsResourceGetMappedEglFrame, "cuGraphicsResourceGetMappedEglFrame");
    LOAD(cuda, "libcuda.so.1", cuEGLStreamConsumerReleaseFrame, "cuEGLStreamConsumerReleaseFrame");
    LOAD(cuda, "libcuda.so.1", cuEGLStreamProducerPresentFrame, "cuEGLStreamProducerPresentFrame");
    LOAD(cuda, "libcuda.so.1", cuEGLStreamProducerReturnFrame, "cuEGLStreamProducerReturnFrame");
    LOAD(cuda, "libcuda.so.1", cuEGLStreamConsumerDisconnect, "cuEGLStreamConsumerDisconnect");
    LOAD(cuda, "libcuda.so.1", cuEGLStreamProducerDisconnect, "cuEGLStreamProducerDisconnect");
}

/* The extension entry points; NULL where this EGL has none (checked where used). In twoproc each
 * process calls this after the fork: glvnd may load its vendor library on the first lookup. */
static void load_egl_extensions(void)
{
#define LOADX(name) p_##name = (__typeof__(p_##name))p_eglGetProcAddress(#name)
    LOADX(eglQueryDevicesEXT); LOADX(eglQueryDeviceAttribEXT); LOADX(eglCreateStreamKHR);
    LOADX(eglDestroyStreamKHR); LOADX(eglQueryStreamKHR); LOADX(eglGetStreamFileDescriptorKHR);
    LOADX(eglCreateStreamFromFileDescriptorKHR);
#undef LOADX
}

#define NEED(name) do { if (!p_##name) fail("this EGL has no %s", #name); } while (0)

/* ---- devices ----------------------------------------------------------------------------------- */
enum { MAX_EGL_DEVICES = 32 };

static int egl_devices(EGLDeviceEXT *devices)
{
    EGLint count = 0;
    if (!p_eglQueryDevicesEXT || !p_eglQueryDeviceAttribEXT ||
        !p_eglQueryDevicesEXT(MAX_EGL_DEVICES, devices, &count))
        return 0;
    return count;
}

/* cuInit, then the number of GPUs both CUDA and EGL see (EGL devices with a CUDA ordinal); exits
 * 2 when the run needs more ("needs two GPUs: found N"), or a GPU asked for is not there. */
static void init_and_count(int producer_gpu, int consumer_gpu)
{
    CUresult r = p_cuInit(0);
    int cuda_count = 0;
    if (r == CUDA_SUCCESS && p_cuDeviceGetCount(&cuda_count) != CUDA_SUCCESS)
        cuda_count = 0;
    EGLDeviceEXT devices[MAX_EGL_DEVICES];
    int egl_count = 0, n = egl_devices(devices);
    for (int i = 0; i < n; i++) {
        EGLAttrib ordinal = -1;
        if (p_eglQueryDeviceAttribEXT(devices[i], EGL_CUDA_DEVICE_NV, &ordinal) && ordinal >= 0)
            egl_count++;
    }
    int found = cuda_count < egl_count ? cuda_count : egl_count;
    int needed = producer_gpu == consumer_gpu ? 1 : 2;
    if (found < needed) {
        if (r != CUDA_SUCCESS && r != CUDA_ERROR_NO_DEVICE)
            fprintf(stderr, "needs two GPUs: found %d (cuInit -> %d %s)\n", found, r, cu_name(r));
        else
            fprintf(stderr, "needs two GPUs: found %d\n", found);
        die(2);
    }
    int top = producer_gpu > consumer_gpu ? producer_gpu : consumer_gpu;
    if (top >= cuda_count) {
        fprintf(stderr, "cross_gpu: no CUDA device %d: found %d\n", top, cuda_count);
        die(2);
    }
}

static int has_word(const char *list, const char *word)
{
    size_t n = strlen(word);
    for (const char *p = list; p && (p = strstr(p, word)); p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0'))
            return 1;
    return 0;
}

/* The initialized EGL display of CUDA device `ordinal`, matched through EGL_CUDA_DEVICE_NV. */
static EGLDisplay display_for(int ordinal)
{
    EGLDeviceEXT devices[MAX_EGL_DEVICES];
    int n = egl_devices(devices);
    EGLDisplay dpy = NULL;
    for (int i = 0; i < n && !dpy; i++) {
        EGLAttrib value = -1;
        if (p_eglQueryDeviceAttribEXT(devices[i], EGL_CUDA_DEVICE_NV, &value) && value == ordinal) {
            dpy = p_eglGetPlatformDisplay(EGL_PLATFORM_DEVICE_EXT, devices[i], NULL);
            if (!dpy)
                fail("eglGetPlatformDisplay for CUDA device %d -> EGL error 0x%x", ordinal, p_eglGetError());
        }
    }
    if (!dpy)
        fail("no EGL device has CUDA ordinal %d", ordinal);
    EGLint major = 0, minor = 0;
    if (!p_eglInitialize(dpy, &major, &minor))
        fail("eglInitialize on CUDA device %d's display -> EGL error 0x%x", ordinal, p_eglGetError());
    const char *extensions = p_eglQueryString(dpy, EGL_EXTENSIONS);
    static const char *const needed[] = {"EGL_KHR_stream", "EGL_KHR_stream_fifo", "EGL_KHR_stream_cross_process_fd"};
    for (size_t i = 0; i < sizeof needed / sizeof *needed; i++)
        if (!has_word(extensions, needed[i]))
            fail("the display of CUDA device %d lacks %s", ordinal, needed[i]);
    return dpy;
}

static CUcontext context_for(int ordinal)
{
    CUdevice device;
    CUcontext ctx;
    CU(p_cuDeviceGet(&device, ordinal));
    CU(p_cuDevicePrimaryCtxRetain(&ctx, device));
    CU(p_cuCtxSetCurrent(ctx));
    return ctx;
}

static EGLint stream_state(EGLDisplay dpy, EGLStreamKHR stream)
{
    EGLint state = 0;
    if (!p_eglQueryStreamKHR(dpy, stream, EGL_STREAM_STATE_KHR, &state))
        fail("eglQueryStreamKHR(EGL_STREAM_STATE_KHR) -> EGL error 0x%x", p_eglGetError());
    return state;
}

/* EGL wants the consumer connected before the producer: the stream must be CONNECTING. */
static void require_connecting(EGLDisplay dpy, EGLStreamKHR stream)
{
    EGLint state = stream_state(dpy, stream);
    if (state != EGL_STREAM_STATE_CONNECTING_KHR)
        fail("the stream is in state 0x%x, not CONNECTING (0x%x): the consumer must connect before the producer", state,
             EGL_STREAM_STATE_CONNECTING_KHR);
}

/* ---- frames and the check pattern ------------------------------------------------------------- */
static size_t align_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

static void set_geometry(int nv12)
{
    memset(&G, 0, sizeof G);
    if (nv12) {
        G.planes = 2;
        G.pitch = (unsigned int)align_up((size_t)width, 256);
        G.row_bytes[0] = (size_t)width; G.rows[0] = (unsigned int)height;
        G.row_bytes[1] = (size_t)(width / 2) * 2; G.rows[1] = (unsigned int)(height / 2);
        G.offset[1] = align_up((size_t)G.pitch * height, 256);
        G.bytes = G.offset[1] + (size_t)G.pitch * G.rows[1];
        G.channels = 1;
        G.format = CU_EGL_COLOR_FORMAT_YUV420_SEMIPLANAR;
    } else {
        G.planes = 1;
        G.pitch = (unsigned int)align_up((size_t)width * 4, 256);
        G.row_bytes[0] = (size_t)width * 4; G.rows[0] = (unsigned int)height;
        G.bytes = (size_t)G.pitch * height;
        G.channels = 4;
        G.format = CU_EGL_COLOR_FORMAT_ARGB;
    }
}

/* The pattern of frame k, plane p: a base value, a vertical stripe and a horizontal band of two
 * others (so a wrong pitch, plane or row shows), all changing with k (37 is odd: no two frames of
 * the last 256 share a base). */
static unsigned char base_value(int k, int p) { return (unsigned char)(k * 37 + p * 101 + 11); }
static void stripe_of(int p, size_t *x0, size_t *x1) { *x0 = G.row_bytes[p] / 3; *x1 = *x0 + (G.row_bytes[p] / 5 ? G.row_bytes[p] / 5 : 1); }
static void band_of(int p, unsigned int *y0, unsigned int *y1) { *y0 = G.rows[p] / 2; *y1 = *y0 + (G.rows[p] / 7 ? G.rows[p] / 7 : 1); }

/* ---- KERNELS and BREAKDOWN ---------------------------------------------------------------------- */
static const char *const PHASE_NAMES[4] = {"none", "producer", "consumer", "both"};

/* BREAKDOWN: the phase of frame k (bit 0: the producer queues a memset, bit 1: the consumer
 * does), -1 for the warm-up frames and whenever BREAKDOWN is off. */
static int phase_of(int k)
{
    if (!breakdown || k < warmup)
        return -1;
    int phase = (int)((int64_t)(k - warmup) * 4 / iterations);
    return phase > 3 ? 3 : phase;
}

/* The small piece of GPU work of KERNELS and BREAKDOWN: a 64 KiB memset on `stream`. */
static void queue_kernel(CUdeviceptr scratch, CUstream stream, int k)
{
    CU(p_cuMemsetD2D8Async(scratch, KERNEL_PITCH, (unsigned char)k, KERNEL_PITCH, KERNEL_ROWS, stream));
}

static CUdeviceptr scratch_alloc(void)
{
    CUdeviceptr scratch = 0;
    if (kernels || breakdown)
        CU(p_cuMemAlloc(&scratch, (size_t)KERNEL_PITCH * KERNEL_ROWS));
    return scratch;
}

/* The median (us) of values[k] over the measured frames k of BREAKDOWN phase `phase`. */
static double phase_median_us(const double *values, int phase)
{
    double *picked = malloc((size_t)iterations * sizeof *picked);
    if (!picked)
        fail("out of memory");
    int n = 0;
    for (int k = warmup; k < total; k++)
        if (phase_of(k) == phase)
            picked[n++] = values[k];
    double median = n ? quantile_us(picked, n, 0.5) : 0.0;
    free(picked);
    return median;
}

/* PEEK: one word of plane 0 to the host, on the consumer's stream, which is then synchronized;
 * with FILL, it must hold frame k's number. */
static void peek_frame(struct consumer *co, const CUeglFrame *m, int k)
{
    static uint32_t word;
    int pitch = m->frameType == CU_EGL_FRAME_TYPE_PITCH;
    if (peek_1d && pitch) {
        CU(p_cuMemcpyDtoHAsync(&word, (CUdeviceptr)(uintptr_t)m->frame.pPitch[0], sizeof word, co->cu_stream));
    } else {
        CUDA_MEMCPY2D copy;
        memset(&copy, 0, sizeof copy);
        if (pitch) {
            copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
            copy.srcDevice = (CUdeviceptr)(uintptr_t)m->frame.pPitch[0];
            copy.srcPitch = m->pitch;
        } else {
            copy.srcMemoryType = CU_MEMORYTYPE_ARRAY;
            copy.srcArray = m->frame.pArray[0];
        }
        copy.dstMemoryType = CU_MEMORYTYPE_HOST;
        copy.dstHost = &word;
        copy.dstPitch = sizeof word;
        copy.WidthInBytes = sizeof word;
        copy.Height = 1;
        CU(p_cuMemcpy2DAsync(&copy, co->cu_stream));
    }
    CU(p_cuStreamSynchronize(co->cu_stream));
    if (fill && word != (uint32_t)k)
        fail("FILL: frame %d arrived holding 0x%08x where its producer wrote 0x%08x", k, word, (uint32_t)k);
}

/* FILL: every byte of the frame, as the Python benchmarks' producers write it. */
static void fill_whole(CUdeviceptr memory, CUstream stream, int k)
{
    CU(p_cuMemsetD32Async(memory, (unsigned int)k, G.bytes / 4, stream));
}

static void fill_frame(CUdeviceptr memory, CUstream stream, int k)
{
    for (int p = 0; p < G.planes; p++) {
        CUdeviceptr plane = memory + G.offset[p];
        unsigned char v = base_value(k, p);
        size_t x0, x1;
        unsigned int y0, y1;
        stripe_of(p, &x0, &x1);
        band_of(p, &y0, &y1);
        CU(p_cuMemsetD2D8Async(plane, G.pitch, v, G.row_bytes[p], G.rows[p], stream));
        CU(p_cuMemsetD2D8Async(plane + x0, G.pitch, v ^ 0x5A, x1 - x0, G.rows[p], stream));
        CU(p_cuMemsetD2D8Async(plane + (size_t)y0 * G.pitch, G.pitch, v ^ 0xA5, G.row_bytes[p], y1 - y0, stream));
    }
}

static void check_frame(struct consumer *co, const CUeglFrame *m, int k)
{
    int nv12 = G.format == CU_EGL_COLOR_FORMAT_YUV420_SEMIPLANAR;
    int format_ok = nv12 ? (m->eglColorFormat == CU_EGL_COLOR_FORMAT_YUV420_SEMIPLANAR || m->eglColorFormat == YVU420_SEMIPLANAR)
                         : m->eglColorFormat == CU_EGL_COLOR_FORMAT_ARGB;
    if (m->width != (unsigned int)width || m->height != (unsigned int)height || (int)m->planeCount != G.planes || !format_ok)
        fail("check: frame %d arrived as %ux%u, %u planes, format 0x%x, type %d; presented %dx%d, %d planes, format 0x%x",
             k, m->width, m->height, m->planeCount, (unsigned int)m->eglColorFormat, (int)m->frameType, width, height,
             G.planes, (unsigned int)G.format);
    for (int p = 0; p < G.planes; p++) {
        CUDA_MEMCPY2D copy;
        memset(&copy, 0, sizeof copy);
        if (m->frameType == CU_EGL_FRAME_TYPE_PITCH) {
            if (m->pitch < G.row_bytes[p])
                fail("check: frame %d plane %d has pitch %u, less than a row (%zu bytes)", k, p, m->pitch, G.row_bytes[p]);
            copy.srcMemoryType = CU_MEMORYTYPE_DEVICE;
            copy.srcDevice = (CUdeviceptr)(uintptr_t)m->frame.pPitch[p];
            copy.srcPitch = m->pitch;
        } else {
            copy.srcMemoryType = CU_MEMORYTYPE_ARRAY;
            copy.srcArray = m->frame.pArray[p];
        }
        copy.dstMemoryType = CU_MEMORYTYPE_HOST;
        copy.dstHost = co->host[p];
        copy.dstPitch = G.row_bytes[p];
        copy.WidthInBytes = G.row_bytes[p];
        copy.Height = G.rows[p];
        /* On the consumer's stream: the acquire made it wait for the producer's work (4.1.4). */
        CU(p_cuMemcpy2DAsync(&copy, co->cu_stream));
    }
    CU(p_cuStreamSynchronize(co->cu_stream));
    for (int p = 0; p < G.planes; p++) {
        unsigned char v = base_value(k, p);
        size_t x0, x1, n = G.row_bytes[p];
        unsigned int y0, y1;
        stripe_of(p, &x0, &x1);
        band_of(p, &y0, &y1);
        for (unsigned int y = 0; y < G.rows[p]; y++) {
            unsigned char *want = co->want[p];
            if (y >= y0 && y < y1) {
                memset(want, v ^ 0xA5, n);
            } else {
                memset(want, v, n);
                memset(want + x0, v ^ 0x5A, x1 - x0);
            }
            const unsigned char *got = co->host[p] + (size_t)y * n;
            if (memcmp(got, want, n) != 0) {
                size_t x = 0;
                while (got[x] == want[x])
                    x++;
                fail("check: frame %d plane %d byte (x %zu, row %u) is 0x%02x, expected 0x%02x (frame type %s)", k, p, x, y,
                     got[x], want[x], m->frameType == CU_EGL_FRAME_TYPE_PITCH ? "pitch" : "array");
            }
        }
    }
}

/* ---- the producer ------------------------------------------------------------------------------ */
/* The driver's description of a pitch-linear frame at `memory`. */
static void describe_frame(CUeglFrame *f, CUdeviceptr memory)
{
    memset(f, 0, sizeof *f);
    for (int p = 0; p < G.planes; p++)
        f->frame.pPitch[p] = (void *)(uintptr_t)(memory + G.offset[p]);
    f->width = (unsigned int)width;
    f->height = (unsigned int)height;
    f->depth = 1;
    f->pitch = G.pitch;
    f->planeCount = (unsigned int)G.planes;
    f->numChannels = G.channels;
    f->frameType = CU_EGL_FRAME_TYPE_PITCH;
    f->eglColorFormat = G.format;
    f->cuFormat = CU_AD_FORMAT_UNSIGNED_INT8;
}

/* Opens the stream on the producer's display (from the descriptor unless both ends share a
 * display), allocates the pool and connects. The consumer must be connected already: the caller
 * checks the consumer's stream object in one process; `check_opened` checks the one opened here
 * (the only one a producer process has). */
static void producer_setup(struct producer *pr, int gpu, int fd, EGLDisplay same_dpy, EGLStreamKHR same_stream,
                           int check_opened)
{
    memset(pr, 0, sizeof *pr);
    pr->ctx = context_for(gpu);
    if (same_stream) {
        pr->dpy = same_dpy;
        pr->stream = same_stream;
    } else {
        pr->dpy = display_for(gpu);
        NEED(eglCreateStreamFromFileDescriptorKHR);
        /* The descriptor stays open until the end: closing it tears the stream down (eglcuda,
         * docs/crossprocess.md rule 1). */
        pr->stream = p_eglCreateStreamFromFileDescriptorKHR(pr->dpy, fd);
        if (!pr->stream)
            fail("eglCreateStreamFromFileDescriptorKHR on CUDA device %d's display -> EGL error 0x%x", gpu, p_eglGetError());
        if (check_opened)
            require_connecting(pr->dpy, pr->stream);
    }
    CU(p_cuStreamCreate(&pr->cu_stream, stream_flags));
    if (work_on_legacy)
        pr->cu_stream = NULL; /* WORK_STREAM=legacy (the created stream is left unused) */
    for (int i = 0; i < POOL; i++) {
        CU(p_cuMemAlloc(&pr->memory[i], G.bytes));
        describe_frame(&pr->pool[i], pr->memory[i]);
        pr->free_list[i] = i;
    }
    pr->free_count = POOL;
    pr->scratch = scratch_alloc();
    pr->present_s = calloc((size_t)total, sizeof(double));
    if (!pr->present_s)
        fail("out of memory");
    CU(p_cuEGLStreamProducerConnect(&pr->conn, pr->stream, width, height));
}

/* One cuEGLStreamProducerReturnFrame; 1 when a frame came back (it joins the free list), 0 when
 * none is ready (CUDA_ERROR_LAUNCH_TIMEOUT, also the answer for the frame the stream keeps). */
static int producer_try_return(struct producer *pr)
{
    CUeglFrame back;
    CUresult r = p_cuEGLStreamProducerReturnFrame(&pr->conn, &back, call_stream_of(PRODUCER_SIDE, &pr->cu_stream));
    if (r == CUDA_ERROR_LAUNCH_TIMEOUT)
        return 0;
    if (r != CUDA_SUCCESS)
        fail("cuEGLStreamProducerReturnFrame -> %d %s", r, cu_name(r));
    for (int i = 0; i < POOL; i++)
        if (back.frame.pPitch[0] == pr->pool[i].frame.pPitch[0]) {
            pr->free_list[pr->free_count++] = i;
            return 1;
        }
    fail("cuEGLStreamProducerReturnFrame gave back a frame not in the pool (plane 0 at %p)", back.frame.pPitch[0]);
}

static void producer_wait_return(struct producer *pr)
{
    int64_t deadline = now_ns() + RETURN_DEADLINE_NS;
    while (!producer_try_return(pr))
        if (now_ns() > deadline)
            fail("no frame came back within %lld s", (long long)(RETURN_DEADLINE_NS / 1000000000LL));
}

/* Present frame number k from a free pool frame (waiting for one to come back if none is). */
static void producer_present(struct producer *pr, int k)
{
    if (pr->free_count == 0)
        producer_wait_return(pr);
    int index = pr->free_list[--pr->free_count];
    if (check)
        fill_frame(pr->memory[index], pr->cu_stream, k);
    else if (fill)
        fill_whole(pr->memory[index], pr->cu_stream, k);
    int phase = phase_of(k);
    if (phase >= 0) {  /* BREAKDOWN: the producer queues work in phases 1 and 3, else its stream is idle */
        if (phase & 1)
            queue_kernel(pr->scratch, pr->cu_stream, k);
        else
            CU(p_cuStreamSynchronize(pr->cu_stream));
    } else if (kernels) {
        queue_kernel(pr->scratch, pr->cu_stream, k);
    }
    struct stamp *s = &shm->ring[k % RING];
    int64_t t0 = now_ns();
    __atomic_store_n(&s->t_ns, t0, __ATOMIC_RELAXED);
    __atomic_store_n(&s->seq, (uint64_t)k + 1, __ATOMIC_RELEASE);
    if (host_sync)
        CU(p_cuStreamSynchronize(pr->cu_stream));
    CU(p_cuEGLStreamProducerPresentFrame(&pr->conn, pr->pool[index], call_stream_of(PRODUCER_SIDE, &pr->cu_stream)));
    pr->present_s[k] = (now_ns() - t0) * 1e-9;
}

/* PACE_US: wait until `due` (sleeping while it is far, spinning the last 100-200 us). */
static void pace_until(int64_t due)
{
    int64_t left;
    while ((left = due - now_ns()) > 0) {
        if (left > 200000) {
            int64_t nap = left - 100000;
            struct timespec t = {(time_t)(nap / 1000000000LL), (long)(nap % 1000000000LL)};
            nanosleep(&t, NULL);
        }
    }
}

/* The pipelined producer: every frame, paced by PACE_US if asked, then wait for the consumer. */
static void producer_run(struct producer *pr)
{
    CU(p_cuCtxSetCurrent(pr->ctx));
    int64_t start = now_ns();
    for (int k = 0; k < total; k++) {
        if (pace_ns)
            pace_until(start + k * pace_ns);
        producer_present(pr, k);
        if (pollute_bytes)
            pollute();
    }
}

static void producer_teardown(struct producer *pr)
{
    CU(p_cuCtxSetCurrent(pr->ctx));
    CU(p_cuEGLStreamProducerDisconnect(&pr->conn));
    for (int i = 0; i < POOL; i++)
        p_cuMemFree(pr->memory[i]);
    if (pr->scratch)
        p_cuMemFree(pr->scratch);
}

static double producer_present_median_us(struct producer *pr)
{
    return quantile_us(pr->present_s + warmup, iterations, 0.5);
}

/* ---- the consumer ------------------------------------------------------------------------------ */
/* Creates the stream on the consumer's display, exports its descriptor (EGL hands it out only
 * before an endpoint connects) and connects CUDA as the consumer. */
static void consumer_setup(struct consumer *co, int gpu)
{
    memset(co, 0, sizeof *co);
    co->fd = -1;
    co->ctx = context_for(gpu);
    co->dpy = display_for(gpu);
    NEED(eglCreateStreamKHR); NEED(eglDestroyStreamKHR); NEED(eglQueryStreamKHR); NEED(eglGetStreamFileDescriptorKHR);
    EGLint attribs[] = {EGL_STREAM_FIFO_LENGTH_KHR, FIFO_LENGTH, EGL_NONE};
    co->stream = p_eglCreateStreamKHR(co->dpy, attribs);
    if (!co->stream)
        fail("eglCreateStreamKHR -> EGL error 0x%x", p_eglGetError());
    if (!same_gpu) {
        co->fd = p_eglGetStreamFileDescriptorKHR(co->dpy, co->stream);
        if (co->fd < 0)
            fail("eglGetStreamFileDescriptorKHR -> EGL error 0x%x", p_eglGetError());
    }
    CU(p_cuStreamCreate(&co->cu_stream, stream_flags));
    if (work_on_legacy)
        co->cu_stream = NULL;
    CU(p_cuEGLStreamConsumerConnect(&co->conn, co->stream));
    co->release_s = calloc((size_t)total, sizeof(double));
    co->latency_s = calloc((size_t)total, sizeof(double));
    if (!co->release_s || !co->latency_s)
        fail("out of memory");
    if (peek && (!(co->acquire_s = calloc((size_t)total, sizeof(double)))
                 || !(co->peek_s = calloc((size_t)total, sizeof(double)))))
        fail("out of memory");
    co->scratch = scratch_alloc();
    if (breakdown && !(co->acquire_ns = calloc((size_t)total, sizeof(int64_t))))
        fail("out of memory");
    if (check)
        for (int p = 0; p < G.planes; p++) {
            co->host[p] = malloc(G.row_bytes[p] * G.rows[p]);
            co->want[p] = malloc(G.row_bytes[p]);
            if (!co->host[p] || !co->want[p])
                fail("out of memory");
        }
}

/* An acquire issued while the stream still waits for its producer tears a cross-process stream
 * down (eglcuda, docs/crossprocess.md rule 2): poll the state until the producer is there. */
static void consumer_wait_producer(struct consumer *co)
{
    int64_t deadline = now_ns() + CONNECT_DEADLINE_NS;
    for (;;) {
        EGLint state = stream_state(co->dpy, co->stream);
        if (state == EGL_STREAM_STATE_DISCONNECTED_KHR)
            fail("the stream was disconnected before the first frame");
        if (state != EGL_STREAM_STATE_CONNECTING_KHR && state != EGL_STREAM_STATE_CREATED_KHR)
            return;
        if (now_ns() > deadline)
            fail("no producer connected within %lld s", (long long)(CONNECT_DEADLINE_NS / 1000000000LL));
        struct timespec t = {0, 1000000};
        nanosleep(&t, NULL);
    }
}

/* For the consumer's error lines in twoproc: whether the producer process is still there. */
static const char *peer_note(void)
{
    static char note[64];
    int status;
    note[0] = '\0';
    if (child_pid > 0 && waitpid(child_pid, &status, WNOHANG) == child_pid) {
        child_pid = -1;
        snprintf(note, sizeof note, "; the producer process has ended, status 0x%x", status);
    }
    return note;
}

/* Acquire frame number k (map it, take its latency, check it if asked) and release it. */
static void consumer_frame(struct consumer *co, int k)
{
    CUgraphicsResource resource;
    CUeglFrame mapped;
    if (k == warmup && !co->start_ns)
        co->start_ns = now_ns();
    int64_t t_asked = now_ns();
    if (co->acquire_ns)
        co->acquire_ns[k] = t_asked;
    CUresult r = p_cuEGLStreamConsumerAcquireFrame(&co->conn, &resource, call_stream_of(CONSUMER_SIDE, &co->cu_stream),
                                                acquire_timeout_us);
    int64_t t_acquired = now_ns();
    if (r != CUDA_SUCCESS)
        fail("cuEGLStreamConsumerAcquireFrame (frame %d) -> %d %s (stream state 0x%x%s)", k, r, cu_name(r),
             stream_state(co->dpy, co->stream), peer_note());
    CU(p_cuGraphicsResourceGetMappedEglFrame(&mapped, resource, 0, 0));
    if (co->acquire_s)
        co->acquire_s[k] = (now_ns() - t_asked) * 1e-9;
    /* FIFO: the k-th acquire gets the k-th present, unless the acquire timed out and the driver
     * handed the last frame back again; the stamp tells. */
    struct stamp *s = &shm->ring[k % RING];
    uint64_t seq = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
    if (seq != (uint64_t)k + 1)
        fail("acquire %d returned no new frame within %u us: frame %d not presented yet (the driver hands the last "
             "frame back when an acquire times out; stream state 0x%x%s)", k, acquire_timeout_us, k,
             stream_state(co->dpy, co->stream), peer_note());
    co->latency_s[k] = (t_acquired - __atomic_load_n(&s->t_ns, __ATOMIC_RELAXED)) * 1e-9;
    if (check)
        check_frame(co, &mapped, k);
    if (peek) {
        int64_t before_peek = now_ns();
        peek_frame(co, &mapped, k);
        if (co->peek_s)
            co->peek_s[k] = (now_ns() - before_peek) * 1e-9;
    }
    int phase = phase_of(k);
    if (phase >= 0) {  /* BREAKDOWN: the consumer queues work in phases 2 and 3, else its stream is idle */
        if (phase & 2)
            queue_kernel(co->scratch, co->cu_stream, k);
        else
            CU(p_cuStreamSynchronize(co->cu_stream));
    } else if (kernels) {
        queue_kernel(co->scratch, co->cu_stream, k);
    }
    int64_t t0 = now_ns();
    if (host_sync)
        CU(p_cuStreamSynchronize(co->cu_stream));
    CU(p_cuEGLStreamConsumerReleaseFrame(&co->conn, resource, call_stream_of(CONSUMER_SIDE, &co->cu_stream)));
    int64_t t1 = now_ns();
    co->release_s[k] = (t1 - t0) * 1e-9;
    if (k == total - 1)
        co->end_ns = t1;
}

static void consumer_run(struct consumer *co)
{
    CU(p_cuCtxSetCurrent(co->ctx));
    consumer_wait_producer(co);
    for (int k = 0; k < total; k++) {
        consumer_frame(co, k);
        if (pollute_bytes)
            pollute();
    }
    __atomic_store_n(&shm->consumer_done, 1, __ATOMIC_RELEASE);
}

static void consumer_teardown(struct consumer *co)
{
    CU(p_cuCtxSetCurrent(co->ctx));
    CU(p_cuEGLStreamConsumerDisconnect(&co->conn));
    p_eglDestroyStreamKHR(co->dpy, co->stream);
    if (co->fd >= 0)
        close(co->fd);
    if (co->scratch)
        p_cuMemFree(co->scratch);
}

/* BREAKDOWN: frames/s over the measured frames of one phase (from the start of its first acquire
 * to the start of the next phase's first, or to the last release). */
static double phase_fps(const struct consumer *co, int phase)
{
    int first = -1, n = 0;
    for (int k = warmup; k < total; k++)
        if (phase_of(k) == phase) {
            if (first < 0)
                first = k;
            n++;
        }
    if (n == 0)
        return 0.0;
    int64_t end = first + n < total ? co->acquire_ns[first + n] : co->end_ns;
    return end > co->acquire_ns[first] ? n / ((end - co->acquire_ns[first]) * 1e-9) : 0.0;
}

static void report(struct consumer *co, double present_us)
{
    char extra[1024] = "";
    if (breakdown) {  /* before the quantiles below sort the arrays */
        size_t used = 0;
        for (int phase = 0; phase < 4 && used < sizeof extra; phase++)
            used += (size_t)snprintf(extra + used, sizeof extra - used,
                                     " present_us_%s=%.2f release_us_%s=%.2f latency_p50_us_%s=%.2f fps_%s=%.1f",
                                     PHASE_NAMES[phase], shm->present_phase_us[phase], PHASE_NAMES[phase],
                                     phase_median_us(co->release_s, phase), PHASE_NAMES[phase],
                                     phase_median_us(co->latency_s, phase), PHASE_NAMES[phase], phase_fps(co, phase));
    }
    if (co->peek_s) {
        size_t used = strlen(extra);
        snprintf(extra + used, sizeof extra - used, " acquire_us=%.2f peek_us=%.2f",
                 quantile_us(co->acquire_s + warmup, iterations, 0.5), quantile_us(co->peek_s + warmup, iterations, 0.5));
    }
    double seconds = (co->end_ns - co->start_ns) * 1e-9;
    double p50 = quantile_us(co->latency_s + warmup, iterations, 0.5);
    double p99 = quantile_us(co->latency_s + warmup, iterations, 0.99);
    double release_us = quantile_us(co->release_s + warmup, iterations, 0.5);
    if (check)
        printf("check=ok\n");
    printf("fps=%.1f latency_p50_us=%.2f latency_p99_us=%.2f present_us=%.2f release_us=%.2f%s\n", iterations / seconds,
           p50, p99, present_us, release_us, extra);
    fflush(stdout);
}

/* ---- in one process ---------------------------------------------------------------------------- */
static struct producer the_producer;

static void *producer_thread(void *unused)
{
    (void)unused;
    producer_run(&the_producer);
    return NULL;
}

static void run_inprocess(int producer_gpu, int consumer_gpu, int pipelined)
{
    struct consumer co;
    struct producer *pr = &the_producer;
    load_egl_extensions();
    init_and_count(producer_gpu, consumer_gpu);
    consumer_setup(&co, consumer_gpu);
    require_connecting(co.dpy, co.stream);
    producer_setup(pr, producer_gpu, co.fd, same_gpu ? co.dpy : NULL, same_gpu ? co.stream : NULL, 0);
    if (pipelined) {
        pthread_t thread;
        if (pthread_create(&thread, NULL, producer_thread, NULL) != 0)
            fail("pthread_create failed");
        consumer_run(&co);
        pthread_join(thread, NULL);
    } else {
        /* One thread, the calls in order, each with its side's context current. */
        CU(p_cuCtxSetCurrent(co.ctx));
        consumer_wait_producer(&co);
        for (int k = 0; k < total; k++) {
            if (k == warmup)
                co.start_ns = now_ns();
            CU(p_cuCtxSetCurrent(pr->ctx));
            producer_present(pr, k);
            CU(p_cuCtxSetCurrent(co.ctx));
            consumer_frame(&co, k);
            CU(p_cuCtxSetCurrent(pr->ctx));
            if (k > 0)  /* the stream keeps the newest frame: the one before comes back */
                producer_wait_return(pr);
        }
        co.end_ns = now_ns();
        shm->consumer_done = 1;
    }
    report(&co, producer_present_median_us(pr));
    producer_teardown(pr);
    if (!same_gpu)
        p_eglDestroyStreamKHR(pr->dpy, pr->stream);
    consumer_teardown(&co);
}

/* ---- two processes ----------------------------------------------------------------------------- */
static int send_fd(int sock, int fd)
{
    char byte = 'F';
    struct iovec iov = {&byte, 1};
    union { struct cmsghdr header; char space[CMSG_SPACE(sizeof(int))]; } control;
    struct msghdr msg;
    memset(&control, 0, sizeof control);
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.space;
    msg.msg_controllen = sizeof control.space;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof fd);
    ssize_t n;
    do n = sendmsg(sock, &msg, MSG_NOSIGNAL); while (n < 0 && errno == EINTR);
    return n == 1 ? 0 : -1;
}

/* The descriptor sent with SCM_RIGHTS; -1 on end of file (the parent gave up). */
static int recv_fd(int sock)
{
    char byte;
    struct iovec iov = {&byte, 1};
    union { struct cmsghdr header; char space[CMSG_SPACE(sizeof(int))]; } control;
    struct msghdr msg;
    memset(&control, 0, sizeof control);
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.space;
    msg.msg_controllen = sizeof control.space;
    ssize_t n;
    do n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC); while (n < 0 && errno == EINTR);
    if (n <= 0)
        return -1;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len >= CMSG_LEN(sizeof(int))) {
            int fd;
            memcpy(&fd, CMSG_DATA(c), sizeof fd);
            return fd;
        }
    fail("the parent's message carried no descriptor");
}

/* The child: the producer. Nothing of EGL or CUDA exists in this process before this point. */
static void producer_process(int sock, int producer_gpu, int consumer_gpu)
{
    role = "cross_gpu producer";
    int fd = recv_fd(sock);
    if (fd < 0)
        exit(2);  /* the parent stopped before handing the stream over (and said why) */
    load_egl_extensions();
    init_and_count(producer_gpu, consumer_gpu);
    struct producer *pr = &the_producer;
    producer_setup(pr, producer_gpu, fd, NULL, NULL, 1);
    char ok = 'P';
    if (send(sock, &ok, 1, MSG_NOSIGNAL) != 1)
        fail("the consumer process is gone");
    producer_run(pr);
    for (int phase = 0; phase < 4 && breakdown; phase++)  /* before the median below sorts the array */
        shm->present_phase_us[phase] = phase_median_us(pr->present_s, phase);
    shm->present_median_us = producer_present_median_us(pr);
    /* Stay connected until the consumer has every frame (or its process is gone). */
    while (!__atomic_load_n(&shm->consumer_done, __ATOMIC_ACQUIRE)) {
        struct pollfd pfd = {sock, POLLIN, 0};
        if (poll(&pfd, 1, 1) > 0)
            break;  /* end of file: the parent left */
    }
    producer_teardown(pr);
    p_eglDestroyStreamKHR(pr->dpy, pr->stream);
    close(fd);
    exit(0);
}

static void run_twoproc(int producer_gpu, int consumer_gpu)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        fail("socketpair: %s", strerror(errno));
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        fail("fork: %s", strerror(errno));
    if (pid == 0) {
        close(sv[0]);
        producer_process(sv[1], producer_gpu, consumer_gpu);
    }
    child_pid = pid;
    close(sv[1]);
    int sock = sv[0];
    role = "cross_gpu consumer";
    load_egl_extensions();
    init_and_count(producer_gpu, consumer_gpu);  /* exits 2 (closing the socket ends the child) */
    struct consumer co;
    consumer_setup(&co, consumer_gpu);
    if (send_fd(sock, co.fd) != 0)
        fail("sending the stream's descriptor: %s", strerror(errno));
    /* Wait for the child to say its producer is connected. */
    struct pollfd pfd = {sock, POLLIN, 0};
    int ready;
    do ready = poll(&pfd, 1, (int)(CONNECT_DEADLINE_NS / 1000000)); while (ready < 0 && errno == EINTR);
    char answer = 0;
    if (ready <= 0)
        fail("the producer process did not connect within %lld s", (long long)(CONNECT_DEADLINE_NS / 1000000000LL));
    if (read(sock, &answer, 1) != 1 || answer != 'P') {
        int status = 0;
        waitpid(child_pid, &status, 0);
        child_pid = -1;
        fail("the producer process failed before connecting (exit status %d)", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    }
    consumer_run(&co);
    int status = 0;
    while (waitpid(child_pid, &status, 0) < 0 && errno == EINTR) {}
    child_pid = -1;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail("the producer process failed (status 0x%x)", status);
    report(&co, shm->present_median_us);
    consumer_teardown(&co);
    close(sock);
}

/* ---- fan-out: one producer process, N consumer processes --------------------------------------- */
/* The producer (the parent) holds one connection per consumer process, all on its own GPU's
 * display, and one ring of FAN_POOL frames: each round presents one frame on every stream; the
 * frame is free again once every stream has given it back. */
struct fan {
    CUcontext ctx;
    EGLDisplay dpy;
    CUstream cu_stream;
    CUdeviceptr scratch;
    int sock[MAX_CONSUMERS];                  /* the socket to each consumer process */
    int fd[MAX_CONSUMERS];                    /* the stream descriptors received */
    EGLStreamKHR stream[MAX_CONSUMERS];
    CUeglStreamConnection conn[MAX_CONSUMERS];
    CUdeviceptr memory[FAN_POOL];
    CUeglFrame pool[FAN_POOL];
    int holders[FAN_POOL];                    /* streams that have not given the frame back yet */
    unsigned char held[FAN_POOL][MAX_CONSUMERS]; /* which ones */
    int round_of[FAN_POOL];                   /* the round the frame was last presented in */
    int free_list[FAN_POOL], free_count;
    double *present_s;                        /* round k, consumer c at [k * consumers + c] */
};

/* What each consumer process leaves for the producer's report (shared memory). */
struct fan_result {
    double latency_p50_us, latency_p99_us, release_us;
    int64_t start_ns, end_ns;
    uint32_t done;
};

static struct shared *fan_stamps;     /* one per consumer: the stamps of its stream's presents */
static struct fan_result *fan_results;
static double *fan_latency, *fan_release; /* consumers x iterations: every measured frame's */
static char role_text[64];

static void *shared_memory(size_t bytes)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        fail("mmap of %zu bytes: %s", bytes, strerror(errno));
    return p;
}

/* For the producer's error lines: the consumer processes that have ended. */
static const char *fan_note(void)
{
    static char note[256];
    size_t used = 0;
    note[0] = '\0';
    for (int c = 0; c < fan_children; c++) {
        int status;
        if (fan_child[c] > 0 && waitpid(fan_child[c], &status, WNOHANG) == fan_child[c]) {
            fan_child[c] = -1;
            if (used < sizeof note)
                used += (size_t)snprintf(note + used, sizeof note - used, "; consumer process %d has ended, status 0x%x",
                                         c, status);
        }
    }
    return note;
}

/* One byte from the producer: 1 when it is `want`, 0 at end of file (the producer stopped and
 * said why), and a failure after CONNECT_DEADLINE_NS. */
static int fan_await(int sock, char want, const char *what)
{
    struct pollfd pfd = {sock, POLLIN, 0};
    int ready;
    do ready = poll(&pfd, 1, (int)(CONNECT_DEADLINE_NS / 1000000)); while (ready < 0 && errno == EINTR);
    if (ready <= 0)
        fail("the producer did not %s within %lld s", what, (long long)(CONNECT_DEADLINE_NS / 1000000000LL));
    char answer = 0;
    return read(sock, &answer, 1) == 1 && answer == want;
}

/* A consumer process: its own stream, handed to the producer, then the usual consumer loop. */
static void fan_consumer_process(int c, int sock, int producer_gpu, int consumer_gpu)
{
    snprintf(role_text, sizeof role_text, "cross_gpu consumer %d", c);
    role = role_text;
    shm = &fan_stamps[c];
    /* The producer checks the GPUs first (one message, not one per process). */
    if (!fan_await(sock, 'G', "start"))
        exit(2);
    load_egl_extensions();
    init_and_count(producer_gpu, consumer_gpu);
    struct consumer co;
    consumer_setup(&co, consumer_gpu);
    if (send_fd(sock, co.fd) != 0)
        fail("sending the stream's descriptor: %s", strerror(errno));
    /* Wait for the producer to say it is connected to this stream. */
    if (!fan_await(sock, 'P', "connect"))
        exit(1);  /* the producer failed before connecting (and said why) */
    consumer_run(&co);
    memcpy(fan_latency + (size_t)c * iterations, co.latency_s + warmup, (size_t)iterations * sizeof(double));
    memcpy(fan_release + (size_t)c * iterations, co.release_s + warmup, (size_t)iterations * sizeof(double));
    struct fan_result *mine = &fan_results[c];
    mine->latency_p50_us = quantile_us(co.latency_s + warmup, iterations, 0.5);
    mine->latency_p99_us = quantile_us(co.latency_s + warmup, iterations, 0.99);
    mine->release_us = quantile_us(co.release_s + warmup, iterations, 0.5);
    mine->start_ns = co.start_ns;
    mine->end_ns = co.end_ns;
    __atomic_store_n(&mine->done, 1, __ATOMIC_RELEASE);
    /* Stay connected until the producer has disconnected (it closes the socket then) or is gone. */
    struct pollfd pfd = {sock, POLLIN, 0};
    int ready;
    do ready = poll(&pfd, 1, (int)(CONNECT_DEADLINE_NS / 1000000)); while (ready < 0 && errno == EINTR);
    consumer_teardown(&co);
    exit(0);
}

/* One cuEGLStreamProducerReturnFrame on stream c; 1 when a frame came back. */
static int fan_try_return(struct fan *f, int c)
{
    CUeglFrame back;
    CUresult r = p_cuEGLStreamProducerReturnFrame(&f->conn[c], &back, call_stream_of(PRODUCER_SIDE, &f->cu_stream));
    if (r == CUDA_ERROR_LAUNCH_TIMEOUT)
        return 0;
    if (r != CUDA_SUCCESS)
        fail("cuEGLStreamProducerReturnFrame (consumer %d) -> %d %s%s", c, r, cu_name(r), fan_note());
    for (int i = 0; i < FAN_POOL; i++)
        if (back.frame.pPitch[0] == f->pool[i].frame.pPitch[0]) {
            if (!f->held[i][c])
                fail("consumer %d's stream gave back frame %d, which it had given back already", c, i);
            f->held[i][c] = 0;
            if (--f->holders[i] == 0)
                f->free_list[f->free_count++] = i;
            return 1;
        }
    fail("cuEGLStreamProducerReturnFrame (consumer %d) gave back a frame not in the pool (plane 0 at %p)", c,
         back.frame.pPitch[0]);
}

/* A frame every stream has given back, waiting for the streams if none is. A return with nothing
 * to give back waits up to about a millisecond inside the driver (eglcuda, csrc/helpers.c), so
 * only the streams that hold the oldest frame out are asked, one at a time: each stream gives its
 * frames back in the order they were presented, so that is the frame each of them returns next. */
static int fan_take(struct fan *f)
{
    int64_t deadline = now_ns() + RETURN_DEADLINE_NS;
    for (unsigned int misses = 0; f->free_count == 0;) {
        int oldest = -1, c = 0;
        for (int i = 0; i < FAN_POOL; i++)
            if (f->holders[i] > 0 && (oldest < 0 || f->round_of[i] < f->round_of[oldest]))
                oldest = i;
        while (!f->held[oldest][c])
            c++;
        if (fan_try_return(f, c))
            continue;
        if (++misses % 16 == 0) {
            const char *note = fan_note();
            if (*note)
                fail("waiting for the frames to come back%s", note);
            if (now_ns() > deadline)
                fail("frame %d did not come back from consumer %d within %lld s", oldest, c,
                     (long long)(RETURN_DEADLINE_NS / 1000000000LL));
        }
    }
    return f->free_list[--f->free_count];
}

static void fan_present_all(struct fan *f, int k)
{
    int i = fan_take(f);
    if (check)
        fill_frame(f->memory[i], f->cu_stream, k);
    else if (fill)
        fill_whole(f->memory[i], f->cu_stream, k);
    if (kernels)
        queue_kernel(f->scratch, f->cu_stream, k);
    f->holders[i] = consumers;
    f->round_of[i] = k;
    memset(f->held[i], 1, (size_t)consumers);
    for (int c = 0; c < consumers; c++) {
        struct stamp *s = &fan_stamps[c].ring[k % RING];
        int64_t t0 = now_ns();
        __atomic_store_n(&s->t_ns, t0, __ATOMIC_RELAXED);
        __atomic_store_n(&s->seq, (uint64_t)k + 1, __ATOMIC_RELEASE);
        CUresult r = p_cuEGLStreamProducerPresentFrame(&f->conn[c], f->pool[i], call_stream_of(PRODUCER_SIDE, &f->cu_stream));
        if (r != CUDA_SUCCESS)
            fail("cuEGLStreamProducerPresentFrame (round %d, consumer %d) -> %d %s%s", k, c, r, cu_name(r), fan_note());
        f->present_s[(size_t)k * consumers + c] = (now_ns() - t0) * 1e-9;
    }
}

static void run_fanout(int producer_gpu, int consumer_gpu)
{
    static struct fan the_fan;
    struct fan *f = &the_fan;
    fan_stamps = shared_memory((size_t)consumers * sizeof *fan_stamps);
    fan_results = shared_memory((size_t)consumers * sizeof *fan_results);
    fan_latency = shared_memory((size_t)consumers * iterations * sizeof(double));
    fan_release = shared_memory((size_t)consumers * iterations * sizeof(double));
    /* The consumer processes first: no CUDA or EGL display exists in this process yet. */
    for (int c = 0; c < consumers; c++) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
            fail("socketpair: %s", strerror(errno));
        fflush(stdout);
        fflush(stderr);
        pid_t pid = fork();
        if (pid < 0)
            fail("fork: %s", strerror(errno));
        if (pid == 0) {
            /* Only this consumer's socket: a sibling's kept open here would hide its end of file. */
            close(sv[0]);
            for (int j = 0; j < c; j++)
                close(f->sock[j]);
            fan_children = 0;
            fan_consumer_process(c, sv[1], producer_gpu, consumer_gpu);
        }
        close(sv[1]);
        f->sock[c] = sv[0];
        fan_child[fan_children++] = pid;
    }
    role = "cross_gpu producer";
    load_egl_extensions();
    init_and_count(producer_gpu, consumer_gpu);  /* exits 2 (die takes the consumers down) */
    for (int c = 0; c < consumers; c++) {
        char go = 'G';
        if (send(f->sock[c], &go, 1, MSG_NOSIGNAL) != 1)
            fail("consumer process %d is gone%s", c, fan_note());
    }
    f->ctx = context_for(producer_gpu);
    f->dpy = display_for(producer_gpu);
    NEED(eglCreateStreamFromFileDescriptorKHR); NEED(eglDestroyStreamKHR); NEED(eglQueryStreamKHR);
    CU(p_cuStreamCreate(&f->cu_stream, stream_flags));
    for (int i = 0; i < FAN_POOL; i++) {
        CU(p_cuMemAlloc(&f->memory[i], G.bytes));
        describe_frame(&f->pool[i], f->memory[i]);
        f->free_list[i] = i;
    }
    f->free_count = FAN_POOL;
    f->scratch = scratch_alloc();
    f->present_s = calloc((size_t)total * consumers, sizeof(double));
    if (!f->present_s)
        fail("out of memory");
    for (int c = 0; c < consumers; c++) {
        struct pollfd pfd = {f->sock[c], POLLIN, 0};
        int ready;
        do ready = poll(&pfd, 1, (int)(CONNECT_DEADLINE_NS / 1000000)); while (ready < 0 && errno == EINTR);
        if (ready <= 0)
            fail("consumer process %d did not hand its stream over within %lld s", c,
                 (long long)(CONNECT_DEADLINE_NS / 1000000000LL));
        f->fd[c] = recv_fd(f->sock[c]);
        if (f->fd[c] < 0)
            fail("consumer process %d ended before handing its stream over%s", c, fan_note());
        /* The descriptor stays open until the end (docs/crossprocess.md rule 1). */
        f->stream[c] = p_eglCreateStreamFromFileDescriptorKHR(f->dpy, f->fd[c]);
        if (!f->stream[c])
            fail("eglCreateStreamFromFileDescriptorKHR (consumer %d) -> EGL error 0x%x", c, p_eglGetError());
        require_connecting(f->dpy, f->stream[c]);
        CU(p_cuEGLStreamProducerConnect(&f->conn[c], f->stream[c], width, height));
    }
    /* Every stream is connected: the consumers start acquiring (their first acquire waits at most
     * ACQUIRE_TIMEOUT_US, so not while the other streams are still being connected). */
    for (int c = 0; c < consumers; c++) {
        char ok = 'P';
        if (send(f->sock[c], &ok, 1, MSG_NOSIGNAL) != 1)
            fail("consumer process %d is gone%s", c, fan_note());
    }
    int64_t start = now_ns();
    for (int k = 0; k < total; k++) {
        if (pace_ns)
            pace_until(start + k * pace_ns);
        fan_present_all(f, k);
    }
    /* Stay connected until every consumer has every frame. */
    int64_t deadline = now_ns() + CONNECT_DEADLINE_NS;
    for (int c = 0; c < consumers; c++)
        while (!__atomic_load_n(&fan_results[c].done, __ATOMIC_ACQUIRE)) {
            const char *note = fan_note();
            if (*note)
                fail("a consumer ended before its last frame%s", note);
            if (now_ns() > deadline)
                fail("consumer %d did not release its last frame within %lld s", c,
                     (long long)(CONNECT_DEADLINE_NS / 1000000000LL));
            struct timespec t = {0, 200000};
            nanosleep(&t, NULL);
        }
    double present_us = quantile_us(f->present_s + (size_t)warmup * consumers, iterations * consumers, 0.5);
    CU(p_cuCtxSetCurrent(f->ctx));
    for (int c = 0; c < consumers; c++) {
        CU(p_cuEGLStreamProducerDisconnect(&f->conn[c]));
        p_eglDestroyStreamKHR(f->dpy, f->stream[c]);
        close(f->fd[c]);
        close(f->sock[c]);  /* end of file: the consumer disconnects and exits */
    }
    for (int i = 0; i < FAN_POOL; i++)
        p_cuMemFree(f->memory[i]);
    if (f->scratch)
        p_cuMemFree(f->scratch);
    for (int c = 0; c < consumers; c++) {
        int status = 0;
        if (fan_child[c] > 0) {
            while (waitpid(fan_child[c], &status, 0) < 0 && errno == EINTR) {}
            fan_child[c] = -1;
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail("consumer process %d failed (status 0x%x)", c, status);
    }
    int64_t first = fan_results[0].start_ns, last = fan_results[0].end_ns;
    for (int c = 1; c < consumers; c++) {
        if (fan_results[c].start_ns < first)
            first = fan_results[c].start_ns;
        if (fan_results[c].end_ns > last)
            last = fan_results[c].end_ns;
    }
    if (check)
        printf("check=ok\n");
    for (int c = 0; c < consumers; c++)
        printf("consumer=%d latency_p50_us=%.2f latency_p99_us=%.2f release_us=%.2f\n", c, fan_results[c].latency_p50_us,
               fan_results[c].latency_p99_us, fan_results[c].release_us);
    int n = iterations * consumers;
    printf("fps=%.1f latency_p50_us=%.2f latency_p99_us=%.2f present_us=%.2f release_us=%.2f consumers=%d\n",
           iterations / ((last - first) * 1e-9), quantile_us(fan_latency, n, 0.5), quantile_us(fan_latency, n, 0.99),
           present_us, quantile_us(fan_release, n, 0.5), consumers);
    fflush(stdout);
}

/* ---- main -------------------------------------------------------------------------------------- */
static int parse_int(const char *text, int low, int high, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < low || v > high)
        return -1;
    *out = (int)v;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 8 && argc != 9)
        usage_exit(NULL);
    const char *mode = argv[1];
    int twoproc = strcmp(mode, "twoproc") == 0, pipelined = strcmp(mode, "inprocess_pipelined") == 0;
    int fanout = strcmp(mode, "fanout") == 0;
    if (!twoproc && !pipelined && !fanout && strcmp(mode, "inprocess") != 0)
        usage_exit(NULL);
    if (argc == 9 && !fanout)
        usage_exit("CONSUMERS is fanout's argument");
    int producer_gpu, consumer_gpu, nv12;
    if (parse_int(argv[2], 0, 1023, &producer_gpu) || parse_int(argv[3], 0, 1023, &consumer_gpu))
        usage_exit("the GPUs are CUDA ordinals");
    if (parse_int(argv[4], 1, 32768, &width) || parse_int(argv[5], 1, 32768, &height))
        usage_exit("WIDTH and HEIGHT are in 1..32768");
    if (strcmp(argv[6], "argb") == 0)
        nv12 = 0;
    else if (strcmp(argv[6], "nv12") == 0)
        nv12 = 1;
    else
        usage_exit("FORMAT is argb or nv12");
    if (nv12 && (width % 2 || height % 2))
        usage_exit("nv12 needs an even WIDTH and HEIGHT");
    if (parse_int(argv[7], 1, 100000000, &iterations))
        usage_exit("ITERATIONS is a positive number");
    const char *env = getenv("CHECK");
    check = env && *env && strcmp(env, "0") != 0;
    env = getenv("PACE_US");
    int pace_us = 0;
    if (env && *env && parse_int(env, 0, 10000000, &pace_us))
        usage_exit("PACE_US is a number of microseconds");
    pace_ns = (int64_t)pace_us * 1000;
    acquire_timeout_us = ACQUIRE_TIMEOUT_US + 2u * (unsigned int)pace_us;
    env = argc == 9 ? argv[8] : getenv("CONSUMERS");
    if (fanout && env && *env && parse_int(env, 1, MAX_CONSUMERS, &consumers))
        usage_exit("CONSUMERS is a number of consumer processes, 1..32");
    env = getenv("KERNELS");
    kernels = env && *env && strcmp(env, "0") != 0;
    env = getenv("PEEK");
    peek = env && *env && strcmp(env, "0") != 0;
    env = getenv("PEEK_1D");
    peek_1d = env && *env && strcmp(env, "0") != 0;
    env = getenv("NONBLOCKING");
    stream_flags = env && *env && strcmp(env, "0") != 0 ? 1u /* CU_STREAM_NON_BLOCKING */ : 0u;
    const char *call_names[3] = {"CALL_STREAM", "CALL_STREAM_PRODUCER", "CALL_STREAM_CONSUMER"};
    for (int i = 0; i < 3; i++) {
        env = getenv(call_names[i]);
        if (env && *env && set_call_stream(i - 1, env))
            usage_exit("CALL_STREAM, CALL_STREAM_PRODUCER and CALL_STREAM_CONSUMER are own, legacy or per-thread");
    }
    env = getenv("HOST_SYNC");
    host_sync = env && *env && strcmp(env, "0") != 0;
    env = getenv("WORK_STREAM");
    work_on_legacy = env && strcmp(env, "legacy") == 0;
    if (env && *env && !work_on_legacy && strcmp(env, "own") != 0)
        usage_exit("WORK_STREAM is own or legacy");
    env = getenv("FILL");
    fill = env && *env && strcmp(env, "0") != 0;
    env = getenv("BREAKDOWN");
    breakdown = env && *env && strcmp(env, "0") != 0;
    env = getenv("POLLUTE_KB");
    if (env && *env) {
        int kib = 0;
        if (!twoproc)
            usage_exit("POLLUTE_KB is for twoproc");
        if (parse_int(env, 0, 1 << 20, &kib))
            usage_exit("POLLUTE_KB is a number of KiB, 0..1048576");
        pollute_bytes = (size_t)kib * 1024;
        if (pollute_bytes && !(pollute_buffer = calloc(pollute_bytes, 1)))
            fail("POLLUTE_KB: out of memory");
    }
    if (fill && check)
        usage_exit("FILL=1 and CHECK=1 both write every frame: choose one");
    if (breakdown && !twoproc)
        usage_exit("BREAKDOWN=1 is for twoproc");
    if (breakdown && check)
        usage_exit("BREAKDOWN=1 times the calls without CHECK's fills and copies");
    if (breakdown && fill)
        usage_exit("BREAKDOWN=1 times the calls without FILL's writes");
    if (breakdown && iterations < 40)
        usage_exit("BREAKDOWN=1 needs ITERATIONS >= 40 (four phases)");
    warmup = iterations / 10 + 2;
    total = warmup + iterations;
    /* One GPU for both ends, in one process: one display, one stream object, no descriptor. */
    same_gpu = !twoproc && !fanout && producer_gpu == consumer_gpu;
    set_geometry(nv12);

    load_libraries();
    /* The present stamps: shared with the child in twoproc, so made before any fork. */
    shm = mmap(NULL, sizeof *shm, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shm == MAP_FAILED)
        fail("mmap: %s", strerror(errno));
    if (twoproc)
        run_twoproc(producer_gpu, consumer_gpu);
    else if (fanout)
        run_fanout(producer_gpu, consumer_gpu);
    else
        run_inprocess(producer_gpu, consumer_gpu, pipelined);
    return 0;
}
