/* The CUDA driver API: its EGL interop (cudaEGL.h) and the few plain driver calls eglcuda needs
 * (init, devices, primary context, memory, streams, events, copies).
 * Written from the CUDA driver API reference; no CUDA header is included. Same sections as
 * egl_core.h. "@symbol" names the exported ABI name where cuda.h maps a call to a versioned
 * symbol (cuMemAlloc -> cuMemAlloc_v2); functions are looked up with dlsym in libcuda and a
 * missing one is reported as unsupported, never fatal. */

/* ---- types ---------------------------------------------------------------------------- */
/* Deviation: CUresult and the enums below are plain ints/enums with only the values we use
 * spelled out; their size (4 bytes) is what the ABI fixes. */
typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long cuuint64_t;
typedef unsigned int cuuint32_t;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUarray_st *CUarray;
typedef struct CUgraphicsResource_st *CUgraphicsResource;
typedef struct CUeglStreamConnection_st *CUeglStreamConnection;
typedef void (*CUhostFn)(void *userData);

typedef enum CUeglFrameType_enum {
    CU_EGL_FRAME_TYPE_ARRAY = 0,
    CU_EGL_FRAME_TYPE_PITCH = 1
} CUeglFrameType;

typedef enum CUeglResourceLocationFlags_enum {
    CU_EGL_RESOURCE_LOCATION_SYSMEM = 0,
    CU_EGL_RESOURCE_LOCATION_VIDMEM = 1
} CUeglResourceLocationFlags;

/* Deviation: cudaEGL.h lists over a hundred formats; we declare those eglcuda allocates. */
typedef enum CUeglColorFormat_enum {
    CU_EGL_COLOR_FORMAT_YUV420_PLANAR = 0x00,
    CU_EGL_COLOR_FORMAT_YUV420_SEMIPLANAR = 0x01,
    CU_EGL_COLOR_FORMAT_YUV422_PLANAR = 0x02,
    CU_EGL_COLOR_FORMAT_YUV422_SEMIPLANAR = 0x03,
    CU_EGL_COLOR_FORMAT_ARGB = 0x06,
    CU_EGL_COLOR_FORMAT_RGBA = 0x07,
    CU_EGL_COLOR_FORMAT_L = 0x08,
    CU_EGL_COLOR_FORMAT_R = 0x09,
    CU_EGL_COLOR_FORMAT_YUV444_PLANAR = 0x0A,
    CU_EGL_COLOR_FORMAT_YUV444_SEMIPLANAR = 0x0B,
    CU_EGL_COLOR_FORMAT_ABGR = 0x0E,
    CU_EGL_COLOR_FORMAT_BGRA = 0x0F,
    CU_EGL_COLOR_FORMAT_A = 0x10
} CUeglColorFormat;

typedef enum CUarray_format_enum {
    CU_AD_FORMAT_UNSIGNED_INT8 = 0x01,
    CU_AD_FORMAT_UNSIGNED_INT16 = 0x02,
    CU_AD_FORMAT_UNSIGNED_INT32 = 0x03,
    CU_AD_FORMAT_SIGNED_INT8 = 0x08,
    CU_AD_FORMAT_HALF = 0x10,
    CU_AD_FORMAT_FLOAT = 0x20
} CUarray_format;

typedef enum CUmemorytype_enum {
    CU_MEMORYTYPE_HOST = 0x01,
    CU_MEMORYTYPE_DEVICE = 0x02,
    CU_MEMORYTYPE_ARRAY = 0x03,
    CU_MEMORYTYPE_UNIFIED = 0x04
} CUmemorytype;

#define CU_EGL_FRAME_MAX_PLANES 3
#define CUDA_EGL_INFINITE_TIMEOUT 0xFFFFFFFF

/* A frame as the driver sees it: one width/height/pitch (of plane 0); the geometry of the other
 * planes follows from the color format. 64 bytes on LP64. */
typedef struct CUeglFrame_st {
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
    CUeglFrameType frameType;
    CUeglColorFormat eglColorFormat;
    CUarray_format cuFormat;
} CUeglFrame;

typedef struct CUDA_ARRAY_DESCRIPTOR_st {
    size_t Width;
    size_t Height;
    CUarray_format Format;
    unsigned int NumChannels;
} CUDA_ARRAY_DESCRIPTOR;

typedef struct CUDA_MEMCPY2D_st {
    size_t srcXInBytes;
    size_t srcY;
    CUmemorytype srcMemoryType;
    const void *srcHost;
    CUdeviceptr srcDevice;
    CUarray srcArray;
    size_t srcPitch;
    size_t dstXInBytes;
    size_t dstY;
    CUmemorytype dstMemoryType;
    void *dstHost;
    CUdeviceptr dstDevice;
    CUarray dstArray;
    size_t dstPitch;
    size_t WidthInBytes;
    size_t Height;
} CUDA_MEMCPY2D;

