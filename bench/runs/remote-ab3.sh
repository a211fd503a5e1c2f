#!/bin/bash
# Session 7, third A/B on one H200: eglcuda/remote of bda9a8e ("old": the callback frame path, brought along as
# old44/eglcuda/remote: `git archive bda9a8e eglcuda/remote | tar -x -C old44`, since the GPU machine's copy of
# the repository has the landed history only) against this checkout ("new": the relay reuses the staging buffer
# freed last, LIFO), alternating, three rounds, one remote subscriber flat out (1080p NV12), both with
# bench/runs/_diag44.py's instrumentation; in every round the raw engine w3 from one buffer and from rings of 4
# and 12, w1. Then the GPU remote tier and the remote sample on a clean copy of this checkout.
set -u
ROOT=$PWD
source bench/runs/_remote_setup.sh $OUT
[ -d old44/eglcuda/remote ] || { echo "$0: needs old44/eglcuda/remote (see the top of this script)"; exit 2; }
rm -rf /tmp/clean && cp -r $ROOT /tmp/clean
rm -rf /tmp/old && mkdir -p /tmp/old && cp -r $ROOT/eglcuda $ROOT/pyproject.toml /tmp/old/ && rm -rf /tmp/old/eglcuda/remote \
  && cp -r old44/eglcuda/remote /tmp/old/eglcuda/remote
python3 bench/runs/_diag44.py /tmp/old; python3 bench/runs/_diag44.py $ROOT
echo "setup $(( $(date +%s) - T0 )) s; HEAD $(git rev-parse --short HEAD); $(nproc) cores; $(lscpu | grep 'Model name' | cut -c1-80)"
U="UCX_TCP_TX_SEG_SIZE=256K,UCX_TCP_RX_SEG_SIZE=1M"
summary() { python3 bench/runs/_ab_summary.py "$1" "$2"; }  # $1 label, $2 out dir
for round in 1 2 3; do
  for v in old new; do
    tree=$ROOT; [ $v = old ] && tree=/tmp/old
    variants=eglcuda; extra=""; [ $v = old ] && { variants=eglcuda,ucx-raw; extra="--raw-rings 4,12"; }
    rm -f /tmp/ucxstats.*
    (cd $tree && PYTHONPATH=$tree:$PYTHONPATH timeout 120 python3 $ROOT/bench/remote.py --out $OUT/$v$round --sizes 1080p-nv12 \
      --duration 2 --subscribers 1 --rates max --variants $variants --engine-modes blocking $extra --ucx-env $U --no-plots \
      > $OUT/bench-$v$round.log 2>&1)
    echo "round $round $v rc=$? ($(( $(date +%s) - T0 )) s)"; grep -hE '^(PASS|FAIL|INFO 1080p-nv12:)' $OUT/bench-$v$round.log | cut -c1-160
    summary $v $OUT/$v$round; mkdir -p $OUT/stats-$v$round; cp /tmp/ucxstats.*.json $OUT/stats-$v$round/ 2>/dev/null
  done
done
tar czf $OUT/stats.tgz -C $OUT $(cd $OUT && ls -d stats-*) && rm -rf $OUT/stats-*
(cd /tmp/clean && PYTHONPATH=/tmp/clean:$PYTHONPATH EGLCUDA_REQUIRE_GPU=1 timeout 200 python3 -m pytest tests/gpu/test_remote.py \
  tests/unit/remote -q -ra -p no:cacheprovider > $OUT/tests.log 2>&1; echo "remote tests (clean copy) rc=$?"; \
  grep -E "^(FAILED|ERROR)|^SKIPPED" $OUT/tests.log | cut -c1-200 | head; tail -1 $OUT/tests.log; \
  PYTHONPATH=/tmp/clean:$PYTHONPATH timeout 40 python3 samples/remote_subscriber.py --frames 300 > $OUT/sample.log 2>&1; \
  echo "remote sample rc=$?"; tail -2 $OUT/sample.log)
echo "total $(( $(date +%s) - T0 )) s"
