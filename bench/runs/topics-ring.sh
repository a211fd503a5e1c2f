#!/bin/bash
# Device run shm43 (issue 43, frames announced and releases returned through a shared-memory ring per
# subscriber, branch shm43): the GPU topics and ordering tests, the fan-out sample, and the paired
# bench against the hand-written CUDA IPC ring (1080p NV12, cuda-ipc, qos every, N = 1 and 8, 3 rounds)
# without and with MPS.
# Checks: every GPU topics/ordering test passes (every byte of every frame through cuda-ipc, cuda-vmm,
# eglstream; ordering joins); topic_fanout exits 0; publisher CPU us/frame at N = 8 (goal <= 25, was
# 35-46); cuda-ipc frames/s against the ipc-ring at N = 1 ("vs ring", goal >= 1.0, was 0.90 without
# MPS, 0.65 under MPS). Total bounded by the timeouts: about 8.5 minutes (setup ~1, tests <= 250 s,
# sample <= 40 s, benches <= 50 s each).
set -u
command -v nvidia-smi > /dev/null || { echo "$0: needs an NVIDIA GPU machine (nvidia-smi not found); see bench/runs/README.md"; exit 2; }
[ -f .device/setup.sh ] || { echo "$0: needs .device/ staged in the repository root (bench/runs/README.md)"; exit 2; }
T0=$(date +%s)
source .device/setup.sh > $OUT/setup.log 2>&1; tail -1 $OUT/setup.log
echo "setup $(( $(date +%s) - T0 )) s"
EGLCUDA_REQUIRE_GPU=1 timeout 250 python3 -m pytest tests/gpu/test_topics.py tests/gpu/test_ordering.py -q -ra -p no:cacheprovider --durations=8 > $OUT/topics.log 2>&1
echo "topics+ordering rc=$? ($(( $(date +%s) - T0 )) s)"; grep -E "^(FAILED|ERROR)" $OUT/topics.log | cut -c1-200 | head; grep -E "^SKIPPED" $OUT/topics.log | cut -c1-160 | head -5; tail -1 $OUT/topics.log
timeout 40 python3 samples/topic_fanout.py > $OUT/fanout.log 2>&1
echo "topic_fanout rc=$? ($(( $(date +%s) - T0 )) s)"; tail -4 $OUT/fanout.log
B="--sizes 1080p-nv12 --subscribers 1,8 --duration 1 --transports cuda-ipc,ipc-ring --rounds 3 --qos every"
timeout 50 python3 bench/topics.py $B --out /tmp/b-off > $OUT/bench-off.log 2>&1; echo "bench (MPS off) rc=$? ($(( $(date +%s) - T0 )) s)"
timeout 50 python3 bench/topics.py $B --mps --out /tmp/b-mps > $OUT/bench-mps.log 2>&1; echo "bench (MPS on) rc=$? ($(( $(date +%s) - T0 )) s)"
for m in off mps; do cp /tmp/b-$m/results.json $OUT/$m.json 2>/dev/null; done
grep -h "ERROR\|Traceback\|Error" $OUT/bench-off.log $OUT/bench-mps.log | head -5
# Each configuration's line (rates, p50/p99, CPU us/frame of publisher and subscribers), then the medians.
for m in off mps; do echo "== MPS $m"; grep -E "^1080p" $OUT/bench-$m.log | cut -c1-230; done
python3 - "$OUT" <<'PY'
import json, math, os, statistics, sys
def f(v, d=1):
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{d}f}"
print(f"{'mps':<4}{'transport':<10}{'N':>2} {'fps':>8} {'pub cpu us':>10} {'sub cpu us':>10} {'p50':>7} {'p99':>8} {'vs ring':>7}")
for mode in ("off", "mps"):
    path = os.path.join(sys.argv[1], f"{mode}.json")
    if not os.path.exists(path):
        print(f"{mode}: no results"); continue
    rows = [r for r in json.load(open(path)).get("rows", []) if not r.get("paired") and r.get("qos") == "every"]
    cells = {}
    for r in rows:
        cells.setdefault((r.get("transport"), r.get("n")), []).append(r)
    def med(rs, key):
        vals = [r[key] for r in rs if isinstance(r.get(key), (int, float))]
        return statistics.median(vals) if vals else None
    for (transport, n), rs in sorted(cells.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] or 0)):
        ring = cells.get(("ipc-ring", n), [])
        rate, ring_rate = med(rs, "publisher_rate"), med(ring, "publisher_rate")
        vs = rate / ring_rate if rate and ring_rate and transport != "ipc-ring" else None
        print(f"{mode:<4}{transport:<10}{n:>2} {f(rate,0):>8} {f(med(rs,'publisher_cpu_us')):>10} {f(med(rs,'subscriber_cpu_us')):>10} "
              f"{f(med(rs,'p50_us')):>7} {f(med(rs,'p99_us')):>8} {f(vs,2):>7}")
PY
echo "total $(( $(date +%s) - T0 )) s"
