"""Finalizers of CUDA-side objects, run by the garbage collector inside eglcuda's locked sections,
do not deadlock (a frame collected while a producer was being connected once hung the tests)."""
from __future__ import annotations

from ..gc_in_locks import run_case


def test_frame_collected_inside_the_device_lock(cuda_ordinal):
    out = run_case(f"""
        from eglcuda import _cuda
        device = eglcuda.get_device({cuda_ordinal})
        free_before = device.memory_info()[0]
        cycle = Cycle(eglcuda.Frame.allocate(4096, 4096, eglcuda.ColorFormat.ARGB))
        held = free_before - device.memory_info()[0]
        del cycle
        with _cuda._init_lock:  # as if this thread were looking up a device when GC ran
            gc.collect()
        returned = device.memory_info()[0] - (free_before - held)
        print("held", held >= 4096 * 4096 * 4, "returned", returned >= 0)
    """)
    assert "held True returned True" in out


def test_stream_objects_collected_inside_the_device_lock(cuda_display):
    out = run_case("""
        from eglcuda import _cuda
        display = eglcuda.Display.for_cuda_device(0)
        stream = display.create_stream()
        consumer = stream.connect_cuda_consumer()
        producer = stream.connect_cuda_producer(64, 48)
        cycle = Cycle((stream, consumer, producer, producer.allocate_frame()))
        del stream, consumer, producer, cycle
        with _cuda._init_lock:
            gc.collect()
        print("collected")
    """)
    assert "collected" in out


def test_unused_dlpack_capsule_collected_inside_the_capsule_lock(cuda_ordinal):
    out = run_case("""
        from eglcuda import _interop
        frame = eglcuda.Frame.allocate(64, 48, eglcuda.ColorFormat.ARGB)
        cycle = Cycle(frame.planes[0].__dlpack__())  # never consumed: its destructor frees it
        assert len(_interop._keep_alive) == 1
        del cycle
        with _interop._keep_lock:  # as if this thread were exporting another plane when GC ran
            gc.collect()
        print("kept", len(_interop._keep_alive))
    """)
    assert "kept 0" in out
