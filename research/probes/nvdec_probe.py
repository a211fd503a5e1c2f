# Research record (see research/README.md): open, not yet run (written 2026-11-23 without a GPU; needs PyNvVideoCodec and tests/data, not eglcuda).
"""Probe: what PyNvVideoCodec (NVDEC) gives us, before eglcuda publishes its frames.

NOT YET RUN (written without a GPU). Answers, for the video pipeline (docs/video.md), in one run:
1. stream info from the built-in demuxer (Width/Height/FrameRate/codec/chroma/bit depth);
2. the decoded NV12 frame: DLPack shape/strides, plane pointers, pitch, CAI of both planes,
   and whether every frame's index band and digests match tests/data/clips.json
   (NVDEC vs the CPU decoder, bit for bit);
3. surface reuse: does a frame returned by Decode() change when later packets are decoded,
   after how many Decode() calls, and how many distinct output buffers the decoder cycles;
4. GetNumDecodedFrame + GetLockedFrame / UnlockFrame: do locked frames survive later decodes;
5. context: is the decoder's output memory in the device's primary context (the one CuPy and
   PyTorch use), and does passing our own cudacontext/cudastream work;
6. throughput on the benchmark clip (NVDEC, and PyAV on the CPU if installed).

On a machine with an NVIDIA GPU, the PyNvVideoCodec and PyAV wheels in .whl/ and the clips made
beforehand (tests/data/make_clips.py --bench); research/probes/video_run.sh runs it this way, with
the video pipeline's test, sample and benchmark:
    python3 -m pip install -q --no-index --no-deps --target /tmp/site2 .whl/*.whl
    PYTHONPATH=/tmp/site2:$PYTHONPATH python3 research/probes/nvdec_probe.py [--bench tests/data/generated/bench_1920x1080p60_h264.mp4]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
import traceback

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.data import make_clips as mc  # noqa: E402

import _needs  # noqa: E402  (research/probes/_needs.py: a missing need is one line and status 2)

if not _needs.help_asked():  # (--help works without them)
    _needs.needs_module(__file__, "cupy", _needs.CUPY_HOW)
    _needs.needs_module(__file__, "PyNvVideoCodec", "pip install PyNvVideoCodec, or its wheel in .whl/: "
                        "research/probes/video_run.sh")
    import cupy as cp  # noqa: E402
    import PyNvVideoCodec as nvc  # noqa: E402


def section(title):
    print(f"\n== {title}", flush=True)


def guarded(fn):
    def run(*a, **k):
        try:
            return fn(*a, **k)
        except Exception:
            print(f"  FAILED {fn.__name__}:\n" + "".join("    " + ln for ln in traceback.format_exc().splitlines(True)))
    return run


def packets(path):
    """The demuxer's packets, then one empty packet to flush the decoder."""
    dmx = nvc.CreateDemuxer(filename=str(path))
    for pkt in dmx:
        yield pkt
    yield nvc.PacketData()


def dev_array(frame):
    """The frame as one (H*3/2, W) uint8 device array, zero-copy (CuPy's DLPack, else PyTorch's)."""
    try:
        return cp.from_dlpack(frame)
    except Exception as e:  # noqa: BLE001
        if not getattr(dev_array, "warned", False):
            print(f"  cp.from_dlpack failed ({type(e).__name__}: {e}); using torch.from_dlpack")
            dev_array.warned = True
        import torch
        return cp.asarray(torch.from_dlpack(frame))


def to_host(frame, h):
    host = cp.asnumpy(dev_array(frame))
    return host[:h], host[h:]


@guarded
def stream_info(path):
    dmx = nvc.CreateDemuxer(filename=str(path))
    info = {}
    for name in ("Width", "Height", "FrameRate", "GetNvCodecId", "ChromaFormat", "BitDepth", "FrameSize",
                 "ColorSpace", "ColorRange", "GetContainerName"):
        try:
            info[name] = getattr(dmx, name)()
        except Exception as e:  # noqa: BLE001
            info[name] = f"<{type(e).__name__}: {e}>"
    print(f"  {path.name}: {info}")


