"""A grouped bar chart as a standalone SVG file: enough for docs/benchmarks.md without making
matplotlib a dependency of the benchmarks."""
from __future__ import annotations

import html
import pathlib

COLORS = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860"]


def grouped_bars(path: str | pathlib.Path, title: str, ylabel: str, groups: list[str], series: dict[str, list[float]],
                 log: bool = False) -> None:
    """Write one bar per series in each group. ``series`` maps a legend name to one value per
    group (NaN: no bar)."""
    import math

    width, height, left, bottom, top = 860, 420, 70, 60, 50
    plot_w, plot_h = width - left - 20, height - bottom - top
    values = [v for vs in series.values() for v in vs if v == v]
    peak = max(values) if values else 1.0
    low = min(values) if values else 1.0

    def scale(v: float) -> float:
        if log:
            lo, hi = math.log10(low / 1.5), math.log10(peak * 1.2)
            return plot_h * (math.log10(v) - lo) / (hi - lo)
        return plot_h * v / (peak * 1.15)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
             f'font-size="12"><rect width="100%" height="100%" fill="white"/>',
             f'<text x="{width / 2}" y="22" text-anchor="middle" font-size="15">{html.escape(title)}</text>',
             f'<text x="16" y="{top + plot_h / 2}" transform="rotate(-90 16 {top + plot_h / 2})" '
             f'text-anchor="middle">{html.escape(ylabel)}</text>',
             f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="black"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="black"/>']
    ticks = _ticks(low, peak, log)
    for tick in ticks:
        y = top + plot_h - scale(tick)
        if top <= y <= top + plot_h:
            parts.append(f'<line x1="{left - 4}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#ddd"/>')
            parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{tick:g}</text>')
    group_w = plot_w / max(1, len(groups))
    bar_w = group_w * 0.8 / max(1, len(series))
    for g, group in enumerate(groups):
        x0 = left + g * group_w + group_w * 0.1
        for s, (name, vs) in enumerate(series.items()):
            v = vs[g]
            if v != v:
                continue
            h = scale(v)
            x = x0 + s * bar_w
            parts.append(f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w - 2:.1f}" height="{h:.1f}" '
                         f'fill="{COLORS[s % len(COLORS)]}"><title>{html.escape(name)}: {v:.3g}</title></rect>')
            parts.append(f'<text x="{x + bar_w / 2 - 1:.1f}" y="{top + plot_h - h - 3:.1f}" text-anchor="middle" '
                         f'font-size="9">{v:.3g}</text>')
        parts.append(f'<text x="{x0 + group_w * 0.4:.1f}" y="{top + plot_h + 18}" text-anchor="middle">'
                     f'{html.escape(group)}</text>')
    for s, name in enumerate(series):
        x = left + 10 + s * 190
        parts.append(f'<rect x="{x}" y="{height - 22}" width="12" height="12" fill="{COLORS[s % len(COLORS)]}"/>')
        parts.append(f'<text x="{x + 16}" y="{height - 12}">{html.escape(name)}</text>')
    parts.append("</svg>")
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(path).write_text("\n".join(parts) + "\n")


def _ticks(low: float, high: float, log: bool) -> list[float]:
    import math

    if log:
        return [10.0 ** e for e in range(math.floor(math.log10(low / 1.5)), math.ceil(math.log10(high * 1.2)) + 1)]
    step = 10 ** math.floor(math.log10(high / 2)) if high > 0 else 1
    for mult in (1, 2, 5):
        if high / (step * mult) <= 6:
            step *= mult
            break
    return [step * i for i in range(0, int(high * 1.15 / step) + 1)]
