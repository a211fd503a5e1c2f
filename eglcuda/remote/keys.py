"""The pre-shared key of a relay and its remote subscribers: where it comes from, what is refused
as a key, making one (``python -m eglcuda keygen``), and the Noise pre-shared key derived from it
(session.py proves it; docs/security.md, "Remote subscribers")."""
from __future__ import annotations

import errno
import hashlib
import os
import secrets
import stat
import zlib

from ..errors import UsageError

MIN_KEY = 16  # bytes
MAX_KEY = 4096  # bytes (a key file longer than this is not a key)
NEW_KEY = 32  # bytes of a key that keygen makes
KEY_FILE_VARIABLE = "EGLCUDA_REMOTE_KEY_FILE"
KEY_VARIABLE = "EGLCUDA_REMOTE_KEY"
KEYGEN = "python -m eglcuda keygen PATH"
_HEX_DIGITS = frozenset(b"0123456789abcdefABCDEF")
_from_environment: str | None = None  # EGLCUDA_REMOTE_KEY once read (it leaves os.environ then)


def load_key(key: bytes | None) -> bytes:
    """The key to use: ``key`` itself, else the file named by ``EGLCUDA_REMOTE_KEY_FILE``, else
    ``EGLCUDA_REMOTE_KEY`` (hex). ``EGLCUDA_REMOTE_KEY`` leaves ``os.environ`` at every call,
    whichever key is used, so that child processes do not inherit it; this process keeps it for
    its later relays and subscribers. Raises :class:`UsageError` naming both variables when
    there is none, or why the one used is not a usable key (:func:`check_key`)."""
    global _from_environment
    text = os.environ.pop(KEY_VARIABLE, None)
    if text:  # (checked when it is the key used: a key= or a key file wins over a bad one)
        _from_environment = text
    if key is not None:
        if isinstance(key, str) or not isinstance(key, (bytes, bytearray, memoryview)):
            raise UsageError(f"key is bytes (at least {MIN_KEY} random bytes), got {type(key).__name__}; a key file "
                             f"goes in {KEY_FILE_VARIABLE}, a hex key in {KEY_VARIABLE}; make one with {KEYGEN}")
        return check_key(bytes(key), "key=")
    path = os.environ.get(KEY_FILE_VARIABLE)
    if path:
        try:
            return read_key_file(path)
        except UsageError as exc:
            raise UsageError(f"{KEY_FILE_VARIABLE}: {exc}") from None  # (the file came from the environment: say so)
    if _from_environment is not None:
        try:
            raw = bytes.fromhex(_from_environment.strip())
        except ValueError:
            raise UsageError(f"{KEY_VARIABLE} is the key in hex, and it is not hex") from None
        return check_key(raw, KEY_VARIABLE)
    raise UsageError(f"a remote topic needs a pre-shared key: pass key=, or set {KEY_FILE_VARIABLE} (a file only "
                     f"its owner can read) or {KEY_VARIABLE} (hex); make one with {KEYGEN}")


