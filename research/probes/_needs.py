"""The probes' first checks: what a probe needs, said in one line before it is used.

Every probe that can run on a machine without its needs calls these at the top of its main path.
Each check returns when the need is met; otherwise it prints ONE line to stderr,
``PROGRAM: needs WHAT: what is missing (how to get it)``, and exits with status 2 (no
traceback). ``program`` is the probe's ``__file__`` (or its name).

Help: a probe without argparse calls :func:`answer_help` with its ``__doc__`` first, so that
``--help`` / ``-h`` prints the module docstring and exits 0 on any machine. A probe with argparse
that imports what it needs at module level guards those imports with :func:`help_asked`.

Not a probe: nothing here measures anything (``research/README.md``).
"""
from __future__ import annotations

import importlib
import os
import shutil
import sys
from typing import Iterable, Mapping, NoReturn, Sequence

UCXX_HOW = "pip install -e '.[remote-cu13]' or '.[remote-cu12]'"
CUPY_HOW = "pip install cupy-cuda12x or cupy-cuda13x"
CUDA_PYTHON_HOW = "pip install cuda-python"


def name_of(program: str) -> str:
    """The probe's file name (``stream_probe.py``) from its ``__file__`` or name."""
    return os.path.basename(program) or program


def unmet(program: str, line: str) -> NoReturn:
    """Print ``PROGRAM: LINE`` to stderr as one line and exit with status 2."""
    print(f"{name_of(program)}: {' '.join(line.split())}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def help_asked(argv: Sequence[str] | None = None) -> bool:
    """Whether the command line (``sys.argv`` by default) asks for help (``-h`` or ``--help``)."""
    return any(arg in ("-h", "--help") for arg in (sys.argv if argv is None else argv)[1:])


def answer_help(doc: str | None) -> None:
    """With ``-h`` / ``--help`` on the command line, print ``doc`` (the module docstring) and exit 0."""
    if help_asked():
        print((doc or "").strip())
        raise SystemExit(0)


def needs_args(program: str, count: int, usage: str) -> None:
    """At least ``count`` positional arguments, else the usage line (``usage``: the arguments)."""
    if len(sys.argv) - 1 < count:
        unmet(program, f"needs {count} argument{'s' * (count != 1)}: usage: python {program_path(program)} {usage}")


def program_path(program: str) -> str:
    """``research/probes/NAME``: how the docstrings call a probe."""
    return f"research/probes/{name_of(program)}"


def needs_module(program: str, name: str | tuple[str, ...], how_to_get: str) -> None:
    """The module ``name`` (or the first of several alternatives that imports) imports here."""
    names = (name,) if isinstance(name, str) else name
    why = ""
    for each in names:
        try:
            importlib.import_module(each)
            return
        except Exception as exc:  # noqa: BLE001 -- ImportError, or a module that fails as it loads
            why = why or " ".join(str(exc).split()) or type(exc).__name__
    unmet(program, f"needs the Python module {' or '.join(names)}: {why} ({how_to_get})")


def needs_command(program: str, command: str, how_to_get: str) -> None:
    """The executable ``command`` (e.g. ``gcc``) is on ``PATH``."""
    if shutil.which(command) is None:
        unmet(program, f"needs {command}: not on PATH ({how_to_get})")


def needs_cuda(program: str, *capabilities: str, start: bool = True, hint: str = "") -> None:
    """eglcuda's capabilities (:func:`eglcuda.available`), ``"cuda"`` when none is named: the CUDA
    driver loads and sees a device. ``start=False`` only loads libcuda.so.1 (no ``cuInit``: for a
    parent that must not start CUDA before its children, e.g. under MPS). ``hint``: added to the
    line when unmet (e.g. where a stand-in libcuda comes from)."""
    try:
        from eglcuda import availability
        from eglcuda._bind import loader
    except ImportError as exc:
        unmet(program, f"needs the eglcuda package built: {exc} (pip install -e . in the checkout)")
    extra = f"; {hint}" if hint else ""
    if not start:
        ok, _ = loader.cuda_available()
        if not ok:
            unmet(program, f"needs {availability.NEEDS['cuda']}: no {loader.CUDA_LIBRARY} on this machine "
                           f"({availability.NVIDIA_DRIVER}){extra}")
        return
    why = availability.explain(*(capabilities or ("cuda",)))
    if why:
        unmet(program, why + extra)


def needs_cpus(program: str, count: int, cpus: Iterable[int] = ()) -> None:
    """At least ``count`` CPUs this process may run on, among them each of ``cpus`` (to pin to)."""
    allowed = os.sched_getaffinity(0)
    absent = sorted(set(cpus) - allowed)
    if len(allowed) < count or absent:
        wanted = f"CPU {', '.join(map(str, absent))}" if absent else f"{count} CPUs"
        how = "name one of those, or run it on a machine with more" if absent else "run it on a machine with more"
        unmet(program, f"needs {wanted} to run on: this process may use CPUs {sorted(allowed)} ({how})")


def frozen(program: str, commit: str) -> NoReturn:
    """A frozen record: say at which commit to rerun it, exit 2."""
    unmet(program, f"a frozen record: it relies on internals that are gone; rerun it at commit {commit} "
                   f"(research/README.md)")


def every_row_failed(rows: Iterable[Mapping[str, object]], key: str = "error") -> bool:
    """Whether there were rows and each of them holds ``key`` (a probe that measured nothing)."""
    seen = [key in row for row in rows]
    return bool(seen) and all(seen)
