# Type stub of the compiled module eglcuda.frames._core (_core.pyx): what Python code sees.
from typing import Any

from .._resource import Resource

class ProducerLink:
    """Shared by a producer and every frame it presented: ``connected`` turns False when the
    producer disconnects."""

    connected: bool

class FrameCore(Resource):
    """Base of :class:`eglcuda.Frame`: the driver's description of the frame and the producers
    it was presented on."""

    _sources: tuple[Any, ...]
    @property
    def key(self) -> int: ...
    def _describe(self, array: bool, plane_addresses: tuple[int, ...], width: int, height: int, pitch: int,
                  channels: int, color_format: int) -> None: ...
    @property
    def _egl_address(self) -> int: ...
    @property
    def presented(self) -> bool: ...
    def _drop_disconnected_links(self) -> None: ...

def make_capsule(owner: Any, data: int, device_id: int, shape: tuple[int, ...], strides: tuple[int, ...],
                 read_only: bool, versioned: bool) -> object:
    """A DLPack capsule of uint8 elements over ``data`` on CUDA device ``device_id``."""
