/* What the two fake libraries share: the types they pass (written from the EGL and CUDA driver
 * API references, NOT from eglcuda's csrc/ declarations, so an ABI mistake there shows up as a
 * failure here instead of being copied), the one lock and wake-up, call counting and fault
 * injection, and the EGLStream model.
 *
 * libfake_egl.so owns all of it; libfake_cuda.so links against it (DT_NEEDED, rpath $ORIGIN), so a
 * process that dlopens both, in either order, has one instance of this state.
 *
 * Nothing here is a real GPU: "device memory" is host memory. See fake_egl.c for the model. */
#ifndef FAKE_COMMON_H
#define FAKE_COMMON_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define FAKE_EXPORT __attribute__((visibility("default")))

/* ---- EGL types and tokens (EGL 1.5, EGL_KHR_stream and companions) ------------------------- */
typedef int32_t EGLint;
typedef unsigned int EGLBoolean;
typedef unsigned int EGLenum;
typedef intptr_t EGLAttrib;
typedef uint64_t EGLuint64KHR;
typedef uint64_t EGLTimeKHR;
typedef void *EGLDisplay;
typedef void *EGLConfig;
typedef void *EGLContext;
typedef void *EGLSurface;
typedef void *EGLDeviceEXT;
typedef void *EGLStreamKHR;
typedef void *EGLSync;
typedef int EGLNativeFileDescriptorKHR;

#define EGL_FALSE 0
#define EGL_TRUE 1
#define EGL_NONE 0x3038
#define EGL_SUCCESS 0x3000
#define EGL_NOT_INITIALIZED 0x3001
#define EGL_BAD_ACCESS 0x3002
#define EGL_BAD_ALLOC 0x3003
#define EGL_BAD_ATTRIBUTE 0x3004
#define EGL_BAD_CONFIG 0x3005
#define EGL_BAD_CONTEXT 0x3006
#define EGL_BAD_DISPLAY 0x3008
#define EGL_BAD_MATCH 0x3009
#define EGL_BAD_PARAMETER 0x300C
#define EGL_BAD_SURFACE 0x300D
#define EGL_BAD_DEVICE_EXT 0x322B
#define EGL_BAD_STREAM_KHR 0x321B
#define EGL_BAD_STATE_KHR 0x321C
#define EGL_VENDOR 0x3053
#define EGL_VERSION 0x3054
#define EGL_EXTENSIONS 0x3055
#define EGL_CLIENT_APIS 0x308D
#define EGL_OPENGL_ES_API 0x30A0
#define EGL_OPENGL_API 0x30A2
#define EGL_PLATFORM_DEVICE_EXT 0x313F
#define EGL_DEVICE_EXT 0x322C
#define EGL_CUDA_DEVICE_NV 0x323A
#define EGL_CONSUMER_LATENCY_USEC_KHR 0x3210
#define EGL_PRODUCER_FRAME_KHR 0x3212
#define EGL_CONSUMER_FRAME_KHR 0x3213
#define EGL_STREAM_STATE_KHR 0x3214
#define EGL_STREAM_STATE_CREATED_KHR 0x3215
#define EGL_STREAM_STATE_CONNECTING_KHR 0x3216
#define EGL_STREAM_STATE_EMPTY_KHR 0x3217
#define EGL_STREAM_STATE_NEW_FRAME_AVAILABLE_KHR 0x3218
#define EGL_STREAM_STATE_OLD_FRAME_AVAILABLE_KHR 0x3219
#define EGL_STREAM_STATE_DISCONNECTED_KHR 0x321A
#define EGL_CONSUMER_ACQUIRE_TIMEOUT_USEC_KHR 0x321E
#define EGL_STREAM_FIFO_LENGTH_KHR 0x31FC
#define EGL_STREAM_TIME_NOW_KHR 0x31FD
#define EGL_STREAM_TIME_CONSUMER_KHR 0x31FE
#define EGL_STREAM_TIME_PRODUCER_KHR 0x31FF
#define EGL_SUPPORT_RESET_NV 0x3334
#define EGL_SUPPORT_REUSE_NV 0x3335

