# Research record (see research/README.md): runs against the current package (public API; xproc_ext.c connects its own ends).
"""Probe: between two processes on one GPU (under MPS), which side and which layer make eglcuda's
hand-over slower than the C reference's?

Each pair is a consumer process and a producer process (fresh interpreters) on one EGLStream
(FIFO 4, 1920x1080 ARGB by default, a pool of 4 frames, no GPU work, no check), set up with
eglcuda (``create_stream(cross_process=True)``, ``serve_stream``, ``receive_stream``). Each end is
driven one of these ways:

- ``c``: the C reference's loop (bench/c/cross_gpu.c's), run inside the Python process
  (xproc_ext.c, the GIL released for the whole loop);
- ``thin``: a Python loop over the thinnest binding (one C call per driver step, the GIL released,
  a context check), the floor of any Python library;
- ``egl``: eglcuda's public calls (``acquire`` and ``release`` with ``frame_numbers=False``;
  ``present``, and ``return_frame(timeout_us=2 s)`` while no frame is free);
- ``eglspin`` (producer): eglcuda, but ``return_frame(0)`` in a Python loop while none is free,
  the C loop's way of waiting.

The CUDA stream each end's calls pass: by default a blocking stream the end created, as the C
reference's ends do (eglcuda's producer: ``present(frame, cuda_stream=...)``, its return always
passes the legacy default stream). A ``0`` suffix passes the legacy default stream instead
(``thin0``, ``c0``; eglcuda: ``present(frame)``, ``connect_cuda_consumer(cuda_stream=0)``);
``thinr0``/``cr0`` only for the producer's return.

Beside them, the standalone C program (``cross_gpu twoproc``). Every variant runs once a round,
the order rotated each round; frames/s are counted at the consumer from frame N/10 + 2 on.

    python3 research/probes/xproc_probe.py [--mps] [--rounds 4] [--frames 20000] [--size 1920x1080]
        [--cpus A,B] [--variants C,c/c,...] [--tree NAME=PATH] [--json F]

A variant is CONSUMER/PRODUCER, or CONSUMER/PRODUCER@NAME to import eglcuda from a --tree.

--cpus A,B: every process of every variant may run on CPUs A and B only.
"""
from __future__ import annotations

import argparse, functools, importlib.util, json, os, pathlib, statistics, subprocess, sys, sysconfig, tempfile
import time

import _needs  # research/probes/_needs.py: a missing need is one line and status 2

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXT = pathlib.Path("/tmp") / ("xproc_ext" + sysconfig.get_config_var("EXT_SUFFIX"))
C_BINARY = pathlib.Path("/tmp/xproc_cross_gpu")
FIFO = 4
POOL = 4  # xproc_ext.c's and cross_gpu.c's
VARIANTS = ["C", "thin/thin", "thin/thin0", "thin/thinr0", "thin0/thin", "thin0/thin0", "egl/egl", "egl/egl0",
            "egl0/egl0"]


def build() -> None:
    include = sysconfig.get_paths()["include"]
    subprocess.run(["gcc", "-O2", "-Wall", "-shared", "-fPIC", "-I" + include, "-o", str(EXT),
                    str(ROOT / "research/probes/xproc_ext.c"), "-ldl"], check=True)
    subprocess.run(["gcc", "-O2", "-Wall", "-o", str(C_BINARY), str(ROOT / "bench/c/cross_gpu.c"), "-ldl",
                    "-lpthread"], check=True)


def load_ext():
    spec = importlib.util.spec_from_file_location("xproc_ext", EXT)
    ext = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ext)
    return ext


LIBCUDA = os.environ.get("EGLCUDA_LIBCUDA", "libcuda.so.1")


# ---- the two ends (run in the child processes) ------------------------------------------------------

def use_tree() -> None:
    """Import eglcuda from the tree XPROC_TREE names (built in place), if any."""
    tree = os.environ.get("XPROC_TREE")
    if tree:
        sys.path.insert(0, tree)
        import eglcuda
        assert eglcuda.__file__.startswith(tree), eglcuda.__file__


