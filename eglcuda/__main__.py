"""Command line: ``python -m eglcuda info [--json]``."""
from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eglcuda", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    info = commands.add_parser("info", help="report EGL, CUDA and the interop paths available here")
    info.add_argument("--json", action="store_true", help="machine-readable output")
    args = parser.parse_args(argv)

    from ._info import collect, format_report

    report = collect()
    if args.json:
        json.dump(report, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
