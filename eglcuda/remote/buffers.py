"""Page-locked host buffers, allocated once per connection (a relay's staging ring, a remote
subscriber's receive window): the D2H / H2D copies and UCX's sends and receives use them in
place."""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from .._bind import cuda
from ..cuda_device import CudaDevice
from . import _ucx


class Pinned:
    """``count`` page-locked buffers of ``size`` bytes each, as numpy arrays (``arrays``)."""

    def __init__(self, device: CudaDevice, count: int, size: int, doing: str) -> None:
        self.device = device
        self.size = size
        self._hosts: list[int] = []
        self.arrays: list[np.ndarray] = []
        self._ucx: list[Any] | None = None  # the arrays as UCXX Arrays (for_ucx)
        device.make_current()
        try:
            for _ in range(count):
                host, _device_address = cuda.host_alloc_mapped(size, doing)
                self._hosts.append(host)
                self.arrays.append(np.ctypeslib.as_array((ctypes.c_ubyte * size).from_address(host)))
        except BaseException:
            self.close()
            raise

    def for_ucx(self) -> list[Any]:
        """The buffers as UCXX ``Array`` objects, for :meth:`Endpoint.send_now` / ``recv_now`` (made
        once, on the UCX engine's thread: they keep the arrays alive)."""
        if self._ucx is None:
            self._ucx = [_ucx.engine().arr(array) for array in self.arrays]
        return self._ucx

    def address(self, index: int) -> int:
        """The host address of buffer ``index`` (valid until :meth:`close`)."""
        return self._hosts[index]

    def __len__(self) -> int:
        return len(self.arrays)

    def close(self) -> None:
        """Free every buffer (nothing may use them any more: UCX's requests on them ended)."""
        hosts, self._hosts = self._hosts, []
        self.arrays = []
        self._ucx = None
        if hosts:
            self.device.make_current()
            for host in hosts:
                cuda.host_free(host)
