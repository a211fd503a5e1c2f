# Research record (see research/README.md): runs against the current package (import paths updated to eglcuda._bind).
"""Probe: which one-channel 8-bit color formats a CUDA->CUDA EGLStream carries (raw calls)."""
import _needs  # research/probes/_needs.py: a missing need is one line and status 2

_needs.answer_help(__doc__)
_needs.needs_cuda(__file__, "cuda", "cuda-stream")

import eglcuda
from eglcuda._bind.cuda import check
from eglcuda.cuda_device import get_device
from eglcuda._bind.egl import int_attribs
from eglcuda._bind._native import ffi, lib

display = eglcuda.Display.for_cuda_device(0)
get_device(0).make_current()
for name, value in (("L", 0x08), ("R", 0x09), ("A", 0x10), ("Y", 0x52), ("YUV420_PLANAR 7x5", 0x00), ("NV12 7x5", 0x01)):
    odd = "7x5" in name
    width, height = (7, 5) if odd else (64, 48)
    stream = lib.eglCreateStreamKHR(display.handle, int_attribs([]))
    c, p = ffi.new("CUeglStreamConnection *"), ffi.new("CUeglStreamConnection *")
    check(lib.cuEGLStreamConsumerConnect(c, stream), "c")
    check(lib.cuEGLStreamProducerConnect(p, stream, width, height), "p")
    frame = ffi.new("CUeglFrame *")
    planes = 3 if value == 0 else 2 if value == 1 else 1
    for i in range(planes):
        ptr = ffi.new("CUdeviceptr *"); check(lib.cuMemAlloc(ptr, 256 * height), "alloc")
        frame.frame.pPitch[i] = ffi.cast("void *", ptr[0])
    frame.width, frame.height, frame.depth, frame.pitch = width, height, 1, 256
    frame.planeCount, frame.numChannels = planes, 1
    frame.frameType, frame.eglColorFormat, frame.cuFormat = lib.CU_EGL_FRAME_TYPE_PITCH, value, lib.CU_AD_FORMAT_UNSIGNED_INT8
    s = ffi.new("CUstream *")
    r1 = lib.cuEGLStreamProducerPresentFrame(p, frame[0], s)
    res = ffi.new("CUgraphicsResource *")
    r2 = lib.cuEGLStreamConsumerAcquireFrame(c, res, s, 200000) if r1 == 0 else -1
    got = ffi.new("CUeglFrame *")
    r3 = lib.cuGraphicsResourceGetMappedEglFrame(got, res[0], 0, 0) if r2 == 0 else -1
    print(f"{name}: present {r1} acquire {r2} map {r3} -> fmt 0x{got.eglColorFormat:x} w {got.width} h {got.height} "
          f"pitch {got.pitch} planes {got.planeCount} type {got.frameType}")
    lib.cuEGLStreamProducerDisconnect(p); lib.cuEGLStreamConsumerDisconnect(c); lib.eglDestroyStreamKHR(display.handle, stream)
