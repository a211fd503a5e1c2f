"""eglcuda: zero-copy frame streaming between CUDA, OpenGL and other processes through EGL.

Importing eglcuda loads no driver library: libEGL and libcuda are opened at first use, and a
missing one raises :class:`Unsupported` then.
"""
import os as _os
import sys as _sys

try:
    from ._bind import _native  # noqa: F401 - the compiled EGL/CUDA bindings every part uses
except ImportError as _missing:
    _where = _os.path.dirname(_os.path.abspath(__file__))
    _why = (f"eglcuda at {_where} has no compiled modules (a source tree that was not built): build it there "
            f"(pip install -e .), or run from another folder (or with python -P) to use the installed eglcuda")
    if _sys.argv[:1] == ["-m"]:  # (python -m eglcuda ...: one line, not a traceback)
        print(f"python -m eglcuda: {_why}", file=_sys.stderr)
        raise SystemExit(2) from None
    raise ImportError(_why) from _missing

from .context import GLContext
from .cuda_device import CudaDevice, driver_version, get_device
from .display import Device, Display, client_extensions, devices
from .errors import (
    ClosedError,
    CUDAError,
    Dropped,
    EGLError,
    EglCudaError,
    GLError,
    MPSError,
    MismatchedSource,
    MPSInUse,
    NotCoherent,
    PeerError,
    Refused,
    StreamDisconnected,
    Timeout,
    Unsupported,
    UsageError,
    VulkanError,
)
from .frames.formats import ColorFormat, Layout, PlaneGeometry, plane_geometry
from .frames.frame import Attach, Frame, MemoryKind, Plane
from .images.image import CudaImage, Image, ImagePath, MappedImage, TextureFormat, TEXTURE_FORMATS
from .images.paths import PathChoice, image_path, siblings_alias
from .streams.cuda import AcquiredFrame, CudaConsumer, CudaProducer
from .streams.gl import GLFrame, GLSurfaceProducer, GLTextureConsumer
from .streams.share import acknowledge, offer_fd, receive_fd, receive_stream, serve_stream
from .streams.stream import ResourceLocation, Stream, StreamState
from .topics import Batch, BatchFrame, BatchPlane, Batcher, Message, Publisher, Subscriber, SubscriberInfo, TopicInfo, WaitSet, list_topics
from .remote import Relay, RemoteInfo, RemoteSubscriber  # (ucxx not imported)
from .syncs.paths import ServerWaitPath, SyncPath, SyncPaths, gl_server_wait_path, sync_paths
from .syncs.sync import CudaWait, Sync, SyncKind, cuda_wait_sync, sync_after_cuda

from . import mps  # CUDA MPS: eglcuda.mps.MPSDaemon, under_mps (imports only errors and _bind)
from ._version import __version__
from .availability import available, require

__all__ = [
    "Batch",
    "BatchFrame",
    "BatchPlane",
    "Batcher",
    "MismatchedSource",
    "Relay",
    "RemoteInfo",
    "RemoteSubscriber",
    "available",
    "require",
    "AcquiredFrame",
    "Attach",
    "MemoryKind",
    "CudaWait",
    "Sync",
    "SyncKind",
    "SyncPath",
    "SyncPaths",
    "ServerWaitPath",
    "cuda_wait_sync",
    "sync_after_cuda",
    "sync_paths",
    "gl_server_wait_path",
    "CudaImage",
    "Image",
    "ImagePath",
    "MappedImage",
    "NotCoherent",
    "MPSError",
    "MPSInUse",
    "mps",
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
    "Dropped",
    "Message",
    "Publisher",
    "Refused",
    "Subscriber",
    "SubscriberInfo",
    "TopicInfo",
    "WaitSet",
    "list_topics",
    "CudaDevice",
    "Device",
    "Display",
    "EGLError",
    "EglCudaError",
    "GLError",
    "VulkanError",
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
    "__version__",
]
