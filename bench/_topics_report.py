"""bench/topics.py's results: the plots, the comparison of rounds and trees (--rounds,
--baseline), the summary line and the markdown table."""
from __future__ import annotations

import math
import pathlib
import statistics

from _script import MATPLOTLIB
from _topics_common import PROGRAM, TRANSPORTS


def median_known(values) -> float:
    """The median of the values that were measured (NaN when none was: torch-mp, a subscriber that got no frame)."""
    known = [v for v in values if isinstance(v, (int, float)) and not math.isnan(v)]
    return statistics.median(known) if known else math.nan


def _us(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.1f}"


def plot(rows: list[dict], out: pathlib.Path) -> list[str]:
    """The PNG plots written to ``out``; none, with one line saying why, without matplotlib."""
    written = []
    groups = sorted({(r["size"], r["qos"]) for r in rows if "publisher_rate" in r})
    _, purpose, hint = MATPLOTLIB
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{PROGRAM}: plots left out: needs {purpose}: {hint}", flush=True)
        return written
    for size, qos in groups:
        selected = [r for r in rows if r["size"] == size and r["qos"] == qos and "publisher_rate" in r
                    and not r.get("stalled")]
        transports = sorted({r["transport"] for r in selected}, key=TRANSPORTS.index)
        ns = sorted({r["n"] for r in selected})
        for metric, label, unit in (("publisher_rate", "publisher rate", "frames/s"), ("p50_us", "latency p50", "us")):
            name = f"topics_{size}_{qos}_{metric}"
            series = {t: [next((r[metric] for r in selected if r["transport"] == t and r["n"] == n), math.nan)
                          for n in ns] for t in transports}
            figure, axes = plt.subplots(figsize=(7, 4))
            for transport, values in series.items():
                axes.plot(ns, values, marker="o", label=transport)
            axes.set_xlabel("subscribers")
            axes.set_ylabel(f"{label} ({unit})")
            axes.set_xscale("log", base=2)
            axes.set_xticks(ns, [str(n) for n in ns])
            axes.set_yscale("log")
            axes.set_title(f"{size}, qos {qos}: {label}")
            axes.grid(True, alpha=0.3)
            axes.legend()
            figure.tight_layout()
            figure.savefig(out / f"{name}.png", dpi=120)
            plt.close(figure)
            written.append(f"{name}.png")
    return written


COMPARED = (("publisher_rate", "frames/s", True), ("publisher_cpu_us", "pub CPU us/frame", False),
            ("p50_us", "p50 us", False), ("p99_us", "p99 us", False))


def compare(rows: list[dict]) -> list[dict]:
    """Per cell (size, qos, transport, N; stalled rows left out): the median over rounds of each
    COMPARED metric for this tree and the baseline, their ratio (current / baseline), and in the
    'every' cells the ratio of frames/s to the ipc-ring's median of the same size and N."""
    good = [r for r in rows if "publisher_rate" in r and not r.get("stalled") and not r.get("paired")]
    keys = sorted({(r["size"], r["qos"], r["transport"], r["n"]) for r in good},
                  key=lambda k: (k[0], k[1], TRANSPORTS.index(k[2]) if k[2] in TRANSPORTS else 99, k[3]))
    cells = []
    for size, qos, transport, n in keys:
        mine = [r for r in good if (r["size"], r["qos"], r["transport"], r["n"]) == (size, qos, transport, n)]
        cell: dict = {"size": size, "qos": qos, "transport": transport, "n": n}
        for tree in ("current", "baseline"):
            runs = [r for r in mine if r.get("tree", "current") == tree]
            if runs:
                cell[tree] = {metric: median_known(r.get(metric, math.nan) for r in runs) for metric, _, _ in COMPARED}
                cell[tree]["rounds"] = len(runs)
        if "current" in cell and "baseline" in cell:
            cell["ratio"] = {metric: _ratio(cell["current"][metric], cell["baseline"][metric]) for metric, _, _ in COMPARED}
        ring = [r["publisher_rate"] for r in good if r["transport"] == "ipc-ring" and r["size"] == size and r["n"] == n]
        if ring and transport != "ipc-ring" and qos == "every" and "current" in cell:
            cell["vs_ring"] = _ratio(cell["current"]["publisher_rate"], statistics.median(ring))
        cells.append(cell)
    return cells


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(a) and not math.isnan(b) else math.nan


