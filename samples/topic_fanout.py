"""One publisher, three subscriber processes, on a frame topic (eglcuda.Publisher / Subscriber).

- this process publishes ARGB frames whose bytes follow from their sequence number;
- "checker" (qos every): checks every byte of every frame (CUDA; through CUDA IPC on a discrete
  GPU, an EGLStream elsewhere);
- "gl" (qos every): receives each frame in a GL texture through an EGLStream, draws it and checks
  every texel;
- "slow" (qos latest): takes 30 ms per frame; it skips frames, and never slows the others down.

Each subscriber is a fresh interpreter (spawned, never forked: CUDA does not survive fork).
Prints each subscriber's frames, skips, transport and failures, and the publisher's rate; exits 0
when every check passed, 1 otherwise, 2 (one line) where there is no GPU with EGL streams between
processes and to GL, or no PyOpenGL (``pip install -e '.[gl]'``).

    python samples/topic_fanout.py [--frames 300] [--width 1280 --height 720] [--transport auto] [--mps]

With --mps every process runs under CUDA MPS (a private daemon for the run, or the one already
serving this GPU; exits 2 with one line when nvidia-cuda-mps-control is missing).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _frames import collect_reports, frame_bytes, publish_known_frames, report, report_done  # noqa: E402
from _sample import FRAME, at_least, lazy, mps_session, run  # noqa: E402

PROGRAM = "samples/topic_fanout.py"
# Imported at first use, once require() has checked they are there (and so --help always works).
np = lazy("numpy")
eglcuda = lazy("eglcuda")

SEED = 20261123


def subscriber(args) -> int:
    """The body of a subscriber process (``--role``)."""
    done = {"role": args.role, "frames": 0, "skipped": 0, "bad": 0, "transport": None, "latency_us": []}
    if args.role == "gl":
        display = eglcuda.Display.for_cuda_device(0)
        context = display.create_context()
        context.make_current()
        sub = eglcuda.Subscriber(args.name, qos="every", queue=2, path=args.path, timeout=30, gl_context=context)
    else:
        qos = "latest" if args.role == "slow" else "every"
        sub = eglcuda.Subscriber(args.name, qos=qos, path=args.path, timeout=30, transport=args.transport)
    done["transport"] = sub.info.transport
    report(event="ready", role=args.role)
    width, height = sub.info.width, sub.info.height
    try:
        for message in sub:  # ends when the publisher closes the topic
            done["frames"] += 1
            done["skipped"] += int(message.skipped)
            done["latency_us"].append((message.received_ns - message.timestamp_ns) / 1e3)
            want = frame_bytes(height, width, message.seq, SEED)
            if args.role == "gl":
                got = message.frame.read(width, height)  # R, G, B, A of memory order B, G, R, A
                bad = np.count_nonzero(got != want[..., [2, 1, 0, 3]])
            else:
                bad = np.count_nonzero(message.frame.planes[0].to_numpy() != want)
            done["bad"] += int(bad != 0)
            if args.role == "slow":
                time.sleep(0.03)
    finally:
        sub.close()
    report_done(done)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--transport", default="auto", choices=["auto", "cuda-ipc", "eglstream"],
                        help="for the checker and the slow subscriber (the GL one always uses an EGLStream)")
    parser.add_argument("--mps", action="store_true", help="run the publisher and the subscribers under CUDA MPS")
    parser.add_argument("--role", choices=["checker", "gl", "slow"], help=argparse.SUPPRESS)
    parser.add_argument("--name", default="fanout", help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    at_least(parser, args, {**FRAME, "--frames": 1})
    if args.role:
        return subscriber(args)

    # EGLStreams between processes (the checker and slow subscribers without CUDA IPC), a GL
    # consumer with PyOpenGL (the gl subscriber), CUDA IPC when it is asked for by name.
    needs = ["cross-process", "gl-stream", *(["cuda-ipc"] if args.transport == "cuda-ipc" else [])]
    with mps_session(PROGRAM, args.mps, *needs):
        return publish(args)


def publish(args: argparse.Namespace) -> int:
    """The publisher's side: start the three subscribers, publish, collect their reports."""
    with tempfile.TemporaryDirectory(prefix="eglcuda-fanout-") as folder:
        os.chmod(folder, 0o700)
        path = os.path.join(folder, "fanout.topic")
        children: dict[str, subprocess.Popen] = {}
        try:
            with eglcuda.Publisher("fanout", args.width, args.height, "ARGB", fps=None, path=path,
                                   every_timeout=10.0) as pub:
                children = {role: subprocess.Popen([sys.executable, __file__, "--role", role, "--path", path,
                                                    "--transport", args.transport], stdout=subprocess.PIPE, text=True)
                            for role in ("checker", "gl", "slow")}
                for role, child in children.items():  # wait until each has joined
                    line = child.stdout.readline()
                    if not line:
                        print(f"topic_fanout: the {role} subscriber did not start")
                        return 1
                rate = publish_known_frames(pub, args.frames, args.height, args.width, SEED)
                transports = {info.pid: info.transport for info in pub.subscribers}
                pub.close(timeout=10)
            results = collect_reports(children)
        finally:  # a subscriber still running here (an early return, an error) must not outlive the sample
            for child in children.values():
                if child.poll() is None:
                    child.kill()
                    child.wait(10)
    failed = False
    print(f"published {args.frames} frames of {args.width}x{args.height} ARGB at {rate:.0f} frames/s "
          f"(subscriber transports by pid: {transports})")
    for result in results:
        if "error" in result:
            failed = True
            print(f"  {result['role']}: FAILED: {result['error']}")
            continue
        every = result["role"] in ("checker", "gl")
        ok = result["bad"] == 0 and (not every or result["frames"] == args.frames)
        failed |= not ok
        print(f"  {result['role']:8s} {'PASS' if ok else 'FAIL'}: {result['frames']} frames, {result['skipped']} "
              f"skipped, {result['bad']} wrong, via {result['transport']}, latency p50 {result['latency_p50_us']:.0f} us")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
