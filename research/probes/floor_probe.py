# Research record (see research/README.md): runs against the current package (public API and bench/stream_roundtrip.py; floor_ext.c connects its own endpoints).
"""Probe: how close can any Python loop get to the C program on the serial round trip?

floor_ext.c is the thinnest binding possible: one C function per step (present; acquire with map;
release; return), no checks, no bookkeeping, on its own CUDA producer and consumer connected to
a stream eglcuda made, two frames of the C reference's shape. Its loop has the shape of eglcuda's
four-call loop. Every column runs in each round, the order reversed every other round; ratios
are medians of per-round ratios against the standalone C program on the same CPU.

    python3 research/probes/floor_probe.py [--cpus 2,5] [--rounds 7] [--frames 10000] [--json F]
        [--tree NAME=PATH ...] [WxH ...]

--tree adds a column: eglcuda's four-call loop from the source tree at PATH (built in place), in a
fresh interpreter each round, to hold two trees against each other and C in one run.
"""
import argparse, importlib.util, json, os, pathlib, statistics, subprocess, sys, sysconfig, time

import eglcuda

import _needs  # research/probes/_needs.py: a missing need is one line and status 2

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from stream_roundtrip import SIZES, build_c, run_c, eglcuda_serial, eglcuda_serial_steps  # noqa: E402


def load_ext():
    so = pathlib.Path("/tmp") / ("floor_ext" + sysconfig.get_config_var("EXT_SUFFIX"))
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-I" + sysconfig.get_paths()["include"], "-o", str(so),
                    str(ROOT / "research/probes/floor_ext.c"), "-ldl"], check=True)
    spec = importlib.util.spec_from_file_location("floor_ext", so)
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    return ext


def floor(ext, display, width, height, frames, keep_gil, check_context):
    display.cuda_device().make_current()
    with display.create_stream() as stream:
        ext.setup(os.environ.get("EGLCUDA_LIBCUDA", "libcuda.so.1"), stream.handle, width, height, int(keep_gil), int(check_context))
        try:
            present, acquire, release, return_frame = ext.present, ext.acquire, ext.release, ext.return_frame
            warmup = frames // 10 + 2
            start = 0.0
            for i in range(frames + warmup):
                if i == warmup:
                    start = time.perf_counter()
                present(i)
                acquire()
                release()
                if i:
                    return_frame()
            elapsed = time.perf_counter() - start
        finally:
            ext.teardown()
    return 1e6 * elapsed / frames


def tree_serial(path, width, height, frames):
    """eglcuda_serial from the tree at ``path``, in a fresh interpreter (on this process's CPUs)."""
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[1] + '/bench']\n"
            "import eglcuda, stream_roundtrip\n"
            "assert eglcuda.__file__.startswith(sys.argv[1]), eglcuda.__file__\n"
            "display = eglcuda.Display.for_cuda_device(0)\n"
            "print(stream_roundtrip.eglcuda_serial(display, *map(int, sys.argv[2:5])))\n"
            "display.close()\n")
    done = subprocess.run([sys.executable, "-c", code, str(pathlib.Path(path).resolve()), str(width), str(height),
                           str(frames)], capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise RuntimeError(f"tree {path}: {done.stderr.strip().splitlines()[-1:]}")
    return float(done.stdout.split()[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("sizes", nargs="*", help="WxH (default: the bench's four sizes)")
    parser.add_argument("--cpus", default=None, help="CPUs to pin to, one block of rows each")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--frames", type=int, default=10000)
    parser.add_argument("--json", help="write every round's figures here")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH",
                        help="also run the four-call loop of the tree at PATH, fresh each round")
    parser.add_argument("--lean", action="store_true",
                        help="only C, the GIL-released floor with the context check, eglcuda's four calls and the trees")
    args = parser.parse_args()
    _needs.needs_command(__file__, "gcc", "apt install gcc")
    _needs.needs_cuda(__file__, "cuda", "cuda-stream")
    if args.cpus:
        _needs.needs_cpus(__file__, 1, (int(c) for c in args.cpus.split(",")))
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes] or SIZES
    cpus = [int(c) for c in args.cpus.split(",")] if args.cpus else [min(os.sched_getaffinity(0))]
    ext, binary = load_ext(), build_c()
    display = eglcuda.Display.for_cuda_device(0)
    n = args.frames
    records = []
    for cpu in cpus:
        os.sched_setaffinity(0, {cpu})  # inherited by the C program's process
        for w, h in sizes:
            cases = {
                "C": lambda: run_c(binary, w, h, n, "serial"),
                "C, same calls": lambda: run_c(binary, w, h, n, "serial_same"),
                "floor, GIL kept, context check": lambda: floor(ext, display, w, h, n, True, True),
                "floor, GIL released": lambda: floor(ext, display, w, h, n, False, False),
                "floor, GIL released, context check": lambda: floor(ext, display, w, h, n, False, True),
                "eglcuda four calls": lambda: eglcuda_serial(display, w, h, n),
                "eglcuda steps": lambda: eglcuda_serial_steps(display, w, h, n),
            }
            if args.lean:
                cases = {k: v for k, v in cases.items()
                         if k in ("C", "floor, GIL released, context check", "eglcuda four calls")}
            for name, path in (t.split("=", 1) for t in args.tree):
                cases[f"tree {name}, fresh"] = lambda path=path: tree_serial(path, w, h, n)
            runs = {k: [] for k in cases}
            for round_ in range(args.rounds):
                order = list(cases) if round_ % 2 == 0 else list(reversed(cases))
                for k in order:
                    runs[k].append(cases[k]())
            ratios = {k: statistics.median(x / c for x, c in zip(v, runs["C"])) for k, v in runs.items()}
            extra = {k: statistics.median(x - c for x, c in zip(v, runs["floor, GIL released, context check"]))
                     for k, v in runs.items() if k.startswith(("eglcuda", "tree"))}
            print(f"{w}x{h}, CPU {cpu}, {n} frames x {args.rounds} rounds", flush=True)
            for k, v in runs.items():
                print(f"  {k:36s} {statistics.median(v):7.2f} us  x{ratios[k]:.3f} of C   "
                      + " ".join(f"{x:.2f}" for x in v), flush=True)
            for k, us in extra.items():
                print(f"  {k} over the GIL-released floor: {us:+.2f} us/frame", flush=True)
            records.append({"size": f"{w}x{h}", "cpu": cpu, "frames": n, "runs": runs, "ratios": ratios,
                            "over_floor_us": extra})
            if args.json:  # after every block: a run cut short keeps what it measured
                pathlib.Path(args.json).write_text(json.dumps(records, indent=1))
    display.close()


if __name__ == "__main__":
    main()
