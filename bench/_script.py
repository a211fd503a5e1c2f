"""What every benchmark does before it starts, and when it fails: one line, never a traceback.

- ``require(program, *capabilities, modules=..., gcc=False, in_child=False)``: the platform through
  :func:`eglcuda.available`, then the Python packages (``pip install -e '.[bench]'`` brings them
  all), then gcc for the C references. When something is missing it prints one line naming it and
  how to get it, and exits with status 2.
  With ``in_child=True`` the platform is probed in a child interpreter, so that this process never
  initializes CUDA (the MPS benchmarks: a daemon started afterwards must serve every process).
- ``run(main, program)``: runs the benchmark; an error ends it with one line and status 1, or
  status 2 for :class:`eglcuda.Unsupported` (something this machine lacks, such as
  nvidia-cuda-mps-control for ``--mps``); ``EGLCUDA_TRACEBACK=1`` shows the traceback instead.
- ``listed(parser, option, text, what, ...)``: the comma-separated values of an option, converted
  and checked as the command line is read: a bad one is argparse's usage error (status 2), before
  anything is probed or started (where it would be a ValueError with status 1, or a child that
  never starts).
- ``lazy(name)``: a module imported at first use, so that ``--help`` works and ``require`` speaks
  before a missing package would.
- ``mps_daemon()``: a private MPS daemon for a run (``--mps``), its clients the processes
  started from then on.
- ``plot_bars(...)``: the grouped bar charts of docs/benchmarks.md, with matplotlib.
- ``build_reference(name)``: bench/c/NAME.c, the C reference of a benchmark, built with gcc.

The ``bench`` extra pins CuPy for CUDA 13 (driver 580 and later). On a CUDA 12 driver,
install ``cupy-cuda12x`` instead; ``nvidia-smi`` shows the version.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import math
import os
import pathlib
import shutil
import subprocess
import sys
from types import ModuleType
from typing import Callable, Collection, Iterator, Sequence, TypeVar

T = TypeVar("T")

BENCH_HINT = "pip install -e '.[bench]' (in the eglcuda checkout)"
# (module to import, what it is for, how to get it)
CUPY = ("cupy", "CuPy for its kernels", f"{BENCH_HINT} (CUDA 13; cupy-cuda12x for a CUDA 12 driver)")
SCIPY = ("scipy.ndimage", "SciPy to check the results", BENCH_HINT)
CUDA_PYTHON = ("cuda.bindings.driver", "cuda-python for the comparisons", BENCH_HINT)
PYOPENGL = ("OpenGL.EGL", "PyOpenGL for the comparisons", BENCH_HINT)
MATPLOTLIB = ("matplotlib", "matplotlib for the plots", BENCH_HINT)
# the remote extras bring it beside ucxx: a relay and its remotes seal every message with it
CRYPTOGRAPHY = ("cryptography", "pyca/cryptography", "pip install -e '.[remote-cu12]' in a checkout (or remote-cu13)")


def fail(program: str, message: str, status: int) -> None:
    print(f"{program}: {message}", file=sys.stderr)
    raise SystemExit(status)


def listed(parser: argparse.ArgumentParser, option: str, text: str, what: str,
           kind: Callable[[str], T] = str, choices: Collection[str] = (), least: float | None = None) -> list[T]:
    """The comma-separated values of ``option`` (``text``), each converted by ``kind``; a value
    that does not convert, is not among ``choices`` (when given) or is below ``least`` ends the run
    with argparse's usage error: "``option`` takes ``what``, got ..."."""
    values: list[T] = []
    for item in text.split(","):
        try:
            value = kind(item.strip())
        except ValueError:
            parser.error(f"{option} takes {what}, got {item!r}")
        if (choices and item.strip() not in choices) or (least is not None and not value >= least) \
                or (isinstance(value, float) and not math.isfinite(value)):  # (NaN, inf: no rate, no count)
            parser.error(f"{option} takes {what}, got {item!r}")
        values.append(value)
    return values


def at_least(least: float, kind: Callable[[str], float] = int, *, above: bool = False) -> Callable[[str], float]:
    """An argparse ``type`` for a finite number of ``kind`` at least ``least`` (``above``: more
    than it): a value below it, NaN or infinity is argparse's usage error as the command line is
    read."""
    def convert(text: str) -> float:
        value = kind(text)  # (a ValueError: argparse's "invalid int value")
        if not (value > least if above else value >= least):
            raise argparse.ArgumentTypeError(f"is {'more than' if above else 'at least'} {least:g}, got {text}")
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"is a finite number, got {text}")
        return value
    convert.__name__ = getattr(kind, "__name__", "number")
    return convert


