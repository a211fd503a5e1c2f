"""CUDA MPS (Multi-Process Service) for a pipeline's processes: is this process under MPS, and a
private MPS control daemon that lives exactly as long as the pipeline.

Between two processes on one GPU, frame rates are bound by the GPU time-slicing between the
processes' CUDA contexts; under MPS the processes' work goes through one shared server context
instead (measured: 3,124 -> 17,078 frames/s, 1080p, H100, ``samples/cross_process.py``).

::

    from eglcuda import mps

    with mps.MPSDaemon() as daemon:          # a private daemon; stopped (and cleaned) on exit
        daemon.apply()                       # this process and the children it starts from now on
        ...                                  # start the pipeline's processes here

The daemon's pipe and log directories are private (mode 0700) under
``$XDG_RUNTIME_DIR/eglcuda/mps-<id>/`` (``/tmp/eglcuda-<uid>/`` without XDG_RUNTIME_DIR). A small
watchdog process (a fresh interpreter running :func:`_watch`) holds the read end of a pipe whose
write end only the owning process holds: when the owner exits, however it exits (SIGKILL
included), the watchdog reads EOF, sends ``quit`` to the daemon, waits for the daemon and its
server, and removes the directories. Nothing here changes the GPU's compute mode or any device setting.

Command line: ``python -m eglcuda mps start|stop|status`` (see :mod:`eglcuda.cli`).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import secrets
import select
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NoReturn

from ._bind import cuda as _cuda
from ._bind import loader as _loader
from ._integers import as_int, check_flag
from ._unix import positive_seconds, read_regular_file
from .errors import ClosedError, EglCudaError, MPSError, MPSInUse, Timeout, Unsupported, UsageError

CONTROL = "nvidia-cuda-mps-control"
SERVER = "nvidia-cuda-mps-server"
# Where driver packages put the binaries when they are not on PATH (/usr/local/nvidia/bin: the
# NVIDIA container images).
SEARCH_DIRECTORIES: tuple[str, ...] = ("/usr/local/nvidia/bin", "/usr/bin", "/usr/local/cuda/bin")
INSTALL_HINT = (
    "it ships with the NVIDIA driver, not with the CUDA toolkit: Debian 'apt-get install nvidia-cuda-mps' "
    "(non-free), Ubuntu 'nvidia-compute-utils-<driver branch>', the .run installer puts it in /usr/bin; in a "
    "container the NVIDIA Container Toolkit mounts it when NVIDIA_DRIVER_CAPABILITIES includes 'compute'"
)

PIPE_VARIABLE = "CUDA_MPS_PIPE_DIRECTORY"
LOG_VARIABLE = "CUDA_MPS_LOG_DIRECTORY"
# The driver's default pipe directory when the variable is unset (NVIDIA MPS documentation).
SYSTEM_PIPE_DIRECTORY = "/tmp/nvidia-mps"
# What the control daemon keeps in its pipe directory: its pid file (gone once it stops) and its
# control socket (left behind when it stops).
PID_FILE = "nvidia-cuda-mps-control.pid"
CONTROL_SOCKET = "control"
_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with the NUL; the daemon also makes "control_privileged"

MEASURED_GAIN = ("a cross-process pipeline on one GPU runs about 5x faster under MPS "
                 "(measured 3.1k -> 17k frames/s at 1080p, H100)")
START_HINT = "start one with `python -m eglcuda mps start`"

# Where private instances live when XDG_RUNTIME_DIR is unset: /tmp/eglcuda-<uid>.
_FALLBACK_ROOT = "/tmp"
_INSTANCE_PREFIX = "mps-"
_STATE_FILE = "state.json"
_STALE_START_S = 60.0  # an instance without a watchdog for this long is a leftover of a crashed start


# ---- paths ---------------------------------------------------------------------------------------

def base_directory(create: bool = True) -> Path:
    """The per-user directory holding eglcuda's MPS instances: ``$XDG_RUNTIME_DIR/eglcuda``, or
    ``/tmp/eglcuda-<uid>`` when XDG_RUNTIME_DIR is unset. Created with mode 0700; an existing one
    is refused (:class:`MPSError`) when it is not this user's or others may write to it."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime) and os.path.isdir(runtime):
        base = Path(runtime) / "eglcuda"
    else:
        base = Path(_FALLBACK_ROOT) / f"eglcuda-{os.getuid()}"
    if create:
        _private_directory(base)
    return base


def _private_directory(path: Path) -> None:
    """Make ``path`` (mode 0700) or check that the existing one is this user's alone."""
    try:
        os.mkdir(path, 0o700)
        os.chmod(path, 0o700)  # mkdir's mode goes through the umask
    except FileExistsError:
        pass
    except PermissionError as exc:
        raise MPSError(f"not allowed to create {path}: {exc.strerror}") from None
    except FileNotFoundError:
        raise  # (its parent went: _start_private makes it again)
    except OSError as exc:  # a read-only or full filesystem, say
        raise MPSError(f"cannot create {path}: {exc.strerror or exc}") from None
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise MPSError(f"{path} exists and is not a directory (a link or a file): refusing to use it for MPS")
    if info.st_uid != os.getuid():
        raise MPSError(f"{path} belongs to uid {info.st_uid}, not to this user (uid {os.getuid()}): refusing to "
                       "put MPS pipes there")
    if info.st_mode & 0o022:
        raise MPSError(f"{path} is writable by group or others (mode {stat.S_IMODE(info.st_mode):o}): refusing to "
                       f"put MPS pipes there; 'chmod 700 {path}' or remove it")


