# Research record (see research/README.md): runs against the current package (bench/stream_roundtrip.py's loops, the fake driver of tests/fakes).
"""Probe: how many CPU instructions does eglcuda spend per frame of the serial round trip?

Runs a serial loop of ``bench/stream_roundtrip.py`` against the fake driver (tests/fakes, no GPU)
under valgrind's callgrind, twice, with two frame counts; the difference of the two totals over
the difference of the frames is the per-frame count, with start-up and set-up cancelled out. The
per-call counts are the inclusive counts of the public calls' entry points, taken the same way.
The fake's own work is in the count too (the same in every tree), so compare trees, not this
count with C's.

    python3 research/probes/frame_instructions.py [--loop four|steps|bare ...] [--frames 10000,30000]
        [--size 640x480] [--json FILE]

Needs valgrind (callgrind_annotate comes with it) and gcc.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]

# The entry points of the public per-frame calls (Cython's wrappers), and what they are called here.
CALLS = {"present": r"CudaProducer_\d+present$", "return_frame": r"CudaProducer_\d+return_frame$",
         "present_and_return": r"CudaProducer_\d+present_and_return$",
         "acquire": r"CudaConsumer_\d+acquire$", "acquire_next": r"CudaConsumer_\d+acquire_next$",
         "release": r"AcquiredFrame_\d+release$"}


def child(loop: str, frames: int, width: int, height: int) -> int:
    sys.path.insert(0, str(ROOT / "bench"))
    import eglcuda
    from stream_roundtrip import eglcuda_serial, eglcuda_serial_steps

    with eglcuda.Display.for_cuda_device(0) as display:
        if loop == "four":
            eglcuda_serial(display, width, height, frames)
        else:
            eglcuda_serial_steps(display, width, height, frames, frame_numbers=(loop == "steps"))
    return 0


def looped(frames: int) -> int:
    """Frames the bench's loop makes for ``frames`` measured ones (it warms up on 10 % more)."""
    return frames + frames // 10 + 2


def callgrind(loop: str, frames: int, size: tuple[int, int], env: dict, out: pathlib.Path) -> tuple[int, dict]:
    """Total instructions of one run, and each public call's inclusive count."""
    result = out / f"callgrind.{loop}.{frames}"
    subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={result}", sys.executable, __file__,
                    "--child", loop, str(frames), str(size[0]), str(size[1])],
                   check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    total = 0
    for line in result.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            total = int(line.split()[1])
    annotated = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100", str(result)],
                               check=True, capture_output=True, text=True).stdout
    calls: dict[str, int] = {}
    for line in annotated.splitlines():
        match = re.match(r"\s*([\d,]+)\s.*?(\S+?)(?: \[.*\])?$", line)
        if not match:
            continue
        count, function = int(match.group(1).replace(",", "")), match.group(2).split(":")[-1]
        for name, pattern in CALLS.items():
            # A function whose inlined header code callgrind files under the header as well is
            # listed once per file, each with the whole inclusive count: take it once.
            if re.search(pattern, function):
                calls[name] = max(calls.get(name, 0), count)
    return total, calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--loop", action="append", choices=("four", "steps", "bare"),
                        help="four: present, acquire, release, return_frame; steps: present_and_return and "
                             "acquire_next; bare: the steps with frame_numbers=False (default: all three)")
    parser.add_argument("--frames", default="10000,30000", help="the two frame counts")
    parser.add_argument("--size", default="640x480")
    parser.add_argument("--json", help="write the counts to this file")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        loop, frames, width, height = args.child
        return child(loop, int(frames), int(width), int(height))
    for tool in ("valgrind", "callgrind_annotate", "gcc"):
        if subprocess.run(["which", tool], capture_output=True).returncode:
            print(f"frame_instructions.py: needs {tool} (apt-get install valgrind gcc)")
            return 2
    first, second = (int(n) for n in args.frames.split(","))
    width, height = (int(n) for n in args.size.split("x"))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp)
        libs = subprocess.run([sys.executable, str(ROOT / "tests/fakes/build.py"), str(out)], check=True,
                              capture_output=True, text=True).stdout.split()
        # One BLAS thread: NumPy's idle BLAS threads spin for a while, in counts that follow the
        # run's wall time, not its frames. One hash seed: with a random one, the start-up's dict
        # and set work differs between the two runs and does not cancel out.
        env = dict(os.environ, EGLCUDA_LIBEGL=libs[0], EGLCUDA_LIBCUDA=libs[1], PYTHONHASHSEED="0",
                   EGLCUDA_LIBVULKAN="/nonexistent/libvulkan.so.1", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                   PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        for loop in args.loop or ["four", "steps", "bare"]:
            total1, calls1 = callgrind(loop, first, (width, height), env, out)
            total2, calls2 = callgrind(loop, second, (width, height), env, out)
            frames = looped(second) - looped(first)
            per_call = {name: (calls2[name] - calls1.get(name, 0)) / frames for name in calls2}
            per_call = {name: count for name, count in per_call.items() if count >= 1}  # not per frame
            results[loop] = {"per_frame": (total2 - total1) / frames, "per_call": per_call}
            print(f"{loop:6s} {results[loop]['per_frame']:8.0f} instructions per frame; per call: "
                  + ", ".join(f"{name} {count:.0f}" for name, count in per_call.items()), flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
