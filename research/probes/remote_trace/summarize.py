"""Status: runs against the current package. The remote subscriber's side of a trace written by
``sitecustomize.py`` here: the median and mean microseconds between its consecutive steps (frame
arrival -> take -> copy queued -> credit -> credit sent -> next frame arrival), middle half of the run.

    python research/probes/remote_trace/summarize.py [/tmp/eglcuda-trace]
"""
import glob
import statistics
import sys

if sys.argv[1:2] in (["-h"], ["--help"]):
    print(__doc__.strip())
    sys.exit(0)
folder = sys.argv[1] if len(sys.argv) > 1 else "/tmp/eglcuda-trace"
if not glob.glob(f"{folder}/*.txt"):
    print(f"summarize.py: no trace files (*.txt) in {folder}: run a traced bench first (sitecustomize.py here)",
          file=sys.stderr)
    sys.exit(2)
CHAIN = [("M_frame", "M_take"), ("M_take", "M_gbw"), ("M_gbw", "M_credit"), ("M_credit", "send3"),
         ("send3", "M_frame")]
for path in sorted(glob.glob(f"{folder}/*.txt")):
    events = sorted(((line.split()[0], int(line.split()[1])) for line in open(path)), key=lambda e: e[1])
    if not any(step == "M_frame" for step, _ in events):
        continue  # (not a remote subscriber's process)
    events = events[len(events) // 4: 3 * len(events) // 4]
    print(path)
    for first, then in CHAIN:
        gaps, since = [], None
        for step, at in events:
            if step == first and since is None:
                since = at
            elif step == then and since is not None:
                gaps.append((at - since) / 1e3)
                since = None
        if gaps:
            print(f"  {first:>9} -> {then:<9} n={len(gaps):6d} median {statistics.median(gaps):7.1f} us"
                  f"  mean {statistics.mean(gaps):7.1f} us")
