"""The pre-shared key of a relay and its remote subscribers, and the mutual challenge-response
proof of holding it (stdlib ``hmac`` / ``secrets``; docs/security.md, "Remote subscribers")."""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import stat

from ..errors import UsageError

MIN_KEY = 16  # bytes
MAX_KEY = 4096  # bytes (a key file longer than this is not a key)
NONCE = 32  # bytes of each side's challenge
MAC = 32  # bytes of an HMAC-SHA256
KEY_FILE_VARIABLE = "EGLCUDA_REMOTE_KEY_FILE"
KEY_VARIABLE = "EGLCUDA_REMOTE_KEY"


def load_key(key: bytes | None) -> bytes:
    """The key to use: ``key`` itself, else the file named by ``EGLCUDA_REMOTE_KEY_FILE`` (which
    only its owner may read), else ``EGLCUDA_REMOTE_KEY`` (hex). Raises :class:`UsageError`
    naming both variables when there is none, or when the one found is not a usable key."""
    if key is not None:
        if isinstance(key, str) or not isinstance(key, (bytes, bytearray, memoryview)):
            raise UsageError(f"key is bytes (at least {MIN_KEY}), got {type(key).__name__}; a text key goes in a "
                             f"file ({KEY_FILE_VARIABLE}) or hex in {KEY_VARIABLE}")
        return _checked(bytes(key), "key=")
    path = os.environ.get(KEY_FILE_VARIABLE)
    if path:
        return read_key_file(path)
    text = os.environ.get(KEY_VARIABLE)
    if text:
        try:
            raw = bytes.fromhex(text.strip())
        except ValueError:
            raise UsageError(f"{KEY_VARIABLE} is the key in hex, and it is not hex") from None
        return _checked(raw, KEY_VARIABLE)
    raise UsageError(f"a remote topic needs a pre-shared key: pass key=, or set {KEY_FILE_VARIABLE} (a file only "
                     f"its owner can read) or {KEY_VARIABLE} (hex), at least {MIN_KEY} bytes")


def read_key_file(path: str) -> bytes:
    """The key in file ``path`` (its bytes, a trailing newline dropped); refused when group or
    others may read it, or it is not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        raise UsageError(f"key file {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"key file {path} is not a regular file")
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise UsageError(f"key file {path} may be read by others (mode {stat.S_IMODE(info.st_mode):o}): "
                             f"chmod 600 it")
        data = os.read(fd, MAX_KEY + 2)
    finally:
        os.close(fd)
    if data.endswith(b"\n"):
        data = data[:-1]
    return _checked(data, f"key file {path}")


def _checked(key: bytes, where: str) -> bytes:
    if not MIN_KEY <= len(key) <= MAX_KEY:
        raise UsageError(f"{where}: a key is {MIN_KEY}..{MAX_KEY} bytes, got {len(key)}")
    return key


def nonce() -> bytes:
    return secrets.token_bytes(NONCE)


def proof(key: bytes, role: bytes, first: bytes, second: bytes, name: bytes) -> bytes:
    """HMAC-SHA256 over the role, both nonces (the prover's peer's first) and the topic name:
    a proof made for one side, connection or topic is worth nothing for another."""
    return hmac.new(key, b"eglcuda-remote-v1\0" + role + b"\0" + first + second + name, hashlib.sha256).digest()


def same(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(a, b)
