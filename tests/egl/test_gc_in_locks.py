"""A Display's finalizer, run by the garbage collector while its lock is held, does not deadlock."""
from __future__ import annotations

from ..gc_in_locks import run_case


def test_display_collected_inside_the_display_lock(egl_device):
    out = run_case(f"""
        from eglcuda import display as _display
        device = eglcuda.devices()[{egl_device.index}]
        cycle = Cycle(eglcuda.Display.for_device(device))
        address = cycle.payload._address
        del cycle
        with _display._refs_lock:  # as if this thread were opening a display when GC ran
            collected = gc.collect()
        print("refs", _display._refs.get(address, 0), "collected", collected > 0)
    """)
    assert "refs 0 collected True" in out
