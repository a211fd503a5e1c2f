"""One line per bench/remote.py run of the bench/runs/remote-ab*.sh scripts: the raw engine's rows, then one
remote subscriber's rate and the per-frame CPU of the relay's and the remote subscriber's threads that
bench/runs/_diag44.py's instrumentation wrote (/tmp/ucxstats.PID.json).

    python3 bench/runs/_ab_summary.py LABEL OUT_DIR"""
import glob
import json
import sys

label, out = sys.argv[1], sys.argv[2]
rows = json.load(open(f"{out}/results.json"))["rows"]
for r in rows:
    if r["variant"].startswith("ucx-raw"):
        print(f"  {label:4s} {r['variant']:28s} {r.get('rate', float('nan')):7.0f}/s")
r = [r for r in rows if r["variant"] == "eglcuda"][-1]
sent = r["relay"][0]["sent"]; seen = r["subscribers"][0]["seen"]
line = f"  {label:4s} 1 remote {r['rate_mean']:6.0f}/s p50 {r['p50_us']/1e3:.2f} ms sent {sent} seen {seen} |"
for f in sorted(glob.glob("/tmp/ucxstats.*.json")):
    try:
        d = json.load(open(f)); role = d["argv"][1]
    except (OSError, ValueError, KeyError, IndexError):  # (a process killed while writing it)
        continue
    if role not in ("relay", "remote"): continue
    cpu = d["cpu_ms_total_user_sys"]; n = sent if role == "relay" else seen
    e = cpu.get("eglcuda-ucx", [0, 0, 0]); o = cpu.get("eglcuda-relay-bench-remote", cpu.get("MainThread"))
    line += f" {role} engine {e[0]*1000/n:.0f} us/frame (user {e[1]*1000/n:.0f} sys {e[2]*1000/n:.0f}), passes {d['passes']/n:.1f}, other thread {o[0]*1000/n:.0f} us |"
print(line)
