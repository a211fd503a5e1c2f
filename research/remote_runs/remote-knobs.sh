#!/bin/bash
# Run 2026-11-28 on one H200 at 262f8fe (the second such run; the first tried windows of 4 and 6, 4 in flight, a
# 60 us poll and 16 MB socket buffers: none helped): which knob moves one remote subscriber (1080p NV12, flat out)
# towards the raw engine, alternating, three rounds, each configuration 3 s with the threads of the relay and the remote subscriber
# sampled over 2 s of it (research/remote_runs/_threads45.py); the knobs (research/remote_runs/_knobs45.py) on a copy of this
# checkout: sends in flight (3: 1, 2), progress rounds a pass (4: 1, 8), the GIL's switch interval (5 ms: 0.5 ms).
# From the repository root, after the set-up _remote_setup.sh names (research/README.md):
#   bash research/remote_runs/remote-knobs.sh [OUT_DIR]     (or OUT=...; default research-out/remote-knobs)
# The logs end up in OUT_DIR/logs.tgz.
set -u
OUT=${1:-${OUT:-research-out/remote-knobs}}; mkdir -p "$OUT"
ROOT=$PWD; L=/tmp/logs; mkdir -p $L
source research/remote_runs/_remote_setup.sh $L
patched_copy /tmp/kt research/remote_runs/_knobs45.py
echo "setup $(( $(date +%s) - T0 )) s; HEAD $(git rev-parse --short HEAD) + working tree; $(nproc) cores"
U="UCX_TCP_TX_SEG_SIZE=256K,UCX_TCP_RX_SEG_SIZE=1M"
B="UCX_TCP_SNDBUF=16M,UCX_TCP_RCVBUF=16M"
one() { knob_one "$@"; }  # label, variants, ucx-env, knob settings... (_remote_setup.sh)
for round in 1 2 3; do
  echo "== round $round ($(( $(date +%s) - T0 )) s)"
  one raw$round ucx-raw $U X=0
  one base$round eglcuda $U X=0
  one a1-$round eglcuda $U EGLX_AHEAD=1
  one a2-$round eglcuda $U EGLX_AHEAD=2
  one r1-$round eglcuda $U EGLX_ROUNDS=1
  one r8-$round eglcuda $U EGLX_ROUNDS=8
  one sw500-$round eglcuda $U EGLX_SWITCH_US=500
done
# Where the engine threads' time goes (when py-spy is installed: on PATH, or named by PY_SPY): py-spy on the relay and
# the remote subscriber, 400 samples a second for 2 s with native frames, the code as it is, flat out.
SPY=${PY_SPY:-$(command -v py-spy || true)}
if [ -n "$SPY" ] && [ -x "$SPY" ]; then
  (cd /tmp/kt && PYTHONPATH=/tmp/kt${PYTHONPATH:+:$PYTHONPATH} timeout 60 python3 $ROOT/bench/remote.py --out $L/spy --sizes 1080p-nv12 \
    --duration 5 --subscribers 1 --rates max --variants eglcuda --ucx-env $U --no-plots > $L/bench-spy.log 2>&1) &
  for i in $(seq 100); do R=$(pgrep -f "[-]-role relay " | head -1); S=$(pgrep -f "[-]-role remote " | head -1)
    [ -n "$R" ] && [ -n "$S" ] && break; sleep 0.1; done
  sleep 2.5
  $SPY record -p $R -r 400 -d 2 --native --threads -f raw -o $L/spy-relay.txt > $L/spy-relay.log 2>&1 &
  $SPY record -p $S -r 400 -d 2 --native --threads -f raw -o $L/spy-remote.txt > $L/spy-remote.log 2>&1
  wait; echo "py-spy: $(tail -1 $L/spy-relay.log | cut -c1-100) / $(wc -l < $L/spy-remote.txt) stacks"
  python3 research/remote_runs/_knobs_summary.py spy $L/spy
fi
tar czf "$OUT/logs.tgz" -C /tmp logs
echo "total $(( $(date +%s) - T0 )) s"
