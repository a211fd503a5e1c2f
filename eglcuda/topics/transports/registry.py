"""The transports a topic can use, by name. Each transport module registers one
:class:`TransportSpec` when it is imported (:mod:`eglcuda.topics.transports` imports the built-in
ones); backends make their transports from here, and a subscriber's ``transport="auto"`` asks for
the registered ones in rising :attr:`TransportSpec.rank`.

What a publisher offers follows one rule, :func:`offer`, applied when the publisher is made: its
pool is one kind of memory in one layout, and it offers only the transports that can serve that
pool to some subscriber. Transports named together that cannot share one pool are refused then,
with the reason and what to name instead; a subscriber that asks for a transport the publisher
does not offer is refused at the handshake with the same reason.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ...errors import UsageError
from ...frames.formats import Layout
from .base import PublisherTransport, SubscriberTransport

# The kinds of pool memory (a publisher's pool is one of them).
DEVICE_MEMORY = "device"  # what eglcuda.Frame.allocate makes: cuMemAlloc memory, or CUDA arrays
VMM_MEMORY = "vmm"  # cuMemCreate allocations shareable by file descriptor (cuda-vmm makes them)

_MEMORY_NAMES = {DEVICE_MEMORY: "cuMemAlloc memory", VMM_MEMORY: "VMM memory"}


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
    - ``on_integrated``: whether it works on an integrated GPU (Tegra): ``auto`` asks for it
      there, and a publisher there offers it;
    - ``offered``: whether a publisher offers it unless told which transports to offer;
    - ``memory``: the pool memory it serves (``DEVICE_MEMORY``, ``VMM_MEMORY``); a transport of
      another memory than ``DEVICE_MEMORY`` makes the pool itself (``PublisherTransport.allocate``);
      ``memory_note``: what it does with that memory, said when a combination is refused;
    - ``layouts``: the pool layouts it serves, and ``layout_note`` why not the others.

    The pool frames a subscriber's end keeps (the publisher needs ``max_pool`` above them) are
    the publisher class's :attr:`PublisherTransport.keeps_frames`.
    """

    name: str
    publisher: Callable[[Any], PublisherTransport]
    subscriber: Callable[..., SubscriberTransport]
    rank: int
    unfit: Callable[[Any], str | None] = _fits_any
    on_integrated: bool = True
    offered: bool = True
    memory: str = DEVICE_MEMORY
    memory_note: str = ""
    layouts: frozenset[Layout] = field(default_factory=lambda: frozenset(Layout))
    layout_note: str = ""

    @property
    def keeps_frames(self) -> int:
        return int(getattr(self.publisher, "keeps_frames", 0))


_registered: dict[str, TransportSpec] = {}


def register(spec: TransportSpec) -> TransportSpec:
    """Add ``spec`` (its module calls this once, at import)."""
    known = _registered.get(spec.name)
    if known is not None and known is not spec:
        raise ValueError(f"a topic transport named {spec.name!r} is registered already")
    if spec.memory not in _MEMORY_NAMES:
        raise ValueError(f"transport {spec.name!r}: memory is one of {sorted(_MEMORY_NAMES)}, got {spec.memory!r}")
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


# ==== what a publisher offers ========================================================================

def too_few_frames(keeps_frames: int, max_pool: int) -> str | None:
    """Why a publisher of ``max_pool`` frames cannot serve a transport whose end keeps
    ``keeps_frames`` of them (None: it can): it would never get a pool frame back, and would wait
    every_timeout for good."""
    if max_pool > keeps_frames:
        return None
    return (f"its end keeps {keeps_frames} pool frame(s) until the next frame replaces it (an EGLStream keeps the "
            f"newest frame presented to it), and this publisher has max_pool={max_pool}: it would never get a pool "
            f"frame back (it needs a Publisher of max_pool >= {keeps_frames + 1})")


@dataclass(frozen=True)
class Offer:
    """What a publisher offers (:func:`offer`): ``specs``, in ``auto``'s order, all serving a pool
    of ``memory``; ``refusals``: for each registered transport it does not offer, why (what a
    subscriber asking for it is told); ``asked``: the arguments it was decided from."""

    specs: tuple[TransportSpec, ...]
    memory: str
    refusals: Mapping[str, str]
    asked: tuple[tuple[str, ...] | None, Layout, int, bool]

    def on_integrated_gpu(self) -> "Offer":
        """The same request for a publisher on an integrated GPU (Tegra): known once its device
        is (the rest of the rule is checked before any device is touched)."""
        names, layout, max_pool, integrated = self.asked
        return self if integrated else offer(names, layout, max_pool, integrated=True)

    @property
    def names(self) -> list[str]:
        return [spec.name for spec in self.specs]

    def refusal(self, name: str) -> str:
        """Why a subscriber asking for transport ``name`` is not served through it."""
        why = self.refusals.get(name)
        return f"not offered by this publisher (it offers {', '.join(self.names)})" + (f": {why}" if why else "")


