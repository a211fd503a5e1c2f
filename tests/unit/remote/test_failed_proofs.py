"""Failed key proofs are logged with the peer's address, at most one line a minute per host (a
guesser's every connection comes from another port), with the count since the last line."""
from __future__ import annotations

import pytest

pytest.importorskip("numpy")
from eglcuda.remote import server  # noqa: E402


def test_failed_proofs_are_counted_per_address_and_logged_once_a_minute(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(server.time, "monotonic", lambda: now[0])
    proofs = server._FailedProofs()
    assert proofs.note("10.0.0.9:4000") == 1  # the first from a host: logged at once
    assert [proofs.note(f"10.0.0.9:{4001 + i}") for i in range(5)] == [0] * 5  # within the minute: counted
    assert proofs.note("10.0.0.7:4001") == 1  # another host has its own minute
    assert proofs.note("[fd00::9]:4001") == 1 and proofs.note("[fd00::9]:4002") == 0
    now[0] += 61
    assert proofs.note("10.0.0.9:4100") == 6  # the five counted and this one
    assert proofs.note("10.0.0.9:4000") == 0


def test_the_addresses_remembered_are_bounded(monkeypatch):
    monkeypatch.setattr(server._FailedProofs, "ADDRESSES", 4)
    proofs = server._FailedProofs()
    for host in range(10):
        proofs.note(f"10.0.0.{host}:4000")
    assert len(proofs._seen) == 4
