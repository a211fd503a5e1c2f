/* C reference for bench/stream_roundtrip.py: the same driver calls eglcuda makes, with no Python.
 *
 *   stream_roundtrip WIDTH HEIGHT ITERATIONS MODE
 * MODE: serial|serial_counter|serial_same|serial_same_counter|pipelined|breakdown
 * prints "us_per_frame=<float> fps=<float>"; breakdown also prints the median microseconds of each
 * call of the serial loop ("present=... acquire=... map=... release=... return=...").
 * serial_counter also reads the stream's consumer frame counter (eglQueryStreamu64KHR) after each
 * acquire, as eglcuda's consumer does when its producer is in another process: it tells a new
 * frame from an old one handed back again.
 * serial_same makes exactly the driver calls of eglcuda's four-call loop with both ends in one
 * process: serial plus the current-context check (cuCtxGetCurrent) eglcuda makes before each of
 * present, acquire (with map), release and return. (Frame numbers then come from the producer's
 * present counts, without the query.) serial_same_counter adds the counter query to it.
 *
 * Types come from eglcuda's own declarations (csrc/); libEGL and libcuda are opened at run time
 * like eglcuda does, so the build needs neither headers nor link libraries. */
#include <dlfcn.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../../csrc/egl_core.h"
#include "../../csrc/egl_stream.h"
#include "../../csrc/cuda_egl.h"

#define FN(name) static __typeof__(&name) p_##name
FN(eglGetProcAddress); FN(eglGetPlatformDisplay); FN(eglInitialize); FN(eglQueryDevicesEXT);
FN(eglQueryDeviceAttribEXT); FN(eglCreateStreamKHR); FN(eglDestroyStreamKHR); FN(eglQueryStreamu64KHR);
FN(cuInit); FN(cuDeviceGet); FN(cuDevicePrimaryCtxRetain); FN(cuCtxSetCurrent); FN(cuCtxGetCurrent); FN(cuMemAlloc);
FN(cuStreamCreate); FN(cuEGLStreamConsumerConnect); FN(cuEGLStreamProducerConnect);
FN(cuEGLStreamConsumerAcquireFrame); FN(cuGraphicsResourceGetMappedEglFrame); FN(cuEGLStreamConsumerReleaseFrame);
FN(cuEGLStreamProducerPresentFrame); FN(cuEGLStreamProducerReturnFrame);
FN(cuEGLStreamConsumerDisconnect); FN(cuEGLStreamProducerDisconnect);

#define CHECK(call) do { CUresult r_ = (call); if (r_) { fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #call, r_); exit(1); } } while (0)

static void *must(void *p, const char *what) { if (!p) { fprintf(stderr, "missing %s\n", what); exit(2); } return p; }
#define LOAD(lib, name, sym) p_##name = (__typeof__(p_##name))must(dlsym(lib, sym), sym)
#define LOADX(name) p_##name = (__typeof__(p_##name))must(p_eglGetProcAddress(#name), #name)

