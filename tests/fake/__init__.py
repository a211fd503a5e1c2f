"""Tests against the fake driver of tests/fakes/ (see conftest.py)."""
