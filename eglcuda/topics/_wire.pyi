# Type stub of the compiled module eglcuda.topics._wire (_wire.pyx): what Python code sees.
from typing import Any

class Inbox:
    """The receiving side of one topic connection after its handshake."""

    wakes: int  # WAKE messages read so far
    counts_wakes: bool  # every WAKE_CHECK-th WAKE is handed out, none for a run

    def __init__(self, fd: int, capacity: int = ..., batch: int = ..., wake_fd: int = ...,
                 busy_wait: float = ...) -> None: ...
    def close(self) -> None: ...
    def next(self, deadline: float | None = None) -> Any:
        """A ``Frame`` or ``Release`` tuple, the bytes of any other message, ``b""`` at the end of
        the connection, or None when nothing came (by ``deadline``)."""
    def rest(self) -> Any:
        """The next message of what the last read found waiting, or None once it is handed out."""
    def queued_kinds(self) -> bytes:
        """The kind byte of each message read but not handed out yet (0: the connection's end)."""
    def frame_next(self) -> bool:
        """Whether the next message, read earlier and waiting here, is a FRAME (nothing is taken)."""
    def arm(self) -> bool:
        """True when messages read earlier wait here; False: the socket's readiness says when."""
    def quiet(self) -> bool:
        """As arm(), for a subscriber that holds all it may."""

def drain(epoll_fd: int, timeout: float, inboxes: dict[int, tuple[Inbox, Any]], limit: int) -> list[tuple[Any, Any]]: ...
def ipc_record(context: int, event: int, stream: int, query: bool = ...) -> bool: ...
def ipc_release(context: int, stream: int, done: int) -> int: ...
def ipc_event_done(context: int, event: int) -> bool: ...
def ipc_order_after(context: int, stream: int, event: int, doing: str) -> None: ...
def send_release(fd: int, seq: int, flags: int, extra: bytes) -> int: ...
