# Research record (see research/README.md): open, not yet run (uses eglcuda's private Stream adoption).
"""Does EGL_NV_stream_metadata carry per-frame metadata with CUDA-produced frames, across
processes, and what does it cost next to the topic layer's socket message?

A consumer process makes a FIFO stream with one metadata block (EGL_METADATA0_SIZE_NV) and serves
it; a producer process (a fresh interpreter) connects a CUDA producer, and before each present
writes a 32-byte block (frame number, timestamp, a pattern) with eglSetStreamMetadataNV. The
consumer acquires each frame and reads the block with eglQueryStreamMetadataNV
(EGL_CONSUMER_METADATA_NV), checks it belongs to that frame, and times both calls.

    python research/probes/stream_metadata_probe.py [--frames 500]

Prints one JSON line: whether every frame's block matched, the median set and query times (us),
and for comparison the median time of one 64-byte send + receive on a SOCK_SEQPACKET socket
pair (what a topic FRAME message costs). Uses eglcuda's private stream adoption, as a probe may.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import _needs  # research/probes/_needs.py: a missing need is one line and status 2

EGL_METADATA0_SIZE_NV = 0x3255
EGL_CONSUMER_METADATA_NV = 0x3254
EGL_MAX_STREAM_METADATA_BLOCK_SIZE_NV = 0x3251
BLOCK = struct.Struct("<QQ16s")


def egl_functions():
    egl = ctypes.CDLL("libEGL.so.1")
    egl.eglGetProcAddress.restype = ctypes.c_void_p
    egl.eglGetProcAddress.argtypes = [ctypes.c_char_p]
    proto_set = ctypes.CFUNCTYPE(ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32,
                                 ctypes.c_int32, ctypes.c_void_p)
    proto_query = ctypes.CFUNCTYPE(ctypes.c_uint, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint, ctypes.c_int32,
                                   ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p)
    set_address = egl.eglGetProcAddress(b"eglSetStreamMetadataNV")
    query_address = egl.eglGetProcAddress(b"eglQueryStreamMetadataNV")
    if not set_address or not query_address:
        _needs.unmet(__file__, "needs EGL_NV_stream_metadata (NVIDIA's EGL): libEGL.so.1 has no "
                               "eglSetStreamMetadataNV / eglQueryStreamMetadataNV")
    set_fn = proto_set(set_address)
    query_fn = proto_query(query_address)
    return egl, set_fn, query_fn


def stream_with_metadata(display, fifo: int):
    """An eglcuda Stream made with one metadata block (eglcuda's Stream takes no such attribute)."""
    from eglcuda._bind import egl_stream
    from eglcuda.streams.stream import Stream

    handle = egl_stream.create(display.handle, [(egl_stream.FIFO_LENGTH, fifo), (EGL_METADATA0_SIZE_NV, BLOCK.size)])
    stream = Stream.__new__(Stream)
    stream._adopt_handle(display, handle, fifo, True, imported=False)
    stream._export()
    return stream


def producer(args) -> int:
    import numpy as np

    import eglcuda

    _, set_fn, _ = egl_functions()
    with eglcuda.Display.for_cuda_device(0) as display:
        display.require("EGL_NV_stream_metadata")
        stream = eglcuda.receive_stream(display, args.socket, timeout=30)
        prod = stream.connect_cuda_producer(640, 480)
        free = [prod.allocate_frame() for _ in range(6)]
        times = []
        data = ctypes.create_string_buffer(BLOCK.size)
        for number in range(1, args.frames + 1):
            while not free:
                back = prod.return_frame(timeout_us=2_000_000)
                if back is not None:
                    free.append(back)
            frame = free.pop()
            frame.planes[0].copy_from(np.full(frame.planes[0].shape, number % 256, np.uint8))
            data.raw = BLOCK.pack(number, time.monotonic_ns(), b"eglcuda-metadata")
            started = time.perf_counter_ns()
            ok = set_fn(display._address, stream.handle, 0, 0, BLOCK.size, data)
            times.append(time.perf_counter_ns() - started)
            if not ok:
                print(json.dumps({"producer_error": "eglSetStreamMetadataNV failed", "frame": number}), flush=True)
                return 1
            prod.present(frame)
        print(json.dumps({"set_us_p50": statistics.median(times) / 1e3}), flush=True)
        sys.stdin.readline()
        stream.close()
    return 0


def consumer(args) -> dict:
    import eglcuda

    _, _, query_fn = egl_functions()
    result: dict = {}
    with tempfile.TemporaryDirectory() as folder, eglcuda.Display.for_cuda_device(0) as display:
        if not display.supports("EGL_NV_stream_metadata"):
            return {"supported": False}
        path = os.path.join(folder, "s")
        stream = stream_with_metadata(display, fifo=4)
        cons = stream.connect_cuda_consumer()
        child = subprocess.Popen([sys.executable, __file__, "--role", "producer", "--socket", path,
                                  "--frames", str(args.frames)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 text=True)
        eglcuda.serve_stream(stream, path, timeout=30)
        data = ctypes.create_string_buffer(BLOCK.size)
        times, mismatches = [], 0
        for _ in range(args.frames):
            with cons.acquire(timeout_us=5_000_000) as frame:
                started = time.perf_counter_ns()
                ok = query_fn(display._address, stream.handle, EGL_CONSUMER_METADATA_NV, 0, 0, BLOCK.size, data)
                times.append(time.perf_counter_ns() - started)
                number, _stamp, tag = BLOCK.unpack(data.raw)
                mismatches += (not ok) or number != frame.number or tag != b"eglcuda-metadata"
        result.update(supported=True, frames=args.frames, mismatched=mismatches,
                      query_us_p50=statistics.median(times) / 1e3)
        child.stdin.write("done\n")
        child.stdin.flush()
        out, _ = child.communicate(timeout=60)
        for line in out.splitlines():
            result.update(json.loads(line))
        stream.close()
    return result


def socket_message_cost(count: int = 5000) -> float:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    message = bytes(64)
    times = []
    for _ in range(count):
        started = time.perf_counter_ns()
        a.send(message)
        b.recv(128)
        times.append(time.perf_counter_ns() - started)
    a.close()
    b.close()
    return statistics.median(times) / 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=500)
    parser.add_argument("--role", default="consumer", help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "producer":
        return producer(args)
    _needs.needs_cuda(__file__, "cuda", "cross-process")
    result = consumer(args)
    result["socket_message_us_p50"] = socket_message_cost()
    print(json.dumps(result))
    return 0 if result.get("mismatched", 1) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
