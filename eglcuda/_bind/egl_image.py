"""The EGLImage calls (EGL_KHR_image_base, EGL_KHR_gl_texture_2D_image, GL_OES_EGL_image;
csrc/egl_image.h). Displays, contexts and images are addresses (ints)."""
from __future__ import annotations

from ._native import ffi, lib
from .egl import address, egl_error, int_attribs


def create_from_texture(display: int, context: int, texture: int, level: int) -> int:
    """An EGLImage of mip ``level`` of GL 2D texture ``texture`` of ``context``, its contents
    preserved (``eglCreateImageKHR`` with ``EGL_GL_TEXTURE_2D_KHR``)."""
    attributes = int_attribs([(lib.EGL_GL_TEXTURE_LEVEL_KHR, level), (lib.EGL_IMAGE_PRESERVED_KHR, lib.EGL_TRUE)])
    handle = lib.eglCreateImageKHR(ffi.cast("EGLDisplay", display), ffi.cast("EGLContext", context),
                                   lib.EGL_GL_TEXTURE_2D_KHR, ffi.cast("EGLClientBuffer", texture), attributes)
    if handle == ffi.NULL:
        raise egl_error("eglCreateImageKHR", f"making an EGLImage of texture {texture}")
    return address(handle)


def destroy(display: int, image: int) -> None:
    """``eglDestroyImageKHR`` (finalizers: the driver's answer is not reported)."""
    lib.eglDestroyImageKHR(ffi.cast("EGLDisplay", display), ffi.cast("EGLImageKHR", image))


def target_texture_2d(image: int) -> None:
    """Make the GL_TEXTURE_2D bound in the current GL context show ``image``
    (``glEGLImageTargetTexture2DOES``, a GL call: GL reports its failure, read it with
    :func:`eglcuda._bind.gl.check`)."""
    lib.glEGLImageTargetTexture2DOES(lib.GL_TEXTURE_2D, ffi.cast("GLeglImageOES", image))
