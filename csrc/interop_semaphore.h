/* A timeline semaphore shared by CUDA and GL, made by Vulkan: the one object both APIs can wait
 * on and signal on the GPU when EGL_NV_cuda_event is missing (CUDA event -> GL server wait).
 * Written from the Vulkan 1.2 specification (VK_KHR_external_semaphore_fd, timeline semaphores),
 * the GL_EXT_semaphore, GL_EXT_semaphore_fd and GL_NV_timeline_semaphore extension texts, and the
 * CUDA driver API reference (external semaphores). Same sections as egl_core.h. */

/* ---- types ---------------------------------------------------------------------------- */
typedef int32_t VkResult;
typedef uint32_t VkStructureType;
typedef uint32_t VkBool32;
typedef void *VkInstance;        /* dispatchable handles are pointers */
typedef void *VkPhysicalDevice;
typedef void *VkDevice;
typedef uint64_t VkSemaphore;    /* non-dispatchable handles are 64-bit values */
typedef void (*PFN_vkVoidFunction)(void);

typedef struct VkApplicationInfo {
    VkStructureType sType; const void *pNext; const char *pApplicationName; uint32_t applicationVersion;
    const char *pEngineName; uint32_t engineVersion; uint32_t apiVersion;
} VkApplicationInfo;
typedef struct VkInstanceCreateInfo {
    VkStructureType sType; const void *pNext; uint32_t flags; const VkApplicationInfo *pApplicationInfo;
    uint32_t enabledLayerCount; const char *const *ppEnabledLayerNames;
    uint32_t enabledExtensionCount; const char *const *ppEnabledExtensionNames;
} VkInstanceCreateInfo;
typedef struct VkPhysicalDeviceIDProperties {
    VkStructureType sType; void *pNext; uint8_t deviceUUID[16]; uint8_t driverUUID[16];
    uint8_t deviceLUID[8]; uint32_t deviceNodeMask; VkBool32 deviceLUIDValid;
} VkPhysicalDeviceIDProperties;
/* VkPhysicalDeviceProperties2 with its large core-properties member left as room the driver
 * fills: only the chained ID properties are read. */
typedef struct VkPhysicalDeviceProperties2 {
    VkStructureType sType; void *pNext; uint64_t properties[256];
} VkPhysicalDeviceProperties2;
typedef struct VkDeviceQueueCreateInfo {
    VkStructureType sType; const void *pNext; uint32_t flags; uint32_t queueFamilyIndex; uint32_t queueCount;
    const float *pQueuePriorities;
} VkDeviceQueueCreateInfo;
typedef struct VkPhysicalDeviceTimelineSemaphoreFeatures {
    VkStructureType sType; void *pNext; VkBool32 timelineSemaphore;
} VkPhysicalDeviceTimelineSemaphoreFeatures;
typedef struct VkDeviceCreateInfo {
    VkStructureType sType; const void *pNext; uint32_t flags; uint32_t queueCreateInfoCount;
    const VkDeviceQueueCreateInfo *pQueueCreateInfos; uint32_t enabledLayerCount; const char *const *ppEnabledLayerNames;
    uint32_t enabledExtensionCount; const char *const *ppEnabledExtensionNames; const void *pEnabledFeatures;
} VkDeviceCreateInfo;
typedef struct VkSemaphoreTypeCreateInfo {
    VkStructureType sType; const void *pNext; uint32_t semaphoreType; uint64_t initialValue;
} VkSemaphoreTypeCreateInfo;
typedef struct VkExportSemaphoreCreateInfo {
    VkStructureType sType; const void *pNext; uint32_t handleTypes;
} VkExportSemaphoreCreateInfo;
typedef struct VkSemaphoreCreateInfo {
    VkStructureType sType; const void *pNext; uint32_t flags;
} VkSemaphoreCreateInfo;
typedef struct VkSemaphoreGetFdInfoKHR {
    VkStructureType sType; const void *pNext; VkSemaphore semaphore; uint32_t handleType;
} VkSemaphoreGetFdInfoKHR;

