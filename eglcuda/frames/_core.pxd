# Declarations shared by the frames layer's extension (_core.pyx) and the stream endpoints
# (streams/cuda.pyx), which read a frame's driver description without Python attribute lookups.

cdef extern from "eglcuda_types.h" nogil:
    ctypedef void *CUarray
    ctypedef int CUeglFrameType
    ctypedef int CUeglColorFormat
    ctypedef int CUarray_format
    union _CUeglFramePlanes:
        CUarray pArray[3]
        void *pPitch[3]
    ctypedef struct CUeglFrame:
        _CUeglFramePlanes frame
        unsigned int width
        unsigned int height
        unsigned int depth
        unsigned int pitch
        unsigned int planeCount
        unsigned int numChannels
        CUeglFrameType frameType
        CUeglColorFormat eglColorFormat
        CUarray_format cuFormat
    enum:
        CU_EGL_FRAME_TYPE_ARRAY
        CU_EGL_FRAME_TYPE_PITCH
        CU_AD_FORMAT_UNSIGNED_INT8


cdef class ProducerLink:
    """What a frame knows of a producer it was presented on (no reference to the producer)."""
    cdef public bint connected


from eglcuda._resource cimport Resource


cdef class FrameCore(Resource):
    """The part of a Frame the per-frame path reads: its driver description and key."""
    cdef CUeglFrame egl
    cdef readonly unsigned long long key
    # The links of the producers this frame was presented on since they connected, and the last
    # one it was presented on (checked first: a frame usually cycles on one producer).
    cdef list links
    cdef ProducerLink last_link
    # The CUDA streams the frame was handed to (DLPack, copies) since its last present or publish:
    # what the next one is ordered after (docs/ordering.md). None: none.
    cdef public list _handed_to
    # The frames whose planes Frame.from_arrays wrapped while eglcuda only lends them (an acquired
    # frame, a message): this frame is usable only while they are; () for any other frame.
    cdef public tuple _sources
