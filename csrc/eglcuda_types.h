/* The declarations of csrc/ as one C header, for eglcuda's Cython extensions (frames/_core.pyx,
 * streams/cuda.pyx): they take the driver's types and the per-frame helper table from here, so
 * the C compiler checks them against the same text the cffi module is built from. */
#include <stddef.h>
#include <stdint.h>
#include "egl_core.h"
#include "egl_stream.h"
#include "cuda_egl.h"
#include "hot_api.h"
