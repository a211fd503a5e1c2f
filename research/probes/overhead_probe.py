# Research record (see research/README.md): frozen record (uses the old layout: eglcuda._hotpath ProducerCore/ConsumerCore/AcquiredCore and bind(); ran 419c99e to 9e8cabf).
"""Probe: the Python-side CPU cost of eglcuda's per-frame C methods, with fake driver helpers
(research/probes/fake_driver.c: no GPU, no driver; the bookkeeping a real stream would do)."""
import _needs  # research/probes/_needs.py: a missing need is one line and status 2

_needs.answer_help(__doc__)
_needs.frozen(__file__, "9e8cabf")  # (the commit its first line names)

import ctypes, pathlib, statistics, subprocess, sys, time
ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", "/tmp/fake_driver.so", str(ROOT / "research/probes/fake_driver.c")], check=True)
from eglcuda import _hotpath
from eglcuda._hotpath import ProducerCore, ConsumerCore, AcquiredCore
lib = ctypes.CDLL("/tmp/fake_driver.so")
addr = lambda n: ctypes.cast(getattr(lib, n), ctypes.c_void_p).value
_hotpath.bind(tuple(addr(n) for n in ("f_present", "f_return", "f_present_return", "f_acquire", "f_next", "f_release", "f_counter")))
bufs = [ctypes.create_string_buffer(256) for _ in range(8)]
a = lambda b: ctypes.addressof(b)

class P(ProducerCore):
    def _check_frame(self, frame): pass
    def _first_present(self, frame, key): self._associated[key] = frame
    def _return_failed(self, status, waited): return None
class AF(AcquiredCore):
    __slots__ = ()
class C(ConsumerCore):
    pass
class Frame:
    def __init__(self, i):
        self.egl = ctypes.create_string_buffer(128)
        ctypes.c_uint64.from_buffer(self.egl).value = 0x1000 * (i + 1)
        self._egl_address = a(self.egl); self.key = 0x1000 * (i + 1)

frames = [Frame(0), Frame(1)]

def endpoints():
    """A fresh producer and consumer on a fresh fake stream (each run starts with nothing in flight)."""
    lib.f_reset()
    p = P(); p._bind(a(bufs[0]), a(bufs[1]), a(bufs[2]), True)
    c = C(); c._bind(a(bufs[3]), a(bufs[4]), a(bufs[5]), a(bufs[6]), a(bufs[7]), a(bufs[0]), a(bufs[1]), True, AF)
    c._producer_seen = True
    return p, c

def four(n):
    producer, consumer = endpoints()
    frames[:] = [Frame(0), Frame(1)]
    start = time.perf_counter()
    for i in range(n):
        producer.present(frames[i & 1])
        consumer.acquire().release()
        if i:
            frames[(i - 1) & 1] = producer.return_frame(1_000_000)
    return 1e6 * (time.perf_counter() - start) / n

def steps(n):
    """The loop steps: present_and_return + acquire_next, a ring of three frames."""
    producer, consumer = endpoints()
    free = [Frame(0), Frame(1), Frame(2)]
    start = time.perf_counter()
    for i in range(n):
        frame = free.pop()
        back = producer.present_and_return(frame, timeout_us=1_000_000 if not free and i > 1 else 0)
        if back is not None:
            free.append(back)
        consumer.acquire_next()
    return 1e6 * (time.perf_counter() - start) / n

def empty(n):
    def f(*a): return None
    start = time.perf_counter()
    for i in range(n):
        f(frames[i & 1])
        if i:
            frames[(i - 1) & 1] = f(1_000_000)
    return 1e6 * (time.perf_counter() - start) / n

for name, fn in (("four calls", four), ("steps", steps), ("loop only", empty)):
    runs = [fn(200000) for _ in range(7)]
    print(f"{name:12s} {statistics.median(runs):.3f} us/frame")