def compare_markdown(cells: list[dict], args) -> str:
    """The comparison table (see compare)."""
    rounds = max((c.get("current", {}).get("rounds", 0) for c in cells), default=0)
    lines = [f"Comparison, median of {rounds} round(s); MPS {'on' if args.mps else 'off'}"
             + (f"; baseline eglcuda from {args.baseline} (ratio: this tree / baseline; frames/s higher is better, "
                "the others lower)" if args.baseline else "") + "; vs ring: frames/s / ipc-ring's (every).", ""]
    head = ["size", "qos", "transport", "N"]
    for _, label, _ in COMPARED:
        head += [label] + ([f"{label} baseline", "ratio"] if args.baseline else [])
    head.append("vs ring")
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * 4 + "---:|" * (len(head) - 4)]
    for cell in cells:
        values = [cell["size"], cell["qos"], cell["transport"], str(cell["n"])]
        for metric, _, _ in COMPARED:
            values.append(_fmt(cell.get("current", {}).get(metric)))
            if args.baseline:
                values += [_fmt(cell.get("baseline", {}).get(metric)), _fmt(cell.get("ratio", {}).get(metric), 3)]
        values.append(_fmt(cell.get("vs_ring"), 3))
        lines.append("| " + " | ".join(values) + " |")
    return "\n".join(lines)


def _fmt(value, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.{digits}f}" if digits != 1 or value < 1000 else f"{value:.0f}"


def summary_line(rows: list[dict]) -> str:
    """The headline numbers: 8 (or the most) 'latest' subscribers at 1080p per transport, the best
    lossless alternative, and the stalled-subscriber change."""
    parts = []
    good = [r for r in rows if "publisher_rate" in r]
    if not good:
        return "no results"
    size = "1080p-nv12" if any(r["size"] == "1080p-nv12" for r in good) else good[0]["size"]
    n = max(r["n"] for r in good if r["size"] == size)
    for row in good:
        if row["size"] == size and row["n"] == n and not row.get("stalled") and row["qos"] == "latest":
            parts.append(f"{row['transport']} latest N={n} {row['publisher_rate']:.0f}/s p50 {row['p50_worst_us']:.0f} us")
    for row in good:
        if row["size"] == size and row["n"] == n and row["qos"] == "every" and not row.get("stalled"):
            parts.append(f"{row['transport']} every N={n} {row['publisher_rate']:.0f}/s")
    for stall in (r for r in good if r.get("stalled") and r["size"] == size):
        base = next((r for r in good if not r.get("stalled") and r["size"] == size and r["qos"] == "latest"
                     and r["transport"] == stall["transport"] and r["n"] == stall["n"]), None)
        if base:
            parts.append(f"{stall['transport']} 1 stalled of {stall['n']}: "
                         f"{100.0 * (stall['publisher_rate'] / base['publisher_rate'] - 1.0):+.1f} %")
    for paired in (r for r in rows if r.get("paired") and "changes" in r and r["size"] == size):
        parts.append(f"{paired['transport']} 1 of {paired['n']} stopped and resumed: "
                     f"{100 * paired['median_change']:+.1f} % (median of {paired['stall_pairs']})")
    return "; ".join(parts)


