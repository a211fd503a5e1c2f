"""The compiled declarations: every prototype is there, and the structs have the CUDA ABI layout."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from eglcuda._bind import loader as _loader
from eglcuda._bind._native import ffi, lib

from ..forking import said_in_forked_child

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
import build_ffi  # noqa: E402


def all_prototypes():
    return [p for name in build_ffi.HEADERS for p in build_ffi.parse_prototypes((ROOT / "csrc" / name).read_text())]


def test_every_declared_function_is_compiled_and_in_the_entry_table():
    prototypes = all_prototypes()
    assert len(prototypes) > 80
    assert sorted(_loader.ENTRIES) == sorted(p.name for p in prototypes)
    for p in prototypes:
        assert hasattr(lib, p.name), p.name
        assert ffi.typeof(getattr(lib, p.name)).kind == "function"


def test_requires_groups_name_core_cuda_vulkan_or_extensions():
    for entry in _loader.ENTRIES.values():
        for group in entry.requires:
            assert group in ("core", "cuda", "vulkan") or group.startswith(("EGL_", "GL_")), (entry.name, group)


def test_cuda_semaphore_structs_match_cuda_h():
    # Sizes and offsets of cuda.h's external-semaphore structs on 64-bit Linux.
    assert ffi.sizeof("CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC") == 96
    assert ffi.offsetof("CUDA_EXTERNAL_SEMAPHORE_HANDLE_DESC", "handle") == 8
    assert ffi.sizeof("CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS") == 144
    assert ffi.offsetof("CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS", "flags") == 72
    assert ffi.offsetof("VkSemaphoreGetFdInfoKHR", "semaphore") == 16
    assert ffi.offsetof("VkSemaphoreTypeCreateInfo", "initialValue") == 24


def test_versioned_cuda_symbols():
    # cuda.h maps these to _v2 ABI names; binding the unversioned name would call an old ABI.
    assert _loader.ENTRIES["cuMemAlloc"].symbol == "cuMemAlloc_v2"
    assert _loader.ENTRIES["cuMemcpy2DAsync"].symbol == "cuMemcpy2DAsync_v2"
    assert _loader.ENTRIES["cuDevicePrimaryCtxRelease"].symbol == "cuDevicePrimaryCtxRelease_v2"
    assert _loader.ENTRIES["cuStreamWaitValue32"].symbol == "cuStreamWaitValue32_v2"
    assert _loader.ENTRIES["cuEGLStreamProducerPresentFrame"].symbol == "cuEGLStreamProducerPresentFrame"


def test_egl_attrib_is_pointer_sized():
    assert ffi.sizeof("EGLAttrib") == ffi.sizeof("void *") == 8
    assert ffi.sizeof("EGLint") == 4
    assert ffi.sizeof("EGLTimeKHR") == 8


# Layouts from cudaEGL.h / cuda.h on LP64: CUeglFrame is a union of three pointers followed by nine
# 4-byte fields (60 bytes, padded to 64 for pointer alignment).
CUEGLFRAME_OFFSETS = {
    "frame": 0, "width": 24, "height": 28, "depth": 32, "pitch": 36, "planeCount": 40,
    "numChannels": 44, "frameType": 48, "eglColorFormat": 52, "cuFormat": 56,
}
CUDA_MEMCPY2D_OFFSETS = {
    "srcXInBytes": 0, "srcY": 8, "srcMemoryType": 16, "srcHost": 24, "srcDevice": 32, "srcArray": 40,
    "srcPitch": 48, "dstXInBytes": 56, "dstY": 64, "dstMemoryType": 72, "dstHost": 80, "dstDevice": 88,
    "dstArray": 96, "dstPitch": 104, "WidthInBytes": 112, "Height": 120,
}


def test_cueglframe_layout():
    assert ffi.sizeof("CUeglFrame") == 64
    for field, offset in CUEGLFRAME_OFFSETS.items():
        assert ffi.offsetof("CUeglFrame", field) == offset, field
    frame = ffi.new("CUeglFrame *")
    frame.frame.pPitch[2] = ffi.cast("void *", 0x1234)
    assert int(ffi.cast("uintptr_t", frame.frame.pArray[2])) == 0x1234  # a union, not a struct


def test_memcpy2d_and_array_descriptor_layout():
    assert ffi.sizeof("CUDA_MEMCPY2D") == 128
    for field, offset in CUDA_MEMCPY2D_OFFSETS.items():
        assert ffi.offsetof("CUDA_MEMCPY2D", field) == offset, field
    assert ffi.sizeof("CUDA_ARRAY_DESCRIPTOR") == 24
    assert ffi.offsetof("CUDA_ARRAY_DESCRIPTOR", "NumChannels") == 20


def test_resource_desc_layout():
    # cuda.h: an enum, a 128-byte union (reserved int[32]) aligned to 8, then flags.
    assert ffi.sizeof("CUDA_RESOURCE_DESC") == 144
    assert ffi.offsetof("CUDA_RESOURCE_DESC", "res") == 8
    assert ffi.offsetof("CUDA_RESOURCE_DESC", "flags") == 136


def test_vmm_struct_layouts():
    # cuda.h on LP64: two enums, CUmemLocation (8), the win32 metadata pointer, then allocFlags
    # (compressionType, gpuDirectRDMACapable, usage, reserved[4]: 8 bytes).
    assert ffi.sizeof("CUmemAllocationProp") == 32
    offsets = {"type": 0, "requestedHandleTypes": 4, "location": 8, "win32HandleMetaData": 16, "allocFlags": 24}
    for field, offset in offsets.items():
        assert ffi.offsetof("CUmemAllocationProp", field) == offset, field
    prop = ffi.new("CUmemAllocationProp *")
    base = int(ffi.cast("uintptr_t", prop))
    assert int(ffi.cast("uintptr_t", ffi.addressof(prop.allocFlags, "usage"))) - base == 26
    assert int(ffi.cast("uintptr_t", ffi.addressof(prop.allocFlags, "reserved"))) - base == 28
    assert ffi.sizeof("CUmemLocation") == 8 and ffi.sizeof("CUmemAccessDesc") == 12
    assert ffi.offsetof("CUmemAccessDesc", "flags") == 8
    assert ffi.sizeof("CUmemGenericAllocationHandle") == 8


@pytest.mark.parametrize(
    "name, value",
    [
        ("CU_EGL_COLOR_FORMAT_YUV420_PLANAR", 0x00), ("CU_EGL_COLOR_FORMAT_YUV420_SEMIPLANAR", 0x01),
        ("CU_EGL_COLOR_FORMAT_ARGB", 0x06), ("CU_EGL_COLOR_FORMAT_RGBA", 0x07), ("CU_EGL_COLOR_FORMAT_L", 0x08),
        ("CU_EGL_COLOR_FORMAT_R", 0x09), ("CU_EGL_COLOR_FORMAT_YUV444_PLANAR", 0x0A),
        ("CU_EGL_COLOR_FORMAT_ABGR", 0x0E), ("CU_EGL_COLOR_FORMAT_BGRA", 0x0F),
        ("CU_EGL_FRAME_TYPE_ARRAY", 0), ("CU_EGL_FRAME_TYPE_PITCH", 1),
        ("CU_EGL_RESOURCE_LOCATION_SYSMEM", 0), ("CU_EGL_RESOURCE_LOCATION_VIDMEM", 1),
        ("EGL_STREAM_STATE_DISCONNECTED_KHR", 0x321A), ("EGL_SUPPORT_REUSE_NV", 0x3335),
        ("EGL_STREAM_FIFO_LENGTH_KHR", 0x31FC), ("EGL_CUDA_DEVICE_NV", 0x323A),
        ("EGL_SYNC_CUDA_EVENT_NV", 0x323C), ("EGL_GL_TEXTURE_2D_KHR", 0x30B1),
        ("CU_MEM_ALLOCATION_TYPE_PINNED", 1), ("CU_MEM_LOCATION_TYPE_DEVICE", 1),
        ("CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR", 1), ("CU_MEM_ACCESS_FLAGS_PROT_READWRITE", 3),
        ("CU_MEM_ALLOC_GRANULARITY_MINIMUM", 0), ("CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", 102),
        ("CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED", 103),
    ],
)
def test_constants(name, value):
    assert getattr(lib, name) == value


def test_import_loads_no_driver_library_and_unbound_calls_fail_cleanly():
    # A fresh interpreter: importing eglcuda must not open libEGL or libcuda, and a call through an
    # unfilled slot must return a failure (CUDA_ERROR_NOT_FOUND, EGL_FALSE), not crash.
    code = (
        "import eglcuda\n"
        "from eglcuda._bind._native import ffi, lib\n"
        "maps = open('/proc/self/maps').read()\n"
        "assert 'libEGL' not in maps and 'libcuda' not in maps, 'loaded at import'\n"
        "out = ffi.new('int *')\n"
        "assert lib.cuDriverGetVersion(out) == 500\n"
        "assert lib.eglInitialize(ffi.NULL, ffi.NULL, ffi.NULL) == 0\n"
        "assert lib.eglGetProcAddress(b'eglInitialize') == ffi.NULL\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_a_child_forked_while_a_thread_loads_a_library_can_load_them():
    """The loader's lock held by a thread loading a library (the first EGL or CUDA use, one of the
    probes of eglcuda.available()) when another thread forked: in the child, the first EGL or CUDA
    call and every later look for a GL library waited for it forever."""
    import threading

    holding, leave = threading.Event(), threading.Event()

    def load() -> None:  # (what a thread inside _open does, as long as the test needs)
        with _loader._lock:
            holding.set()
            leave.wait(30)

    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    try:
        assert holding.wait(30)
        def report() -> str:
            answers = (_loader.opengl_available(), _loader.egl_available(), _loader.cuda_available())
            return repr([ok for ok, _ in answers])

        code, said = said_in_forked_child(report)
        assert code == 0, f"the child's loader calls hung (status {code})"
        leave.set()
        loader.join(30)
        assert said == repr([_loader.opengl_available()[0], _loader.egl_available()[0], _loader.cuda_available()[0]])
    finally:
        leave.set()
        loader.join(30)


def test_a_child_forked_while_a_thread_is_inside_cuinit_is_told_it_cannot_use_cuda(monkeypatch):
    """A thread inside cuInit (which can take seconds) when another thread forked: the child's first
    CUDA call waited forever on the init lock (or, with no libcuda, said libcuda was missing);
    it is the forked-child UsageError, as for a child of a process that had initialized CUDA."""
    import threading

    from eglcuda._bind import cuda as _cuda
    from eglcuda.errors import UsageError

    inside, leave = threading.Event(), threading.Event()
    # (As in a process whose first cuInit is still under way: one that initialized CUDA before,
    # an earlier test's, tells a forked child so whatever the lock does.)
    monkeypatch.setattr(_cuda, "_initialized", False)

    def initialize() -> None:  # (what a thread inside cuInit does, as long as the test needs)
        with _cuda._init_lock:
            _cuda._initializing = True
            try:
                inside.set()
                leave.wait(30)
            finally:
                _cuda._initializing = False

    thread = threading.Thread(target=initialize, daemon=True)
    thread.start()
    try:
        assert inside.wait(30)
        def report() -> str:
            try:
                _cuda.init()
                return "initialized"
            except UsageError as exc:
                return "forked child" if str(exc) == _cuda.FORKED_CHILD else f"UsageError: {exc}"
            except Exception as exc:
                return f"{type(exc).__name__}: {exc}"

        code, said = said_in_forked_child(report)
        assert code == 0, f"the child's init() hung (status {code})"
        assert said == "forked child", said
    finally:
        leave.set()
        thread.join(30)
