"""bench/topics.py's baselines, run as its roles (``--role ring-pub`` ...): a plain CUDA IPC ring
(cudaipcsink-like: the publisher's pool exported once, frame numbers over a Unix socket) and
torch.multiprocessing (CUDA tensors through a multiprocessing queue), what a Python user would
otherwise write, measured in the same run as eglcuda's topics."""
from __future__ import annotations

import json
import math
import socket
import struct
import subprocess
import sys
import time

from _topics_common import POOL, ROOT, SIZES, TOPICS, WARMUP, emit, now_ns, pin, plane_rows, summarize


# ==== a plain CUDA IPC ring (cudaipcsink-like) =======================================================

_RING_FRAME = struct.Struct("<BQQ")  # slot, seq, timestamp (0 slot 255: end)


def ring_publisher(args) -> int:
    import select

    from eglcuda import get_device
    from eglcuda._bind import cuda, cuda_ipc

    width, height, fmt = SIZES[args.size]
    size = width * height * (4 if fmt == "ARGB" else 3) // (1 if fmt == "ARGB" else 2)
    device = get_device(0)
    device.make_current()
    buffers = [cuda.mem_alloc(size, "a ring buffer") for _ in range(POOL)]
    planes = plane_rows(width, height, fmt)
    source = cuda.mem_alloc(size, "the frames' source") if args.write else 0
    events = [cuda_ipc.event_create_interprocess() for _ in range(POOL)]
    handles = b"".join(cuda_ipc.mem_handle(b) + cuda_ipc.event_handle(e) for b, e in zip(buffers, events))
    pairs = [socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) for _ in range(args.n)]
    children = []
    for index, (mine, theirs) in enumerate(pairs):
        children.append(subprocess.Popen([sys.executable, str(TOPICS), "--role", "ring-sub", "--fd", str(theirs.fileno()),
                                          "--size", args.size] + (["--sync"] if args.sync else []) + (["--pin"] if args.pin else [])
                                         + (["--profile", args.profile] if args.profile else []),
                                         pass_fds=[theirs.fileno()], stdout=subprocess.PIPE, text=True, cwd=ROOT))
        theirs.close()
        mine.send(handles)
    pin(args, True)  # (after its subscribers started: they take the other CPUs)
    socks = [mine for mine, _ in pairs]
    for sock in socks:
        assert sock.recv(16) == b"opened"
        sock.setblocking(False)
    poller = select.epoll()
    for sock in socks:
        poller.register(sock.fileno(), select.EPOLLIN)
    by_fd = {sock.fileno(): sock for sock in socks}
    pending = [0] * POOL  # subscribers still holding each slot
    free = list(range(POOL))

    def collect(timeout: float) -> None:
        for fd, _ in poller.poll(timeout):
            while True:
                try:
                    data = by_fd[fd].recv(16)
                except BlockingIOError:
                    break
                slot = data[0]
                pending[slot] -= 1
                if pending[slot] == 0:
                    free.append(slot)

    stream = 0
    seq, count, started, end = 0, 0, 0, 0
    total = WARMUP
    phase = "warm"
    while True:
        collect(0)
        while not free:
            collect(1.0)
        slot = free.pop(0)
        if phase == "warm" and seq >= total:
            phase, started, cpu = "timed", now_ns(), time.process_time()
            end = started + int(args.duration * 1e9)
        if phase == "timed" and now_ns() >= end:
            break
        if source:  # --write: the same copies the topic's publisher queues
            for offset, row_bytes, height_rows in planes:
                cuda.copy_2d(stream, ("device", source + offset, row_bytes),
                             ("device", buffers[slot] + offset, row_bytes), row_bytes, height_rows, wait=False)
        stamp = now_ns()
        cuda_ipc.record(events[slot], stream)
        message = _RING_FRAME.pack(slot, seq, stamp if phase == "timed" else 0)
        pending[slot] = len(socks)
        for sock in socks:
            sock.send(message)
        seq += 1
        count += phase == "timed"
    elapsed = (now_ns() - started) / 1e9
    cpu = time.process_time() - cpu
    for sock in socks:
        sock.setblocking(True)
        sock.send(_RING_FRAME.pack(255, 0, 0))
    results = []
    for child in children:
        out, _ = child.communicate(timeout=120)
        results += [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")]
    for buffer, event in zip(buffers, events):
        cuda_ipc.event_destroy(event)
        cuda.mem_free(buffer)
    if source:
        cuda.mem_free(source)
    emit(role="publisher", rate=count / elapsed, frames=count, transports=["ipc-ring"], cpu_us=1e6 * cpu / count)
    for result in results:
        emit(**result)
    return 0


def ring_subscriber(args) -> int:
    pin(args, False)
    from eglcuda import get_device
    from eglcuda._bind import cuda, cuda_egl, cuda_ipc

    sock = socket.socket(fileno=args.fd)
    device = get_device(0)
    device.make_current()
    stream = cuda_egl.stream_create()
    handles = sock.recv(1 << 16)
    buffers, events = [], []
    for at in range(0, len(handles), 128):
        buffers.append(cuda_ipc.open_mem_handle(handles[at:at + 64]))  # opened once, used for every frame
        events.append(cuda_ipc.open_event_handle(handles[at + 64:at + 128]))
    sock.send(b"opened")
    latencies, received, first, last, cpu = [], 0, 0, 0, math.nan
    while True:
        slot, seq, stamp = _RING_FRAME.unpack(sock.recv(64))
        if slot == 255:
            if received:
                cpu = time.process_time() - cpu
            break
        cuda_ipc.wait(stream, events[slot])
        if args.sync:
            cuda.stream_synchronize(stream)
        got = now_ns()
        if stamp:
            if not received:
                cpu = time.process_time()
            received += 1
            latencies.append(got - stamp)
            first = first or got
            last = got
        sock.send(bytes([slot]))
    for buffer in buffers:
        cuda_ipc.close_mem_handle(buffer)
    emit(role="subscriber", **summarize(latencies, received, first, last, cpu))
    return 0


# ==== torch.multiprocessing ===========================================================================

def _torch_subscriber(inbox, outbox, results, sync: bool) -> None:
    import torch

    latencies, received, first, last = [], 0, 0, 0
    while True:
        item = inbox.get()
        if item is None:
            break
        tensor, slot, stamp = item
        if sync:
            torch.cuda.current_stream().synchronize()
        got = now_ns()
        if stamp:
            received += 1
            latencies.append(got - stamp)
            first = first or got
            last = got
        del tensor
        outbox.put(slot)
    results.put(summarize(latencies, received, first, last))


def torch_run(args) -> int:
    try:
        import torch
        import torch.multiprocessing as tmp
    except ImportError as exc:
        emit(role="skipped", reason=f"torch is not installed ({exc})")
        return 0
    width, height, fmt = SIZES[args.size]
    size = width * height * (4 if fmt == "ARGB" else 3) // (1 if fmt == "ARGB" else 2)
    context = tmp.get_context("spawn")
    pool = [torch.empty(size, dtype=torch.uint8, device="cuda") for _ in range(POOL)]
    inboxes = [context.Queue() for _ in range(args.n)]
    outbox, results = context.Queue(), context.Queue()
    children = [context.Process(target=_torch_subscriber, args=(inbox, outbox, results, args.sync))
                for inbox in inboxes]
    for child in children:
        child.start()
    pending = [0] * POOL
    free = list(range(POOL))
    seq, count, started, end, phase = 0, 0, 0, 0, "warm"
    while True:
        while not free or not outbox.empty():
            slot = outbox.get()
            pending[slot] -= 1
            if pending[slot] == 0:
                free.append(slot)
        slot = free.pop(0)
        if phase == "warm" and seq >= WARMUP:
            phase, started = "timed", now_ns()
            end = started + int(args.duration * 1e9)
        if phase == "timed" and now_ns() >= end:
            break
        torch.cuda.current_stream().synchronize()  # what a producer must do before sharing
        stamp = now_ns() if phase == "timed" else 0
        pending[slot] = args.n
        for inbox in inboxes:
            inbox.put((pool[slot], slot, stamp))
        seq += 1
        count += phase == "timed"
    elapsed = (now_ns() - started) / 1e9
    for inbox in inboxes:
        inbox.put(None)
    emit(role="publisher", rate=count / elapsed, frames=count, transports=["torch-mp"])
    for _ in children:
        emit(role="subscriber", **results.get(timeout=120))
    for child in children:
        child.join(60)
    return 0