def size(text: str) -> tuple[int, int]:
    """``WIDTHxHEIGHT`` (both positive) as a pair; ValueError otherwise."""
    width, times, height = text.partition("x")
    if not times or int(width) < 1 or int(height) < 1:
        raise ValueError(text)
    return int(width), int(height)


def output_file(parser: argparse.ArgumentParser, option: str, path: str | None) -> None:
    """A file ``option`` names for results written at the end of the run, checked before the run:
    a path that is empty, a folder, in a folder that does not exist, or not writable ends the run
    with argparse's usage error at once, not after the run with its results lost. None: no file."""
    if path is None:
        return
    folder = os.path.dirname(os.path.abspath(path)) if path else ""
    if not path:
        why = "an empty path"
    elif os.path.isdir(path):
        why = "a folder: name a file in it"
    elif not os.path.isdir(folder):
        why = f"in a folder that does not exist ({folder})"
    elif not os.access(path if os.path.exists(path) else folder, os.W_OK):
        why = "not writable here"
    else:
        return
    parser.error(f"{option} {path!r} is {why}")


def output_folder(parser: argparse.ArgumentParser, option: str, path: str | None) -> None:
    """A folder ``option`` names for results written during and after the run, checked before the
    run: an empty path, a file, or a place where the folder cannot be made ends the run with
    argparse's usage error at once. None or "": no folder."""
    if not path:
        return
    existing = os.path.abspath(path)
    while not os.path.exists(existing):  # (the nearest part that exists must be a writable folder)
        existing = os.path.dirname(existing)
    if existing == os.path.abspath(path) and not os.path.isdir(existing):
        why = "a file, not a folder"
    elif not os.path.isdir(existing):
        why = f"under a file ({existing})"
    elif not os.access(existing, os.W_OK | os.X_OK):
        why = f"not writable here ({existing})"
    else:
        return
    parser.error(f"{option} {path!r} is {why}")


@contextlib.contextmanager
def mps_daemon() -> Iterator[str]:
    """A private MPS daemon for this run (eglcuda.mps.MPSDaemon: it also stops the daemon if this
    process dies), its environment set for the processes started from now on; yields its description."""
    from eglcuda import mps

    with mps.MPSDaemon() as daemon:
        daemon.apply(children_only=True)  # the processes started from now on are its clients
        yield f"eglcuda.mps.MPSDaemon ({daemon.describe()})"

def mps_binaries(program: str) -> None:
    """Exit with status 2 and one line when this machine has no MPS control daemon or server."""
    from eglcuda import mps

    for name in (mps.CONTROL, mps.SERVER):
        if mps.find_binary(name) is None:
            fail(program, f"needs {name} (CUDA MPS), found neither on PATH nor in {', '.join(mps.SEARCH_DIRECTORIES)}: "
                          f"{mps.INSTALL_HINT}", 2)


def require(program: str, *capabilities: str, modules: Sequence[tuple[str, str, str]] = (),
            gcc: bool = False, in_child: bool = False) -> None:
    """Exit with status 2 and one line unless everything the benchmark needs is here (see the
    module notes for ``in_child``)."""
    try:
        import eglcuda
    except ImportError as exc:
        fail(program, f"needs eglcuda ({exc}): pip install -e . in the eglcuda checkout", 2)
    if in_child and capabilities:
        why = _explain_in_child(program, os.path.dirname(os.path.dirname(os.path.abspath(eglcuda.__file__))),
                                capabilities)
    else:
        why = eglcuda.availability.explain(*capabilities)
    if why:
        fail(program, why, 2)
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    for module, purpose, hint in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            fail(program, f"needs {purpose}: {hint}", 2)
    if gcc and shutil.which("gcc") is None:
        fail(program, "needs gcc to build the C reference: apt-get install gcc", 2)


# A child interpreter that prints eglcuda.availability.explain(*argv) (empty: all there).
_EXPLAIN = ("import sys; sys.path.insert(0, sys.argv.pop(1)); import eglcuda; "
            "print(eglcuda.availability.explain(*sys.argv[1:]) or '', flush=True)")


