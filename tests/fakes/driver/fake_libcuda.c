/* A stand-in libcuda.so.1 for running eglcuda's CUDA code paths on a machine without a GPU.
 *
 * "Device memory" is host memory in shared-memory files (memfd), so CUDA IPC works between
 * processes the way the driver's does for the parts eglcuda relies on: an exported allocation is
 * mapped by another process (not by its own, and once per process), copies are plain memcpy, and
 * streams and events are synchronous (work is done when it is queued, so every ordering holds).
 * Only what eglcuda's frames layer and the topic transport "cuda-ipc" call is here; anything else
 * is missing, as on an old driver. Not a model of the GPU's timing or its asynchrony.
 *
 * Build: cc -shared -fPIC -o libcuda.so.1 fake_libcuda.c   (tests/unit/test_topics_fakecuda.py does)
 * Environment: FAKECUDA_DEVICES (default 1), FAKECUDA_INTEGRATED (default 0), FAKECUDA_BUSY_AFTER_WAIT
 * (default 0; N > 0: every Nth cuEventQuery says CUDA_ERROR_NOT_READY, as a real event would while
 * the work before its record still runs, and every Nth cuStreamQuery that follows a
 * cuStreamWaitEvent says it too, as a real stream would while a kernel queued behind the wait
 * still runs), FAKECUDA_STATS_DIR (unset: none; else each process keeps DIR/<pid>.calls up to date:
 * how many cuEventRecord and cuStreamWaitEvent calls it made, for tests that check a path ran).
 *
 * Test hook: fakecuda_hold(stream, 1) marks a stream as having queued work that has not run,
 * until fakecuda_hold(stream, 0). While it holds, cuStreamQuery of that stream says NOT_READY, an
 * event recorded on it is pending, and a stream that waits on such an event is busy too (so the
 * order between streams is modelled, not the work's timing). In this process only. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext;
typedef void *CUstream;
typedef struct fake_event *CUevent;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef struct { char reserved[64]; } CUipcEventHandle;
typedef struct { unsigned char bytes[16]; } CUuuid;
typedef struct {
    size_t srcXInBytes, srcY; int srcMemoryType; const void *srcHost; CUdeviceptr srcDevice; void *srcArray;
    size_t srcPitch;
    size_t dstXInBytes, dstY; int dstMemoryType; void *dstHost; CUdeviceptr dstDevice; void *dstArray;
    size_t dstPitch;
    size_t WidthInBytes, Height;
} CUDA_MEMCPY2D;

enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, INVALID_DEVICE = 101,
       INVALID_CONTEXT = 201, ALREADY_MAPPED = 208, INVALID_HANDLE = 400, NOT_READY = 600, NOT_SUPPORTED = 801 };
enum { HOST = 1, DEVICE = 2, ARRAY = 3, UNIFIED = 4 };

struct fake_event { uint32_t magic; uint32_t id; int interprocess; uint32_t holds; };
#define EVENT_MAGIC 0x45564e54u
#define MAX_ALLOCS 8192
#define TOTAL_MEMORY (8ull << 30)

struct alloc { char *base; size_t size; int fd; int imported; char key[32]; };
static struct alloc allocs[MAX_ALLOCS];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;
static size_t in_use;
static uint32_t next_event = 1;
static char contexts[8];
static __thread CUcontext current;

static int device_count(void) { const char *v = getenv("FAKECUDA_DEVICES"); int n = v ? atoi(v) : 1; return n < 1 ? 1 : (n > 8 ? 8 : n); }

CUresult cuInit(unsigned int flags) { (void)flags; initialized = 1; return OK; }
CUresult cuDriverGetVersion(int *v) { *v = 13000; return OK; }
CUresult cuGetErrorName(CUresult e, const char **s) { static char b[64]; snprintf(b, sizeof b, "FAKE_CUDA_ERROR_%d", e); *s = b; return OK; }
CUresult cuGetErrorString(CUresult e, const char **s) { (void)e; *s = "from the fake libcuda"; return OK; }
CUresult cuDeviceGetCount(int *n) { if (!initialized) return NOT_INITIALIZED; *n = device_count(); return OK; }
CUresult cuDeviceGet(CUdevice *d, int ordinal) { if (ordinal < 0 || ordinal >= device_count()) return INVALID_DEVICE; *d = ordinal; return OK; }
CUresult cuDeviceGetName(char *name, int len, CUdevice d) { snprintf(name, len, "Fake GPU %d", d); return OK; }
CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice d) { (void)d; *bytes = TOTAL_MEMORY; return OK; }
CUresult cuDeviceGetAttribute(int *v, int attribute, CUdevice d)
{
    (void)d;
    const char *integrated = getenv("FAKECUDA_INTEGRATED");
    switch (attribute) {
    case 18: *v = integrated && atoi(integrated); break;          /* INTEGRATED */
    case 19: *v = 1; break;                                        /* CAN_MAP_HOST_MEMORY */
    case 41: *v = 1; break;                                        /* UNIFIED_ADDRESSING */
    case 75: *v = 9; break; case 76: *v = 0; break;                /* compute capability */
    case 125: *v = 1; break;                                       /* IPC_EVENT_SUPPORTED */
    default: *v = 0;
    }
    return OK;
}
CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) { memset(u, 0, sizeof *u); memcpy(u->bytes, "FAKEGPU-UUID-", 13); u->bytes[15] = (unsigned char)d; return OK; }
CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return cuDeviceGetUuid(u, d); }
CUresult cuDeviceCanAccessPeer(int *can, CUdevice d, CUdevice peer) { *can = d != peer; return OK; }
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d) { *c = &contexts[d]; return OK; }
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d) { (void)d; return OK; }
CUresult cuCtxGetCurrent(CUcontext *c) { *c = current; return OK; }
CUresult cuCtxSetCurrent(CUcontext c) { current = c; return OK; }
CUresult cuCtxSynchronize(void) { return current ? OK : INVALID_CONTEXT; }

