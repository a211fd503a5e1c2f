"""EGL devices and displays.

A :class:`Display` owns one reference to an initialized ``EGLDisplay``. EGL hands back the same
handle for the same device every time and ``eglTerminate`` is not reference counted, so eglcuda
counts references per handle: closing one :class:`Display` never pulls the handle from under
another one opened on the same device.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._bind import cuda as _cuda_driver
from ._bind import egl
from ._bind import loader as _loader
from ._integers import as_int
from ._resource import Resource
from .cuda_device import CudaDevice, get_device
from .errors import ClosedError, EGLError, Unsupported, UsageError

if TYPE_CHECKING:  # the annotations of the factories below; both layers sit above this one
    from .context import GLContext
    from .streams.stream import Stream

# Re-entrant: a Display's finalizer takes it, and the garbage collector may run that finalizer
# on a thread that holds it.
_refs_lock = threading.RLock()
_refs: dict[int, int] = {}  # EGLDisplay address -> number of open Display objects


def client_extensions() -> frozenset[str]:
    """The client extensions of the EGL library (empty if it has none to report)."""
    _loader.egl()
    extensions = egl.client_extensions()
    _loader.bind_egl_extensions(extensions)
    return extensions


@dataclass(frozen=True)
class Device:
    """One EGL device (``EGL_EXT_device_base``). EGL devices are never destroyed, so this holds
    no resource; open it with :meth:`Display.for_device`."""

    index: int
    handle_address: int
    extensions: frozenset[str]
    cuda_ordinal: int | None
    drm_node: str | None
    render_node: str | None
    vendor: str | None

    @property
    def handle(self) -> int:
        """The ``EGLDeviceEXT``, as an address (the same as :attr:`handle_address`)."""
        return self.handle_address

    @property
    def is_software(self) -> bool:
        return "EGL_MESA_device_software" in self.extensions

    def __str__(self) -> str:
        parts = [f"EGL device {self.index}"]
        if self.vendor:
            parts.append(self.vendor)
        if self.cuda_ordinal is not None:
            parts.append(f"CUDA {self.cuda_ordinal}")
        if self.drm_node:
            parts.append(self.drm_node)
        if self.is_software:
            parts.append("software")
        return ", ".join(parts)


def devices() -> list[Device]:
    """The EGL devices of this machine, in EGL's order (which is not CUDA's order)."""
    extensions = client_extensions()
    if not ({"EGL_EXT_device_enumeration", "EGL_EXT_device_base"} & extensions):
        raise Unsupported("EGL_EXT_device_enumeration", where="this EGL library (client extensions)")
    found = []
    for index, handle in enumerate(egl.query_devices()):
        dev_extensions = frozenset((egl.query_device_string(handle, egl.EXTENSIONS) or "").split())
        cuda_ordinal = None
        if "EGL_NV_device_cuda" in dev_extensions:
            cuda_ordinal = egl.query_device_attrib(handle, egl.CUDA_DEVICE_NV)
        drm = egl.query_device_string(handle, egl.DRM_DEVICE_FILE) if "EGL_EXT_device_drm" in dev_extensions else None
        render = (
            egl.query_device_string(handle, egl.DRM_RENDER_NODE_FILE)
            if "EGL_EXT_device_drm_render_node" in dev_extensions
            else None
        )
        vendor = egl.query_device_string(handle, egl.VENDOR) if "EGL_EXT_device_query_name" in dev_extensions else None
        found.append(Device(index, handle, dev_extensions, cuda_ordinal, drm, render, vendor))
    return found


def _terminate(handle_address: int) -> None:
    """Drop one reference; terminate the display when it was the last. Never raises."""
    try:
        with _refs_lock:
            count = _refs.get(handle_address, 0) - 1
            if count > 0:
                _refs[handle_address] = count
                return
            _refs.pop(handle_address, None)
        egl.terminate(handle_address)
    except Exception:  # pragma: no cover - finalizers must not raise
        pass


class Display(Resource):
    """An initialized EGL display. Make one with :meth:`for_cuda_device`, :meth:`for_device`,
    :meth:`surfaceless` or :meth:`default`; close it with :meth:`close` or a ``with`` block.

    Closing a display closes what was made from it (contexts, streams, images, syncs) first,
    newest first.
    """

    def __init__(self, handle: int, description: str, device: Device | None = None) -> None:
        version = egl.initialize(handle, f"initializing {description}")
        self._address = handle
        with _refs_lock:
            _refs[self._address] = _refs.get(self._address, 0) + 1
        self._own(_terminate, self._address)
        self.device = device
        self.description = description
        self.version: tuple[int, int] = version
        self.vendor: str = self._query_string(egl.VENDOR)
        self.client_apis: frozenset[str] = frozenset(self._query_string(egl.CLIENT_APIS).split())
        self.extensions: frozenset[str] = frozenset(self._query_string(egl.EXTENSIONS).split())
        self.client_extensions: frozenset[str] = client_extensions()
        _loader.bind_egl_extensions(self.extensions)

    # ---- construction ----------------------------------------------------------------------
    @classmethod
    def for_device(cls, device: Device) -> "Display":
        """Open the display of one EGL device (``EGL_EXT_platform_device``)."""
        if not isinstance(device, Device):
            raise UsageError(f"expected an eglcuda.Device, got {type(device).__name__}")
        if "EGL_EXT_platform_device" not in client_extensions():
            raise Unsupported("EGL_EXT_platform_device", where="this EGL library (client extensions)")
        handle = egl.platform_display(egl.PLATFORM_DEVICE, device.handle_address, f"opening {device}")
        return cls(handle, str(device), device)

    @classmethod
    def for_cuda_device(cls, ordinal: int = 0) -> "Display":
        """Open the EGL display of a CUDA device, matched through ``EGL_CUDA_DEVICE_NV``
        (EGL and CUDA enumerate GPUs in different orders on multi-GPU hosts)."""
        checked = as_int(ordinal)  # (a NumPy integer too)
        if checked is None or checked < 0:
            raise UsageError(f"a CUDA device ordinal is an int >= 0, got {ordinal!r}")
        ordinal = checked
        # The root cause first: without libcuda (a CPU machine) there is no CUDA device to match.
        _loader.cuda()
        found = devices()
        for device in found:
            if device.cuda_ordinal == ordinal:
                return cls.for_device(device)
        count = _cuda_driver.device_count()
        if ordinal >= count:
            raise Unsupported(f"CUDA device {ordinal}", where=f"this machine (the CUDA driver sees {count})")
        listed = ", ".join(str(d) for d in found) or "none"
        raise Unsupported(
            f"an EGL device for CUDA device {ordinal}",
            where=f"this machine (EGL devices: {listed})",
            hint="CUDA devices need NVIDIA's EGL (EGL_NV_device_cuda)",
        )

    @classmethod
    def surfaceless(cls) -> "Display":
        """Open Mesa's surfaceless platform display (``EGL_MESA_platform_surfaceless``)."""
        if "EGL_MESA_platform_surfaceless" not in client_extensions():
            raise Unsupported("EGL_MESA_platform_surfaceless", where="this EGL library (client extensions)")
        handle = egl.platform_display(egl.PLATFORM_SURFACELESS, 0, "opening the surfaceless display")
        return cls(handle, "surfaceless display")

    @classmethod
    def default(cls) -> "Display":
        """The display of CUDA device 0 if there is one, else the first EGL device, else the
        surfaceless display."""
        found = devices() if {"EGL_EXT_device_enumeration", "EGL_EXT_device_base"} & client_extensions() else []
        for device in found:
            if device.cuda_ordinal == 0:
                return cls.for_device(device)
        if found:
            return cls.for_device(found[0])
        return cls.surfaceless()

    # ---- queries ---------------------------------------------------------------------------
    def _query_string(self, name: int) -> str:
        return egl.query_string(self.handle, name, f"reading a string of {self.description}")

    @property
    def handle(self) -> int:
        """The raw ``EGLDisplay``, as an address; raises :class:`ClosedError` once closed."""
        if self.closed:
            raise ClosedError(f"{self.description} is closed")
        return self._address

    @property
    def cuda_ordinal(self) -> int | None:
        return self.device.cuda_ordinal if self.device else None

    def supports(self, name: str) -> bool:
        """Whether the display or the client lists extension ``name``. Never raises."""
        try:
            return not self.closed and (name in self.extensions or name in self.client_extensions)
        except Exception:
            return False

    def require(self, *names: str) -> None:
        """Raise :class:`Unsupported` naming the first extension of ``names`` that is missing."""
        if self.closed:
            raise ClosedError(f"{self.description} is closed")
        for name in names:
            if name not in self.extensions and name not in self.client_extensions:
                raise Unsupported(name, where=f"{self.description} ({self.vendor}, EGL {self.version[0]}.{self.version[1]})")

    # ---- children and lifetime -------------------------------------------------------------
    def cuda_device(self, device: "int | CudaDevice | None" = None) -> "CudaDevice":
        """``device`` as a :class:`CudaDevice`; None means this display's own CUDA device."""
        if device is None:
            device = self.cuda_ordinal
            if device is None:
                raise UsageError("this display belongs to no CUDA device; pass device=")
        return get_device(device)

    def create_context(self, **options) -> "GLContext":
        """A headless OpenGL context on this display; see :class:`eglcuda.GLContext`."""
        from .context import GLContext  # a factory for a layer above (contexts import this module)

        return GLContext(self, **options)

    def create_stream(self, **options) -> "Stream":
        """An EGLStream on this display; see :class:`eglcuda.Stream` for the options."""
        from .streams.stream import Stream  # a factory for a layer above (streams import this module)

        return Stream(self, **options)

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"EGL {self.version[0]}.{self.version[1]}, {self.vendor}"
        return f"<Display {self.description}: {state}>"


def check_display(display: object, what: str) -> None:
    """Raise :class:`UsageError` unless ``display`` is a :class:`Display` (before any EGL call)."""
    if not isinstance(display, Display):
        raise UsageError(f"{what} takes an eglcuda.Display, got {type(display).__name__}")


__all__ = ["Device", "Display", "EGLError", "client_extensions", "devices"]
