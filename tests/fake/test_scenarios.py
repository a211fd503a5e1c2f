"""The stream scenarios shared with the GPU tier (tests/stream_scenarios.py), on the fake driver."""
from __future__ import annotations

from typing import Any

import pytest

from .. import stream_scenarios
from .harness import fake_driver_test
from .kit import display


@pytest.mark.parametrize("name, options", stream_scenarios.CASES)
@fake_driver_test
def test_scenario(name: str, options: dict[str, Any]) -> None:
    with display() as opened:
        stream_scenarios.run(opened, name, options)
