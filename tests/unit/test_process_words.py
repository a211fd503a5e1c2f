"""No tracked file a user reads or runs speaks of how the project was developed: no issue
numbers, work sessions, run labels, seed threads, "our GPU machine", the developers' own set-up
(what they stage in ``.device/``, their notes under ``/work/notes``) or its limits. That holds
for ``research/`` too, whose records keep dates and commits. Say what a user can check instead:
the hardware ("an H200, driver 580"), the date, the commit, the command."""
from __future__ import annotations

import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

PATTERNS = {
    "an issue number": r"\bissues? #?\d+",
    "a work session": r"\bsessions? \d+|\b(?:this|that|our|previous|next|earlier|later) session\b",
    "a seed thread": r"\bseed threads?\b",
    "our own machines": r"\bour (?:own )?(?:GPU |CPU |test |device )?(?:machines?|hosts?|set-?up|GPUs?)\b"
                        r"|\bthe project's (?:[\w-]+ ){0,2}?machines?\b"
                        r"|\bour [HAL]\d{2,3}s?\b|\bthe [HAL]\d{2,3} machines?\b|\bPLATFORM\.md\b",
    # .device/ is the developers' staging folder (.gitignore's /.device/ is left alone); frame.device and
    # torch.device(...) are attributes, not it.
    "the development set-up": r"\bdevice tool\b|\.device-run|/work/(?:wt\w*|main|notes|shared|helpers)\b"
                              r"|(?<![\w)\]/])\.device\b|\.device/setup\b|\bnvidia-h200(?:-x\d)?\b"
                              r"|\bremote\d{2,}\w*",
    "a run label": r"\bruns? [A-Z][0-9]{0,2}(?: and [A-Z][0-9]{0,2})*\b(?=[ ,.;:)]|$)"
                   r"|\bscripts? [A-Z][0-9],|\b(?:second|third|fourth|fifth|sixth) look\b",
}
FOUND = re.compile("|".join(f"(?P<k{i}>{p})" for i, p in enumerate(PATTERNS.values())), re.IGNORECASE)
NAMES = list(PATTERNS)
# A run label is a capital letter (and digits): matched case-sensitively, apart.
RUN_LABEL = re.compile(PATTERNS["a run label"])


def tracked_files() -> list[str]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return [name for name in out.decode().split("\0") if name]


def matches(text: str) -> list[tuple[int, str, str]]:
    """(line, what, the words) for each place ``text`` speaks of how the project was developed."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for match in FOUND.finditer(line):
            kind = NAMES[int(match.lastgroup[1:])]
            if kind == "a run label" and not RUN_LABEL.search(match.group()):
                continue  # "run a ..." is English, "run A2" a label
            found.append((number, kind, match.group()))
    return found


def test_no_tracked_file_speaks_of_how_the_project_was_developed():
    files = tracked_files()
    if not files:
        pytest.skip("no git checkout here (an installed package without its sources)")
    here = pathlib.Path(__file__).resolve().relative_to(ROOT).as_posix()
    report = []
    for name in files:
        path = ROOT / name
        if name == here or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files (clips, images)
        report += [f"{name}:{line}: {kind}: {words!r}" for line, kind, words in matches(text)]
    assert not report, "words about how the project was developed:\n" + "\n".join(report)


@pytest.mark.parametrize("text", [
    "### Changed (issue 44, session 9: the relay)", "as in Issue 42", "this session's judged runs",
    "The seed thread's experiment", "Our GPU machine has driver 580", "runs A and A2 showed",
    "`.device` scripts Y2, Y3, T3 of that session", "the fifth look", "the device tool lent an H200",
    "/work/wt44/.device-run-44.sh", "on the project's CPU machine", "run Y6)",
    "source .device/setup.sh > $OUT/setup.log", "open, not yet run (carry `.device`, `.whl`)",
    "Full tables: /work/notes/ucx-tuning.md", "2026-11-28, remote44bench", "the project's 2-core CPU machine",
])
def test_the_patterns_find_process_words(text):
    assert matches(text), text


@pytest.mark.parametrize("text", [
    "@pytest.fixture(scope=\"session\")", "with eglcuda.mps.session(True) as daemon:",
    "a new session (setsid)", "for the rest of the machine's session", "measured on an H200, driver 580",
    "run a benchmark", "issues no call", "the test session", "runs A/B comparisons on one machine", "A first look (any machine)",
    "frame.device", "torch.device(f\"cuda:{n}\")", "never the project's name", "--remote2", "/.device/",
])
def test_ordinary_words_pass(text):
    assert not matches(text), matches(text)
