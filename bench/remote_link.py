"""What a remote subscriber gets over a real link with delay and loss: a publisher and a relay in one
network namespace, a remote subscriber in another, a veth pair between them with netem's delay and
loss on both ends (bench/_netlink.py: unprivileged, on one host), UCX over TCP on the veth only.

Measured over --duration seconds once the remote joined (frames count when their publish time falls
in that window): the rate the publisher kept and the rate the remote got, the frames it skipped, the
latency from publish to the frame usable in its own GPU memory (its stream synchronized), and every
byte of every frame checked (random content, a function of the frame's seq); with the link's TCP
retransmissions and the packets netem dropped in the same window. The relay and the remote are both
``qos="every"`` by default: every frame, so the question is whether the link keeps the pace; with
``--qos latest`` a link that does not shows as skipped frames instead.

    python bench/remote_link.py [--link netem:delay=2ms,loss=0.5%] [--width 1920 --height 1080]
                                [--rate 60] [--duration 5] [--qos every|latest] [--no-check]
                                [--ucx-env K=V,...] [--out DIR]

``--link``: ``netem:delay=Dms,loss=P%[,mtu=N]`` (the default: 2 ms and 0.5 % each way, MTU 1500)
or ``veth[:mtu=N]`` (the clean link); either with ``offload=on|off`` (the veth's TCP segmentation
offload; off by default where there is loss, so that netem drops MTU-sized packets as a wire would,
not whole 64 KB super-packets) and ``cc=NAME`` (the TCP congestion control of both namespaces;
by default the host's, named in the table: it decides how TCP takes random loss). Prints one table
row; with --out, writes results.json and results.md there. Exits 2 with one line where there is no CUDA GPU, no ucxx
(``pip install -e '.[remote-cu13]'`` or ``remote-cu12``) or the machine cannot make the link: no
unshare, nsenter or mount program, no unprivileged user/network/mount namespaces, no sysfs in them,
no veth, or no netem (the sch_netem kernel module); ip and tc are not needed. On a machine without
a GPU, the fake libcuda of tests/fakes runs it (LD_LIBRARY_PATH, UCX_MODULES=^cuda): the numbers
then measure the CPU side only.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import secrets
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _netlink  # noqa: E402
from _remote_common import TAIL_S, Pacer, RoleProcess, Tally, Window, emit, now_ns  # noqa: E402
from _script import CRYPTOGRAPHY, at_least, fail, lazy, output_folder, require, run  # noqa: E402

np = lazy("numpy")
PROGRAM = "bench/remote_link.py"
NAME = "bench-link"
JOIN_S = 60.0
UCX_ENV = {"UCX_TLS": "tcp", "UCX_WARN_UNUSED_ENV_VARS": "n"}
SEED = 3


# ==== the roles (each in its namespace) ============================================================

class Content:
    """Frame ``seq``'s planes: a fixed random image per plane plus a value that changes with every
    frame, so a frame mixing two frames' bytes never matches."""

    def __init__(self, shapes: list[tuple[int, ...]]) -> None:
        self.bases = [np.random.default_rng([SEED, i]).integers(0, 256, s, dtype=np.uint8)
                      for i, s in enumerate(shapes)]
        self.scratch = [np.empty_like(b) for b in self.bases]

    def planes(self, seq: int) -> list:
        for base, out in zip(self.bases, self.scratch):
            np.add(base, np.uint8((seq * 37 + 11) % 256), out=out)
        return self.scratch


def role_publisher(args) -> int:
    import eglcuda

    window = Window()
    published = 0
    with eglcuda.Publisher(NAME, args.width, args.height, "NV12", path=args.path, pool=8,
                           every_timeout=5.0) as pub:
        content = None
        emit(role="ready")
        pacer = Pacer(args.rate)
        seq = 0
        while not window.over(TAIL_S):
            pacer.wait()
            frame = pub.next_frame(timeout=30)
            if content is None:
                content = Content([tuple(p.shape) for p in frame.planes])
            for plane, data in zip(frame.planes, content.planes(seq)):
                plane.copy_from(data)
            stamp = now_ns()
            seq = pub.publish(frame, payload=b"") + 1
            published += window.inside(stamp)
        span = (window.end - window.start) / 1e9
        emit(role="publisher", rate=published / span if span > 0 else math.nan, frames=published)
    return 0


