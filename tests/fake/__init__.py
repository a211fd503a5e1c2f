"""Tests against the fake driver of tests/fakedriver/ (see conftest.py)."""
