"""Run-time loading of libEGL and libcuda into the compiled function table.

Nothing is loaded at import. The first EGL (or CUDA) operation calls :func:`egl` (or
:func:`cuda`), which opens the library, binds the core entry points with ``dlsym`` and raises
:class:`Unsupported` with install advice if the library is not there. EGL extension functions are
bound with ``eglGetProcAddress`` only once a client or display extension string lists the
extension (:func:`bind_egl_extensions`): a non-NULL pointer alone proves nothing.

The GL library (``libOpenGL.so.0``, glvnd's desktop GL) is only looked for: PyOpenGL loads it
for the GL calls, and :func:`opengl_available` says beforehand whether it will find one.

Test hook: the environment variables ``EGLCUDA_LIBEGL``, ``EGLCUDA_LIBCUDA``,
``EGLCUDA_LIBVULKAN`` and ``EGLCUDA_LIBOPENGL``, when set (read at import), name the library file
to open instead of the default soname, e.g. the fake driver the CPU test tier builds
(tests/fakes/), or a file that does not exist to stand for a missing library. They are for
tests only: eglcuda does not check that the file is a real driver.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from ..errors import Unsupported
from ._native import ffi, lib

EGL_LIBRARY = "libEGL.so.1"
CUDA_LIBRARY = "libcuda.so.1"
VULKAN_LIBRARY = "libvulkan.so.1"
OPENGL_LIBRARY = "libOpenGL.so.0"
# PyOpenGL's EGL platform loads libOpenGL.so.0, else libGL.so.1 (glvnd's GLX library, which also
# dispatches to the EGL context that is current).
OPENGL_LIBRARIES = (OPENGL_LIBRARY, "libGL.so.1")
# What Mesa needs for eglcuda's EGL and GL steps without a GPU, in one place: every hint names it.
MESA_PACKAGES = "libegl1 libegl-mesa0 libgl1-mesa-dri libopengl0"
MESA_HINT = f"on Debian/Ubuntu: apt-get install {MESA_PACKAGES} (Mesa, no GPU needed)"
EGL_INSTALL_HINT = (
    f"install an EGL implementation: on Debian/Ubuntu 'apt-get install {MESA_PACKAGES}' "
    "(Mesa, no GPU needed), or the NVIDIA driver's EGL with the glvnd loader"
)
OPENGL_INSTALL_HINT = ("on Debian/Ubuntu: apt-get install libopengl0, glvnd's OpenGL library; the NVIDIA "
                       "driver's packages bring it too")
CUDA_INSTALL_HINT = "install the NVIDIA driver (libcuda.so.1 ships with it, not with the CUDA toolkit)"
VULKAN_INSTALL_HINT = "install the Vulkan loader (Debian/Ubuntu: 'apt-get install libvulkan1'); the NVIDIA driver brings the ICD"


@dataclass
class _Entry:
    index: int
    name: str
    symbol: str
    requires: tuple[str, ...]


@dataclass
class _Library:
    """One run-time library and which of its entries are bound."""

    soname: str
    handle: object = None
    error: str | None = None
    bound: set[str] = field(default_factory=set)
    missing: set[str] = field(default_factory=set)


def _read_entries() -> dict[str, _Entry]:
    entries = {}
    for index in range(lib.eglcuda_entry_count()):
        name = ffi.string(lib.eglcuda_entry_name(index)).decode()
        entries[name] = _Entry(
            index=index,
            name=name,
            symbol=ffi.string(lib.eglcuda_entry_symbol(index)).decode(),
            requires=tuple(ffi.string(lib.eglcuda_entry_requires(index)).decode().split("|")),
        )
    return entries


ENTRIES: dict[str, _Entry] = _read_entries()
_lock = threading.Lock()


def _fresh_lock_in_child() -> None:
    """In a child made by ``fork()``: a lock of its own. The parent's may have been held by a thread
    loading a library (one that does not exist in the child): the child's first EGL or CUDA call
    would wait for it forever. A load that thread had not finished is done again in the child."""
    global _lock
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_in_child)
_egl = _Library(os.environ.get("EGLCUDA_LIBEGL") or EGL_LIBRARY)
_cuda = _Library(os.environ.get("EGLCUDA_LIBCUDA") or CUDA_LIBRARY)
_vulkan = _Library(os.environ.get("EGLCUDA_LIBVULKAN") or VULKAN_LIBRARY)
_opengl_names = (os.environ["EGLCUDA_LIBOPENGL"],) if os.environ.get("EGLCUDA_LIBOPENGL") else OPENGL_LIBRARIES
_opengl: list[str] = []  # the first of _opengl_names that loads, once looked for; "" when none does


def _open(library: _Library, hint: str, group: str) -> _Library:
    with _lock:
        if library.handle is None and library.error is None:
            handle = lib.eglcuda_dlopen(library.soname.encode())
            if handle == ffi.NULL:
                library.error = ffi.string(lib.eglcuda_dlerror()).decode() or "not found"
            else:
                for entry in ENTRIES.values():
                    if group not in entry.requires:
                        continue
                    address = lib.eglcuda_dlsym(handle, entry.symbol.encode())
                    if address == ffi.NULL:
                        library.missing.add(entry.name)
                    else:
                        lib.eglcuda_bind(entry.index, address)
                        library.bound.add(entry.name)
                # Last: a library with a handle is bound (a child forked during the binding binds it again).
                library.handle = handle
    if library.handle is None:
        raise Unsupported(library.soname, where=f"this machine ({library.error})", hint=hint)
    return library


def egl() -> None:
    """Load libEGL and bind the EGL 1.5 core calls; raise :class:`Unsupported` if absent."""
    if _egl.handle is None:
        library = _open(_egl, EGL_INSTALL_HINT, "core")
        if library.missing:
            raise Unsupported(", ".join(sorted(library.missing)), where=f"{EGL_LIBRARY} (EGL 1.5 core)")


def cuda() -> None:
    """Load libcuda and bind what it exports; raise :class:`Unsupported` if absent."""
    if _cuda.handle is None:
        _open(_cuda, CUDA_INSTALL_HINT, "cuda")


def vulkan() -> None:
    """Load the Vulkan loader (only its ``vkGetInstanceProcAddr``; everything else is reached
    through it); raise :class:`Unsupported` if absent."""
    if _vulkan.handle is None:
        library = _open(_vulkan, VULKAN_INSTALL_HINT, "vulkan")
        if library.missing:
            raise Unsupported(", ".join(sorted(library.missing)), where=VULKAN_LIBRARY)


def load_failure(which: str) -> str | None:
    """Why ``which`` ("egl" or "cuda") did not load when it is there but broken (a dependency
    missing, not a library, the wrong architecture): the loader's words; None when it loaded, was
    not tried yet, or is not there at all."""
    library = {"egl": _egl, "cuda": _cuda}[which]
    error = library.error
    if error is None or (error.startswith(f"{library.soname}:") and "No such file" in error):
        return None
    return error


def egl_available() -> tuple[bool, str]:
    """Whether libEGL loads, and why not (never raises)."""
    try:
        egl()
    except Unsupported as exc:
        return False, str(exc)
    return True, ""


def cuda_available() -> tuple[bool, str]:
    """Whether libcuda loads, and why not (never raises)."""
    try:
        cuda()
    except Unsupported as exc:
        return False, str(exc)
    return True, ""


def opengl_available() -> tuple[bool, str]:
    """Whether a desktop GL library (``libOpenGL.so.0``, else ``libGL.so.1``) loads, which
    PyOpenGL needs for GL calls in EGL contexts; and what is missing if not (never raises).
    The library is opened once and left open; no function is bound from it."""
    with _lock:
        if not _opengl:
            found = ""
            for name in _opengl_names:
                if lib.eglcuda_dlopen(name.encode()) != ffi.NULL:
                    found = name
                    break
            _opengl.append(found)
    if _opengl[0]:
        return True, _opengl[0]
    return False, f"no {OPENGL_LIBRARY} on this machine ({OPENGL_INSTALL_HINT})"


def bind_egl_extensions(extensions: frozenset[str]) -> None:
    """Bind the functions of every listed extension that are not bound yet (EGL extensions from
    a display's or the client's string; GL extensions from the current GL context's list)."""
    egl()
    with _lock:
        for entry in ENTRIES.values():
            if entry.name in _egl.bound or {"core", "cuda", "vulkan"} & set(entry.requires):
                continue
            if not any(name in extensions for name in entry.requires):
                continue
            address = lib.eglGetProcAddress(entry.name.encode())
            if address != ffi.NULL:
                lib.eglcuda_bind(entry.index, address)
                _egl.bound.add(entry.name)


def is_bound(name: str) -> bool:
    """Whether the table holds an address for ``name`` (a declared C function)."""
    return bool(lib.eglcuda_is_bound(ENTRIES[name].index))


def require_cuda_entry(name: str) -> None:
    """Raise :class:`Unsupported` unless libcuda exports ``name``."""
    cuda()
    if not is_bound(name):
        raise Unsupported(name, where=f"this CUDA driver ({CUDA_LIBRARY})")
