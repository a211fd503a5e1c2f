"""eglcuda: zero-copy frame streaming between CUDA, OpenGL and other processes through EGL.

Importing eglcuda loads no driver library: libEGL and libcuda are opened at first use, and a
missing one raises :class:`Unsupported` then.
"""
from ._context import GLContext
from ._cuda import CudaDevice, driver_version, get_device
from ._display import Device, Display, client_extensions, devices
from ._formats import ColorFormat, Layout, PlaneGeometry, plane_geometry
from ._frame import AcquiredFrame, Attach, Frame, MemoryKind, Plane
from ._image import CudaImage, Image, MappedImage, PathChoice, TextureFormat, TEXTURE_FORMATS, image_path, siblings_alias
from ._sync import (CudaWait, Sync, SyncKind, SyncPaths, cuda_wait_sync, gl_server_wait_path, sync_after_cuda,
                    sync_paths)
from ._glstream import GLFrame, GLSurfaceProducer, GLTextureConsumer
from ._share import acknowledge, offer_fd, receive_fd, receive_stream, serve_stream
from ._stream import CudaConsumer, CudaProducer, ResourceLocation, Stream, StreamState
from ._errors import (
    ClosedError,
    CUDAError,
    EGLError,
    EglCudaError,
    NotCoherent,
    PeerError,
    StreamDisconnected,
    Timeout,
    Unsupported,
    UsageError,
)

__version__ = "0.1.0"

__all__ = [
    "AcquiredFrame",
    "Attach",
    "MemoryKind",
    "CudaWait",
    "Sync",
    "SyncKind",
    "SyncPaths",
    "cuda_wait_sync",
    "sync_after_cuda",
    "sync_paths",
    "gl_server_wait_path",
    "CudaImage",
    "Image",
    "MappedImage",
    "NotCoherent",
    "PathChoice",
    "TEXTURE_FORMATS",
    "TextureFormat",
    "image_path",
    "siblings_alias",
    "ColorFormat",
    "CudaConsumer",
    "CudaProducer",
    "Frame",
    "Layout",
    "Plane",
    "PlaneGeometry",
    "ResourceLocation",
    "Stream",
    "StreamDisconnected",
    "StreamState",
    "plane_geometry",
    "PeerError",
    "acknowledge",
    "offer_fd",
    "receive_fd",
    "receive_stream",
    "serve_stream",
    "ClosedError",
    "CUDAError",
    "CudaDevice",
    "Device",
    "Display",
    "EGLError",
    "EglCudaError",
    "GLContext",
    "GLFrame",
    "GLSurfaceProducer",
    "GLTextureConsumer",
    "Timeout",
    "Unsupported",
    "UsageError",
    "client_extensions",
    "devices",
    "driver_version",
    "get_device",
]
