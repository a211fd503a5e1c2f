"""Text patches of a copy of the package, for the experiment scripts of research/remote_runs (_knobs45.py, _trace46.py)."""


def patch(path: str, pairs: list[tuple[str, str]]) -> None:
    """Replace each ``before`` in ``path`` by its ``after`` (the first one); stop with the place when one is
    missing (the code moved on since the script was written)."""
    text = open(path).read()
    for before, after in pairs:
        if before not in text:
            raise SystemExit(f"{path}: not found: {before[:60]!r}")
        text = text.replace(before, after, 1)
    open(path, "w").write(text)
