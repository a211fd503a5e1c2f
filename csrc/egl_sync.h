/* EGLSync: EGL_KHR_fence_sync, EGL_KHR_reusable_sync, EGL_KHR_wait_sync and the tokens of
 * EGL_NV_cuda_event (which adds no functions: its syncs are made with EGL 1.5 eglCreateSync,
 * whose pointer-sized EGLAttrib list can carry a CUevent handle).
 * Written from the Khronos and NVIDIA extension texts. Same sections as egl_core.h. */

/* ---- types ---------------------------------------------------------------------------- */
typedef void *EGLSyncKHR;
typedef void *EGLSync;

/* ---- constants ------------------------------------------------------------------------ */
#define EGL_SYNC_PRIOR_COMMANDS_COMPLETE_KHR 0x30F0
#define EGL_SYNC_STATUS_KHR 0x30F1
#define EGL_SIGNALED_KHR 0x30F2
#define EGL_UNSIGNALED_KHR 0x30F3
#define EGL_TIMEOUT_EXPIRED_KHR 0x30F5
#define EGL_CONDITION_SATISFIED_KHR 0x30F6
#define EGL_SYNC_TYPE_KHR 0x30F7
#define EGL_SYNC_CONDITION_KHR 0x30F8
#define EGL_SYNC_FENCE_KHR 0x30F9
#define EGL_SYNC_REUSABLE_KHR 0x30FA
#define EGL_SYNC_FLUSH_COMMANDS_BIT_KHR 0x0001
/* EGL_FOREVER_KHR is 0xFFFFFFFFFFFFFFFF: cffi's cdef takes no unsigned 64-bit literal, so the
 * Python side defines it (eglcuda._constants.EGL_FOREVER). */
/* EGL_NV_cuda_event */
#define EGL_CUDA_EVENT_HANDLE_NV 0x323B
#define EGL_SYNC_CUDA_EVENT_NV 0x323C
#define EGL_SYNC_CUDA_EVENT_COMPLETE_NV 0x323D

/* ---- functions ------------------------------------------------------------------------ */
/* @requires core */
EGLSync eglCreateSync(EGLDisplay dpy, EGLenum type, const EGLAttrib *attrib_list);

/* @requires EGL_KHR_fence_sync|EGL_KHR_reusable_sync */
EGLSyncKHR eglCreateSyncKHR(EGLDisplay dpy, EGLenum type, const EGLint *attrib_list);
EGLBoolean eglDestroySyncKHR(EGLDisplay dpy, EGLSyncKHR sync);
EGLint eglClientWaitSyncKHR(EGLDisplay dpy, EGLSyncKHR sync, EGLint flags, EGLTimeKHR timeout);
EGLBoolean eglGetSyncAttribKHR(EGLDisplay dpy, EGLSyncKHR sync, EGLint attribute, EGLint *value);

/* @requires EGL_KHR_reusable_sync */
EGLBoolean eglSignalSyncKHR(EGLDisplay dpy, EGLSyncKHR sync, EGLenum mode);

/* @requires EGL_KHR_wait_sync */
EGLint eglWaitSyncKHR(EGLDisplay dpy, EGLSyncKHR sync, EGLint flags);
