"""CUDA graphics interop (``cuGraphics*``, csrc/cuda_egl.h): registering EGLImages and GL textures
with CUDA, mapping them, and where the mapped texels are.

Registrations (``CUgraphicsResource``), arrays and streams are addresses (ints). The one-element
resource arrays the map calls take are made per call: the driver reads them only during it."""
from __future__ import annotations

from ._native import ffi, lib
from .cuda import check, cuda_error
from .egl import address


def _resources(resource: int):
    return ffi.new("CUgraphicsResource *", ffi.cast("CUgraphicsResource", resource))


def register_egl_image(image: int) -> int:
    """Register an EGLImage (``cuGraphicsEGLRegisterImage``, no flags), in the current context."""
    out = ffi.new("CUgraphicsResource *")
    check(lib.cuGraphicsEGLRegisterImage(out, ffi.cast("void *", image), lib.CU_GRAPHICS_REGISTER_FLAGS_NONE),
          "cuGraphicsEGLRegisterImage", "registering the EGLImage with CUDA")
    return address(out[0])


def register_gl_texture(texture: int) -> int:
    """Register a GL 2D texture of the current GL context for surface loads and stores
    (``cuGraphicsGLRegisterImage``), in the current CUDA context."""
    out = ffi.new("CUgraphicsResource *")
    check(lib.cuGraphicsGLRegisterImage(out, texture, lib.GL_TEXTURE_2D, lib.CU_GRAPHICS_REGISTER_FLAGS_SURFACE_LDST),
          "cuGraphicsGLRegisterImage", "registering the image's source texture with CUDA")
    return address(out[0])


def unregister(resource: int) -> int:
    """``cuGraphicsUnregisterResource``; returns the driver's status (finalizers ignore it)."""
    return lib.cuGraphicsUnregisterResource(ffi.cast("CUgraphicsResource", resource))


def mapped_egl_frame(resource: int) -> tuple[str, int, int, int]:
    """Where the frame of a registered EGLImage lives (``cuGraphicsResourceGetMappedEglFrame``):
    ``("array", CUarray, 0, color format)`` or ``("device", pointer, pitch, color format)``,
    with the frame's ``CUeglColorFormat``."""
    frame = ffi.new("CUeglFrame *")
    check(lib.cuGraphicsResourceGetMappedEglFrame(frame, ffi.cast("CUgraphicsResource", resource), 0, 0),
          "cuGraphicsResourceGetMappedEglFrame", "reading the image's CUDA frame")
    if frame.frameType == lib.CU_EGL_FRAME_TYPE_ARRAY:
        return ("array", address(frame.frame.pArray[0]), 0, frame.eglColorFormat)
    return ("device", address(frame.frame.pPitch[0]), frame.pitch, frame.eglColorFormat)


def map_array(resource: int, stream: int, level: int) -> int:
    """Map a registered GL texture on ``stream`` (``cuGraphicsMapResources``) and return the
    ``CUarray`` of mip ``level``; a map the driver gives no array for is undone before raising."""
    resources = _resources(resource)
    cu_stream = ffi.cast("CUstream", stream)
    check(lib.cuGraphicsMapResources(1, resources, cu_stream), "cuGraphicsMapResources",
          "mapping the image's GL texture")
    array = ffi.new("CUarray *")
    status = lib.cuGraphicsSubResourceGetMappedArray(array, resources[0], 0, level)
    if status:
        lib.cuGraphicsUnmapResources(1, resources, cu_stream)
        raise cuda_error(status, "cuGraphicsSubResourceGetMappedArray", "reading the mapped array")
    return address(array[0])


def unmap(resource: int, stream: int) -> None:
    """Unmap a registered GL texture on ``stream`` (orders the stream's work before later GL work)."""
    check(lib.cuGraphicsUnmapResources(1, _resources(resource), ffi.cast("CUstream", stream)),
          "cuGraphicsUnmapResources", "unmapping the image's GL texture")