@guarded
def decode_and_check(path, entry, **kwargs):
    w, h = entry["width"], entry["height"]
    dec = nvc.CreateDecoder(gpuid=0, codec=nvc.CreateDemuxer(filename=str(path)).GetNvCodecId(),
                            usedevicememory=True, **kwargs)
    n = bad = 0
    ptrs = set()
    for pkt in packets(path):
        for fr in dec.Decode(pkt):
            if n == 0:
                y_ptr, uv_ptr = fr.GetPtrToPlane(0), fr.GetPtrToPlane(1)
                views = fr.cuda()
                print(f"  first frame: shape {fr.shape} strides {fr.strides} dtype {fr.dtype} format {fr.format}"
                      f" dlpack_device {fr.__dlpack_device__()}")
                print(f"  Y ptr {y_ptr:#x}, UV ptr {uv_ptr:#x}, UV - Y = {uv_ptr - y_ptr} (W*H = {w * h});"
                      f" framesize() {fr.framesize()}")
                for i, v in enumerate(views):
                    print(f"  plane {i} CAI: {v.__cuda_array_interface__}")
            ptrs.add(fr.GetPtrToPlane(0))
            y, uv = to_host(fr, h)
            idx = mc.frame_index_from_luma(y)
            dy, duv = mc.nv12_digests(y, uv)
            ok = idx == n and dy == entry["y_sha256"][n] and duv == entry["uv_sha256"][n]
            if not ok:
                bad += 1
                if bad <= 3:
                    print(f"  frame {n}: index {idx}, Y {'ok' if dy == entry['y_sha256'][n] else 'differs'},"
                          f" UV {'ok' if duv == entry['uv_sha256'][n] else 'differs'}")
            n += 1
    print(f"  {path.name} {kwargs or ''}: {n}/{entry['frames']} frames, {bad} mismatched,"
          f" {len(ptrs)} distinct output buffers")


@guarded
def reuse(path, entry):
    """Hold frame 0 (a zero-copy view), decode on, see when its content changes."""
    h = entry["height"]
    dec = nvc.CreateDecoder(gpuid=0, codec=nvc.CreateDemuxer(filename=str(path)).GetNvCodecId(), usedevicememory=True,
                            latency=nvc.DisplayDecodeLatencyType.LOW)
    held = snapshot = None
    calls = 0
    for pkt in packets(path):
        pkt.decode_flag = nvc.VideoPacketFlag.ENDOFPICTURE if pkt.bsl else pkt.decode_flag
        frames = dec.Decode(pkt)
        calls += 1
        if held is None and frames:
            held = dev_array(frames[0])
            snapshot = held.copy()
            held_at = calls
            print(f"  frame 0 came from Decode() call {calls} ({len(frames)} frame(s) in that call)")
            continue
        if held is not None:
            cp.cuda.runtime.deviceSynchronize()
            if not cp.array_equal(held, snapshot):
                now = mc.frame_index_from_luma(cp.asnumpy(held[:h]))
                print(f"  held frame 0 overwritten after {calls - held_at} more Decode() call(s); now shows frame {now}")
                return
    print("  held frame 0 never overwritten during the clip")