static CUresult need_context(void) { return current ? OK : INVALID_CONTEXT; }

static struct alloc *find(CUdeviceptr p, int containing)
{
    for (int i = 0; i < MAX_ALLOCS; i++) {
        struct alloc *a = &allocs[i];
        if (!a->base) continue;
        if ((char *)(uintptr_t)p == a->base) return a;
        if (containing && (char *)(uintptr_t)p > a->base && (char *)(uintptr_t)p < a->base + a->size) return a;
    }
    return NULL;
}

static struct alloc *slot(void)
{
    for (int i = 0; i < MAX_ALLOCS; i++) if (!allocs[i].base) return &allocs[i];
    return NULL;
}

CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t size)
{
    if (need_context()) return INVALID_CONTEXT;
    if (!size) return INVALID_VALUE;
    int fd = memfd_create("fake-cuda", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)size) < 0) { if (fd >= 0) close(fd); return OUT_OF_MEMORY; }
    char *base = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) { close(fd); return OUT_OF_MEMORY; }
    pthread_mutex_lock(&lock);
    struct alloc *a = slot();
    if (!a) { pthread_mutex_unlock(&lock); munmap(base, size); close(fd); return OUT_OF_MEMORY; }
    *a = (struct alloc){base, size, fd, 0, {0}};
    in_use += size;
    pthread_mutex_unlock(&lock);
    *p = (CUdeviceptr)(uintptr_t)base;
    return OK;
}

CUresult cuMemFree_v2(CUdeviceptr p)
{
    pthread_mutex_lock(&lock);
    struct alloc *a = find(p, 0);
    if (!a || a->imported) { pthread_mutex_unlock(&lock); return INVALID_VALUE; }
    munmap(a->base, a->size);
    close(a->fd);
    in_use -= a->size;
    memset(a, 0, sizeof *a);
    pthread_mutex_unlock(&lock);
    return OK;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    pthread_mutex_lock(&lock);
    *free_bytes = TOTAL_MEMORY - in_use;
    *total = TOTAL_MEMORY;
    pthread_mutex_unlock(&lock);
    return OK;
}

CUresult cuMemGetAddressRange_v2(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
    pthread_mutex_lock(&lock);
    struct alloc *a = find(p, 1);
    if (a) { if (base) *base = (CUdeviceptr)(uintptr_t)a->base; if (size) *size = a->size; }
    pthread_mutex_unlock(&lock);
    return a ? OK : NOT_SUPPORTED;
}

CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr p) { (void)p; if (attribute == 8) { *(unsigned int *)data = 0; return OK; } return NOT_SUPPORTED; }

static char *endpoint(int kind, const void *host, CUdeviceptr device)
{
    if (kind == HOST) return (char *)host;
    if (kind == DEVICE || kind == UNIFIED) return (char *)(uintptr_t)device;
    return NULL;
}

CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *c, CUstream s)
{
    (void)s;
    if (need_context()) return INVALID_CONTEXT;
    char *src = endpoint(c->srcMemoryType, c->srcHost, c->srcDevice);
    char *dst = endpoint(c->dstMemoryType, c->dstHost, c->dstDevice);
    if (!src || !dst || c->WidthInBytes > c->srcPitch || c->WidthInBytes > c->dstPitch) return INVALID_VALUE;
    for (size_t y = 0; y < c->Height; y++)
        memcpy(dst + (c->dstY + y) * c->dstPitch + c->dstXInBytes, src + (c->srcY + y) * c->srcPitch + c->srcXInBytes,
               c->WidthInBytes);
    return OK;
}
CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *c) { return cuMemcpy2DAsync_v2(c, NULL); }
CUresult cuMemsetD8Async(CUdeviceptr p, unsigned char v, size_t n, CUstream s) { (void)s; memset((void *)(uintptr_t)p, v, n); return OK; }

