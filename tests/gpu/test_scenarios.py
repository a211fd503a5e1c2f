"""The stream scenarios shared with the fake-driver tier (tests/stream_scenarios.py), on NVIDIA's
driver."""
from __future__ import annotations

from typing import Any

import pytest

from .. import stream_scenarios
from ..conftest import require_extension


@pytest.mark.parametrize("name, options", stream_scenarios.CASES)
def test_scenario(cuda_display, name: str, options: dict[str, Any]) -> None:
    require_extension(cuda_display, "EGL_KHR_stream")
    stream_scenarios.run(cuda_display, name, options)
