# Research record (see research/README.md): runs against the current package (import paths updated to eglcuda._bind).
"""Probe: how the driver treats frames of each format over an EGLStream (raw calls).

Prints what the consumer's mapped frame says (pitch, planes, channels) for frames presented with
a chosen geometry, whether each plane's bytes arrive under the geometry we assume, how long an
acquire with no new frame takes and what it returns, and what the first return gives."""
import time

import _needs  # research/probes/_needs.py: a missing need is one line and status 2

_needs.answer_help(__doc__)
_needs.needs_cuda(__file__, "cuda", "cuda-stream")

import numpy as np

import eglcuda
from eglcuda._bind.cuda import check
from eglcuda.cuda_device import get_device
from eglcuda._bind.egl import int_attribs
from eglcuda._bind._native import ffi, lib

display = eglcuda.Display.for_cuda_device(0)
dev = get_device(0)
dev.make_current()
dpy = display.handle
rng = np.random.default_rng(1)

FMT = {
    "ARGB": (lib.CU_EGL_COLOR_FORMAT_ARGB, [(1, 1, 4)]),
    "L": (lib.CU_EGL_COLOR_FORMAT_L, [(1, 1, 1)]),
    "YUV420": (lib.CU_EGL_COLOR_FORMAT_YUV420_PLANAR, [(1, 1, 1), (2, 2, 1), (2, 2, 1)]),
    "NV12": (lib.CU_EGL_COLOR_FORMAT_YUV420_SEMIPLANAR, [(1, 1, 1), (2, 2, 2)]),
    "YUV444": (lib.CU_EGL_COLOR_FORMAT_YUV444_PLANAR, [(1, 1, 1), (1, 1, 1), (1, 1, 1)]),
}


def copy2d(dst_dev=None, dst_host=None, src_dev=None, src_host=None, width_bytes=0, height=0, src_pitch=0, dst_pitch=0,
           src_array=None, dst_array=None):
    c = ffi.new("CUDA_MEMCPY2D *")
    if src_host is not None:
        c.srcMemoryType = lib.CU_MEMORYTYPE_HOST; c.srcHost = ffi.from_buffer(src_host)
    elif src_array is not None:
        c.srcMemoryType = lib.CU_MEMORYTYPE_ARRAY; c.srcArray = src_array
    else:
        c.srcMemoryType = lib.CU_MEMORYTYPE_DEVICE; c.srcDevice = src_dev
    if dst_host is not None:
        c.dstMemoryType = lib.CU_MEMORYTYPE_HOST; c.dstHost = ffi.from_buffer(dst_host)
    elif dst_array is not None:
        c.dstMemoryType = lib.CU_MEMORYTYPE_ARRAY; c.dstArray = dst_array
    else:
        c.dstMemoryType = lib.CU_MEMORYTYPE_DEVICE; c.dstDevice = dst_dev
    c.srcPitch = src_pitch; c.dstPitch = dst_pitch; c.WidthInBytes = width_bytes; c.Height = height
    check(lib.cuMemcpy2D(c), "cuMemcpy2D")


