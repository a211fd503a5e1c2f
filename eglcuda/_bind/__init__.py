"""The binding layer: the only code that touches the compiled cffi module (``ffi``/``lib``).

- :mod:`.loader` opens libEGL, libcuda and libvulkan at first use and fills the call table;
- :mod:`.egl`, :mod:`.cuda`, :mod:`.cuda_egl`, :mod:`.gl` and :mod:`.vulkan` hold the calls of
  each library with its error funnel: every failure becomes the matching exception of
  :mod:`eglcuda.errors`, read right after the failing call (``egl_error``, ``check``,
  ``gl.check``, ``vulkan.check``); :mod:`.egl_stream`, :mod:`.egl_image`, :mod:`.egl_sync` and
  :mod:`.cuda_graphics` hold the calls of one upstream area each, through those funnels;
- :mod:`.hot` hands the stream endpoints (``eglcuda/streams/cuda.pyx``) the table of per-frame
  C helpers.

Upper layers see handles as ints (addresses) or opaque boxes made here, never cffi objects.
"""
