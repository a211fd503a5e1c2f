"""A stand-in for ``nvidia-cuda-mps-server`` (see control.py): logs its start to server.log and
runs until its control daemon stops it (SIGTERM; ignored in FAKE_MPS_MODE=stubborn)."""
import os
import signal
import time

LOG = os.environ.get("CUDA_MPS_LOG_DIRECTORY") or "/var/log/nvidia-mps"
with open(os.path.join(LOG, "server.log"), "a") as f:
    f.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}.000 Other {os.getpid():5d}] Startup\n")
if os.environ.get("FAKE_MPS_MODE") == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    time.sleep(60)
