/* C reference for bench/sources.py's paced rows: what a subscriber's frame costs at a camera's
 * rate with no Python, the same system calls and driver calls eglcuda's cuda-ipc subscriber makes.
 *
 *   subscriber_wake RATE SECONDS MODE [SOURCES]
 * MODE  bare   the wake and the messages only (no CUDA): epoll_wait, read the frame's message,
 *              write the release
 *       cuda   the same plus the subscriber's driver calls of a frame, as eglcuda makes them: the
 *              current-context check and cuEventQuery on the frame's event (taking it), the
 *              context check and cuStreamQuery on the reader's stream (letting it go)
 *
 * A child process (forked before CUDA is initialized) plays SOURCES publishers (1 if not given),
 * each with a Unix socket of its own: every 1/RATE seconds, from a random phase of its own, it
 * writes a 64-byte frame message stamped with CLOCK_MONOTONIC on that source's socket, and reads
 * the releases. The parent, the subscriber, sleeps in one epoll_wait on all of them; each wake
 * takes one message from every socket that has one (in cuda mode each source has its own event
 * and stream, as each subscriber has). It measures its thread's CPU time
 * (CLOCK_THREAD_CPUTIME_ID) from before the epoll_wait to after the last release of that wake,
 * shared out evenly between the frames it took, and each frame's latency from its stamp to the
 * return of epoll_wait. Prints one line:
 *   frames=N cpu_us_mean=.. cpu_us_p50=.. cpu_us_p99=.. wake_us_p50=.. wake_us_p99=..
 * libcuda is opened at run time (types from eglcuda's csrc/), as bench/c/stream_roundtrip.c. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../csrc/egl_core.h"
#include "../../csrc/egl_stream.h"
#include "../../csrc/cuda_egl.h"

#define FN(name) static __typeof__(&name) p_##name
FN(cuInit); FN(cuDeviceGet); FN(cuDevicePrimaryCtxRetain); FN(cuCtxSetCurrent); FN(cuCtxGetCurrent);
FN(cuStreamCreate); FN(cuStreamQuery); FN(cuEventCreate); FN(cuEventQuery);

#define CHECK(call) do { CUresult r_ = (call); if (r_ && r_ != 600 /* CUDA_ERROR_NOT_READY */) { fprintf(stderr, "%s:%d %s -> %d\n", __FILE__, __LINE__, #call, r_); exit(1); } } while (0)

static void *must(void *p, const char *what) { if (!p) { fprintf(stderr, "missing %s\n", what); exit(2); } return p; }
#define LOAD(lib, name, sym) p_##name = (__typeof__(p_##name))must(dlsym(lib, sym), sym)

enum { MESSAGE = 64, RELEASE = 11, MAX_FRAMES = 1000000, MAX_SOURCES = 256 };

static double clock_s(clockid_t id) { struct timespec t; clock_gettime(id, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int by_value(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }
static double at(double *sorted, int n, double q) { return sorted[(int)(q * (n - 1))]; }

static void publish(const int *fds, int sources, double rate, double seconds)
{
    char message[MESSAGE], release[RELEASE * 8];
    double period = 1.0 / rate, next[MAX_SOURCES], now = clock_s(CLOCK_MONOTONIC), end = now + period + seconds;
    memset(message, 0, sizeof message);
    for (int i = 0; i < sources; i++) next[i] = now + period * (rand() / (double)RAND_MAX);
    for (;;) {
        int due = 0;  /* the source whose frame is next */
        for (int i = 1; i < sources; i++) if (next[i] < next[due]) due = i;
        if (next[due] >= end) break;
        double wait = next[due] - clock_s(CLOCK_MONOTONIC);
        if (wait > 0) {
            struct timespec t = {(time_t)wait, (long)((wait - (time_t)wait) * 1e9)};
            nanosleep(&t, NULL);
        }
        double stamp = clock_s(CLOCK_MONOTONIC);
        memcpy(message, &stamp, sizeof stamp);
        if (write(fds[due], message, MESSAGE) != MESSAGE) _exit(1);
        while (recv(fds[due], release, sizeof release, MSG_DONTWAIT) > 0) {}
        next[due] += period;
    }
    message[8] = 1;  /* the last message on each socket: the end */
    for (int i = 0; i < sources; i++)
        if (write(fds[i], message, MESSAGE) != MESSAGE) _exit(1);
    for (int i = 0; i < sources; i++)
        while (read(fds[i], release, sizeof release) > 0) {}  /* until the subscriber closes its end */
    _exit(0);
}

int main(int argc, char **argv)
{
    if ((argc != 4 && argc != 5) || (strcmp(argv[3], "bare") && strcmp(argv[3], "cuda"))) {
        fprintf(stderr, "usage: %s RATE SECONDS bare|cuda [SOURCES]\n", argv[0]);
        return 2;
    }
    double rate = atof(argv[1]), seconds = atof(argv[2]);
    int cuda = strcmp(argv[3], "cuda") == 0, sources = argc == 5 ? atoi(argv[4]) : 1;
    if (sources < 1 || sources > MAX_SOURCES) { fprintf(stderr, "SOURCES is 1..%d\n", MAX_SOURCES); return 2; }
    int ours[MAX_SOURCES], theirs[MAX_SOURCES];
    for (int i = 0; i < sources; i++) {
        int pair[2];
        if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, pair)) { perror("socketpair"); return 1; }
        ours[i] = pair[0];
        theirs[i] = pair[1];
    }
    pid_t child = fork();
    if (child == 0) {
        for (int i = 0; i < sources; i++) close(ours[i]);
        srand(getpid());
        publish(theirs, sources, rate, seconds);
    }
    for (int i = 0; i < sources; i++) close(theirs[i]);

    CUcontext context = NULL;
    CUstream streams[MAX_SOURCES];
    CUevent events[MAX_SOURCES];
    if (cuda) {
        void *lib = must(dlopen("libcuda.so.1", RTLD_NOW), "libcuda.so.1");
        LOAD(lib, cuInit, "cuInit"); LOAD(lib, cuDeviceGet, "cuDeviceGet");
        LOAD(lib, cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"); LOAD(lib, cuCtxSetCurrent, "cuCtxSetCurrent");
        LOAD(lib, cuCtxGetCurrent, "cuCtxGetCurrent"); LOAD(lib, cuStreamCreate, "cuStreamCreate");
        LOAD(lib, cuStreamQuery, "cuStreamQuery"); LOAD(lib, cuEventCreate, "cuEventCreate");
        LOAD(lib, cuEventQuery, "cuEventQuery");
        CUdevice device;
        CHECK(p_cuInit(0));
        CHECK(p_cuDeviceGet(&device, 0));
        CHECK(p_cuDevicePrimaryCtxRetain(&context, device));
        CHECK(p_cuCtxSetCurrent(context));
        for (int i = 0; i < sources; i++) {
            CHECK(p_cuStreamCreate(&streams[i], 0));
            /* An interprocess event, as a publisher's slot has (here made by this process). */
            CHECK(p_cuEventCreate(&events[i], CU_EVENT_DISABLE_TIMING | 0x4 /* CU_EVENT_INTERPROCESS */));
        }
    }
    int poll = epoll_create1(0);
    for (int i = 0; i < sources; i++) {
        struct epoll_event watch = {.events = EPOLLIN, .data.u32 = (uint32_t)i};
        epoll_ctl(poll, EPOLL_CTL_ADD, ours[i], &watch);
    }

    static double cpu[MAX_FRAMES], wake[MAX_FRAMES];
    static struct epoll_event ready[MAX_SOURCES];
    char message[MESSAGE], release[RELEASE] = {0};
    double stamps[MAX_SOURCES];
    int frames = 0, skip = (int)(rate * sources), open = sources;  /* the first second: warm-up, not counted */
    while (open) {
        double started = clock_s(CLOCK_THREAD_CPUTIME_ID);
        int n = epoll_wait(poll, ready, sources, 10000);
        if (n < 1) { fprintf(stderr, "no frame for 10 s\n"); return 1; }
        double woke = clock_s(CLOCK_MONOTONIC);
        int took = 0;
        for (int k = 0; k < n; k++) {
            int i = (int)ready[k].data.u32, fd = ours[i];
            if (read(fd, message, MESSAGE) != MESSAGE) { fprintf(stderr, "the publisher is gone\n"); return 1; }
            if (message[8]) {  /* this source's end */
                epoll_ctl(poll, EPOLL_CTL_DEL, fd, NULL);
                open--;
                continue;
            }
            if (cuda) {
                CUcontext current = NULL;
                CHECK(p_cuCtxGetCurrent(&current));
                if (current != context) CHECK(p_cuCtxSetCurrent(context));
                CHECK(p_cuEventQuery(events[i]));
                CHECK(p_cuCtxGetCurrent(&current));
                if (current != context) CHECK(p_cuCtxSetCurrent(context));
                CHECK(p_cuStreamQuery(streams[i]));
            }
            if (write(fd, release, RELEASE) != RELEASE) { fprintf(stderr, "the publisher is gone\n"); return 1; }
            memcpy(&stamps[took++], message, sizeof(double));
        }
        double used = clock_s(CLOCK_THREAD_CPUTIME_ID) - started;
        for (int k = 0; k < took; k++) {
            if (skip > 0) { skip--; continue; }
            if (frames < MAX_FRAMES) { cpu[frames] = used / took; wake[frames] = woke - stamps[k]; frames++; }
        }
    }
    for (int i = 0; i < sources; i++) close(ours[i]);
    waitpid(child, NULL, 0);
    if (!frames) { fprintf(stderr, "no frames measured\n"); return 1; }
    double sum = 0;
    for (int i = 0; i < frames; i++) sum += cpu[i];
    qsort(cpu, frames, sizeof *cpu, by_value);
    qsort(wake, frames, sizeof *wake, by_value);
    printf("frames=%d cpu_us_mean=%.2f cpu_us_p50=%.2f cpu_us_p99=%.2f wake_us_p50=%.1f wake_us_p99=%.1f\n", frames,
           1e6 * sum / frames, 1e6 * at(cpu, frames, 0.5), 1e6 * at(cpu, frames, 0.99), 1e6 * at(wake, frames, 0.5),
           1e6 * at(wake, frames, 0.99));
    return 0;
}
