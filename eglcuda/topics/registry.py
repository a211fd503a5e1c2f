"""Listing live topics (``python -m eglcuda topics``) and cleaning up after dead publishers.

A topic directory holds ``<name>.topic`` sockets and their ``.lock`` files (see
:mod:`eglcuda.topics.naming`). For each socket the registry tries the lock: free means the
publisher's process is gone, and the socket and lock are removed (when ``clean``); held means a
live publisher, which is asked for its status (a STATUS_REQUEST on a connection of its own: the
publisher answers from its service thread, its subscribers notice nothing).
"""
from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ..errors import EglCudaError, PeerError, UsageError
from .._integers import check_flag
from .. import _unix
from . import naming, protocol, sockets
from .info import SubscriberInfo

STATUS_VERSION = 1
MAX_LISTED = 256  # subscribers listed in one status (the total is given too)
RELAY_SUFFIX = ".relay"  # <topic socket>.<pid>.relay: a relay's status (eglcuda.Relay writes it)
MAX_RELAY_STATUS = 65536  # bytes
_MAX_PID = 2**22  # (Linux's pid_max at most: a larger "pid" is no process)

_TOPIC_KEYS = {
    "version": int, "name": str, "pid": int, "uid": int, "instance": str, "width": int, "height": int,
    "format": str, "layout": str, "pitch": int, "fps": (float, type(None)), "measured_fps": (float, type(None)),
    "pool": int, "max_pool": int, "published": int, "access": str, "transports": list, "subscribers": list,
    "subscribers_total": int, "dropped": int, "uptime_s": float,
}
_SUBSCRIBER_KEYS = {
    "id": int, "pid": int, "uid": int, "qos": str, "queue": int, "transport": str, "delivered": int,
    "skipped": int, "outstanding": int, "since": float,
}


@dataclass(frozen=True)
class TopicStatus:
    """A live topic, as its publisher describes itself."""

    name: str
    path: str
    pid: int
    uid: int
    instance: str
    width: int
    height: int
    format: str
    layout: str
    pitch: int
    fps: float | None
    measured_fps: float | None
    pool: int
    max_pool: int
    published: int
    access: str
    transports: list[str]
    subscribers: list[SubscriberInfo]
    subscribers_total: int
    dropped: int
    uptime_s: float


@dataclass
class Listing:
    """What :func:`list_topics` found: live topics, stale sockets (removed when cleaning), and
    sockets whose publisher holds its lock but did not answer (``path -> why``)."""

    directory: str
    topics: list[TopicStatus] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unresponsive: dict[str, str] = field(default_factory=dict)
    relays: list[dict[str, Any]] = field(default_factory=list)  # live relays' statuses (each has "topic")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---- the status a publisher sends -----------------------------------------------------------------

def _check_type(value: Any, kind: Any, where: str) -> None:
    if kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(kind, tuple):
        ok = any((v is type(None) and value is None) or (v is float and isinstance(value, (int, float))
                 and not isinstance(value, bool)) for v in kind)
    else:
        ok = isinstance(value, kind)
    if not ok:
        raise protocol.ProtocolError(f"status field {where} has the wrong type ({type(value).__name__})")


def validate_status(body: Any) -> dict[str, Any]:
    """Check a STATUS body against the schema (exact keys, types, ranges); returns it. Raises
    :class:`ProtocolError`."""
    if not isinstance(body, dict) or set(body) != set(_TOPIC_KEYS):
        missing = set(_TOPIC_KEYS) - set(body) if isinstance(body, dict) else set()
        extra = set(body) - set(_TOPIC_KEYS) if isinstance(body, dict) else set()
        raise protocol.ProtocolError(f"status keys differ from the schema (missing {sorted(missing)}, "
                                     f"unknown {sorted(extra)})")
    for key, kind in _TOPIC_KEYS.items():
        _check_type(body[key], kind, key)
    if body["version"] != STATUS_VERSION:
        raise protocol.ProtocolError(f"status version {body['version']}")
    try:
        naming.check_name(body["name"])
    except UsageError:
        raise protocol.ProtocolError(f"status names an invalid topic {body['name']!r}") from None
    for key in ("pid", "uid", "width", "height", "pitch", "pool", "max_pool", "published", "subscribers_total",
                "dropped"):
        if body[key] < 0:
            raise protocol.ProtocolError(f"status field {key} is negative")
    if body["layout"] not in ("pitch", "array") or body["access"] not in ("user", "group", "all"):
        raise protocol.ProtocolError("status layout or access out of range")
    if len(body["format"]) > 32 or len(body["instance"]) > 32:
        raise protocol.ProtocolError("status strings too long")
    if len(body["transports"]) > 8 or not all(isinstance(t, str) and len(t) <= 32 for t in body["transports"]):
        raise protocol.ProtocolError("status transports malformed")
    if len(body["subscribers"]) > MAX_LISTED:
        raise protocol.ProtocolError("status lists too many subscribers")
    for index, entry in enumerate(body["subscribers"]):
        if not isinstance(entry, dict) or set(entry) != set(_SUBSCRIBER_KEYS):
            raise protocol.ProtocolError(f"status subscriber {index} differs from the schema")
        for key, kind in _SUBSCRIBER_KEYS.items():
            _check_type(entry[key], kind, f"subscribers[{index}].{key}")
        if entry["qos"] not in ("latest", "every") or len(entry["transport"]) > 32:
            raise protocol.ProtocolError(f"status subscriber {index} qos or transport malformed")
    return body


