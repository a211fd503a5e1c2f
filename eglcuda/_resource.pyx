# cython: language_level=3
"""The one way eglcuda owns a native handle: :class:`Resource`.

Every class that owns a driver handle (displays, GL contexts, streams and their endpoints, frames,
images, syncs) derives from it and gets the same lifetime rules:

- ``_own(release, *args, parent=...)``, called right after the handle is made, arranges that
  ``release(*args)`` runs exactly once: at :meth:`close`, when the object is garbage collected, or
  at interpreter exit; it never raises (the driver may be gone at exit). ``release`` must not refer
  to the object itself.
- ``close()`` is idempotent; it first closes the children registered with ``parent=`` (newest
  first: what was made last may depend on what was made before), then runs the subclass's
  ``_before_release()``, then the release. ``closed`` is also True once the parent is closed.
- A child keeps its parent alive; a parent refers to its children weakly. When a parent is
  collected its children are garbage too (they would keep it alive otherwise), and the collector
  finalizes a cycle's objects in no useful order: a parent's release runs its children's first,
  so a stream is never destroyed before its endpoints disconnect.
- At interpreter exit every open root (a resource with no parent) is closed before the remaining
  finalizers run: first those of ``_exit_rank`` 0 (displays, with their streams and endpoints),
  then 1 (frames), then 2 (devices), newest first within a rank. So a producer disconnects before
  the frames it presented are freed, and those are freed before their device's context goes.
- In a child process made by ``fork()`` every inherited resource counts as closed and its release
  never runs: the handles belong to the parent's driver state.

Objects that own connections to peers rather than a handle (a topic's publisher and subscriber)
are not Resources: they close through their own ``close()`` at exit, before the Resources they
use, and stay closable in a forked child. :mod:`eglcuda._lifecycle` holds that, and says why.
"""
import atexit
import os
import weakref

from .errors import ClosedError

cdef unsigned long fork_generation = 0
_roots = weakref.WeakValueDictionary()  # (exit rank, -creation order) -> open resources with no parent
_owning = weakref.WeakSet()  # every resource with a live release, for fork
_next_root = 0
_exiting = False
_abandoned = False


def exiting() -> bool:
    """Whether the interpreter is closing eglcuda's resources at exit."""
    return _exiting


def _quietly(release, args) -> None:
    try:
        release(*args)
    except Exception:  # pragma: no cover - finalizers must not raise
        pass


def _release_after_children(release, args, child_releases: list) -> None:
    """A resource's finalizer: its children's finalizers first, newest first (each runs once; a
    child closed already has run its own), then its release."""
    for child_release in reversed(child_releases):
        child_release()
    _quietly(release, args)