def consumer(kind: str, path: str, width: int, height: int, frames: int) -> dict:
    use_tree()
    import eglcuda
    from eglcuda import mps
    warmup = frames // 10 + 2
    total = frames + warmup
    display = eglcuda.Display.for_cuda_device(0)
    display.cuda_device().make_current()
    stream = display.create_stream(fifo_length=FIFO, cross_process=True)
    ext = None
    if kind == "egl":
        end = stream.connect_cuda_consumer(frame_numbers=False)
    elif kind == "egl0":
        end = stream.connect_cuda_consumer(frame_numbers=False, cuda_stream=0)
    else:
        ext = load_ext()
        ext.consumer_connect(LIBCUDA, stream.handle, int(kind.endswith("0")))
        kind = kind.rstrip("0")
    eglcuda.serve_stream(stream, path, timeout=60)
    if ext is not None:
        # An acquire while the producer is still connecting tears the stream down (eglcuda's
        # acquire waits for it; the bare binding must too).
        deadline = time.monotonic() + 60
        while stream.state is eglcuda.StreamState.CONNECTING and time.monotonic() < deadline:
            time.sleep(0.001)
    if kind == "c":
        elapsed = ext.consumer_loop(total, warmup)
    elif kind == "thin":
        acquire, release, clock = ext.acquire, ext.release, time.perf_counter
        start = 0.0
        for k in range(total):
            if k == warmup:
                start = clock()
            acquire()
            release()
        elapsed = clock() - start
    else:
        acquire, clock = end.acquire, time.perf_counter
        start = 0.0
        for k in range(total):
            if k == warmup:
                start = clock()
            acquire(2_000_000).release()
        elapsed = clock() - start
    result = {"fps": frames / elapsed, "mps": mps.under_mps(0)[0]}
    print(json.dumps(result), flush=True)
    sys.stdin.readline()  # the producer has gone
    if ext is not None:
        ext.disconnect()
    stream.close()
    display.close()
    return result


def producer(kind: str, path: str, width: int, height: int, frames: int) -> None:
    use_tree()
    import eglcuda
    total = frames + frames // 10 + 2
    display = eglcuda.Display.for_cuda_device(0)
    display.cuda_device().make_current()
    stream = eglcuda.receive_stream(display, path, timeout=60)
    stats = {}
    if kind.startswith("egl"):
        end = stream.connect_cuda_producer(width, height)
        free = [end.allocate_frame() for _ in range(POOL)]
        return_frame, clock = end.return_frame, time.perf_counter_ns
        if kind.endswith("0"):
            present = end.present  # the legacy default stream
        else:
            from eglcuda._bind import cuda as _cuda
            created = _cuda.stream_create()  # blocking, as the C reference's
            present = functools.partial(end.present, cuda_stream=created)
        wait_us = 0 if "spin" in kind else 2_000_000
        calls = nones = waited = 0
        for _ in range(total):
            if not free:
                t0 = clock()
                while not free:
                    back = return_frame(wait_us)
                    calls += 1
                    if back is not None:
                        free.append(back)
                    else:
                        nones += 1
                waited += clock() - t0
            present(free.pop())
        stats = {"waits": calls - nones, "return_calls": calls, "us_per_wait": waited / 1e3 / max(1, calls - nones)}
    else:
        ext = load_ext()
        null = {"": (0, 0), "0": (1, 1), "r0": (0, 1)}[kind.lstrip("chint")]
        ext.producer_connect(LIBCUDA, stream.handle, width, height, *null)
        if kind.startswith("c"):
            ext.producer_loop(total)
        else:
            present, try_return = ext.present, ext.try_return
            free = list(range(POOL))
            for _ in range(total):
                while not free:
                    back = try_return()
                    if back >= 0:
                        free.append(back)
                present(free.pop())
        stats = ext.stats()
    print(json.dumps(stats), flush=True)
    sys.stdin.readline()  # the consumer has taken every frame
    if not kind.startswith("egl"):
        ext.disconnect()
    stream.close()
    display.close()


# ---- the parent --------------------------------------------------------------------------------------

def pinned(cpus):
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


def run_pair(variant: str, width: int, height: int, frames: int, cpus, scratch: str, trees: dict) -> dict:
    """variant: CONSUMER/PRODUCER[@TREE]; both ends import eglcuda from TREE (a --tree name)."""
    variant, _, tree = variant.partition("@")
    consumer_kind, producer_kind = variant.split("/")
    env = dict(os.environ, XPROC_TREE=trees[tree]) if tree else None
    path = os.path.join(scratch, f"s{time.monotonic_ns()}")
    argv = [sys.executable, __file__, "--role"]
    size = [str(width), str(height), str(frames)]
    pipes = dict(stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                 preexec_fn=pinned(cpus))
    con = subprocess.Popen(argv + ["consumer", consumer_kind, path] + size, **pipes)
    pro = subprocess.Popen(argv + ["producer", producer_kind, path] + size, **pipes)
    try:
        line = con.stdout.readline()
        if not line:
            raise RuntimeError(f"consumer: {con.stderr.read().strip().splitlines()[-3:]}; "
                               f"producer: {pro.stderr.read().strip().splitlines()[-3:] if pro.poll() is not None else 'running'}")
        result = json.loads(line)
        said = pro.stdout.readline()
        if not said:
            raise RuntimeError(f"producer: {pro.stderr.read().strip().splitlines()[-3:]}")
        result["producer"] = json.loads(said)
        pro.stdin.write("done\n"), pro.stdin.flush()
        pro.wait(30)
        con.stdin.write("done\n"), con.stdin.flush()
        con.wait(30)
        return result
    finally:
        for p in (pro, con):
            if p.poll() is None:
                p.kill()
                p.wait()


