"""eglcuda.Batcher on the GPU: publisher processes (tests/gpu/topics_peer.py) and a batching
process (tests/gpu/batcher_peer.py) that checks every byte of every image of every batch.

Covered: batches from several topics through each transport (NV12 and ARGB), round-robin
collection while every source has frames queued, and the order on the GPU with a slow reader on
the smallest pool (one batch buffer): the reader takes each batch on a side stream behind a long
kernel (through DLPack, or ``__cuda_array_interface__`` with the stream named at release), the
batch is released before the GPU read it, and the copy the reader made must still be the batch's
bytes (the next batch's copies into the same buffer waited for it)."""
from __future__ import annotations

import os

import pytest

import eglcuda

from ..conftest import require_extension
from .batcher_kit import Sources, folder, run  # noqa: F401  (fixture)


@pytest.fixture
def display(cuda_display):
    require_extension(cuda_display, "EGL_KHR_stream", "EGL_KHR_stream_fifo", "EGL_KHR_stream_cross_process_fd")
    return cuda_display


def make_sources(folder: str, transport: str) -> Sources:  # noqa: F811
    if transport == "cuda-ipc" and eglcuda.get_device(0).info.integrated:
        pytest.skip("CUDA IPC is not available on an integrated GPU (Tegra)")
    return Sources(dict(os.environ), folder, transport)


def offer(transport: str) -> dict:
    return {"offer": "cuda-vmm"} if transport == "cuda-vmm" else {}  # (offered alone: its pool is VMM memory)


@pytest.mark.parametrize("transport,fmt,size", [
    ("cuda-ipc", "NV12", (1920, 1080)),
    ("cuda-ipc", "ARGB", (333, 97)),
    ("cuda-ipc", "YUV420_PLANAR", (320, 240)),
    ("cuda-vmm", "NV12", (640, 480)),
    ("eglstream", "NV12", (640, 480)),
])
def test_every_byte_of_batches_from_four_sources(display, folder, transport, fmt, size):  # noqa: F811
    sources = make_sources(folder, transport)
    try:
        for seed in (1, 2, 3, 4):
            sources.add(seed, rate=120, width=size[0], height=size[1], fmt=fmt, **offer(transport))
        batches = run(sources.batcher("batch", "--batch-size", "4", "--count", "30", "--formation-ms", "100"), 30)
    finally:
        sources.stop()
    per_source: dict[int, list[int]] = {}
    for b in batches:
        for source, seq in zip(b["sources"], b["seqs"]):
            per_source.setdefault(source, []).append(seq)
    assert sorted(per_source) == [0, 1, 2, 3]
    for seqs in per_source.values():  # qos every: nothing lost, nothing twice
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), per_source
    assert sum(b["size"] for b in batches) >= 60  # mostly full batches at 4 x 120 frames/s


def test_round_robin_while_every_source_has_frames_queued(display, folder):  # noqa: F811
    sources = make_sources(folder, "cuda-ipc")
    try:
        for seed in (5, 6, 7):
            sources.add(seed, rate=0, width=640, height=480)
        batches = run(sources.batcher("batch", "--batch-size", "6", "--count", "4", "--queue", "8",
                                      "--prefill-ms", "500", "--formation-ms", "500"), 4)
    finally:
        sources.stop()
    for b in batches:  # each pass takes one frame of each source, in turn
        assert b["size"] == 6 and b["sources"][:3] == b["sources"][3:] and sorted(b["sources"][:3]) == [0, 1, 2], b


@pytest.mark.parametrize("via", ["dlpack", "cai"])
@pytest.mark.parametrize("transport", ["cuda-ipc", "eglstream"])
def test_a_slow_reader_on_the_smallest_pool_reads_its_own_batch(display, folder, transport, via):  # noqa: F811
    pytest.importorskip("cupy")
    sources = make_sources(folder, transport)
    try:
        for seed in (8, 9):
            sources.add(seed, rate=0, width=1280, height=720, pool=2)
        batches = run(sources.batcher("batch", "--batch-size", "2", "--count", "20", "--pool", "1",
                                      "--slow-reader-ms", "20", "--via", via), 20)
    finally:
        sources.stop()
    # The reader's stream was still running when most batches were released: the check means
    # something (a batch released after the GPU read it proves nothing).
    assert sum(b["busy_at_release"] for b in batches) >= 15, [b["busy_at_release"] for b in batches]


