"""The ``cuda-vmm`` transport: pool memory shared as file descriptors (CUDA virtual memory
management), on discrete GPUs and on Jetson (Orin), where legacy CUDA IPC is not available, and in
containers without a shared IPC namespace.

- **Memory.** Each pool slot is its own ``cuMemCreate`` allocation of the POSIX file-descriptor
  handle type, mapped in the publisher (:func:`allocate_frame`, which the backend calls when the
  publisher offers this transport). It is exported once as a descriptor
  (``cuMemExportToShareableHandle``), and the descriptor travels with the slot's SLOT message
  (``SCM_RIGHTS``): once per slot and subscriber. The subscriber imports, reserves, maps and
  grants its device access (``cuMemImportFromShareableHandle``, ``cuMemMap``,
  ``cuMemSetAccess``) and closes the descriptor. A descriptor is a capability: only the process it
  was sent to can map the memory (a legacy CUDA IPC handle is 64 bytes that any process learning
  them can open: docs/security.md). A subscriber killed loses its mappings with its process.
- **Order.** Without interprocess events (which Tegra does not have), order is kept on the host,
  and only when there is GPU work to wait for: a publish whose stream (or a stream the frame was
  handed to) still has work queued synchronizes that stream before the FRAME message goes out; a
  release whose streams still have work queued synchronizes the subscriber's stream (which first
  waits for the others, docs/ordering.md) before the RELEASE goes out. A frame written and read
  without GPU work still queued at those moments costs one ``cuStreamQuery`` each. The publisher
  never waits for another process.
"""
from __future__ import annotations

import os
import struct
import time
import weakref
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ..._bind import cuda, cuda_vmm
from ...cuda_device import CudaDevice
from ...errors import EglCudaError, PeerError, UsageError
from ...frames.formats import PLANE_ALIGNMENT, ColorFormat, Layout, default_pitch, linear_layout
from ...frames.frame import Frame
from .. import protocol
from .base import NO_UUID, UNMAP_WAIT_S, Geometry, PublisherLink, PublisherTransport, SubscriberTransport
from .registry import VMM_MEMORY, TransportSpec, register
from .views import SlotView, _ViewSpec, join_readers, unfit_for_cuda_views

if TYPE_CHECKING:
    from .backends import CudaPublisherBackend, CudaSubscriberBackend

CUDA_VMM = "cuda-vmm"
_VMM_SLOT = struct.Struct("<Q")  # the allocation's size in bytes (its descriptor travels beside it)


# ==== the pool's memory ==============================================================================

class _Mapping:
    """A publisher's own mapping of a slot's allocation and the descriptor it exports; released
    once, when the frame that lives in it is collected or freed."""

    def __init__(self, address: int, size: int, handle: int, fd: int) -> None:
        self.address, self.size, self.handle, self.fd = address, size, handle, fd


def _unmap(device: CudaDevice, address: int, size: int, handle: int, fd: int) -> None:
    """Finalizer of a _Mapping: close the descriptor, unmap and release (never raises)."""
    try:
        os.close(fd)
        device.make_current()
        cuda_vmm.unmap_release(address, size, handle)
    except Exception:  # noqa: BLE001 - finalizers must not raise
        pass


