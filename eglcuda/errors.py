"""The exception hierarchy and the error-name tables.

Every error eglcuda raises derives from :class:`EglCudaError`. Driver refusals carry the code,
its name and the call that failed; missing features are :class:`Unsupported`, naming what is
missing and where.
"""
from __future__ import annotations

# EGL error codes (EGL 1.5 section 3.1, and the stream and device extensions).
EGL_ERROR_NAMES: dict[int, str] = {
    0x3000: "EGL_SUCCESS",
    0x3001: "EGL_NOT_INITIALIZED",
    0x3002: "EGL_BAD_ACCESS",
    0x3003: "EGL_BAD_ALLOC",
    0x3004: "EGL_BAD_ATTRIBUTE",
    0x3005: "EGL_BAD_CONFIG",
    0x3006: "EGL_BAD_CONTEXT",
    0x3007: "EGL_BAD_CURRENT_SURFACE",
    0x3008: "EGL_BAD_DISPLAY",
    0x3009: "EGL_BAD_MATCH",
    0x300A: "EGL_BAD_NATIVE_PIXMAP",
    0x300B: "EGL_BAD_NATIVE_WINDOW",
    0x300C: "EGL_BAD_PARAMETER",
    0x300D: "EGL_BAD_SURFACE",
    0x300E: "EGL_CONTEXT_LOST",
    0x321B: "EGL_BAD_STREAM_KHR",
    0x321C: "EGL_BAD_STATE_KHR",
    0x322B: "EGL_BAD_DEVICE_EXT",
}

# CUresult names used when libcuda is absent or cannot name a code itself (cuGetErrorName is
# preferred when it answers). Values from the CUDA driver API reference.
CUDA_ERROR_NAMES: dict[int, str] = {
    0: "CUDA_SUCCESS",
    1: "CUDA_ERROR_INVALID_VALUE",
    2: "CUDA_ERROR_OUT_OF_MEMORY",
    3: "CUDA_ERROR_NOT_INITIALIZED",
    4: "CUDA_ERROR_DEINITIALIZED",
    100: "CUDA_ERROR_NO_DEVICE",
    101: "CUDA_ERROR_INVALID_DEVICE",
    200: "CUDA_ERROR_INVALID_IMAGE",
    201: "CUDA_ERROR_INVALID_CONTEXT",
    205: "CUDA_ERROR_MAP_FAILED",
    206: "CUDA_ERROR_UNMAP_FAILED",
    207: "CUDA_ERROR_ARRAY_IS_MAPPED",
    208: "CUDA_ERROR_ALREADY_MAPPED",
    210: "CUDA_ERROR_ALREADY_ACQUIRED",
    211: "CUDA_ERROR_NOT_MAPPED",
    219: "CUDA_ERROR_INVALID_GRAPHICS_CONTEXT",
    300: "CUDA_ERROR_INVALID_SOURCE",
    400: "CUDA_ERROR_INVALID_HANDLE",
    401: "CUDA_ERROR_ILLEGAL_STATE",
    500: "CUDA_ERROR_NOT_FOUND",
    600: "CUDA_ERROR_NOT_READY",
    700: "CUDA_ERROR_ILLEGAL_ADDRESS",
    702: "CUDA_ERROR_LAUNCH_TIMEOUT",
    709: "CUDA_ERROR_CONTEXT_IS_DESTROYED",
    801: "CUDA_ERROR_NOT_SUPPORTED",
    805: "CUDA_ERROR_MPS_CONNECTION_FAILED",
    806: "CUDA_ERROR_MPS_RPC_FAILURE",
    807: "CUDA_ERROR_MPS_SERVER_NOT_READY",
    808: "CUDA_ERROR_MPS_MAX_CLIENTS_REACHED",
    809: "CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED",
    810: "CUDA_ERROR_MPS_CLIENT_TERMINATED",
    999: "CUDA_ERROR_UNKNOWN",
}


# OpenGL error codes (glGetError; OpenGL 4.6 section 2.3.1).
GL_ERROR_NAMES: dict[int, str] = {
    0x0500: "GL_INVALID_ENUM",
    0x0501: "GL_INVALID_VALUE",
    0x0502: "GL_INVALID_OPERATION",
    0x0503: "GL_STACK_OVERFLOW",
    0x0504: "GL_STACK_UNDERFLOW",
    0x0505: "GL_OUT_OF_MEMORY",
    0x0506: "GL_INVALID_FRAMEBUFFER_OPERATION",
    0x0507: "GL_CONTEXT_LOST",
}


def egl_error_name(code: int) -> str:
    """The EGL name of an error code, or its hex value if EGL defines no such code."""
    return EGL_ERROR_NAMES.get(code, f"EGL error 0x{code:04X}")


def gl_error_name(code: int) -> str:
    """The OpenGL name of a ``glGetError`` code, or its hex value if GL defines no such code."""
    return GL_ERROR_NAMES.get(code, f"GL error 0x{code:04X}")


def cuda_error_name(code: int) -> str:
    """The CUresult name of a code from the built-in table (see also ``CUDAError.name``)."""
    return CUDA_ERROR_NAMES.get(code, f"CUresult {code}")