def status_from(body: dict[str, Any], path: str) -> TopicStatus:
    fields = dict(body)
    fields.pop("version")
    fields["subscribers"] = [SubscriberInfo(**entry) for entry in body["subscribers"]]
    fields["fps"] = None if body["fps"] is None else float(body["fps"])
    fields["measured_fps"] = None if body["measured_fps"] is None else float(body["measured_fps"])
    fields["uptime_s"] = float(body["uptime_s"])
    return TopicStatus(path=path, **fields)


def query(path: str, timeout: float = 1.0) -> TopicStatus:
    """Ask the publisher at socket ``path`` for its status. Raises :class:`PeerError` (not an
    eglcuda publisher, refused), :class:`Timeout`, or ``OSError`` (nobody listening)."""
    deadline = time.monotonic() + timeout
    sock = sockets.connect(path, deadline, f"connecting to {path}", wait=False)
    try:
        peer = sockets.peer_of(sock)
        if peer.uid != os.geteuid() and os.geteuid() != 0:
            raise PeerError(f"{path} is served by uid {peer.uid}, not by this user")
        try:
            sockets.send(sock, protocol.encode(protocol.StatusRequest()))
        except BlockingIOError:
            raise PeerError(f"the publisher at {path} does not read its socket") from None
        except OSError as exc:  # EPIPE, ECONNRESET: it closed, maybe after saying why
            said = sockets.parting_words(sock)
            if said is not None:
                raise PeerError(f"the publisher at {path} refused: {said.reason}") from None
            raise PeerError(f"the publisher at {path} closed the connection ({exc.strerror or exc})") from None
        data, fds = sockets.receive(sock, deadline, f"the publisher at {path} sent no status within {timeout} s")
        sockets.close_fds(fds)
        if not data:
            raise PeerError(f"the publisher at {path} closed without a status")
        message = protocol.decode(data, len(fds))
        if isinstance(message, protocol.Refuse):
            raise PeerError(f"the publisher at {path} refused: {message.reason}")
        if not isinstance(message, protocol.Status):
            raise PeerError(f"{path} answered with {type(message).__name__}, not a status")
        return status_from(validate_status(message.body), path)
    finally:
        sock.close()


# ---- listing and cleaning ------------------------------------------------------------------------

def _remove_stale(socket_path: str) -> bool:
    """Remove a topic socket and its lock if no live publisher holds the lock. True if removed."""
    lock = naming.lock_path(socket_path)
    try:
        fd = naming.take_lock(lock)
    except (OSError, UsageError):
        return False
    if fd is None:
        return False  # a publisher holds it: alive
    try:
        sockets.remove_dead_socket(socket_path, owner=os.geteuid())
    except (OSError, UsageError):
        pass
    naming.release_lock(lock, fd)
    return not os.path.exists(socket_path)


