# Sourced by the remote run scripts (bash bench/runs/remote-*.sh), with the folder for the set-up logs:
#   source bench/runs/_remote_setup.sh LOG_DIR
# Checks what a run needs (a GPU machine, .device/ and the UCXX wheels staged: bench/runs/README.md; else
# one line and status 2), builds and installs the checkout (.device/setup.sh), installs the wheels into
# /tmp/ucxx and puts them on PYTHONPATH. Sets T0 (the start, for the scripts' timings).
command -v nvidia-smi > /dev/null || { echo "$0: needs an NVIDIA GPU machine (nvidia-smi not found); see bench/runs/README.md"; exit 2; }
[ -f .device/setup.sh ] || { echo "$0: needs .device/ staged in the repository root (bench/runs/README.md)"; exit 2; }
ls .wheels/*.whl > /dev/null 2>&1 || { echo "$0: needs the UCXX wheels in .wheels/ (bench/runs/README.md says how to get them)"; exit 2; }
T0=$(date +%s)
mkdir -p "$1"
source .device/setup.sh > "$1/setup.log" 2>&1; tail -1 "$1/setup.log"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ucxx .wheels/*.whl > "$1/ucxx-install.log" 2>&1 \
  || tail -3 "$1/ucxx-install.log"
export PYTHONPATH=/tmp/ucxx${PYTHONPATH:+:$PYTHONPATH}
