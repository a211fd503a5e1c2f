#!/bin/bash
# Session 7, second A/B on one H200: eglcuda/remote of a base commit ("old": bda9a8e, the callback frame path,
# brought along as old44/eglcuda/remote: `git archive bda9a8e eglcuda/remote | tar -x -C old44`, since the GPU
# machine's copy of the repository has the landed history only) against this checkout ("new": the relay's credit
# reader on callbacks, the remote subscriber's credit messages made once), alternating, three rounds, one remote
# subscriber flat out (1080p NV12), both with bench/runs/_diag44.py's instrumentation; the raw engine w3 from one
# buffer and from a ring of 12 in the first round.
set -u
ROOT=$PWD
source bench/runs/_remote_setup.sh $OUT
[ -d old44/eglcuda/remote ] || { echo "$0: needs old44/eglcuda/remote (see the top of this script)"; exit 2; }
rm -rf /tmp/old && mkdir -p /tmp/old && cp -r $ROOT/eglcuda $ROOT/pyproject.toml /tmp/old/ && rm -rf /tmp/old/eglcuda/remote \
  && cp -r old44/eglcuda/remote /tmp/old/eglcuda/remote
python3 bench/runs/_diag44.py /tmp/old; python3 bench/runs/_diag44.py $ROOT
echo "setup $(( $(date +%s) - T0 )) s; HEAD $(git rev-parse --short HEAD); $(nproc) cores; $(lscpu | grep 'Model name' | cut -c1-80)"
U="UCX_TCP_TX_SEG_SIZE=256K,UCX_TCP_RX_SEG_SIZE=1M"
summary() { python3 bench/runs/_ab_summary.py "$1" "$2"; }  # $1 label, $2 out dir
for round in 1 2 3; do
  for v in old new; do
    tree=$ROOT; [ $v = old ] && tree=/tmp/old
    variants=eglcuda; extra=""; [ $round = 1 ] && [ $v = old ] && { variants=eglcuda,ucx-raw; extra="--raw-rings 12"; }
    rm -f /tmp/ucxstats.*
    (cd $tree && PYTHONPATH=$tree:$PYTHONPATH timeout 120 python3 $ROOT/bench/remote.py --out $OUT/$v$round --sizes 1080p-nv12 \
      --duration 2 --subscribers 1 --rates max --variants $variants --engine-modes blocking $extra --ucx-env $U --no-plots \
      > $OUT/bench-$v$round.log 2>&1)
    echo "round $round $v rc=$? ($(( $(date +%s) - T0 )) s)"; grep -hE '^(PASS|FAIL|INFO 1080p-nv12:)' $OUT/bench-$v$round.log | cut -c1-160
    summary $v $OUT/$v$round; mkdir -p $OUT/stats-$v$round; cp /tmp/ucxstats.*.json $OUT/stats-$v$round/ 2>/dev/null
  done
done
tar czf $OUT/stats.tgz -C $OUT $(cd $OUT && ls -d stats-*) && rm -rf $OUT/stats-*
echo "total $(( $(date +%s) - T0 )) s"
