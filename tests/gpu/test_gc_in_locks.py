"""Finalizers of CUDA-side objects, run by the garbage collector inside eglcuda's locked sections,
do not deadlock (a frame collected while a producer was being connected once hung the tests)."""
from __future__ import annotations

from ..gc_in_locks import run_case


def test_frame_collected_inside_the_device_lock(cuda_ordinal):
    out = run_case(f"""
        from eglcuda._bind import cuda as _cuda
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
        from eglcuda._bind import cuda as _cuda
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


def test_unused_dlpack_capsule_in_a_cycle_keeps_its_frame_until_collected(cuda_ordinal):
    out = run_case("""
        import sys, weakref
        frame = eglcuda.Frame.allocate(64, 48, eglcuda.ColorFormat.ARGB)
        watch = weakref.ref(frame)
        before = sys.getrefcount(frame)
        cycle = Cycle(frame.planes[0].__dlpack__())  # never consumed: its destructor frees it
        held = sys.getrefcount(frame) - before
        del frame
        alive = watch() is not None
        del cycle
        gc.collect()  # frees the capsule, which lets go of the frame...
        gc.collect()  # ...itself in a cycle with its planes (each plane keeps its frame alive)
        print("held", held, "alive", alive, "freed", watch() is None)
    """)
    assert "held 1 alive True freed True" in out
