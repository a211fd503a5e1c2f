"""The Python blocks of README.md and docs/*.md, for the tests that compile and run them.

A fenced block whose info string starts with ``python`` is one of them. The words after
``python`` say how it is meant (docs/architecture.md, "Code in the docs"):

- none: runs as written, in a fresh interpreter, imports and definitions included;
- ``fragment``: a piece of a program (names defined elsewhere, ``...`` for your code); it is
  only compiled;
- ``background``: runs as written, in the background, while the page's next runnable block runs
  (a publisher and its subscriber in two terminals); both must succeed.
"""
from __future__ import annotations

import dataclasses
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
KINDS = frozenset({"fragment", "background"})
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")


@dataclasses.dataclass(frozen=True)
class Block:
    path: pathlib.Path
    line: int  # the line of the opening fence (1-based)
    words: tuple[str, ...]  # the info string's words after "python"
    code: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def fragment(self) -> bool:
        return "fragment" in self.words

    @property
    def background(self) -> bool:
        return "background" in self.words


def pages() -> list[pathlib.Path]:
    """README.md and the Markdown pages of docs/ (none where the tree has no docs)."""
    found = [ROOT / "README.md"] if (ROOT / "README.md").exists() else []
    return found + sorted((ROOT / "docs").glob("*.md"))


def blocks_of(path: pathlib.Path) -> list[Block]:
    """Every fenced block of ``path`` whose language is Python, in page order."""
    found: list[Block] = []
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        words = tuple(opening["info"].split())
        body: list[str] = []
        end = index + 1
        while end < len(lines):
            closing = _FENCE.match(lines[end])
            if closing and closing["fence"].startswith(fence) and not closing["info"].strip():
                break
            line = lines[end]
            body.append(line[len(indent):] if line.startswith(indent) else line.lstrip())
            end += 1
        if words and words[0] == "python":
            found.append(Block(path, index + 1, words[1:], "\n".join(body) + "\n"))
        index = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for page in pages() for block in blocks_of(page)]
