# Sourced by the remote run scripts (bash research/remote_runs/remote-*.sh), with the folder for the set-up logs:
#   source research/remote_runs/_remote_setup.sh LOG_DIR
# Checks what a run needs (a GPU machine, .device/ and the UCXX wheels staged: research/README.md; else
# one line and status 2), builds and installs the checkout (.device/setup.sh), installs the wheels into
# /tmp/ucxx and puts them on PYTHONPATH. Sets T0 (the start, for the scripts' timings); defines remote_tier,
# bench_row, patched_copy and knob_one (below).
command -v nvidia-smi > /dev/null || { echo "$0: needs an NVIDIA GPU machine (nvidia-smi not found); see research/README.md"; exit 2; }
[ -f .device/setup.sh ] || { echo "$0: needs .device/ staged in the repository root (research/README.md)"; exit 2; }
ls .wheels/*.whl > /dev/null 2>&1 || { echo "$0: needs the UCXX wheels in .wheels/ (research/README.md says how to get them)"; exit 2; }
T0=$(date +%s)
mkdir -p "$1"
source .device/setup.sh > "$1/setup.log" 2>&1; tail -1 "$1/setup.log"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ucxx .wheels/*.whl > "$1/ucxx-install.log" 2>&1 \
  || tail -3 "$1/ucxx-install.log"
export PYTHONPATH=/tmp/ucxx${PYTHONPATH:+:$PYTHONPATH}

# The GPU remote tier (thread mode unless EGLCUDA_UCX_PROGRESS says otherwise), its log in $1, at most $2 s:
#   remote_tier $L/tests-thread.log 170
remote_tier() {
  EGLCUDA_REQUIRE_GPU=1 timeout "$2" python3 -m pytest tests/gpu/test_remote.py tests/unit/remote -q -ra -p no:cacheprovider > "$1" 2>&1
  echo "remote tests (${EGLCUDA_UCX_PROGRESS:-thread}) rc=$? ($(( $(date +%s) - T0 )) s)"
  grep -E "^(FAILED|ERROR)|^SKIPPED" "$1" | cut -c1-200 | head; tail -1 "$1"
}

# bench/remote.py into $L/LABEL with the UCX settings in $U, at most LIMIT s; then its goal lines and its table:
#   bench_row LABEL LIMIT bench/remote.py arguments...
bench_row() {
  local label=$1 limit=$2; shift 2
  timeout "$limit" python3 bench/remote.py --out $L/$label --ucx-env $U --no-plots "$@" > $L/bench-$label.log 2>&1
  echo "bench $label rc=$? ($(( $(date +%s) - T0 )) s)"; grep -hE '^(PASS|FAIL|INFO)' $L/bench-$label.log | cut -c1-240
  grep -h '^|' $L/$label/results.md | grep -v "^| size\|^|--" | cut -c1-170
}

# A copy of the checkout's package in DIR with an experiment script of research/remote_runs applied (_knobs45.py, _trace46.py):
#   patched_copy /tmp/kt research/remote_runs/_knobs45.py
patched_copy() {
  rm -rf "$1" && mkdir -p "$1" && cp -r $ROOT/eglcuda $ROOT/pyproject.toml "$1"/ && python3 "$2" "$1"
}

# One knob configuration of a knob run (research/remote_runs/_knobs45.py applied to a copy in /tmp/kt; $ROOT the checkout,
# $L the logs): bench/remote.py 1080p NV12, 1 remote flat out for 3 s with the relay's and the remote subscriber's
# threads sampled, then its summary line; skipped once the call ran KNOB_UNTIL_S seconds (when set):
#   knob_one LABEL VARIANTS UCX_ENV KNOB=VALUE...
knob_one() {
  local label=$1 variants=$2 ucx=$3; shift 3
  if [ -n "${KNOB_UNTIL_S:-}" ] && [ $(( $(date +%s) - T0 )) -ge $KNOB_UNTIL_S ]; then echo "$label: skipped (the call's time)"; return; fi
  python3 research/remote_runs/_threads45.py 2.5 2 $L/th-$label.json > /dev/null 2>&1 &
  local sampler=$!
  (cd /tmp/kt && env "$@" PYTHONPATH=/tmp/kt:$PYTHONPATH timeout 60 python3 $ROOT/bench/remote.py --out $L/$label --sizes 1080p-nv12 \
    --duration 3 --subscribers 1 --rates max --variants $variants --engine-modes blocking --ucx-env $ucx --no-plots \
    > $L/bench-$label.log 2>&1)
  local rc=$?; sleep 0.2; kill $sampler 2> /dev/null; wait $sampler 2> /dev/null
  [ $rc = 0 ] || echo "$label rc=$rc: $(tail -1 $L/bench-$label.log | cut -c1-150)"
  python3 research/remote_runs/_knobs_summary.py $label $L/$label $L/th-$label.json 2>&1 | cut -c1-230
}
