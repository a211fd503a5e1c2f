"""Both ends of CUDA VMM memory shared as a file descriptor, for tests/unit/test_cuda_vmm.py (on the
fake libcuda of tests/fakes/driver/, or on a GPU).

    python tests/unit/vmm_peer.py export SIZE_GRANULES SEED

The exporter allocates SIZE_GRANULES granules with eglcuda._bind.cuda_vmm, maps them, writes
random bytes (from SEED) with a host-to-device copy, exports the descriptor and sends it with
SCM_RIGHTS over a UNIX socket to a child it starts (``vmm_peer.py import SOCKET_FD``), which
imports and maps it, copies every byte back to the host and compares. Each process counts its
open descriptors before and after and prints one JSON line; the exporter's includes the child's.
"""
from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys

import eglcuda
from eglcuda._bind import cuda, cuda_vmm


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def export(granules: int, seed: int) -> dict:
    eglcuda.get_device(0).make_current()
    reason = cuda_vmm.supported(0)
    step = cuda_vmm.granularity(0)
    size = granules * step
    data = random.Random(seed).randbytes(size)
    before = open_fds()
    handle = cuda_vmm.create(size, 0)
    address = cuda_vmm.reserve(size, step)
    cuda_vmm.map(address, size, handle)
    cuda_vmm.set_access(address, size, 0)
    cuda.copy_2d(0, ("host", data, size), ("device", address, size), size, 1, wait=True)
    fd = cuda_vmm.export_fd(handle)
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    child = subprocess.Popen([sys.executable, __file__, "import", str(theirs.fileno())], pass_fds=(theirs.fileno(),),
                             stdout=subprocess.PIPE, text=True)
    theirs.close()
    socket.send_fds(ours, [json.dumps({"size": size, "seed": seed}).encode()], [fd])
    os.close(fd)  # the child has its own copy now
    out, _ = child.communicate(timeout=60)
    ours.close()
    cuda_vmm.unmap_release(address, size, handle)
    return {"supported": reason, "granularity": step, "size": size, "fds_before": before, "fds_after": open_fds(),
            "child": json.loads(out.splitlines()[-1]) if out.strip() else None, "child_exit": child.returncode}


def import_(sock_fd: int) -> dict:
    eglcuda.get_device(0).make_current()
    sock = socket.socket(fileno=sock_fd)
    before = open_fds()
    message, fds, _, _ = socket.recv_fds(sock, 4096, 1)
    order = json.loads(message)
    size = order["size"]
    expected = random.Random(order["seed"]).randbytes(size)
    address = cuda_vmm.map_import(fds[0], size, 0)
    got = bytearray(size)
    cuda.copy_2d(0, ("device", address, size), ("host", got, size), size, 1, wait=True)
    os.close(fds[0])
    cuda_vmm.unmap_release(address, size)
    differ = sum(1 for a, b in zip(got, expected) if a != b)
    sock.close()
    return {"fds_received": len(fds), "bytes": len(got), "differ": differ, "fds_before": before - 1,
            "fds_after": open_fds()}


if __name__ == "__main__":
    if sys.argv[1] == "export":
        print(json.dumps(export(int(sys.argv[2]), int(sys.argv[3]))), flush=True)
    else:
        print(json.dumps(import_(int(sys.argv[2]))), flush=True)
