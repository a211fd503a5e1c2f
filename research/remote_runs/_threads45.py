"""Per-thread CPU and context switches of the relay and the remote subscriber of a running bench/remote.py,
over a window in its steady state (research/remote_runs/remote-knobs.sh runs it beside each bench run).

    python research/remote_runs/_threads45.py DELAY_S WINDOW_S OUT.json"""
import json
import os
import subprocess
import sys
import time

delay, window, out = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
HZ = os.sysconf("SC_CLK_TCK")


def pids() -> dict:
    found = {}
    for role in ("relay", "remote"):
        r = subprocess.run(["pgrep", "-f", f"[-]-role {role} "], capture_output=True, text=True).stdout.split()
        if r:
            found[role] = int(r[0])
    return found


def sample(pid: int) -> dict:
    threads = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = open(f"/proc/{pid}/task/{tid}/stat").read()
            status = open(f"/proc/{pid}/task/{tid}/status").read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        f = stat.rsplit(")", 1)[1].split()
        vol = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
        nonvol = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
        threads[f"{name}/{tid}"] = (int(f[11]), int(f[12]), vol, nonvol)
    return threads


deadline = time.monotonic() + 60
found = {}
while time.monotonic() < deadline and len(found) < 2:
    found = pids()
    time.sleep(0.1)
if len(found) < 2:
    json.dump({"error": "no relay and remote found"}, open(out, "w"))
    sys.exit(0)
time.sleep(delay)
a = {role: sample(pid) for role, pid in found.items()}
time.sleep(window)
b = {role: sample(pid) for role, pid in found.items()}
result = {}
for role in found:
    for name, after in b[role].items():
        before = a[role].get(name)
        if before is None:
            continue
        d = [x - y for x, y in zip(after, before)]
        if d[0] + d[1] == 0 and d[2] + d[3] < 5:
            continue
        result[f"{role}:{name}"] = {"cpu_pct": round(100 * (d[0] + d[1]) / HZ / window, 1),
                                    "user_pct": round(100 * d[0] / HZ / window, 1),
                                    "sys_pct": round(100 * d[1] / HZ / window, 1),
                                    "vol_per_s": round(d[2] / window), "nonvol_per_s": round(d[3] / window)}
json.dump(result, open(out, "w"), indent=1)
