# Sourced by the remote run scripts (bash research/remote_runs/remote-*.sh), with the folder for their logs:
#   source research/remote_runs/_remote_setup.sh LOG_DIR
# Install this checkout and UCXX into the Python that runs the scripts (python3) first: pip install -e '.[remote-cu13]'
# (research/README.md, "Remote subscribers on a GPU", says how without network). Checks what a run needs (an NVIDIA
# GPU; this checkout's eglcuda with its compiled modules, UCXX and pyca/cryptography importable by python3); else one
# line naming what is missing and status 2. Creates LOG_DIR. Sets T0 (the start, for the scripts' timings); defines
# remote_tier, bench_row, patched_copy and knob_one (below).
command -v nvidia-smi > /dev/null || { echo "$0: needs an NVIDIA GPU machine (nvidia-smi not found); see research/README.md"; exit 2; }
missing=$(cd / && python3 - "$PWD" <<'EOF'
import importlib.util, os, sys
spec = importlib.util.find_spec("eglcuda")
home = spec and spec.origin and os.path.dirname(os.path.dirname(os.path.realpath(spec.origin)))
names = [] if home == os.path.realpath(sys.argv[1]) else ["this checkout's eglcuda"]
names += [name for name in ("ucxx", "cryptography") if importlib.util.find_spec(name) is None]
print(", ".join(names))
EOF
) || missing="a working python3"
ls eglcuda/_bind/_native*.so > /dev/null 2>&1 || missing="${missing:+$missing, }eglcuda's compiled modules in eglcuda/"
[ -z "$missing" ] || { echo "$0: needs $missing: install this checkout and UCXX into python3 first (pip install -e '.[remote-cu13]'; research/README.md)"; exit 2; }
T0=$(date +%s)
mkdir -p "$1"

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
# threads sampled, then its summary line; skipped once the run took KNOB_UNTIL_S seconds (when set):
#   knob_one LABEL VARIANTS UCX_ENV KNOB=VALUE...
knob_one() {
  local label=$1 variants=$2 ucx=$3; shift 3
  if [ -n "${KNOB_UNTIL_S:-}" ] && [ $(( $(date +%s) - T0 )) -ge $KNOB_UNTIL_S ]; then echo "$label: skipped (KNOB_UNTIL_S reached)"; return; fi
  python3 research/remote_runs/_threads45.py 2.5 2 $L/th-$label.json > /dev/null 2>&1 &
  local sampler=$!
  (cd /tmp/kt && env "$@" PYTHONPATH=/tmp/kt${PYTHONPATH:+:$PYTHONPATH} timeout 60 python3 $ROOT/bench/remote.py --out $L/$label --sizes 1080p-nv12 \
    --duration 3 --subscribers 1 --rates max --variants $variants --engine-modes blocking --ucx-env $ucx --no-plots \
    > $L/bench-$label.log 2>&1)
  local rc=$?; sleep 0.2; kill $sampler 2> /dev/null; wait $sampler 2> /dev/null
  [ $rc = 0 ] || echo "$label rc=$rc: $(tail -1 $L/bench-$label.log | cut -c1-150)"
  python3 research/remote_runs/_knobs_summary.py $label $L/$label $L/th-$label.json 2>&1 | cut -c1-230
}
