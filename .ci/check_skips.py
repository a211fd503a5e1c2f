"""Read a pytest JUnit XML report and fail unless every skip says what is missing.

    python .ci/check_skips.py REPORT.xml [--expect TEXT]...

A skip's reason must name what the machine or Python lacks ("needs ...", "no ...", "... missing",
"install ...", "could not import ..."), the way eglcuda.available words it. Each --expect TEXT must
occur in at least one skip reason (e.g. "no libEGL.so.1": proof that the libraries really were
hidden). Exits 1 and lists the offending skips, 0 otherwise.
"""
from __future__ import annotations

import argparse
import collections
import re
import sys
import xml.etree.ElementTree as ET

NAMES_WHAT_IS_MISSING = re.compile(r"\b(needs?|no|missing|not installed|install|could not import|lacks?)\b", re.I)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("report")
    parser.add_argument("--expect", action="append", default=[], metavar="TEXT")
    args = parser.parse_args()
    reasons: collections.Counter[str] = collections.Counter()
    vague = []
    try:
        report = ET.parse(args.report).getroot()
    except (OSError, ET.ParseError) as exc:
        print(f"{sys.argv[0]}: cannot read the JUnit report {args.report}: {exc}", file=sys.stderr)
        return 2
    for case in report.iter("testcase"):
        for skipped in case.findall("skipped"):
            reason = skipped.get("message", "").strip()
            if reason == "collection skipped":  # a whole module: the reason is in the text, (path, line, 'Skipped: ...')
                found = re.search(r"Skipped: (.*?)['\"]\)\s*$", skipped.text or "", re.S)
                reason = found.group(1) if found else (skipped.text or "").strip()
            reason = re.sub(r"^(?:Skipped: )", "", reason).strip()
            reasons[reason] += 1
            if not NAMES_WHAT_IS_MISSING.search(reason):
                vague.append(f"{case.get('classname')}::{case.get('name')}: {reason or '(no reason)'}")
    print(f"{sum(reasons.values())} skips, {len(reasons)} distinct reasons:")
    for reason, count in reasons.most_common():
        print(f"  {count:4d}  {reason}")
    failed = False
    if vague:
        failed = True
        print(f"{len(vague)} skips do not say what is missing:", *vague, sep="\n  ")
    for text in args.expect:
        if not any(text in reason for reason in reasons):
            failed = True
            print(f"no skip reason mentions {text!r}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
