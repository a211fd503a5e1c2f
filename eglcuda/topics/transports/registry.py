"""The transports a topic can use, by name. Each transport module registers one
:class:`TransportSpec` when it is imported (:mod:`eglcuda.topics.transports` imports the built-in
ones); backends make their transports from here, and a subscriber's ``transport="auto"`` asks for
the registered ones in rising :attr:`TransportSpec.rank`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .base import PublisherTransport, SubscriberTransport


def _fits_any(backend: Any) -> str | None:
    return None


@dataclass(frozen=True)
class TransportSpec:
    """A transport, as the registry knows it.

    - ``publisher(backend)``: the transport's publisher side, made once per publisher from its
      :class:`~eglcuda.topics.transports.backends.CudaPublisherBackend`;
    - ``subscriber(backend, welcome, qos, queue)``: a subscriber's end, once the publisher chose
      this transport for it;
    - ``rank``: ``auto`` asks for transports in rising rank (ties: registration order);
    - ``unfit(backend)``: why a subscriber with this backend cannot use the transport at all
      (None: it can; asked before the handshake: a forced transport then fails with the reason);
    - ``on_integrated``: whether ``auto`` offers it on an integrated GPU (Tegra);
    - ``offered``: whether a publisher offers it unless told which transports to offer.
    """

    name: str
    publisher: Callable[[Any], PublisherTransport]
    subscriber: Callable[..., SubscriberTransport]
    rank: int
    unfit: Callable[[Any], str | None] = _fits_any
    on_integrated: bool = True
    offered: bool = True


_registered: dict[str, TransportSpec] = {}


def register(spec: TransportSpec) -> TransportSpec:
    """Add ``spec`` (its module calls this once, at import)."""
    known = _registered.get(spec.name)
    if known is not None and known is not spec:
        raise ValueError(f"a topic transport named {spec.name!r} is registered already")
    _registered[spec.name] = spec
    return spec


def registered() -> list[TransportSpec]:
    """Every registered transport, in the order ``auto`` asks for them."""
    order = {name: index for index, name in enumerate(_registered)}
    return sorted(_registered.values(), key=lambda spec: (spec.rank, order[spec.name]))


def names() -> tuple[str, ...]:
    """The registered transports' names, in ``auto``'s order."""
    return tuple(spec.name for spec in registered())


def get(name: str) -> TransportSpec | None:
    return _registered.get(name)
