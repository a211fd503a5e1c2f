"""How a topic's frames reach a subscriber: transports as plug-ins behind one interface.

- :mod:`.base`: the interface (:class:`PublisherTransport`, :class:`PublisherLink`,
  :class:`SubscriberTransport`, the backends) and what both ends share (:class:`Geometry`,
  :class:`DeviceIdentity`);
- :mod:`.registry`: the transports by name (:class:`TransportSpec`); ``auto`` picks by rank; the
  rule of what a publisher may offer together (:func:`offer`);
- :mod:`.views`: :class:`SlotView`, a mapped pool slot as a frame;
- one module per transport: :mod:`.cuda_ipc`, :mod:`.cuda_vmm`, :mod:`.eglstream`;
- :mod:`.backends`: the real GPU backends, which make one transport of each registered kind.

Adding a transport is one new module here (its two sides and a ``register(TransportSpec(...))``
at its end; docs/architecture.md walks through it) and one name in the import below.
"""
from .base import (NO_UUID, DeviceIdentity, Geometry, PublisherBackend, PublisherLink, PublisherTransport,
                   SubscriberBackend, SubscriberTransport)
from .registry import Offer, TransportSpec, get, names, offer, register, registered
from .views import SlotView
from . import cuda_ipc, cuda_vmm, eglstream  # noqa: F401  (the built-in transports: each registers itself)
from .backends import CudaPublisherBackend, CudaSubscriberBackend

__all__ = ["NO_UUID", "DeviceIdentity", "Geometry", "PublisherBackend", "PublisherLink", "PublisherTransport",
           "SubscriberBackend", "SubscriberTransport", "Offer", "TransportSpec", "get", "names", "offer", "register", "registered",
           "SlotView", "CudaPublisherBackend", "CudaSubscriberBackend"]
