# cython: language_level=3
"""The frames layer's compiled part: a frame's driver description, the links to the producers it
was presented on, and DLPack capsules.

A :class:`FrameCore` holds the ``CUeglFrame`` a producer hands the driver, inside the object, so
the stream endpoints (``streams/cuda.pyx``, which cimport this type) present a frame by reading
C fields, with no Python attribute lookup.
"""
from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid, PyCapsule_New
from cpython.ref cimport Py_DECREF, Py_INCREF, PyObject
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.string cimport memset


cdef class ProducerLink:
    """Shared by a producer and every frame it presented: ``connected`` turns False when the
    producer disconnects, so a frame can tell whether a driver may still use it without keeping
    any producer alive."""

    def __cinit__(self):
        self.connected = True


cdef class FrameCore:
    """Base of :class:`eglcuda.Frame`: the driver's description of the frame (set once by
    ``_describe``) and the producers it was presented on."""

    _exit_rank = 1  # at exit, frames are freed after the streams they were presented on

    def __cinit__(self, *args, **kwargs):
        # Frame's keyword arguments reach __cinit__ too; they are Frame.__init__'s to read.
        self.links = []
        self._sources = ()
        memset(&self.egl, 0, sizeof(CUeglFrame))

    def _describe(self, bint array, tuple plane_addresses, unsigned int width, unsigned int height,
                  unsigned int pitch, unsigned int channels, int color_format):
        """Fill the driver's description: plane addresses (device pointers, or CUarray handles
        with ``array``), plane 0's size and pitch, channels, and the CUeglColorFormat value."""
        cdef Py_ssize_t count = len(plane_addresses)
        cdef Py_ssize_t i
        if not 1 <= count <= 3:
            raise ValueError(f"a frame has 1 to 3 planes, got {count}")
        memset(&self.egl, 0, sizeof(CUeglFrame))
        for i in range(count):
            self.egl.frame.pPitch[i] = <void *><uintptr_t>int(plane_addresses[i])
        self.egl.width = width
        self.egl.height = height
        self.egl.depth = 1
        self.egl.pitch = 0 if array else pitch
        self.egl.planeCount = <unsigned int>count
        self.egl.numChannels = channels
        self.egl.frameType = CU_EGL_FRAME_TYPE_ARRAY if array else CU_EGL_FRAME_TYPE_PITCH
        self.egl.eglColorFormat = color_format
        self.egl.cuFormat = CU_AD_FORMAT_UNSIGNED_INT8
        self.key = <unsigned long long><uintptr_t>self.egl.frame.pPitch[0]

    @property
    def _egl_address(self) -> int:
        """The address of the frame's ``CUeglFrame`` (valid as long as the frame object lives)."""
        return <uintptr_t>&self.egl

    @property
    def presented(self) -> bool:
        """Whether a producer the frame was presented on is still connected: the driver may still
        use the frame's memory until every one of them disconnects."""
        cdef ProducerLink link
        for link in self.links:
            if link.connected:
                return True
        return False

    def _drop_disconnected_links(self) -> None:
        self.links = [link for link in self.links if (<ProducerLink>link).connected]
        if self.last_link is not None and not self.last_link.connected:
            self.last_link = None


# ---- DLPack ------------------------------------------------------------------------------------
# Layouts from dlpack.h (v1.0): DLManagedTensor for the "dltensor" capsule and
# DLManagedTensorVersioned, which can say read-only, for "dltensor_versioned".

cdef struct DLDevice:
    int32_t device_type
    int32_t device_id

cdef struct DLDataType:
    uint8_t code
    uint8_t bits
    uint16_t lanes

cdef struct DLTensor:
    void *data
    DLDevice device
    int32_t ndim
    DLDataType dtype
    int64_t *shape
    int64_t *strides
    uint64_t byte_offset

cdef struct DLManagedTensor:
    DLTensor dl_tensor
    void *manager_ctx
    void (*deleter)(DLManagedTensor *) noexcept nogil

