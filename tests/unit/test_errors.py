"""Error hierarchy, name tables, the loader's answer for a missing library, and input checks
that must fire before any driver call."""
from __future__ import annotations

import json

import pytest

import eglcuda
from eglcuda._bind import loader as _loader
from eglcuda.errors import CUDA_ERROR_NAMES, EGL_ERROR_NAMES, cuda_error_name, egl_error_name, gl_error_name


def test_hierarchy():
    for cls in (eglcuda.EGLError, eglcuda.CUDAError, eglcuda.GLError, eglcuda.VulkanError, eglcuda.Unsupported,
                eglcuda.ClosedError, eglcuda.UsageError, eglcuda.Timeout):
        assert issubclass(cls, eglcuda.EglCudaError)
    assert issubclass(eglcuda.UsageError, ValueError)
    assert issubclass(eglcuda.Timeout, TimeoutError)


def test_egl_error_names_cover_the_spec_range():
    for code in range(0x3000, 0x300F):
        assert code in EGL_ERROR_NAMES
    assert egl_error_name(0x300C) == "EGL_BAD_PARAMETER"
    assert egl_error_name(0x321B) == "EGL_BAD_STREAM_KHR"
    assert egl_error_name(0x1234) == "EGL error 0x1234"


def test_egl_error_message_names_code_and_call():
    error = eglcuda.EGLError(0x3008, "eglInitialize", "opening a display")
    assert (error.code, error.name, error.call) == (0x3008, "EGL_BAD_DISPLAY", "eglInitialize")
    assert str(error) == "eglInitialize failed with EGL_BAD_DISPLAY (0x3008) while opening a display"


def test_cuda_error_names():
    assert cuda_error_name(702) == "CUDA_ERROR_LAUNCH_TIMEOUT"
    assert cuda_error_name(999) == "CUDA_ERROR_UNKNOWN"
    assert cuda_error_name(12345) == "CUresult 12345"
    assert len(set(CUDA_ERROR_NAMES.values())) == len(CUDA_ERROR_NAMES)
    error = eglcuda.CUDAError(400, "cuEGLStreamConsumerAcquireFrame")
    assert error.name == "CUDA_ERROR_INVALID_HANDLE"
    assert "cuEGLStreamConsumerAcquireFrame failed with CUDA_ERROR_INVALID_HANDLE (400)" in str(error)


def test_gl_and_vulkan_errors_name_code_and_call():
    assert gl_error_name(0x0502) == "GL_INVALID_OPERATION"
    assert gl_error_name(0x1234) == "GL error 0x1234"
    error = eglcuda.GLError(0x0500, "glEGLImageTargetTexture2DOES", "binding texture 3 to the EGLImage")
    assert (error.code, error.name, error.call) == (0x0500, "GL_INVALID_ENUM", "glEGLImageTargetTexture2DOES")
    assert str(error) == ("glEGLImageTargetTexture2DOES failed with GL_INVALID_ENUM (0x0500) while binding texture 3 "
                          "to the EGLImage")
    error = eglcuda.VulkanError("vkCreateDevice", -7)
    assert (error.call, error.code) == ("vkCreateDevice", -7)
    assert str(error) == "vkCreateDevice failed with VkResult -7"


def test_modes_are_strings():
    # Each mode is defined once, as an enum whose members equal (and print as) the old strings.
    assert eglcuda.ImagePath.NATIVE == "native" and eglcuda.ImagePath("gl-interop") is eglcuda.ImagePath.GL_INTEROP
    assert eglcuda.SyncPath.EMULATED == "emulated" and eglcuda.SyncPath("native") is eglcuda.SyncPath.NATIVE
    assert [str(p) for p in eglcuda.ServerWaitPath] == ["egl", "semaphore", "client-wait"]
    assert f"{eglcuda.ImagePath.GL_INTEROP}" == "gl-interop"
    assert json.dumps({"path": eglcuda.ServerWaitPath.CLIENT_WAIT}) == '{"path": "client-wait"}'


def test_missing_library_is_unsupported_with_name_and_hint():
    library = _loader._Library("libeglcuda-test-missing.so.7")
    with pytest.raises(eglcuda.Unsupported) as info:
        _loader._open(library, "install it from somewhere", "cuda")
    assert info.value.missing == "libeglcuda-test-missing.so.7"
    assert "install it from somewhere" in str(info.value)
    # The failure is remembered: asking again answers the same without reopening.
    with pytest.raises(eglcuda.Unsupported):
        _loader._open(library, "install it from somewhere", "cuda")


