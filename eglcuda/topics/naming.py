"""Topic names and where their sockets live.

A topic ``camera`` is the UNIX socket ``camera.topic`` in the topic directory, with a lock file
``camera.topic.lock`` beside it that the publisher holds (``flock``) for its whole life: the kernel
drops the lock when the publisher's process ends however it ends, so a socket whose lock is free
belongs to a dead publisher (stale) and may be removed.

The topic directory is ``$XDG_RUNTIME_DIR/eglcuda/`` when ``XDG_RUNTIME_DIR`` names a directory of
this user's, else ``/tmp/eglcuda-<uid>/``. eglcuda creates it with mode 0700 and refuses to use one
that is a symbolic link, is owned by someone else or is open to other users: another user who
could write there could put their own socket under a topic's name. A topic opened to a group or
to everyone (``access=``) therefore needs an explicit socket ``path`` in a directory those users
can reach.
"""
from __future__ import annotations

import os
import re
import stat

from ..errors import UsageError
from .._unix import check_path

SUFFIX = ".topic"
LOCK_SUFFIX = ".lock"
MAX_NAME = 63
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


def check_name(name: object) -> str:
    """Return ``name`` if it is a valid topic name: 1 to 63 characters out of letters, digits,
    ``_``, ``.`` and ``-``, starting with a letter or digit. Raise :class:`UsageError` otherwise."""
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME or not _NAME.match(name) or ".." in name:
        raise UsageError(f"a topic name is 1 to {MAX_NAME} letters, digits, '_', '.' or '-', starting with a letter "
                         f"or digit (no '..'), got {name!r}")
    return name


def _owned_private_directory(path: str, shared: bool = False) -> str | None:
    """Why ``path`` is not a private directory of this user (None when it is); ``shared``: one
    that others may reach but not write to will do."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return "it does not exist"
    except OSError as exc:
        return f"it cannot be read ({exc.strerror})"
    if stat.S_ISLNK(info.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISDIR(info.st_mode):
        return "it is not a directory"
    if info.st_uid != os.geteuid():
        return f"it belongs to uid {info.st_uid}, not to this process's uid {os.geteuid()}"
    if shared and info.st_mode & 0o022:
        return f"other users may write to it (mode {stat.S_IMODE(info.st_mode):04o}; eglcuda wants at most 0755)"
    if not shared and info.st_mode & 0o077:
        return f"other users can reach it (mode {stat.S_IMODE(info.st_mode):04o}; eglcuda wants 0700)"
    return None


def default_directory() -> str:
    """The topic directory for this user (not created; see :func:`topic_directory`)."""
    base = os.environ.get("XDG_RUNTIME_DIR", "")
    if base and os.path.isabs(base):
        try:
            info = os.stat(base)
            if stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid():
                return os.path.join(base, "eglcuda")
        except OSError:
            pass
    return f"/tmp/eglcuda-{os.geteuid()}"


def topic_directory(create: bool = False, directory: str | os.PathLike[str] | None = None,
                    shared: bool = False) -> str:
    """The topic directory (``directory`` or :func:`default_directory`), checked to be a private
    directory of this user (``shared``: or one others may reach but not write to, where
    ``access="group"`` or ``"all"`` publishers put their sockets); ``create`` makes it (mode
    0700) when missing. Raises
    :class:`UsageError` for a directory that is not safe to use or cannot be made, and
    ``FileNotFoundError`` when it is missing and not to be created."""
    if directory is None:
        path = default_directory()
    else:
        try:
            given: object = os.fspath(directory)
        except TypeError:
            given = None
        if not isinstance(given, str) or not given:
            raise UsageError(f"a topic directory is a non-empty str or os.PathLike, got {directory!r}")
        path = given
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:  # (its parent missing, read-only or not ours: XDG_RUNTIME_DIR, say)
            raise UsageError(f"cannot make the eglcuda topic directory {path}: {exc.strerror}; give the topic a "
                             "path= in a directory of yours, or set XDG_RUNTIME_DIR to one") from None
    problem = _owned_private_directory(path, shared)
    if problem == "it does not exist":
        raise FileNotFoundError(path)
    if problem is not None:
        raise UsageError(f"not using {path} as the eglcuda topic directory: {problem}")
    return path


def check_socket_path(path: str | os.PathLike[str]) -> str:
    """An explicit socket path, checked for what a UNIX socket takes (as the stream hand-over
    checks its paths: a non-empty str, no NUL, no abstract name, at most 107 bytes, a file
    name), made absolute (and checked again: the absolute path is what binds and connects)."""
    return check_path(os.path.abspath(check_path(path)))


def socket_path(name: str, path: str | os.PathLike[str] | None = None, create: bool = False) -> str:
    """The socket of topic ``name``: ``path`` when given, else ``<topic directory>/<name>.topic``
    (``create``: make the directory when missing)."""
    check_name(name)
    if path is not None:
        return check_socket_path(path)
    directory = topic_directory(create=create) if create else default_directory()
    if not create and os.path.exists(directory):
        topic_directory(create=False)  # refuse an unsafe directory before connecting into it
    return check_socket_path(os.path.join(directory, name + SUFFIX))


def lock_path(socket: str) -> str:
    """The lock file that goes with a topic socket."""
    return socket + LOCK_SUFFIX


def name_of(socket: str) -> str | None:
    """The topic name of a socket file in a topic directory (None for other files)."""
    base = os.path.basename(socket)
    if not base.endswith(SUFFIX):
        return None
    name = base[: -len(SUFFIX)]
    try:
        return check_name(name)
    except UsageError:
        return None


# ---- the publisher's lock -----------------------------------------------------------------------

def take_lock(path: str) -> int | None:
    """Take the lock file ``path`` (made if missing, mode 0600) for this process: its descriptor,
    or None when another process holds it. The kernel drops the lock when the descriptor closes,
    also when the process dies."""
    import fcntl

    for _ in range(16):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        except OSError as exc:
            kind = _kind_of(path)
            raise UsageError(f"cannot use {path} as the topic's lock file"
                             f"{f': it is {kind}' if kind else ''} ({exc.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        # Its holder may have removed the file between our open and our lock (it removes it as it
        # closes): a lock on a removed file guards nothing, so try again with the path's file.
        try:
            same = os.path.samestat(os.lstat(path), os.fstat(fd))
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)
    raise UsageError(f"could not take the lock file {path}: it keeps being replaced")


def _kind_of(path: str) -> str | None:
    """What is at ``path`` when it is not a file a lock can be (a directory, a link...), else None."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return None
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symbolic link (not followed)"
    return None if stat.S_ISREG(mode) else "not a regular file"


def release_lock(path: str, fd: int) -> None:
    """Remove the lock file (while still holding it) and let go of it."""
    try:
        if os.path.samestat(os.lstat(path), os.fstat(fd)):
            os.unlink(path)
    except OSError:
        pass
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