typedef unsigned long long CUsurfObject;

typedef enum CUresourcetype_enum {
    CU_RESOURCE_TYPE_ARRAY = 0x00,
    CU_RESOURCE_TYPE_MIPMAPPED_ARRAY = 0x01,
    CU_RESOURCE_TYPE_LINEAR = 0x02,
    CU_RESOURCE_TYPE_PITCH2D = 0x03
} CUresourcetype;

/* What a texture or surface object reads: only the array member is used by eglcuda; the
 * reserved member fixes the union at 128 bytes, as in cuda.h (144 bytes in all on LP64). */
typedef struct CUDA_RESOURCE_DESC_st {
    CUresourcetype resType;
    union {
        struct { CUarray hArray; } array;
        struct { int reserved[32]; } reserved;
    } res;
    unsigned int flags;
} CUDA_RESOURCE_DESC;

/* ---- constants ------------------------------------------------------------------------ */
#define CUDA_SUCCESS 0
#define CUDA_ERROR_INVALID_VALUE 1
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_FOUND 500
#define CUDA_ERROR_LAUNCH_TIMEOUT 702
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_EVENT_DISABLE_TIMING 0x2
#define CU_MEMHOSTALLOC_PORTABLE 0x01
#define CU_MEMHOSTALLOC_DEVICEMAP 0x02
#define CU_MEM_ATTACH_GLOBAL 0x1
#define CU_MEM_ATTACH_HOST 0x2
#define CU_MEM_ATTACH_SINGLE 0x4
#define CU_POINTER_ATTRIBUTE_MEMORY_TYPE 2
#define CU_POINTER_ATTRIBUTE_IS_MANAGED 8
#define CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL 9
#define CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY 83
#define CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS 89
#define CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY 19
#define CU_GRAPHICS_REGISTER_FLAGS_NONE 0x00
#define CU_GRAPHICS_REGISTER_FLAGS_SURFACE_LDST 0x04
#define CU_STREAM_WAIT_VALUE_GEQ 0x0
#define CU_STREAM_WAIT_VALUE_EQ 0x1
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x02
#define CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM 91
#define CU_DEVICE_ATTRIBUTE_INTEGRATED 18
#define CU_DEVICE_ATTRIBUTE_PCI_BUS_ID 33
#define CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID 34
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
/* "Indicates if contexts created on this device will be shared via MPS" (cuda.h, CUDA 12.x and
 * later; documented in the CUDA 12.6 driver API). Per process: the driver connects to an MPS
 * control daemon, or not, in cuInit. A driver that predates it answers CUDA_ERROR_INVALID_VALUE. */
#define CU_DEVICE_ATTRIBUTE_MPS_ENABLED 133