@pytest.mark.parametrize("ordinal", [-1, 1.0, "0", None])
def test_for_cuda_device_rejects_bad_ordinals_before_egl(ordinal):
    with pytest.raises(eglcuda.UsageError):
        eglcuda.Display.for_cuda_device(ordinal)


def test_for_device_rejects_non_devices():
    with pytest.raises(eglcuda.UsageError):
        eglcuda.Display.for_device("/dev/dri/renderD128")


def test_objects_of_the_wrong_kind_are_named_before_any_driver_call(tmp_path):
    """What used to escape as AttributeError or TypeError from inside."""
    path = str(tmp_path / "s.sock")
    with pytest.raises(eglcuda.UsageError, match="eglcuda.Display"):
        eglcuda.Stream.from_fd(None, 0)
    with pytest.raises(eglcuda.UsageError, match="eglcuda.Display"):
        eglcuda.receive_stream(None, path, timeout=0.1)
    with pytest.raises(eglcuda.UsageError, match="eglcuda.Stream"):
        eglcuda.serve_stream(None, path, timeout=0.1)
    with pytest.raises(eglcuda.UsageError, match="unknown capability"):
        eglcuda.available(["egl"])
    assert not (tmp_path / "s.sock").exists()


def _errors_as_raised():
    from eglcuda.errors import MPSError, MPSInUse, VulkanError
    from eglcuda.remote.wire import WireError
    from eglcuda.topics.protocol import ProtocolError, VersionError
    return [
        eglcuda.EGLError(0x300C, "eglCreateStreamKHR", doing="making a stream"),
        eglcuda.CUDAError(201, "cuCtxPushCurrent", description="invalid device context", doing="importing"),
        eglcuda.GLError(0x0502, "glTexImage2D"),
        VulkanError("vkCreateSemaphore", -3),
        eglcuda.Unsupported("libcuda.so.1", "this machine", "install the NVIDIA driver"),
        MPSError("the daemon did not start", log="line one\nline two"),
        MPSInUse("another daemon serves", pipe_directory="/tmp/mps-pipes"),
        eglcuda.Dropped("it fell behind", code=3),
        eglcuda.Refused("wrong user", code=1),
        eglcuda.MismatchedSource("320x240 NV12 against 640x480 NV12"),
        eglcuda.Timeout("no frame in 0.5 s"),
        eglcuda.ClosedError("closed"),
        ProtocolError("a message of 9 bytes"),
        VersionError("protocol 9"),
        WireError("bad tag"),
    ]


def _public_state(error):
    return type(error), str(error), error.args, vars(error)


def test_every_error_pickles_and_copies_with_its_message_and_attributes():
    import copy
    import pickle
    for error in _errors_as_raised():
        for again in (pickle.loads(pickle.dumps(error)), copy.copy(error), copy.deepcopy(error)):
            assert _public_state(again) == _public_state(error)


_POOL_ROUND_TRIP = """
import concurrent.futures, multiprocessing, pickle, sys
errors = pickle.loads(sys.stdin.buffer.read())
state = lambda error: (type(error), str(error), error.args, vars(error))
with concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
    futures = [pool.submit(exec, f"import pickle\\nraise pickle.loads({pickle.dumps(error)!r})") for error in errors]
    for future, error in zip(futures, errors):
        raised = future.exception(timeout=60)
        print(type(error).__name__, "intact" if state(raised) == state(error) else f"arrived as {state(raised)!r}")
"""


def test_an_error_raised_in_a_process_pool_worker_reaches_the_parent_intact(tmp_path):
    """Each error raised in a spawned worker of a process pool reaches the parent as it was. (In
    a fresh interpreter outside the checkout: a spawned worker imports eglcuda again, and must
    find the same one as its parent.)"""
    import pickle
    import subprocess
    import sys

    expected = _errors_as_raised()
    done = subprocess.run([sys.executable, "-c", _POOL_ROUND_TRIP], input=pickle.dumps(expected), cwd=tmp_path,
                          capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    assert done.stdout.decode().splitlines() == [f"{type(error).__name__} intact" for error in expected]


@pytest.mark.parametrize("call", [lambda: eglcuda.get_device(-1), lambda: eglcuda.cuda_device.device_info(-2),
                                  lambda: eglcuda.cuda_device.device_info(__import__("numpy").int64(-1)),
                                  lambda: eglcuda.Frame.allocate(8, 8, device=-1)])
def test_a_negative_cuda_ordinal_is_a_usage_error_not_a_missing_device(call):
    """A program that falls back to the CPU on Unsupported must not take its own bug for a
    machine without a GPU: a negative ordinal is refused before the driver is asked."""
    with pytest.raises(eglcuda.UsageError, match="0 or more, got -"):
        call()