def _lock_held(socket_path: str) -> bool:
    import fcntl

    try:
        fd = os.open(naming.lock_path(socket_path), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _served(socket_path: str) -> bool:
    """Whether something accepts connections at the socket (a socket of another kind: no)."""
    try:
        return sockets.listening(socket_path)
    except UsageError:
        return False


def relay_status_path(socket_path: str, pid: int) -> str:
    """Where the relay of process ``pid`` keeps its status, beside the topic's socket."""
    return f"{socket_path}.{pid}{RELAY_SUFFIX}"


def write_relay_status(path: str, body: dict[str, Any]) -> None:
    """Replace a relay's status file atomically (mode 0600). The content goes to a file of a
    fresh name made here (``O_EXCL``: never one that was there, a link or a file another process
    put in its place; ``O_NOFOLLOW``), renamed over ``path`` (a link there is replaced, never
    followed)."""
    temporary = f"{path}.{secrets.token_hex(8)}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(body, out)
        os.replace(temporary, path)
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise


def _relay_status(path: str, clean: bool) -> dict[str, Any] | None:
    """A live relay's status file (a dead relay's is removed when ``clean``; a broken one is skipped)."""
    data = _unix.read_regular_file(path, MAX_RELAY_STATUS + 1)  # (a FIFO of that name is not waited on)
    try:
        body = json.loads(data) if data is not None and len(data) <= MAX_RELAY_STATUS else None
    except (ValueError, RecursionError):  # (RecursionError: arrays nested thousands deep)
        return None
    if not isinstance(body, dict) or not isinstance(body.get("remotes"), list) or not isinstance(body.get("name"), str):
        return None
    pid = body.get("pid")
    if pid.__class__ is not int or not 0 < pid <= _MAX_PID:  # (0, -1 or a bool would ask about other processes)
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        if clean:
            try:
                os.unlink(path)
            except OSError:
                pass
        return None
    except PermissionError:
        pass
    return body


def list_topics(directory: str | os.PathLike[str] | None = None, clean: bool = True, timeout: float = 1.0) -> Listing:
    """The live topics in ``directory`` (default: this user's topic directory), each publisher
    asked for its status (up to ``timeout`` seconds each). Sockets of dead publishers are
    removed when ``clean``, else only reported."""
    timeout = _unix.positive_seconds(timeout, "timeout")
    clean = check_flag(clean, "clean")
    try:
        # (a folder named here may be a shared one: access="group" or "all" sockets must be in
        # a folder others reach, and its owner lists them there)
        folder = naming.topic_directory(create=False, directory=directory, shared=directory is not None)
    except FileNotFoundError:
        return Listing(os.fspath(directory) if directory is not None else naming.default_directory())
    listing = Listing(folder)
    for entry in sorted(os.listdir(folder)):
        path = os.path.join(folder, entry)
        if entry.endswith(RELAY_SUFFIX):
            status = _relay_status(path, clean)
            if status is not None:
                listing.relays.append(status)
            continue
        if entry.endswith(naming.SUFFIX + naming.LOCK_SUFFIX):
            socket_path = path[: -len(naming.LOCK_SUFFIX)]
            if clean and not os.path.exists(socket_path):
                # An orphan lock, if no one holds it: its publisher died before binding.
                try:
                    fd = naming.take_lock(path)
                except (OSError, UsageError):
                    fd = None
                if fd is not None:
                    naming.release_lock(path, fd)
            continue
        if naming.name_of(path) is None or not sockets.is_socket(path):
            continue
        # A free lock means a dead publisher, unless the socket is still served: a live
        # publisher whose lock file was removed (a /tmp cleaner) is asked like any other.
        if not _lock_held(path) and not _served(path):
            listing.stale.append(path)
            if clean and _remove_stale(path):
                listing.removed.append(path)
            continue
        try:
            listing.topics.append(query(path, timeout))
        except (EglCudaError, OSError) as exc:
            listing.unresponsive[path] = str(exc) or type(exc).__name__
    return listing


def format_listing(listing: Listing) -> str:
    """The text ``python -m eglcuda topics`` prints."""
    lines = [f"topics in {listing.directory}:"]
    if not listing.topics:
        lines.append("  (none)")
    for topic in listing.topics:
        fps = f"{topic.fps:.1f}" if topic.fps is not None else (
            f"~{topic.measured_fps:.1f}" if topic.measured_fps is not None else "?")
        lines.append(f"  {topic.name}: pid {topic.pid}, {topic.width}x{topic.height} {topic.format} {topic.layout}, "
                     f"{fps} fps, pool {topic.pool}, {topic.published} published, access {topic.access}, "
                     f"{topic.subscribers_total} subscriber(s), {topic.dropped} dropped")
        for sub in topic.subscribers:
            lines.append(f"    subscriber {sub.id}: pid {sub.pid}, {sub.qos}"
                         f"{f' (queue {sub.queue})' if sub.qos == 'every' else ''}, {sub.transport}, "
                         f"{sub.delivered} delivered, {sub.skipped} skipped, {sub.outstanding} held")
        if topic.subscribers_total > len(topic.subscribers):
            lines.append(f"    ... and {topic.subscribers_total - len(topic.subscribers)} more")
        lines.extend(_relay_lines([r for r in listing.relays if r.get("name") == topic.name]))
    known = {topic.name for topic in listing.topics}
    lines.extend(_relay_lines([r for r in listing.relays if r.get("name") not in known]))
    for path in listing.stale:
        state = "removed" if path in listing.removed else "left in place"
        lines.append(f"  stale socket of a dead publisher: {path} ({state})")
    for path, why in listing.unresponsive.items():
        lines.append(f"  no answer from {path}: {why}")
    # (relay files, socket names and a silent peer's error are others' text: nothing in them may
    # move the cursor or start a line of its own)
    return "\n".join(protocol.printable(line) for line in lines)


def _relay_lines(relays: list[dict[str, Any]]) -> list[str]:
    lines = []
    for relay in relays:
        remotes = [r for r in relay["remotes"] if isinstance(r, dict)]
        lines.append(f"    relay on {relay.get('address', '?')}: pid {relay['pid']}, {relay.get('qos', '?')}, "
                     f"{len(remotes)} remote subscriber(s)")
        for remote in remotes:
            dropped = f", dropped: {remote['dropped']}" if remote.get("dropped") else ""
            lines.append(f"      remote {remote.get('peer', '?')}: {remote.get('qos', '?')}, {remote.get('sent', 0)} sent, "
                         f"{remote.get('skipped', 0)} skipped{dropped}")
    return lines
