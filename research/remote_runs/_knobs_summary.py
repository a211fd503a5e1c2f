"""One line per bench/remote.py run of research/remote_runs/remote-knobs.sh: the rate (raw engine or one remote), p50, and
the busiest threads of the relay and the remote subscriber (CPU %, user/sys, voluntary context switches a
second) from research/remote_runs/_threads45.py.

    python3 research/remote_runs/_knobs_summary.py LABEL OUT_DIR [THREADS.json]"""
import json
import sys

label, out = sys.argv[1], sys.argv[2]
rows = json.load(open(f"{out}/results.json"))["rows"]
line = f"{label:22s}"
for r in rows:
    if r["variant"].startswith("ucx-raw"):
        line += f" {r['variant']} {r.get('rate', float('nan')):6.0f}/s"
    elif r["variant"] == "eglcuda":
        line += f" 1 remote {r['rate_mean']:6.0f}/s p50 {r['p50_us'] / 1e3:.2f} ms"
if len(sys.argv) > 3:
    try:
        threads = json.load(open(sys.argv[3]))
    except (OSError, ValueError):
        threads = {}
    for role in ("relay", "remote"):
        mine = sorted(((v["cpu_pct"], k, v) for k, v in threads.items() if isinstance(v, dict) and k.startswith(role + ":")), reverse=True)[:2]
        line += f" | {role} " + ", ".join(f"{v['cpu_pct']:.0f}% ({v['user_pct']:.0f}u/{v['sys_pct']:.0f}s, {v['vol_per_s']}+{v['nonvol_per_s']} cs/s)"
                                         for _, _, v in mine)
print(line)
