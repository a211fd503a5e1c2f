/* EGL core (1.5, the part eglcuda uses) and the device platform extensions.
 *
 * Our own declarations, written from the EGL 1.5 specification and the Khronos extension
 * texts; no upstream header is included. This file is both valid C (compiled into the
 * extension module) and the cffi cdef text, so it stays within the C subset cffi parses:
 * no preprocessor conditionals, integer #defines only.
 *
 * Sections, in the same order in every csrc/ header:
 *   types, constants, functions (grouped under "@requires" markers).
 * A "@requires X|Y" comment applies to the function prototypes after it: "core" functions are
 * looked up with dlsym in libEGL; an extension's functions are resolved with eglGetProcAddress
 * only once the client or a display lists one of the named extensions.
 */

/* ---- types ---------------------------------------------------------------------------- */
typedef int32_t EGLint;           /* khronos_int32_t */
typedef unsigned int EGLBoolean;
typedef unsigned int EGLenum;
typedef intptr_t EGLAttrib;       /* pointer-sized, as EGL 1.5 requires */
typedef intptr_t EGLAttribKHR;
typedef uint64_t EGLuint64KHR;
typedef uint64_t EGLTimeKHR;
typedef void *EGLDisplay;
typedef void *EGLConfig;
typedef void *EGLContext;
typedef void *EGLSurface;
typedef void *EGLClientBuffer;
typedef void *EGLDeviceEXT;

/* ---- constants ------------------------------------------------------------------------ */
#define EGL_FALSE 0
#define EGL_TRUE 1
#define EGL_NONE 0x3038
#define EGL_DONT_CARE -1

#define EGL_SUCCESS 0x3000
#define EGL_NOT_INITIALIZED 0x3001
#define EGL_BAD_ACCESS 0x3002
#define EGL_BAD_ALLOC 0x3003
#define EGL_BAD_ATTRIBUTE 0x3004
#define EGL_BAD_CONFIG 0x3005
#define EGL_BAD_CONTEXT 0x3006
#define EGL_BAD_CURRENT_SURFACE 0x3007
#define EGL_BAD_DISPLAY 0x3008
#define EGL_BAD_MATCH 0x3009
#define EGL_BAD_NATIVE_PIXMAP 0x300A
#define EGL_BAD_NATIVE_WINDOW 0x300B
#define EGL_BAD_PARAMETER 0x300C
#define EGL_BAD_SURFACE 0x300D
#define EGL_CONTEXT_LOST 0x300E
#define EGL_BAD_DEVICE_EXT 0x322B

#define EGL_VENDOR 0x3053
#define EGL_VERSION 0x3054
#define EGL_EXTENSIONS 0x3055
#define EGL_CLIENT_APIS 0x308D

/* config attributes */
#define EGL_ALPHA_SIZE 0x3021
#define EGL_BLUE_SIZE 0x3022
#define EGL_GREEN_SIZE 0x3023
#define EGL_RED_SIZE 0x3024
#define EGL_DEPTH_SIZE 0x3025
#define EGL_CONFIG_ID 0x3028
#define EGL_SURFACE_TYPE 0x3033
#define EGL_RENDERABLE_TYPE 0x3040
#define EGL_PBUFFER_BIT 0x0001
#define EGL_WINDOW_BIT 0x0004
#define EGL_OPENGL_ES2_BIT 0x0004
#define EGL_OPENGL_BIT 0x0008
#define EGL_OPENGL_ES3_BIT 0x0040
#define EGL_HEIGHT 0x3056
#define EGL_WIDTH 0x3057

/* client APIs and contexts */
#define EGL_OPENGL_ES_API 0x30A0
#define EGL_OPENGL_API 0x30A2
#define EGL_CONTEXT_MAJOR_VERSION 0x3098
#define EGL_CONTEXT_MINOR_VERSION 0x30FB
#define EGL_CONTEXT_OPENGL_PROFILE_MASK 0x30FD
#define EGL_CONTEXT_OPENGL_CORE_PROFILE_BIT 0x0001
#define EGL_CONTEXT_OPENGL_COMPATIBILITY_PROFILE_BIT 0x0002
#define EGL_DRAW 0x3059
#define EGL_READ 0x305A

/* EGL_EXT_platform_device, EGL_MESA_platform_surfaceless, EGL_EXT_device_query */
#define EGL_PLATFORM_DEVICE_EXT 0x313F
#define EGL_PLATFORM_SURFACELESS_MESA 0x31DD
#define EGL_DEVICE_EXT 0x322C
/* EGL_EXT_device_drm, EGL_EXT_device_drm_render_node */
#define EGL_DRM_DEVICE_FILE_EXT 0x3233
#define EGL_DRM_RENDER_NODE_FILE_EXT 0x3377
/* EGL_NV_device_cuda */
#define EGL_CUDA_DEVICE_NV 0x323A

/* ---- functions ------------------------------------------------------------------------ */
/* @requires core */
EGLint eglGetError(void);
EGLDisplay eglGetPlatformDisplay(EGLenum platform, void *native_display, const EGLAttrib *attrib_list);
EGLBoolean eglInitialize(EGLDisplay dpy, EGLint *major, EGLint *minor);
EGLBoolean eglTerminate(EGLDisplay dpy);
const char *eglQueryString(EGLDisplay dpy, EGLint name);
/* Deviation: the header returns __eglMustCastToProperFunctionPointerType; we take the address as
 * void *, the same size on every ABI we build for, and cast where it is called. */
void *eglGetProcAddress(const char *procname);
EGLBoolean eglBindAPI(EGLenum api);
EGLenum eglQueryAPI(void);
EGLBoolean eglChooseConfig(EGLDisplay dpy, const EGLint *attrib_list, EGLConfig *configs, EGLint config_size, EGLint *num_config);
EGLBoolean eglGetConfigAttrib(EGLDisplay dpy, EGLConfig config, EGLint attribute, EGLint *value);
EGLContext eglCreateContext(EGLDisplay dpy, EGLConfig config, EGLContext share_context, const EGLint *attrib_list);
EGLBoolean eglDestroyContext(EGLDisplay dpy, EGLContext ctx);
EGLSurface eglCreatePbufferSurface(EGLDisplay dpy, EGLConfig config, const EGLint *attrib_list);
EGLBoolean eglDestroySurface(EGLDisplay dpy, EGLSurface surface);
EGLBoolean eglMakeCurrent(EGLDisplay dpy, EGLSurface draw, EGLSurface read, EGLContext ctx);
EGLContext eglGetCurrentContext(void);
EGLDisplay eglGetCurrentDisplay(void);
EGLSurface eglGetCurrentSurface(EGLint readdraw);
EGLBoolean eglSwapBuffers(EGLDisplay dpy, EGLSurface surface);
EGLBoolean eglReleaseThread(void);

/* @requires EGL_EXT_device_enumeration|EGL_EXT_device_base */
EGLBoolean eglQueryDevicesEXT(EGLint max_devices, EGLDeviceEXT *devices, EGLint *num_devices);

/* @requires EGL_EXT_device_query|EGL_EXT_device_base */
EGLBoolean eglQueryDeviceAttribEXT(EGLDeviceEXT device, EGLint attribute, EGLAttrib *value);
const char *eglQueryDeviceStringEXT(EGLDeviceEXT device, EGLint name);
EGLBoolean eglQueryDisplayAttribEXT(EGLDisplay dpy, EGLint attribute, EGLAttrib *value);
