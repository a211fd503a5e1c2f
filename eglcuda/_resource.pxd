# The one base of every eglcuda object that owns a native handle (see _resource.pyx).

cdef class Resource:
    cdef public object _finalizer  # weakref.finalize running the release, or None before _own
    cdef public Resource _parent   # kept alive by the child: frame -> consumer -> stream -> display
    cdef list _children            # weak references, in registration order
    cdef list _child_releases      # the finalizers of Resource children (run first at collection)
    cdef Py_ssize_t _compact_at     # list length at which dead references are dropped
    cdef unsigned long _generation  # the fork generation this object was made in
    cdef object __weakref__

    cdef bint _inherited(self) noexcept
    cdef void _forget_after_fork(self) noexcept
    cdef void _register(self, child) except *