def allocate_frame(device: CudaDevice, width: int, height: int, format: ColorFormat, layout: Layout) -> Frame:
    """A pool frame in its own shareable allocation (planes laid out as :meth:`Frame.allocate`
    lays them out). The frame keeps the mapping alive; the mapping goes with the frame."""
    if layout is not Layout.PITCH:
        raise UsageError("cuda-vmm shares pitch-linear frames only (layout='pitch')")
    pitch = default_pitch(format, width, PLANE_ALIGNMENT)
    offsets, total = linear_layout(format, width, height, pitch)
    device.make_current()
    step = cuda_vmm.granularity(device.ordinal)
    size = -(-total // step) * step
    handle = cuda_vmm.create(size, device.ordinal)
    address = None
    mapped = False
    try:
        address = cuda_vmm.reserve(size, step)
        cuda_vmm.map(address, size, handle)
        mapped = True
        cuda_vmm.set_access(address, size, device.ordinal)
        fd = cuda_vmm.export_fd(handle)
    except BaseException:
        try:  # undo what was done; the failure that stopped it is the one raised
            if mapped:
                cuda_vmm.unmap_release(address, size)  # type: ignore[arg-type]  # (set with mapped)
            elif address is not None:
                cuda_vmm.address_free(address, size)
            cuda_vmm.release(handle)
        except EglCudaError:
            pass
        raise
    mapping = _Mapping(address, size, handle, fd)
    weakref.finalize(mapping, _unmap, device, address, size, handle, fd)
    frame = Frame.from_pointer([address + o for o in offsets], width, height, pitch, format, device, owner=mapping)
    # (The transport reads the slot's descriptor here; a proxy: a frame the program still refers to
    # after its publisher closed keeps the mapping no more than a closed frame keeps its memory.)
    frame._vmm = weakref.proxy(mapping)  # type: ignore[attr-defined]
    return frame


# ==== the publisher's side ===========================================================================

class CudaVmmPublisher(PublisherTransport):
    name = CUDA_VMM

    def __init__(self, backend: "CudaPublisherBackend") -> None:
        self.backend = backend
        self.device = backend.device
        self._unavailable: str | None = None
        self._checked = False

    def _check_platform(self) -> str | None:
        if not self._checked:
            self._checked = True
            self._unavailable = cuda_vmm.supported(self.device.handle)
        return self._unavailable

    def refusal(self, hello: protocol.Hello, peer_pid: int) -> str | None:
        why = self._check_platform()
        if why is not None:
            return why
        if hello.consumer is not protocol.ConsumerKind.CUDA:
            return "a GL subscriber takes frames through an EGLStream"
        if hello.gpu_uuid == NO_UUID:
            return "the subscriber did not say which GPU it is on"
        if hello.gpu_uuid != self.backend.identity.uuid:
            return "the subscriber is on another GPU (cuda-vmm maps the pool on the publisher's GPU only)"
        return None

    def attach(self, hello: protocol.Hello, attach: protocol.Attach, fds: list[int], peer_pid: int) -> PublisherLink:
        if fds or attach.extra:
            raise PeerError("a cuda-vmm subscriber attaches without data or descriptors")
        return CudaVmmLink(self)

    def allocate(self, width: int, height: int, format: ColorFormat, layout: Layout) -> Any:
        return allocate_frame(self.device, width, height, format, layout)

    def on_publish(self, slot: Any, cuda_stream: int | None) -> None:
        # The subscriber reads as soon as the FRAME arrives: work still writing the frame ends
        # first (the publish stream waits for the frame's other writers already: order_writes).
        stream = cuda_stream or 0
        self.device.make_current()
        if not cuda.stream_idle(stream):
            cuda.stream_synchronize(stream, "finishing the writes of a frame before cuda-vmm subscribers read it")


class CudaVmmLink(PublisherLink):
    transport: CudaVmmPublisher
    message_only = True
    plain_release = True

    def __init__(self, transport: CudaVmmPublisher) -> None:
        self.transport = transport

    def slot_extra(self, slot: Any) -> bytes | None:
        return _VMM_SLOT.pack(slot.frame._vmm.size)

    def slot_fds(self, slot: Any) -> Sequence[int]:
        return (slot.frame._vmm.fd,)

    def deliver(self, slot: Any, cuda_stream: int | None) -> None:
        pass  # the FRAME message is the hand-over

    def released(self, slot: Any, release: protocol.Release) -> bool:
        if release.extra or release.flags & protocol.RELEASE_RECORDED:
            raise PeerError("a cuda-vmm release carries no transport data")
        return True

    def close(self) -> None:
        pass  # the subscriber's mappings are its own: they go with its process or its close()


# ==== the subscriber's side ==========================================================================

class CudaVmmSubscriber(SubscriberTransport):
    name = CUDA_VMM

    def __init__(self, backend: "CudaSubscriberBackend", welcome: protocol.Welcome, qos: protocol.Qos | None = None,
                 queue: int = 1) -> None:
        self.geometry = Geometry.from_welcome(welcome)
        if self.geometry.layout is not Layout.PITCH:
            raise protocol.ProtocolError("a cuda-vmm topic must be pitch-linear")
        if backend.device is None:  # (the backend offers cuda-vmm only with a device)
            raise protocol.ProtocolError("cuda-vmm offered to a subscriber without a CUDA device")
        self._spec = _ViewSpec(self.geometry)
        self.device: CudaDevice = backend.device
        self.stream = backend.cuda_stream
        self._slot_bytes = self.geometry.plane_offsets[-1] + self._spec.planes[-1].nbytes
        self._slots: dict[int, tuple[int, int]] = {}  # slot -> (address, size)
        self._closed = False

    def on_slot(self, slot: protocol.Slot, fds: Sequence[int] = ()) -> None:
        if len(slot.extra) != _VMM_SLOT.size or len(fds) != 1:
            raise protocol.ProtocolError(f"a cuda-vmm SLOT carries {_VMM_SLOT.size} bytes and one descriptor, got "
                                         f"{len(slot.extra)} bytes and {len(fds)}")
        (size,) = _VMM_SLOT.unpack(slot.extra)
        if size < self._slot_bytes:
            raise protocol.ProtocolError(f"slot {slot.slot} is {size} bytes, its frame needs {self._slot_bytes}")
        if slot.slot in self._slots:
            raise protocol.ProtocolError(f"slot {slot.slot} described twice")
        self.device.make_current()
        self._slots[slot.slot] = (cuda_vmm.map_import(fds[0], size, self.device.ordinal), size)

    def take(self, frame: protocol.Frame, deadline: float,
             stop: Callable[[], bool] | None = None) -> tuple[Any, int | None]:
        entry = self._slots.get(frame.slot)
        if entry is None:
            raise protocol.ProtocolError(f"frame {frame.seq} is in slot {frame.slot}, which was never described")
        # (The publisher's writes landed before the FRAME went out: nothing to wait for here.)
        return SlotView(self._spec, entry[0], self.device, self.stream, frame.slot, self.ring), None

    def release(self, obj: Any, frame: protocol.Frame, cuda_stream: int | None) -> tuple[int, bytes]:
        obj._released = True
        if self._closed:
            return 0, b""
        # Every stream that may read the frame joins one, which the host then waits for when it
        # has work queued: the publisher may write the slot as soon as the RELEASE arrives.
        stream = join_readers(obj, self.stream or 0, cuda_stream)
        self.device.make_current()
        if not cuda.stream_idle(stream):
            cuda.stream_synchronize(stream, "finishing the reads of a frame before releasing it (cuda-vmm)")
        return protocol.RELEASE_TAKEN, b""

    def finish_reading(self, timeout: float) -> bool:
        return _wait_idle(self.device, self.stream or 0, timeout)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        slots, self._slots = self._slots, {}
        if not slots:
            return
        # Work queued on the slots must end before they are unmapped (bounded: a subscriber must
        # not hang on it; the mappings are then left to the process's end).
        if not _wait_idle(self.device, self.stream or 0, UNMAP_WAIT_S):
            return
        self.device.make_current()
        for address, size in slots.values():
            try:
                cuda_vmm.unmap_release(address, size)
            except EglCudaError:
                pass


def _wait_idle(device: CudaDevice, stream: int, timeout: float) -> bool:
    device.make_current()
    deadline = time.monotonic() + timeout
    while not cuda.stream_idle(stream):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.001)
    return True


# Offered when a publisher names it (Publisher(transports=...)): it makes the pool VMM memory, which
# the other built-in transports cannot serve (the registry's rule refuses them beside it).
register(TransportSpec(
    CUDA_VMM, CudaVmmPublisher, CudaVmmSubscriber, rank=20, unfit=unfit_for_cuda_views, offered=False,
    memory=VMM_MEMORY, memory_note="cuda-vmm shares VMM memory only (each pool frame its own cuMemCreate "
    "allocation, passed by file descriptor)",
    layouts=frozenset({Layout.PITCH}), layout_note="cuda-vmm shares pitch-linear frames only (layout='pitch')"))