def run(name, width, height, pitch_align=256, array=False, fifo=0):
    fmt, planes = FMT[name]
    attrs = [(lib.EGL_STREAM_FIFO_LENGTH_KHR, fifo)] if fifo else []
    stream = lib.eglCreateStreamKHR(dpy, int_attribs(attrs))
    assert stream != ffi.NULL
    cconn = ffi.new("CUeglStreamConnection *"); pconn = ffi.new("CUeglStreamConnection *")
    check(lib.cuEGLStreamConsumerConnect(cconn, stream), "consumer connect")
    check(lib.cuEGLStreamProducerConnect(pconn, stream, width, height), "producer connect")
    frame = ffi.new("CUeglFrame *")
    pitch0 = -(-width * planes[0][2] // pitch_align) * pitch_align
    datas, ptrs = [], []
    for i, (dx, dy, ch) in enumerate(planes):
        w, h = -(-width // dx), -(-height // dy)
        data = rng.integers(0, 256, (h, w * ch), dtype=np.uint8)
        datas.append(data)
        if array:
            desc = ffi.new("CUDA_ARRAY_DESCRIPTOR *", {"Width": w, "Height": h, "Format": lib.CU_AD_FORMAT_UNSIGNED_INT8, "NumChannels": ch})
            arr = ffi.new("CUarray *"); check(lib.cuArrayCreate(arr, desc), "cuArrayCreate")
            frame.frame.pArray[i] = arr[0]
            copy2d(dst_array=arr[0], src_host=data, width_bytes=w * ch, height=h, src_pitch=w * ch)
        else:
            pitch = pitch0 * w * ch // (width * planes[0][2]) if i else pitch0
            ptr = ffi.new("CUdeviceptr *"); check(lib.cuMemAlloc(ptr, pitch * h), "alloc")
            ptrs.append((ptr[0], pitch))
            frame.frame.pPitch[i] = ffi.cast("void *", ptr[0])
            copy2d(dst_dev=ptr[0], src_host=data, width_bytes=w * ch, height=h, src_pitch=w * ch, dst_pitch=pitch)
    frame.width, frame.height, frame.depth = width, height, 1
    frame.pitch = 0 if array else pitch0
    frame.planeCount = len(planes); frame.numChannels = planes[0][2]
    frame.frameType = lib.CU_EGL_FRAME_TYPE_ARRAY if array else lib.CU_EGL_FRAME_TYPE_PITCH
    frame.eglColorFormat = fmt; frame.cuFormat = lib.CU_AD_FORMAT_UNSIGNED_INT8
    cstream = ffi.new("CUstream *")
    r = lib.cuEGLStreamProducerPresentFrame(pconn, frame[0], cstream)
    res = ffi.new("CUgraphicsResource *")
    r2 = lib.cuEGLStreamConsumerAcquireFrame(cconn, res, cstream, 1000000)
    got = ffi.new("CUeglFrame *")
    r3 = lib.cuGraphicsResourceGetMappedEglFrame(got, res[0], 0, 0) if r2 == 0 else -1
    print(f"{name} {width}x{height} {'array' if array else 'pitch'}: present={r} acquire={r2} map={r3} "
          f"type={got.frameType} fmt={got.eglColorFormat} pitch={got.pitch} planes={got.planeCount} ch={got.numChannels} "
          f"w={got.width} h={got.height} depth={got.depth} cuFormat={got.cuFormat}")
    ok = []
    if r3 == 0:
        for i, (dx, dy, ch) in enumerate(planes):
            w, h = -(-width // dx), -(-height // dy)
            out = np.zeros((h, w * ch), np.uint8)
            if got.frameType == lib.CU_EGL_FRAME_TYPE_ARRAY:
                copy2d(dst_host=out, src_array=got.frame.pArray[i], width_bytes=w * ch, height=h, dst_pitch=w * ch)
            else:
                pitch_i = got.pitch * w * ch // (width * planes[0][2]) if i else got.pitch
                copy2d(dst_host=out, src_dev=int(ffi.cast("uintptr_t", got.frame.pPitch[i])), width_bytes=w * ch,
                       height=h, src_pitch=pitch_i, dst_pitch=w * ch)
            ok.append(bool((out == datas[i]).all()))
        print(f"   planes match under assumed geometry: {ok}")
    if r2 == 0:
        t = time.perf_counter()
        r4 = lib.cuEGLStreamConsumerAcquireFrame(cconn, res, cstream, 50000)
        print(f"   re-acquire with no release: {r4} after {1e3*(time.perf_counter()-t):.1f} ms")
        r5 = lib.cuEGLStreamConsumerReleaseFrame(cconn, res[0], cstream)
        t = time.perf_counter()
        r6 = lib.cuEGLStreamConsumerAcquireFrame(cconn, res, cstream, 50000)
        print(f"   release={r5}; acquire with no new frame: {r6} after {1e3*(time.perf_counter()-t):.1f} ms")
        if r6 == 0:
            lib.cuEGLStreamConsumerReleaseFrame(cconn, res[0], cstream)
    back = ffi.new("CUeglFrame *")
    t = time.perf_counter()
    r7 = lib.cuEGLStreamProducerReturnFrame(pconn, back, cstream)
    print(f"   first return: {r7} after {1e3*(time.perf_counter()-t):.1f} ms")
    state = ffi.new("EGLint *")
    lib.eglQueryStreamKHR(dpy, stream, lib.EGL_STREAM_STATE_KHR, state)
    print(f"   state {hex(state[0])}")
    print("   disconnect producer", lib.cuEGLStreamProducerDisconnect(pconn))
    t = time.perf_counter()
    r8 = lib.cuEGLStreamConsumerAcquireFrame(cconn, res, cstream, 50000)
    lib.eglQueryStreamKHR(dpy, stream, lib.EGL_STREAM_STATE_KHR, state)
    print(f"   acquire after producer disconnect: {r8} after {1e3*(time.perf_counter()-t):.1f} ms, state {hex(state[0])}")
    if r8 == 0:
        lib.cuEGLStreamConsumerReleaseFrame(cconn, res[0], cstream)
    print("   disconnect consumer", lib.cuEGLStreamConsumerDisconnect(cconn))
    lib.eglDestroyStreamKHR(dpy, stream)
    for p, _ in ptrs:
        lib.cuMemFree(p)


for name in FMT:
    run(name, 64, 48)
run("YUV420", 33, 17, pitch_align=64)
run("NV12", 33, 17, pitch_align=64)
run("ARGB", 64, 48, array=True)
run("YUV420", 64, 48, array=True)
run("ARGB", 7, 5, pitch_align=1)
run("ARGB", 64, 48, fifo=4)

# reuse off
stream = lib.eglCreateStreamKHR(dpy, int_attribs([(lib.EGL_SUPPORT_REUSE_NV, 0)]))
print("create with SUPPORT_REUSE_NV=0:", stream != ffi.NULL, hex(lib.eglGetError()))
attr_stream = lib.eglCreateStreamAttribKHR(dpy, ffi.new("EGLAttrib[]", [lib.EGL_SUPPORT_REUSE_NV, 0, lib.EGL_NONE]))
print("createAttrib with SUPPORT_REUSE_NV=0:", attr_stream != ffi.NULL, hex(lib.eglGetError()))
# producer before consumer
s2 = lib.eglCreateStreamKHR(dpy, int_attribs([]))
pconn = ffi.new("CUeglStreamConnection *")
print("producer connect before consumer:", lib.cuEGLStreamProducerConnect(pconn, s2, 64, 48))
print("consumer connect with flags VIDMEM:", lib.cuEGLStreamConsumerConnectWithFlags(ffi.new("CUeglStreamConnection *"), lib.eglCreateStreamKHR(dpy, int_attribs([])), 1))