/* Streams: a stream is a small heap object; work runs when queued. */
CUresult cuStreamCreate(CUstream *s, unsigned int flags) { (void)flags; if (need_context()) return INVALID_CONTEXT; *s = malloc(16); return OK; }
CUresult cuStreamDestroy_v2(CUstream s) { free(s); return OK; }
CUresult cuStreamSynchronize(CUstream s) { (void)s; return need_context(); }
/* fakecuda_hold: each hold is a bit (never reused); a stream's entry says which holds it waits on. */
#define MAX_STREAM_STATES 256
static struct { CUstream stream; uint32_t hold; uint32_t waits; } stream_states[MAX_STREAM_STATES];
static uint32_t live_holds, next_hold = 1;
static int stream_state(CUstream s)  /* the index of s's entry, made if need be; -1 when full (caller holds lock) */
{
    int free_entry = -1;
    for (int i = 0; i < MAX_STREAM_STATES; i++) {
        if (stream_states[i].hold || stream_states[i].waits) {
            if (stream_states[i].stream == s) return i;
        } else if (free_entry < 0) {
            free_entry = i;
        }
    }
    if (free_entry >= 0) stream_states[free_entry].stream = s;
    return free_entry;
}
static uint32_t holds_of(CUstream s)  /* the live holds s is behind (caller holds lock) */
{
    for (int i = 0; i < MAX_STREAM_STATES; i++)
        if ((stream_states[i].hold || stream_states[i].waits) && stream_states[i].stream == s)
            return (stream_states[i].hold | stream_states[i].waits) & live_holds;
    return 0;
}
void fakecuda_hold(CUstream s, int held)
{
    pthread_mutex_lock(&lock);
    int i = stream_state(s);
    if (i >= 0) {
        if (held && !stream_states[i].hold && next_hold) {
            stream_states[i].hold = next_hold;
            live_holds |= next_hold;
            next_hold <<= 1;
        } else if (!held) {
            live_holds &= ~stream_states[i].hold;
            stream_states[i].hold = 0;
        }
    }
    pthread_mutex_unlock(&lock);
}

static int waited;  /* a cuStreamWaitEvent since the last cuStreamQuery (FAKECUDA_BUSY_AFTER_WAIT) */
static unsigned queries_after_wait;
static int busy_queries;  /* the next queries that still say NOT_READY, unless an event is recorded first */
CUresult cuStreamQuery(CUstream s)
{
    if (need_context()) return INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    uint32_t behind = holds_of(s);
    pthread_mutex_unlock(&lock);
    if (behind) return NOT_READY;
    const char *every = getenv("FAKECUDA_BUSY_AFTER_WAIT");
    int n = every ? atoi(every) : 0;
    if (waited && n > 0 && ++queries_after_wait % (unsigned)n == 0)
        busy_queries = 2;  /* busy for this query and the next: a caller may ask twice before recording */
    waited = 0;
    if (busy_queries > 0) {
        busy_queries--;
        return NOT_READY;
    }
    return OK;
}

static CUresult check_event(CUevent e) { return e && e->magic == EVENT_MAGIC ? OK : INVALID_HANDLE; }
CUresult cuEventCreate(CUevent *e, unsigned int flags)
{
    if (need_context()) return INVALID_CONTEXT;
    if ((flags & 0x4) && !(flags & 0x2)) return INVALID_VALUE; /* interprocess events must not time */
    struct fake_event *ev = calloc(1, sizeof *ev);
    pthread_mutex_lock(&lock);
    ev->id = next_event++;
    pthread_mutex_unlock(&lock);
    ev->magic = EVENT_MAGIC;
    ev->interprocess = (flags & 0x4) != 0;
    *e = ev;
    return OK;
}
CUresult cuEventDestroy_v2(CUevent e) { if (check_event(e)) return INVALID_HANDLE; e->magic = 0; free(e); return OK; }
static unsigned long records, waits;
static void count_call(unsigned long *counter)
{
    ++*counter;
    const char *dir = getenv("FAKECUDA_STATS_DIR");
    if (!dir)
        return;
    char path[4096];
    snprintf(path, sizeof path, "%s/%d.calls", dir, (int)getpid());
    FILE *file = fopen(path, "w");
    if (file) {
        fprintf(file, "records %lu waits %lu\n", records, waits);
        fclose(file);
    }
}