def read_key_file(path: str) -> bytes:
    """The key in file ``path``: its bytes, without one line ending at the end (LF or CR LF).
    Refused: hex text (the key's bytes in hex, which :data:`KEY_VARIABLE` takes), a file that is
    not regular, that is not this process's user's (effective uid), that group or others may read
    or write, or whose folder others may write to (they could replace it)."""
    try:
        # (O_NONBLOCK: opening a FIFO would wait for a writer, before the check that it is no file)
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno == errno.ELOOP and os.path.islink(path):
            raise UsageError(f"key file {path} is a symbolic link: name the key file itself") from None
        raise UsageError(f"key file {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"key file {path} is not a regular file")
        if info.st_uid != os.geteuid():
            raise UsageError(f"key file {path} belongs to uid {info.st_uid}, not to this process's user "
                             f"({os.geteuid()})")
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UsageError(f"key file {path} may be read by others (mode {stat.S_IMODE(info.st_mode):o}): "
                             f"chmod 600 it")
        _check_folder(path)
        data = os.read(fd, MAX_KEY + 3)  # (a longer file reads as too long, its line ending dropped)
    finally:
        os.close(fd)
    # (one line ending, "\n" or "\r\n", is a hand-written key's or a CRLF editor's, never the key's:
    # keygen never draws a key ending in "\n")
    data = data[:-2] if data.endswith(b"\r\n") else data[:-1] if data.endswith(b"\n") else data
    if len(data) >= 2 * MIN_KEY and len(data) % 2 == 0 and all(c in _HEX_DIGITS for c in data):
        # (what EGLCUDA_REMOTE_KEY holds, in the wrong place: no guess, but not the key's bytes)
        raise UsageError(f"key file {path} holds hex text ({len(data)} hex digits): a key file holds the key's bytes "
                         f"themselves; convert it with 'xxd -r -p {path} > NEWFILE', or give the hex in "
                         f"{KEY_VARIABLE}")
    return check_key(data, f"key file {path}")


def _check_folder(path: str) -> None:
    folder = os.path.dirname(os.path.abspath(path))
    try:
        info = os.stat(folder)
    except OSError as exc:
        raise UsageError(f"key file {path}: its folder: {exc.strerror}") from None
    if info.st_uid not in (os.geteuid(), 0):
        raise UsageError(f"key file {path}: its folder {folder} belongs to uid {info.st_uid}, who could replace it")
    writable = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if writable and not info.st_mode & stat.S_ISVTX:
        raise UsageError(f"key file {path}: others may write to its folder {folder} (mode "
                         f"{stat.S_IMODE(info.st_mode):o}) and could replace it: keep the key in a folder only you "
                         f"can write to")


def check_key(key: bytes, where: str) -> bytes:
    """``key`` if it can be a key: 16..4096 bytes that look random. Refused with the reason: a
    key that looks like text (a password, or hex: the session can be attacked with a dictionary
    offline by whoever poses as the relay, so a key must be random bytes), the same byte
    repeated, a short repeated or counting pattern, or too few different byte values."""
    if not MIN_KEY <= len(key) <= MAX_KEY:
        got = f"more than {MAX_KEY}" if len(key) > MAX_KEY else str(len(key))  # (a file is read no further)
        raise UsageError(f"{where}: a key is {MIN_KEY}..{MAX_KEY} random bytes, got {got} ({KEYGEN} makes one)")
    why = _weakness(key)
    if why is not None:
        raise UsageError(f"{where}: not a usable key: {why}; a key is random bytes: make one with {KEYGEN}")
    return key


def _weakness(key: bytes) -> str | None:
    if len(set(key)) == 1:
        return "it is one byte value repeated"
    if all(32 <= b < 127 or b in (9, 10, 13) for b in key):
        return "it looks like text (a password or hex), which a dictionary can guess"
    steps = {(key[i + 1] - key[i]) % 256 for i in range(len(key) - 1)}
    if len(steps) == 1:
        return "it is a counting sequence"
    for period in range(2, len(key) // 2 + 1):
        if key == (key[:period] * (len(key) // period + 1))[:len(key)]:
            return f"it repeats a {period}-byte pattern"
    if len(set(key)) < min(len(key), 256) // 2:
        return f"it has only {len(set(key))} different byte values in {len(key)} bytes"
    if len(key) >= 256 and len(zlib.compress(key, 9)) < 0.9 * len(key):
        return "it compresses: it is not random"
    return None


def noise_psk(key: bytes) -> bytes:
    """The 32-byte Noise pre-shared key of ``key``: a hash of its length and its bytes, so that
    two different keys (also one a prefix of the other, or one padded with zero bytes) never
    prove each other."""
    return hashlib.sha256(b"eglcuda-remote psk\0" + len(key).to_bytes(4, "big") + key).digest()


def write_new_key(path: str) -> None:
    """Make a key: :data:`NEW_KEY` random bytes in a new file ``path``, mode 0600. Refuses a path
    that exists (it never overwrites a key) and a folder others may write to."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise UsageError(f"the key file's path is empty or not a path: {path!r}")
    _check_folder(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        if os.path.isdir(path):  # (no key to keep: "remove it first" would be the wrong advice)
            raise UsageError(f"{path} is a folder: name a new file in it (e.g. "
                             f"{os.path.join(os.fspath(path), 'relay.key')})") from None
        raise UsageError(f"{path} exists: keygen never overwrites a key (remove it first if you mean to)") from None
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror}") from None
    try:
        os.fchmod(fd, 0o600)
        key = secrets.token_bytes(NEW_KEY)
        # (Vanishingly rare: a random key that looks like text. One in 256 ends in a newline,
        # which read_key_file drops as a hand-written key's: such a key is drawn again.)
        while _weakness(key) is not None or key.endswith(b"\n"):
            key = secrets.token_bytes(NEW_KEY)
        written = 0
        while written < len(key):  # (a write may take part of it: a file size limit, a disk filling up)
            written += os.write(fd, key[written:])
        os.fsync(fd)
    except BaseException as exc:
        os.close(fd)
        os.unlink(path)
        if isinstance(exc, OSError) and exc.filename is None:  # (the file's, not standard output's)
            raise OSError(exc.errno, exc.strerror, os.fspath(path)) from None
        raise
    os.close(fd)