def role_relay(args) -> int:
    import eglcuda

    window = Window()
    key = bytes.fromhex(pathlib.Path(args.key_file).read_text().strip())
    with eglcuda.Relay(NAME, listen=f"{_netlink.ADDRESSES['a']}:0", key=key, path=args.path, timeout=JOIN_S,
                       qos=args.qos, queue=8, every_timeout=5.0) as relay:
        emit(role="listening", port=relay.address[1])
        while not window.over(1.0):
            time.sleep(0.05)
        remotes = [{"peer": r.peer, "sent": r.sent, "skipped": r.skipped} for r in relay.remotes]
    emit(role="relay", remotes=remotes)
    return 0


def role_remote(args) -> int:
    import eglcuda
    from eglcuda._bind import cuda

    window, tally = Window(), Tally()
    bad = skipped = 0
    content = None
    address = f"{_netlink.ADDRESSES['a']}:{args.port}"
    key = bytes.fromhex(pathlib.Path(args.key_file).read_text().strip())
    with eglcuda.Subscriber(NAME, remote=address, key=key, qos=args.qos, queue=4, timeout=JOIN_S) as sub:
        emit(role="joined")
        stream = sub.cuda_stream or 0
        while not window.over(2.0):
            try:
                message = sub.receive(1.0)
            except eglcuda.Timeout:
                continue
            except (eglcuda.Dropped, eglcuda.StreamDisconnected):
                break  # the publisher closed at the end
            with message:
                cuda.stream_synchronize(stream, "waiting for a frame to be usable")
                usable = now_ns()
                inside = window.inside(message.timestamp_ns)
                tally.add(window, message.timestamp_ns, usable)
                skipped += message.skipped if inside else 0
                if args.check and inside:
                    planes = message.frame.planes
                    if content is None:
                        content = Content([tuple(p.shape) for p in planes])
                    want = content.planes(message.seq)
                    bad += any(not np.array_equal(p.to_numpy(), w) for p, w in zip(planes, want))
    emit(role="remote", **tally.result(window), skipped=skipped, bad=bad if args.check else None)
    return 0


# ==== orchestration ================================================================================

def spawn(role: str, prefix: list[str], env: dict, args, *extra: str) -> RoleProcess:
    """A role process of this bench in one side's namespaces (``prefix`` enters them)."""
    command = [*prefix, sys.executable, str(pathlib.Path(__file__).resolve()), "--role", role, "--width",
               str(args.width), "--height", str(args.height), "--rate", str(args.rate), "--qos", args.qos,
               *(["--no-check"] if not args.check else []), *extra]
    return RoleProcess(role, command, env)