def shown(value: object, limit: int = 60) -> str:
    """``value`` as an error message shows it: its ``repr``, cut to ``limit`` characters (an int
    of thousands of digits has a repr too long to read, or none at all)."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - (ValueError: an int past Python's digit limit; a broken __repr__)
        if isinstance(value, int):
            return f"{'a negative' if value < 0 else 'an'} int of {value.bit_length()} bits"
        name = type(value).__name__
        return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"
    return text if len(text) <= limit else text[:limit - 3] + "..."


class EglCudaError(Exception):
    """Base class of every error raised by eglcuda.

    Every eglcuda error pickles and copies as it was raised (message, class and attributes), so
    one raised in a worker process reaches the parent of a ``multiprocessing`` pool intact.
    """

    def __reduce__(self) -> tuple[object, ...]:
        # Subclasses take their own arguments (a code, a call) and hand Exception only the
        # message, so rebuilding by calling the class with ``args`` would fail or garble it.
        return (_rebuilt_error, (type(self), self.args, self.__dict__))


def _rebuilt_error(cls: type[EglCudaError], args: tuple[object, ...], state: dict[str, object]) -> EglCudaError:
    """An unpickled or copied eglcuda error: its message and attributes, no ``__init__`` again."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class EGLError(EglCudaError):
    """An EGL call failed; ``code`` is what ``eglGetError()`` said right after it."""

    def __init__(self, code: int, call: str, doing: str = "") -> None:
        self.code = code
        self.name = egl_error_name(code)
        self.call = call
        detail = f" while {doing}" if doing else ""
        super().__init__(f"{call} failed with {self.name} (0x{code:04X}){detail}")


class CUDAError(EglCudaError):
    """A CUDA driver call returned an error ``CUresult``."""

    def __init__(self, code: int, call: str, name: str | None = None, description: str = "", doing: str = "") -> None:
        self.code = code
        self.name = name or cuda_error_name(code)
        self.call = call
        detail = f" while {doing}" if doing else ""
        extra = f": {description}" if description else ""
        super().__init__(f"{call} failed with {self.name} ({code}){extra}{detail}")


class GLError(EglCudaError):
    """An OpenGL call eglcuda made failed; ``code`` is what ``glGetError()`` said right after it."""

    def __init__(self, code: int, call: str, doing: str = "") -> None:
        self.code = code
        self.name = gl_error_name(code)
        self.call = call
        detail = f" while {doing}" if doing else ""
        super().__init__(f"{call} failed with {self.name} (0x{code:04X}){detail}")


class VulkanError(EglCudaError):
    """A Vulkan call failed (eglcuda uses Vulkan only to make the semaphore CUDA signals and GL
    waits on); ``code`` is the ``VkResult``."""

    def __init__(self, call: str, code: int) -> None:
        self.call = call
        self.code = code
        super().__init__(f"{call} failed with VkResult {code}")


class Unsupported(EglCudaError):
    """A library, extension or driver entry point this operation needs is not there.

    ``missing`` names it (``"libEGL.so.1"``, ``"EGL_KHR_stream"``, ``"cuEventCreateFromEGLSync"``);
    ``where`` says on which display or driver.
    """

    def __init__(self, missing: str, where: str = "", hint: str = "") -> None:
        self.missing = missing
        self.where = where
        self.hint = hint
        text = f"{missing} is not available"
        if where:
            text += f" on {where}"
        if hint:
            text += f"; {hint}"
        super().__init__(text)


class ClosedError(EglCudaError, ValueError):
    """An object was used after ``close()`` (or after the parent it depends on was closed)."""


class UsageError(EglCudaError, ValueError):
    """Bad input or a call out of order, caught before anything reached the driver."""


class Timeout(EglCudaError, TimeoutError):
    """A wait ran out of time."""


class StreamDisconnected(EglCudaError):
    """The other end of an EGLStream is gone (disconnected, or its process died)."""


class NotCoherent(EglCudaError):
    """A CUDA view that would not alias its GL or EGL object (writes on one side would not reach
    the other) was asked for; eglcuda refuses instead of handing back wrong data."""


class PeerError(EglCudaError, ConnectionError):
    """The process on the other side of a stream hand-over went away, or is not eglcuda."""


class MPSError(EglCudaError):
    """A CUDA MPS control daemon could not be started, used or stopped (:mod:`eglcuda.mps`);
    ``log`` holds the last lines of its log when there is one."""

    def __init__(self, message: str, log: str = "") -> None:
        self.log = log
        super().__init__(message + (f"; its log:\n{log}" if log else ""))


class MPSInUse(MPSError):
    """Another MPS control daemon already serves this machine; the message says how to use it.
    ``pipe_directory`` is its pipe directory (None when it cannot be read)."""

    def __init__(self, message: str, pipe_directory: str | None = None) -> None:
        self.pipe_directory = pipe_directory
        super().__init__(message)


class Dropped(StreamDisconnected):
    """A topic's publisher dropped this subscriber, or closed, or a subscriber left: ``reason``
    says why (in words), ``code`` is the protocol's reason code (see :mod:`eglcuda.topics`)."""

    def __init__(self, reason: str, code: int = 0) -> None:
        self.reason = reason
        self.code = code
        super().__init__(reason)


class Refused(PeerError):
    """A topic's publisher turned this subscriber away at the handshake (wrong user, no common
    transport, a topic name or protocol version that does not match, or, once the subscriber's
    timeout has passed, a publisher still too busy with other handshakes); ``reason`` says why."""

    def __init__(self, reason: str, code: int = 0) -> None:
        self.reason = reason
        self.code = code
        super().__init__(reason)


class MismatchedSource(UsageError):
    """A source that cannot join the others: an :class:`eglcuda.Batcher` batches frames of one
    size, format and CUDA device, and the message names both sides."""
