"""Rewrite a wheel without the files that importing and running it do not need (a smaller wheel
for a size-limited container image, cache or transfer).

The PyNvVideoCodec 2.2.4 wheel is 26.9 MB, but most of it is not needed to import and decode:
the FFmpeg source tarball it ships for the LGPL (data/external/ffmpeg/src, 12 MB), the
samples and benchmarks it installs as top-level folders (a 5 MB notebook among them), and
two extra copies of each bundled FFmpeg library (zip has no symlinks: libavformat.so,
.so.63 and .so.63.1.101 are three identical 5.4 MB files; the extension needs only the
SONAME, libavformat.so.63). The slim wheel is 4.65 MB.

    python scripts/slim_wheel.py pynvvideocodec-2.2.4-cp312-cp312-manylinux_2_28_x86_64.whl \\
        --out-dir /tmp/slim --drop '*.data/*' --drop 'samples/*' --drop 'benchmarks/*'

Identical shared libraries stored under several names are reduced to their SONAME (the name
with one version number, e.g. libavutil.so.61) unless --keep-duplicates is given. The output
keeps the input's file name (pip takes name and version from it), and RECORD is rewritten
with the remaining files' hashes. With readelf on PATH, every bundled library that an ELF
file of the wheel needs (DT_NEEDED) is checked to be still there.

The slim wheel is for your own machines, not for redistribution: it drops the FFmpeg source
that the original ships for its licence.
"""
from __future__ import annotations

import argparse
import base64
import collections
import fnmatch
import hashlib
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

class BadRequest(ValueError):
    """What the command line asks cannot be done with this wheel: main() makes it a usage error."""


SONAME_RE = re.compile(r"^(?P<dir>.*/)?(?P<stem>lib[^/]+?\.so)(?P<ver>(\.\d+)*)$")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _duplicate_so_names(members: dict[str, bytes]) -> set[str]:
    """Names of shared libraries that duplicate another name's content, keeping the SONAME."""
    groups = collections.defaultdict(list)
    for name, data in members.items():
        m = SONAME_RE.match(name)
        if m:
            groups[(m["dir"], m["stem"], hashlib.sha256(data).digest())].append(name)
    drop = set()
    for names in groups.values():
        if len(names) < 2:
            continue

        def rank(n: str):
            ver = SONAME_RE.match(n)["ver"]
            return (ver.count(".") != 1, len(n))  # one version number first, then shortest
        keep = min(names, key=rank)
        drop.update(n for n in names if n != keep)
    return drop


def _check_needed(members: dict[str, bytes], original_names: set[str]) -> list[str]:
    """DT_NEEDED entries that name a library the original wheel bundled but the slim one lacks."""
    if not shutil.which("readelf"):
        print("readelf not found: NEEDED check skipped")
        return []
    problems = []
    present = {pathlib.PurePosixPath(n).name for n in members}
    with tempfile.TemporaryDirectory() as tmp:
        for name, data in members.items():
            if not data.startswith(b"\x7fELF"):
                continue
            path = pathlib.Path(tmp) / "x.so"
            path.write_bytes(data)
            out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True).stdout
            for needed in re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", out):
                if needed not in present and needed in original_names:
                    problems.append(f"{name} needs {needed}")
    return problems


def slim(wheel: pathlib.Path, out_dir: pathlib.Path, drop: list[str], keep_duplicates: bool) -> pathlib.Path:
    with zipfile.ZipFile(wheel) as zin:
        infos = [i for i in zin.infolist() if not i.is_dir()]
        members = {i.filename: zin.read(i) for i in infos}
        modes = {i.filename: i.external_attr for i in infos}
    original_names = {pathlib.PurePosixPath(n).name for n in members}
    record = next((n for n in members if n.endswith(".dist-info/RECORD")), None)
    if record is None:
        raise BadRequest(f"{wheel} is not a wheel: it holds no .dist-info/RECORD")

    removed = {n for n in members if n != record and any(fnmatch.fnmatch(n, p) for p in drop)}
    if any(n.endswith(".dist-info/METADATA") or n.endswith(".dist-info/WHEEL") for n in removed):
        raise BadRequest("--drop matches the wheel's METADATA or WHEEL, which a wheel needs")
    if not keep_duplicates:
        removed |= _duplicate_so_names({n: d for n, d in members.items() if n not in removed})
    kept = {n: d for n, d in members.items() if n not in removed and n != record}

    problems = _check_needed(kept, original_names)
    if problems:
        raise SystemExit("slim wheel would miss bundled libraries:\n  " + "\n  ".join(problems))

    lines = [f"{n},{_record_hash(d)},{len(d)}" for n, d in kept.items()] + [f"{record},,"]
    out = out_dir / wheel.name
    if out.resolve() == wheel.resolve():
        raise BadRequest("--out-dir must differ from the wheel's folder")
    out_dir.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zout:
        for n, d in kept.items():
            zi = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = modes[n]
            zi.compress_type = zipfile.ZIP_DEFLATED
            zout.writestr(zi, d)
        zi = zipfile.ZipInfo(record, date_time=(2020, 1, 1, 0, 0, 0))
        zi.external_attr = modes[record]
        zi.compress_type = zipfile.ZIP_DEFLATED
        zout.writestr(zi, "\n".join(lines) + "\n")

    for n in sorted(removed):
        print(f"dropped {n} ({len(members[n]):,} bytes)")
    print(f"{out}: {out.stat().st_size:,} bytes (was {wheel.stat().st_size:,})")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("wheel", type=pathlib.Path)
    ap.add_argument("--out-dir", type=pathlib.Path, required=True)
    ap.add_argument("--drop", action="append", default=[], help="fnmatch pattern of members to leave out (repeatable)")
    ap.add_argument("--keep-duplicates", action="store_true", help="keep every name of identical shared libraries")
    args = ap.parse_args()
    # A wheel that is not there, or not a wheel, is a usage error, not a traceback.
    if not args.wheel.is_file():
        ap.error(f"{args.wheel}: no such file")
    if not zipfile.is_zipfile(args.wheel):
        ap.error(f"{args.wheel} is not a wheel (not a zip archive)")
    try:
        slim(args.wheel, args.out_dir, args.drop, args.keep_duplicates)
    except BadRequest as exc:
        ap.error(str(exc))
    except OSError as exc:  # --out-dir that cannot be made or written
        ap.error(f"--out-dir {args.out_dir}: {exc.strerror or exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
