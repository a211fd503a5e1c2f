"""bench/stream_roundtrip.py's goal table: each cell is the loop's ratio to C at that size (the
median of a serial loop's CPU rows), and every cell over the goal is named."""
from __future__ import annotations

import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import stream_roundtrip as bench  # noqa: E402


def test_goal_table_cells_and_the_cells_over_the_goal():
    rng = np.random.default_rng()
    rows, want = [], {}
    for size in ("640x480", "7680x4320"):
        for mode in ("serial, CPU 2", "serial, CPU 5", "serial, CPU 7", "pipelined"):
            med = {bench.RATIO + label: float(rng.uniform(0.9, 1.2)) for label, _, _ in bench.RATIOS}
            rows.append((size, mode, med))
            for label, _, _ in bench.RATIOS:
                want.setdefault((size, mode.split(",")[0], label), []).append(med[bench.RATIO + label])
    table, over = bench.goal_table(rows)
    lines = table.splitlines()
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    assert header[0] == "size" and len(lines) == 4
    expected_over = []
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        size = cells[0]
        for name, cell in zip(header[1:], cells[1:]):
            mode, label = name.split(" ", 1)
            value = float(np.median(want[(size, mode, label)]))
            assert cell == f"{value:.3f}", (size, name)
            if label != "stack / C" and value > bench.GOAL:
                expected_over.append(f"{size} {mode} {label} {value:.3f}")
    assert over == expected_over


def test_goal_table_says_n_a_for_a_missing_loop():
    med = {bench.RATIO + label: 1.0 for label, _, _ in bench.RATIOS}
    table, over = bench.goal_table([("640x480", "serial, CPU 0", med)])
    assert "n/a" in table.splitlines()[2] and over == []
