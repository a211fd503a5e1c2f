"""The backends of real GPUs: :class:`CudaPublisherBackend` (pool frames from
:meth:`eglcuda.Frame.allocate`, one transport of each registered kind) and
:class:`CudaSubscriberBackend` (the subscriber's device, stream, display, and its end of the
transport the publisher chose). The CPU tests inject backends whose transport moves no GPU memory
(tests/topics_null.py)."""
from __future__ import annotations

from typing import Any, Sequence

from ..._bind import cuda, cuda_egl, cuda_ipc
from ...context import GLContext
from ...cuda_device import CudaDevice, get_device
from ...display import Display
from ...errors import EglCudaError, UsageError
from ...frames.formats import ColorFormat, Layout
from ...frames.frame import Frame
from ...frames.interop import stream_handle
from .. import protocol
from .base import DeviceIdentity, Geometry, PublisherBackend, PublisherTransport, SubscriberBackend, SubscriberTransport
from . import registry


class CudaPublisherBackend(PublisherBackend):
    """A publisher on a CUDA device: the registered transports ``offer`` names (the registry's
    rule, :func:`~eglcuda.topics.transports.registry.offer`, chose them), and pool frames from
    :meth:`eglcuda.Frame.allocate` unless one of them needs its own kind of memory (``cuda-vmm``)."""

    def __init__(self, device: "int | CudaDevice", offer: registry.Offer) -> None:
        self.device = get_device(device)
        self.identity = DeviceIdentity.of(self.device)
        self.offer = offer.on_integrated_gpu() if self.identity.integrated else offer
        self.geometry_spec: Geometry | None = None
        self._uuids: dict[bytes, int] | None = None
        self._transports = [spec.publisher(self) for spec in offer.specs]

    def allocate(self, width: int, height: int, format: ColorFormat, layout: Layout) -> Any:
        for transport in self._transports:
            frame = transport.allocate(width, height, format, layout)
            if frame is not None:
                return frame
        return Frame.allocate(width, height, format, layout, self.device)

    def geometry(self, frame: Any) -> Geometry:
        if frame.layout is Layout.PITCH:
            base = frame.planes[0].pointer
            offsets = tuple(plane.pointer - base for plane in frame.planes)
        else:
            offsets = tuple(0 for _ in frame.planes)
        self.geometry_spec = Geometry(frame.width, frame.height, frame.format, frame.layout, frame.pitch, offsets)
        return self.geometry_spec

    def order_writes(self, frame: Any, stream: int | None) -> None:
        writers = frame._handed_to
        if writers is not None:
            frame._handed_to = None
            self.device.make_current()
            cuda.join_streams(stream or 0, writers, "ordering a publish after the streams that wrote the frame")

    def forget_writes(self, frame: Any) -> None:
        writers = frame._handed_to
        if writers is not None:
            self.device.make_current()
            for stream in writers:
                cuda.stream_synchronize(stream, "discarding a frame: waiting for the streams that wrote it")
            frame._handed_to = None

    def free(self, frame: Any) -> None:
        frame.close()

    def transports(self) -> Sequence[PublisherTransport]:
        return self._transports

    def not_offered(self, name: str) -> str:
        return self.offer.refusal(name)

    def ordinal_of(self, uuid: bytes) -> int | None:
        """This process's CUDA ordinal of the GPU with ``uuid`` (None: not visible here)."""

        if self._uuids is None:
            found = {}
            for ordinal in range(cuda.device_count()):
                found[cuda.instance_uuid(cuda.device_get(ordinal))] = ordinal
            self._uuids = found
        return self._uuids.get(uuid)

    def can_access_peer(self, ordinal: int, peer: int) -> bool:
        return cuda_ipc.can_access_peer(cuda.device_get(ordinal), cuda.device_get(peer))

    def close(self) -> None:
        for transport in self._transports:
            transport.close()


class CudaSubscriberBackend(SubscriberBackend):
    """A subscriber on a CUDA device (or a GL subscriber, with ``gl_context``)."""

    def __init__(self, device: "int | CudaDevice", gl_context: "GLContext | None" = None,
                 cuda_stream: Any = None) -> None:

        self.gl_context = gl_context
        self._display: Display | None = None
        self.device: CudaDevice | None
        if gl_context is not None:

            if not isinstance(gl_context, GLContext):
                raise UsageError(f"gl_context must be an eglcuda.GLContext, got {type(gl_context).__name__}")
            ordinal = gl_context.display.cuda_ordinal
            self.consumer = protocol.ConsumerKind.GL
            if ordinal is None:
                self.device = None
                self.identity = DeviceIdentity(-1)
                self.cuda_stream = None
                self.owns_stream = False
                return
            device = ordinal
        else:
            self.consumer = protocol.ConsumerKind.CUDA
        self.device = get_device(device)
        self.identity = DeviceIdentity.of(self.device)
        self.device.make_current()
        self.owns_stream = cuda_stream is None and gl_context is None
        if self.owns_stream:
            self.cuda_stream = cuda_egl.stream_create()
        else:
            self.cuda_stream = None if cuda_stream is None else stream_handle(cuda_stream)

    def wishes(self, requested: str) -> tuple[str, ...]:
        if requested == "auto":
            return tuple(spec.name for spec in registry.registered()
                         if spec.unfit(self) is None and (spec.on_integrated or not self.identity.integrated))
        spec = registry.get(requested)
        why = None if spec is None else spec.unfit(self)
        if why is not None:
            raise UsageError(f"transport={requested!r} is not possible for this subscriber: {why}")
        return (requested,)

    def display(self) -> Display:
        if self.gl_context is not None:
            return self.gl_context.display
        if self._display is None:
            if self.device is None:  # (only a GL subscriber is without a device)
                raise UsageError("a subscriber without a CUDA device has no display of its own")
            self._display = Display.for_cuda_device(self.device.ordinal)
        return self._display

    def transport(self, name: str, welcome: protocol.Welcome, qos: protocol.Qos, queue: int) -> SubscriberTransport:
        spec = registry.get(name)
        if spec is None:
            raise protocol.ProtocolError(f"the publisher chose transport {name!r}, which this subscriber did not ask for")
        why = spec.unfit(self)
        if why is not None:
            raise protocol.ProtocolError(f"{name} offered to a subscriber that cannot use it: {why}")
        return spec.subscriber(self, welcome, qos, queue)

    def close(self) -> None:

        if self.owns_stream and self.cuda_stream and self.device is not None:  # (an own stream has a device)
            self.device.make_current()
            try:
                cuda_egl.stream_destroy(self.cuda_stream)
            except EglCudaError:  # pragma: no cover - teardown goes on
                pass
            self.cuda_stream = None
        display, self._display = self._display, None
        if display is not None:
            display.close()
