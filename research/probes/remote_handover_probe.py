"""How many hand-overs between threads does a remote frame cost, and how many frames go out
from a credit at once? 320x240 NV12 frames, publisher flat out, one relay and one 'latest'
remote subscriber (bench/remote.py's roles, each its own process), counted by wrapping the
relay's and the remote's methods in their processes; frames/s beside, with the raw engine
(bench/_ucx_raw.py, window 3) in the same run.

    LD_LIBRARY_PATH=<stand-in libcuda> python research/probes/remote_handover_probe.py [--duration S]

(research/probes/remote_handover_probe.sh runs it for two trees in alternate rounds, with the
stand-in libcuda built.) Counts per frame the relay sent:

- ``wakes``: the relay's local thread handed staged frames to the loop (call_soon_threadsafe);
- ``stages``: frames the local thread copied to staging (D2H copy waited for);
- ``from_credit``: frames whose send was posted by the credit that made room for them, with no
  local-thread step between (a frame staged ahead of its credit);
- ``stale``: frames staged ahead of a credit that came too late for them (let go);
- ``credit_hops``: the remote's user thread handed credit to the engine's loop (per frame sent:
  a 'latest' remote also credits back the frames it did not take).

A frame count on a loaded machine moves with the load; these ratios do not.
"""
from __future__ import annotations

import argparse
import atexit
import json
import os
import pathlib
import secrets
import subprocess
import sys
import tempfile
import time

import _needs  # research/probes/_needs.py: a missing need is one line and status 2

ROOT = pathlib.Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
SIZE = ("--width", "320", "--height", "240", "--format", "NV12")


def _count_relay(counts: dict) -> None:
    from eglcuda.remote import relay, sender, staging

    call = relay.Relay._call

    def counted_call(self, function, *args):
        if getattr(function, "__name__", "") in ("_dispatch", "_dispatch_staged"):
            counts["wakes"] = counts.get("wakes", 0) + 1
        return call(self, function, *args)

    relay.Relay._call = counted_call
    stage = staging.Staging.stage

    def counted_stage(self, message):
        index = stage(self, message)
        if index is not None:
            counts["stages"] = counts.get("stages", 0) + 1
        return index

    staging.Staging.stage = counted_stage
    pump = sender.Sender.pump

    def counted_pump(self):
        before = self._inflight
        pump(self)
        caller = sys._getframe(1).f_code.co_name
        if caller in ("credit", "_read_credits"):
            counts["from_credit"] = counts.get("from_credit", 0) + max(0, self._inflight - before)

    sender.Sender.pump = counted_pump
    let_go = getattr(sender.Sender, "_let_go_stale", None)
    if let_go is not None:
        def counted_let_go(self, now):
            held = len(self._pending)
            stale = let_go(self, now)
            counts["stale"] = counts.get("stale", 0) + held - len(self._pending)
            return stale

        sender.Sender._let_go_stale = counted_let_go


def _count_remote(counts: dict) -> None:
    from eglcuda.remote import receiver

    hand = getattr(receiver.Receiver, "_hand_credit", None) or receiver.Receiver._credit
    name = hand.__name__

    def counted(self, *args):
        counts["credit_hops"] = counts.get("credit_hops", 0) + 1
        return hand(self, *args)

    setattr(receiver.Receiver, name, counted)


def child(role: str, rest: list[str]) -> int:
    counts: dict = {}
    if role == "relay":
        _count_relay(counts)
    elif role == "remote":
        _count_remote(counts)
    atexit.register(lambda: print("COUNTS " + json.dumps(counts), flush=True))
    sys.path.insert(0, str(BENCH))
    import remote  # bench/remote.py

    sys.argv = [str(BENCH / "remote.py"), "--role", role, *SIZE, *rest]
    return int(remote.main() or 0)


class Proc:
    def __init__(self, role: str, *rest: str) -> None:
        self.p = subprocess.Popen([sys.executable, __file__, "child", role, *rest], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.lines: list[str] = []

    def expect(self, prefix: str, key: str | None = None) -> dict:
        assert self.p.stdout is not None
        for line in self.p.stdout:
            if line.startswith(prefix):
                body = json.loads(line[len(prefix):])
                if key is None or body.get("role") == key:
                    return body
        raise RuntimeError(f"no {prefix}{key or ''} line")

    def go(self, start: int, end: int) -> None:
        assert self.p.stdin is not None
        self.p.stdin.write(f"go {start} {end}\n")
        self.p.stdin.flush()

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(10)


def measure(duration: float) -> dict:
    env = {**os.environ, "UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n",
           "UCX_MODULES": "^cuda", "UCX_TCP_TX_SEG_SIZE": "256K", "UCX_TCP_RX_SEG_SIZE": "1M"}
    os.environ.update(env)
    with tempfile.TemporaryDirectory(prefix="eglcuda-handover-") as folder:
        os.chmod(folder, 0o700)
        path, key = os.path.join(folder, "t.topic"), os.path.join(folder, "key")
        with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "w") as handle:
            handle.write(secrets.token_hex(32))
        procs: list[Proc] = []
        try:
            pub = Proc("pub", "--path", path, "--rate", "0")
            procs.append(pub)
            pub.expect("RESULT ", "ready")
            relay = Proc("relay", "--path", path, "--key-file", key)
            procs.append(relay)
            port = relay.expect("RESULT ", "listening")["port"]
            sub = Proc("remote", "--port", str(port), "--key-file", key)
            procs.append(sub)
            sub.expect("RESULT ", "joined")
            time.sleep(0.5)
            start = time.monotonic_ns() + int(0.2e9)
            end = start + int(duration * 1e9)
            for proc in procs:
                proc.go(start, end)
            got = sub.expect("RESULT ", "remote")
            remote_counts = sub.expect("COUNTS ")
            said = relay.expect("RESULT ", "relay")
            relay_counts = relay.expect("COUNTS ")
        finally:
            for proc in procs:
                proc.stop()
    sys.path.insert(0, str(BENCH))
    import _ucx_raw

    raw = _ucx_raw.measure(115200, 3, "blocking", duration, env)
    sent = sum(r["sent"] for r in said["remotes"])
    return {"remote_fps": got["rate"], "raw_fps": raw["rate"], "frames": got["frames"], "sent": sent,
            **{k: round(v / max(1, sent), 3) for k, v in relay_counts.items()},
            **{k: round(v / max(1, sent), 3) for k, v in remote_counts.items()}}


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "child":
        return child(sys.argv[2], sys.argv[3:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    _needs.needs_module(__file__, "ucxx", _needs.UCXX_HOW)
    _needs.needs_cuda(__file__, hint="or the stand-in of tests/fakes in LD_LIBRARY_PATH, as "
                                     "research/probes/remote_handover_probe.sh builds it")
    row = measure(args.duration)
    print(f"{args.label:>7}: remote {row['remote_fps']:6.0f} frames/s, raw {row['raw_fps']:6.0f} "
          f"({row['remote_fps'] / row['raw_fps']:.2f}x); per frame sent: wakes {row.get('wakes', 0)}, stages "
          f"{row.get('stages', 0)}, from credit {row.get('from_credit', 0)}, stale {row.get('stale', 0)}; credit hops "
          f"{row.get('credit_hops', 0)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
