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
