"""Same as available_fork_deadlock.py, with no patching: a thread asks available("gl") (the probe
opens an EGL display and imports PyOpenGL), the main thread forks meanwhile, the child asks
available("egl"). Exit 0 = the child hung (bug)."""
import os, signal, sys, threading, time
import eglcuda
from eglcuda import availability

t = threading.Thread(target=eglcuda.available, args=("gl",), daemon=True)
t.start()
time.sleep(0.01)
inside = availability._lock._is_owned() if hasattr(availability._lock, "_is_owned") else None
pid = os.fork()
if pid == 0:
    signal.alarm(5)
    print("child:", eglcuda.available("egl", reason=True), flush=True)
    os._exit(0)
_, status = os.waitpid(pid, 0)
t.join()
if os.WIFSIGNALED(status):
    print("BUG: the child's available('egl') hung (killed after 5 s)")
    sys.exit(0)
print("the child answered")
sys.exit(1)
