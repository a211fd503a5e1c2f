"""Command line: ``python -m eglcuda COMMAND`` (or the ``eglcuda`` script).

  info [--json]            what this machine's EGL and CUDA offer, and which interop paths work here
  check                    run the interop conformance checks that apply to this machine
  mps start|stop|status    a private CUDA MPS daemon for a pipeline's processes
  topics [--json]          the live frame topics of this user (stale sockets of dead publishers removed)
  relay NAME --listen H:P  serve topic NAME to remote subscribers over UCX (docs/remote.md)
  keygen PATH              make a relay's pre-shared key: 32 random bytes in a new file, mode 0600
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import shlex
import sys
from typing import Any, Callable, NoReturn

from . import conformance, mps
from ._version import __version__
from .errors import EglCudaError, Unsupported, UsageError
from .info import collect, format_report
from .topics.registry import format_listing, list_topics


DESCRIPTION = ("eglcuda: zero-copy frame streaming between CUDA, OpenGL and other processes through EGL.\n"
               "These commands tell what this machine can do, and manage the helpers a pipeline uses.")
EPILOG = ("'python -m eglcuda COMMAND --help' describes a command. Start with 'info', then 'check'.\n"
          "The commands, samples and benchmarks: docs/cli.md.")


class _Parser(argparse.ArgumentParser):
    """A parser that says a bad option in one line, ``python -m eglcuda COMMAND: reason``, exit
    status 2, as every other reason a command stops (not argparse's usage block). An option is
    spelled whole: argparse would take a prefix for the option it begins (``--key HEX`` for
    ``--key-file HEX``, ``--every`` for ``--every-timeout``); its commands' parsers are this too."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} ('{self.prog} --help' lists the options)\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(
        prog="python -m eglcuda", description=DESCRIPTION, epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    _add_version(parser)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    info = commands.add_parser(
        "info", help="report EGL, CUDA and the interop paths available here",
        description="What this machine's EGL, GL and CUDA offer, and which of eglcuda's interop paths work "
                    "here: a one-line summary with the root cause of what does not, then the EGL devices "
                    "and displays, the CUDA driver and devices, MPS, and a table of paths with 'available' "
                    "or 'unsupported (why)'. Never fails: a missing library is part of the report.")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    info.set_defaults(run=_info)
    _add_check(commands)
    _add_mps(commands)
    _add_topics(commands)
    _add_relay(commands)
    _add_keygen(commands)
    args, extra = parser.parse_known_args(argv)
    if extra:  # (said by the parser of the command, or of its action: `mps start`)
        said_by = commands.choices.get(args.command, parser)
        for action in said_by._actions:
            if isinstance(action, argparse._SubParsersAction) and getattr(args, action.dest or "", None) in action.choices:
                said_by = action.choices[getattr(args, action.dest)]
        said_by.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:  # bare `python -m eglcuda`: say what there is
        parser.print_help()
        return 0
    run: Callable[[argparse.Namespace], int] = args.run
    return _pipe_safe(run, args)


def _info(args: argparse.Namespace) -> int:
    report = collect()
    if args.json:
        _print_json(report)
    else:
        print(format_report(report))
    return 0


def _fail(command: str, error: EglCudaError | str) -> int:
    """Say why ``python -m eglcuda COMMAND`` stops, in one voice: the command, then the reason
    (never an exception's class name). Exit status 2 for bad input or a missing requirement, 1
    for what failed while running."""
    print(f"python -m eglcuda {command}: {error}", file=sys.stderr)
    return 2 if isinstance(error, (str, UsageError, Unsupported)) else 1


def _print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2)
    sys.stdout.write("\n")


def _add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action="version", version=f"eglcuda {__version__}")


def _add_check(commands: "argparse._SubParsersAction[_Parser]") -> None:

    check = commands.add_parser(
        "check", help="run the interop conformance checks that apply to this machine (data verified)",
        description="Run eglcuda's interop conformance checks against the installed package: each moves "
                    "random data through one path and compares every byte. Prints pass / fail / not "
                    "applicable (why), writes the results as JSON, exits 1 on a failure.")
    conformance.add_arguments(check)
    check.set_defaults(run=conformance.run_command)