@guarded
def locked(path, entry, hold=8):
    """GetNumDecodedFrame + GetLockedFrame: hold `hold` frames locked while decoding on."""
    w, h = entry["width"], entry["height"]
    dec = nvc.CreateDecoder(gpuid=0, codec=nvc.CreateDemuxer(filename=str(path)).GetNvCodecId(), usedevicememory=True,
                            latency=nvc.DisplayDecodeLatencyType.LOW)
    size = w * h * 3 // 2
    locked_ptrs = []  # (ptr, index, digest)
    seen = 0
    all_ptrs = set()
    for pkt in packets(path):
        pkt.decode_flag = nvc.VideoPacketFlag.ENDOFPICTURE if pkt.bsl else pkt.decode_flag
        for _ in range(dec.GetNumDecodedFrame(pkt)):
            ptr = dec.GetLockedFrame()
            all_ptrs.add(ptr)
            mem = cp.cuda.UnownedMemory(ptr, size, dec)
            arr = cp.ndarray((h * 3 // 2, w), cp.uint8, cp.cuda.MemoryPointer(mem, 0))
            cp.cuda.runtime.deviceSynchronize()
            host = cp.asnumpy(arr)
            locked_ptrs.append((ptr, arr, mc.frame_index_from_luma(host[:h]), host))
            seen += 1
            if len(locked_ptrs) > hold:
                old_ptr, old_arr, old_idx, old_host = locked_ptrs.pop(0)
                cp.cuda.runtime.deviceSynchronize()
                same = np.array_equal(cp.asnumpy(old_arr), old_host)
                if not same:
                    print(f"  locked frame {old_idx} CHANGED while locked")
                dec.UnlockFrame(old_ptr)
    print(f"  {seen} frames through GetLockedFrame, {hold} held at a time: {len(all_ptrs)} distinct buffers;"
          f" indices in order: {[i for _, _, i, _ in locked_ptrs]} (last {hold})")


@guarded
def context_check(path):
    from cuda.bindings import driver as cu
    cp.cuda.Device(0).use()
    cp.zeros(1)  # CuPy now works in the primary context
    err, cupy_ctx = cu.cuCtxGetCurrent()
    err, dev = cu.cuDeviceGet(0)
    err, primary = cu.cuDevicePrimaryCtxRetain(dev)
    print(f"  CuPy current ctx {int(cupy_ctx):#x}, primary ctx {int(primary):#x}")
    dec = nvc.CreateDecoder(gpuid=0, codec=nvc.CreateDemuxer(filename=str(path)).GetNvCodecId(), usedevicememory=True)
    for pkt in packets(path):
        frames = dec.Decode(pkt)
        if frames:
            ptr = frames[0].GetPtrToPlane(0)
            err, ctx = cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_CONTEXT, ptr)
            print(f"  output buffer's context {int(ctx):#x} (primary: {int(ctx) == int(primary)})")
            break
    s = cp.cuda.Stream(non_blocking=True)
    dec2 = nvc.CreateDecoder(gpuid=0, codec=nvc.CreateDemuxer(filename=str(path)).GetNvCodecId(),
                             cudacontext=int(primary), cudastream=s.ptr, usedevicememory=True)
    n = 0
    for pkt in packets(path):
        for fr in dec2.Decode(pkt):
            fr.__dlpack__(stream=s.ptr)  # makes s wait on the decoder's event
            n += 1
    s.synchronize()
    print(f"  own context + own stream: {n} frames decoded, DLPack with stream=s ok")
    cu.cuDevicePrimaryCtxRelease(dev)


@guarded
def throughput(path, repeat=3):
    for latency in ("NATIVE", "LOW"):
        best = None
        for _ in range(repeat):
            dmx = nvc.CreateDemuxer(filename=str(path))
            dec = nvc.CreateDecoder(gpuid=0, codec=dmx.GetNvCodecId(), usedevicememory=True,
                                    latency=getattr(nvc.DisplayDecodeLatencyType, latency))
            t0 = time.perf_counter()
            n = 0
            for pkt in dmx:
                if latency == "LOW" and pkt.bsl:
                    pkt.decode_flag = nvc.VideoPacketFlag.ENDOFPICTURE
                n += len(dec.Decode(pkt))
            n += len(dec.Decode(nvc.PacketData()))
            cp.cuda.runtime.deviceSynchronize()
            dt = time.perf_counter() - t0
            best = dt if best is None else min(best, dt)
        print(f"  NVDEC {latency:6s}: {n} frames in {best * 1e3:.1f} ms = {n / best:.0f} frames/s (best of {repeat})")
    try:
        import av
    except ImportError:
        print("  PyAV not installed: no CPU baseline")
        return
    with av.open(str(path)) as c:
        c.streams.video[0].thread_type = "AUTO"
        t0 = time.perf_counter()
        n = sum(1 for fr in c.decode(video=0) if fr.to_ndarray(format="nv12") is not None)
        dt = time.perf_counter() - t0
    print(f"  PyAV (CPU, threads AUTO, to NV12 ndarray): {n} frames in {dt * 1e3:.1f} ms = {n / dt:.0f} frames/s")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", type=pathlib.Path, default=mc.GENERATED / "bench_1920x1080p60_h264.mp4")
    args = ap.parse_args()
    print("PyNvVideoCodec", nvc.__version__, {k: getattr(nvc, k) for k in ("__cuda_version__",
          "__video_codec_sdk_version__") if hasattr(nvc, k)})
    manifest = json.loads(mc.MANIFEST.read_text())
    clips = {name: (mc.HERE / name, entry) for name, entry in manifest.items()}
    bench_json = args.bench.with_name(args.bench.name + ".json")
    if args.bench.exists() and bench_json.exists():
        clips.update({k: (args.bench, v) for k, v in json.loads(bench_json.read_text()).items()})
    section("demuxer")
    for path, _ in clips.values():
        stream_info(path)
    section("decode every frame, check index band and digests against the CPU decoder")
    for path, entry in clips.values():
        decode_and_check(path, entry)
        decode_and_check(path, entry, latency=nvc.DisplayDecodeLatencyType.LOW)
    first_path, first_entry = next(iter(clips.values()))
    section("surface reuse (Decode)")
    reuse(first_path, first_entry)
    section("locked frames (GetNumDecodedFrame + GetLockedFrame / UnlockFrame)")
    locked(first_path, first_entry)
    section("contexts and streams")
    context_check(first_path)
    if args.bench.exists():
        section(f"throughput: {args.bench.name}")
        throughput(args.bench)
    else:
        print(f"\n(no {args.bench}: make it with tests/data/make_clips.py --bench)")


if __name__ == "__main__":
    main()
