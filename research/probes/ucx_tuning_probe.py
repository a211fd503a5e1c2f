"""Which UCX settings and progress mode move a frame fastest between two processes over TCP
loopback (host buffers, no GPU): the engine under eglcuda's relay. Its findings are in
research/README.md (section "UCX (remote subscribers)") and docs/benchmarks.md.

Runs bench/_ucx_raw.py's sender/receiver pair (fresh processes per measurement) for each
configuration, interleaved over --reps rounds so that a loaded machine's drift hits every
configuration alike, and prints the median, min and max frames/s of each.

    python research/probes/ucx_tuning_probe.py [--size BYTES] [--duration S] [--reps N] [--grid NAME,...]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import _ucx_raw  # noqa: E402

import _needs  # noqa: E402  (research/probes/_needs.py: a missing need is one line and status 2)

BASE = {"UCX_TLS": "tcp", "UCX_NET_DEVICES": "lo", "UCX_WARN_UNUSED_ENV_VARS": "n"}
# name -> (window, mode, extra environment)
GRIDS = {
    "modes": {f"{mode} w{w}": (w, mode, {}) for mode in _ucx_raw.MODES for w in (1, 4)},
    "relay": {f"asyncio-blocking w{w}{name}": (w, "asyncio-blocking", extra) for w in (1, 3)
              for name, extra in (("", {}), (" tx 256K rx 1M", {"UCX_TCP_TX_SEG_SIZE": "256K", "UCX_TCP_RX_SEG_SIZE": "1M"}),
                                  (" proto v1", {"UCX_PROTO_ENABLE": "n"}))},
    "focus": {f"{mode} w{w}{name}": (w, mode, extra) for mode in ("blocking", "asyncio-blocking") for w in (1, 3)
              for name, extra in (("", {}), (" tx 256K rx 1M", {"UCX_TCP_TX_SEG_SIZE": "256K", "UCX_TCP_RX_SEG_SIZE": "1M"}))},
    "asyncio": {f"{mode} w{w} tx 256K rx 1M": (w, mode, {"UCX_TCP_TX_SEG_SIZE": "256K", "UCX_TCP_RX_SEG_SIZE": "1M"})
                for mode in ("asyncio-blocking", "asyncio-polling", "asyncio-thread", "thread") for w in (1, 3)},
    "future": {f"{mode} w{w} tx 256K rx 1M{name}": (w, mode, {"UCX_TCP_TX_SEG_SIZE": "256K", "UCX_TCP_RX_SEG_SIZE": "1M", **extra})
               for mode in ("asyncio-blocking", "asyncio-thread") for w in (1, 3)
               for name, extra in (("", {}), (" python futures", {"UCXPY_ENABLE_PYTHON_FUTURE": "1"}))},
    "seg": {f"blocking w1 tx {tx} rx {rx}": (1, "blocking", {"UCX_TCP_TX_SEG_SIZE": tx, "UCX_TCP_RX_SEG_SIZE": rx})
            for tx, rx in (("8K", "64K"), ("64K", "1M"), ("256K", "1M"), ("1M", "4M"))},
    "window": {f"blocking w{w}": (w, "blocking", {}) for w in (1, 2, 4, 8)},
    "tcp": {
        "default (tx 8K rx 64K)": (1, "blocking", {}),
        "tx 64K rx 256K": (1, "blocking", {"UCX_TCP_TX_SEG_SIZE": "64K", "UCX_TCP_RX_SEG_SIZE": "256K"}),
        "tx 256K rx 1M": (1, "blocking", {"UCX_TCP_TX_SEG_SIZE": "256K", "UCX_TCP_RX_SEG_SIZE": "1M"}),
        "sndbuf/rcvbuf 4M": (1, "blocking", {"UCX_TCP_SNDBUF": "4M", "UCX_TCP_RCVBUF": "4M"}),
        "rndv thresh inf (eager)": (1, "blocking", {"UCX_RNDV_THRESH": "inf"}),
        "rndv thresh 64K": (1, "blocking", {"UCX_RNDV_THRESH": "64K"}),
        "rndv frag host 4M": (1, "blocking", {"UCX_RNDV_FRAG_SIZE": "host:4M"}),
        "proto v1": (1, "blocking", {"UCX_PROTO_ENABLE": "n"}),
    },
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=1920 * 1080 * 3 // 2, help="bytes per frame (default 1080p NV12)")
    parser.add_argument("--duration", type=float, default=2.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--grid", default="modes,window,tcp")
    parser.add_argument("--json", help="also write every measurement here")
    args = parser.parse_args()
    _needs.needs_module(__file__, "ucxx", _needs.UCXX_HOW)
    configs = {f"{grid}: {name}": spec for grid in args.grid.split(",") for name, spec in GRIDS[grid].items()}
    results: dict[str, list[dict]] = {name: [] for name in configs}
    for rep in range(args.reps):
        for name, (window, mode, extra) in configs.items():
            try:
                result = _ucx_raw.measure(args.size, window, mode, args.duration, {**BASE, **extra})
            except Exception as exc:  # one failing setting must not hide the others
                result = {"error": " ".join(str(exc).split())[:200]}
            results[name].append(result)
            print(f"rep {rep} {name}: {result.get('rate', float('nan')):.0f} frames/s "
                  f"p50 {result.get('p50_us', float('nan')):.0f} us {result.get('error', '')}", file=sys.stderr, flush=True)
    print(f"size {args.size} bytes, {args.duration} s per run, {args.reps} interleaved reps; median (min-max) frames/s, "
          "GB/s, median p50/p99 send-to-ack us")
    for name, runs in results.items():
        rates = [r["rate"] for r in runs if "rate" in r]
        if not rates:
            print(f"| {name} | failed: {runs[0].get('error')} |")
            continue
        p50 = statistics.median(r["p50_us"] for r in runs if "rate" in r)
        p99 = statistics.median(r["p99_us"] for r in runs if "rate" in r)
        median = statistics.median(rates)
        print(f"| {name} | {median:.0f} ({min(rates):.0f}-{max(rates):.0f}) | {median * args.size / 1e9:.2f} | "
              f"{p50:.0f} / {p99:.0f} |")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"size": args.size, "results": results}, indent=1))
    return 1 if _needs.every_row_failed(r for runs in results.values() for r in runs) else 0  # nothing measured


if __name__ == "__main__":
    sys.exit(main())