def test_close_from_another_thread_ends_a_waiting_next(display, folder):  # noqa: F811
    """On the GPU: close() from another thread ends a waiting next() at once (ClosedError) and
    leaves no descriptor behind (tests/unit/topics/test_batcher_fakecuda.py says more)."""
    sources = make_sources(folder, "cuda-ipc")
    try:
        sources.add(12, rate=1, width=640, height=480)
        peer = sources.batcher("interrupt", "--batch-size", "2")
        try:
            result = peer.wait_for(lambda m: m["event"] == "interrupt", timeout=60)
        finally:
            peer.stop()
    finally:
        sources.stop()
    for kind, seconds, closed in result["outcomes"][0::2]:
        assert kind == "ClosedError" and seconds < 0.6 and closed, result
    assert result["signal_in_next"]["seen"] == ["UsageError", "closed", "ClosedError"], result
    assert result["signal_close"]["seen"] == ["handler", "closed", "released"], result
    assert result["fork_beside_release"] == {"child": 0, "parent_released": True, "wrong": []}, result
    assert result["fds_after"] == result["fds_before"], result


def test_a_frame_taken_before_an_error_comes_in_the_next_batch(display, folder):  # noqa: F811
    """On the GPU: a frame taken in a next() that then raised (another source's receive refused)
    comes in the next batch, every byte right."""
    sources = make_sources(folder, "cuda-ipc")
    try:
        sources.add(13, rate=200, width=640, height=480)
        sources.add(14, rate=200, width=640, height=480)
        peer = sources.batcher("interrupt", "--hold-second", "--batch-size", "4", "--queue", "4", "--count", "6",
                               "--formation-ms", "200")
        try:
            result = peer.wait_for(lambda m: m["event"] == "interrupt", timeout=60)
        finally:
            peer.stop()
    finally:
        sources.stop()
    assert result["raised"] == ["UsageError", "UsageError"] and all(not b["wrong"] for b in result["batches"])
    first = [seq for b in result["batches"] for source, seq in zip(b["sources"], b["seqs"]) if source == 0]
    assert first == list(range(result["before"] + 1, result["before"] + 1 + len(first))), result


def test_bad_input_is_refused_with_the_reason(display, folder):  # noqa: F811
    sources = make_sources(folder, "cuda-ipc")
    try:
        sources.add(10, rate=100, width=64, height=48)
        sources.add(11, rate=100, width=64, height=48, fmt="ARGB")
        peer = sources.batcher("misuse")
        try:
            results = peer.wait_for(lambda m: m["event"] == "misuse")["results"]
        finally:
            peer.stop()
    finally:
        sources.stop()
    assert results["mixed"][0] == "MismatchedSource" and "64x48 ARGB" in results["mixed"][1], results
    assert results["pool_exhausted"][0] == "UsageError" and results["closed_subscriber"][0] == "ClosedError", results


def test_torch_and_cupy_take_the_batch_without_a_copy(display, folder):  # noqa: F811
    pytest.importorskip("torch")
    pytest.importorskip("cupy")
    sources = make_sources(folder, "cuda-ipc")
    try:
        for seed in (12, 13, 14):
            sources.add(seed, rate=100, width=640, height=480)
        batches = run(sources.batcher("batch", "--batch-size", "3", "--count", "10", "--torch"), 10)
    finally:
        sources.stop()
    assert all(b["torch"] == {"same_memory": True, "same_bytes": True} for b in batches), batches


def test_a_source_joined_again_behind_the_batcher_is_batched_from_its_new_publisher(display, folder):  # noqa: F811
    """Source 0's publisher killed and replaced; the program drains its subscriber and calls
    wait_for_publisher() itself: the new publisher's frames are batched byte for byte, with
    skipped counted from that publisher's seqs (0 each for an 'every' source)."""
    sources = make_sources(folder, "cuda-ipc")
    try:
        sources.add(15, rate=100, width=640, height=480)
        sources.add(16, rate=100, width=640, height=480)
        peer = sources.batcher("rejoin", "--batch-size", "2", "--count", "20")
        try:
            peer.wait_for(lambda m: m["event"] == "formed")
            sources.replace(0, seed=17, rate=100, width=640, height=480)
            peer.send("go 17")
            report = peer.wait_for(lambda m: m["event"] == "rejoined")
        finally:
            peer.stop()
    finally:
        sources.stop()
    assert report["ended"] == "StreamDisconnected" and report["left"] == [] and report["wrong"] == [], report
    seqs = [seq for seq, _ in report["after"]]
    assert [skipped for _, skipped in report["after"]] == [0] * len(seqs), report
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), report
