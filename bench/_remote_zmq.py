"""bench/remote.py's baseline, what a user would otherwise write: a device-to-host copy, pyzmq PUB to
the subscriber processes (high-water mark 2: a slow subscriber loses frames, like qos latest) and a
host-to-device copy on arrival, with eglcuda's CUDA bindings and plain host memory. Run as
bench/remote.py's roles (``--role zmq-pub``, ``--role zmq-sub``)."""
from __future__ import annotations

import math
import struct
import time

from _remote_common import TAIL_S, DeviceFrame, Pacer, Tally, Window, emit, frame_geometry, now_ns


def _device(width: int, height: int, fmt: str) -> DeviceFrame:
    return DeviceFrame(*frame_geometry(width, height, fmt), "the zmq baseline's frame")


def role_zmq_publisher(args) -> int:
    import numpy as np
    import zmq

    device = _device(args.width, args.height, args.format)
    context = zmq.Context()
    sock = context.socket(zmq.PUB)
    sock.setsockopt(zmq.SNDHWM, 2)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    emit(role="ready", port=port)
    window = Window()
    published, seq = 0, 0
    pacer = Pacer(args.rate)
    size = device.row * device.rows
    while not window.over(TAIL_S):
        pacer.wait()
        stamp = now_ns()
        host = np.empty(size, np.uint8)  # a fresh host array per frame, as cupy.asnumpy gives
        device.to_host(host)
        sock.send_multipart([struct.pack("<qq", seq, stamp), host], copy=False)
        seq += 1
        published += window.inside(stamp)
        if not window.given.is_set() and not pacer.period:
            time.sleep(0.001)
    span = (window.end - window.start) / 1e9
    emit(role="publisher", rate=published / span if span > 0 else math.nan, frames=published)
    sock.close()
    context.term()
    return 0


def role_zmq_subscriber(args) -> int:
    import zmq

    device = _device(args.width, args.height, args.format)
    context = zmq.Context()
    sock = context.socket(zmq.SUB)
    sock.setsockopt(zmq.RCVHWM, 2)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(f"tcp://127.0.0.1:{args.port}")
    window, tally = Window(), Tally()
    joined = False
    while not window.over(2.0):
        if not sock.poll(1000):
            continue
        header, body = sock.recv_multipart(copy=False)
        _, stamp = struct.unpack("<qq", header.bytes)
        device.from_host(body.buffer)
        tally.add(window, stamp, now_ns())
        if not joined:  # a frame arrived: the subscription is in place
            emit(role="joined", transport="zmq")
            joined = True
    emit(role="remote", **tally.result(window))
    sock.close()
    context.term()
    return 0
