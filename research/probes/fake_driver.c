/* Research record (see research/README.md): frozen record (uses the old layout: fake helpers with the signatures eglcuda._hotpath.bind() took; used by overhead_probe.py, 419c99e to 9e8cabf). */
/* Fake per-frame helpers with the signatures hotpath binds: no driver, just the bookkeeping the
 * real stream would do (reuse: the newest presented frame stays, older ones come back). */
#include <stdint.h>
static void *ring[64]; static int head, tail;
static uint64_t counter;
void f_reset(void) { head = tail = 0; }
int f_present(void *ctx, void *conn, const void *frame, void *box) { ring[head++ & 63] = *(void *const *)frame; return 0; }
int f_return(void *ctx, void *conn, void *frame, void *box, unsigned long long t, unsigned long long *plane0) {
    if (head - tail < 2) return 702;
    *plane0 = (unsigned long long)(uintptr_t)ring[tail++ & 63]; *(void **)frame = (void *)(uintptr_t)*plane0; return 0; }
int f_present_return(void *ctx, void *conn, const void *p, void *pb, void *back, void *rb, unsigned long long t,
                     unsigned long long *plane0, int *failed) {
    f_present(ctx, conn, p, pb); *failed = 6; return f_return(ctx, conn, back, rb, t, plane0); }
int f_acquire(void *ctx, void *conn, void *res, void *sb, unsigned int t, void *frame, void *dpy, void *es,
              uint64_t *cf, int *failed) { *(void **)res = (void *)1; if (dpy) *cf = ++counter; return 0; }
int f_release(void *ctx, void *conn, void *res, void *sb) { return 0; }
int f_next(void *ctx, void *conn, void *held, void *res, void *sb, unsigned int t, void *frame, void *dpy, void *es,
           uint64_t *cf, int *failed) { return f_acquire(ctx, conn, res, sb, t, frame, dpy, es, cf, failed); }
int f_counter(void *dpy, void *es, uint64_t *cf) { *cf = counter; return 0; }
