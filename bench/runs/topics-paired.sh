#!/bin/bash
# Device run 43 (issue 43, "Performance may only go up"): bench/topics.py, the tree before the
# topics restructure (.old = 4232a0b, built into /tmp/oldsite) against this tree, alternating in
# one run, 3 rounds, 1080p NV12, N = 1, 4, 8, qos every and latest, the cuda-ipc transport and the
# hand-written CUDA IPC ring; without MPS, then under a private MPS daemon (every only).
# Checks: publisher CPU us/frame at N=8 (goal <= 25), cuda-ipc frames/s >= ipc-ring in each
# 'every' cell ("vs ring" >= 1), ratios this tree / 4232a0b per cell.
# Also: the GPU topics tests of the changed delivery paths (gpu-tests.log).
# Carry [".device", ".old"]. Expected: about 7 minutes (setup and the old build 1-2, the GPU tests about 1, the bench
# without MPS about 3 (46 configurations), under MPS about 2 (27)); the timeouts bound it at about 9.5. results.json is written after each
# configuration, so a bench cut short still leaves its rows and comparison.
set -u
command -v nvidia-smi > /dev/null || { echo "$0: needs an NVIDIA GPU machine (nvidia-smi not found); see bench/runs/README.md"; exit 2; }
[ -f .device/setup.sh ] || { echo "$0: needs .device/ staged in the repository root (bench/runs/README.md)"; exit 2; }
source .device/setup.sh > $OUT/setup.log 2>&1
tail -1 $OUT/setup.log
python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/oldsite ./.old > $OUT/oldbuild.log 2>&1 \
  || { echo "old build failed"; tail -3 $OUT/oldbuild.log; }
# The changed delivery paths on the real driver first (hand-out, skips and NOTICEs, drops, a slot's readers).
EGLCUDA_REQUIRE_GPU=1 timeout 100 python3 -m pytest tests/gpu/test_topics.py -q -p no:cacheprovider \
  -k "fanout or slot_not_written or killed_while_others or late_join or write_still_running" > $OUT/gpu-tests.log 2>&1
echo "gpu topics tests rc=$?"; tail -1 $OUT/gpu-tests.log
B="--sizes 1080p-nv12 --subscribers 1,4,8 --duration 1 --transports cuda-ipc,ipc-ring --rounds 3 --baseline /tmp/oldsite"
timeout 230 python3 bench/topics.py $B --qos every,latest --out /tmp/b-off > $OUT/bench-off.log 2>&1; echo "bench (MPS off) rc=$?"
timeout 160 python3 bench/topics.py $B --qos every --mps --out /tmp/b-mps > $OUT/bench-mps.log 2>&1; echo "bench (MPS on) rc=$?"
for m in off mps; do
  cp /tmp/b-$m/results.json $OUT/$m.json 2>/dev/null  # (the tables are in bench-$m.log; $OUT holds 7 files)
done
grep -h "ERROR\|Traceback\|Error" $OUT/bench-off.log $OUT/bench-mps.log | head -5
python3 - "$OUT" <<'PY'
import json, math, os, sys
def f(v, d=1):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{d}f}"
print(f"{'mps':<4}{'qos':<7}{'transport':<10}{'N':>2} {'fps now':>8} {'fps old':>8} {'x':>6} {'cpu now':>8} {'cpu old':>8} {'x':>6} {'p50':>7} {'p99':>8} {'vs ring':>7}")
for mode in ("off", "mps"):
    path = os.path.join(sys.argv[1], f"{mode}.json")
    if not os.path.exists(path):
        print(f"{mode}: no results"); continue
    for c in json.load(open(path)).get("comparison", []):
        now, old, r = c.get("current", {}), c.get("baseline", {}), c.get("ratio", {})
        print(f"{mode:<4}{c['qos']:<7}{c['transport']:<10}{c['n']:>2} {f(now.get('publisher_rate'),0):>8} "
              f"{f(old.get('publisher_rate'),0):>8} {f(r.get('publisher_rate'),2):>6} {f(now.get('publisher_cpu_us')):>8} "
              f"{f(old.get('publisher_cpu_us')):>8} {f(r.get('publisher_cpu_us'),2):>6} {f(now.get('p50_us')):>7} "
              f"{f(now.get('p99_us')):>8} {f(c.get('vs_ring'),2):>7}")
PY
