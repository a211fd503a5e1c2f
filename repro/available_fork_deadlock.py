"""available() in a child forked while another thread of the parent is inside a probe hangs forever:
availability._lock (a threading.RLock) is copied into the child held by a thread that does not exist there.
Run: python repro/available_fork_deadlock.py   (exit 0 = bug reproduced: the child hung)"""
import os, signal, sys, threading, time
import eglcuda
from eglcuda import availability

started = threading.Event()
real = availability.CAPABILITIES["gl"]
def gl_probe():              # the real "gl" probe, and something slow inside it (PyOpenGL's import, a driver
    started.set()            # that takes seconds to initialize): what matters is that a thread is inside it
    time.sleep(2)
    return real()
availability.CAPABILITIES["gl"] = gl_probe

threading.Thread(target=eglcuda.available, args=("gl",), daemon=True).start()
started.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(5)          # SIGALRM kills the child if available() never returns
    print("child:", eglcuda.available("egl", reason=True), flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
if os.WIFSIGNALED(status):
    print(f"BUG: the child's available('egl') hung (killed by signal {os.WTERMSIG(status)} after 5 s)")
    sys.exit(0)
print("fixed: the child answered")
sys.exit(1)
