/* EGLImage: EGL_KHR_image_base and EGL_KHR_gl_texture_2D_image.
 * Written from the Khronos extension texts. Same sections as egl_core.h. */

/* ---- types ---------------------------------------------------------------------------- */
typedef void *EGLImageKHR;
typedef void *GLeglImageOES;

/* ---- constants ------------------------------------------------------------------------ */
#define EGL_IMAGE_PRESERVED_KHR 0x30D2
#define EGL_GL_TEXTURE_2D_KHR 0x30B1
#define EGL_GL_TEXTURE_LEVEL_KHR 0x30BC
/* OpenGL tokens the image code needs (from the GL registry). */
#define GL_TEXTURE_2D 0x0DE1

/* ---- functions ------------------------------------------------------------------------ */
/* @requires EGL_KHR_image_base */
EGLImageKHR eglCreateImageKHR(EGLDisplay dpy, EGLContext ctx, EGLenum target, EGLClientBuffer buffer, const EGLint *attrib_list);
EGLBoolean eglDestroyImageKHR(EGLDisplay dpy, EGLImageKHR image);

/* GL_OES_EGL_image: a GL function, reached through eglGetProcAddress once the current GL
 * context lists the extension. */
/* @requires GL_OES_EGL_image */
void glEGLImageTargetTexture2DOES(unsigned int target, GLeglImageOES image);
