"""The library loader's lock (eglcuda/_bind/loader.py _lock) held across fork: a thread is loading
libEGL (eglcuda.available("egl") on first use) when the main thread forks; in the child, the first
EGL use waits forever. Exit 0 = a child hung (bug) in one of the tries."""
import faulthandler, os, sys, threading, time
import eglcuda
from eglcuda._bind import loader

def attempt() -> str:
    t = threading.Thread(target=loader.egl_available, daemon=True)
    t.start()
    while not loader._lock.locked() and t.is_alive():
        pass
    held = loader._lock.locked()
    pid = os.fork()
    if pid == 0:
        faulthandler.dump_traceback_later(5, exit=True)
        loader.egl_available()
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    t.join()
    return "hung" if os.waitstatus_to_exitcode(status) != 0 else ("answered (lock held at fork)" if held else "answered")

print(attempt())