def find_binary(name: str = CONTROL) -> str | None:
    """Where ``name`` is: PATH first, then :data:`SEARCH_DIRECTORIES`; None when nowhere."""
    found = shutil.which(name)
    if found:
        return os.path.abspath(found)
    for folder in SEARCH_DIRECTORIES:
        candidate = os.path.join(folder, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _require_binaries() -> str:
    control = find_binary(CONTROL)
    searched = f"searched PATH and {', '.join(SEARCH_DIRECTORIES)}"
    if control is None:
        raise Unsupported(CONTROL, where=f"this machine ({searched})", hint=INSTALL_HINT)
    # The control daemon starts the server itself; it must find it next to it or on PATH.
    if not os.access(os.path.join(os.path.dirname(control), SERVER), os.X_OK) and find_binary(SERVER) is None:
        raise Unsupported(SERVER, where=f"this machine ({searched}; {CONTROL} is {control})", hint=INSTALL_HINT)
    return control


# ---- processes -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class MPSProcess:
    """A running MPS control daemon or server found in /proc."""

    pid: int
    uid: int
    kind: str  # "control" or "server"
    pipe_directory: str | None  # from its environment; None when this user may not read it


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _process_start(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot), telling a pid from its reuse."""
    data = _read(f"/proc/{pid}/stat")
    if not data:
        return None
    try:
        return int(data.rsplit(b")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def _alive(pid: int | None, start: int | None = None) -> bool:
    if not pid or pid <= 0:
        return False
    data = _read(f"/proc/{pid}/stat")
    if data is None:
        return False
    try:
        state = data.rsplit(b")", 1)[1].split()[0]
    except IndexError:
        return False
    if state in (b"Z", b"X"):  # a zombie has exited; only its parent's wait is missing
        return False
    return start is None or _process_start(pid) == start


def _mps_kind(argv: list[bytes]) -> str | None:
    # A daemon started through an interpreter (a wrapper script) shows the script as argv[1].
    for arg in argv[:2]:
        name = os.path.basename(arg.decode(errors="replace"))
        if name == SERVER:
            return "server"
        if name == CONTROL:
            # Without -d/-f the program is a client sending commands, not the daemon.
            return "control" if any(a in (b"-d", b"-f") for a in argv[1:4]) else None
    return None


def _environment_of(pid: int) -> dict[str, str] | None:
    data = _read(f"/proc/{pid}/environ")
    if data is None:
        return None
    found = {}
    for item in data.split(b"\0"):
        key, _, value = item.partition(b"=")
        if key in (PIPE_VARIABLE.encode(), LOG_VARIABLE.encode()):
            found[key.decode()] = value.decode(errors="replace")
    return found


def mps_processes() -> list[MPSProcess]:
    """Every MPS control daemon and server running on this machine (that /proc shows), with the
    pipe directory each serves when its environment is readable."""
    found: list[Any] = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    me = os.getpid()
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        argv = (_read(f"/proc/{pid}/cmdline") or b"").split(b"\0")
        kind = _mps_kind(argv)
        if kind is None or not _alive(pid):
            continue
        try:
            uid = os.stat(f"/proc/{pid}").st_uid
        except OSError:
            continue
        environment = _environment_of(pid)
        pipe = None if environment is None else environment.get(PIPE_VARIABLE) or SYSTEM_PIPE_DIRECTORY
        found.append(MPSProcess(pid, uid, kind, pipe))
    return found


def _pid_file_daemon(pipe_directory: str) -> int | None:
    """The pid of the control daemon serving ``pipe_directory`` per its pid file, if it runs."""
    data = _read(os.path.join(pipe_directory, PID_FILE))
    try:
        pid = int((data or b"").strip() or 0)
    except ValueError:
        return None
    return pid if _alive(pid) else None


def _control_daemon(pipe_directory: str, processes: Iterable[MPSProcess] | None = None) -> int | None:
    """The pid of the control daemon serving ``pipe_directory``: its pid file's, else the one
    /proc shows (``processes``, or a fresh look): a daemon that has opened its socket, which is
    what :meth:`MPSDaemon.start` waits for, may not have written its pid file yet."""
    pid = _pid_file_daemon(pipe_directory)
    if pid is None:
        pid = next((p.pid for p in (mps_processes() if processes is None else processes)
                    if p.kind == "control" and p.pipe_directory == pipe_directory), None)
    return pid


@dataclass(frozen=True)
class RunningDaemon:
    """An MPS control daemon that serves clients on this machine."""

    pipe_directory: str | None  # None: another user's daemon whose environment cannot be read
    pid: int | None
    uid: int | None
    eglcuda: bool  # one of this user's eglcuda instances

    @property
    def system(self) -> bool:
        return self.pipe_directory == SYSTEM_PIPE_DIRECTORY


def running_daemons() -> list[RunningDaemon]:
    """The MPS control daemons running now: found in /proc, and through the pid files of the
    default pipe directory and of this process's CUDA_MPS_PIPE_DIRECTORY."""
    base = str(base_directory(create=False)) + os.sep
    daemons: dict[int | None, RunningDaemon] = {}
    for process in mps_processes():
        if process.kind == "control":
            pipe = process.pipe_directory
            daemons[process.pid] = RunningDaemon(pipe, process.pid, process.uid,
                                                 bool(pipe and pipe.startswith(base)))
    for pipe in {SYSTEM_PIPE_DIRECTORY, os.environ.get(PIPE_VARIABLE) or SYSTEM_PIPE_DIRECTORY}:
        pid = _pid_file_daemon(pipe)
        known = daemons.get(pid)
        if pid is not None and (known is None or known.pipe_directory is None):
            try:
                uid = os.stat(f"/proc/{pid}").st_uid
            except OSError:
                uid = None
            daemons[pid] = RunningDaemon(pipe, pid, uid, pipe.startswith(base))
    return sorted(daemons.values(), key=lambda d: (d.pid or 0))


def _in_use_message(daemon: RunningDaemon) -> str:
    if daemon.system:
        return (f"a system-wide MPS daemon already serves this machine (pipe dir {daemon.pipe_directory}, pid "
                f"{daemon.pid}): use it by leaving {PIPE_VARIABLE} unset")
    if daemon.pipe_directory is None:
        return (f"an MPS daemon of another user (uid {daemon.uid}, pid {daemon.pid}) already serves this machine; "
                "its pipe dir cannot be read: ask its owner for it and set "
                f"{PIPE_VARIABLE} to it, or stop it")
    who = "an eglcuda MPS daemon" if daemon.eglcuda else "an MPS daemon"
    return (f"{who} already serves this machine (pipe dir {daemon.pipe_directory}, pid {daemon.pid}): use it with "
            f"'export {PIPE_VARIABLE}={shlex.quote(daemon.pipe_directory)}'"
            + (", or stop it with `python -m eglcuda mps stop`" if daemon.eglcuda else ""))


# ---- detection -----------------------------------------------------------------------------------

def pipe_directory_in_effect() -> str:
    """The pipe directory a CUDA client in this process connects through (the variable, or the
    driver's default)."""
    return os.environ.get(PIPE_VARIABLE) or SYSTEM_PIPE_DIRECTORY


def _daemon_in_effect() -> int | None:
    """The pid of the control daemon serving this process's pipe directory (its pid file), if any."""
    return _pid_file_daemon(pipe_directory_in_effect())


def _reachable(pid: int | None) -> str:
    """What serves this process's pipe directory, given :func:`_daemon_in_effect`'s answer."""
    pipe = pipe_directory_in_effect()
    if pid is None:
        return f"no MPS control daemon serves pipe dir {pipe}"
    return f"an MPS control daemon (pid {pid}) serves pipe dir {pipe}, the one this process would use"


def under_mps(device: int = 0, *, initialize: bool = True) -> tuple[bool | None, str]:
    """Whether this process's CUDA contexts on ``device`` run under MPS, and the evidence.

    The answer comes from the driver: ``CU_DEVICE_ATTRIBUTE_MPS_ENABLED`` ("contexts created on
    this device will be shared via MPS"), read after ``cuInit``, which is where the driver
    connects to an MPS control daemon or runs without one. None means it cannot be told (a
    driver that does not know the attribute, or ``initialize=False`` before CUDA is
    initialized); the reason then says what evidence there is. Never raises.
    """
    try:
        ok, why = _loader.cuda_available()
        if not ok:
            return False, f"no CUDA driver ({why})"
        if not initialize and not _cuda.initialized():
            return None, f"CUDA is not initialized in this process yet; {_reachable(_daemon_in_effect())}"
        try:
            enabled = _cuda.mps_enabled(device)
        except EglCudaError as exc:
            # cuInit fails (CUDA_ERROR_MPS_CONNECTION_FAILED, 805) when a daemon answers but its server
            # cannot start for this process.
            return None, f"the CUDA driver did not answer: {exc}; {_reachable(_daemon_in_effect())}"
        if enabled is None:
            return None, (f"this CUDA driver does not report CU_DEVICE_ATTRIBUTE_MPS_ENABLED (older than CUDA 12.x); "
                          f"{_reachable(_daemon_in_effect())}")
        if enabled:
            return True, (f"CU_DEVICE_ATTRIBUTE_MPS_ENABLED = 1 on device {device}: contexts go through the MPS "
                          f"server of pipe dir {pipe_directory_in_effect()}")
        pid = _daemon_in_effect()  # read once: the reason and the note below agree
        reachable = _reachable(pid)
        if pid is not None:
            reachable += " (it started after this process initialized CUDA, or refused it: see its control.log)"
        return False, f"CU_DEVICE_ATTRIBUTE_MPS_ENABLED = 0 on device {device}; {reachable}"
    except Exception as exc:  # detection is advice: it never takes a program down
        return None, f"detection failed: {type(exc).__name__}: {exc}"


def advice(active: bool | None) -> str:
    """One line for reports: what MPS would bring, or that it is on."""
    if active:
        return f"active (pipe dir {pipe_directory_in_effect()})"
    return f"not active: {MEASURED_GAIN}; {START_HINT}"


# ---- instances -----------------------------------------------------------------------------------

def _instance_paths(directory: Path) -> tuple[Path, Path]:
    return directory / "pipe", directory / "log"


# What each field of an instance's state file may hold; a field of another type (a file damaged
# or written by hand) is read as absent.
_MAX_STATE_BYTES = 65536  # (a state file is a few hundred bytes: more is no state file of ours)
_STATE_TYPES: dict[str, tuple[type, ...]] = {
    "watchdog_pid": (int,), "watchdog_start": (int,), "owner_pid": (int,), "watch_pid": (int,),
    "created": (int, float), "timeout": (int, float), "binary": (str,), "detached": (bool,),
}


def _read_state(directory: Path) -> dict[str, Any]:
    data = read_regular_file(directory / _STATE_FILE, _MAX_STATE_BYTES)  # (a FIFO there is not waited on)
    try:
        loaded = json.loads(data) if data is not None else None
    except (ValueError, RecursionError):  # (RecursionError: arrays nested thousands deep)
        return {}
    if not isinstance(loaded, dict):
        return {}
    return {key: value for key, value in loaded.items()
            if key not in _STATE_TYPES or (isinstance(value, _STATE_TYPES[key])
                                           and (key == "detached" or not isinstance(value, bool)))}


def _write_state(directory: Path, state: dict[str, Any]) -> None:
    temporary = directory / (_STATE_FILE + ".tmp")
    temporary.write_text(json.dumps(state))
    os.replace(temporary, directory / _STATE_FILE)


def _instance_processes(pipe: Path) -> list[int]:
    """Pids of the control daemon and servers serving ``pipe`` (never its clients)."""
    pids = {p.pid for p in mps_processes() if p.pipe_directory == str(pipe)}
    from_file = _pid_file_daemon(str(pipe))
    if from_file is not None and _mps_kind((_read(f"/proc/{from_file}/cmdline") or b"").split(b"\0")):
        pids.add(from_file)
    return sorted(pids)


def _log_tail(log: Path, lines: int = 12) -> str:
    chunks = []
    for name in ("control.log", "server.log", "launch.log"):
        for folder in (log, log.parent):
            data = _read(str(folder / name))
            if data:
                tail = data.decode(errors="replace").rstrip().splitlines()[-lines:]
                chunks.append(f"{name}:\n" + "\n".join("  " + line for line in tail))
                break
    return "\n".join(chunks)


def _send(binary: str | None, pipe: Path, log: Path, command: str, timeout: float) -> str:
    """Send one command through ``nvidia-cuda-mps-control`` (client mode); its output, or why not."""
    if binary is None:
        return "no control binary"
    environment = {**os.environ, PIPE_VARIABLE: str(pipe), LOG_VARIABLE: str(log)}
    try:
        done = subprocess.run([binary], input=command + "\n", env=environment, capture_output=True, text=True,
                              timeout=timeout, start_new_session=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return (done.stdout + done.stderr).strip()


def _shutdown(directory: Path, timeout: float = 10.0) -> dict[str, Any]:
    """Stop the instance in ``directory`` and remove it: ``quit`` to its daemon, a bounded wait for
    the daemon and its servers, SIGTERM then SIGKILL to what is left of them, then the directory.
    Used by the watchdog and by :func:`stop` alike."""
    pipe, log = _instance_paths(directory)
    state = _read_state(directory)
    report: dict[str, Any] = {"directory": str(directory), "signalled": []}
    deadline = time.monotonic() + timeout
    if not (pipe / CONTROL_SOCKET).exists():
        # (no socket to say quit through, the directory removed under the daemon, say: nothing
        # to wait for, signals at once)
        report["quit"] = "no control socket"
        deadline = time.monotonic()
    elif _instance_processes(pipe) or (pipe / PID_FILE).exists():
        report["quit"] = _send(state.get("binary") or find_binary(), pipe, log, "quit", max(timeout, 1.0))
    steps: tuple[tuple[signal.Signals | None, float], ...] = ((None, 0.0), (signal.SIGTERM, 3.0), (signal.SIGKILL, 2.0))
    for sig, grace in steps:
        if sig is not None:
            left = _instance_processes(pipe)
            if not left:
                break
            for pid in left:
                with contextlib.suppress(OSError):
                    os.kill(pid, sig)
            report["signalled"].append({"signal": sig.name, "pids": left})
            deadline = time.monotonic() + grace
        while _instance_processes(pipe) and time.monotonic() < deadline:
            time.sleep(0.05)
    report["left"] = _instance_processes(pipe)
    shutil.rmtree(directory, ignore_errors=True)
    report["removed"] = not directory.exists()
    _remove_base_if_empty(directory.parent)  # the per-user directory too, when this was its last instance
    return report


def _open_directory(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _remove_base_if_empty(base: Path) -> None:
    """Remove the per-user directory if it is empty and no start holds it (:func:`_start_lock`)."""
    try:
        fd = _open_directory(base)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (held: a start is about to use the directory)
        os.rmdir(base)
    except OSError:
        pass
    finally:
        os.close(fd)


# The descriptors of the start locks this process holds or is taking. A flock belongs to the
# open file, which a child forked meanwhile (a fork-start worker pool) shares: the child closes
# its copies, or the lock would stay held until that child exits.
_start_lock_fds: set[int] = set()


def _close_start_locks_in_child() -> None:
    for fd in _start_lock_fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    _start_lock_fds.clear()


os.register_at_fork(after_in_child=_close_start_locks_in_child)


@contextlib.contextmanager
def _start_lock(wait: float) -> Iterator[None]:
    """One start at a time for this user: an exclusive flock on the per-user directory, held from
    the look for running daemons until the new one runs. Without it, two processes starting
    together both saw no daemon and both started one. :class:`Timeout` after ``wait`` s."""
    deadline = time.monotonic() + wait
    while True:
        try:
            base = base_directory()
        except FileNotFoundError as exc:  # (the folder it goes in is gone: $XDG_RUNTIME_DIR removed)
            raise MPSError(f"cannot create the per-user MPS directory: {exc.strerror or exc}") from None
        try:
            fd = _open_directory(base)
        except FileNotFoundError:  # (removed by the stop of its last instance meanwhile)
            if time.monotonic() >= deadline:
                raise Timeout(f"the per-user MPS directory kept disappearing for {wait:g} s") from None
            time.sleep(0.01)
            continue
        except OSError as exc:
            raise MPSError(f"cannot open {base}: {exc.strerror or exc}") from None
        _start_lock_fds.add(fd)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise Timeout(f"another process kept starting an eglcuda MPS daemon (it holds {base}) "
                                      f"for {wait:g} s") from None
                    time.sleep(0.01)
            try:  # the directory locked is still the one of that name (not removed before the lock)
                named = os.stat(base, follow_symlinks=False)
                held = os.fstat(fd)
                same = (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)
            except OSError:
                same = False
        except BaseException:
            _start_lock_fds.discard(fd)
            os.close(fd)
            raise
        if same:
            break
        _start_lock_fds.discard(fd)
        os.close(fd)
    try:
        yield
    finally:
        _start_lock_fds.discard(fd)
        os.close(fd)  # (the lock goes with it)


def instances() -> list[Path]:
    """This user's eglcuda MPS instance directories."""
    base = base_directory(create=False)
    try:
        return sorted(p for p in base.iterdir() if p.name.startswith(_INSTANCE_PREFIX) and p.is_dir())
    except OSError:
        return []


def _watchdog_alive(state: dict[str, Any]) -> bool:
    return _alive(state.get("watchdog_pid"), state.get("watchdog_start"))


def reap_stale() -> list[str]:
    """Stop and remove instances whose watchdog is gone (all their guardians died at once, e.g. a
    killed process group or a reboot of the runtime directory's filesystem). Returns their paths."""
    reaped = []
    for directory in instances():
        state = _read_state(directory)
        if _watchdog_alive(state):
            continue
        created = state.get("created") or _mtime(directory)
        if state.get("watchdog_pid") is None and time.time() - created < _STALE_START_S:
            continue  # being started right now by someone
        _shutdown(directory, timeout=5.0)
        reaped.append(str(directory))
    return reaped


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def instance_status(directory: Path) -> dict[str, Any]:
    """What one instance looks like now (plain data)."""
    pipe, log = _instance_paths(directory)
    state = _read_state(directory)
    found = [p for p in mps_processes() if p.pipe_directory == str(pipe)]
    processes = {p.pid: p.kind for p in found}
    control = _control_daemon(str(pipe), found)
    return {
        "directory": str(directory),
        "pipe_directory": str(pipe),
        "log_directory": str(log),
        "control_pid": control,
        "running": control is not None,
        "servers": sorted(pid for pid, kind in processes.items() if kind == "server"),
        "watchdog_pid": state.get("watchdog_pid"),
        "watchdog_alive": _watchdog_alive(state),
        "owner_pid": state.get("owner_pid"),
        "watch_pid": state.get("watch_pid"),
        "detached": state.get("detached", False),
        "binary": state.get("binary"),
        "created": state.get("created"),
    }


# ---- the daemon ----------------------------------------------------------------------------------

class MPSDaemon:
    """A private MPS control daemon for a pipeline's processes (a context manager).

    :meth:`start` makes the private pipe and log directories, starts ``nvidia-cuda-mps-control -d``
    with them and waits for its control socket; :meth:`env` gives the variables the pipeline's
    processes need, :meth:`apply` puts them into this process's environment (before CUDA starts);
    :meth:`stop` quits the daemon, waits for it and its server, and removes the directories.

    ``timeout``: seconds to wait for the daemon to come up, and for it to go at stop.
    ``reuse``: when an MPS daemon already serves this machine, use it (not owned: :meth:`stop`
    leaves it alone) instead of refusing with :class:`MPSInUse`.
    ``detach``: do not tie the daemon to this process (the command line's ``mps start``): it
    runs until :func:`stop`, or until ``owner_pid`` exits when that is given.
    The daemon is stopped by a watchdog when the process that started it (not detached) or
    ``owner_pid`` exits, however it exits. Processes forked (not spawned) from the owner keep
    the daemon up until they exit too: they inherit the watchdog's pipe.
    """

    def __init__(self, *, timeout: float = 10.0, reuse: bool = False, detach: bool = False,
                 owner_pid: int | None = None) -> None:
        self.timeout = positive_seconds(timeout, "timeout")
        pid = as_int(owner_pid)
        if owner_pid is not None and not (pid is not None and pid > 0 and _alive(pid)):
            raise UsageError(f"owner_pid {owner_pid!r} is not a running process")
        owner_pid = pid
        self.reuse = check_flag(reuse, "reuse")
        self.detach = check_flag(detach, "detach")
        self.owner_pid = owner_pid
        self.directory: Path | None = None
        self.pipe_directory: str | None = None
        self.log_directory: str | None = None
        self.owned = False
        self.adopted: RunningDaemon | None = None
        self._lock = threading.Lock()
        self._guard: weakref.finalize[Any, Any] | None = None  # closes the watchdog pipe's write end
        self._write_end = -1
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._saved_environment: dict[str, str | None] | None = None
        self._stopped = False
        self._pid = os.getpid()  # the process that may stop the daemon (a forked child only lets go)

    def __reduce__(self) -> NoReturn:
        # (a copy would share the watchdog pipe's descriptor: closed by one, written by the other
        # after the number is reused)
        raise TypeError("an eglcuda.mps.MPSDaemon owns a daemon process and its watchdog: it cannot be copied or "
                        "pickled; pass its env() to other processes")

    def __copy__(self) -> NoReturn:
        self.__reduce__()

    def __deepcopy__(self, memo: object) -> NoReturn:
        self.__reduce__()

    # -- life cycle

    def start(self) -> MPSDaemon:
        """Start the daemon (or adopt a running one with ``reuse``). Raises :class:`MPSInUse` when
        another daemon serves the machine, :class:`Unsupported` when the binaries are missing,
        :class:`MPSError` (with the log's last lines) when the daemon will not run, and
        :class:`eglcuda.Timeout` when its control socket does not appear in time."""
        with self._lock:
            if self.pipe_directory is not None or self._stopped:
                raise UsageError("an MPSDaemon starts once; make a new one")
            made = not os.path.lexists(base_directory(create=False))
            tried = False
            try:
                with _start_lock(2 * self.timeout + 10.0):
                    reap_stale()
                    daemons = running_daemons()
                    if daemons:
                        usable = self._choose(daemons)
                        if self.reuse and usable is not None:
                            self.adopted = usable
                            self.pipe_directory = usable.pipe_directory
                            self.log_directory = self._adopted_log(usable)
                            return self
                        refused = usable or daemons[0]
                        raise MPSInUse(_in_use_message(refused), refused.pipe_directory)
                    binary = _require_binaries()
                    tried = True
                    self._start_private(binary)
                    return self
            finally:
                if not self.owned and (made or tried):  # (made for the lock, or a failed start's: not left behind)
                    _remove_base_if_empty(base_directory(create=False))

    @staticmethod
    def _choose(daemons: list[RunningDaemon]) -> RunningDaemon | None:
        """The daemon this process would use: the one of its pipe directory, else one whose pipe
        directory is known."""
        pipe = pipe_directory_in_effect()
        for daemon in daemons:
            if daemon.pipe_directory == pipe:
                return daemon
        return next((d for d in daemons if d.pipe_directory is not None), None)

    @staticmethod
    def _adopted_log(daemon: RunningDaemon) -> str | None:
        if daemon.pid is not None:
            environment = _environment_of(daemon.pid) or {}
            if LOG_VARIABLE in environment:
                return environment[LOG_VARIABLE]
        return None

    def _start_private(self, binary: str) -> None:
        directory = base_directory(create=False) / f"{_INSTANCE_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        pipe, log = _instance_paths(directory)
        if len(str(pipe / "control_privileged").encode()) > _SOCKET_PATH_MAX:
            raise UsageError(f"the MPS pipe directory {pipe} is too long for a UNIX socket path "
                             f"({_SOCKET_PATH_MAX} bytes): set XDG_RUNTIME_DIR to a shorter directory")
        for attempt in range(3):
            base_directory()
            try:
                _private_directory(directory)  # the last instance's stop may remove base in between
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
        state = {"owner_pid": None if self.detach else os.getpid(), "watch_pid": self.owner_pid,
                 "detached": self.detach, "binary": binary, "created": time.time(),
                 "watchdog_pid": None, "watchdog_start": None, "timeout": self.timeout}
        try:
            # (inside the try: a failure here, a full filesystem say, removes the instance too)
            for folder in (pipe, log):
                _private_directory(folder)
            _write_state(directory, state)
        except BaseException as exc:
            self._abandon(directory)
            if isinstance(exc, OSError):
                raise MPSError(f"cannot set up the MPS instance in {directory}: {exc.strerror or exc}") from None
            raise
        self.directory, self.pipe_directory, self.log_directory = directory, str(pipe), str(log)
        try:
            watchdog = self._spawn_watchdog(directory)
            state.update(watchdog_pid=watchdog.pid, watchdog_start=_process_start(watchdog.pid))
            _write_state(directory, state)
            self.owned = True
            self._launch(binary, directory, pipe, log)
        except BaseException as exc:
            self._abandon(directory)
            if isinstance(exc, OSError) and not isinstance(exc, EglCudaError):
                raise MPSError(f"cannot start the MPS daemon in {directory}: {exc.strerror or exc}") from None
            raise

    def _spawn_watchdog(self, directory: Path) -> subprocess.Popen[bytes]:
        # -c rather than -m eglcuda.mps: the package imports this module, and runpy warns about that.
        command = [sys.executable, "-c", "import sys; from eglcuda.mps import _main; sys.exit(_main())", "_watch",
                   "--dir", str(directory), "--timeout", str(self.timeout)]
        pass_fds: tuple[int, ...] = ()
        write_end = None
        if not self.detach:
            read_end, write_end = os.pipe()  # both ends close-on-exec: only the watchdog gets the read end
            command += ["--fd", str(read_end)]
            pass_fds = (read_end,)
        if self.owner_pid is not None:
            command += ["--pid", str(self.owner_pid)]
        package_root = str(Path(__file__).resolve().parents[1])
        environment = dict(os.environ)
        environment["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, environment.get("PYTHONPATH")) if p)
        with open(directory / "watchdog.log", "ab") as log:
            try:
                process = subprocess.Popen(command, pass_fds=pass_fds, env=environment, stdin=subprocess.DEVNULL,
                                           stdout=log, stderr=log, start_new_session=True, cwd="/")
            finally:
                if pass_fds:
                    os.close(pass_fds[0])
        if write_end is not None:
            self._write_end = write_end
            self._guard = weakref.finalize(self, _close_quietly, write_end)
        self._watchdog = process
        return process

    def _launch(self, binary: str, directory: Path, pipe: Path, log: Path) -> None:
        environment = dict(os.environ)
        environment.update({PIPE_VARIABLE: str(pipe), LOG_VARIABLE: str(log)})
        # The daemon starts nvidia-cuda-mps-server by name: let it find the one next to it.
        environment["PATH"] = os.pathsep.join(p for p in (os.path.dirname(binary), environment.get("PATH")) if p)
        deadline = time.monotonic() + self.timeout
        with open(directory / "launch.log", "wb") as output:  # a file, not a pipe: the daemon may keep it open
            try:
                launcher = subprocess.Popen([binary, "-d"], env=environment, stdin=subprocess.DEVNULL, stdout=output,
                                            stderr=output, start_new_session=True, cwd="/")
            except OSError as exc:
                raise MPSError(f"cannot run {binary}: {exc.strerror or exc}") from None
        try:
            code = launcher.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            code = None  # a launcher that stays in the foreground: the socket decides
        if code:
            raise MPSError(f"{binary} -d exited with status {code}", _log_tail(log))
        control = pipe / CONTROL_SOCKET
        while time.monotonic() < deadline:
            if control.exists() and (_pid_file_daemon(str(pipe)) is not None or _instance_processes(pipe)):
                return
            if code is not None and not _instance_processes(pipe):
                time.sleep(0.1)  # a daemon between its two forks is briefly hard to see: look twice
                if not _instance_processes(pipe) and not control.exists():
                    raise MPSError(f"the MPS control daemon ({binary}) exited right after starting", _log_tail(log))
            time.sleep(0.02)
        tail = _log_tail(log)
        raise Timeout(f"the MPS control daemon did not open {control} within {self.timeout:g} s"
                      + (f"; its log:\n{tail}" if tail else ""))

    def _abandon(self, directory: Path) -> None:
        """Undo a start that failed half-way: the watchdog goes, then the instance."""
        self._release_watchdog(min(self.timeout, 5.0) + 6.0)
        _shutdown(directory, timeout=min(self.timeout, 5.0))
        self.owned = False
        self.directory = self.pipe_directory = self.log_directory = None

    def _release_watchdog(self, wait: float) -> None:
        """Tell the watchdog to shut the instance down, and wait (at most ``wait`` s) for it to
        finish and exit."""
        if self._guard is not None:
            with contextlib.suppress(OSError):
                os.write(self._write_end, b"stop")
            self._guard()  # closes the write end
            self._guard = None
        elif self._watchdog is not None:
            with contextlib.suppress(OSError):
                self._watchdog.send_signal(signal.SIGTERM)
        if self._watchdog is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._watchdog.wait(timeout=wait)  # also reaps it: it is this process's child
            self._watchdog = None

    def stop(self, timeout: float | None = None) -> dict[str, Any]:
        """Stop an owned daemon: ``quit``, a bounded wait for the daemon and its server, the
        directories removed; the environment :meth:`apply` changed is restored. An adopted daemon
        is left running. Idempotent. Returns what was done (plain data)."""
        with self._lock:
            self._restore_environment()
            _applied.discard(self)
            if self._stopped or self.pipe_directory is None:
                self._stopped = True
                return {"stopped": False}
            self._stopped = True
            if os.getpid() != self._pid:
                # A forked child leaving its copy's ``with`` block: the daemon is its parent's. The
                # child's copy of the watchdog pipe closes as it exits; the parent stops the daemon.
                return {"stopped": False, "forked": True}
            if not self.owned:
                return {"stopped": False, "adopted": self.pipe_directory}
            directory = self.directory
            assert directory is not None
            report = _stop_instance(directory, timeout or self.timeout, release=self._release_watchdog)
            self.owned = False
            return report

    close = stop

    @property
    def closed(self) -> bool:
        return self._stopped

    @property
    def running(self) -> bool:
        """Whether the daemon this object stands for runs now: its pid file names a live process,
        or a control daemon of its pipe directory shows in /proc (the same test :meth:`start`
        waits for: a daemon that has just opened its socket may not have written its pid file)."""
        return self.pipe_directory is not None and _control_daemon(self.pipe_directory) is not None

    def __enter__(self) -> MPSDaemon:
        if self.pipe_directory is None:
            self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- what the pipeline's processes need

    def env(self) -> dict[str, str]:
        """The variables a process needs to be a client of this daemon (set them before it starts
        CUDA): CUDA_MPS_PIPE_DIRECTORY, and CUDA_MPS_LOG_DIRECTORY when known."""
        if self._stopped:
            raise ClosedError("the MPS daemon is stopped: its pipe directory is gone")
        if self.pipe_directory is None:
            raise UsageError("the MPS daemon is not started")
        if self.owned and self.directory is not None and not self.directory.exists():
            raise ClosedError(f"the MPS daemon was stopped elsewhere (python -m eglcuda mps stop?): its directory "
                              f"{self.directory} is gone")
        variables = {PIPE_VARIABLE: self.pipe_directory}
        if self.log_directory:
            variables[LOG_VARIABLE] = self.log_directory
        return variables

    def apply(self, children_only: bool = False) -> dict[str, str]:
        """Put :meth:`env` into ``os.environ``: processes started from now on are clients, and so
        is this one if CUDA is not initialized in it yet. Raises :class:`UsageError` when eglcuda
        already initialized CUDA here (this process would silently stay outside MPS), unless
        ``children_only``. Undone by :meth:`stop`. Once applied, the daemon runs until
        :meth:`stop` or this process's exit, also when the object is dropped (a daemon never
        applied stops with its object). (CUDA started by another library, CuPy or PyTorch, is not
        seen here: apply before using them.)"""
        variables = self.env()
        children_only = check_flag(children_only, "children_only")
        if not children_only and _cuda.initialized():
            raise UsageError("CUDA is already initialized in this process, so it stays outside MPS: apply() the "
                             "MPS environment before the first CUDA call, or pass children_only=True to set it "
                             "for the processes started from here only")
        if self._saved_environment is None:
            self._saved_environment = {key: os.environ.get(key) for key in (PIPE_VARIABLE, LOG_VARIABLE)}
        # The environment now names the daemon: it lives until stop() or this process's exit, not
        # until this object is dropped (``env = mps.start().apply()`` keeps no reference).
        _applied.add(self)
        os.environ.update(variables)
        if LOG_VARIABLE not in variables:
            os.environ.pop(LOG_VARIABLE, None)
        return variables

    def _restore_environment(self) -> None:
        if self._saved_environment is None:
            return
        for key, value in self._saved_environment.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_environment = None

    def exports(self) -> str:
        """The shell lines that make a shell's programs clients (``export VAR=...``)."""
        return "\n".join(f"export {key}={shlex.quote(value)}" for key, value in self.env().items())

    def status(self) -> dict[str, Any]:
        """This daemon now (plain data)."""
        if self.directory is not None and self.owned:
            return {**instance_status(self.directory), "owned": True}
        return {"pipe_directory": self.pipe_directory, "log_directory": self.log_directory, "owned": False,
                "running": self.running, "adopted": None if self.adopted is None else asdict(self.adopted)}

    def describe(self) -> str:
        if self.pipe_directory is None:
            return "MPS daemon (not started)"
        if not self.owned:
            return f"MPS daemon already running, used as is (pipe dir {self.pipe_directory})"
        return f"private MPS daemon (pipe dir {self.pipe_directory}, log dir {self.log_directory})"

    def __repr__(self) -> str:
        return f"<{self.describe()}>"


_applied: set[MPSDaemon] = set()  # daemons whose environment is in os.environ: kept until stop() or exit


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


def _stop_instance(directory: Path, timeout: float, release: Callable[[float], object] | None = None) -> dict[str, Any]:
    """Stop one instance through its watchdog (which does :func:`_shutdown` and exits), or
    directly when the watchdog is gone. Waits at most about ``timeout`` + 6 s (the watchdog's
    own escalation to signals takes up to 5 s after ``timeout``)."""
    state = _read_state(directory)
    patience = timeout + 6.0
    if release is not None:
        release(patience)
    elif _watchdog_alive(state):
        with contextlib.suppress(OSError):
            os.kill(state["watchdog_pid"], signal.SIGTERM)
        deadline = time.monotonic() + patience
        while directory.exists() and _watchdog_alive(state) and time.monotonic() < deadline:
            time.sleep(0.02)
    if directory.exists():
        report = _shutdown(directory, timeout=timeout)
    else:
        report = {"directory": str(directory), "left": _instance_processes(directory / "pipe"), "removed": True}
    report["stopped"] = True
    if report.get("left") or not report.get("removed"):
        raise MPSError(f"the MPS daemon of {directory} did not go away (pids {report.get('left')}); "
                       "its directory is " + ("gone" if report.get("removed") else "still there"))
    return report


# ---- module-level API ----------------------------------------------------------------------------

def start(**options: Any) -> MPSDaemon:
    """Start a private daemon (see :class:`MPSDaemon` for the options); the caller stops it."""
    return MPSDaemon(**options).start()


def stop(directory: str | os.PathLike[str] | None = None, *, all: bool = False,  # noqa: A002 - the CLI's word
         timeout: float = 10.0) -> list[dict[str, Any]]:
    """Stop this user's eglcuda MPS instances: the one of ``directory`` (an instance or its pipe
    directory), or the one this process's CUDA_MPS_PIPE_DIRECTORY names, or the only one running,
    or with ``all`` every one. Raises :class:`UsageError` when it is not clear which, or when
    ``timeout`` is not a positive number of seconds."""
    timeout = positive_seconds(timeout, "timeout")
    all = check_flag(all, "all")  # noqa: A001 - the CLI's word
    if directory is not None and not os.fspath(directory):
        # (an empty path, as a shell's unset "$DIR" gives: it names no instance, so none is stopped
        # in its place)
        raise UsageError("the MPS directory to stop is an empty path: name an instance, or leave it out")
    reaped = [{"directory": path, "stopped": True, "stale": True} for path in reap_stale()]
    found = instances()
    if all:
        chosen = found
    else:
        wanted = directory or os.environ.get(PIPE_VARIABLE)
        chosen = []
        if wanted:
            path = Path(wanted).resolve()
            chosen = [d for d in found if path in (d.resolve(), (d / "pipe").resolve())]
            if not chosen and directory:
                raise UsageError(f"{directory} is not one of this user's eglcuda MPS instances "
                                 f"({', '.join(map(str, found)) or 'none running'})")
        if not chosen:
            if len(found) > 1:
                raise UsageError("several eglcuda MPS daemons run: name one (--dir) or stop them all (--all): "
                                 + ", ".join(map(str, found)))
            chosen = found
    return reaped + [_stop_instance(d, timeout) for d in chosen]


def status() -> dict[str, Any]:
    """This user's eglcuda MPS instances, the other daemons on this machine, and the binaries."""
    control = find_binary(CONTROL)
    return {
        "binary": control,
        "server_binary": find_binary(SERVER),
        "base_directory": str(base_directory(create=False)),
        "environment": {key: os.environ.get(key) for key in (PIPE_VARIABLE, LOG_VARIABLE)},
        "instances": [instance_status(d) for d in instances()],
        "daemons": [asdict(d) | {"system": d.system} for d in running_daemons()],
    }


@contextlib.contextmanager
def session(enabled: bool = True, *, children_only: bool = False, quiet: bool = False,
            **options: Any) -> Iterator[MPSDaemon | None]:
    """What a sample's or benchmark's ``--mps`` does: a daemon (a running one is used as is), its
    environment applied for this process and the ones it starts, everything undone at the end.
    Yields None when not ``enabled``."""
    enabled, quiet = check_flag(enabled, "enabled"), check_flag(quiet, "quiet")
    if not enabled:
        yield None
        return
    with MPSDaemon(reuse=True, **options) as daemon:
        daemon.apply(children_only=children_only)
        if not quiet:
            print(f"MPS: {daemon.describe()}", file=sys.stderr, flush=True)
        yield daemon


# ---- the watchdog --------------------------------------------------------------------------------

def _watch(directory: Path, fd: int | None, pid: int | None, timeout: float) -> int:
    """Wait for the owner to go (EOF on ``fd``, ``pid`` exiting, SIGTERM/SIGINT/SIGHUP, or the
    instance directory removed by a stop that could not name this watchdog), then
    shut the instance down."""
    stop_now = threading.Event()

    def on_signal(signum: int, frame: object) -> None:  # noqa: ARG001
        stop_now.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    waits = []
    if fd is not None:
        waits.append(fd)
    pidfd = None
    start = None
    if pid is not None:
        start = _process_start(pid)
        with contextlib.suppress(AttributeError, OSError):
            pidfd = os.pidfd_open(pid)  # readable once the process exits (Linux 5.3+)
            waits.append(pidfd)
    why = "signal"
    while not stop_now.is_set():
        try:
            ready, _, _ = select.select(waits, [], [], 0.25)
        except InterruptedError:
            continue
        if fd is not None and fd in ready:
            data = os.read(fd, 64)
            why = "owner exited" if not data else "stop requested"
            break
        if pidfd is not None and pidfd in ready:
            why = f"process {pid} exited"
            break
        if pid is not None and pidfd is None and not _alive(pid, start):
            why = f"process {pid} exited"
            break
        if not directory.exists():  # (stopped without this watchdog: its state file could not name it)
            why = "its directory was removed"
            break
    print(f"[{time.strftime('%H:%M:%S')}] eglcuda MPS watchdog: {why}; stopping {directory}", flush=True)
    report = _shutdown(directory, timeout=timeout)
    print(json.dumps(report), flush=True)
    return 0 if not report.get("left") else 1


def _main(argv: list[str] | None = None) -> int:
    """``_watch ...``: the watchdog's entry (the public commands are ``python -m eglcuda mps
    start|stop|status``)."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] != ["_watch"]:
        print("usage: python -m eglcuda mps start|stop|status (this module's own entry is the watchdog)",
              file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="eglcuda.mps _watch")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--fd", type=int)
    parser.add_argument("--pid", type=int)
    parser.add_argument("--timeout", type=float, default=10.0)
    args = parser.parse_args(arguments[1:])
    return _watch(Path(args.dir), args.fd, args.pid, args.timeout)


if __name__ == "__main__":
    sys.exit(_main())
