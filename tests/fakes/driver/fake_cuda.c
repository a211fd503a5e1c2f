/* The one fake libcuda, for testing eglcuda without a GPU: the CUDA driver calls eglcuda (and
 * bench/c/cross_gpu.c) make, where "device memory" is host memory in shared-memory files (one
 * memfd per allocation), so what eglcuda's plane copies write can be read back and checked, and
 * another process can map it (CUDA IPC, VMM descriptors). Builds on a stream-model library
 * (fake_common.h): libfake_egl.so (fake_egl.c), which owns the lock, the fault injection and the
 * EGLStream model; see fake_egl.c for that model and tests/fakes/README.md for the test controls.
 * Every test that needs a libcuda loads this one (tests/fakes/build.py builds it): the fake tier
 * as libfake_cuda.so, the unit tests as libcuda.so.1 on LD_LIBRARY_PATH.
 *
 * What is modelled, and checked the way a driver would refuse it (each refusal of a kind eglcuda
 * should never cause is also noted as a misuse, see fake_misuse_count()):
 *   - cuInit first (else CUDA_ERROR_NOT_INITIALIZED); FAKE_CUDA_DEVICE_COUNT devices (default 1);
 *     primary contexts with a retain count; the current context is per thread, and every call
 *     that needs one fails with CUDA_ERROR_INVALID_CONTEXT without it (the EGLStream endpoint
 *     calls need the context they connected from).
 *   - memory: cuMemAlloc / cuMemAllocPitch / cuMemAllocManaged / cuMemHostAlloc (+ device pointer:
 *     the same address, as with unified addressing) and their frees, every live allocation
 *     tracked (fake_live_allocations() for leak tests); a free of anything but a live base
 *     address is CUDA_ERROR_INVALID_VALUE; FAKE_CUDA_TOTAL_MEM bytes per device (default 1 GiB)
 *     then CUDA_ERROR_OUT_OF_MEMORY.
 *   - CUDA arrays are host buffers; cuMemcpy2D(Async) copies between host, "device" (any live
 *     allocation: the whole range must lie inside one, else CUDA_ERROR_INVALID_VALUE / 
 *     CUDA_ERROR_ILLEGAL_ADDRESS) and arrays (inside the array) at once; streams and events are
 *     handles that are checked, all work is done when queued.
 *   - the EGLStream endpoints (fake_egl.c): frames are checked against the connection (size,
 *     format, plane count, channels, every plane's memory: pitch x plane height bytes inside one
 *     live allocation, or arrays of the plane's size), consumer-side frames describe the
 *     producer's memory (the same pointers), NV12 comes back labelled YVU420_SEMIPLANAR as NVIDIA's
 *     driver 580 does.
 *   - a present into a full FIFO waits for room for at most FAKE_FIFO_WAIT_MS (default 10000)
 *     milliseconds, then fails with CUDA_ERROR_TIMEOUT (909) instead of blocking for ever;
 *     a return with nothing to give back waits FAKE_RETURN_WAIT_US (default 1000) microseconds
 *     and answers CUDA_ERROR_LAUNCH_TIMEOUT (702), as the real driver does.
 *   - endpoint calls on a stream an endpoint left fail with CUDA_ERROR_UNKNOWN (999); acquire with
 *     no frame fails with CUDA_ERROR_LAUNCH_TIMEOUT after the timeout.
 *   - CUDA IPC: memory handles of cuMemAlloc allocations, opened in another process of the same
 *     user (through /proc/PID/fd), once per process; interprocess events (opened as new events).
 *   - virtual memory management with POSIX file descriptor handles (see that section): the
 *     descriptor works in any process it is sent to.
 *   - the order between streams, without timing: the fake_cuda_hold test hook,
 *     FAKE_CUDA_BUSY_AFTER_WAIT and FAKE_CUDA_STATS_DIR (see "streams and events").
 * Not modelled: kernels, GL interop, EGLImage, external semaphores, host functions (those entry
 * points are not exported, so eglcuda reports them unsupported). */
#define _GNU_SOURCE
#include "fake_common.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_DEVICES 4
#define MAX_FRAMES_IN_STREAM 64

/* ---- state -------------------------------------------------------------------------------- */
/* KIND_IMPORTED: another process's allocation opened with cuIpcOpenMemHandle; KIND_VMM: a mapped
 * VMM range with access granted (cuMemSetAccess); KIND_FOREIGN: memory a test adopted as device
 * memory that another library owns (fake_cuda_adopt: the fake PyNvVideoCodec's decoded frames,
 * NVDEC's memory on a GPU). All are device memory for copies; none is freed with cuMemFree. */
enum { KIND_DEVICE, KIND_HOST, KIND_MANAGED, KIND_IMPORTED, KIND_VMM, KIND_FOREIGN };

struct alloc {
    struct alloc *next;
    unsigned char *base;
    size_t size;
    int kind;
    int device;
    int fd;       /* the memfd holding the bytes; -1 for KIND_IMPORTED and KIND_VMM */
    char key[32]; /* KIND_IMPORTED: "pid:fd" of the exporter's allocation (mapped once per process) */
};

struct fake_array {
    unsigned int magic;
    struct fake_array *next;
    size_t width, height, row_bytes;
    int format;
    unsigned int channels;
    int device;
    unsigned char *data;
    int fd; /* the memfd behind data */
};

struct fake_cu_stream {
    unsigned int magic;
    struct fake_cu_stream *next;
    int device;
};

struct fake_event {
    unsigned int magic;
    struct fake_event *next;
    unsigned int flags;
    long long recorded_ns; /* 0: never recorded */
    long long done_ns;     /* FAKE_D2H_DELAY_US: when the copies before its last record are done */
    CUstream stream;       /* ... queued on this stream */
    uint32_t id;           /* names it in an interprocess handle */
    uint32_t holds;        /* the fake_cuda_hold holds its last record is behind */
};

struct fake_ctx {
    unsigned int magic;
    int device;
    int retained;
};

#define MAGIC_ARRAY 0x41525259u
#define MAGIC_CU_STREAM 0x43535452u
#define MAGIC_EVENT 0x45564E54u
#define MAGIC_CTX 0x43545854u

static int initialized;
static struct fake_ctx contexts[MAX_DEVICES];
static __thread struct fake_ctx *current;
static struct alloc *allocations;
static struct fake_array *arrays;
static struct fake_cu_stream *cu_streams;
static struct fake_event *events;
static size_t used_bytes[MAX_DEVICES];
static size_t total_bytes = (size_t)1 << 30;
static long long fifo_wait_ns = 10000ll * 1000000ll;
static long long return_wait_ns = 1000ll * 1000ll;
static int integrated;
static unsigned busy_after_wait;   /* FAKE_CUDA_BUSY_AFTER_WAIT */
static const char *stats_dir;      /* FAKE_CUDA_STATS_DIR */
static size_t vmm_granularity = (size_t)2 << 20;
static uint32_t next_event_id = 1;
static int want_stream_flags = -1;  /* FAKE_WANT_STREAM_FLAGS */
static long skip_memset32_at = -1;  /* FAKE_SKIP_FILL_AT */
static int fail_stream = -1;        /* FAKE_FAIL_STREAM, FAKE_FAIL_AT */
static long fail_at = -1;
static int print_stats;             /* FAKE_STATS */
static long long d2h_delay_ns;      /* FAKE_D2H_DELAY_US */
static long long h2d_delay_ns;      /* FAKE_H2D_DELAY_US */

__attribute__((constructor)) static void fake_cuda_load(void)
{
    const char *value = getenv("FAKE_CUDA_TOTAL_MEM");
    if (value && strtoull(value, NULL, 0) > 0)
        total_bytes = strtoull(value, NULL, 0);
    value = getenv("FAKE_FIFO_WAIT_MS");
    if (value)
        fifo_wait_ns = strtoll(value, NULL, 0) * 1000000ll;
    value = getenv("FAKE_RETURN_WAIT_US");
    if (value)
        return_wait_ns = strtoll(value, NULL, 0) * 1000ll;
    value = getenv("FAKE_CUDA_INTEGRATED");
    integrated = value && atoi(value) != 0;
    value = getenv("FAKE_CUDA_BUSY_AFTER_WAIT");
    busy_after_wait = value && atoi(value) > 0 ? (unsigned)atoi(value) : 0;
    value = getenv("FAKE_CUDA_STATS_DIR");
    stats_dir = value && *value ? value : NULL;
    value = getenv("FAKE_WANT_STREAM_FLAGS");
    if (value && *value)
        want_stream_flags = atoi(value);
    value = getenv("FAKE_SKIP_FILL_AT");
    if (value && *value)
        skip_memset32_at = atol(value);
    value = getenv("FAKE_FAIL_STREAM");
    if (value && *value && getenv("FAKE_FAIL_AT")) {
        fail_stream = atoi(value);
        fail_at = atol(getenv("FAKE_FAIL_AT"));
    }
    value = getenv("FAKE_D2H_DELAY_US");
    if (value && *value)
        d2h_delay_ns = strtoll(value, NULL, 0) * 1000ll;
    value = getenv("FAKE_H2D_DELAY_US");
    if (value && *value)
        h2d_delay_ns = strtoll(value, NULL, 0) * 1000ll;
    value = getenv("FAKE_STATS");
    print_stats = value && atoi(value) != 0;
    value = getenv("FAKE_CUDA_VMM_GRANULARITY");
    if (value && strtoull(value, NULL, 0) >= 4096 && (strtoull(value, NULL, 0) & (strtoull(value, NULL, 0) - 1)) == 0)
        vmm_granularity = strtoull(value, NULL, 0);
    for (int i = 0; i < MAX_DEVICES; i++) {
        contexts[i].magic = MAGIC_CTX;
        contexts[i].device = i;
    }
}

