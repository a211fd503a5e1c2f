#!/bin/bash
# One H200, thread mode: a 'latest' relay that receives on the engine's thread as a remote gets room (the package as it
# is: "pull") against the same package with its local thread receiving every frame as before ("base") and with the
# room also renewed as each send ends ("renew"); research/remote_runs/_pull_ab.py makes the two copies. One remote
# flat out; rounds interleaved, the raw engine in each: ROUNDS_SMALL at 320x240 NV12 with VARIANTS (default "base pull
# renew"), then ROUNDS_1080 at 1080p NV12 (base, pull), stopping once the run took UNTIL_S seconds. Run after
# `source research/remote_runs/_remote_setup.sh LOG_DIR` in the same shell, L the log folder:
#   L=... T0=$T0 ROUNDS_SMALL=5 ROUNDS_1080=0 bash research/remote_runs/remote-pull.sh
set -u
ROOT=$PWD; L=${L:?the log folder}; UNTIL_S=${UNTIL_S:-500}; T0=${T0:-$(date +%s)}
ROUNDS_SMALL=${ROUNDS_SMALL:-5}; ROUNDS_1080=${ROUNDS_1080:-1}; VARIANTS=${VARIANTS:-base pull renew}
for v in base pull renew; do rm -rf /tmp/ab-$v && mkdir -p /tmp/ab-$v && cp -r $ROOT/eglcuda $ROOT/pyproject.toml /tmp/ab-$v/; done
python3 research/remote_runs/_pull_ab.py /tmp/ab-base base && python3 research/remote_runs/_pull_ab.py /tmp/ab-renew renew || exit 1
late() { [ $(( $(date +%s) - T0 )) -ge $UNTIL_S ]; }
ab() {  # ab LABEL base|pull|renew|raw bench/remote.py arguments...
  local label=$1 v=$2; shift 2
  local variants=eglcuda dir=/tmp/ab-$v
  if [ $v = raw ]; then variants=ucx-raw; dir=/tmp/ab-pull; fi
  (cd $dir && PYTHONPATH=$dir${PYTHONPATH:+:$PYTHONPATH} timeout 90 python3 $ROOT/bench/remote.py --out $L/$label --subscribers 1 \
    --rates max --variants $variants --engine-modes blocking --no-plots "$@" > $L/bench-$label.log 2>&1)
  echo "$label rc=$? $(grep -h '^|' $L/$label/results.md 2>/dev/null | grep -v '^| size\|^|--' | cut -c1-170 | tr '\n' ' ')"
}
S="--width 320 --height 240 --rounds 1 --duration 2"
for round in $(seq 1 $ROUNDS_SMALL); do
  late && break
  echo "== 320x240 round $round ($(( $(date +%s) - T0 )) s)"
  ab raw-$round raw $S; for v in $VARIANTS; do ab $v-$round $v $S; done
done
H="--sizes 1080p-nv12 --rounds 1 --duration 2 --ucx-env UCX_TCP_TX_SEG_SIZE=256K,UCX_TCP_RX_SEG_SIZE=1M"
for round in $(seq 1 $ROUNDS_1080); do
  late && break
  echo "== 1080p round $round ($(( $(date +%s) - T0 )) s)"
  ab raw1080-$round raw $H; ab base1080-$round base $H; ab pull1080-$round pull $H
done
echo "total $(( $(date +%s) - T0 )) s"
