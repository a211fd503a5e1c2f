/* Research record (see research/README.md): runs against the current package (plain C: it needs no eglcuda at all). */
/* Probe: what the per-frame path's primitives cost on this machine, ns per call. */
#include <dlfcn.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }
int main(void)
{
    enum { N = 2000000 };
    struct timespec t;
    double a = now();
    for (int i = 0; i < N; i++) clock_gettime(CLOCK_MONOTONIC, &t);
    printf("clock_gettime(MONOTONIC) %.1f ns\n", (now() - a) / N);
    sem_t s; sem_init(&s, 0, 1);
    a = now();
    for (int i = 0; i < N; i++) { sem_trywait(&s); sem_post(&s); }
    printf("sem_trywait+sem_post %.1f ns\n", (now() - a) / N);
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    a = now();
    for (int i = 0; i < N; i++) { pthread_mutex_trylock(&m); pthread_mutex_unlock(&m); }
    printf("mutex trylock+unlock %.1f ns\n", (now() - a) / N);
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW);
    if (cuda) {
        int (*init)(unsigned) = dlsym(cuda, "cuInit");
        int (*get)(void **) = dlsym(cuda, "cuCtxGetCurrent");
        void *ctx;
        init(0);
        a = now();
        for (int i = 0; i < N; i++) get(&ctx);
        printf("cuCtxGetCurrent %.1f ns\n", (now() - a) / N);
    }
    return 0;
}