/* ---- functions ------------------------------------------------------------------------ */
/* @requires cuda */
CUresult cuInit(unsigned int flags);
CUresult cuDriverGetVersion(int *driverVersion);
CUresult cuGetErrorName(CUresult error, const char **pStr);
CUresult cuGetErrorString(CUresult error, const char **pStr);
CUresult cuDeviceGetCount(int *count);
CUresult cuDeviceGet(CUdevice *device, int ordinal);
CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
CUresult cuDeviceGetAttribute(int *pi, int attrib, CUdevice dev);
CUresult cuDeviceTotalMem(size_t *bytes, CUdevice dev); /* @symbol cuDeviceTotalMem_v2 */
CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
CUresult cuDevicePrimaryCtxRelease(CUdevice dev); /* @symbol cuDevicePrimaryCtxRelease_v2 */
CUresult cuCtxGetCurrent(CUcontext *pctx);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuCtxSynchronize(void);
CUresult cuMemGetInfo(size_t *free, size_t *total); /* @symbol cuMemGetInfo_v2 */
CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytesize); /* @symbol cuMemAlloc_v2 */
CUresult cuMemAllocPitch(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height, unsigned int ElementSizeBytes); /* @symbol cuMemAllocPitch_v2 */
CUresult cuMemFree(CUdeviceptr dptr); /* @symbol cuMemFree_v2 */
CUresult cuMemGetAddressRange(CUdeviceptr *pbase, size_t *psize, CUdeviceptr dptr); /* @symbol cuMemGetAddressRange_v2 */
CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags);
CUresult cuMemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int Flags); /* @symbol cuMemHostGetDevicePointer_v2 */
CUresult cuMemFreeHost(void *p);
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags);
CUresult cuPointerGetAttribute(void *data, int attribute, CUdeviceptr ptr);
CUresult cuArrayCreate(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray); /* @symbol cuArrayCreate_v2 */
CUresult cuArrayDestroy(CUarray hArray);
CUresult cuMemcpy2D(const CUDA_MEMCPY2D *pCopy); /* @symbol cuMemcpy2D_v2 */
CUresult cuMemcpy2DAsync(const CUDA_MEMCPY2D *pCopy, CUstream hStream); /* @symbol cuMemcpy2DAsync_v2 */
CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags);
CUresult cuStreamDestroy(CUstream hStream); /* @symbol cuStreamDestroy_v2 */
CUresult cuStreamSynchronize(CUstream hStream);
CUresult cuStreamQuery(CUstream hStream);
CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags);
CUresult cuStreamAttachMemAsync(CUstream hStream, CUdeviceptr dptr, size_t length, unsigned int flags);
CUresult cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData);
CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags);
CUresult cuEventDestroy(CUevent hEvent); /* @symbol cuEventDestroy_v2 */
CUresult cuEventRecord(CUevent hEvent, CUstream hStream);
CUresult cuEventSynchronize(CUevent hEvent);
CUresult cuEventQuery(CUevent hEvent);
CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd);
CUresult cuGraphicsUnregisterResource(CUgraphicsResource resource);
CUresult cuGraphicsMapResources(unsigned int count, CUgraphicsResource *resources, CUstream hStream);
CUresult cuGraphicsUnmapResources(unsigned int count, CUgraphicsResource *resources, CUstream hStream);
CUresult cuGraphicsSubResourceGetMappedArray(CUarray *pArray, CUgraphicsResource resource, unsigned int arrayIndex, unsigned int mipLevel);
CUresult cuGraphicsGLRegisterImage(CUgraphicsResource *pCudaResource, unsigned int image, unsigned int target, unsigned int Flags);
CUresult cuGraphicsGLRegisterBuffer(CUgraphicsResource *pCudaResource, unsigned int buffer, unsigned int Flags);
CUresult cuGraphicsResourceGetMappedPointer(CUdeviceptr *pDevPtr, size_t *pSize, CUgraphicsResource resource); /* @symbol cuGraphicsResourceGetMappedPointer_v2 */
CUresult cuSurfObjectCreate(CUsurfObject *pSurfObject, const CUDA_RESOURCE_DESC *pResDesc);
CUresult cuSurfObjectDestroy(CUsurfObject surfObject);
CUresult cuStreamWaitValue32(CUstream stream, CUdeviceptr addr, unsigned int value, unsigned int flags); /* @symbol cuStreamWaitValue32_v2 */
CUresult cuStreamWriteValue32(CUstream stream, CUdeviceptr addr, unsigned int value, unsigned int flags); /* @symbol cuStreamWriteValue32_v2 */

/* @requires cuda */
/* The EGL interop entry points (cudaEGL.h). EGL handles are passed as void *: cudaEGL.h uses
 * the EGL typedefs, which are pointers. */
CUresult cuGraphicsEGLRegisterImage(CUgraphicsResource *pCudaResource, void *image, unsigned int flags);
CUresult cuGraphicsResourceGetMappedEglFrame(CUeglFrame *eglFrame, CUgraphicsResource resource, unsigned int index, unsigned int mipLevel);
CUresult cuEGLStreamConsumerConnect(CUeglStreamConnection *conn, void *stream);
CUresult cuEGLStreamConsumerConnectWithFlags(CUeglStreamConnection *conn, void *stream, unsigned int flags);
CUresult cuEGLStreamConsumerDisconnect(CUeglStreamConnection *conn);
CUresult cuEGLStreamConsumerAcquireFrame(CUeglStreamConnection *conn, CUgraphicsResource *pCudaResource, CUstream *pStream, unsigned int timeout);
CUresult cuEGLStreamConsumerReleaseFrame(CUeglStreamConnection *conn, CUgraphicsResource pCudaResource, CUstream *pStream);
CUresult cuEGLStreamProducerConnect(CUeglStreamConnection *conn, void *stream, EGLint width, EGLint height);
CUresult cuEGLStreamProducerDisconnect(CUeglStreamConnection *conn);
CUresult cuEGLStreamProducerPresentFrame(CUeglStreamConnection *conn, CUeglFrame eglframe, CUstream *pStream);
CUresult cuEGLStreamProducerReturnFrame(CUeglStreamConnection *conn, CUeglFrame *eglframe, CUstream *pStream);
CUresult cuEventCreateFromEGLSync(CUevent *phEvent, void *eglSync, unsigned int flags);
