/* Research record (see research/README.md): frozen record (uses the old layout: gap_probe.py and inprocess_probe.py feed it endpoint internals; ran at 0fd9a72 to c68e07a). */
/* Probe: the C serial round trip run inside a Python process, on connections eglcuda made.
 * gap_ns: busy-wait this long after each driver call (stand-in for interpreter time);
 * pollute_kb: write this much memory after each call (stand-in for the interpreter's cache use). */
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "../../csrc/egl_core.h"
#include "../../csrc/egl_stream.h"
#include "../../csrc/cuda_egl.h"

static double now_s(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static volatile unsigned char *junk;
static void between(long gap_ns, long pollute_kb)
{
    if (pollute_kb) for (long i = 0; i < pollute_kb * 1024; i += 64) junk[i]++;
    if (gap_ns) { double end = now_s() + gap_ns * 1e-9; while (now_s() < end) {} }
}

double serial_loop(CUeglStreamConnection *producer, CUeglStreamConnection *consumer, CUeglFrame *frames,
                   CUstream consumer_stream, int iterations, long gap_ns, long pollute_kb)
{
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    __typeof__(&cuEGLStreamProducerPresentFrame) present = dlsym(cuda, "cuEGLStreamProducerPresentFrame");
    __typeof__(&cuEGLStreamConsumerAcquireFrame) acquire = dlsym(cuda, "cuEGLStreamConsumerAcquireFrame");
    __typeof__(&cuGraphicsResourceGetMappedEglFrame) map = dlsym(cuda, "cuGraphicsResourceGetMappedEglFrame");
    __typeof__(&cuEGLStreamConsumerReleaseFrame) release = dlsym(cuda, "cuEGLStreamConsumerReleaseFrame");
    __typeof__(&cuEGLStreamProducerReturnFrame) ret = dlsym(cuda, "cuEGLStreamProducerReturnFrame");
    if (!junk) junk = calloc(8 << 20, 1);
    CUgraphicsResource resource;
    CUeglFrame mapped, back;
    CUstream producer_stream = NULL, cstream = consumer_stream;
    int warmup = iterations / 10 + 2;
    double start = 0;
    for (int i = 0; i < iterations + warmup; i++) {
        if (i == warmup) start = now_s();
        if (present(producer, frames[i % 2], &producer_stream)) return -1;
        between(gap_ns, pollute_kb);
        if (acquire(consumer, &resource, &cstream, 1000000)) return -2;
        between(gap_ns, pollute_kb);
        if (map(&mapped, resource, 0, 0)) return -3;
        between(gap_ns, pollute_kb);
        if (release(consumer, resource, &cstream)) return -4;
        between(gap_ns, pollute_kb);
        if (i > 0) {
            CUresult r;
            while ((r = ret(producer, &back, &producer_stream)) == CUDA_ERROR_LAUNCH_TIMEOUT) {}
            if (r) return -5;
            between(gap_ns, pollute_kb);
        }
    }
    return 1e6 * (now_s() - start) / iterations;
}

/* serial_loop with exactly the driver calls of eglcuda's four-call loop: the current-context check
 * before present, acquire (with map and the frame counter query), release and return. */
double serial_loop_same(CUeglStreamConnection *producer, CUeglStreamConnection *consumer, CUeglFrame *frames,
                        CUstream consumer_stream, int iterations, CUcontext context, EGLDisplay dpy,
                        EGLStreamKHR egl_stream)
{
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW), *egl = dlopen("libEGL.so.1", RTLD_NOW);
    __typeof__(&cuEGLStreamProducerPresentFrame) present = dlsym(cuda, "cuEGLStreamProducerPresentFrame");
    __typeof__(&cuEGLStreamConsumerAcquireFrame) acquire = dlsym(cuda, "cuEGLStreamConsumerAcquireFrame");
    __typeof__(&cuGraphicsResourceGetMappedEglFrame) map = dlsym(cuda, "cuGraphicsResourceGetMappedEglFrame");
    __typeof__(&cuEGLStreamConsumerReleaseFrame) release = dlsym(cuda, "cuEGLStreamConsumerReleaseFrame");
    __typeof__(&cuEGLStreamProducerReturnFrame) ret = dlsym(cuda, "cuEGLStreamProducerReturnFrame");
    __typeof__(&cuCtxGetCurrent) get_current = dlsym(cuda, "cuCtxGetCurrent");
    __typeof__(&eglGetProcAddress) proc = dlsym(egl, "eglGetProcAddress");
    __typeof__(&eglQueryStreamu64KHR) query = (__typeof__(&eglQueryStreamu64KHR))proc("eglQueryStreamu64KHR");
    CUgraphicsResource resource;
    CUeglFrame mapped, back;
    CUcontext current;
    EGLuint64KHR number;
    CUstream producer_stream = NULL, cstream = consumer_stream;
    int warmup = iterations / 10 + 2;
    double start = 0;
    for (int i = 0; i < iterations + warmup; i++) {
        if (i == warmup) start = now_s();
        if (get_current(&current) || current != context) return -6;
        if (present(producer, frames[i % 2], &producer_stream)) return -1;
        if (get_current(&current) || current != context) return -6;
        if (acquire(consumer, &resource, &cstream, 1000000)) return -2;
        if (map(&mapped, resource, 0, 0)) return -3;
        if (!query(dpy, egl_stream, EGL_CONSUMER_FRAME_KHR, &number)) return -7;
        if (get_current(&current) || current != context) return -6;
        if (release(consumer, resource, &cstream)) return -4;
        if (i > 0) {
            CUresult r;
            if (get_current(&current) || current != context) return -6;
            while ((r = ret(producer, &back, &producer_stream)) == CUDA_ERROR_LAUNCH_TIMEOUT) {}
            if (r) return -5;
        }
    }
    return 1e6 * (now_s() - start) / iterations;
}
