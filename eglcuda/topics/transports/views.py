"""What a subscriber reads when a transport maps the publisher's pool slots into its process
(``cuda-ipc``, ``cuda-vmm``): :class:`SlotView`, with the same plane interface as
:class:`eglcuda.AcquiredFrame`."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..._bind import cuda
from ..._lifecycle import stay_if_ended_by_exit
from ...errors import ClosedError
from ...frames.formats import plane_geometry
from ...frames.frame import FrameBase, Plane
from .. import protocol
from .base import Geometry

if TYPE_CHECKING:
    from ...cuda_device import CudaDevice


class _ViewSpec:
    """What every view of one topic's slots shares (made once per subscription)."""

    __slots__ = ("geometry", "planes")

    def __init__(self, geometry: Geometry) -> None:
        self.geometry = geometry
        self.planes = plane_geometry(geometry.format, geometry.width, geometry.height, geometry.pitch)


class SlotView(FrameBase):
    """A read-only view of a publisher's pool slot, as a ``cuda-ipc`` subscriber receives it: the
    same plane interface as :class:`eglcuda.AcquiredFrame` (DLPack, ``__cuda_array_interface__``,
    ``to_numpy``), ordered on the subscriber's CUDA stream. Unusable once its message is released:
    the publisher may then write the slot again."""

    __slots__ = ("_spec", "_base", "device", "_stream", "_released", "slot", "_plane_cache", "_handed_to",
                 "_ring", "__weakref__")

    read_only = True

    def __init__(self, spec: _ViewSpec, base: int, device: "CudaDevice", stream: int | None, slot: int,
                 ring: Any = None) -> None:
        self._spec = spec
        # The subscriber's frame ring (its ``dropped()``): once the publisher dropped the subscriber
        # it may write the slot again, before the subscriber has read of the drop.
        self._ring = ring
        self._base = base
        self.device = device
        self.slot = slot
        self._stream = stream
        self._released = False
        # Made when first asked for: most frames' planes are read once or never.
        self._plane_cache: tuple[Plane, ...] | None = None
        self._handed_to: list[int] | None = None

    width = property(lambda self: self._spec.geometry.width)
    height = property(lambda self: self._spec.geometry.height)
    format = property(lambda self: self._spec.geometry.format)
    layout = property(lambda self: self._spec.geometry.layout)
    pitch = property(lambda self: self._spec.geometry.pitch)

    # FrameBase declares _planes as an attribute; a view computes it, read-only (as Frame does).
    @property
    def _planes(self) -> tuple[Plane, ...]:  # type: ignore[override]
        planes = self._plane_cache
        if planes is None:
            base = self._base
            planes = self._plane_cache = tuple(
                Plane(self, i, g, base + offset)
                for i, (g, offset) in enumerate(zip(self._spec.planes, self._spec.geometry.plane_offsets)))
        return planes

    @property
    def cuda_stream(self) -> int | None:
        """The subscriber's ``CUstream``: it waits for the publisher's work on this frame."""
        return self._stream

    @property
    def released(self) -> bool:
        return self._released

    def _check_usable(self) -> None:
        if self._released or (self._ring is not None and self._ring.dropped()):
            if self._released:
                error = ClosedError("the message was released (or the subscriber lost its publisher): the publisher "
                                    "may have written this slot again; receive a new message")
            else:
                error = ClosedError("the publisher dropped this subscriber and may have written this slot again: "
                                    "receive() says why")
            # (a daemon thread reading a message as the exit closes its subscriber waits to be
            # stopped with the interpreter, as in receive(), rather than die with a traceback)
            stay_if_ended_by_exit(error)
            raise error

    def __repr__(self) -> str:
        state = " released" if self._released else ""
        return f"<SlotView slot {self.slot} {self.width}x{self.height} {self.format.name}{state}>"


def join_readers(view: SlotView, own: int, cuda_stream: int | None) -> int:
    """At a release of ``view``: the stream its order goes on (``cuda_stream``, else the
    subscriber's own ``own``), made to wait, on the GPU, for the subscriber's stream and every
    stream the view was handed to that still has work queued (docs/ordering.md). Idle streams
    cost a query each; a view handed to nobody, released on its own stream, costs nothing."""
    stream = cuda_stream if cuda_stream is not None else own
    readers = view._handed_to
    if readers is not None or stream != own:
        view._handed_to = None
        view.device.make_current()
        try:
            cuda.join_streams(stream, (own, *(readers or ())), "ordering a release after the streams that read the frame")
        except BaseException:
            view._handed_to = readers  # (a release that failed here let go of nothing: a later one joins them)
            raise
    return stream


def unfit_for_cuda_views(backend: object) -> str | None:
    """Why a subscriber end cannot read mapped slots with CUDA at all (a transport's unfit)."""
    if getattr(backend, "consumer", None) is protocol.ConsumerKind.GL:
        return "a GL subscriber receives frames through an EGLStream (gl_context)"
    if getattr(backend, "device", None) is None:
        return "the subscriber has no CUDA device"
    return None
