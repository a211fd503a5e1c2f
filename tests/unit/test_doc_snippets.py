"""Every Python block of README.md and docs/*.md compiles, and says how it is meant (runnable as
written, or a ``fragment``; tests/gpu/test_doc_snippets.py runs the runnable ones)."""
from __future__ import annotations

import textwrap

import pytest

from ..doc_blocks import KINDS, ROOT, Block, all_blocks, blocks_of

BLOCKS = all_blocks()


def test_the_docs_have_python_blocks():
    if not (ROOT / "docs").exists():
        pytest.skip("no docs/ in this tree (an installed package without its sources)")
    assert len(BLOCKS) >= 10
    assert any(not block.fragment for block in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=[block.where for block in BLOCKS])
def test_block_compiles(block: Block):
    compile(block.code, block.where, "exec")


@pytest.mark.parametrize("block", BLOCKS, ids=[block.where for block in BLOCKS])
def test_block_says_how_it_is_meant(block: Block):
    unknown = set(block.words) - KINDS
    assert not unknown, f"{block.where}: unknown words {sorted(unknown)} after 'python' (known: {sorted(KINDS)})"
    assert not (block.fragment and block.background), f"{block.where}: a fragment does not run in the background"


def test_a_background_block_has_a_block_to_run_beside():
    for page in {block.path for block in BLOCKS}:
        runnable = [block for block in blocks_of(page) if not block.fragment]
        for block, following in zip(runnable, runnable[1:] + [None]):
            if block.background:
                assert following is not None and not following.background, \
                    f"{block.where}: a background block needs a runnable block after it on its page"


def test_the_extractor_reads_fences_info_and_indented_blocks(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(textwrap.dedent("""\
        Text.

        ```python
        import eglcuda
        ```

        - a list item:

          ```python fragment
          frame = pub.next_frame()
          ```

        ````python background
        print("```")
        ````

        ```sh
        python -m eglcuda info
        ```
        """))
    blocks = blocks_of(page)
    assert [(b.line, b.words, b.code) for b in blocks] == [
        (3, (), "import eglcuda\n"),
        (9, ("fragment",), "frame = pub.next_frame()\n"),
        (13, ("background",), 'print("```")\n'),
    ]


def test_a_block_that_does_not_compile_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```python\nwith eglcuda.Publisher(...) as pub\n```\n")
    (block,) = blocks_of(page)
    with pytest.raises(SyntaxError):
        compile(block.code, "page.md", "exec")
