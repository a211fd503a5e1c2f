/* The CUDA driver's virtual memory management calls: physical allocations made with cuMemCreate,
 * shared between processes as POSIX file descriptors (cuMemExportToShareableHandle, sent with
 * SCM_RIGHTS, cuMemImportFromShareableHandle), and mapped into a reserved virtual address range
 * (cuMemAddressReserve, cuMemMap, cuMemSetAccess). For the `cuda-vmm` topic transport.
 * Written from the CUDA driver API reference (section "Virtual Memory Management") and the type
 * definitions it gives; no CUDA header is included. Same sections as egl_core.h; it uses the types
 * of cuda_egl.h (CUresult, CUdevice, CUdeviceptr), which comes before it in build_ffi.py.
 * None of these calls has a versioned ABI name (no "@symbol"). */

/* ---- types ---------------------------------------------------------------------------- */
/* A physical allocation's handle: an opaque 64-bit value, not a pointer. */
typedef unsigned long long CUmemGenericAllocationHandle;

/* Deviation: cuda.h declares these as enums (4 bytes on every ABI CUDA supports); we use int
 * typedefs and list only the values eglcuda passes, as for CUresult in cuda_egl.h. */
typedef int CUmemAllocationType;
typedef int CUmemAllocationHandleType;
typedef int CUmemLocationType;
typedef int CUmemAccess_flags;
typedef int CUmemAllocationGranularity_flags;

/* Where memory lives: a device (type CU_MEM_LOCATION_TYPE_DEVICE) and its ordinal. 8 bytes. */
typedef struct CUmemLocation_st {
    CUmemLocationType type;
    int id;
} CUmemLocation;

/* What cuMemCreate makes. 32 bytes on LP64: type 0, requestedHandleTypes 4, location 8,
 * win32HandleMetaData 16, allocFlags 24 (8 bytes: compressionType, gpuDirectRDMACapable, usage,
 * reserved[4]). Zero every field eglcuda does not set. */
typedef struct CUmemAllocationProp_st {
    CUmemAllocationType type;
    CUmemAllocationHandleType requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

/* Who may access a mapped range, and how. 12 bytes. */
typedef struct CUmemAccessDesc_st {
    CUmemLocation location;
    CUmemAccess_flags flags;
} CUmemAccessDesc;


/* ---- constants ------------------------------------------------------------------------ */
#define CU_MEM_ALLOCATION_TYPE_PINNED 0x1
#define CU_MEM_LOCATION_TYPE_DEVICE 0x1
#define CU_MEM_HANDLE_TYPE_NONE 0x0
#define CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR 0x1
#define CU_MEM_ACCESS_FLAGS_PROT_NONE 0x0
#define CU_MEM_ACCESS_FLAGS_PROT_READ 0x1
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 0x3
#define CU_MEM_ALLOC_GRANULARITY_MINIMUM 0x0
#define CU_MEM_ALLOC_GRANULARITY_RECOMMENDED 0x1
#define CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED 102
#define CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED 103

/* ---- functions ------------------------------------------------------------------------ */
/* @requires cuda */
CUresult cuMemGetAllocationGranularity(size_t *granularity, const CUmemAllocationProp *prop, CUmemAllocationGranularity_flags option);
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop, unsigned long long flags);
CUresult cuMemRelease(CUmemGenericAllocationHandle handle);
/* For CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, shareableHandle points at an int that receives a
 * new descriptor (the caller owns it), and osHandle of the import is the descriptor itself cast
 * to a pointer; the import does not take the descriptor over. */
CUresult cuMemExportToShareableHandle(void *shareableHandle, CUmemGenericAllocationHandle handle, CUmemAllocationHandleType handleType, unsigned long long flags);
CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle, void *osHandle, CUmemAllocationHandleType shHandleType);
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags);
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size);
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle, unsigned long long flags);
CUresult cuMemUnmap(CUdeviceptr ptr, size_t size);
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count);
