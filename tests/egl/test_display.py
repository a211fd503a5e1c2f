"""Devices, displays and their lifetimes on whatever EGL this machine has (Mesa on CI)."""
from __future__ import annotations

import pytest

import eglcuda
from eglcuda._bind import egl


def test_devices_enumerate(egl_device):
    found = eglcuda.devices()
    assert found and found[0].index == 0
    assert [d.index for d in found] == list(range(len(found)))
    for device in found:
        assert device.handle_address != 0
        assert isinstance(device.extensions, frozenset)
        assert device.cuda_ordinal is None or device.cuda_ordinal >= 0
        assert str(device).startswith(f"EGL device {device.index}")


def test_client_extensions_list_device_platform(egl_device):
    extensions = eglcuda.client_extensions()
    assert "EGL_EXT_platform_device" in extensions
    assert {"EGL_EXT_device_enumeration", "EGL_EXT_device_base"} & extensions


def test_display_opens_reports_and_closes_twice(egl_device):
    display = eglcuda.Display.for_device(egl_device)
    assert display.version >= (1, 4)
    assert display.vendor
    assert display.extensions and all(name.startswith("EGL_") for name in display.extensions)
    assert not display.closed
    display.close()
    display.close()
    assert display.closed
    with pytest.raises(eglcuda.ClosedError):
        display.handle
    with pytest.raises(eglcuda.ClosedError):
        display.create_context()
    with pytest.raises(eglcuda.ClosedError):
        display.require("EGL_KHR_image_base")
    assert display.supports("EGL_KHR_image_base") is False  # never raises, even closed


def test_context_manager_closes(egl_device):
    with eglcuda.Display.for_device(egl_device) as display:
        assert not display.closed
    assert display.closed


def test_two_displays_on_one_device_are_counted(egl_device):
    # EGL returns one handle per device and eglTerminate is not counted: closing the first must
    # leave the second usable.
    first = eglcuda.Display.for_device(egl_device)
    second = eglcuda.Display.for_device(egl_device)
    assert first._address == second._address
    first.close()
    with second.create_context() as context:
        assert context.is_current
    second.close()


def test_supports_and_require(display):
    some = sorted(display.extensions)[0]
    assert display.supports(some) is True
    assert display.supports("EGL_EGLCUDA_not_an_extension") is False
    assert display.supports(None) is False  # bad input still answers
    display.require(some)
    with pytest.raises(eglcuda.Unsupported) as info:
        display.require(some, "EGL_EGLCUDA_not_an_extension")
    assert info.value.missing == "EGL_EGLCUDA_not_an_extension"
    assert display.vendor in str(info.value)


def test_surfaceless_display(egl_device):
    if "EGL_MESA_platform_surfaceless" not in eglcuda.client_extensions():
        pytest.skip("EGL_MESA_platform_surfaceless missing")
    with eglcuda.Display.surfaceless() as display:
        assert display.device is None
        with display.create_context() as context:
            assert context.is_current


def test_default_display(egl_device):
    with eglcuda.Display.default() as display:
        assert display.version >= (1, 4)


def test_terminated_display_surfaces_as_egl_error_with_name(display):
    # Terminate behind eglcuda's back: the next driver call must become an EGLError naming
    # EGL_NOT_INITIALIZED and the call, not a crash.
    egl.terminate(display.handle)
    with pytest.raises(eglcuda.EGLError) as info:
        display.create_context()
    assert info.value.name == "EGL_NOT_INITIALIZED"
    assert info.value.code == 0x3001
    assert info.value.call == "eglChooseConfig"


def test_driver_refusal_is_egl_error(display):
    with pytest.raises(eglcuda.EGLError) as info:
        display.create_context(version=(99, 0))
    assert info.value.name == "EGL_BAD_MATCH"
    assert info.value.call == "eglCreateContext"


def test_closing_display_closes_its_contexts(egl_device):
    display = eglcuda.Display.for_device(egl_device)
    context = display.create_context()
    context.make_current()
    display.close()
    assert context.closed
    assert egl.current_context() == 0
    context.close()  # still safe