/* ---- CUDA driver types (cuda.h, cudaEGL.h) ------------------------------------------------ */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUarray_st *CUarray;
typedef struct CUgraphicsResource_st *CUgraphicsResource;
typedef struct CUeglStreamConnection_st *CUeglStreamConnection;

typedef struct {
    union {
        CUarray pArray[3];
        void *pPitch[3];
    } frame;
    unsigned int width;
    unsigned int height;
    unsigned int depth;
    unsigned int pitch;
    unsigned int planeCount;
    unsigned int numChannels;
    int frameType;      /* CUeglFrameType: 0 array, 1 pitch */
    int eglColorFormat; /* CUeglColorFormat */
    int cuFormat;       /* CUarray_format */
} CUeglFrame;

typedef struct {
    size_t Width;
    size_t Height;
    int Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct {
    size_t srcXInBytes;
    size_t srcY;
    int srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    size_t srcPitch;
    size_t dstXInBytes;
    size_t dstY;
    int dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    size_t dstPitch;
    size_t WidthInBytes;
    size_t Height;
} CUDA_MEMCPY2D;

/* CUDA IPC (cuda.h: CU_IPC_HANDLE_SIZE 64) and device UUIDs. */
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef struct { char reserved[64]; } CUipcEventHandle;
typedef struct { char bytes[16]; } CUuuid;

/* Virtual memory management (cuda.h, CUDA 10.2 and later). The enums are 4 bytes. */
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct {
    int type; /* CUmemLocationType: 1 device */
    int id;
} CUmemLocation;
typedef struct {
    int type;                 /* CUmemAllocationType: 1 pinned */
    int requestedHandleTypes; /* CUmemAllocationHandleType: 1 POSIX file descriptor */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct {
    CUmemLocation location;
    int flags; /* CUmemAccess_flags: 0 none, 1 read, 3 read/write */
} CUmemAccessDesc;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_INVALID_DEVICE 101
#define CUDA_ERROR_INVALID_CONTEXT 201
#define CUDA_ERROR_ALREADY_MAPPED 208
#define CUDA_ERROR_INVALID_HANDLE 400
#define CUDA_ERROR_ILLEGAL_STATE 401
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_ILLEGAL_ADDRESS 700
#define CUDA_ERROR_LAUNCH_TIMEOUT 702
#define CUDA_ERROR_CONTEXT_IS_DESTROYED 709
#define CUDA_ERROR_NOT_SUPPORTED 801
#define CUDA_ERROR_TIMEOUT 909
#define CUDA_ERROR_UNKNOWN 999

#define CU_EGL_FRAME_TYPE_ARRAY 0
#define CU_EGL_FRAME_TYPE_PITCH 1
#define CU_EGL_COLOR_FORMAT_YUV420_SEMIPLANAR 0x01
#define CU_EGL_COLOR_FORMAT_YVU420_SEMIPLANAR 0x15

_Static_assert(sizeof(CUeglFrame) == 64, "CUeglFrame is 64 bytes on LP64");
_Static_assert(sizeof(CUDA_MEMCPY2D) == 128, "CUDA_MEMCPY2D is 128 bytes on LP64");
_Static_assert(sizeof(CUmemAllocationProp) == 32, "CUmemAllocationProp is 32 bytes on LP64");
_Static_assert(offsetof(CUmemAllocationProp, allocFlags) == 24, "allocFlags follows the metadata pointer");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc is 12 bytes");

/* ---- the EGLStream model (see fake_egl.c for the rules) ------------------------------------- */
enum fake_frame_status {
    FRAME_PENDING,    /* presented, not latched by the consumer yet */
    FRAME_HELD,       /* acquired by the consumer, not released */
    FRAME_LATCHED,    /* released, still the stream's newest frame: re-acquirable (reuse on) */
    FRAME_RETURNABLE, /* the producer may take it back (ReturnFrame) */
    FRAME_LOST        /* the consumer went away with it: it never comes back */
};

struct fake_conn;

struct fake_frame {
    unsigned int magic;
    struct fake_stream *stream;
    struct fake_frame *next; /* present order */
    CUeglFrame desc;         /* as the producer presented it */
    uint64_t number;         /* the stream's frame number (EGL_PRODUCER_FRAME_KHR after its present) */
    int status;              /* enum fake_frame_status */
};

struct fake_stream {
    unsigned int magic;
    struct fake_stream *next_stream; /* every live stream */
    int handles;                     /* live EGLStreamKHR handles on it */
    int fifo_length;                 /* 0: mailbox */
    int latency_us;
    int reuse;                       /* EGL_SUPPORT_REUSE_NV */
    int disconnected;                /* sticky */
    int fd_exported;
    dev_t fd_dev;
    ino_t fd_ino;
    uint64_t producer_frame;         /* frames inserted (the newest frame's number) */
    uint64_t consumer_frame;         /* the number of the frame latched last */
    struct fake_conn *consumer, *producer;
    struct fake_frame *frames;       /* not yet returned, in present order */
    int id;                          /* streams are numbered from 0 in creation order (FAKE_FAIL_STREAM) */
    long presents, acquires, returns, returns_waited, returns_missed; /* FAKE_STATS */
};

struct fake_conn {
    unsigned int magic;
    struct fake_conn *next_conn;
    struct fake_stream *stream;
    int producer;       /* 1 producer, 0 consumer */
    void *context;      /* the CUDA context it connected from */
    int width, height;  /* producer: the connection's frame size */
};

#define FAKE_MAGIC_STREAM 0x5354524Du
#define FAKE_MAGIC_FRAME 0x46524D45u
#define FAKE_MAGIC_CONN 0x434F4E4Eu

/* ---- services libfake_egl.so gives libfake_cuda.so (not part of any real API) -------------- */
FAKE_EXPORT void fake__lock(void);
FAKE_EXPORT void fake__unlock(void);
/* Wait (lock held) until woken or deadline_ns (CLOCK_MONOTONIC) passes; 0 when woken. */
FAKE_EXPORT int fake__wait_until(long long deadline_ns);
FAKE_EXPORT void fake__wake_all(void);
FAKE_EXPORT long long fake__now_ns(void);
/* Count one call of `name` (slot cached by the caller) and answer the injected fault: 0 for
 * none, else the code this call must fail with. */
FAKE_EXPORT int fake__slot(const char *name);
FAKE_EXPORT int fake__enter(int slot);
/* Note a misuse the real driver would refuse or crash on (bad handle, double free, access out
 * of bounds): counted and kept for the tests to read, and traced with FAKE_TRACE=1. */
FAKE_EXPORT void fake__misuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
FAKE_EXPORT void fake__trace(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Stream model, lock held. */
FAKE_EXPORT struct fake_stream *fake__stream_from_handle(void *handle);
FAKE_EXPORT int fake__stream_state(struct fake_stream *stream);
FAKE_EXPORT struct fake_conn *fake__conn_new(struct fake_stream *stream, int producer, void *context);
FAKE_EXPORT struct fake_conn *fake__conn_lookup(void *conn);
FAKE_EXPORT void fake__conn_free(struct fake_conn *conn);
FAKE_EXPORT struct fake_frame *fake__frame_lookup(void *resource);
FAKE_EXPORT struct fake_frame *fake__frame_new(void); /* zeroed; fake__frame_unlink frees it */
FAKE_EXPORT void fake__frame_unlink(struct fake_frame *frame);
FAKE_EXPORT int fake__device_count(void);
/* Device memory the model shares between processes (fake_egl_shared.c: a region mapped before
 * fork, at the same address in every process), or NULL: the fake libcuda then makes its own
 * (fake_egl.c). fake__shared_contains says whether a range lies in memory shared that way, which
 * another process may have allocated. */
FAKE_EXPORT void *fake__shared_alloc(size_t size);
FAKE_EXPORT int fake__shared_contains(uintptr_t address, size_t length);

/* The per-call preamble: count the call, and return the injected fault if one is armed. */
#define FAKE_ENTER(name, on_fault)                  \
    static int fake_slot_ = -1;                     \
    if (fake_slot_ < 0)                             \
        fake_slot_ = fake__slot(name);              \
    int fake_fault_ = fake__enter(fake_slot_);      \
    if (fake_fault_) {                              \
        fake__trace("%s: injected fault %d", name, fake_fault_); \
        on_fault;                                   \
    }

#endif
