"""Polling with a deadline, for what the tests wait on outside a peer's messages (files that go,
processes that end); tests/json_peer.py waits on a peer's messages."""
from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(condition: Callable[[], object], seconds: float) -> bool:
    """Whether ``condition()`` became true within ``seconds`` (asked once more at the deadline)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return bool(condition())
