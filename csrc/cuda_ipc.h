/* The CUDA driver's interprocess calls (memory and event handles) and the few device queries the
 * topic layer needs to choose a transport per subscriber (GPU UUIDs, peer access).
 * Written from the CUDA driver API reference (sections "Memory Management", "Event Management",
 * "Device Management" and "Peer Context Memory Access"); no CUDA header is included. Same
 * sections as egl_core.h; it uses the types of cuda_egl.h and interop_semaphore.h (CUuuid and
 * cuDeviceGetUuid are declared there, for matching Vulkan devices), which come before it in
 * build_ffi.py.
 * "@symbol" names the exported ABI name where cuda.h maps a call to a versioned symbol. */

/* ---- types ---------------------------------------------------------------------------- */
/* CU_IPC_HANDLE_SIZE is 64: both handle kinds are 64 opaque bytes, passed by value. */
typedef struct CUipcMemHandle_st {
    char reserved[64];
} CUipcMemHandle;

typedef struct CUipcEventHandle_st {
    char reserved[64];
} CUipcEventHandle;


/* ---- constants ------------------------------------------------------------------------ */
/* CU_EVENT_DISABLE_TIMING (0x2) is declared in cuda_egl.h; an interprocess event needs it too. */
#define CU_EVENT_INTERPROCESS 0x4
#define CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS 0x1
#define CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING 41
#define CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED 125
#define CUDA_ERROR_NOT_READY 600
#define CUDA_ERROR_ALREADY_MAPPED 208
#define CUDA_ERROR_NOT_SUPPORTED 801

/* ---- functions ------------------------------------------------------------------------ */
/* @requires cuda */
CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr);
CUresult cuIpcOpenMemHandle(CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags); /* @symbol cuIpcOpenMemHandle_v2 */
CUresult cuIpcCloseMemHandle(CUdeviceptr dptr);
CUresult cuIpcGetEventHandle(CUipcEventHandle *pHandle, CUevent event);
CUresult cuIpcOpenEventHandle(CUevent *phEvent, CUipcEventHandle handle);
/* A device's UUID (CUuuid, 16 bytes) names the same GPU in every process, whatever
 * CUDA_VISIBLE_DEVICES makes its ordinal there. cuDeviceGetUuid_v2 gives MIG instances their own
 * UUIDs; older drivers have only cuDeviceGetUuid (interop_semaphore.h). */
CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev);
CUresult cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev);
