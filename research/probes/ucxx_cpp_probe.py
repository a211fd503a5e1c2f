"""Is UCXX's Python layer what a remote frame's message costs? One process, eglcuda's UCX engine
(thread mode, ``_ucx.engine()``) and an endpoint to its own worker: a ping-pong of one message
(a receive posted on the worker, a send on the endpoint, both waited for) made --count times
through the engine's Python path (``Endpoint.recv_now`` / ``send_now``, UCXX's Python requests
and futures, the callbacks on the engine's loop: the relay's and a remote's frame path) and
through UCXX's C++ API with completion callbacks on UCX's progress thread and no Python between
messages (``ucxx_cpp_pingpong.cpp``, built here with g++ against the headers of the libucxx and
libucx wheels), rounds interleaved on the same worker and endpoint. Checks the bytes received.

    python research/probes/ucxx_cpp_probe.py [--size 115200] [--count 2000] [--rounds 5]

Prints each round's time a round trip (two messages) on each path, the medians and their ratio.
"""
from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
for key, value in {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n"}.items():
    os.environ.setdefault(key, value)


def missing() -> str | None:
    """What this probe needs and does not find, in one line (None: everything is there)."""
    if shutil.which("g++") is None:
        return "g++ is missing (apt install g++)"
    for module, extra in (("ucxx", "pip install -e '.[remote-cu12]'"), ("numpy", "pip install numpy")):
        if importlib.util.find_spec(module) is None:
            return f"{module} is missing ({extra})"
    for wheel in ("libucxx", "libucx"):
        spec = importlib.util.find_spec(wheel)
        if spec is None or not spec.submodule_search_locations:
            return f"the {wheel} wheel is missing (pip install -e '.[remote-cu12]')"
        if not os.path.isdir(os.path.join(list(spec.submodule_search_locations)[0], "include")):
            return f"the {wheel} wheel has no include/ folder (a full wheel, not a slimmed one)"
    return None


def build(folder: str) -> str:
    """libpingpong.so in ``folder``, built against the wheels' headers and libucxx.so."""
    roots = {name: list(importlib.util.find_spec(name).submodule_search_locations)[0]  # type: ignore[union-attr]
             for name in ("libucxx", "libucx")}
    lib64 = os.path.join(roots["libucxx"], "lib64")
    out = os.path.join(folder, "libpingpong.so")
    subprocess.run(["g++", "-O2", "-std=c++17", "-shared", "-fPIC", os.path.join(HERE, "ucxx_cpp_pingpong.cpp"),
                    "-I", os.path.join(roots["libucxx"], "include"), "-I", os.path.join(roots["libucx"], "include"),
                    "-L", lib64, "-lucxx", f"-Wl,-rpath,{lib64}", "-o", out], check=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=115200, help="bytes a message (115200: 320x240 NV12)")
    parser.add_argument("--count", type=int, default=2000, help="round trips a round")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.size < 1 or args.count < 1 or args.rounds < 1:
        parser.error("--size, --count and --rounds are at least 1")
    why = missing()
    if why is not None:
        print(f"ucxx_cpp_probe: {why}", file=sys.stderr)
        return 2
    import numpy as np
    from eglcuda.remote import _ucx

    with tempfile.TemporaryDirectory(prefix="ucxx-cpp-probe-") as folder:  # (gone at once, on an error too)
        library = build(folder)
        engine = _ucx.engine()  # (first: it loads libucxx and libucp, which the probe's library links to)
        lib = ctypes.CDLL(library)  # (mapped now: its file may go)
    lib.cpp_pingpong.restype = ctypes.c_double
    lib.cpp_pingpong.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_size_t, ctypes.c_int, ctypes.c_ulonglong]

    made: dict = {}
    ready = threading.Event()

    def connect() -> None:  # (on the engine's thread, as every endpoint of the engine)
        raw = engine.api.UCXEndpoint.create_from_worker_address(engine.worker, engine.worker.address, True)
        endpoint = _ucx.Endpoint(engine, raw)
        prefix = engine.new_prefix()
        endpoint.use_tags(prefix, prefix)
        made.update(raw=raw, endpoint=endpoint, prefix=prefix)
        ready.set()

    engine.loop.call_soon_threadsafe(connect)
    if not ready.wait(10):
        print("ucxx_cpp_probe: the engine made no endpoint in 10 s", file=sys.stderr)
        return 1
    endpoint, raw, prefix = made["endpoint"], made["raw"], made["prefix"]
    rng = np.random.default_rng(1)
    sent = rng.integers(0, 256, args.size, dtype=np.uint8)
    received = np.zeros(args.size, np.uint8)
    sent_array, received_array = engine.arr(sent), engine.arr(received)

    def python_round(count: int) -> float:
        finished = threading.Event()
        state = {"done": 0, "left": 0}

        def one_done(error: object) -> None:
            assert error is None, error
            state["left"] -= 1
            if state["left"] == 0:
                state["done"] += 1
                if state["done"] == count:
                    finished.set()
                else:
                    step()

        def step() -> None:
            state["left"] = 2
            endpoint.recv_now(received_array, 9, one_done)
            endpoint.send_now(sent_array, 9, one_done)

        started = time.perf_counter()
        engine.loop.call_soon_threadsafe(step)
        if not finished.wait(120):
            raise RuntimeError("the Python path stalled")
        return (time.perf_counter() - started) / count

    def cpp_round(count: int) -> float:
        return lib.cpp_pingpong(raw.ucxx_ptr, engine.worker.ucxx_ptr, sent.ctypes.data, received.ctypes.data,
                                args.size, count, (prefix << 8) | 10)

    python_s, cpp_s = [], []
    for round_ in range(args.rounds):
        for path, times, run in (("python", python_s, python_round), ("c++", cpp_s, cpp_round)):
            received[:] = 0
            times.append(run(args.count))
            if not np.array_equal(received, sent):
                print(f"ucxx_cpp_probe: round {round_}, {path}: the bytes received differ from those sent")
                return 1
        print(f"round {round_}: python {1e6 * python_s[-1]:.1f} us, C++ {1e6 * cpp_s[-1]:.1f} us a round trip")
    python_us, cpp_us = 1e6 * statistics.median(python_s), 1e6 * statistics.median(cpp_s)
    print(f"{args.size} B, {args.count} round trips x {args.rounds} rounds (medians): Python path {python_us:.1f} us, "
          f"C++ callbacks {cpp_us:.1f} us a round trip of two messages; Python - C++ = {python_us - cpp_us:.1f} us "
          f"({python_us / cpp_us:.2f}x)")
    sys.stdout.flush()
    os._exit(0)  # (UCXX's teardown order is its own: the process ends here, as the engine's users do)


if __name__ == "__main__":
    sys.exit(main())
