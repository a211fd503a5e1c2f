"""Status: runs against the current package, on a machine without a GPU (the stand-in libcuda).

What waiting on topics costs per frame, on a CPU machine: bench/sources.py's own publisher and
subscriber roles (its variants, its measurement: the waiting thread's CPU time inside eglcuda's
calls, the whole process's), every process on tests/fakes/driver/fake_cuda.c in place of
libcuda.so.1, whose device memory is shared memory. The stand-in has no GPU work and no driver
threads, so what is left is eglcuda's Python and system calls on the per-frame path: the number
to cut, before and after a change, on the same machine in one sitting. ``--profile`` runs one
1-topic waiting loop in this process under cProfile instead and prints the top of it.
``--batcher`` measures ``eglcuda.Batcher`` instead: N publishers, batches of one frame a source,
this thread's CPU time per frame inside ``next()`` and the batch's release (small frames: the
stand-in's copies are host ``memcpy``s, which a GPU does not charge to the CPU).

    python research/probes/waitcost_probe.py [--sources 1,8] [--rate 30] [--variants waitset,selectors]
                                             [--seconds 5] [--size 640x480:NV12] [--profile]
    python research/probes/waitcost_probe.py --batcher [--sources 8] [--rate 30] [--seconds 5]
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))


def fake_env(folder: str) -> None:
    from tests.fakes import build

    build.build_libcuda(folder)
    os.environ["LD_LIBRARY_PATH"] = folder  # (the children)
    os.environ["EGLCUDA_LIBCUDA"] = os.path.join(folder, "libcuda.so.1")  # (this process: --profile)
    os.environ["__EGL_VENDOR_LIBRARY_FILENAMES"] = "/nonexistent.json"  # no EGL: cuda-ipc only


def profile(args: argparse.Namespace, folder: str) -> None:
    """One publisher at ``rate`` in a child, one wait-set loop here under cProfile."""
    path = os.path.join(folder, "p.topic")
    pub = subprocess.Popen([sys.executable, os.path.join(ROOT, "bench", "sources.py"), "--role", "pub", "--path",
                            path, "--name", "s0", "--rate", str(args.rate), "--size", args.size,
                            "--transport", "cuda-ipc"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert pub.stdout is not None and pub.stdout.readline().strip() == "READY"
        import eglcuda
        import sources

        sub = eglcuda.Subscriber("s0", qos="every", queue=4, path=path, timeout=30)
        variant = sources.VARIANTS[args.variants.split(",")[0]]

        def take(message, calls):  # type: ignore[no-untyped-def]
            message.release()

        variant([sub], 1.0, take, sources.Meters())
        profiler = cProfile.Profile()
        profiler.enable()
        variant([sub], args.seconds, take, sources.Meters())
        profiler.disable()
        sub.close()
        pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    finally:
        pub.kill()
        pub.wait()


def batcher(args: argparse.Namespace, folder: str) -> None:
    """Batcher rows: CPU per frame of this thread inside next() and release()."""
    import eglcuda

    for count in [int(n) for n in args.sources.split(",")]:
        paths = [os.path.join(folder, f"b{count}-{i}.topic") for i in range(count)]
        pubs = [subprocess.Popen([sys.executable, os.path.join(ROOT, "bench", "sources.py"), "--role", "pub",
                                  "--path", path, "--name", f"s{i}", "--rate", str(args.rate), "--size", "64x48:NV12",
                                  "--transport", "cuda-ipc"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
                for i, path in enumerate(paths)]
        try:
            for pub in pubs:
                assert pub.stdout is not None and pub.stdout.readline().strip() == "READY"
            subs = [eglcuda.Subscriber(f"s{i}", qos="every", queue=4, path=path, timeout=30)
                    for i, path in enumerate(paths)]
            with eglcuda.Batcher(subs, count, formation_timeout=1 / args.rate if args.rate else 0.05) as batching:
                for seconds, counting in ((1.0, False), (args.seconds, True)):
                    frames = batches = 0
                    inside = 0.0
                    until = time.monotonic() + seconds
                    while time.monotonic() < until:
                        started = time.thread_time()
                        batch = batching.next()
                        frames += batch.size
                        batches += 1
                        batch.release()
                        inside += time.thread_time() - started
            for sub in subs:
                sub.close()
            print(f"| {count} | Batcher | {frames / args.seconds:.0f} | {frames / max(batches, 1):.1f} | "
                  f"{1e6 * inside / max(frames, 1):.1f} |", flush=True)
        finally:
            for pub in pubs:
                pub.kill()
                pub.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sources", default="1,8")
    parser.add_argument("--rate", type=float, default=30.0)
    parser.add_argument("--variants", default="waitset,selectors")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--size", default="640x480:NV12")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--batcher", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="eglcuda-waitcost-") as folder:
        os.chmod(folder, 0o700)
        fake_env(folder)
        if args.profile:
            profile(args, folder)
            return 0
        if args.batcher:
            print(f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, stand-in libcuda, 64x48 NV12, {args.rate:g} frames/s")
            print("| sources | variant | frames/s | frames a batch | in calls us/frame |")
            print("|---:|---|---:|---:|---:|")
            batcher(args, folder)
            return 0
        import sources

        bench = argparse.Namespace(size=args.size, transport="cuda-ipc", seconds=args.seconds, warmup=1.0, split=True)
        print(f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, stand-in libcuda, {args.size}, {args.rate:g} frames/s")
        print("| sources | variant | frames/s | in calls us/frame | waiting thread % core | process us/frame | loop us "
              "| p50 us | p99 us |")
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|")
        for count in [int(n) for n in args.sources.split(",")]:
            for variant in args.variants.split(","):
                row = sources.measure(variant, count, args.rate, bench)
                print(f"| {count} | {variant} | {row['fps']:.0f} | {row['inside_us']:.1f} | {row['thread_pct']:.2f} | "
                      f"{row['cpu_us']:.1f} | {row['loop_us']:.1f} | {row['p50_us']:.0f} | {row['p99_us']:.0f} |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