cdef class Resource:
    """Base of every object that owns a native handle: ``closed``, idempotent :meth:`close`, ``with``,
    a finalizer that never raises, and children closed before their parent."""

    # Where a root closes at interpreter exit (see the module notes); subclasses override.
    _exit_rank = 0

    def __cinit__(self, *args, **kwargs):
        self._children = []
        self._child_releases = []
        self._compact_at = 16
        self._generation = fork_generation

    cdef bint _inherited(self) noexcept:
        return self._generation != fork_generation

    cdef void _forget_after_fork(self) noexcept:
        """In a forked child: drop what the parent's threads may have held (subclasses with locks
        of their own reset them here). The release is already detached."""

    def _own(self, release, *args, Resource parent=None) -> None:
        """Take ownership of a handle just made: ``release(*args)`` runs once, at close,
        collection or exit. With ``parent``, register as its child."""
        global _next_root
        self._finalizer = weakref.finalize(self, _release_after_children, release, args, self._child_releases)
        _owning.add(self)
        if parent is not None:
            self._parent = parent
            parent._register(self)
        else:
            _next_root += 1
            _roots[(self._exit_rank, -_next_root)] = self

    def _adopt(self, child) -> None:
        """Register ``child`` (anything with ``close()``) to be closed before this one; a
        :class:`Resource` child also counts as closed once this one is."""
        if isinstance(child, Resource):
            (<Resource>child)._parent = self
        self._register(child)

    cdef void _register(self, child) except *:
        # Dead entries are dropped whenever the list doubles, so a long-lived parent of many
        # short-lived children (syncs of a display) does not grow without bound.
        self._children.append(weakref.ref(child))
        if isinstance(child, Resource) and (<Resource>child)._finalizer is not None:
            self._child_releases.append((<Resource>child)._finalizer)
        if len(self._children) >= self._compact_at:
            self._children = [ref for ref in self._children if ref() is not None]
            # (in place: this resource's finalizer holds the list)
            self._child_releases[:] = [release for release in self._child_releases if release.alive]
            self._compact_at = max(16, 2 * len(self._children))

    @property
    def closed(self) -> bool:
        """True once closed, once the parent is closed, or in a process forked after creation."""
        if self._inherited():
            return True
        if self._finalizer is not None and not self._finalizer.alive:
            return True
        return self._parent is not None and self._parent.closed

    def _check_open(self) -> None:
        """Raise :class:`ClosedError` if the object may no longer be used."""
        if self.closed:
            if self._inherited():
                raise ClosedError(f"{type(self).__name__} was made before this process forked: its handles "
                                  "belong to the parent process")
            raise ClosedError(f"the {type(self).__name__} is closed (or what it was made from is)")

    def _before_release(self) -> None:
        """Hook for subclasses: what to do at close() before the handle is released."""

    def close(self) -> None:
        """Close what was made from this object (newest first), then release its handle. Safe to
        call twice."""
        if self._inherited() or self._finalizer is None or not self._finalizer.alive:
            return
        for ref in reversed(self._children):
            child = ref()
            if child is not None:
                child.close()
        self._children = [ref for ref in self._children if ref() is not None]
        self._before_release()
        self._finalizer()
        if self._parent is not None:  # the parent need not remember a closed child
            self._parent._children = [ref for ref in self._parent._children
                                      if ref() is not None and ref() is not self]
            self._parent._child_releases[:] = [release for release in self._parent._child_releases
                                               if release.alive]

    def __reduce__(self):
        # (copy.copy, deepcopy and pickle would make a second object over the same handle, which
        # neither its close nor its finalizer knows of: Cython's own refusal names neither)
        raise TypeError(f"a {type(self).__name__} cannot be copied or pickled: it owns a driver handle that only it "
                        "releases; make another one where it is needed")

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def abandon(Resource resource) -> None:
    """At interpreter exit: another thread is still inside a driver call of ``resource``. Its
    handle, and what it hangs from, are left to the end of the process (releasing them under that
    call is not safe); so is everything not yet closed, which that call may still be using."""
    global _abandoned
    _abandoned = True
    while resource is not None:
        if resource._finalizer is not None:
            resource._finalizer.detach()
        resource = resource._parent


def _close_roots_at_exit() -> None:
    global _exiting
    _exiting = True
    for key in sorted(_roots.keys()):
        if _abandoned:
            break
        root = _roots.get(key)
        if root is not None:
            try:
                root.close()
            except Exception:  # pragma: no cover - exit goes on whatever a close says
                pass
    if _abandoned:
        for resource in list(_owning):
            finalizer = (<Resource>resource)._finalizer
            if finalizer is not None:
                finalizer.detach()


def _forked_child() -> None:
    global fork_generation
    fork_generation += 1
    for resource in list(_owning):
        finalizer = (<Resource>resource)._finalizer
        if finalizer is not None:
            finalizer.detach()
        (<Resource>resource)._forget_after_fork()
    _owning.clear()
    _roots.clear()


# atexit runs its handlers newest first: make sure weakref.finalize's handler is registered, then
# register ours after it, so the roots close before the finalizers of what they leave behind run.
weakref.finalize(_close_roots_at_exit, lambda: None)
atexit.register(_close_roots_at_exit)
os.register_at_fork(after_in_child=_forked_child)
