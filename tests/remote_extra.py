"""The remote tests' skip: a relay and its remote subscribers need both halves of the remote extra,
UCXX and pyca/cryptography (every message is sealed), so a machine with one but not the other
skips them naming what it lacks rather than failing inside a peer process."""
from __future__ import annotations

import importlib.util

import pytest

REMOTE_EXTRA = ("ucxx", "cryptography")


def missing(first: str = "remote-cu12", second: str = "remote-cu13") -> str | None:
    """Why the remote tests cannot run here (naming each module absent and the extra that brings
    it), or None when both are importable."""
    absent = [name for name in REMOTE_EXTRA if importlib.util.find_spec(name) is None]
    if not absent:
        return None
    verb = "is" if len(absent) == 1 else "are"
    return f"{' and '.join(absent)} {verb} not installed: pip install -e '.[{first}]' (or {second})"


def skip_without(first: str = "remote-cu12", second: str = "remote-cu13") -> None:
    """Skip the calling test unless the remote extra is installed."""
    reason = missing(first, second)
    if reason is not None:
        pytest.skip(reason)
