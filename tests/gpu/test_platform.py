"""The NVIDIA EGL device, its display and CUDA: matching, contexts, and the info report."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import eglcuda
from eglcuda._bind import egl
from eglcuda._bind._native import ffi, lib

from ..conftest import require_extension


def test_cuda_display_matches_through_egl_cuda_device_nv(cuda_display, cuda_ordinal):
    assert cuda_display.cuda_ordinal == cuda_ordinal
    assert egl.query_device_attrib(cuda_display.device.handle, egl.CUDA_DEVICE_NV) == cuda_ordinal
    assert "NVIDIA" in cuda_display.vendor
    assert cuda_display.version >= (1, 5)


def test_every_cuda_ordinal_maps_to_one_egl_device(cuda_ordinal):
    ordinals = [d.cuda_ordinal for d in eglcuda.devices() if d.cuda_ordinal is not None]
    assert sorted(ordinals) == list(range(eglcuda._bind.cuda.device_count()))


def test_for_cuda_device_out_of_range_is_unsupported(cuda_ordinal):
    with pytest.raises(eglcuda.Unsupported) as info:
        eglcuda.Display.for_cuda_device(1000)
    assert "CUDA device 1000" in str(info.value)


def test_stream_extensions_are_listed(cuda_display):
    require_extension(cuda_display, "EGL_KHR_stream")
    assert cuda_display.supports("EGL_KHR_stream")
    from eglcuda._bind import loader as _loader

    assert _loader.is_bound("eglCreateStreamKHR")


def test_cuda_device_info_and_primary_context(cuda_ordinal):
    device = eglcuda.get_device(cuda_ordinal)
    assert device is eglcuda.get_device(cuda_ordinal)
    assert device.info.name and device.info.total_memory > 0
    device.make_current()
    current = ffi.new("CUcontext *")
    assert lib.cuCtxGetCurrent(current) == 0 and int(ffi.cast("uintptr_t", current[0])) == device.context
    free, total = device.memory_info()
    assert 0 < free <= total
    assert eglcuda.driver_version() >= 11000


def test_cuda_error_is_named_by_the_driver(cuda_ordinal):
    eglcuda.get_device(cuda_ordinal).make_current()
    with pytest.raises(eglcuda.CUDAError) as info:
        eglcuda._bind.cuda.check(lib.cuMemFree(0xDEAD0000), "cuMemFree")
    assert info.value.name.startswith("CUDA_ERROR_")
    assert info.value.call == "cuMemFree"


def test_pyopengl_draws_on_the_nvidia_display(cuda_display):
    GL = pytest.importorskip("OpenGL.GL")
    rng = np.random.default_rng()
    width, height = 129, 67
    texels = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)
    with cuda_display.create_context() as context:
        assert context.is_current
        texture = GL.glGenTextures(1)
        GL.glBindTexture(GL.GL_TEXTURE_2D, texture)
        GL.glPixelStorei(GL.GL_UNPACK_ALIGNMENT, 1)
        GL.glPixelStorei(GL.GL_PACK_ALIGNMENT, 1)
        GL.glTexImage2D(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA8, width, height, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, texels)
        back = GL.glGetTexImage(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE)
        np.testing.assert_array_equal(np.frombuffer(back, np.uint8).reshape(height, width, 4), texels)
        GL.glDeleteTextures([texture])


def test_info_json_reports_cuda_and_stream_path(cuda_display):
    result = subprocess.run([sys.executable, "-m", "eglcuda", "info", "--json"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["cuda"]["loaded"] and report["cuda"]["devices"]
    assert any(d["cuda_ordinal"] == 0 for d in report["egl"]["devices"])
    paths = {p["path"]: p for p in report["paths"]}
    assert paths["EGLStream CUDA -> CUDA"]["status"] in ("available", "planned")
    native = paths["EGLImage GL texture -> CUDA (native)"]
    if not report["cuda"]["devices"][0]["integrated"]:
        # The self-test's verdict, measured on this machine, not a table entry.
        assert native["status"] == "unsupported" and "not coherent" in native["why"]
        assert report["eglimage"]["path"] == "gl-interop" and report["eglimage"]["native_coherent"] is False
        assert paths["EGLImage GL texture -> CUDA (GL interop)"]["status"] == "available"
