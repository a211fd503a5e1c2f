"""1,000 open/close cycles of displays and GL contexts: process memory stays flat, and garbage
collection alone releases what was never closed."""
from __future__ import annotations

import gc
import os
import weakref

import eglcuda

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


def grows(cycle, warmup: int = 50, cycles: int = 1000) -> int:
    for _ in range(warmup):
        cycle()
    gc.collect()
    before = rss_bytes()
    for _ in range(cycles):
        cycle()
    gc.collect()
    return rss_bytes() - before


def test_display_open_close_is_flat(egl_device):
    def cycle():
        display = eglcuda.Display.for_device(egl_device)
        display.close()

    # A leaked display holds the driver's per-display state (MBs on Mesa); 1,000 leaks would
    # show as far more than 8 MiB.
    assert grows(cycle) < 8 << 20


def test_context_create_close_is_flat(display):
    def cycle():
        context = display.create_context(surfaceless=False)
        context.make_current()
        context.close()

    assert grows(cycle) < 8 << 20


def test_garbage_collection_releases_unclosed_objects(egl_device):
    def cycle():
        display = eglcuda.Display.for_device(egl_device)
        context = display.create_context()
        context.make_current()
        # Neither is closed: dropping the references must release both.

    assert grows(cycle, warmup=20, cycles=300) < 8 << 20
    display = eglcuda.Display.for_device(egl_device)
    context = display.create_context()
    ref_d, ref_c = weakref.ref(display), weakref.ref(context)
    finalizers = (display._finalizer, context._finalizer)
    del display, context
    gc.collect()
    assert ref_d() is None and ref_c() is None
    assert not any(f.alive for f in finalizers)
