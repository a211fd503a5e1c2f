"""Where a frame's and a credit's time goes, from the trace files of research/remote_runs/_trace46.py (one run of one relay
and one remote subscriber): the median and p90 of each step, microseconds, over the frames of the run's middle.

    python3 research/remote_runs/_trace_summary.py TRACE_DIR"""
import glob
import json
import statistics
import sys


def main(folder: str) -> None:
    relay, remote = {}, {}
    for path in glob.glob(f"{folder}/trace-*.json"):
        marks = json.load(open(path))
        steps = {m[0] for m in marks}
        if "R.post" in steps:
            relay = marks
        elif "S.arrive" in steps:
            remote = marks
    if not relay or not remote:
        print(f"{folder}: no relay and remote subscriber traces")
        return
    by = {}  # (step, seq) -> time, the first
    for step, value, at in relay + remote:
        if step in ("R.staged", "R.dispatch", "R.post", "R.sent", "S.arrive", "S.take", "S.copied"):
            by.setdefault((step, value), at)
    seqs = sorted(v for (s, v) in by if s == "S.copied")
    seqs = seqs[len(seqs) // 5: len(seqs) * 4 // 5]  # (the middle: no start or end)
    rows = []

    def between(name, first, then, pairs):
        spans = [(b - a) / 1e3 for a, b in pairs if a is not None and b is not None and b >= a]
        if spans:
            spans.sort()
            rows.append((name, statistics.median(spans), spans[int(0.9 * (len(spans) - 1))], len(spans)))

    chain = ["R.staged", "R.dispatch", "R.post", "S.arrive", "S.take", "S.copied"]
    for first, then in zip(chain, chain[1:]):
        between(f"{first} -> {then}", first, then, [(by.get((first, s)), by.get((then, s))) for s in seqs])
    between("R.post -> R.sent", "R.post", "R.sent", [(by.get(("R.post", s)), by.get(("R.sent", s))) for s in seqs])
    # Credits: the k-th posted by the remote subscriber is the k-th the relay reads (one connection, in order).
    out = [at for step, _, at in remote if step == "S.credit"]
    got = [at for step, _, at in relay if step == "R.credit"]
    k = min(len(out), len(got))
    between("S.credit -> R.credit (k-th)", "", "", list(zip(out[k // 5: k * 4 // 5], got[k // 5: k * 4 // 5])))
    # After a credit the relay's local thread wakes and stages the next frame.
    times = sorted([(at, step) for step, _, at in relay if step in ("R.credit", "R.wake", "R.staged")])
    after_credit, wake_to_staged, last_credit, last_wake = [], [], None, None
    for at, step in times:
        if step == "R.credit":
            last_credit = at
        elif step == "R.wake" and last_credit is not None:
            after_credit.append((last_credit, at)); last_credit = None; last_wake = at
        elif step == "R.staged" and last_wake is not None:
            wake_to_staged.append((last_wake, at)); last_wake = None
    between("R.credit -> R.wake (next)", "", "", after_credit)
    between("R.wake -> R.staged", "", "", wake_to_staged)
    copied = [by.get(("S.copied", s)) for s in seqs]
    credits = sorted(out)
    import bisect
    between("S.copied -> S.credit (next)", "", "", [(c, credits[i]) for c in copied if c is not None
                                                     for i in [bisect.bisect_left(credits, c)] if i < len(credits)])
    span = (by[("S.copied", seqs[-1])] - by[("S.copied", seqs[0])]) / 1e9 if len(seqs) > 1 else 0
    print(f"{folder}: {len(seqs)} frames in the middle, {len(seqs) / span if span else 0:.0f} frames/s; "
          f"notifier wakes: relay {sum(1 for m in relay if m[0] == 'notify')}, remote {sum(1 for m in remote if m[0] == 'notify')}")
    for name, median, p90, n in rows:
        print(f"  {name:32s} median {median:8.1f} us  p90 {p90:8.1f} us  ({n})")


if __name__ == "__main__":
    main(sys.argv[1])
