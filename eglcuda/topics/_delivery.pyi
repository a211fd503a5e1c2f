# Type stub of the compiled module eglcuda.topics._delivery (_delivery.pyx): what Python code sees.
from typing import Any

FREE: int
WRITING: int
PUBLISHED: int
STATE_NAMES: dict[int, str]

class Slot:
    """One pool frame and who holds it."""

    index: int
    frame: Any
    state: int
    holders: set[Member]
    waiters: dict[Member, float]
    seq: int
    published_at: float
    def __init__(self, index: int, frame: Any) -> None: ...

class Member:
    """A subscriber after its handshake, as the publishing thread tracks it."""

    id: int
    sock: Any
    fd: int
    inbox: Any
    peer: Any
    qos: Any
    latest: bool
    queue: int
    credit: int
    link: Any
    message_only: bool
    plain_release: bool
    transport: str
    outstanding: dict[int, Slot]
    seen_slots: set[int]
    delivered: int
    skipped: int
    noticed: bool
    since: float
    alive: bool
    leaving: bool
    ring: Any
    def __init__(self, ident: int, sock: Any, peer: Any, hello: Any, link: Any, transport: str, recv_limit: int,
                 read_batch: int, ring: Any = ...) -> None: ...
    def info(self) -> Any: ...

def delivered(sub: Member, slot: Slot, seq: int) -> None: ...
def released(sub: Member, slot: Slot, recorded: bool, now: float, free: Any) -> None: ...
def free_if_unheld(slot: Slot, free: Any) -> None: ...
def forget(sub: Member, pool: list[Slot], free: Any) -> None: ...
def hand_out(subs: list[Member], slot: Slot, seq: int, data: bytes, stream: int | None,
             recorded: set[Any], timestamp_ns: int = ..., payload: bytes = ..., now: float = ...,
             read_at: float = ..., interval: float = ...) -> list[Member]: ...
def collect(subs: list[Member], free: Any) -> list[tuple[Member, str]]: ...
def wakes_past_releases(sub: Member) -> bool: ...
def note_sockets(subs: list[Member]) -> None: ...
def sleeping(subs: list[Member], on: bool) -> bool: ...
def settle(batch: list[tuple[Any, Any]], free: Any) -> list[tuple[Any, Any]]: ...
def full_every(subs: list[Member]) -> list[Member]: ...
def take_free(free: Any, settled: Any) -> Slot | None: ...
def worth_a_read(subs: list[Member], now: float, read_at: float, interval: float) -> bool: ...
def skip_full(subs: list[Member]) -> tuple[list[Member], list[Member]]: ...