def format_row(row: dict) -> str:
    label = f"{row['size']:>10} {row['qos']:<6} {row['transport']:<9} N={row['n']}{' (1 stalled)' if row.get('stalled') else ''}"
    if "tree" in row:
        label += f" [{row['tree']}, round {row['round'] + 1}]"
    if "skipped" in row:
        return f"{label}: skipped ({row['skipped']})"
    if "error" in row:
        return f"{label}: ERROR {row['error']}"
    if row.get("paired"):
        changes = ", ".join(f"{100 * c:+.1f}" for c in row["changes"])
        return (f"{label} (1 stopped and resumed, {row['stall_pairs']} x {row['stall_phase']} s): publisher rate "
                f"change median {100 * row['median_change']:+.1f} % ({changes} %), running "
                f"{statistics.median(row['running_rates']):.0f}/s")
    rates = row["subscriber_rates"]
    return (f"{label}: publisher {row['publisher_rate']:8.0f}/s, subscribers {min(rates):8.0f}..{max(rates):8.0f}/s, "
            f"p50 {row['p50_us']:7.1f} us (worst {row['p50_worst_us']:7.1f}), p99 {row['p99_us']:8.1f} us, "
            f"CPU us/frame pub {_us(row.get('publisher_cpu_us', math.nan))} sub {_us(row.get('subscriber_cpu_us', math.nan))} "
            f"[{','.join(row['transports'])}]")


def markdown(rows: list[dict], args) -> str:
    lines = [f"Frame topics, one publisher and N subscriber processes; MPS {'on' if args.mps else 'off'}; "
             f"{args.duration} s timed per configuration{'; latency includes the stream sync' if args.sync else ''}"
             f"{'; the publisher writes every frame on the GPU (--write)' if args.write else ''}"
             f"; eglcuda subscribers busy-wait {args.busy_wait:g} us.",
             "", "| size | qos | transport | N | publisher frames/s | slowest subscriber frames/s | p50 us (median of "
             "subscribers) | worst p50 us | worst p99 us | publisher CPU us/frame | subscriber CPU us/frame (median) |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        if row.get("paired") and "changes" in row:
            continue  # (after the table)
        name = row["transport"] + (" (1 of N stalled)" if row.get("stalled") else "")
        if "publisher_rate" not in row:
            lines.append(f"| {row['size']} | {row['qos']} | {name} | {row['n']} | "
                         f"{row.get('skipped') or row.get('error')} | | | | | | |")
            continue
        lines.append(f"| {row['size']} | {row['qos']} | {name} | {row['n']} | {row['publisher_rate']:.0f} | "
                     f"{min(row['subscriber_rates']):.0f} | {row['p50_us']:.1f} | {row['p50_worst_us']:.1f} | "
                     f"{row['p99_us']:.1f} | {_us(row.get('publisher_cpu_us', math.nan))} | "
                     f"{_us(row.get('subscriber_cpu_us', math.nan))} |")
    stalls = [r for r in rows if r.get("stalled") and "publisher_rate" in r]
    for stall in stalls:
        base = next((r for r in rows if not r.get("stalled") and r["size"] == stall["size"] and r["qos"] == "latest"
                     and r["transport"] == stall["transport"] and r["n"] == stall["n"] and "publisher_rate" in r), None)
        if base:
            change = 100.0 * (stall["publisher_rate"] / base["publisher_rate"] - 1.0)
            lines.append(f"\n{stall['size']} {stall['transport']}: one stalled 'latest' subscriber of {stall['n']} "
                         f"changes the publisher's rate by {change:+.1f} % (target: more than -5 %).")
    for row in rows:
        if row.get("paired") and "changes" in row:
            lines.append(f"\n{row['size']} {row['transport']}, in one run: one of {row['n']} 'latest' subscribers "
                         f"stopped and resumed {row['stall_pairs']} times ({row['stall_phase']} s each) changes the "
                         f"publisher's rate by {100 * row['median_change']:+.1f} % (median; each stop: "
                         f"{', '.join(f'{100 * c:+.1f}' for c in row['changes'])} %; target: more than -5 %).")
    return "\n".join(lines)
