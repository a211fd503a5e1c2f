"""eglcuda._bind.cuda_vmm: bad input is refused before the driver; and, under the fake libcuda
(tests/fakes/driver/), device memory shared as a file descriptor between processes: the
exporter's bytes read back in a child that received the descriptor over a UNIX socket, and no
descriptor leaked by unmap and release."""
from __future__ import annotations

import pytest

from eglcuda import UsageError
from eglcuda._bind import cuda_vmm

GRANULARITY = 1 << 16


@pytest.fixture
def known_granularity(monkeypatch):
    # Device 0's granularity as if the driver had answered: the checks run without libcuda.
    monkeypatch.setitem(cuda_vmm._granularity, 0, GRANULARITY)


@pytest.mark.parametrize("size", [0, -GRANULARITY, GRANULARITY + 1, GRANULARITY // 2, 1.5 * GRANULARITY, True, "64"])
def test_create_refuses_a_size_not_a_multiple_of_the_granularity(known_granularity, size):
    with pytest.raises(UsageError):
        cuda_vmm.create(size, 0)


def test_the_size_error_says_what_to_round_to(known_granularity):
    with pytest.raises(UsageError, match=f"round it up to {2 * GRANULARITY}"):
        cuda_vmm.create(GRANULARITY + 1, 0)


@pytest.mark.parametrize("ordinal", [-1, None, 0.0, True])
def test_bad_device_ordinals(known_granularity, ordinal):
    with pytest.raises(UsageError):
        cuda_vmm.create(GRANULARITY, ordinal)
    with pytest.raises(UsageError):
        cuda_vmm.granularity(ordinal)
    with pytest.raises(UsageError):
        cuda_vmm.set_access(1 << 30, GRANULARITY, ordinal)


@pytest.mark.parametrize("fd", [-1, None, 3.0, "3"])
def test_bad_descriptors(known_granularity, fd):
    with pytest.raises(UsageError):
        cuda_vmm.import_fd(fd)
    with pytest.raises(UsageError):
        cuda_vmm.map_import(fd, GRANULARITY, 0)


def test_map_import_checks_the_size_before_importing(known_granularity):
    with pytest.raises(UsageError, match="multiple"):
        cuda_vmm.map_import(0, GRANULARITY + 4096, 0)


@pytest.mark.parametrize("alignment", [-1, 3, GRANULARITY + 1, 1.0])
def test_reserve_alignment_is_zero_or_a_power_of_two(alignment):
    with pytest.raises(UsageError, match="alignment"):
        cuda_vmm.reserve(GRANULARITY, alignment)


@pytest.mark.parametrize("call", [
    lambda: cuda_vmm.reserve(0),
    lambda: cuda_vmm.map(0, GRANULARITY, 1),
    lambda: cuda_vmm.map(1 << 30, 0, 1),
    lambda: cuda_vmm.unmap(1 << 30, -1),
    lambda: cuda_vmm.address_free(0, GRANULARITY),
    lambda: cuda_vmm.unmap_release(1 << 30, 0),
    lambda: cuda_vmm.set_access(1 << 30, 0, 0),
])
def test_zero_or_negative_addresses_and_sizes(call):
    with pytest.raises(UsageError):
        call()


# ---- on the fake libcuda (tests/fakes/driver/fake_cuda.c) ------------------------------------------

import json  # noqa: E402
import os  # noqa: E402
import pathlib  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402


PEER = pathlib.Path(__file__).resolve().parent / "vmm_peer.py"
ROOT = pathlib.Path(__file__).resolve().parents[2]


def python(env, code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("granules", [1, 3])
def test_bytes_cross_processes_through_the_descriptor(fake_env, granules):
    done = subprocess.run([sys.executable, str(PEER), "export", str(granules), "43"], capture_output=True, text=True,
                          env=fake_env, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["supported"] is None
    assert result["granularity"] == 2 << 20  # what NVIDIA GPUs report, and the fake's default
    child = result["child"]
    assert result["child_exit"] == 0 and child is not None, done.stderr
    assert child["fds_received"] == 1 and child["bytes"] == result["size"] == granules * (2 << 20)
    assert child["differ"] == 0  # every byte the exporter wrote, read back in the other process
    # unmap and release (and closing the descriptors) leave no descriptor behind, on either side
    assert result["fds_after"] == result["fds_before"]
    assert child["fds_after"] == child["fds_before"]


def test_an_import_of_something_else_is_refused_and_leaves_nothing(fake_env):
    # A pipe is no exported allocation: the import fails and nothing (handle, reservation, fd) stays.
    out = python(fake_env, COUNTS + """
read, write = os.pipe()
before = len(os.listdir("/proc/self/fd"))
try:
    cuda_vmm.map_import(read, 2 << 20, 0)
except CUDAError as exc:
    print("refused", exc.call, exc.name)
print("left", *counts(), len(os.listdir("/proc/self/fd")) - before)
""")
    assert out.splitlines() == ["refused cuMemImportFromShareableHandle CUDA_ERROR_INVALID_VALUE", "left 0 0 0 0"]


COUNTS = """
import ctypes, os
import eglcuda
from eglcuda import CUDAError
from eglcuda._bind import cuda_vmm
eglcuda.get_device(0).make_current()
fake = ctypes.CDLL("libcuda.so.1")
fake.fake_cuda_count.restype = ctypes.c_long
def counts():
    return [fake.fake_cuda_count(w.encode()) for w in ("vmm_handles", "vmm_reservations", "vmm_mappings")]
"""


@pytest.mark.parametrize("step", ["cuMemAddressReserve", "cuMemMap", "cuMemSetAccess"])
def test_map_import_undoes_what_it_did_when_a_step_fails(fake_env, step):
    # The fake's fault injection fails the step once (CUDA_ERROR_OUT_OF_MEMORY): the import, the
    # reservation and the mapping made before it are undone; only the exporter's handle is left.
    env = {**fake_env, "FAKE_FAIL": f"{step}:1:2"}
    out = python(env, COUNTS + """
handle = cuda_vmm.create(2 << 20, 0)
fd = cuda_vmm.export_fd(handle)
before = len(os.listdir("/proc/self/fd"))
try:
    cuda_vmm.map_import(fd, 2 << 20, 0)
except CUDAError as exc:
    print("refused", exc.call, exc.name)
print("left", *counts(), len(os.listdir("/proc/self/fd")) - before)
address = cuda_vmm.map_import(fd, 2 << 20, 0)  # the fault was for one call: now it maps
cuda_vmm.unmap_release(address, 2 << 20)
os.close(fd)
cuda_vmm.release(handle)
print("end", *counts())
""")
    assert out.splitlines() == [f"refused {step} CUDA_ERROR_OUT_OF_MEMORY", "left 1 0 0 0", "end 0 0 0"]


def test_driver_refusals_are_named_cuda_errors(fake_env):
    out = python(fake_env, """
import eglcuda
from eglcuda import CUDAError
from eglcuda._bind import cuda_vmm
eglcuda.get_device(0).make_current()
for call in (lambda: cuda_vmm.release(12345), lambda: cuda_vmm.export_fd(12345),
             lambda: cuda_vmm.unmap(1 << 40, 2 << 20), lambda: cuda_vmm.address_free(1 << 40, 2 << 20),
             lambda: cuda_vmm.reserve(4096)):
    try:
        call()
    except CUDAError as exc:
        print(exc.call, exc.name)
""")
    assert out.splitlines() == [
        "cuMemRelease CUDA_ERROR_INVALID_VALUE", "cuMemExportToShareableHandle CUDA_ERROR_INVALID_VALUE",
        "cuMemUnmap CUDA_ERROR_INVALID_VALUE", "cuMemAddressFree CUDA_ERROR_INVALID_VALUE",
        "cuMemAddressReserve CUDA_ERROR_INVALID_VALUE"]


def test_supported_says_why_not_and_never_raises(fake_env):
    out = python({**fake_env, "FAKE_CUDA_DEVICE_COUNT": "2"}, """
from eglcuda._bind import cuda_vmm
print(cuda_vmm.supported(0), cuda_vmm.supported(1))
print(cuda_vmm.supported(2))
print(cuda_vmm.granularity(1))
""")
    lines = out.splitlines()
    assert lines[0] == "None None"
    assert "cuDeviceGet" in lines[1] and "CUDA_ERROR_INVALID_DEVICE" in lines[1]
    assert lines[2] == str(2 << 20)


def test_supported_without_libcuda_says_so():
    env = {**os.environ, "EGLCUDA_LIBCUDA": "/nonexistent/libcuda.so.1"}
    out = python(env, "from eglcuda._bind import cuda_vmm; print(cuda_vmm.supported(0))")
    assert "libcuda.so.1" in out and "not available" in out