def _unfit(spec: TransportSpec, layout: Layout, max_pool: int, integrated: bool) -> str | None:
    """Why ``spec`` cannot serve a pool of ``layout`` and ``max_pool`` frames (on an
    ``integrated`` GPU), whatever its memory."""
    if integrated and not spec.on_integrated:
        return f"the publisher's GPU is integrated (Tegra), where {spec.name} is not available"
    if layout not in spec.layouts:
        return spec.layout_note or f"{spec.name} does not serve layout={layout.value!r}"
    return too_few_frames(spec.keeps_frames, max_pool)


def _memory_conflict(spec: TransportSpec, memory: str, makers: Sequence[TransportSpec]) -> str:
    """Why ``spec`` cannot serve a pool of ``memory``, which ``makers`` make it (none: the usual)."""
    made = f" ({' and '.join(_names(makers))} makes it)" if makers else ""
    note = spec.memory_note or f"{spec.name} serves {_MEMORY_NAMES[spec.memory]} only"
    return f"the pool is {_MEMORY_NAMES[memory]}{made}, and {note}"


def _names(specs: Sequence[TransportSpec]) -> list[str]:
    return [spec.name for spec in specs]


def offer(names: Sequence[str] | None, layout: Layout, max_pool: int, integrated: bool = False) -> Offer:
    """What a publisher of a pool in ``layout`` with up to ``max_pool`` frames (on an
    ``integrated`` GPU) offers, when told to offer the transports ``names`` (None: those
    registered as ``offered``).

    The rule: a pool is one kind of memory, and every transport offered must serve it, in its
    layout, with that many frames, on that GPU. Named transports that break it raise
    :class:`UsageError` saying why and which to name instead; of the default ones, those that do
    not fit are left out (a subscriber asking for one is told why)."""
    known = registered()
    if names is not None:
        given = names
        try:  # (once: a generator is read here, not emptied by the first look)
            names = None if isinstance(given, (str, bytes)) else tuple(given)
        except TypeError:
            names = None
        if names is None or not all(isinstance(name, str) for name in names):
            raise UsageError(f"transports is a sequence of transport names, got {given!r}")
        unknown = sorted(set(names) - {spec.name for spec in known})
        if unknown or not names:
            raise UsageError(f"transports are some of {_names(known)}, got {list(names)!r}")
    chosen = [spec for spec in known if (spec.offered if names is None else spec.name in names)]
    refusals = {spec.name: "" for spec in known if spec not in chosen}
    # Layout and pool size: they do not depend on the other transports.
    unfit = {spec.name: why for spec in chosen
             if (why := _unfit(spec, layout, max_pool, integrated)) is not None}
    fit = [spec for spec in chosen if spec.name not in unfit]
    # Memory: the pool is made for the first transport that needs memory of its own, or is the
    # backend's usual memory; a transport that serves another cannot be offered with it.
    basis = chosen if names is not None else fit
    makers = [spec for spec in basis if spec.memory != DEVICE_MEMORY]
    memory = makers[0].memory if makers else DEVICE_MEMORY
    makers = [spec for spec in makers if spec.memory == memory]
    clash = [spec for spec in basis if spec.memory != memory]
    if names is not None and (unfit or clash):
        problems = [f"transport {name!r} cannot be offered: {why}" for name, why in unfit.items()]
        if clash:
            problems.append(_clash_error(chosen, makers, clash, memory, fit))
        raise UsageError("; ".join(problems))
    refusals.update(unfit)
    for spec in clash:
        refusals[spec.name] = _memory_conflict(spec, memory, makers)
    chosen = [spec for spec in fit if spec.memory == memory]
    if not chosen:  # (only the defaults can come here: named ones that do not fit raised above)
        raise UsageError(f"no registered transport can serve a pool of layout={layout.value!r} and "
                         f"max_pool={max_pool} ({'; '.join(f'{n}: {w}' for n, w in refusals.items() if w)})")
    # What a subscriber asking for another transport is told: why it could not be offered here.
    for spec in known:
        if spec.name in refusals and not refusals[spec.name]:
            refusals[spec.name] = (_memory_conflict(spec, memory, makers) if spec.memory != memory
                                   else _unfit(spec, layout, max_pool, integrated) or "")
    asked = (None if names is None else tuple(names), layout, max_pool, integrated)
    return Offer(tuple(chosen), memory, refusals, asked)


def _clash_error(chosen: Sequence[TransportSpec], makers: Sequence[TransportSpec], clash: Sequence[TransportSpec],
                 memory: str, fit: Sequence[TransportSpec]) -> str:
    """The error for named transports that need different pool memory: why, and the sets of
    them that work (of those that ``fit`` the pool's layout and size)."""
    needs: dict[str, list[str]] = {}
    for spec in chosen:
        needs.setdefault(spec.memory, []).append(spec.name)
    groups = [[spec.name for spec in fit if spec.memory == kind] for kind in needs]
    why = "; ".join(spec.memory_note for spec in [*makers, *clash] if spec.memory_note)
    choices = [f"transports={group!r}" for group in groups if group]
    advice = f". Offer {' or '.join(choices)}" if choices else ""
    if len(choices) > 1:
        advice += " (one publisher each, if subscribers need both)"
    return (f"transports {_names(chosen)!r} cannot be offered together: a publisher's pool is one kind of memory, "
            f"and they need {' and '.join(_MEMORY_NAMES[kind] for kind in needs)} ({why}){advice}")
