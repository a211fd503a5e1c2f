/* The EGLStream family: EGL_KHR_stream and its fifo, attrib, cross_process_fd,
 * consumer_gltexture and producer_eglsurface companions, and EGL_NV_stream_reset.
 * Written from the Khronos and NVIDIA extension texts. Same sections as egl_core.h. */

/* ---- types ---------------------------------------------------------------------------- */
typedef void *EGLStreamKHR;
typedef int EGLNativeFileDescriptorKHR;

/* ---- constants ------------------------------------------------------------------------ */
/* EGL_KHR_stream */
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
#define EGL_BAD_STREAM_KHR 0x321B
#define EGL_BAD_STATE_KHR 0x321C
/* EGL_KHR_stream_consumer_gltexture */
#define EGL_CONSUMER_ACQUIRE_TIMEOUT_USEC_KHR 0x321E
/* EGL_KHR_stream_fifo */
#define EGL_STREAM_FIFO_LENGTH_KHR 0x31FC
#define EGL_STREAM_TIME_NOW_KHR 0x31FD
#define EGL_STREAM_TIME_CONSUMER_KHR 0x31FE
#define EGL_STREAM_TIME_PRODUCER_KHR 0x31FF
/* EGL_KHR_stream_cross_process_fd */
#define EGL_NO_FILE_DESCRIPTOR_KHR -1
/* EGL_KHR_stream_producer_eglsurface */
#define EGL_STREAM_BIT_KHR 0x0800
/* EGL_NV_stream_reset */
#define EGL_SUPPORT_RESET_NV 0x3334
#define EGL_SUPPORT_REUSE_NV 0x3335

/* ---- functions ------------------------------------------------------------------------ */
/* @requires EGL_KHR_stream */
EGLStreamKHR eglCreateStreamKHR(EGLDisplay dpy, const EGLint *attrib_list);
EGLBoolean eglDestroyStreamKHR(EGLDisplay dpy, EGLStreamKHR stream);
EGLBoolean eglStreamAttribKHR(EGLDisplay dpy, EGLStreamKHR stream, EGLenum attribute, EGLint value);
EGLBoolean eglQueryStreamKHR(EGLDisplay dpy, EGLStreamKHR stream, EGLenum attribute, EGLint *value);
EGLBoolean eglQueryStreamu64KHR(EGLDisplay dpy, EGLStreamKHR stream, EGLenum attribute, EGLuint64KHR *value);

/* @requires EGL_KHR_stream_attrib */
EGLStreamKHR eglCreateStreamAttribKHR(EGLDisplay dpy, const EGLAttrib *attrib_list);
EGLBoolean eglSetStreamAttribKHR(EGLDisplay dpy, EGLStreamKHR stream, EGLenum attribute, EGLAttrib value);
EGLBoolean eglQueryStreamAttribKHR(EGLDisplay dpy, EGLStreamKHR stream, EGLenum attribute, EGLAttrib *value);
EGLBoolean eglStreamConsumerAcquireAttribKHR(EGLDisplay dpy, EGLStreamKHR stream, const EGLAttrib *attrib_list);
EGLBoolean eglStreamConsumerReleaseAttribKHR(EGLDisplay dpy, EGLStreamKHR stream, const EGLAttrib *attrib_list);

/* @requires EGL_KHR_stream_fifo */
EGLBoolean eglQueryStreamTimeKHR(EGLDisplay dpy, EGLStreamKHR stream, EGLenum attribute, EGLTimeKHR *value);

/* @requires EGL_KHR_stream_cross_process_fd */
EGLNativeFileDescriptorKHR eglGetStreamFileDescriptorKHR(EGLDisplay dpy, EGLStreamKHR stream);
EGLStreamKHR eglCreateStreamFromFileDescriptorKHR(EGLDisplay dpy, EGLNativeFileDescriptorKHR file_descriptor);

/* @requires EGL_KHR_stream_consumer_gltexture */
EGLBoolean eglStreamConsumerGLTextureExternalKHR(EGLDisplay dpy, EGLStreamKHR stream);
EGLBoolean eglStreamConsumerAcquireKHR(EGLDisplay dpy, EGLStreamKHR stream);
EGLBoolean eglStreamConsumerReleaseKHR(EGLDisplay dpy, EGLStreamKHR stream);

/* @requires EGL_KHR_stream_producer_eglsurface */
EGLSurface eglCreateStreamProducerSurfaceKHR(EGLDisplay dpy, EGLConfig config, EGLStreamKHR stream, const EGLint *attrib_list);

/* @requires EGL_NV_stream_reset */
EGLBoolean eglResetStreamNV(EGLDisplay dpy, EGLStreamKHR stream);
