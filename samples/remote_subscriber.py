"""A topic that crosses hosts, both ends on this machine over loopback: a publisher (this
process), a relay (``python -m eglcuda relay``, a local subscriber of the topic that serves it over
UCX) and two remote subscriber processes (``eglcuda.Subscriber(name, remote="host:port")``):

- "checker" (qos every, the relay's local subscription every too: lossless end to end) checks
  every byte of every frame and that none is missing;
- "latest" (qos latest) checks every byte of the frames it gets, and may skip some.

The frames are ARGB, their bytes follow from their sequence number. The relay and the remote
subscribers share a random key (``EGLCUDA_REMOTE_KEY``, in their environment only): who does not
know it cannot join. UCX goes over TCP on the loopback device (``UCX_TLS=tcp``,
``UCX_NET_DEVICES=lo``), the path it takes between two hosts. Between two machines, run the relay
with ``--listen HOST:PORT`` on the publisher's host and give the subscribers ``remote=
"HOST:PORT"`` and the key (docs/remote.md).

Prints each subscriber's frames, skips, failures and latency, then PASS or FAIL; exits 0 when
every check passed, 1 otherwise, 2 (one line) where there is no NVIDIA GPU whose frames can go
to another process, or no ucxx (``pip install -e '.[remote-cu13]'``, or ``remote-cu12`` for a
CUDA 12 driver).

    python samples/remote_subscriber.py [--frames 300] [--width 1280 --height 720]
"""
from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _frames import collect_reports, frame_bytes, publish_known_frames, report, report_done  # noqa: E402
from _sample import CRYPTOGRAPHY, fail, lazy, require, run  # noqa: E402

PROGRAM = "samples/remote_subscriber.py"
np = lazy("numpy")
eglcuda = lazy("eglcuda")

SEED = 20261128
UCX_LOOPBACK = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n"}


def subscriber(args) -> int:
    """The body of a remote subscriber process (``--role``): the key comes from the environment."""
    done = {"role": args.role, "frames": 0, "skipped": 0, "bad": 0, "out_of_order": 0, "first": None, "last": None,
            "latency_us": []}
    qos = "every" if args.role == "checker" else "latest"
    with eglcuda.Subscriber(args.name, remote=f"127.0.0.1:{args.port}", qos=qos, timeout=30) as sub:
        done["transport"] = sub.info.transport
        report(event="ready", role=args.role)
        width, height = sub.info.width, sub.info.height
        last = -1
        for message in sub:  # ends when the publisher closes the topic
            seq = int(message.payload)
            done["frames"] += 1
            done["skipped"] += int(message.skipped)
            done["out_of_order"] += int(seq <= last or seq != message.seq)
            last = seq
            done["first"] = seq if done["first"] is None else done["first"]
            done["last"] = seq
            got = message.frame.planes[0].to_numpy()  # in this process's own device memory
            done["latency_us"].append((time.monotonic_ns() - message.timestamp_ns) / 1e3)
            done["bad"] += int(np.count_nonzero(got != frame_bytes(height, width, seq, SEED)) != 0)
            message.release()
            if args.role == "latest":
                time.sleep(0.005)  # slower than the publisher: skips frames, never slows the others
    report_done(done)
    return 0


def check_needs() -> None:
    """Exit 2 with one line unless there is a GPU whose frames reach another process, ucxx and
    pyca/cryptography (the remote extras)."""
    require(PROGRAM, "cuda")
    if not (eglcuda.available("cuda-ipc") or eglcuda.available("cross-process")):
        require(PROGRAM, "cuda-ipc")  # names what is missing
    from eglcuda.remote import ucxx_missing

    missing = ucxx_missing()
    if missing:
        fail(PROGRAM, missing, 2)
    require(PROGRAM, modules=[CRYPTOGRAPHY])


def start_relay(name: str, env: dict) -> tuple[subprocess.Popen, int]:
    """``python -m eglcuda relay NAME`` on a free loopback port; returns it and the port."""
    relay = subprocess.Popen([sys.executable, "-m", "eglcuda", "relay", name, "--listen", "127.0.0.1:0",
                              "--qos", "every"], stdout=subprocess.PIPE, text=True, env=env)
    assert relay.stdout is not None
    line = relay.stdout.readline()  # "relay NAME listening on HOST:PORT"
    if "listening on" not in line:
        relay.wait(10)
        raise RuntimeError(f"the relay did not start (status {relay.returncode}): {line.strip()!r}")
    return relay, int(line.rsplit(":", 1)[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=300)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--role", choices=["checker", "latest"], help=argparse.SUPPRESS)
    parser.add_argument("--name", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        return subscriber(args)
    if args.frames < 1 or args.width < 2 or args.height < 2:
        parser.error("--frames, --width and --height are positive (width and height at least 2)")
    check_needs()

    name = f"remote-sample-{os.getpid()}"
    # The key: in the children's environment only (never on a command line, where ps shows it).
    env = {**os.environ, **{k: v for k, v in UCX_LOOPBACK.items() if k not in os.environ},
           "EGLCUDA_REMOTE_KEY": secrets.token_hex(32), "PYTHONUNBUFFERED": "1"}
    os.environ.update({k: env[k] for k in UCX_LOOPBACK})
    children: dict[str, subprocess.Popen] = {}
    relay = None
    try:
        with eglcuda.Publisher(name, args.width, args.height, "ARGB", fps=None, every_timeout=10.0) as pub:
            relay, port = start_relay(name, env)
            children = {role: subprocess.Popen([sys.executable, __file__, "--role", role, "--name", name,
                                                "--port", str(port)], stdout=subprocess.PIPE, text=True, env=env)
                        for role in ("checker", "latest")}
            for role, child in children.items():  # wait until each has joined through the relay
                if not child.stdout or not child.stdout.readline():
                    print(f"remote_subscriber: the {role} subscriber did not start")
                    return 1
            rate = publish_known_frames(pub, args.frames, args.height, args.width, SEED)
            pub.close(timeout=10)
        results = collect_reports(children)
        relay.send_signal(signal.SIGTERM)
        relay_status = relay.wait(30)
    finally:  # a child still running here (an early return, an error) must not outlive the sample
        for child in [*children.values(), *([relay] if relay is not None else [])]:
            if child.poll() is None:
                child.kill()
                child.wait(10)
    failed = relay_status != 0
    print(f"published {args.frames} frames of {args.width}x{args.height} ARGB at {rate:.0f} frames/s; "
          f"relay on 127.0.0.1:{port} {'stopped cleanly' if not failed else f'exited with status {relay_status}'}")
    for result in results:
        if "error" in result:
            failed = True
            print(f"  {result['role']}: FAILED: {result['error']}")
            continue
        lossless = result["role"] == "checker"
        ok = result["bad"] == 0 and result["out_of_order"] == 0 and result["frames"] > 0 and \
            (not lossless or (result["frames"] == args.frames and result["skipped"] == 0))
        failed |= not ok
        print(f"  {result['role']:8s} {'PASS' if ok else 'FAIL'}: {result['frames']} frames, {result['skipped']} "
              f"skipped, {result['bad']} wrong, {result['out_of_order']} out of order (seq {result['first']}.."
              f"{result['last']}), via {result['transport']}, latency p50 {result['latency_p50_us']:.0f} us")
    print("FAIL" if failed else "PASS")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