def measure(args, spec: _netlink.LinkSpec, env: dict) -> dict:
    """One run: the link, the three processes, the window; what each said and what the link counted."""
    children: list[RoleProcess] = []
    with tempfile.TemporaryDirectory(prefix="eglcuda-bench-link-") as folder, _netlink.Link(spec) as link:
        os.chmod(folder, 0o700)
        path = os.path.join(folder, "bench.topic")
        key_file = os.path.join(folder, "key")
        with open(os.open(key_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as handle:
            handle.write(secrets.token_hex(32))
        sides = {side: {**env, "UCX_NET_DEVICES": _netlink.DEVICES[side]} for side in ("a", "b")}
        try:
            pub = spawn("pub", link.enter("a"), sides["a"], args, "--path", path)
            children.append(pub)
            pub.expect("ready", JOIN_S)
            relay = spawn("relay", link.enter("a"), sides["a"], args, "--path", path, "--key-file", key_file)
            children.append(relay)
            port = relay.expect("listening", JOIN_S)["port"]
            remote = spawn("remote", link.enter("b"), sides["b"], args, "--port", str(port), "--key-file", key_file)
            children.append(remote)
            remote.expect("joined", JOIN_S)
            time.sleep(1.0)  # warm up: TCP's windows open before the window
            before = {side: link.counters(side) for side in ("a", "b")}
            start = now_ns() + int(0.2e9)
            end = start + int(args.duration * 1e9)
            for child in children:
                child.go(start, end)
            published = pub.expect("publisher", args.duration + TAIL_S + 30)
            after = {side: link.counters(side) for side in ("a", "b")}
            got = remote.expect("remote", 30)
            relay.expect("relay", 30)
            cc = link.congestion_control("a")  # (side a sends the frames)
        finally:
            for child in reversed(children):
                child.stop()
    counted = {key: sum(after[s][key] - before[s][key] for s in ("a", "b")) for key in before["a"]}
    return {"link": spec.describe() + ("" if spec.cc else f", TCP {cc}"), "tcp_cc": cc,
            "frame": f"{args.width}x{args.height} NV12", "qos": args.qos,
            "rate": args.rate, "duration": args.duration, "published_rate": published["rate"], "remote": got,
            **counted}


HEADER = ("| link | frame, qos | published/s | remote got/s | skipped | p50 / p99 / max ms | frames wrong "
          "| TCP segments retransmitted | netem dropped |\n|---|---|---:|---:|---:|---:|---:|---:|---:|")


def row(result: dict) -> str:
    got = result["remote"]
    wrong = "not checked" if got["bad"] is None else f"{got['bad']} of {got['frames']}"
    return (f"| {result['link']} | {result['frame']}, {result['qos']} | {result['published_rate']:.1f} | "
            f"{got['rate']:.1f} | {got['skipped']} | {got['p50_us'] / 1e3:.2f} / {got['p99_us'] / 1e3:.2f} / "
            f"{got['max_us'] / 1e3:.2f} | {wrong} | {result['tcp_retransmitted']:,} of "
            f"{result['tcp_out_segments']:,} | {result['netem_dropped']:,} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--link", default="netem:delay=2ms,loss=0.5%",
                        help="netem:delay=Dms,loss=P%%[,mtu=N] or veth[:mtu=N], either with offload=on|off and "
                             "cc=NAME (default netem:delay=2ms,loss=0.5%%)")
    parser.add_argument("--width", type=at_least(2), default=1920)
    parser.add_argument("--height", type=at_least(2), default=1080)
    parser.add_argument("--rate", type=at_least(0, float, above=True), default=60.0, help="frames a second the publisher publishes")
    parser.add_argument("--duration", type=at_least(0, float, above=True), default=5.0, help="timed seconds")
    parser.add_argument("--qos", choices=["every", "latest"], default="every", help="the relay's and the remote's")
    parser.add_argument("--no-check", dest="check", action="store_false", help="do not check the frames' bytes")
    parser.add_argument("--ucx-env", default="", metavar="K=V,...", help="UCX_* settings for every process")
    parser.add_argument("--out", default="", help="a folder for results.json and results.md")
    # the roles of the processes this script spawns
    parser.add_argument("--role", choices=["pub", "relay", "remote"], help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--key-file", help=argparse.SUPPRESS)
    args = parser.parse_args()
    output_folder(parser, "--out", args.out)
    if args.role:
        return {"pub": role_publisher, "relay": role_relay, "remote": role_remote}[args.role](args)

    try:
        spec = _netlink.LinkSpec.parse(args.link)
    except ValueError as exc:
        parser.error(str(exc))
    if args.width < 16 or args.height < 16 or args.width % 2 or args.height % 2:
        parser.error("--width and --height are even numbers of at least 16")
    if not (args.rate > 0 and args.duration > 0):
        parser.error("--rate and --duration are more than 0")
    env = {**os.environ, **{k: v for k, v in UCX_ENV.items() if k not in os.environ}, "PYTHONUNBUFFERED": "1"}
    for setting in filter(None, args.ucx_env.split(",")):
        key, _, value = setting.partition("=")
        if not key.startswith(("UCX_", "UCXPY_")) or not value:
            parser.error(f"--ucx-env takes UCX_NAME=VALUE pairs, got {setting!r}")
        env[key] = value
    # Checks first: a GPU (CUDA), pyca/cryptography, ucxx, then each thing the link needs.
    require(PROGRAM, "cuda", modules=[("numpy", "numpy", "pip install numpy"), CRYPTOGRAPHY])
    from eglcuda.remote import ucxx_missing

    missing = ucxx_missing()
    if missing:
        fail(PROGRAM, missing, 2)
    missing = _netlink.missing(spec)
    if missing:  # (its line says what is absent: "no netem qdisc (...)")
        fail(PROGRAM, f"needs what its link is made of: {missing}", 2)
    result = measure(args, spec, env)
    table = HEADER + "\n" + row(result)
    ucx = " ".join(f"{k}={v}" for k, v in sorted(env.items()) if k.startswith(("UCX_", "UCXPY_"))
                   and k not in ("UCX_WARN_UNUSED_ENV_VARS", "UCX_NET_DEVICES"))
    print(f"{PROGRAM}: {args.duration:g} s at {args.rate:g} frames/s; {ucx}\n\n{table}")
    if args.out:
        out = pathlib.Path(args.out).resolve()
        out.mkdir(parents=True, exist_ok=True)
        (out / "results.json").write_text(json.dumps({**result, "ucx_env": ucx}, indent=1))
        (out / "results.md").write_text(table + "\n")
    bad = result["remote"]["bad"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(run(main, PROGRAM))