def run_c(width: int, height: int, frames: int, cpus) -> dict:
    done = subprocess.run([str(C_BINARY), "twoproc", "0", "0", str(width), str(height), "argb", str(frames)],
                          capture_output=True, text=True, timeout=120, preexec_fn=pinned(cpus))
    if done.returncode:
        raise RuntimeError(f"cross_gpu twoproc: {done.stderr.strip().splitlines()[-3:]}")
    fields = dict(f.split("=", 1) for f in done.stdout.strip().splitlines()[-1].split() if "=" in f)
    return {"fps": float(fields["fps"]), "present_us": float(fields["present_us"]),
            "release_us": float(fields["release_us"])}


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--role":
        role, kind, path, w, h, n = sys.argv[2:8]
        (consumer if role == "consumer" else producer)(kind, path, int(w), int(h), int(n))
        return 0
    parser = argparse.ArgumentParser()
    parser.add_argument("--mps", action="store_true", help="run everything under a private MPS daemon")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--frames", type=int, default=20000)
    parser.add_argument("--size", default="1920x1080")
    parser.add_argument("--cpus", default=None, help="A,B: the CPUs every process may run on")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--json", help="write every round's figures here (after each round)")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=PATH",
                        help="a source tree built in place; a variant ending @NAME imports eglcuda from it")
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    cpus = {int(c) for c in args.cpus.split(",")} if args.cpus else None
    _needs.needs_cuda(__file__, start=False)  # (only loads libcuda: the parent never starts CUDA, see below)
    _needs.needs_command(__file__, "gcc", "apt install gcc")
    if cpus:
        _needs.needs_cpus(__file__, 1, cpus)
    variants = args.variants.split(",")
    trees = {name: str(pathlib.Path(path).resolve()) for name, path in (t.split("=", 1) for t in args.tree)}
    build()
    from eglcuda import mps  # the parent never starts CUDA: its children must find the daemon first
    runs: dict[str, list] = {v: [] for v in variants}
    with mps.session(args.mps), tempfile.TemporaryDirectory() as scratch:
        for round_ in range(args.rounds):
            order = variants[round_ % len(variants):] + variants[:round_ % len(variants)]
            for v in order:
                try:
                    r = run_c(width, height, args.frames, cpus) if v == "C" else \
                        run_pair(v, width, height, args.frames, cpus, scratch, trees)
                except Exception as exc:  # noqa: BLE001 -- a record: keep going, say what failed
                    r = {"error": f"{type(exc).__name__}: {exc}"}
                runs[v].append(r)
                print(f"round {round_} {v:12s} {json.dumps(r)}", flush=True)
            if args.json:
                pathlib.Path(args.json).write_text(json.dumps({"args": vars(args), "runs": runs}, indent=1))
    base = [r.get("fps") for r in runs.get("C", [])]
    for v, rs in runs.items():
        producers = [r["producer"] for r in rs if r.get("producer")]
        if producers:
            print(f"  producer {v}: " + ", ".join(
                f"{k} {statistics.median(p[k] for p in producers):.2f}" for k in producers[0]), flush=True)
    print(f"{args.size}, {args.frames} frames x {args.rounds} rounds, MPS {'on' if args.mps else 'off'}, "
          f"CPUs {args.cpus or 'all'}; consumer/producer; frames/s median, ratio to C (median of per-round)")
    for v, rs in runs.items():
        fps = [r.get("fps") for r in rs]
        ok = [f for f in fps if f]
        ratios = [f / b for f, b in zip(fps, base) if f and b]
        print(f"  {v:12s} {statistics.median(ok) if ok else float('nan'):9.0f}  "
              f"x{statistics.median(ratios) if ratios else float('nan'):.3f}   "
              + " ".join(f"{f:.0f}" if f else "err" for f in fps), flush=True)
    return 1 if _needs.every_row_failed(r for rs in runs.values() for r in rs) else 0  # nothing measured: 1


if __name__ == "__main__":
    sys.exit(main())