cdef struct DLPackVersion:
    uint32_t major
    uint32_t minor

cdef struct DLManagedTensorVersioned:
    DLPackVersion version
    void *manager_ctx
    void (*deleter)(DLManagedTensorVersioned *) noexcept nogil
    uint64_t flags
    DLTensor dl_tensor

cdef enum:
    DL_CUDA = 2
    DL_UINT = 1
    DL_FLAG_READ_ONLY = 1

# One allocation per export: both tensor kinds (one is used), the shape and strides they point
# to, and the owner the memory belongs to, held until the consumer calls the deleter.
cdef struct Export:
    DLManagedTensor legacy
    DLManagedTensorVersioned versioned
    int64_t shape[4]
    int64_t strides[4]
    PyObject *owner


cdef void _release_export(Export *export) noexcept nogil:
    # Consumers may call the deleter from any thread, with or without the GIL.
    with gil:
        Py_DECREF(<object>export.owner)
    free(export)


cdef void _legacy_deleter(DLManagedTensor *tensor) noexcept nogil:
    _release_export(<Export *>tensor.manager_ctx)


cdef void _versioned_deleter(DLManagedTensorVersioned *tensor) noexcept nogil:
    _release_export(<Export *>tensor.manager_ctx)


cdef void _capsule_destructor(object capsule) noexcept:
    # A capsule still named "dltensor"/"dltensor_versioned" was never consumed (consumers rename
    # it "used_..."), so its tensor is ours to delete.
    cdef DLManagedTensor *legacy
    cdef DLManagedTensorVersioned *versioned
    if PyCapsule_IsValid(capsule, b"dltensor"):
        legacy = <DLManagedTensor *>PyCapsule_GetPointer(capsule, b"dltensor")
        legacy.deleter(legacy)
    elif PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        versioned = <DLManagedTensorVersioned *>PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        versioned.deleter(versioned)


def make_capsule(object owner, uintptr_t data, int device_id, tuple shape, tuple strides, bint read_only,
                 bint versioned):
    """A DLPack capsule of uint8 elements over ``data`` on CUDA device ``device_id``; strides in
    bytes. ``owner`` stays alive until the consumer is done with the tensor."""
    cdef int ndim = len(shape)
    cdef int i
    cdef DLTensor *tensor
    if not 1 <= ndim <= 4 or len(strides) != ndim:
        raise ValueError(f"a plane tensor has 1 to 4 dimensions with a stride each, got {shape} {strides}")
    cdef Export *export = <Export *>calloc(1, sizeof(Export))
    if export == NULL:
        raise MemoryError("allocating a DLPack tensor")
    for i in range(ndim):
        export.shape[i] = shape[i]
        export.strides[i] = strides[i]
    tensor = &export.versioned.dl_tensor if versioned else &export.legacy.dl_tensor
    tensor.data = <void *>data
    tensor.device.device_type = DL_CUDA
    tensor.device.device_id = device_id
    tensor.ndim = ndim
    tensor.dtype.code = DL_UINT
    tensor.dtype.bits = 8
    tensor.dtype.lanes = 1
    tensor.shape = export.shape
    tensor.strides = export.strides
    Py_INCREF(owner)
    export.owner = <PyObject *>owner
    try:
        if versioned:
            export.versioned.version.major = 1
            export.versioned.version.minor = 0
            export.versioned.manager_ctx = export
            export.versioned.deleter = _versioned_deleter
            export.versioned.flags = DL_FLAG_READ_ONLY if read_only else 0
            return PyCapsule_New(&export.versioned, b"dltensor_versioned", _capsule_destructor)
        export.legacy.manager_ctx = export
        export.legacy.deleter = _legacy_deleter
        return PyCapsule_New(&export.legacy, b"dltensor", _capsule_destructor)
    except BaseException:
        _release_export(export)
        raise
