"""eglcuda.available(): names, answers, caching, and the one-line reasons scripts print."""
from __future__ import annotations

import os
import time

import pytest

import eglcuda
from eglcuda import availability

from ..forking import said_in_forked_child


def test_every_name_answers_a_bool_or_a_bool_and_a_reason():
    for name in availability.CAPABILITIES:
        ok = eglcuda.available(name)
        assert isinstance(ok, bool)
        answer = eglcuda.available(name, reason=True)
        assert isinstance(answer, tuple) and answer[0] is ok
        assert isinstance(answer[1], str) and answer[1] and "\n" not in answer[1]


def test_every_name_says_what_it_needs():
    assert set(availability.NEEDS) == set(availability.CAPABILITIES)


def test_an_unknown_name_is_a_usage_error_not_a_no():
    with pytest.raises(eglcuda.UsageError, match="cuda-stream"):
        eglcuda.available("cuda_stream")


@pytest.mark.parametrize("reason", ["cross-process", "", 1, 0, None])
def test_reason_is_true_or_false_and_a_second_name_is_not_a_yes(reason):
    """available("cuda-stream", "cross-process") reads as asking about two names: its (False, why)
    tuple would be truthy on every machine. Anything but True or False is refused."""
    with pytest.raises(eglcuda.UsageError, match="reason is True or False"):
        eglcuda.available("cuda-stream", reason)
    with pytest.raises(eglcuda.UsageError, match="reason is True or False"):
        eglcuda.available("cuda-stream", reason=reason)


def test_reason_may_be_numpys_bool():
    np = pytest.importorskip("numpy")
    assert eglcuda.available("egl", reason=np.bool_(True)) == eglcuda.available("egl", reason=True)
    assert eglcuda.available("egl", reason=np.bool_(False)) is eglcuda.available("egl")


def test_answers_are_cached_and_fast():
    first = eglcuda.available("cuda-stream", reason=True)
    started = time.perf_counter()
    for _ in range(1000):
        assert eglcuda.available("cuda-stream", reason=True) == first
    assert time.perf_counter() - started < 0.1


def test_explain_names_what_is_needed(monkeypatch):
    monkeypatch.setitem(availability._answers, "two-gpus", (False, "needs two CUDA devices: this machine has 1"))
    monkeypatch.setitem(availability._answers, "egl", (True, "EGL device 0"))
    assert availability.explain("egl") is None
    assert availability.explain("egl", "two-gpus") == (
        "needs two NVIDIA GPUs with EGL streams: needs two CUDA devices: this machine has 1")


def test_a_failing_probe_is_a_no_with_the_failure_as_reason(monkeypatch):
    def broken() -> tuple[bool, str]:
        raise RuntimeError("the driver said something odd")

    monkeypatch.setitem(availability.CAPABILITIES, "cuda-ipc", broken)
    monkeypatch.delitem(availability._answers, "cuda-ipc", raising=False)
    try:
        ok, why = eglcuda.available("cuda-ipc", reason=True)
        assert not ok and "RuntimeError: the driver said something odd" in why
    finally:
        availability._answers.pop("cuda-ipc", None)


def test_gpu_names_rest_on_cuda():
    cuda = eglcuda.available("cuda")
    for name in ("cuda-egl", "cuda-stream", "cross-process", "gl-stream", "eglimage-cuda", "cuda-sync", "two-gpus"):
        if eglcuda.available(name):
            assert cuda, name


@pytest.mark.parametrize("which, variable, name", [("cuda", "EGLCUDA_LIBCUDA", "libcuda.so.1"),
                                                   ("egl", "EGLCUDA_LIBEGL", "libEGL.so.1")])
def test_a_driver_library_that_is_there_but_does_not_load_is_not_called_missing(which, variable, name, tmp_path):
    """A file in the library's place that does not load (here: not a library at all; on a
    machine, a dependency missing): the reason says it is there and gives the loader's words,
    not "no libcuda.so.1 on this machine" and how to install it."""
    import subprocess
    import sys

    broken = tmp_path / "broken.so"
    broken.write_text("not a library\n")
    code = f"import eglcuda; print(eglcuda.available({which!r}, reason=True)[1])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, variable: str(broken)})
    said = result.stdout.strip()
    assert result.returncode == 0 and said.startswith(f"{name} is there but does not load ("), result
    assert str(broken) in said, said


def test_a_child_forked_while_a_thread_probes_gets_answers(monkeypatch):
    """available() in a child forked while another thread of the parent was inside a probe waited
    forever: the child inherited the probes' lock held by a thread it does not have."""
    import threading

    inside, leave = threading.Event(), threading.Event()
    parent = os.getpid()

    def slow_probe() -> tuple[bool, str]:
        if os.getpid() == parent:
            inside.set()
            leave.wait(30)
        return True, "probed"

    cuda = eglcuda.available("cuda", reason=True)  # (asked before: the parent's probes wait for the slow one)
    monkeypatch.setitem(availability.CAPABILITIES, "two-gpus", slow_probe)
    monkeypatch.delitem(availability._answers, "two-gpus", raising=False)
    prober = threading.Thread(target=eglcuda.available, args=("two-gpus",), daemon=True)
    prober.start()
    try:
        assert inside.wait(30)
        def report() -> str:
            answer = eglcuda.available("cuda", reason=True)
            return f"{answer[0]}|{answer[1]}|{eglcuda.available('two-gpus')}"

        code, said = said_in_forked_child(report)
        assert code == 0, f"the child's available() hung (status {code})"
        # The child's answers: the parent's cached one, and the probe the parent's thread was in, run again.
        assert said == f"{cuda[0]}|{cuda[1]}|True"
    finally:
        leave.set()
        prober.join(30)
        availability._answers.pop("two-gpus", None)
