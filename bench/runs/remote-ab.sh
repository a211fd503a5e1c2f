#!/bin/bash
# Session 7, issue 44's 0.8x goal on one H200: a base commit ("old": $1, default abfc493, main before the callback
# frame path) against this checkout ("new": at the run, the working tree on abfc493 with a staged frame
# reserved until dispatched, so the relay's local thread never copies a frame only to skip it; the frame path on
# UCX completion callbacks instead of a task and future per message), alternating, two rounds, one remote
# subscriber flat out (1080p NV12), both with bench/runs/_diag44.py's instrumentation (threads' CPU, engine
# passes); the raw engine w3 from one buffer and from a ring of 12 in the same run; then a py-spy profile of "new".
set -u
ROOT=$PWD
source bench/runs/_remote_setup.sh $OUT
git worktree add -f --detach /tmp/old "${1:-abfc493}" > /dev/null 2>&1 || echo "no worktree"
(cd $ROOT && find eglcuda -name "*.so" -exec cp {} /tmp/old/{} \;)
python3 bench/runs/_diag44.py /tmp/old; python3 bench/runs/_diag44.py $ROOT
echo "setup $(( $(date +%s) - T0 )) s; HEAD $(git rev-parse --short HEAD); $(nproc) cores; $(lscpu | grep 'Model name' | cut -c1-80)"
U="UCX_TCP_TX_SEG_SIZE=256K,UCX_TCP_RX_SEG_SIZE=1M"
summary() { python3 bench/runs/_ab_summary.py "$1" "$2"; }  # $1 label, $2 out dir
for round in 1 2; do
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
if [ -x /tmp/ucxx/bin/py-spy ]; then
  timeout 90 /tmp/ucxx/bin/py-spy record --subprocesses --idle --format raw -r 200 -o $OUT/new.prof -- \
    python3 bench/remote.py --out /tmp/prof --sizes 1080p-nv12 --duration 2 --subscribers 1 --rates max --variants eglcuda \
    --ucx-env $U --no-plots > $OUT/pyspy.log 2>&1; echo "py-spy rc=$? ($(( $(date +%s) - T0 )) s)"; tail -2 $OUT/pyspy.log
fi
echo "total $(( $(date +%s) - T0 )) s"
