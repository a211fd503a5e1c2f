"""A Subscriber's arguments are checked before anything is touched: a bad one is a UsageError
naming it, whatever the machine (no publisher, no GPU needed)."""
from __future__ import annotations

import re

import pytest

import eglcuda
from eglcuda.topics import Qos


@pytest.mark.parametrize("qos", [0, 1, 1.0, True, None, "sometimes", b"every"])
def test_qos_is_a_name_or_a_qos_member_only(qos, tmp_path):
    with pytest.raises(eglcuda.UsageError, match="qos is 'latest' or 'every'"):
        eglcuda.Subscriber("t", qos=qos, path=str(tmp_path / "t.topic"), timeout=0.1)


@pytest.mark.parametrize("qos", ["every", "LATEST", Qos.EVERY])
def test_qos_by_name_in_any_case_or_by_member_reaches_the_join(qos, tmp_path):
    # (no publisher there: the join times out, after the arguments were taken; without a CUDA
    # driver the device is what it stops at, also after them)
    with pytest.raises((eglcuda.Timeout, eglcuda.Unsupported)):
        eglcuda.Subscriber("t", qos=qos, path=str(tmp_path / "t.topic"), timeout=0.1)


def test_a_path_under_a_file_is_a_usage_error_naming_it(tmp_path):
    # (connect() said ENOTDIR: a bare NotADirectoryError, no path, where a file or a folder at the
    # path itself was already a UsageError naming it)
    from .helpers import subscriber

    (tmp_path / "afile").write_bytes(b"")
    path = str(tmp_path / "afile" / "t.topic")
    with pytest.raises(eglcuda.UsageError, match=re.escape(f"cannot connect to {path}: Not a directory")):
        subscriber(path, timeout=1)