/* ---- errors ------------------------------------------------------------------------------- */
static const struct {
    CUresult code;
    const char *name;
    const char *text;
} error_table[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {208, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {401, "CUDA_ERROR_ILLEGAL_STATE", "the operation cannot be performed in the present state"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {702, "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"},
    {709, "CUDA_ERROR_CONTEXT_IS_DESTROYED", "context is destroyed"},
    {801, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {909, "CUDA_ERROR_TIMEOUT", "wait operation timed out"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

FAKE_EXPORT CUresult cuGetErrorName(CUresult error, const char **out)
{
    FAKE_ENTER("cuGetErrorName", return fake_fault_);
    if (out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof(error_table) / sizeof(error_table[0]); i++)
        if (error_table[i].code == error) {
            *out = error_table[i].name;
            return CUDA_SUCCESS;
        }
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

FAKE_EXPORT CUresult cuGetErrorString(CUresult error, const char **out)
{
    FAKE_ENTER("cuGetErrorString", return fake_fault_);
    if (out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof(error_table) / sizeof(error_table[0]); i++)
        if (error_table[i].code == error) {
            *out = error_table[i].text;
            return CUDA_SUCCESS;
        }
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- init, devices, contexts -------------------------------------------------------------- */
FAKE_EXPORT CUresult cuInit(unsigned int flags)
{
    FAKE_ENTER("cuInit", return fake_fault_);
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    __atomic_store_n(&initialized, 1, __ATOMIC_RELEASE);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDriverGetVersion(int *version)
{
    FAKE_ENTER("cuDriverGetVersion", return fake_fault_);
    if (version == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *version = 13000;
    return CUDA_SUCCESS;
}

static int ready(void) { return __atomic_load_n(&initialized, __ATOMIC_ACQUIRE); }

static CUresult check_device(CUdevice dev)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    return dev >= 0 && dev < fake__device_count() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

/* The calling thread's current context, usable; CUDA_SUCCESS or why not. */
static CUresult need_context(const char *call)
{
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (current == NULL) {
        fake__misuse("%s: no current CUDA context on this thread", call);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (__atomic_load_n(&current->retained, __ATOMIC_ACQUIRE) <= 0) {
        fake__misuse("%s: the current context's primary context was released", call);
        return CUDA_ERROR_CONTEXT_IS_DESTROYED;
    }
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetCount(int *count)
{
    FAKE_ENTER("cuDeviceGetCount", return fake_fault_);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (count == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *count = fake__device_count();
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    FAKE_ENTER("cuDeviceGet", return fake_fault_);
    CUresult status = check_device(ordinal);
    if (status == CUDA_SUCCESS) {
        if (device == NULL)
            return CUDA_ERROR_INVALID_VALUE;
        *device = ordinal;
    }
    return status;
}

FAKE_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    FAKE_ENTER("cuDeviceGetName", return fake_fault_);
    CUresult status = check_device(dev);
    if (status)
        return status;
    if (name == NULL || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    snprintf(name, (size_t)len, "Fake CUDA device %d (eglcuda test driver)", dev);
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetAttribute(int *value, int attribute, CUdevice dev)
{
    FAKE_ENTER("cuDeviceGetAttribute", return fake_fault_);
    CUresult status = check_device(dev);
    if (status)
        return status;
    if (value == NULL || attribute <= 0 || attribute > 200)
        return CUDA_ERROR_INVALID_VALUE;
    switch (attribute) {
    case 75: *value = 9; break;        /* compute capability major */
    case 76: *value = 0; break;        /* minor */
    case 18: *value = integrated; break; /* integrated (FAKE_CUDA_INTEGRATED) */
    case 41: *value = 1; break;        /* unified addressing */
    case 102: *value = 1; break;       /* virtual memory management */
    case 103: *value = 1; break;       /* POSIX file descriptor handles */
    case 125: *value = 1; break;       /* interprocess events */
    case 19: *value = 1; break;        /* can map host memory */
    case 83: *value = 1; break;        /* managed memory */
    case 89: *value = 1; break;        /* concurrent managed access */
    case 91: *value = 1; break;        /* host pointer for registered memory */
    case 33: *value = dev + 1; break;  /* PCI bus */
    default: *value = 0;
    }
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    FAKE_ENTER("cuDeviceTotalMem", return fake_fault_);
    CUresult status = check_device(dev);
    if (status)
        return status;
    if (bytes == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *bytes = total_bytes;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    FAKE_ENTER("cuDeviceGetUuid", return fake_fault_);
    CUresult status = check_device(dev);
    if (status)
        return status;
    if (uuid == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    memset(uuid, 0, sizeof(*uuid));
    memcpy(uuid->bytes, "FAKEGPU-UUID-", 13);
    uuid->bytes[15] = (char)dev;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    FAKE_ENTER("cuDeviceGetUuid_v2", return fake_fault_);
    return cuDeviceGetUuid(uuid, dev); /* no MIG instances here */
}

FAKE_EXPORT CUresult cuDeviceCanAccessPeer(int *can, CUdevice dev, CUdevice peer)
{
    FAKE_ENTER("cuDeviceCanAccessPeer", return fake_fault_);
    CUresult status = check_device(dev);
    if (status == CUDA_SUCCESS)
        status = check_device(peer);
    if (status)
        return status;
    if (can == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *can = dev != peer; /* every pair of distinct fake GPUs is peer-capable */
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    FAKE_ENTER("cuDevicePrimaryCtxRetain", return fake_fault_);
    CUresult status = check_device(dev);
    if (status)
        return status;
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    __atomic_add_fetch(&contexts[dev].retained, 1, __ATOMIC_ACQ_REL);
    *pctx = (CUcontext)&contexts[dev];
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    FAKE_ENTER("cuDevicePrimaryCtxRelease", return fake_fault_);
    CUresult status = check_device(dev);
    if (status)
        return status;
    fake__lock();
    if (contexts[dev].retained <= 0) {
        fake__misuse("cuDevicePrimaryCtxRelease: device %d's primary context is not retained", dev);
        status = CUDA_ERROR_INVALID_CONTEXT;
    } else {
        __atomic_sub_fetch(&contexts[dev].retained, 1, __ATOMIC_ACQ_REL);
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    FAKE_ENTER("cuCtxGetCurrent", return fake_fault_);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (pctx == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *pctx = (CUcontext)current;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    FAKE_ENTER("cuCtxSetCurrent", return fake_fault_);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx == NULL) {
        current = NULL;
        return CUDA_SUCCESS;
    }
    for (int i = 0; i < fake__device_count(); i++)
        if (ctx == (CUcontext)&contexts[i]) {
            current = &contexts[i];
            return CUDA_SUCCESS;
        }
    fake__misuse("cuCtxSetCurrent: %p is not a context", (void *)ctx);
    return CUDA_ERROR_INVALID_CONTEXT;
}

FAKE_EXPORT CUresult cuCtxSynchronize(void)
{
    FAKE_ENTER("cuCtxSynchronize", return fake_fault_);
    return need_context("cuCtxSynchronize");
}

/* ---- memory ------------------------------------------------------------------------------- */
/* The live allocation holding [address, address + length), lock held; NULL if none does. *partial
 * says whether one holds the start but not the end. */
static struct alloc elsewhere = {.kind = KIND_FOREIGN, .fd = -1};

static struct alloc *find_range(uintptr_t address, size_t length, int *partial)
{
    if (partial)
        *partial = 0;
    for (struct alloc *a = allocations; a; a = a->next) {
        uintptr_t base = (uintptr_t)a->base;
        if (address >= base && address < base + a->size) {
            if (length <= base + a->size - address)
                return a;
            if (partial)
                *partial = 1;
            return NULL;
        }
    }
    /* Memory another process allocated in the model's shared region (an EGLStream producer's
     * frame, read by the consumer's process): device memory of no allocation of ours. */
    if (fake__shared_contains(address, length))
        return &elsewhere;
    return NULL;
}

static struct alloc *find_base(uintptr_t address)
{
    for (struct alloc *a = allocations; a; a = a->next)
        if ((uintptr_t)a->base == address)
            return a;
    return NULL;
}

/* `size` bytes of shared memory: a memfd, mapped read/write (page-aligned). Another process maps
 * the same bytes through the descriptor: CUDA IPC opens /proc/PID/fd/N, a VMM descriptor is sent
 * over a socket. NULL when out of memory or descriptors. */
static unsigned char *shared_memory(size_t size, int *fd_out)
{
    int fd = memfd_create("fake-cuda", MFD_CLOEXEC);
    if (fd < 0)
        return NULL;
    if (ftruncate(fd, (off_t)size) < 0) {
        close(fd);
        return NULL;
    }
    void *memory = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (memory == MAP_FAILED) {
        close(fd);
        return NULL;
    }
    *fd_out = fd;
    return memory;
}

static struct alloc *track(unsigned char *base, size_t size, int kind, int device, int fd)
{
    struct alloc *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return NULL;
    a->base = base;
    a->size = size;
    a->kind = kind;
    a->device = device;
    a->fd = fd;
    a->next = allocations;
    allocations = a;
    return a;
}

static void untrack(struct alloc *a)
{
    for (struct alloc **p = &allocations; *p; p = &(*p)->next)
        if (*p == a) {
            *p = a->next;
            break;
        }
    free(a);
}

static CUresult new_allocation(size_t size, int kind, unsigned char **out)
{
    if (size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int device = current->device;
    if (used_bytes[device] + size > total_bytes || used_bytes[device] + size < size)
        return CUDA_ERROR_OUT_OF_MEMORY;
    int fd = -1;
    unsigned char *memory = fake__shared_alloc(size); /* memory every process of the model sees */
    if (memory == NULL && (memory = shared_memory(size, &fd)) == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (track(memory, size, kind, device, fd) == NULL) {
        if (fd >= 0) {
            munmap(memory, size);
            close(fd);
        }
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    used_bytes[device] += size;
    *out = memory;
    return CUDA_SUCCESS;
}

static void drop_allocation(struct alloc *a)
{
    used_bytes[a->device] -= a->size;
    if (a->fd >= 0) { /* memory of the model's shared region is never given back */
        munmap(a->base, a->size);
        close(a->fd);
    }
    untrack(a);
}

static CUresult allocate(const char *call, size_t size, int kind, unsigned char **out)
{
    CUresult status = need_context(call);
    if (status)
        return status;
    fake__lock();
    status = new_allocation(size, kind, out);
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    FAKE_ENTER("cuMemAlloc", return fake_fault_);
    unsigned char *memory;
    if (dptr == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult status = allocate("cuMemAlloc", size, KIND_DEVICE, &memory);
    if (status == CUDA_SUCCESS)
        *dptr = (CUdeviceptr)(uintptr_t)memory;
    return status;
}

FAKE_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                        unsigned int element)
{
    FAKE_ENTER("cuMemAllocPitch", return fake_fault_);
    unsigned char *memory;
    if (dptr == NULL || pitch == NULL || width == 0 || height == 0 || (element != 4 && element != 8 && element != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t rounded = (width + 511) & ~(size_t)511;
    CUresult status = allocate("cuMemAllocPitch", rounded * height, KIND_DEVICE, &memory);
    if (status == CUDA_SUCCESS) {
        *dptr = (CUdeviceptr)(uintptr_t)memory;
        *pitch = rounded;
    }
    return status;
}

FAKE_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t size, unsigned int flags)
{
    FAKE_ENTER("cuMemAllocManaged", return fake_fault_);
    unsigned char *memory;
    if (dptr == NULL || (flags != 1 && flags != 2))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult status = allocate("cuMemAllocManaged", size, KIND_MANAGED, &memory);
    if (status == CUDA_SUCCESS)
        *dptr = (CUdeviceptr)(uintptr_t)memory;
    return status;
}

FAKE_EXPORT CUresult cuMemHostAlloc(void **pp, size_t size, unsigned int flags)
{
    FAKE_ENTER("cuMemHostAlloc", return fake_fault_);
    unsigned char *memory;
    if (pp == NULL || (flags & ~0x7u))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult status = allocate("cuMemHostAlloc", size, KIND_HOST, &memory);
    if (status == CUDA_SUCCESS)
        *pp = memory;
    return status;
}

FAKE_EXPORT CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *dptr, void *p, unsigned int flags)
{
    FAKE_ENTER("cuMemHostGetDevicePointer", return fake_fault_);
    CUresult status = need_context("cuMemHostGetDevicePointer");
    if (status)
        return status;
    if (dptr == NULL || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    fake__lock();
    struct alloc *a = find_range((uintptr_t)p, 1, NULL);
    if (a == NULL || a->kind != KIND_HOST)
        status = CUDA_ERROR_INVALID_VALUE;
    else
        *dptr = (CUdeviceptr)(uintptr_t)p; /* unified addressing: the same address */
    fake__unlock();
    return status;
}

static int settle_copies(CUstream stream, long long now, int all);

static CUresult free_allocation(const char *call, uintptr_t address, int host)
{
    CUresult status = need_context(call);
    if (status)
        return status;
    fake__lock();
    settle_copies(NULL, 0, 1); /* (no copy writes into freed memory) */
    struct alloc *a = find_base(address);
    if (a == NULL || (a->kind == KIND_HOST) != host || a->kind > KIND_MANAGED) {
        fake__misuse("%s: 0x%lx is not a live %s allocation", call, (unsigned long)address,
                     host ? "pinned host" : "device or managed");
        status = CUDA_ERROR_INVALID_VALUE;
    } else {
        drop_allocation(a);
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    FAKE_ENTER("cuMemFree", return fake_fault_);
    return free_allocation("cuMemFree", (uintptr_t)dptr, 0);
}

FAKE_EXPORT CUresult cuMemFreeHost(void *p)
{
    FAKE_ENTER("cuMemFreeHost", return fake_fault_);
    return free_allocation("cuMemFreeHost", (uintptr_t)p, 1);
}

FAKE_EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total)
{
    FAKE_ENTER("cuMemGetInfo", return fake_fault_);
    CUresult status = need_context("cuMemGetInfo");
    if (status)
        return status;
    if (free_bytes == NULL || total == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fake__lock();
    *free_bytes = total_bytes - used_bytes[current->device];
    *total = total_bytes;
    fake__unlock();
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemGetAddressRange_v2(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr)
{
    FAKE_ENTER("cuMemGetAddressRange", return fake_fault_);
    CUresult status = need_context("cuMemGetAddressRange");
    if (status)
        return status;
    fake__lock();
    struct alloc *a = find_range((uintptr_t)dptr, 1, NULL);
    if (a == NULL || a == &elsewhere) {
        status = CUDA_ERROR_NOT_FOUND;
    } else {
        if (pbase)
            *pbase = (CUdeviceptr)(uintptr_t)a->base;
        if (psize)
            *psize = a->size;
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr)
{
    FAKE_ENTER("cuPointerGetAttribute", return fake_fault_);
    CUresult status = need_context("cuPointerGetAttribute");
    if (status)
        return status;
    /* CU_POINTER_ATTRIBUTE_MEMORY_TYPE (2), _IS_MANAGED (8), _DEVICE_ORDINAL (9) */
    if (data == NULL || (attribute != 2 && attribute != 8 && attribute != 9))
        return CUDA_ERROR_INVALID_VALUE;
    fake__lock();
    struct alloc *a = find_range((uintptr_t)ptr, 1, NULL);
    if (a == NULL)
        status = CUDA_ERROR_INVALID_VALUE; /* not memory this driver knows */
    else if (attribute == 2) /* managed memory reports as device memory, as the real driver's does */
        *(unsigned int *)data = a->kind == KIND_HOST ? 0x01 /* HOST */ : 0x02 /* DEVICE */;
    else if (attribute == 8)
        *(unsigned int *)data = a->kind == KIND_MANAGED;
    else
        *(int *)data = a->device;
    fake__unlock();
    return status;
}

/* ---- arrays ------------------------------------------------------------------------------- */
static size_t format_bytes(int format)
{
    switch (format) {
    case 0x01: case 0x08: return 1;   /* unsigned / signed int8 */
    case 0x02: case 0x09: case 0x10: return 2;
    case 0x03: case 0x0a: case 0x20: return 4;
    default: return 0;
    }
}

static struct fake_array *array_of(CUarray handle)
{
    for (struct fake_array *a = arrays; a; a = a->next)
        if ((CUarray)a == handle)
            return a;
    return NULL;
}

FAKE_EXPORT CUresult cuArrayCreate_v2(CUarray *handle, const CUDA_ARRAY_DESCRIPTOR *desc)
{
    FAKE_ENTER("cuArrayCreate", return fake_fault_);
    CUresult status = need_context("cuArrayCreate");
    if (status)
        return status;
    if (handle == NULL || desc == NULL || desc->Width == 0 || format_bytes(desc->Format) == 0 ||
        (desc->NumChannels != 1 && desc->NumChannels != 2 && desc->NumChannels != 4))
        return CUDA_ERROR_INVALID_VALUE;
    size_t height = desc->Height ? desc->Height : 1;
    size_t row = desc->Width * desc->NumChannels * format_bytes(desc->Format);
    struct fake_array *a = calloc(1, sizeof(*a));
    unsigned char *data;
    fake__lock();
    if (a == NULL || (status = new_allocation(row * height, KIND_DEVICE, &data)) != CUDA_SUCCESS) {
        fake__unlock();
        free(a);
        return status ? status : CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* The array's bytes are an allocation too (for the memory counts), but not a device pointer
     * anyone was given: take it off the list of those. */
    struct alloc *backing = find_base((uintptr_t)data);
    allocations = backing->next; /* new_allocation put it first */
    a->magic = MAGIC_ARRAY;
    a->width = desc->Width;
    a->height = height;
    a->row_bytes = row;
    a->format = desc->Format;
    a->channels = desc->NumChannels;
    a->device = current->device;
    a->data = data;
    a->fd = backing->fd;
    free(backing);
    a->next = arrays;
    arrays = a;
    fake__unlock();
    *handle = (CUarray)a;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuArrayDestroy(CUarray handle)
{
    FAKE_ENTER("cuArrayDestroy", return fake_fault_);
    CUresult status = need_context("cuArrayDestroy");
    if (status)
        return status;
    fake__lock();
    struct fake_array *a = array_of(handle);
    if (a == NULL) {
        fake__misuse("cuArrayDestroy: %p is not a live array", (void *)handle);
        status = CUDA_ERROR_INVALID_HANDLE;
    } else {
        for (struct fake_array **p = &arrays; *p; p = &(*p)->next)
            if (*p == a) {
                *p = a->next;
                break;
            }
        used_bytes[a->device] -= a->row_bytes * a->height;
        a->magic = 0;
        munmap(a->data, a->row_bytes * a->height);
        close(a->fd);
        free(a);
    }
    fake__unlock();
    return status;
}

/* ---- streams and events ------------------------------------------------------------------- */
static int stream_ok(CUstream stream)
{
    uintptr_t value = (uintptr_t)stream;
    if (value == 0 || value == 1 || value == 2) /* legacy default, CU_STREAM_LEGACY, per-thread */
        return 1;
    for (struct fake_cu_stream *s = cu_streams; s; s = s->next)
        if ((CUstream)s == stream)
            return 1;
    return 0;
}

static struct fake_event *event_of(CUevent handle)
{
    for (struct fake_event *e = events; e; e = e->next)
        if ((CUevent)e == handle)
            return e;
    return NULL;
}

/* Context and stream checks of a call that takes a stream; lock held on success. */
static CUresult enter_with_stream(const char *call, CUstream stream)
{
    CUresult status = need_context(call);
    if (status)
        return status;
    fake__lock();
    if (!stream_ok(stream)) {
        fake__unlock();
        fake__misuse("%s: %p is not a live CUDA stream", call, (void *)stream);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    return CUDA_SUCCESS;
}

/* The order between streams, without timing (fake_cuda_hold): a test marks a stream as having
 * queued work that has not run, until it lets go. Each hold is a bit, never reused; a stream's
 * entry says which holds it waits behind: its own, and those of the events it waited on. While a
 * hold is live, cuStreamQuery of a stream behind it says NOT_READY, an event recorded on such a
 * stream is pending, and a stream that waits on that event is behind the hold too. Lock held. */
#define MAX_STREAM_STATES 256
static struct {
    CUstream stream;
    uint32_t hold;
    uint32_t waits;
} stream_states[MAX_STREAM_STATES];
static uint32_t live_holds, next_hold = 1;

/* The index of the stream's entry, made if need be; -1 when the table is full. */
static int stream_state(CUstream stream)
{
    int free_entry = -1;
    for (int i = 0; i < MAX_STREAM_STATES; i++) {
        if (stream_states[i].hold || stream_states[i].waits) {
            if (stream_states[i].stream == stream)
                return i;
        } else if (free_entry < 0) {
            free_entry = i;
        }
    }
    if (free_entry >= 0)
        stream_states[free_entry].stream = stream;
    return free_entry;
}

static uint32_t holds_of(CUstream stream)
{
    for (int i = 0; i < MAX_STREAM_STATES; i++)
        if ((stream_states[i].hold || stream_states[i].waits) && stream_states[i].stream == stream)
            return (stream_states[i].hold | stream_states[i].waits) & live_holds;
    return 0;
}

/* Test hook: mark `stream` (NULL: the legacy default stream) busy (held = 1) or let it go (0). */
FAKE_EXPORT void fake_cuda_hold(CUstream stream, int held)
{
    fake__lock();
    int i = stream_state(stream);
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
    fake__unlock();
}

/* FAKE_CUDA_BUSY_AFTER_WAIT=N: every Nth cuStreamQuery after a cuStreamWaitEvent says NOT_READY
 * (twice: a caller may ask again before recording), and so does every Nth cuEventQuery, as a real
 * stream and event would while the work before them still runs. Lock held. */
static int waited;
static unsigned queries_after_wait, event_queries;
static int busy_queries;

/* FAKE_CUDA_STATS_DIR: DIR/<pid>.calls says how many cuEventRecord and cuStreamWaitEvent calls this
 * process made, kept up to date for tests that check which ordering path ran. */
static unsigned long records, waits;
static void count_call(unsigned long *counter)
{
    ++*counter;
    if (stats_dir == NULL)
        return;
    char path[4096];
    snprintf(path, sizeof path, "%s/%d.calls", stats_dir, (int)getpid());
    FILE *file = fopen(path, "w");
    if (file) {
        fprintf(file, "records %lu waits %lu\n", records, waits);
        fclose(file);
    }
}

struct side {
    unsigned char *first; /* the first byte of the first row */
    size_t pitch;
};

/* FAKE_D2H_DELAY_US=N: a device -> host cuMemcpy2DAsync is done N us after the stream's copies
 * before it, as a real one runs after the host call returned. Its source is read when it is
 * queued; its destination holds 0xEE bytes until the copy is done, which the host learns from
 * cuStreamSynchronize, cuStreamQuery, or cuEventQuery / cuEventSynchronize of an event recorded
 * after it (a caller that reads the bytes sooner reads 0xEE). Freeing host memory or destroying a
 * stream finishes every pending copy first. FAKE_H2D_DELAY_US=N: the same for a host -> device
 * one, which reads its host source when it is done (a caller that writes the source again sooner
 * changes what arrives). Lock held in each of these. */
struct pending_copy {
    struct pending_copy *next;
    CUstream stream;
    long long done_ns;
    unsigned char *dst;
    const unsigned char *src; /* read when done: the snapshot in data, or the host source (H2D) */
    size_t pitch, src_pitch, width, height;
    unsigned char data[];
};
static struct pending_copy *pending_copies;

/* When the last copy pending on `stream` is done (0: none is pending). */
static long long pending_done(CUstream stream)
{
    long long last = 0;
    for (struct pending_copy *c = pending_copies; c; c = c->next)
        if (c->stream == stream && c->done_ns > last)
            last = c->done_ns;
    return last;
}

/* Finish the copies of `stream` done by `now` (every stream's with `all`); whether one is left on it. */
static int settle_copies(CUstream stream, long long now, int all)
{
    int left = 0;
    for (struct pending_copy **p = &pending_copies; *p;) {
        struct pending_copy *c = *p;
        if (all || (c->stream == stream && c->done_ns <= now)) {
            for (size_t row = 0; row < c->height; row++)
                memcpy(c->dst + row * c->pitch, c->src + row * c->src_pitch, c->width);
            *p = c->next;
            free(c);
            continue;
        }
        if (c->stream == stream)
            left = 1;
        p = &c->next;
    }
    return left;
}

/* Queue a delayed copy; 0 when it cannot be (out of memory: the copy is made at once instead). */
static int delay_copy(CUstream stream, const struct side *src, const struct side *dst, size_t width, size_t height,
                      long long delay_ns, int snapshot)
{
    struct pending_copy *c = malloc(sizeof(*c) + (snapshot ? width * height : 0));
    if (c == NULL)
        return 0;
    long long now = fake__now_ns(), last = pending_done(stream);
    c->stream = stream;
    c->done_ns = (last > now ? last : now) + delay_ns;
    c->dst = dst->first;
    c->pitch = dst->pitch;
    c->src = snapshot ? c->data : src->first;
    c->src_pitch = snapshot ? width : src->pitch;
    c->width = width;
    c->height = height;
    for (size_t row = 0; row < height; row++) {
        if (snapshot)
            memcpy(c->data + row * width, src->first + row * src->pitch, width);
        memset(dst->first + row * dst->pitch, 0xEE, width);
    }
    struct pending_copy **tail = &pending_copies;
    while (*tail)
        tail = &(*tail)->next;
    c->next = NULL;
    *tail = c;
    return 1;
}

/* Wait (the lock let go meanwhile) until the copies of `stream` up to `done_ns` are done. */
static void wait_copies(CUstream stream, long long done_ns)
{
    if (done_ns == 0)
        return;
    while (fake__now_ns() < done_ns)
        fake__wait_until(done_ns);
    settle_copies(stream, fake__now_ns(), 0);
}

FAKE_EXPORT CUresult cuStreamCreate(CUstream *out, unsigned int flags)
{
    FAKE_ENTER("cuStreamCreate", return fake_fault_);
    CUresult status = need_context("cuStreamCreate");
    if (status)
        return status;
    if (out == NULL || flags > 1)
        return CUDA_ERROR_INVALID_VALUE;
    if (want_stream_flags >= 0 && (int)flags != want_stream_flags) {
        fake__misuse("cuStreamCreate: flags %u, the test wants %d", flags, want_stream_flags);
        return CUDA_ERROR_INVALID_VALUE;
    }
    struct fake_cu_stream *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    s->magic = MAGIC_CU_STREAM;
    s->device = current->device;
    fake__lock();
    s->next = cu_streams;
    cu_streams = s;
    fake__unlock();
    *out = (CUstream)s;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuStreamDestroy_v2(CUstream stream)
{
    FAKE_ENTER("cuStreamDestroy", return fake_fault_);
    CUresult status = need_context("cuStreamDestroy");
    if (status)
        return status;
    fake__lock();
    settle_copies(NULL, 0, 1); /* (its copies end before it does) */
    status = CUDA_ERROR_INVALID_HANDLE;
    for (struct fake_cu_stream **p = &cu_streams; *p; p = &(*p)->next)
        if (*p == (struct fake_cu_stream *)stream) {
            *p = (*p)->next;
            ((struct fake_cu_stream *)stream)->magic = 0;
            free(stream);
            status = CUDA_SUCCESS;
            break;
        }
    fake__unlock();
    if (status)
        fake__misuse("cuStreamDestroy: %p is not a live CUDA stream", (void *)stream);
    return status;
}

FAKE_EXPORT CUresult cuStreamSynchronize(CUstream stream)
{
    FAKE_ENTER("cuStreamSynchronize", return fake_fault_);
    CUresult status = enter_with_stream("cuStreamSynchronize", stream);
    if (status == CUDA_SUCCESS) {
        wait_copies(stream, pending_done(stream));
        fake__unlock();
    }
    return status;
}

FAKE_EXPORT CUresult cuStreamQuery(CUstream stream)
{
    FAKE_ENTER("cuStreamQuery", return fake_fault_);
    CUresult status = enter_with_stream("cuStreamQuery", stream);
    if (status)
        return status;
    if (holds_of(stream) || settle_copies(stream, fake__now_ns(), 0)) {
        status = CUDA_ERROR_NOT_READY;
    } else {
        if (waited && busy_after_wait && ++queries_after_wait % busy_after_wait == 0)
            busy_queries = 2;
        waited = 0;
        if (busy_queries > 0) {
            busy_queries--;
            status = CUDA_ERROR_NOT_READY;
        }
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuStreamWaitEvent(CUstream stream, CUevent event, unsigned int flags)
{
    FAKE_ENTER("cuStreamWaitEvent", return fake_fault_);
    CUresult status = enter_with_stream("cuStreamWaitEvent", stream);
    if (status)
        return status;
    struct fake_event *e = event_of(event);
    waited = 1;
    if (e == NULL) {
        fake__misuse("cuStreamWaitEvent: %p is not a live event", (void *)event);
        status = CUDA_ERROR_INVALID_HANDLE;
    } else if (flags != 0) {
        status = CUDA_ERROR_INVALID_VALUE;
    } else {
        uint32_t behind = e->holds & live_holds;
        int i = behind ? stream_state(stream) : -1;
        if (i >= 0)
            stream_states[i].waits |= behind;
        count_call(&waits);
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuStreamAttachMemAsync(CUstream stream, CUdeviceptr dptr, size_t length, unsigned int flags)
{
    FAKE_ENTER("cuStreamAttachMemAsync", return fake_fault_);
    CUresult status = enter_with_stream("cuStreamAttachMemAsync", stream);
    if (status)
        return status;
    struct alloc *a = find_base((uintptr_t)dptr);
    if (a == NULL || a->kind != KIND_MANAGED || (length != 0 && length != a->size) ||
        (flags != 1 && flags != 2 && flags != 4) || (flags == 4 && stream == NULL))
        status = CUDA_ERROR_INVALID_VALUE;
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuEventCreate(CUevent *out, unsigned int flags)
{
    FAKE_ENTER("cuEventCreate", return fake_fault_);
    CUresult status = need_context("cuEventCreate");
    if (status)
        return status;
    if (out == NULL || (flags & ~0x7u) || ((flags & 0x4) && !(flags & 0x2))) /* interprocess: no timing */
        return CUDA_ERROR_INVALID_VALUE;
    struct fake_event *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = MAGIC_EVENT;
    e->flags = flags;
    fake__lock();
    e->id = next_event_id++;
    e->next = events;
    events = e;
    fake__unlock();
    *out = (CUevent)e;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuEventDestroy_v2(CUevent event)
{
    FAKE_ENTER("cuEventDestroy", return fake_fault_);
    CUresult status = need_context("cuEventDestroy");
    if (status)
        return status;
    fake__lock();
    status = CUDA_ERROR_INVALID_HANDLE;
    for (struct fake_event **p = &events; *p; p = &(*p)->next)
        if (*p == (struct fake_event *)event) {
            *p = (*p)->next;
            ((struct fake_event *)event)->magic = 0;
            free(event);
            status = CUDA_SUCCESS;
            break;
        }
    fake__unlock();
    if (status)
        fake__misuse("cuEventDestroy: %p is not a live event", (void *)event);
    return status;
}

FAKE_EXPORT CUresult cuEventRecord(CUevent event, CUstream stream)
{
    FAKE_ENTER("cuEventRecord", return fake_fault_);
    CUresult status = enter_with_stream("cuEventRecord", stream);
    if (status)
        return status;
    struct fake_event *e = event_of(event);
    if (e == NULL) {
        fake__misuse("cuEventRecord: %p is not a live event", (void *)event);
        status = CUDA_ERROR_INVALID_HANDLE;
    } else {
        e->recorded_ns = fake__now_ns();
        e->done_ns = pending_done(stream);
        e->stream = stream;
        e->holds = holds_of(stream);
        busy_queries = 0; /* the stream's queued work "ran" behind the record */
        count_call(&records);
    }
    fake__unlock();
    return status;
}

static CUresult event_check(const char *call, CUevent event)
{
    CUresult status = need_context(call);
    if (status)
        return status;
    fake__lock();
    if (event_of(event) == NULL) {
        fake__misuse("%s: %p is not a live event", call, (void *)event);
        status = CUDA_ERROR_INVALID_HANDLE;
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuEventSynchronize(CUevent event)
{
    FAKE_ENTER("cuEventSynchronize", return fake_fault_);
    CUresult status = event_check("cuEventSynchronize", event);
    if (status == CUDA_SUCCESS && (d2h_delay_ns || h2d_delay_ns)) {
        fake__lock();
        struct fake_event *e = event_of(event);
        if (e)
            wait_copies(e->stream, e->done_ns);
        fake__unlock();
    }
    return status;
}

FAKE_EXPORT CUresult cuEventQuery(CUevent event)
{
    FAKE_ENTER("cuEventQuery", return fake_fault_);
    CUresult status = event_check("cuEventQuery", event);
    if (status)
        return status;
    fake__lock();
    struct fake_event *e = event_of(event);
    long long now = fake__now_ns();
    if (e && e->done_ns > now) { /* (FAKE_*_DELAY_US: a copy before its record still runs) */
        status = CUDA_ERROR_NOT_READY;
    } else {
        if (e && e->done_ns)
            settle_copies(e->stream, now, 0);
        if (e && (e->holds & live_holds))
            status = CUDA_ERROR_NOT_READY;
        else if (busy_after_wait && ++event_queries % busy_after_wait == 0)
            status = CUDA_ERROR_NOT_READY;
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuEventElapsedTime(float *ms, CUevent start, CUevent end)
{
    FAKE_ENTER("cuEventElapsedTime", return fake_fault_);
    CUresult status = need_context("cuEventElapsedTime");
    if (status)
        return status;
    if (ms == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fake__lock();
    struct fake_event *a = event_of(start), *b = event_of(end);
    if (a == NULL || b == NULL || (a->flags & 2) || (b->flags & 2))
        status = CUDA_ERROR_INVALID_HANDLE;
    else if (!a->recorded_ns || !b->recorded_ns)
        status = CUDA_ERROR_NOT_READY;
    else
        *ms = (float)(b->recorded_ns - a->recorded_ns) / 1e6f;
    fake__unlock();
    return status;
}

/* ---- copies ------------------------------------------------------------------------------- */
/* One end of a 2D copy, checked; lock held. */
static CUresult copy_side(const char *call, const char *which, int type, const void *host, CUdeviceptr device,
                          CUarray array, size_t x, size_t y, size_t pitch, size_t width, size_t height,
                          struct side *out)
{
    uintptr_t address;
    struct fake_array *a;
    int partial;
    if (type == 4 /* unified */) {
        type = find_range((uintptr_t)device, 1, NULL) ? 2 : 1;
        host = (const void *)(uintptr_t)device;
    }
    switch (type) {
    case 1: /* host */
        if (host == NULL || (height > 1 && pitch < width))
            return CUDA_ERROR_INVALID_VALUE;
        out->first = (unsigned char *)host + y * pitch + x;
        out->pitch = pitch;
        return CUDA_SUCCESS;
    case 2: /* device */
        if (height > 1 && pitch < width)
            return CUDA_ERROR_INVALID_VALUE;
        address = (uintptr_t)device + y * pitch + x;
        if (find_range(address, (height - 1) * pitch + width, &partial) == NULL) {
            fake__misuse("%s: %s device range 0x%lx + %zu rows of %zu bytes, %zu apart, is %s", call, which,
                         (unsigned long)address, height, width, pitch,
                         partial ? "past the end of its allocation" : "in no live allocation");
            return partial ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_ERROR_INVALID_VALUE;
        }
        out->first = (unsigned char *)address;
        out->pitch = pitch;
        return CUDA_SUCCESS;
    case 3: /* array */
        a = array_of(array);
        if (a == NULL) {
            fake__misuse("%s: %s %p is not a live array", call, which, (void *)array);
            return CUDA_ERROR_INVALID_HANDLE;
        }
        if (x + width > a->row_bytes || y + height > a->height) {
            fake__misuse("%s: %s rows %zu..%zu, bytes %zu..%zu outside the %zux%zu-byte array", call, which, y,
                         y + height, x, x + width, a->row_bytes, a->height);
            return CUDA_ERROR_INVALID_VALUE;
        }
        out->first = a->data + y * a->row_bytes + x;
        out->pitch = a->row_bytes;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

static CUresult copy_2d(const char *call, const CUDA_MEMCPY2D *copy, CUstream stream, int queued)
{
    CUresult status = enter_with_stream(call, stream);
    if (status)
        return status;
    struct side src, dst;
    if (copy == NULL) {
        status = CUDA_ERROR_INVALID_VALUE;
    } else if (copy->WidthInBytes && copy->Height) {
        status = copy_side(call, "source", copy->srcMemoryType, copy->srcHost, copy->srcDevice, copy->srcArray,
                           copy->srcXInBytes, copy->srcY, copy->srcPitch, copy->WidthInBytes, copy->Height, &src);
        if (status == CUDA_SUCCESS)
            status = copy_side(call, "destination", copy->dstMemoryType, copy->dstHost, copy->dstDevice,
                               copy->dstArray, copy->dstXInBytes, copy->dstY, copy->dstPitch, copy->WidthInBytes,
                               copy->Height, &dst);
        int d2h = copy->dstMemoryType == 1 /* host */ && copy->srcMemoryType != 1;
        int h2d = copy->srcMemoryType == 1 && copy->dstMemoryType == 2 /* device */;
        if (status == CUDA_SUCCESS &&
            !(queued && d2h && d2h_delay_ns && delay_copy(stream, &src, &dst, copy->WidthInBytes, copy->Height,
                                                           d2h_delay_ns, 1)) &&
            !(queued && h2d && h2d_delay_ns && delay_copy(stream, &src, &dst, copy->WidthInBytes, copy->Height,
                                                           h2d_delay_ns, 0)))
            for (size_t row = 0; row < copy->Height; row++)
                memmove(dst.first + row * dst.pitch, src.first + row * src.pitch, copy->WidthInBytes);
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuMemcpy2D_v2(const CUDA_MEMCPY2D *copy)
{
    FAKE_ENTER("cuMemcpy2D", return fake_fault_);
    return copy_2d("cuMemcpy2D", copy, NULL, 0);
}

FAKE_EXPORT CUresult cuMemcpy2DAsync_v2(const CUDA_MEMCPY2D *copy, CUstream stream)
{
    FAKE_ENTER("cuMemcpy2DAsync", return fake_fault_);
    return copy_2d("cuMemcpy2DAsync", copy, stream, 1);
}

FAKE_EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t count, CUstream stream)
{
    FAKE_ENTER("cuMemsetD8Async", return fake_fault_);
    CUresult status = enter_with_stream("cuMemsetD8Async", stream);
    if (status)
        return status;
    int partial;
    if (count && find_range((uintptr_t)dst, count, &partial) == NULL) {
        fake__misuse("cuMemsetD8Async: 0x%lx + %zu bytes is not inside a live allocation", (unsigned long)dst, count);
        status = partial ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_ERROR_INVALID_VALUE;
    } else if (count) {
        memset((void *)(uintptr_t)dst, value, count);
    }
    fake__unlock();
    return status;
}

/* The 1D and 2D memsets and the device-to-host copy bench/c/cross_gpu.c makes. */
FAKE_EXPORT CUresult cuMemsetD2D8Async(CUdeviceptr dst, size_t pitch, unsigned char value, size_t width,
                                       size_t height, CUstream stream)
{
    FAKE_ENTER("cuMemsetD2D8Async", return fake_fault_);
    CUresult status = enter_with_stream("cuMemsetD2D8Async", stream);
    if (status)
        return status;
    int partial;
    if (width && height && (pitch < width || find_range((uintptr_t)dst, pitch * (height - 1) + width, &partial) == NULL)) {
        fake__misuse("cuMemsetD2D8Async: 0x%lx, %zu rows of %zu bytes %zu apart, is not inside a live allocation",
                     (unsigned long)dst, height, width, pitch);
        status = pitch < width ? CUDA_ERROR_INVALID_VALUE : partial ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_ERROR_INVALID_VALUE;
    } else {
        for (size_t row = 0; row < height && width; row++)
            memset((void *)(uintptr_t)(dst + row * pitch), value, width);
    }
    fake__unlock();
    return status;
}

static long memsets32; /* counted from 0, for FAKE_SKIP_FILL_AT */

FAKE_EXPORT CUresult cuMemsetD32Async(CUdeviceptr dst, unsigned int value, size_t count, CUstream stream)
{
    FAKE_ENTER("cuMemsetD32Async", return fake_fault_);
    CUresult status = enter_with_stream("cuMemsetD32Async", stream);
    if (status)
        return status;
    int partial;
    if (dst & 3) {
        status = CUDA_ERROR_INVALID_VALUE;
    } else if (count && find_range((uintptr_t)dst, count * 4, &partial) == NULL) {
        fake__misuse("cuMemsetD32Async: 0x%lx + %zu words is not inside a live allocation", (unsigned long)dst, count);
        status = partial ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_ERROR_INVALID_VALUE;
    } else if (skip_memset32_at < 0 || memsets32++ != skip_memset32_at) { /* the skipped one writes nothing */
        for (size_t i = 0; i < count; i++)
            ((unsigned int *)(uintptr_t)dst)[i] = value;
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t count, CUstream stream)
{
    FAKE_ENTER("cuMemcpyDtoHAsync", return fake_fault_);
    CUresult status = enter_with_stream("cuMemcpyDtoHAsync", stream);
    if (status)
        return status;
    int partial;
    if (dst == NULL) {
        status = CUDA_ERROR_INVALID_VALUE;
    } else if (count && find_range((uintptr_t)src, count, &partial) == NULL) {
        fake__misuse("cuMemcpyDtoHAsync: 0x%lx + %zu bytes is not inside a live allocation", (unsigned long)src, count);
        status = partial ? CUDA_ERROR_ILLEGAL_ADDRESS : CUDA_ERROR_INVALID_VALUE;
    } else if (count) {
        memcpy(dst, (const void *)(uintptr_t)src, count);
    }
    fake__unlock();
    return status;
}

/* Test hooks: treat [base, base + size) of host memory as device memory another library owns (a
 * decoder's output), or stop. Not counted in fake_live_allocations(). */
FAKE_EXPORT int fake_cuda_adopt(void *base, size_t size)
{
    fake__lock();
    struct alloc *a = size ? track(base, size, KIND_FOREIGN, 0, -1) : NULL;
    fake__unlock();
    return a != NULL;
}

FAKE_EXPORT int fake_cuda_disown(void *base)
{
    fake__lock();
    struct alloc *a = find_base((uintptr_t)base);
    int found = a != NULL && a->kind == KIND_FOREIGN;
    if (found)
        untrack(a);
    fake__unlock();
    return found;
}

/* ---- CUDA IPC ----------------------------------------------------------------------------- */
/* A memory handle names (exporter pid, the allocation's memfd, size); the importer opens
 * /proc/PID/fd/N, so, as with the driver, a handle works in any process of the same user, not in
 * the exporter's own, and once per process (CUDA_ERROR_ALREADY_MAPPED). An event handle names
 * (pid, event id): the opened event is a new event of the importer, with no link to the
 * exporter's records (work is done when queued, so every order holds anyway). */
struct ipc_mem {
    uint32_t magic;
    int32_t pid;
    int32_t fd;
    uint32_t pad;
    uint64_t size;
};
struct ipc_event {
    uint32_t magic;
    int32_t pid;
    uint32_t id;
};
#define IPC_MEM_MAGIC 0x4d454d48u
#define IPC_EVENT_MAGIC 0x45565448u

FAKE_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *handle, CUdeviceptr dptr)
{
    FAKE_ENTER("cuIpcGetMemHandle", return fake_fault_);
    CUresult status = need_context("cuIpcGetMemHandle");
    if (status)
        return status;
    if (handle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fake__lock();
    struct alloc *a = find_base((uintptr_t)dptr);
    if (a == NULL || a->kind != KIND_DEVICE) {
        status = CUDA_ERROR_INVALID_VALUE; /* only the base of a cuMemAlloc allocation */
    } else {
        struct ipc_mem m = {IPC_MEM_MAGIC, getpid(), a->fd, 0, a->size};
        memset(handle, 0, sizeof(*handle));
        memcpy(handle->reserved, &m, sizeof(m));
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *dptr, CUipcMemHandle handle, unsigned int flags)
{
    FAKE_ENTER("cuIpcOpenMemHandle", return fake_fault_);
    CUresult status = need_context("cuIpcOpenMemHandle");
    if (status)
        return status;
    struct ipc_mem m;
    memcpy(&m, handle.reserved, sizeof(m));
    if (dptr == NULL || m.magic != IPC_MEM_MAGIC || flags > 1)
        return CUDA_ERROR_INVALID_VALUE;
    if (m.pid == getpid())
        return CUDA_ERROR_INVALID_CONTEXT; /* the driver's rule: not in the exporting process */
    char key[32], path[64];
    snprintf(key, sizeof key, "%d:%d", m.pid, m.fd);
    fake__lock();
    for (struct alloc *a = allocations; a; a = a->next)
        if (a->kind == KIND_IMPORTED && strcmp(a->key, key) == 0) {
            fake__unlock();
            return CUDA_ERROR_ALREADY_MAPPED;
        }
    fake__unlock();
    snprintf(path, sizeof path, "/proc/%d/fd/%d", m.pid, m.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_INVALID_VALUE;
    void *base = mmap(NULL, m.size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED)
        return CUDA_ERROR_INVALID_VALUE;
    fake__lock();
    struct alloc *a = track(base, m.size, KIND_IMPORTED, current->device, -1);
    if (a == NULL) {
        fake__unlock();
        munmap(base, m.size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    snprintf(a->key, sizeof a->key, "%s", key);
    fake__unlock();
    *dptr = (CUdeviceptr)(uintptr_t)base;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    FAKE_ENTER("cuIpcCloseMemHandle", return fake_fault_);
    CUresult status = need_context("cuIpcCloseMemHandle");
    if (status)
        return status;
    fake__lock();
    struct alloc *a = find_base((uintptr_t)dptr);
    if (a == NULL || a->kind != KIND_IMPORTED) {
        fake__misuse("cuIpcCloseMemHandle: 0x%lx is not memory opened from a handle", (unsigned long)dptr);
        status = CUDA_ERROR_INVALID_VALUE;
    } else {
        munmap(a->base, a->size);
        untrack(a);
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuIpcGetEventHandle(CUipcEventHandle *handle, CUevent event)
{
    FAKE_ENTER("cuIpcGetEventHandle", return fake_fault_);
    CUresult status = need_context("cuIpcGetEventHandle");
    if (status)
        return status;
    if (handle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fake__lock();
    struct fake_event *e = event_of(event);
    if (e == NULL) {
        fake__misuse("cuIpcGetEventHandle: %p is not a live event", (void *)event);
        status = CUDA_ERROR_INVALID_HANDLE;
    } else if (!(e->flags & 0x4)) {
        status = CUDA_ERROR_INVALID_VALUE; /* not made with CU_EVENT_INTERPROCESS */
    } else {
        struct ipc_event m = {IPC_EVENT_MAGIC, getpid(), e->id};
        memset(handle, 0, sizeof(*handle));
        memcpy(handle->reserved, &m, sizeof(m));
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuIpcOpenEventHandle(CUevent *out, CUipcEventHandle handle)
{
    FAKE_ENTER("cuIpcOpenEventHandle", return fake_fault_);
    CUresult status = need_context("cuIpcOpenEventHandle");
    if (status)
        return status;
    struct ipc_event m;
    memcpy(&m, handle.reserved, sizeof(m));
    if (out == NULL || m.magic != IPC_EVENT_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    if (m.pid == getpid())
        return CUDA_ERROR_INVALID_CONTEXT;
    struct fake_event *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    e->magic = MAGIC_EVENT;
    e->flags = 0x6;
    fake__lock();
    e->id = next_event_id++;
    e->next = events;
    events = e;
    fake__unlock();
    *out = (CUevent)e;
    return CUDA_SUCCESS;
}

/* ---- virtual memory management ------------------------------------------------------------ */
/* A physical allocation (cuMemCreate) is a memfd of its size; its handle is the address of its
 * record. Export dups the memfd (the caller owns the copy); import takes a descriptor, in any
 * process that holds one (sent with SCM_RIGHTS), and keeps its own dup. A reservation
 * (cuMemAddressReserve) is PROT_NONE anonymous address space; cuMemMap maps the memfd over part
 * of it (MAP_FIXED, MAP_SHARED) still PROT_NONE, cuMemSetAccess makes it readable and writable
 * (from then on it is device memory for copies and memsets), cuMemUnmap puts the PROT_NONE
 * reservation back. cuMemRelease closes the handle's descriptor: a live mapping keeps the bytes,
 * as the driver keeps an allocation until its last mapping goes.
 * The granularity is 2 MiB, as NVIDIA GPUs report (FAKE_CUDA_VMM_GRANULARITY=BYTES, a power of
 * two >= 4096, sets another); memfd pages are only touched when written, so it costs little.
 * Only the POSIX file descriptor handle type is modelled: others are CUDA_ERROR_NOT_SUPPORTED. */
#define MAGIC_VMM 0x564D4D48u

struct vmm_handle {
    unsigned int magic;
    struct vmm_handle *next;
    int fd;
    size_t size;
    int device;   /* -1: imported (its bytes count on the exporter's device) */
};

struct vmm_range { /* a reservation, or a mapping inside one */
    struct vmm_range *next;
    uintptr_t base;
    size_t size;
    struct alloc *accessible; /* mapping with access granted: its entry among the allocations */
};

static struct vmm_handle *vmm_handles;
static struct vmm_range *reservations, *mappings;

static struct vmm_handle *vmm_handle_of(CUmemGenericAllocationHandle handle)
{
    for (struct vmm_handle *h = vmm_handles; h; h = h->next)
        if ((CUmemGenericAllocationHandle)(uintptr_t)h == handle)
            return h;
    return NULL;
}

static struct vmm_handle *vmm_handle_new(int fd, size_t size, int device)
{
    struct vmm_handle *h = calloc(1, sizeof(*h));
    if (h == NULL)
        return NULL;
    h->magic = MAGIC_VMM;
    h->fd = fd;
    h->size = size;
    h->device = device;
    h->next = vmm_handles;
    vmm_handles = h;
    return h;
}

static struct vmm_range *range_holding(struct vmm_range *list, uintptr_t base, size_t size)
{
    for (struct vmm_range *r = list; r; r = r->next)
        if (base >= r->base && size <= r->size && base - r->base <= r->size - size)
            return r;
    return NULL;
}

static int overlaps(struct vmm_range *list, uintptr_t base, size_t size)
{
    for (struct vmm_range *r = list; r; r = r->next)
        if (base < r->base + r->size && r->base < base + size)
            return 1;
    return 0;
}

static void range_unlink(struct vmm_range **list, struct vmm_range *range)
{
    for (struct vmm_range **p = list; *p; p = &(*p)->next)
        if (*p == range) {
            *p = range->next;
            break;
        }
    free(range);
}

static int valid_prop(const CUmemAllocationProp *prop)
{
    return prop && prop->type == 1 /* pinned */ && prop->location.type == 1 /* device */ &&
           prop->location.id >= 0 && prop->location.id < fake__device_count();
}

FAKE_EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, int option)
{
    FAKE_ENTER("cuMemGetAllocationGranularity", return fake_fault_);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (granularity == NULL || !valid_prop(prop) || (option != 0 && option != 1))
        return CUDA_ERROR_INVALID_VALUE;
    *granularity = vmm_granularity; /* minimum and recommended alike */
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                                 unsigned long long flags)
{
    FAKE_ENTER("cuMemCreate", return fake_fault_);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (handle == NULL || !valid_prop(prop) || flags != 0 || size == 0 || size % vmm_granularity)
        return CUDA_ERROR_INVALID_VALUE;
    if (prop->requestedHandleTypes != 1)
        return CUDA_ERROR_NOT_SUPPORTED; /* only POSIX file descriptors are modelled */
    int device = prop->location.id;
    fake__lock();
    CUresult status = CUDA_SUCCESS;
    if (used_bytes[device] + size > total_bytes || used_bytes[device] + size < size) {
        status = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        int fd = memfd_create("fake-cuda-vmm", MFD_CLOEXEC);
        struct vmm_handle *h = NULL;
        if (fd < 0 || ftruncate(fd, (off_t)size) < 0 || (h = vmm_handle_new(fd, size, device)) == NULL) {
            if (fd >= 0)
                close(fd);
            status = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            used_bytes[device] += size;
            *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
        }
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    FAKE_ENTER("cuMemRelease", return fake_fault_);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult status = CUDA_SUCCESS;
    fake__lock();
    struct vmm_handle *h = vmm_handle_of(handle);
    if (h == NULL) {
        fake__misuse("cuMemRelease: 0x%llx is not a live allocation handle", handle);
        status = CUDA_ERROR_INVALID_VALUE;
    } else {
        for (struct vmm_handle **p = &vmm_handles; *p; p = &(*p)->next)
            if (*p == h) {
                *p = h->next;
                break;
            }
        if (h->device >= 0)
            used_bytes[h->device] -= h->size;
        close(h->fd);
        h->magic = 0;
        free(h);
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuMemExportToShareableHandle(void *shareable, CUmemGenericAllocationHandle handle, int type,
                                                  unsigned long long flags)
{
    FAKE_ENTER("cuMemExportToShareableHandle", return fake_fault_);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (shareable == NULL || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (type != 1)
        return CUDA_ERROR_NOT_SUPPORTED;
    CUresult status = CUDA_SUCCESS;
    fake__lock();
    struct vmm_handle *h = vmm_handle_of(handle);
    if (h == NULL) {
        fake__misuse("cuMemExportToShareableHandle: 0x%llx is not a live allocation handle", handle);
        status = CUDA_ERROR_INVALID_VALUE;
    } else {
        int fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 0);
        if (fd < 0)
            status = CUDA_ERROR_OUT_OF_MEMORY;
        else
            *(int *)shareable = fd;
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *os_handle, int type)
{
    FAKE_ENTER("cuMemImportFromShareableHandle", return fake_fault_);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (handle == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (type != 1)
        return CUDA_ERROR_NOT_SUPPORTED;
    int fd = (int)(intptr_t)os_handle;
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
        (size_t)st.st_size % vmm_granularity)
        return CUDA_ERROR_INVALID_VALUE; /* not a descriptor of an exported allocation */
    int own = fcntl(fd, F_DUPFD_CLOEXEC, 0); /* the caller keeps (and closes) its descriptor */
    if (own < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    fake__lock();
    struct vmm_handle *h = vmm_handle_new(own, (size_t)st.st_size, -1);
    fake__unlock();
    if (h == NULL) {
        close(own);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,
                                         unsigned long long flags)
{
    FAKE_ENTER("cuMemAddressReserve", return fake_fault_);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (ptr == NULL || size == 0 || size % vmm_granularity || flags != 0 || (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    (void)addr; /* a hint the driver may ignore: so does the fake */
    size_t align = alignment > vmm_granularity ? alignment : vmm_granularity;
    size_t span = size + align;
    unsigned char *raw = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    uintptr_t base = ((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1);
    if (base > (uintptr_t)raw)
        munmap(raw, base - (uintptr_t)raw);
    if ((uintptr_t)raw + span > base + size)
        munmap((void *)(base + size), (uintptr_t)raw + span - (base + size));
    struct vmm_range *r = calloc(1, sizeof(*r));
    if (r == NULL) {
        munmap((void *)base, size);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    r->base = base;
    r->size = size;
    fake__lock();
    r->next = reservations;
    reservations = r;
    fake__unlock();
    *ptr = (CUdeviceptr)base;
    return CUDA_SUCCESS;
}

FAKE_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    FAKE_ENTER("cuMemAddressFree", return fake_fault_);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult status = CUDA_SUCCESS;
    fake__lock();
    struct vmm_range *r = range_holding(reservations, (uintptr_t)ptr, size);
    if (r == NULL || r->base != (uintptr_t)ptr || r->size != size) {
        fake__misuse("cuMemAddressFree: 0x%lx + %zu is not a reservation", (unsigned long)ptr, size);
        status = CUDA_ERROR_INVALID_VALUE;
    } else if (overlaps(mappings, r->base, r->size)) {
        fake__misuse("cuMemAddressFree: 0x%lx + %zu is still mapped", (unsigned long)ptr, size);
        status = CUDA_ERROR_INVALID_VALUE;
    } else {
        munmap((void *)r->base, r->size);
        range_unlink(&reservations, r);
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                              unsigned long long flags)
{
    FAKE_ENTER("cuMemMap", return fake_fault_);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (size == 0 || size % vmm_granularity || offset % vmm_granularity || flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult status = CUDA_SUCCESS;
    fake__lock();
    struct vmm_handle *h = vmm_handle_of(handle);
    struct vmm_range *m = NULL;
    if (h == NULL) {
        fake__misuse("cuMemMap: 0x%llx is not a live allocation handle", handle);
        status = CUDA_ERROR_INVALID_VALUE;
    } else if (offset > h->size || size > h->size - offset) {
        status = CUDA_ERROR_INVALID_VALUE;
    } else if (range_holding(reservations, (uintptr_t)ptr, size) == NULL) {
        fake__misuse("cuMemMap: 0x%lx + %zu is not inside a reservation", (unsigned long)ptr, size);
        status = CUDA_ERROR_INVALID_VALUE;
    } else if (overlaps(mappings, (uintptr_t)ptr, size)) {
        status = CUDA_ERROR_ALREADY_MAPPED;
    } else if ((m = calloc(1, sizeof(*m))) == NULL ||
               mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, h->fd, (off_t)offset) == MAP_FAILED) {
        free(m);
        status = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        m->base = (uintptr_t)ptr;
        m->size = size;
        m->next = mappings;
        mappings = m;
    }
    fake__unlock();
    return status;
}

/* The mappings that cover [base, base + size) exactly (whole mappings, no gap); 0 if they do not. */
static int covered(uintptr_t base, size_t size)
{
    size_t sum = 0;
    for (struct vmm_range *m = mappings; m; m = m->next) {
        if (m->base >= base && m->base - base < size) {
            if (m->size > size - (m->base - base))
                return 0;
            sum += m->size;
        } else if (m->base < base && m->base + m->size > base) {
            return 0;
        }
    }
    return sum == size;
}

FAKE_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count)
{
    FAKE_ENTER("cuMemSetAccess", return fake_fault_);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    if (desc == NULL || count == 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int prot = -1;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != 1 || desc[i].location.id < 0 || desc[i].location.id >= fake__device_count())
            return CUDA_ERROR_INVALID_DEVICE;
        int p = desc[i].flags == 3 ? PROT_READ | PROT_WRITE : desc[i].flags == 1 ? PROT_READ :
                desc[i].flags == 0 ? PROT_NONE : -1;
        if (p < 0)
            return CUDA_ERROR_INVALID_VALUE;
        prot = p > prot ? p : prot; /* one address space here: the widest access of any device */
    }
    CUresult status = CUDA_SUCCESS;
    fake__lock();
    if (!covered((uintptr_t)ptr, size)) {
        fake__misuse("cuMemSetAccess: 0x%lx + %zu is not wholly mapped", (unsigned long)ptr, size);
        status = CUDA_ERROR_INVALID_VALUE;
    } else {
        for (struct vmm_range *m = mappings; m; m = m->next) {
            if (m->base < (uintptr_t)ptr || m->base - (uintptr_t)ptr >= size)
                continue;
            mprotect((void *)m->base, m->size, prot);
            if (prot != PROT_NONE && m->accessible == NULL)
                m->accessible = track((unsigned char *)m->base, m->size, KIND_VMM, desc[0].location.id, -1);
            else if (prot == PROT_NONE && m->accessible != NULL) {
                untrack(m->accessible);
                m->accessible = NULL;
            }
        }
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    FAKE_ENTER("cuMemUnmap", return fake_fault_);
    if (!ready())
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult status = CUDA_SUCCESS;
    fake__lock();
    if (size == 0 || !covered((uintptr_t)ptr, size)) {
        fake__misuse("cuMemUnmap: 0x%lx + %zu is not wholly mapped", (unsigned long)ptr, size);
        status = CUDA_ERROR_INVALID_VALUE;
    } else {
        struct vmm_range *m = mappings, *next;
        for (; m; m = next) {
            next = m->next;
            if (m->base < (uintptr_t)ptr || m->base - (uintptr_t)ptr >= size)
                continue;
            /* Back to reserved address space: nobody else may map there meanwhile. */
            mmap((void *)m->base, m->size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
            if (m->accessible)
                untrack(m->accessible);
            range_unlink(&mappings, m);
        }
    }
    fake__unlock();
    return status;
}

/* ---- EGLStream endpoints (the model is in fake_egl.c) ------------------------------------- */
struct plane_spec {
    unsigned int x_div, y_div, channels, pitch_div;
};

struct format_spec {
    int format;
    int planes;
    struct plane_spec plane[3];
};

/* The formats eglcuda presents, from cudaEGL.h's CUeglColorFormat (0x52: CU_EGL_COLOR_FORMAT_Y). */
static const struct format_spec formats[] = {
    {0x06, 1, {{1, 1, 4, 1}}},                                /* ARGB */
    {0x07, 1, {{1, 1, 4, 1}}},                                /* RGBA */
    {0x0E, 1, {{1, 1, 4, 1}}},                                /* ABGR */
    {0x0F, 1, {{1, 1, 4, 1}}},                                /* BGRA */
    {0x10, 1, {{1, 1, 1, 1}}},                                /* A */
    {0x52, 1, {{1, 1, 1, 1}}},                                /* Y */
    {0x00, 3, {{1, 1, 1, 1}, {2, 2, 1, 2}, {2, 2, 1, 2}}},    /* YUV420 planar */
    {0x01, 2, {{1, 1, 1, 1}, {2, 2, 2, 1}}},                  /* YUV420 semi-planar (NV12) */
    {0x15, 2, {{1, 1, 1, 1}, {2, 2, 2, 1}}},                  /* YVU420 semi-planar */
    {0x0A, 3, {{1, 1, 1, 1}, {1, 1, 1, 1}, {1, 1, 1, 1}}},    /* YUV444 planar */
};

static const struct format_spec *format_of(int format)
{
    for (size_t i = 0; i < sizeof(formats) / sizeof(formats[0]); i++)
        if (formats[i].format == format)
            return &formats[i];
    return NULL;
}

/* Whether a presented frame is one the driver can take for this connection; lock held. */
static CUresult check_frame(const CUeglFrame *f, const struct fake_conn *conn)
{
    const struct format_spec *spec = format_of(f->eglColorFormat);
    int device = ((struct fake_ctx *)conn->context)->device;
    if ((int)f->width != conn->width || (int)f->height != conn->height) {
        fake__misuse("present: a %ux%u frame on a %dx%d connection", f->width, f->height, conn->width, conn->height);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (spec == NULL || (int)f->planeCount != spec->planes || f->numChannels != spec->plane[0].channels ||
        f->depth > 1 || f->cuFormat != 0x01 || (f->frameType != CU_EGL_FRAME_TYPE_PITCH &&
                                                f->frameType != CU_EGL_FRAME_TYPE_ARRAY)) {
        fake__misuse("present: frame type %d, format 0x%x, %u planes, %u channels, depth %u, cuFormat %d: not a "
                     "frame this driver takes", f->frameType, f->eglColorFormat, f->planeCount, f->numChannels,
                     f->depth, f->cuFormat);
        return CUDA_ERROR_INVALID_VALUE;
    }
    for (int i = 0; i < spec->planes; i++) {
        const struct plane_spec *p = &spec->plane[i];
        size_t width = (f->width + p->x_div - 1) / p->x_div, height = (f->height + p->y_div - 1) / p->y_div;
        if (f->frameType == CU_EGL_FRAME_TYPE_ARRAY) {
            struct fake_array *a = array_of(f->frame.pArray[i]);
            if (a == NULL || a->width < width || a->height < height || a->channels != p->channels ||
                a->device != device) {
                fake__misuse("present: plane %d: %p is not a live %zux%zu array of %u channels on device %d", i,
                             (void *)f->frame.pArray[i], width, height, p->channels, device);
                return CUDA_ERROR_INVALID_VALUE;
            }
            continue;
        }
        if (f->pitch < width * p->channels * p->pitch_div || f->pitch % p->pitch_div) {
            fake__misuse("present: pitch %u is too small for plane %d", f->pitch, i);
            return CUDA_ERROR_INVALID_VALUE;
        }
        /* The driver reads each plane as rows of the frame's pitch (measured; see eglcuda's
         * frames.formats.driver_extents). */
        size_t extent = (size_t)f->pitch * height;
        struct alloc *a = find_range((uintptr_t)f->frame.pPitch[i], extent, NULL);
        if (a == NULL || (a->kind != KIND_HOST && a->device != device)) {
            fake__misuse("present: plane %d at %p: %zu bytes are not inside one live allocation of device %d", i,
                         f->frame.pPitch[i], extent, device);
            return CUDA_ERROR_INVALID_VALUE;
        }
        if (a->kind == KIND_MANAGED) {
            /* NVIDIA's driver crashes on it (eglcuda measured SIGSEGV); eglcuda must refuse first. */
            fake__misuse("present: plane %d is managed memory (the real driver crashes)", i);
            return CUDA_ERROR_NOT_SUPPORTED;
        }
    }
    return CUDA_SUCCESS;
}

/* Common checks of an endpoint call: context, connection (of the right side), CUDA stream. On
 * success the lock is held and *out is the connection. */
static CUresult enter_endpoint(const char *call, CUeglStreamConnection *pconn, int producer, CUstream *pstream,
                               struct fake_conn **out)
{
    CUresult status = need_context(call);
    if (status)
        return status;
    if (pconn == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    fake__lock();
    struct fake_conn *conn = fake__conn_lookup(*pconn);
    if (conn == NULL || conn->producer != producer) {
        fake__unlock();
        fake__misuse("%s: %p is not a connected %s", call, (void *)*pconn, producer ? "producer" : "consumer");
        return CUDA_ERROR_INVALID_HANDLE;
    }
    if (conn->context != (void *)current) {
        fake__unlock();
        fake__misuse("%s: the current context is not the one the endpoint connected from", call);
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    if (pstream != NULL && !stream_ok(*pstream)) {
        fake__unlock();
        fake__misuse("%s: %p is not a live CUDA stream", call, (void *)*pstream);
        return CUDA_ERROR_INVALID_HANDLE;
    }
    *out = conn;
    return CUDA_SUCCESS;
}

static CUresult connect_endpoint(const char *call, CUeglStreamConnection *pconn, void *egl_stream, int producer,
                        int width, int height)
{
    CUresult status = need_context(call);
    if (status)
        return status;
    if (pconn == NULL || (producer && (width <= 0 || height <= 0)))
        return CUDA_ERROR_INVALID_VALUE;
    fake__lock();
    struct fake_stream *s = fake__stream_from_handle(egl_stream);
    struct fake_conn *conn = NULL;
    int state = s ? fake__stream_state(s) : 0;
    if (s == NULL) {
        fake__misuse("%s: %p is not a live EGLStream", call, egl_stream);
        status = CUDA_ERROR_INVALID_HANDLE;
    } else if (state != (producer ? EGL_STREAM_STATE_CONNECTING_KHR : EGL_STREAM_STATE_CREATED_KHR)) {
        status = CUDA_ERROR_UNKNOWN; /* the consumer connects first, each side once */
    } else if ((conn = fake__conn_new(s, producer, current)) == NULL) {
        status = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        conn->width = width;
        conn->height = height;
        *pconn = (CUeglStreamConnection)conn;
        fake__wake_all();
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuEGLStreamConsumerConnect(CUeglStreamConnection *conn, void *stream)
{
    FAKE_ENTER("cuEGLStreamConsumerConnect", return fake_fault_);
    return connect_endpoint("cuEGLStreamConsumerConnect", conn, stream, 0, 0, 0);
}

FAKE_EXPORT CUresult cuEGLStreamConsumerConnectWithFlags(CUeglStreamConnection *conn, void *stream,
                                                         unsigned int flags)
{
    FAKE_ENTER("cuEGLStreamConsumerConnectWithFlags", return fake_fault_);
    if (flags > 1)
        return CUDA_ERROR_INVALID_VALUE;
    return connect_endpoint("cuEGLStreamConsumerConnectWithFlags", conn, stream, 0, 0, 0);
}

FAKE_EXPORT CUresult cuEGLStreamProducerConnect(CUeglStreamConnection *conn, void *stream, EGLint width,
                                                EGLint height)
{
    FAKE_ENTER("cuEGLStreamProducerConnect", return fake_fault_);
    return connect_endpoint("cuEGLStreamProducerConnect", conn, stream, 1, width, height);
}

static CUresult disconnect(const char *call, CUeglStreamConnection *pconn, int producer)
{
    if (pconn == NULL)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult status = CUDA_SUCCESS;
    fake__lock();
    struct fake_conn *conn = fake__conn_lookup(*pconn);
    if (conn == NULL || conn->producer != producer) {
        fake__misuse("%s: %p is not a connected %s", call, (void *)*pconn, producer ? "producer" : "consumer");
        status = CUDA_ERROR_INVALID_HANDLE;
    } else {
        fake__conn_free(conn);
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuEGLStreamConsumerDisconnect(CUeglStreamConnection *conn)
{
    FAKE_ENTER("cuEGLStreamConsumerDisconnect", return fake_fault_);
    return disconnect("cuEGLStreamConsumerDisconnect", conn, 0);
}

FAKE_EXPORT CUresult cuEGLStreamProducerDisconnect(CUeglStreamConnection *conn)
{
    FAKE_ENTER("cuEGLStreamProducerDisconnect", return fake_fault_);
    if (print_stats && conn != NULL) {
        fake__lock();
        struct fake_conn *c = fake__conn_lookup(*conn);
        if (c && c->producer)
            fprintf(stderr, "stream %d: presents=%ld returns=%ld waited=%ld missed=%ld\n", c->stream->id,
                    c->stream->presents, c->stream->returns, c->stream->returns_waited, c->stream->returns_missed);
        fake__unlock();
    }
    return disconnect("cuEGLStreamProducerDisconnect", conn, 1);
}

static int pending_count(struct fake_stream *s)
{
    int n = 0;
    for (struct fake_frame *f = s->frames; f; f = f->next)
        n += f->status == FRAME_PENDING;
    return n;
}

FAKE_EXPORT CUresult cuEGLStreamProducerPresentFrame(CUeglStreamConnection *pconn, CUeglFrame frame,
                                                     CUstream *pstream)
{
    FAKE_ENTER("cuEGLStreamProducerPresentFrame", return fake_fault_);
    struct fake_conn *conn;
    CUresult status = enter_endpoint("cuEGLStreamProducerPresentFrame", pconn, 1, pstream, &conn);
    if (status)
        return status;
    struct fake_stream *s = conn->stream;
    int frames = 0;
    if (s->disconnected) {
        status = CUDA_ERROR_UNKNOWN;
        goto out;
    }
    if ((status = check_frame(&frame, conn)) != CUDA_SUCCESS)
        goto out;
    for (struct fake_frame *f = s->frames; f; f = f->next) {
        frames++;
        if (f->desc.frame.pPitch[0] == frame.frame.pPitch[0] && f->status != FRAME_RETURNABLE) {
            fake__misuse("present: the frame at %p is still in the stream", frame.frame.pPitch[0]);
            status = CUDA_ERROR_INVALID_VALUE;
            goto out;
        }
    }
    if (frames >= MAX_FRAMES_IN_STREAM) {
        fake__misuse("present: %d frames are already in the stream (at most %d)", frames, MAX_FRAMES_IN_STREAM);
        status = CUDA_ERROR_INVALID_VALUE;
        goto out;
    }
    if (s->fifo_length > 0) {
        long long deadline = fake__now_ns() + fifo_wait_ns;
        while (pending_count(s) >= s->fifo_length) {
            if (s->disconnected) {
                status = CUDA_ERROR_UNKNOWN;
                goto out;
            }
            if (fake__now_ns() >= deadline) {
                status = CUDA_ERROR_TIMEOUT; /* the real driver would go on waiting */
                goto out;
            }
            fake__wait_until(deadline);
            if (fake__conn_lookup(conn) != conn) { /* disconnected meanwhile */
                status = CUDA_ERROR_UNKNOWN;
                fake__unlock();
                return status;
            }
        }
    }
    struct fake_frame *entry = fake__frame_new();
    if (entry == NULL) {
        status = CUDA_ERROR_OUT_OF_MEMORY;
        goto out;
    }
    entry->magic = FAKE_MAGIC_FRAME;
    entry->stream = s;
    entry->desc = frame;
    entry->number = ++s->producer_frame;
    entry->status = FRAME_PENDING;
    struct fake_frame **tail = &s->frames;
    for (struct fake_frame *f = s->frames; f; f = f->next) {
        if (f->status == FRAME_LATCHED || (f->status == FRAME_PENDING && s->fifo_length == 0))
            f->status = FRAME_RETURNABLE; /* no longer the newest; mailbox: dropped */
        tail = &f->next;
    }
    *tail = entry;
    s->presents++;
    fake__wake_all();
out:
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuEGLStreamProducerReturnFrame(CUeglStreamConnection *pconn, CUeglFrame *out,
                                                    CUstream *pstream)
{
    FAKE_ENTER("cuEGLStreamProducerReturnFrame", return fake_fault_);
    struct fake_conn *conn;
    if (out == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult status = enter_endpoint("cuEGLStreamProducerReturnFrame", pconn, 1, pstream, &conn);
    if (status)
        return status;
    long long deadline = fake__now_ns() + return_wait_ns;
    struct fake_stream *s = conn->stream;
    for (int waited_here = 0;; waited_here = 1) {
        struct fake_frame *f = s->frames;
        while (f && f->status != FRAME_RETURNABLE)
            f = f->next;
        if (f) {
            *out = f->desc;
            fake__frame_unlink(f);
            s->returns++;
            break;
        }
        if (!waited_here)
            s->returns_waited++;
        if (fake__now_ns() >= deadline) {
            s->returns_missed++;
            status = CUDA_ERROR_LAUNCH_TIMEOUT;
            break;
        }
        fake__wait_until(deadline);
        if (fake__conn_lookup(conn) != conn) {
            status = CUDA_ERROR_LAUNCH_TIMEOUT;
            break;
        }
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuEGLStreamConsumerAcquireFrame(CUeglStreamConnection *pconn, CUgraphicsResource *resource,
                                                     CUstream *pstream, unsigned int timeout_us)
{
    FAKE_ENTER("cuEGLStreamConsumerAcquireFrame", return fake_fault_);
    struct fake_conn *conn;
    if (resource == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult status = enter_endpoint("cuEGLStreamConsumerAcquireFrame", pconn, 0, pstream, &conn);
    if (status)
        return status;
    struct fake_stream *s = conn->stream;
    if (s->id == fail_stream && s->acquires == fail_at) { /* FAKE_FAIL_STREAM, FAKE_FAIL_AT */
        fake__unlock();
        return CUDA_ERROR_UNKNOWN;
    }
    long long deadline = timeout_us == 0xFFFFFFFFu ? -1 : fake__now_ns() + (long long)timeout_us * 1000;
    struct fake_frame *got = NULL;
    for (;;) {
        for (struct fake_frame *f = s->frames; f && !got; f = f->next)
            if (f->status == FRAME_PENDING)
                got = f; /* FIFO: the oldest; mailbox: the only one */
        if (got) {
            for (struct fake_frame *f = s->frames; f != got; f = f->next)
                if (f->status == FRAME_LATCHED)
                    f->status = FRAME_RETURNABLE;
            got->status = FRAME_HELD;
            s->consumer_frame = got->number;
            break;
        }
        if (s->disconnected || (deadline >= 0 && fake__now_ns() >= deadline))
            break;
        if (deadline < 0)
            fake__wait_until(fake__now_ns() + 100000000ll);
        else
            fake__wait_until(deadline);
        if (fake__conn_lookup(conn) != conn) {
            fake__unlock();
            return CUDA_ERROR_UNKNOWN;
        }
    }
    if (got == NULL && s->reuse) {
        /* Nothing new: the stream hands the newest frame out again if the consumer released it. */
        struct fake_frame *newest = s->frames;
        while (newest && newest->next)
            newest = newest->next;
        if (newest && newest->status == FRAME_LATCHED) {
            newest->status = FRAME_HELD;
            got = newest;
        }
    }
    if (got) {
        *resource = (CUgraphicsResource)got;
        s->acquires++;
        fake__wake_all();
    } else {
        status = s->disconnected ? CUDA_ERROR_UNKNOWN : CUDA_ERROR_LAUNCH_TIMEOUT;
    }
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuEGLStreamConsumerReleaseFrame(CUeglStreamConnection *pconn, CUgraphicsResource resource,
                                                     CUstream *pstream)
{
    FAKE_ENTER("cuEGLStreamConsumerReleaseFrame", return fake_fault_);
    struct fake_conn *conn;
    CUresult status = enter_endpoint("cuEGLStreamConsumerReleaseFrame", pconn, 0, pstream, &conn);
    if (status)
        return status;
    struct fake_frame *f = fake__frame_lookup(resource);
    if (f == NULL || f->stream != conn->stream || f->status != FRAME_HELD) {
        fake__misuse("cuEGLStreamConsumerReleaseFrame: %p is not a frame this consumer holds", (void *)resource);
        status = CUDA_ERROR_INVALID_HANDLE;
    } else if (f->next == NULL && conn->stream->reuse) {
        f->status = FRAME_LATCHED; /* the newest: kept for the consumer */
    } else if (conn->stream->producer == NULL) {
        fake__frame_unlink(f); /* nobody to give it back to */
    } else {
        f->status = FRAME_RETURNABLE;
    }
    fake__wake_all();
    fake__unlock();
    return status;
}

FAKE_EXPORT CUresult cuGraphicsResourceGetMappedEglFrame(CUeglFrame *out, CUgraphicsResource resource,
                                                         unsigned int index, unsigned int mip)
{
    FAKE_ENTER("cuGraphicsResourceGetMappedEglFrame", return fake_fault_);
    CUresult status = need_context("cuGraphicsResourceGetMappedEglFrame");
    if (status)
        return status;
    if (out == NULL || index != 0 || mip != 0)
        return CUDA_ERROR_INVALID_VALUE;
    fake__lock();
    struct fake_frame *f = fake__frame_lookup(resource);
    if (f == NULL || f->status != FRAME_HELD) {
        fake__misuse("cuGraphicsResourceGetMappedEglFrame: %p is not an acquired frame", (void *)resource);
        status = CUDA_ERROR_INVALID_HANDLE;
    } else {
        *out = f->desc;
        if (out->eglColorFormat == CU_EGL_COLOR_FORMAT_YUV420_SEMIPLANAR)
            out->eglColorFormat = CU_EGL_COLOR_FORMAT_YVU420_SEMIPLANAR; /* as driver 580 labels NV12 */
    }
    fake__unlock();
    return status;
}

/* ---- counts for the tests ------------------------------------------------------------------ */
FAKE_EXPORT long fake_cuda_count(const char *what)
{
    long n = 0;
    fake__lock();
    if (strcmp(what, "device_allocations") == 0 || strcmp(what, "host_allocations") == 0 ||
        strcmp(what, "managed_allocations") == 0) {
        int kind = what[0] == 'd' ? KIND_DEVICE : what[0] == 'h' ? KIND_HOST : KIND_MANAGED;
        for (struct alloc *a = allocations; a; a = a->next)
            n += a->kind == kind;
    } else if (strcmp(what, "arrays") == 0) {
        for (struct fake_array *a = arrays; a; a = a->next)
            n++;
    } else if (strcmp(what, "cuda_streams") == 0) {
        for (struct fake_cu_stream *s = cu_streams; s; s = s->next)
            n++;
    } else if (strcmp(what, "events") == 0) {
        for (struct fake_event *e = events; e; e = e->next)
            n++;
    } else if (strcmp(what, "retained") == 0) {
        for (int i = 0; i < MAX_DEVICES; i++)
            n += contexts[i].retained;
    } else if (strcmp(what, "vmm_handles") == 0) {
        for (struct vmm_handle *h = vmm_handles; h; h = h->next)
            n++;
    } else if (strcmp(what, "vmm_reservations") == 0) {
        for (struct vmm_range *r = reservations; r; r = r->next)
            n++;
    } else if (strcmp(what, "vmm_mappings") == 0) {
        for (struct vmm_range *m = mappings; m; m = m->next)
            n++;
    } else if (strcmp(what, "imported") == 0) {
        for (struct alloc *a = allocations; a; a = a->next)
            n += a->kind == KIND_IMPORTED;
    } else if (strcmp(what, "used_bytes") == 0) {
        for (int i = 0; i < MAX_DEVICES; i++)
            n += (long)used_bytes[i];
    } else {
        n = -1;
    }
    fake__unlock();
    return n;
}

/* Every allocation eglcuda could leak: device, pinned and managed memory, arrays, memory opened
 * from IPC handles, VMM handles, reservations and accessible mappings. */
FAKE_EXPORT long fake_live_allocations(void)
{
    long n = 0;
    fake__lock();
    for (struct alloc *a = allocations; a; a = a->next)
        n += a->kind != KIND_FOREIGN;
    for (struct fake_array *a = arrays; a; a = a->next)
        n++;
    for (struct vmm_handle *h = vmm_handles; h; h = h->next)
        n++;
    for (struct vmm_range *r = reservations; r; r = r->next)
        n++;
    fake__unlock();
    return n;
}