def _explain_in_child(program: str, where: str, capabilities: Sequence[str]) -> str | None:
    """eglcuda.availability.explain(*capabilities) as a fresh interpreter answers it (importing
    eglcuda from ``where``, as this process does)."""
    try:
        done = subprocess.run([sys.executable, "-c", _EXPLAIN, where, *capabilities], capture_output=True,
                              text=True, timeout=120)
    except subprocess.TimeoutExpired:
        fail(program, "probing this machine in a child process took more than 120 s", 1)
    lines = done.stdout.splitlines()
    if done.returncode != 0 or not lines:
        said = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        fail(program, f"probing this machine in a child process failed (status {done.returncode})"
             + (f": {said[-1]}" if said else ""), 1)
    return lines[-1] or None


class lazy:  # noqa: N801 - used like a module
    """``cp = lazy("cupy")``: imports the module at the first attribute read."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attribute: str) -> object:
        if self._module is None:
            self._module = importlib.import_module(self._name)
        return getattr(self._module, attribute)


def build_reference(name: str, folder: pathlib.Path | None = None) -> pathlib.Path:
    """bench/c/``name``.c built with gcc into ``folder`` (bench/build/): the program's path.
    RuntimeError with gcc's first error line when it does not build."""
    here = pathlib.Path(__file__).resolve().parent
    folder = here / "build" if folder is None else folder
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / name
    done = subprocess.run(["gcc", "-O2", "-Wall", "-o", str(out), str(here / "c" / f"{name}.c"), "-ldl", "-lpthread"],
                          capture_output=True, text=True)
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines()
        raise RuntimeError(f"building bench/c/{name}.c failed: {said[0] if said else done.returncode}")
    return out


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def missing(exc: BaseException) -> str | None:
    """The line "needs X: ..." when ``exc`` is :class:`eglcuda.Unsupported` (X is not on this
    machine), else None."""
    eglcuda = sys.modules.get("eglcuda")  # an eglcuda exception means eglcuda is imported
    if eglcuda is None or not isinstance(exc, eglcuda.Unsupported):
        return None
    return f"needs {exc.missing}: {' '.join(str(exc).split())}"


def run(main: Callable[[], int], program: str) -> int:
    """``sys.exit(run(main, PROGRAM))``: the benchmark's exit status, and one line for an error."""
    try:
        code = main()
        sys.stdout.flush()  # (here: a reader gone, `| head`, is the BrokenPipeError below, not one at exit)
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # (its output's reader stopped early: quiet, as `python -m eglcuda` is)
        try:  # (Python flushes stdout again at exit: it goes to /dev/null then)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
    except Exception as exc:
        if os.environ.get("EGLCUDA_TRACEBACK") == "1":
            raise
        needs = missing(exc)
        if needs:
            print(f"{program}: {needs}", file=sys.stderr)
            return 2
        print(f"{program}: {one_line(exc)}", file=sys.stderr)
        return 1


def plot_bars(path: str, title: str, ylabel: str, groups: Sequence[str], series: dict[str, Sequence[float]],
              log: bool = False) -> None:
    """A grouped bar chart (one bar per series in each group; NaN: no bar), written to ``path``
    in the format its extension names (.svg, .png, .pdf)."""
    import math

    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    from matplotlib import pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 4.5), layout="constrained")
    count = max(1, len(series))
    width = 0.8 / count
    for index, (name, values) in enumerate(series.items()):
        positions = [g + (index - (count - 1) / 2) * width for g in range(len(groups))]
        shown = [(x, v) for x, v in zip(positions, values) if not math.isnan(v)]
        if not shown:
            continue
        bars = axes.bar([x for x, _ in shown], [v for _, v in shown], width * 0.95, label=name)
        axes.bar_label(bars, fmt="%.3g", fontsize=7, padding=1)
    axes.set_xticks(range(len(groups)), list(groups))
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    if log:
        from matplotlib.ticker import FuncFormatter, NullFormatter

        axes.set_yscale("log")
        axes.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axes.yaxis.set_minor_formatter(NullFormatter())
    axes.grid(axis="y", color="#dddddd")
    axes.set_axisbelow(True)
    axes.legend(fontsize=8, ncols=min(count, 4), loc="upper center", bbox_to_anchor=(0.5, -0.08))
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