typedef VkResult (*PFN_vkCreateInstance)(const VkInstanceCreateInfo *info, const void *allocator, VkInstance *instance);
typedef void (*PFN_vkDestroyInstance)(VkInstance instance, const void *allocator);
typedef VkResult (*PFN_vkEnumeratePhysicalDevices)(VkInstance instance, uint32_t *count, VkPhysicalDevice *devices);
typedef void (*PFN_vkGetPhysicalDeviceProperties2)(VkPhysicalDevice device, VkPhysicalDeviceProperties2 *properties);
typedef VkResult (*PFN_vkCreateDevice)(VkPhysicalDevice physical, const VkDeviceCreateInfo *info, const void *allocator, VkDevice *device);
typedef void (*PFN_vkDestroyDevice)(VkDevice device, const void *allocator);
typedef PFN_vkVoidFunction (*PFN_vkGetDeviceProcAddr)(VkDevice device, const char *name);
typedef VkResult (*PFN_vkCreateSemaphore)(VkDevice device, const VkSemaphoreCreateInfo *info, const void *allocator, VkSemaphore *semaphore);
typedef void (*PFN_vkDestroySemaphore)(VkDevice device, VkSemaphore semaphore, const void *allocator);
typedef VkResult (*PFN_vkGetSemaphoreFdKHR)(VkDevice device, const VkSemaphoreGetFdInfoKHR *info, int *fd);

/* CUDA external semaphores (cuda.h). */
typedef struct CUextSemaphore_st *CUexternalSemaphore;
typedef struct CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC {
    int type;
    union { int fd; struct { void *handle; const void *name; } win32; const void *nvSciSyncObj; } handle;
    unsigned int flags;
    unsigned int reserved[16];
} CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC;
typedef struct CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS {
    struct {
        struct { unsigned long long value; } fence;
        union { void *fence; unsigned long long reserved; } nvSciSync;
        struct { unsigned long long key; } keyedMutex;
        unsigned int reserved[12];
    } params;
    unsigned int flags;
    unsigned int reserved[16];
} CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS;
typedef struct CUuuid_st { unsigned char bytes[16]; } CUuuid;

/* ---- constants ------------------------------------------------------------------------ */
#define VK_SUCCESS 0
#define VK_STRUCTURE_TYPE_APPLICATION_INFO 0
#define VK_STRUCTURE_TYPE_INSTANCE_CREATE_INFO 1
#define VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO 2
#define VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO 3
#define VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO 9
#define VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2 1000059001
#define VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES 1000071004
#define VK_STRUCTURE_TYPE_EXPORT_SEMAPHORE_CREATE_INFO 1000077000
#define VK_STRUCTURE_TYPE_SEMAPHORE_GET_FD_INFO_KHR 1000079001
#define VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_TIMELINE_SEMAPHORE_FEATURES 1000207000
#define VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO 1000207002
#define VK_SEMAPHORE_TYPE_TIMELINE 1
#define VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT 0x1
#define VK_API_VERSION_1_2 0x402000
#define CU_EXTERNAL_SEMAPHORE_HANDLE_TYPE_TIMELINE_SEMAPHORE_FD 9
#define GL_HANDLE_TYPE_OPAQUE_FD_EXT 0x9586
#define GL_SEMAPHORE_TYPE_NV 0x95B3
#define GL_SEMAPHORE_TYPE_TIMELINE_NV 0x95B5
#define GL_TIMELINE_SEMAPHORE_VALUE_NV 0x9595

/* ---- functions ------------------------------------------------------------------------ */
/* @requires vulkan */
PFN_vkVoidFunction vkGetInstanceProcAddr(VkInstance instance, const char *name);

/* @requires cuda */
CUresult cuImportExternalSemaphore(CUexternalSemaphore *semaphore, const CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC *desc);
CUresult cuSignalExternalSemaphoresAsync(const CUexternalSemaphore *semaphores, const CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS *params, unsigned int count, CUstream stream);
CUresult cuDestroyExternalSemaphore(CUexternalSemaphore semaphore);
CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice device);

/* GL functions, reached through eglGetProcAddress once the current GL context lists them. */
/* @requires GL_EXT_semaphore */
void glDeleteSemaphoresEXT(int n, const unsigned int *semaphores);
unsigned char glIsSemaphoreEXT(unsigned int semaphore);
void glSemaphoreParameterui64vEXT(unsigned int semaphore, unsigned int pname, const uint64_t *params);
void glWaitSemaphoreEXT(unsigned int semaphore, unsigned int numBufferBarriers, const unsigned int *buffers, unsigned int numTextureBarriers, const unsigned int *textures, const unsigned int *srcLayouts);
/* @requires GL_EXT_semaphore_fd */
void glImportSemaphoreFdEXT(unsigned int semaphore, unsigned int handleType, int fd);
/* @requires GL_NV_timeline_semaphore */
void glCreateSemaphoresNV(int n, unsigned int *semaphores);
void glSemaphoreParameterivNV(unsigned int semaphore, unsigned int pname, const int *params);
