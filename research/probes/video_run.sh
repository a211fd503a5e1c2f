#!/bin/bash
# Research record (see research/README.md): open, not yet run (written 2026-11-23 without a GPU).
#
# The video pipeline's first GPU run, in one script (docs/video.md). From the repository root of a
# checkout, on a machine with an NVIDIA GPU:
#
#   bash research/probes/video_run.sh [OUT_DIR]     (or OUT=...; default research-out/video-run)
#
# Install the checkout into the Python that runs it (python3) first (pip install -e .), and make the
# clips of tests/data/generated beforehand (`python tests/data/make_clips.py --bench`: 10 MB).
# PyNvVideoCodec (2.2.4) and PyAV (18.1.0) are either installed in that Python too or their wheels
# are in .whl/ (pip download --no-deps -d .whl PyNvVideoCodec==2.2.4 av==18.1.0), which step 1
# installs into /tmp/site2. Where one of these is missing, the script names it in one line and
# exits with status 2. Writes every log and result under OUT_DIR and prints one line per step.
# Each step has its own time limit; together at most 470 s.
#
#   1. install the two wheels of .whl/ into /tmp/site2 (when there are any)
#   2. research/probes/nvdec_probe.py: what NVDEC hands out (layout, buffer reuse, locked frames,
#      contexts, NVDEC vs the CPU decoder bit for bit, decode rates)
#   3. tests/gpu/test_video.py: every subscriber checks every frame against the decoder's
#   4. samples/video_pipeline.py on the committed 320x240 clip (at its 30 fps, all subscribers, --check)
#   5. samples/video_pipeline.py on the generated 1080p60 clip (--max, all subscribers, --check)
#   6. bench/video.py --quick: 1080p and 4K, every row
set -u
command -v nvidia-smi > /dev/null || { echo "$0: needs an NVIDIA GPU machine (nvidia-smi not found)"; exit 2; }
ls eglcuda/_bind/_native*.so > /dev/null 2>&1 && python3 -c "import eglcuda" 2> /dev/null \
  || { echo "$0: needs this checkout installed into python3, run from its root (pip install -e .)"; exit 2; }
ls .whl/*.whl > /dev/null 2>&1 || python3 -c "import PyNvVideoCodec, av" 2> /dev/null \
  || { echo "$0: needs PyNvVideoCodec and PyAV in python3, or their wheels in .whl/ (pip download --no-deps -d .whl PyNvVideoCodec==2.2.4 av==18.1.0)"; exit 2; }
OUT=${1:-${OUT:-research-out/video-run}}
mkdir -p "$OUT"
export PYOPENGL_PLATFORM=egl EGLCUDA_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
CLIP=tests/data/index_320x240_h264.mp4
CLIP_1080=tests/data/generated/bench_1920x1080p60_h264.mp4
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"

say() { echo "$*" | tee -a "$SUMMARY"; }

# step NAME LIMIT_S COMMAND...: runs COMMAND with its output in $OUT/NAME.log, says its status and time.
step() {
  local name=$1 limit=$2
  shift 2
  local started=$SECONDS
  timeout -k 5 "$limit" "$@" > "$OUT/$name.log" 2>&1
  local status=$?
  local note=""
  [ $status -eq 124 ] || [ $status -eq 137 ] && note=" (TIMED OUT after ${limit} s)"
  say "$name: exit $status in $((SECONDS - started)) s$note"
  [ $status -eq 0 ] || tail -n 2 "$OUT/$name.log" | cut -c1-300 | sed "s/^/  $name| /" | tee -a "$SUMMARY"
  return $status
}

# 1. the wheels ------------------------------------------------------------------------------------
if ls .whl/*.whl > /dev/null 2>&1; then
  started=$SECONDS
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site2 .whl/*.whl > "$OUT/install.log" 2>&1
  say "install: exit $? in $((SECONDS - started)) s ($(ls .whl 2>/dev/null | tr '\n' ' '))"
  export PYTHONPATH=/tmp/site2${PYTHONPATH:+:$PYTHONPATH}
else
  say "install: none (.whl/ is empty; PyNvVideoCodec and PyAV come from python3)"
fi
timeout 60 python3 - > "$OUT/versions.txt" 2>&1 <<'EOF'
import importlib, sys
sys.path.insert(0, "samples")
import _video
nvc, why = _video.import_nvc()
print("PyNvVideoCodec:", getattr(nvc, "__version__", None) or why)
for name in ("av", "torch", "cupy", "matplotlib", "OpenGL"):
    try:
        print(f"{name}:", getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as exc:
        print(f"{name}: MISSING ({type(exc).__name__}: {exc})")
EOF
say "versions: $(tr '\n' ';' < "$OUT/versions.txt" | cut -c1-300)"
nvidia-smi --query-gpu=name,driver_version,clocks.max.video --format=csv,noheader > "$OUT/gpu.txt" 2>&1
say "gpu: $(head -1 "$OUT/gpu.txt")"
for clip in "$CLIP_1080" tests/data/generated/bench_3840x2160p60_h264.mp4; do
  [ -f "$clip" ] || say "MISSING $clip: make it with python tests/data/make_clips.py --bench"
done

# 2. the probe ------------------------------------------------------------------------------------
step probe 50 python3 research/probes/nvdec_probe.py --bench "$CLIP_1080"
grep -E "frames, .* mismatched|FAILED|overwritten|never overwritten|distinct buffers|CHANGED|primary: |own context|frames/s" \
  "$OUT/probe.log" | cut -c1-200 | head -20 | tee -a "$SUMMARY"

# 3. the GPU test ---------------------------------------------------------------------------------
step test 120 python3 -m pytest tests/gpu/test_video.py -q -ra -s -p no:cacheprovider --junitxml="$OUT/junit.xml"
grep -E "^(FAILED|ERROR|SKIPPED)|bit-exact|passed|failed" "$OUT/test.log" | cut -c1-250 | head -12 | tee -a "$SUMMARY"

# 4. the sample on the committed clip, at its frame rate --------------------------------------------
step sample_clip 40 python3 samples/video_pipeline.py "$CLIP" --check --out "$OUT/sample_clip"
grep -E "^(decoder|infer|gl|stats) |PASS|FAIL|^samples/" "$OUT/sample_clip.log" | grep -v "^RESULT" | cut -c1-250 \
  | head -8 | tee -a "$SUMMARY"

# 5. the sample on the 1080p clip, as fast as it goes ------------------------------------------------
if [ -f "$CLIP_1080" ]; then
  step sample_1080p 50 python3 samples/video_pipeline.py "$CLIP_1080" --max --check --out "$OUT/sample_1080p"
  grep -E "^(decoder|infer|gl|stats) |PASS|FAIL|^samples/" "$OUT/sample_1080p.log" | grep -v "^RESULT" | cut -c1-250 \
    | head -8 | tee -a "$SUMMARY"
fi

# 6. the benchmark ----------------------------------------------------------------------------------
step bench 200 python3 bench/video.py --quick --out "$OUT/bench"
grep -E "ERROR|SUMMARY" "$OUT/bench.log" | cut -c1-600 | head -8 | tee -a "$SUMMARY"
say "done in $SECONDS s; logs and results in $OUT"