def _pipe_safe(run: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run a command whose output may go to a pipe that closes early (``| head``): stop quietly
    instead of ending in a BrokenPipeError traceback. Output that cannot be written at all (a
    full disk, a closed standard output) is one line on standard error and status 1."""
    if sys.stdout is None:
        print(f"python -m eglcuda {args.command}: standard output is closed: nothing can be written", file=sys.stderr)
        return 1
    try:
        code = run(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        _silence_stdout()
        return 1
    except OSError as exc:
        if not _stdout_failed(exc):
            raise
        _silence_stdout()
        print(f"python -m eglcuda {args.command}: writing its output failed: {exc.strerror or exc}", file=sys.stderr)
        return 1


def _stdout_failed(exc: OSError) -> bool:
    """Whether ``exc`` came from writing standard output (the traceback's last frame wrote it)."""
    try:
        sys.stdout.flush()
    except OSError:
        return True
    return exc.errno in (errno.ENOSPC, errno.EIO, errno.EBADF) and exc.filename is None


def _silence_stdout() -> None:
    """Python flushes stdout again at exit: point it at /dev/null so that flush cannot fail."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _add_mps(commands: "argparse._SubParsersAction[_Parser]") -> None:
    parser = commands.add_parser(
        "mps", help="a private CUDA MPS daemon for a pipeline's processes",
        description="A private CUDA MPS control daemon (pipe and log directories of its own, mode 0700). "
                    "It never changes the GPU's compute mode or any device setting.")
    actions = parser.add_subparsers(dest="action", required=True)
    start = actions.add_parser(
        "start", help="start a daemon and print the shell lines that make programs its clients",
        description="Start a private MPS control daemon. Prints 'export' lines on stdout (messages go to "
                    "stderr), so that eval \"$(python -m eglcuda mps start)\" makes this shell's programs "
                    "its clients. It runs until 'python -m eglcuda mps stop', or until --owner exits.")
    start.add_argument("--print-env", action="store_true",
                       help="print plain VAR=value lines instead (for env files and 'env $(...) program')")
    start.add_argument("--owner", type=int, metavar="PID",
                       help="stop the daemon when this process exits (e.g. --owner $$ for this shell)")
    start.add_argument("--reuse", action="store_true",
                       help="when a daemon already serves this machine, print its environment instead of refusing")
    start.add_argument("--timeout", type=float, default=10.0, help="seconds to wait for the daemon (default 10)")
    stop = actions.add_parser(
        "stop", help="stop this user's eglcuda MPS daemon and remove its directories",
        description="Stop an eglcuda MPS daemon: the one CUDA_MPS_PIPE_DIRECTORY names, or the only one, or "
                    "--dir, or --all. Prints 'unset' lines on stdout for eval.")
    stop.add_argument("--dir", help="the instance (or its pipe directory) to stop")
    stop.add_argument("--all", action="store_true", help="stop every eglcuda MPS daemon of this user")
    stop.add_argument("--timeout", type=float, default=10.0,
                      help="seconds for the daemon to quit before it is signalled (default 10)")
    status = actions.add_parser(
        "status", help="this user's eglcuda MPS daemons and the others running here",
        description="Where nvidia-cuda-mps-control is, which MPS pipe directory this shell's programs would "
                    "use, this user's eglcuda MPS daemons (running or not, their control and server pids, "
                    "what stops them) and the other MPS daemons running on this machine.")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(run=_mps_command)


def _add_topics(commands: "argparse._SubParsersAction[_Parser]") -> None:
    topics = commands.add_parser(
        "topics", help="list live frame topics; remove the sockets of dead publishers",
        description="The live frame topics (eglcuda.Publisher) of this user: each publisher's pid, frame "
                    "size and format, rate and subscribers with their transport. Sockets left by publishers "
                    "that died are removed (or only reported, with --no-clean).")
    topics.add_argument("--json", action="store_true", help="machine-readable output")
    topics.add_argument("--dir", default=None, help="the topic directory (default: this user's)")
    topics.add_argument("--no-clean", action="store_true", help="report stale sockets without removing them")
    topics.add_argument("--timeout", type=float, default=1.0, help="seconds to wait for each publisher's answer")
    topics.set_defaults(run=_topics)


def _add_relay(commands: "argparse._SubParsersAction[_Parser]") -> None:
    relay = commands.add_parser(
        "relay", help="serve a topic to remote subscribers over UCX (needs ucxx)",
        description="Subscribe to topic NAME here and serve it to remote subscribers "
                    "(eglcuda.Subscriber(NAME, remote='HOST:PORT')) over UCX, until SIGINT or SIGTERM. Prints "
                    "'relay NAME listening on HOST:PORT' once serving. The pre-shared key comes from --key-file "
                    "or the environment (EGLCUDA_REMOTE_KEY_FILE, EGLCUDA_REMOTE_KEY), never the command line "
                    "(docs/security.md). Every message is authenticated; --frames integrity or encrypted protects "
                    "the frames' bytes too, at a cost (docs/security.md).")
    relay.add_argument("name", help="the topic")
    relay.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT to listen on (port 0: any free one)")
    relay.add_argument("--key-file", default=None, help="a file holding the key (only its owner may read it)")
    relay.add_argument("--key", nargs="?", action=_KeyRefused, help=argparse.SUPPRESS)
    relay.add_argument("--qos", choices=["latest", "every"], default="latest",
                       help="the relay's own subscription (latest: never slows the publisher)")
    relay.add_argument("--queue", type=int, default=4, help="the relay's queue (every)")
    relay.add_argument("--device", type=int, default=0, help="the CUDA device the relay reads frames on")
    relay.add_argument("--timeout", type=float, default=5.0,
                       help="seconds to wait for the publisher, and for a silent remote subscriber")
    relay.add_argument("--every-timeout", type=float, default=1.0,
                       help="seconds an 'every' remote subscriber may keep the relay waiting before it is dropped")
    relay.add_argument("--max-remotes", type=int, default=16, help="remote subscribers served at once")
    relay.add_argument("--path", default=None, help="an explicit topic socket path")
    relay.add_argument("--frames", choices=["plain", "integrity", "encrypted"], default="plain",
                       help="the frames' bytes: plain (headers authenticated), integrity (a MAC over each frame), "
                            "encrypted (AES-256-GCM)")
    relay.set_defaults(run=_relay)


class _KeyRefused(argparse.Action):
    """``--key``: refused in one line that never repeats the key (a command line is every user's
    to read: ``ps``, ``/proc/PID/cmdline``), naming where a key goes instead."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        from .remote import keys

        parser.exit(2, f"{parser.prog}: --key: a key never goes on the command line (every user of this host can "
                       f"read it there); pass --key-file FILE, or set {keys.KEY_FILE_VARIABLE} (such a file) or "
                       f"{keys.KEY_VARIABLE} (hex)\n")


def _add_keygen(commands: "argparse._SubParsersAction[_Parser]") -> None:
    keygen = commands.add_parser(
        "keygen", help="make a pre-shared key for a relay and its remote subscribers",
        description="Write 32 random bytes to PATH, a new file that only you may read (mode 0600). Refuses a PATH "
                    "that exists (it never overwrites a key) and a folder that others may write to. Copy the file "
                    "to each subscriber host over a channel you trust (scp), and name it with --key-file or "
                    "EGLCUDA_REMOTE_KEY_FILE (docs/security.md).")
    keygen.add_argument("path", help="the new key file")
    keygen.set_defaults(run=_keygen)


def _keygen(args: argparse.Namespace) -> int:
    """``keygen``: exit 2 with one line when the file cannot be made."""
    from .remote import keys

    try:
        keys.write_new_key(args.path)
    except UsageError as exc:
        print(f"python -m eglcuda keygen: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # (writing the key failed: nothing is left of the file)
        print(f"python -m eglcuda keygen: writing {exc.filename or args.path} failed: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    print(f"wrote a {keys.NEW_KEY}-byte key to {args.path} (mode 600)")
    return 0


def _relay(args: argparse.Namespace) -> int:
    """``relay``: exit 2 with one line when ucxx or the key is missing, 1 when it cannot serve."""
    from .remote import Relay, keys, ucxx_missing

    missing = ucxx_missing()
    if missing is not None:
        return _fail("relay", missing)
    if not (args.key_file or os.environ.get(keys.KEY_FILE_VARIABLE) or os.environ.get(keys.KEY_VARIABLE)):
        return _fail("relay", f"a relay needs a pre-shared key: pass --key-file FILE (a file only its owner can "
                              f"read), or set {keys.KEY_FILE_VARIABLE} (such a file) or {keys.KEY_VARIABLE} (hex); "
                              f"at least {keys.MIN_KEY} bytes (docs/security.md)")
    try:
        key = keys.read_key_file(args.key_file) if args.key_file else keys.load_key(None)
        server = Relay(args.name, args.listen, key=key, qos=args.qos, queue=args.queue, device=args.device,
                       timeout=args.timeout, path=args.path, every_timeout=args.every_timeout,
                       max_remotes=args.max_remotes, frames=args.frames)
    except EglCudaError as exc:
        return _fail("relay", exc)
    except KeyboardInterrupt:  # (Ctrl-C while it waited for the publisher: nothing to close yet)
        print(f"python -m eglcuda relay: interrupted while waiting for the publisher of {args.name!r}",
              file=sys.stderr)
        return 130
    host, port = server.address
    # (said once SIGINT and SIGTERM close the relay cleanly: a supervisor may signal it at once)
    server.serve_forever(ready=lambda: print(f"relay {args.name} listening on {host}:{port}", flush=True))
    return 0


def _mps_command(args: argparse.Namespace) -> int:
    try:
        return _mps(args)
    except EglCudaError as exc:
        return _fail(f"mps {args.action}", exc)


def _mps(args: argparse.Namespace) -> int:
    if args.action == "start":
        daemon = mps.MPSDaemon(timeout=args.timeout, reuse=args.reuse, detach=True, owner_pid=args.owner)
        daemon.start()
        if args.print_env:
            for key, value in daemon.env().items():
                print(f"{key}={value}")
        else:
            print(daemon.exports())
        if not args.print_env and daemon.owned:
            until = f"process {args.owner} exits" if args.owner else "`python -m eglcuda mps stop`"
            print(f"eglcuda: {daemon.describe()}; it runs until {until}", file=sys.stderr)
        elif not args.print_env:
            print(f"eglcuda: {daemon.describe()}", file=sys.stderr)
        return 0
    if args.action == "stop":
        stopped = mps.stop(args.dir, all=args.all, timeout=args.timeout)
        for entry in stopped:
            how = " (left over: its watchdog was gone)" if entry.get("stale") else ""
            print(f"eglcuda: stopped the MPS daemon of {entry['directory']}{how}", file=sys.stderr)
        if not stopped:
            print("eglcuda: no eglcuda MPS daemon runs for this user", file=sys.stderr)
        mine = [str(entry["directory"]) for entry in stopped]
        pipe = os.environ.get(mps.PIPE_VARIABLE, "")
        if pipe and any(pipe.startswith(folder + os.sep) for folder in mine):
            print(f"unset {mps.PIPE_VARIABLE} {mps.LOG_VARIABLE}")
        return 0
    report = mps.status()
    if args.json:
        _print_json(report)
        return 0
    print(_format_status(report))
    return 0


def _format_status(report: dict[str, Any]) -> str:
    lines = [f"{mps.CONTROL}: {report['binary'] or 'NOT FOUND (' + mps.INSTALL_HINT + ')'}"]
    environment = report["environment"]
    lines.append(f"{mps.PIPE_VARIABLE} here: {environment[mps.PIPE_VARIABLE] or 'unset (clients use '}"
                 + ("" if environment[mps.PIPE_VARIABLE] else f"{mps.SYSTEM_PIPE_DIRECTORY})"))
    if not report["instances"]:
        lines.append(f"eglcuda MPS daemons of this user: none (in {report['base_directory']})")
    for instance in report["instances"]:
        state = "running" if instance["running"] else "NOT RUNNING"
        if instance["watch_pid"]:
            guard = f"until pid {instance['watch_pid']} exits"
        elif instance["detached"]:
            guard = "until `python -m eglcuda mps stop`"
        else:
            guard = f"until its owner pid {instance['owner_pid']} exits"
        lines.append(f"eglcuda MPS daemon {instance['directory']}: {state}, control pid {instance['control_pid']}, "
                     f"servers {instance['servers'] or 'none'}, {guard}, watchdog "
                     f"{'alive' if instance['watchdog_alive'] else 'GONE'}")
        lines.append(f"  export {mps.PIPE_VARIABLE}={shlex.quote(instance['pipe_directory'])} "
                     f"{mps.LOG_VARIABLE}={shlex.quote(instance['log_directory'])}")
    others = [d for d in report["daemons"] if not d["eglcuda"]]
    for daemon in others:
        where = daemon["pipe_directory"] or "pipe dir unreadable"
        lines.append(f"other MPS daemon: pid {daemon['pid']}, uid {daemon['uid']}, {where}"
                     + (" (system-wide default)" if daemon["system"] else ""))
    return "\n".join(lines)


def _topics(args: argparse.Namespace) -> int:
    """``topics``: the live topics with their publisher's pid, size, format, rate and subscribers
    (and the transport each uses)."""

    if args.dir is not None and not os.path.isdir(args.dir):
        # An absent default folder only means no topic was ever published; a named one is a mistake.
        return _fail("topics", f"--dir {args.dir}: no such folder (without --dir, this user's topic directory is "
                               "used)")
    try:
        listing = list_topics(directory=args.dir, clean=not args.no_clean, timeout=args.timeout)
    except UsageError as exc:
        return _fail("topics", exc)
    if args.json:
        _print_json(listing.as_dict())
    else:
        print(format_listing(listing))
    return 0
