"""Experiment knobs research/remote_runs/remote-knobs.sh and remote-window.sh apply to a copy of the package for one run (never committed
into the package): each is read from the environment when the module loads, the default is the code as it is.

    EGLX_WINDOW=N     frames a relay sends ahead of a 'latest' remote's credits (wire.LATEST_WINDOW, 3)
    EGLX_AHEAD=N      frames in flight to one remote (wire.SEND_AHEAD, 3)
    EGLX_ROUNDS=N     progress rounds of one engine pass (_ucx.PASS_ROUNDS, 4)
    EGLX_SPIN_US=N    before arming the worker while requests are posted, poll UCX for up to N us (0: arm at once)
    EGLX_SWITCH_US=N  sys.setswitchinterval of the relay's and the remote subscriber's processes (CPython: 5000)
    EGLX_LIFO=1       a relay reuses the staging buffer freed last (a smaller working set) instead of the oldest

    python research/remote_runs/_knobs45.py CHECKOUT"""
import sys

from _patch import patch

root = sys.argv[1] if len(sys.argv) > 1 else "."

patch(f"{root}/eglcuda/remote/wire.py", [
    ("SEND_AHEAD = 3 ", "SEND_AHEAD = int(__import__('os').environ.get('EGLX_AHEAD', 3)) "),
    ("LATEST_WINDOW = 3 ", "LATEST_WINDOW = int(__import__('os').environ.get('EGLX_WINDOW', 3)) "),
])
patch(f"{root}/eglcuda/remote/_ucx.py", [
    ("PASS_ROUNDS = 4 ", "PASS_ROUNDS = int(os.environ.get('EGLX_ROUNDS', 4))\nSPIN_S = int(os.environ.get('EGLX_SPIN_US', 0)) / 1e6\n"
     "if os.environ.get('EGLX_SWITCH_US'):\n    __import__('sys').setswitchinterval(int(os.environ['EGLX_SWITCH_US']) / 1e6)\n_ = 0 "),
    ("""                if not self._posted and worker.arm():
                    return""", """                if not self._posted:
                    if SPIN_S and pending:
                        import time as _time
                        end = _time.perf_counter() + SPIN_S
                        moved = False
                        while _time.perf_counter() < end:
                            if worker.progress_once():
                                moved = True
                                break
                        if moved:
                            continue
                    if worker.arm():
                        return"""),
])
patch(f"{root}/eglcuda/remote/relay.py", [
    ("        self._free = _queue.Queue()\n", "        self._free = (_queue.LifoQueue if os.environ.get('EGLX_LIFO') else _queue.Queue)()\n"),
])
print(f"knobs applied to {root}")