static double now_s(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static int by_value(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
static double median_us(double *values, int n) { qsort(values, n, sizeof *values, by_value); return 1e6 * values[n / 2]; }

enum { POOL = 6 };
static CUeglStreamConnection consumer, producer;
static CUcontext context;
static CUeglFrame frames[POOL];
static int iterations;

/* What eglcuda's helpers do before each call from Python: make the context current unless it is. */
static void ensure_current(void)
{
    CUcontext current = NULL;
    CHECK(p_cuCtxGetCurrent(&current));
    if (current != context)
        CHECK(p_cuCtxSetCurrent(context));
}

static void *produce(void *unused)
{
    int free_count = POOL, next = 0;
    CUstream stream = NULL;
    CUeglFrame back;
    (void)unused;
    p_cuCtxSetCurrent(context);
    for (int i = 0; i < iterations; i++) {
        while (free_count == 0) {
            if (p_cuEGLStreamProducerReturnFrame(&producer, &back, &stream) == CUDA_SUCCESS)
                free_count++;
        }
        /* Frames come back in order (FIFO), so a ring index picks a free one. */
        CHECK(p_cuEGLStreamProducerPresentFrame(&producer, frames[next], &stream));
        next = (next + 1) % POOL;
        free_count--;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 5) { fprintf(stderr, "usage: %s WIDTH HEIGHT ITERATIONS serial|serial_counter|serial_same|serial_same_counter|pipelined|breakdown\n", argv[0]); return 2; }
    int width = atoi(argv[1]), height = atoi(argv[2]);
    iterations = atoi(argv[3]);
    int pipelined = strcmp(argv[4], "pipelined") == 0;
    int breakdown = strcmp(argv[4], "breakdown") == 0;
    int same = strcmp(argv[4], "serial_same") == 0 || strcmp(argv[4], "serial_same_counter") == 0;
    int counter = strcmp(argv[4], "serial_counter") == 0 || strcmp(argv[4], "serial_same_counter") == 0;
    void *egl = must(dlopen("libEGL.so.1", RTLD_NOW), "libEGL.so.1");
    void *cuda = must(dlopen("libcuda.so.1", RTLD_NOW), "libcuda.so.1");
    LOAD(egl, eglGetProcAddress, "eglGetProcAddress"); LOAD(egl, eglGetPlatformDisplay, "eglGetPlatformDisplay");
    LOAD(egl, eglInitialize, "eglInitialize");
    LOADX(eglQueryDevicesEXT); LOADX(eglQueryDeviceAttribEXT); LOADX(eglCreateStreamKHR); LOADX(eglDestroyStreamKHR);
    LOADX(eglQueryStreamu64KHR);
    LOAD(cuda, cuInit, "cuInit"); LOAD(cuda, cuDeviceGet, "cuDeviceGet");
    LOAD(cuda, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"); LOAD(cuda, cuCtxSetCurrent, "cuCtxSetCurrent");
    LOAD(cuda, cuCtxGetCurrent, "cuCtxGetCurrent");
    LOAD(cuda, cuMemAlloc, "cuMemAlloc_v2"); LOAD(cuda, cuStreamCreate, "cuStreamCreate");
    LOAD(cuda, cuEGLStreamConsumerConnect, "cuEGLStreamConsumerConnect");
    LOAD(cuda, cuEGLStreamProducerConnect, "cuEGLStreamProducerConnect");
    LOAD(cuda, cuEGLStreamConsumerAcquireFrame, "cuEGLStreamConsumerAcquireFrame");
    LOAD(cuda, cuGraphicsResourceGetMappedEglFrame, "cuGraphicsResourceGetMappedEglFrame");
    LOAD(cuda, cuEGLStreamConsumerReleaseFrame, "cuEGLStreamConsumerReleaseFrame");
    LOAD(cuda, cuEGLStreamProducerPresentFrame, "cuEGLStreamProducerPresentFrame");
    LOAD(cuda, cuEGLStreamProducerReturnFrame, "cuEGLStreamProducerReturnFrame");
    LOAD(cuda, cuEGLStreamConsumerDisconnect, "cuEGLStreamConsumerDisconnect");
    LOAD(cuda, cuEGLStreamProducerDisconnect, "cuEGLStreamProducerDisconnect");

    /* The EGL device of CUDA device 0, matched through EGL_CUDA_DEVICE_NV. */
    EGLDeviceEXT devices[16];
    EGLint count = 0;
    p_eglQueryDevicesEXT(16, devices, &count);
    EGLDisplay dpy = NULL;
    for (int i = 0; i < count && !dpy; i++) {
        EGLAttrib ordinal = -1;
        if (p_eglQueryDeviceAttribEXT(devices[i], EGL_CUDA_DEVICE_NV, &ordinal) && ordinal == 0)
            dpy = p_eglGetPlatformDisplay(EGL_PLATFORM_DEVICE_EXT, devices[i], NULL);
    }
    must(dpy, "an EGL display for CUDA device 0");
    p_eglInitialize(dpy, NULL, NULL);
    CUdevice device;
    CHECK(p_cuInit(0)); CHECK(p_cuDeviceGet(&device, 0)); CHECK(p_cuDevicePrimaryCtxRetain(&context, device));
    CHECK(p_cuCtxSetCurrent(context));

    EGLint attribs[] = {EGL_STREAM_FIFO_LENGTH_KHR, 4, EGL_NONE};
    EGLStreamKHR stream = must(p_eglCreateStreamKHR(dpy, pipelined ? attribs : attribs + 2), "stream");
    CHECK(p_cuEGLStreamConsumerConnect(&consumer, stream));
    CHECK(p_cuEGLStreamProducerConnect(&producer, stream, width, height));
    unsigned int pitch = (unsigned int)((width * 4 + 255) / 256 * 256);
    for (int i = 0; i < POOL; i++) {
        CUdeviceptr ptr;
        CHECK(p_cuMemAlloc(&ptr, (size_t)pitch * height));
        memset(&frames[i], 0, sizeof frames[i]);
        frames[i].frame.pPitch[0] = (void *)(uintptr_t)ptr;
        frames[i].width = width; frames[i].height = height; frames[i].depth = 1; frames[i].pitch = pitch;
        frames[i].planeCount = 1; frames[i].numChannels = 4; frames[i].frameType = CU_EGL_FRAME_TYPE_PITCH;
        frames[i].eglColorFormat = CU_EGL_COLOR_FORMAT_ARGB; frames[i].cuFormat = CU_AD_FORMAT_UNSIGNED_INT8;
    }
    CUstream consumer_stream;
    CHECK(p_cuStreamCreate(&consumer_stream, 0));
    CUgraphicsResource resource;
    CUeglFrame mapped, back;
    EGLuint64KHR consumer_frame = 0;
    CUstream producer_stream = NULL;
    double start = 0;
    if (breakdown) {
        /* The serial loop with a clock read between calls: where C's time goes. */
        double *spent[5];
        for (int k = 0; k < 5; k++) spent[k] = calloc(iterations, sizeof(double));
        for (int i = 0; i < iterations; i++) {
            double t0 = now_s();
            CHECK(p_cuEGLStreamProducerPresentFrame(&producer, frames[i % 2], &producer_stream));
            double t1 = now_s();
            CHECK(p_cuEGLStreamConsumerAcquireFrame(&consumer, &resource, &consumer_stream, 1000000));
            double t2 = now_s();
            CHECK(p_cuGraphicsResourceGetMappedEglFrame(&mapped, resource, 0, 0));
            double t3 = now_s();
            CHECK(p_cuEGLStreamConsumerReleaseFrame(&consumer, resource, &consumer_stream));
            double t4 = now_s();
            if (i > 0) {
                CUresult r;
                while ((r = p_cuEGLStreamProducerReturnFrame(&producer, &back, &producer_stream)) == CUDA_ERROR_LAUNCH_TIMEOUT) {}
                CHECK(r);
            }
            double t5 = now_s();
            spent[0][i] = t1 - t0; spent[1][i] = t2 - t1; spent[2][i] = t3 - t2; spent[3][i] = t4 - t3; spent[4][i] = t5 - t4;
        }
        int skip = iterations / 10 + 1, n = iterations - skip;
        printf("present=%.3f acquire=%.3f map=%.3f release=%.3f return=%.3f\n", median_us(spent[0] + skip, n),
               median_us(spent[1] + skip, n), median_us(spent[2] + skip, n), median_us(spent[3] + skip, n),
               median_us(spent[4] + skip, n));
        start = now_s() - 1e-9;
    } else if (!pipelined) {
        int warmup = iterations / 10 + 2;
        for (int i = 0; i < iterations + warmup; i++) {
            if (i == warmup) start = now_s();
            if (same) ensure_current();
            CHECK(p_cuEGLStreamProducerPresentFrame(&producer, frames[i % 2], &producer_stream));
            if (same) ensure_current();
            CHECK(p_cuEGLStreamConsumerAcquireFrame(&consumer, &resource, &consumer_stream, 1000000));
            CHECK(p_cuGraphicsResourceGetMappedEglFrame(&mapped, resource, 0, 0));
            if (counter && !p_eglQueryStreamu64KHR(dpy, stream, EGL_CONSUMER_FRAME_KHR, &consumer_frame)) {
                fprintf(stderr, "eglQueryStreamu64KHR failed\n");
                exit(1);
            }
            if (same) ensure_current();
            CHECK(p_cuEGLStreamConsumerReleaseFrame(&consumer, resource, &consumer_stream));
            if (i > 0) {  /* the stream keeps the newest frame: the previous one comes back */
                CUresult r;
                if (same) ensure_current();
                while ((r = p_cuEGLStreamProducerReturnFrame(&producer, &back, &producer_stream)) == CUDA_ERROR_LAUNCH_TIMEOUT) {}
                CHECK(r);
            }
        }
    } else {
        pthread_t thread;
        start = now_s();
        pthread_create(&thread, NULL, produce, NULL);
        for (int got = 0; got < iterations; got++) {
            CHECK(p_cuEGLStreamConsumerAcquireFrame(&consumer, &resource, &consumer_stream, 1000000));
            CHECK(p_cuGraphicsResourceGetMappedEglFrame(&mapped, resource, 0, 0));
            CHECK(p_cuEGLStreamConsumerReleaseFrame(&consumer, resource, &consumer_stream));
        }
        pthread_join(thread, NULL);
    }
    double elapsed = now_s() - start;
    printf("us_per_frame=%.3f fps=%.1f\n", 1e6 * elapsed / iterations, iterations / elapsed);
    p_cuEGLStreamProducerDisconnect(&producer);
    p_cuEGLStreamConsumerDisconnect(&consumer);
    p_eglDestroyStreamKHR(dpy, stream);
    return 0;
}
