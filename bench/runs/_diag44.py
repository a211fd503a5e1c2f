"""The instrumentation bench/runs/remote-ab.sh applies to a checkout for one run (never committed into the
package): each relay and remote subscriber writes, when it closes, its threads' CPU (user and system), its UCX
engine's progress passes and the durations of its copies to /tmp/ucxstats.PID.json.

    python bench/runs/_diag44.py CHECKOUT"""
import sys
root = sys.argv[1] if len(sys.argv) > 1 else '.'
p=f'{root}/eglcuda/remote/_ucx.py'; s=open(p).read()
for before in ("        self._scheduled = False\n        worker = self.worker\n",
               "        self._scheduled = False\n        self._in_pass = True\n"):
    s = s.replace(before, before + '        DIAG["passes"] += 1\n', 1)
s=s.replace('''atexit.register(_at_exit)''','''atexit.register(_at_exit)
DIAG = {"passes": 0, "stage": [], "deliver": [], "wait": []}


def _diag() -> None:
    import sys, json
    names = {t.native_id: t.name for t in threading.enumerate()}
    cpu = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            parts = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu[names.get(int(tid), tid)] = ((int(parts[11]) + int(parts[12])) * 10, int(parts[11]) * 10, int(parts[12]) * 10)
    out = {"argv": sys.argv[1:5], "passes": DIAG["passes"], "cpu_ms_total_user_sys": cpu}
    for key in ("stage", "deliver", "wait"):
        v = sorted(DIAG[key])
        if v:
            out[key] = {"n": len(v), "p50_us": v[len(v) // 2] / 1e3, "p90_us": v[int(len(v) * .9)] / 1e3,
                        "mean_us": sum(v) / len(v) / 1e3}
    open(f"/tmp/ucxstats.{os.getpid()}.json", "w").write(json.dumps(out) + "\\n")


atexit.register(_diag)''')
open(p,'w').write(s)
p=f'{root}/eglcuda/remote/relay.py'; s=open(p).read()
s=s.replace('''            try:
                index = None if look else self._stage(message)''','''            try:
                _t0 = time.perf_counter_ns()
                index = None if look else self._stage(message)
                if index is not None:
                    _ucx.DIAG["stage"].append(time.perf_counter_ns() - _t0)''')
s=s.replace('''        if self._closed:
            return''','''        if self._closed:
            return
        _ucx._diag()''',1)
open(p,'w').write(s)
p=f'{root}/eglcuda/remote/subscriber.py'; s=open(p).read()
s=s.replace('''        try:
            self._device.make_current()
            # The slot's earlier''','''        _t0 = time.perf_counter_ns()
        try:
            self._device.make_current()
            # The slot's earlier''')
s=s.replace('''        with link.cond:
            link.free.append(index)
        self._credit(link, 1)
        skipped =''','''        _ucx.DIAG["deliver"].append(time.perf_counter_ns() - _t0)
        with link.cond:
            link.free.append(index)
        self._credit(link, 1)
        skipped =''')
s=s.replace('''            wait = self.timeout if timeout is None else sockets.wait_seconds(timeout)''','''            _w0 = time.perf_counter_ns()
            wait = self.timeout if timeout is None else sockets.wait_seconds(timeout)''')
s=s.replace('''            if stale:
                self._credit(link, stale)
            return self._deliver(''','''            if stale:
                self._credit(link, stale)
            _ucx.DIAG["wait"].append(time.perf_counter_ns() - _w0)
            return self._deliver(''')
s=s.replace('''        if self._closed:
            return''','''        if self._closed:
            return
        _ucx._diag()''',1)
open(p,'w').write(s)