CUresult cuEventRecord(CUevent e, CUstream s)
{
    if (need_context()) return INVALID_CONTEXT;
    busy_queries = 0;  /* the stream's queued work "ran" behind the record */
    CUresult status = check_event(e);
    if (status == OK) {
        pthread_mutex_lock(&lock);
        e->holds = holds_of(s);
        pthread_mutex_unlock(&lock);
        count_call(&records);
    }
    return status;
}
static unsigned event_queries;
CUresult cuEventQuery(CUevent e)
{
    CUresult status = check_event(e);
    if (status == OK && (e->holds & live_holds)) return NOT_READY;
    const char *every = getenv("FAKECUDA_BUSY_AFTER_WAIT");
    int n = every ? atoi(every) : 0;
    if (status == OK && n > 0 && ++event_queries % (unsigned)n == 0)
        return NOT_READY;
    return status;
}
CUresult cuEventSynchronize(CUevent e) { return check_event(e); }
CUresult cuStreamWaitEvent(CUstream s, CUevent e, unsigned int flags)
{
    (void)flags;
    if (need_context()) return INVALID_CONTEXT;
    waited = 1;
    CUresult status = check_event(e);
    if (status == OK) {
        pthread_mutex_lock(&lock);
        uint32_t behind = e->holds & live_holds;
        int i = behind ? stream_state(s) : -1;
        if (i >= 0) stream_states[i].waits |= behind;
        pthread_mutex_unlock(&lock);
        count_call(&waits);
    }
    return status;
}

/* CUDA IPC: a memory handle names (exporter pid, memfd, size); an event handle (pid, id). */
struct mem_handle { uint32_t magic; int32_t pid; int32_t fd; uint32_t pad; uint64_t size; };
struct event_handle { uint32_t magic; int32_t pid; uint32_t id; };

CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
    pthread_mutex_lock(&lock);
    struct alloc *a = find(p, 0);
    if (!a || a->imported) { pthread_mutex_unlock(&lock); return INVALID_VALUE; }
    struct mem_handle m = {0x4d454d48u, getpid(), a->fd, 0, a->size};
    pthread_mutex_unlock(&lock);
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &m, sizeof m);
    return OK;
}

CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags)
{
    (void)flags;
    if (need_context()) return INVALID_CONTEXT;
    struct mem_handle m;
    memcpy(&m, h.reserved, sizeof m);
    if (m.magic != 0x4d454d48u) return INVALID_VALUE;
    if (m.pid == getpid()) return INVALID_CONTEXT; /* the driver's rule: not in the exporting process */
    char key[32];
    snprintf(key, sizeof key, "%d:%d", m.pid, m.fd);
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].base && allocs[i].imported && !strcmp(allocs[i].key, key)) { pthread_mutex_unlock(&lock); return ALREADY_MAPPED; }
    pthread_mutex_unlock(&lock);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", m.pid, m.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) return INVALID_VALUE;
    char *base = mmap(NULL, m.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) return INVALID_VALUE;
    pthread_mutex_lock(&lock);
    struct alloc *a = slot();
    if (!a) { pthread_mutex_unlock(&lock); munmap(base, m.size); return OUT_OF_MEMORY; }
    *a = (struct alloc){base, m.size, -1, 1, {0}};
    strcpy(a->key, key);
    pthread_mutex_unlock(&lock);
    *p = (CUdeviceptr)(uintptr_t)base;
    return OK;
}

CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
    pthread_mutex_lock(&lock);
    struct alloc *a = find(p, 0);
    if (!a || !a->imported) { pthread_mutex_unlock(&lock); return INVALID_VALUE; }
    munmap(a->base, a->size);
    memset(a, 0, sizeof *a);
    pthread_mutex_unlock(&lock);
    return OK;
}

CUresult cuIpcGetEventHandle(CUipcEventHandle *h, CUevent e)
{
    if (check_event(e)) return INVALID_HANDLE;
    if (!e->interprocess) return INVALID_VALUE;
    struct event_handle m = {0x45565448u, getpid(), e->id};
    memset(h, 0, sizeof *h);
    memcpy(h->reserved, &m, sizeof m);
    return OK;
}

CUresult cuIpcOpenEventHandle(CUevent *e, CUipcEventHandle h)
{
    if (need_context()) return INVALID_CONTEXT;
    struct event_handle m;
    memcpy(&m, h.reserved, sizeof m);
    if (m.magic != 0x45565448u) return INVALID_VALUE;
    if (m.pid == getpid()) return INVALID_CONTEXT;
    struct fake_event *ev = calloc(1, sizeof *ev);
    ev->magic = EVENT_MAGIC;
    ev->id = m.id;
    ev->interprocess = 1;
    *e = ev;
    return OK;
}
