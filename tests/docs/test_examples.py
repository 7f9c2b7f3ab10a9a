"""Every Python block of README.md and docs/ runs as written, as torch's tutorials are executed: a page's blocks run
top to bottom in one namespace (a later block may use what an earlier one made), in a fresh working directory.

A fence names what a block needs: ```` ```python ```` runs here; ```` ```python cuda ```` needs a GPU (the page's
`cuda` test runs it with the page's other blocks); ```` ```python no-run: <why> ```` is not run, and says why."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```[ \t]*(\S*)[ \t]*(.*?)[ \t]*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # the line of the opening fence
    kind: str  # "run", "cuda" or "no-run"
    reason: str
    source: str


def _name(page: Path) -> str:
    return str(page.relative_to(ROOT)) if page.is_relative_to(ROOT) else page.name


def blocks(page: Path) -> list[Block]:
    """The Python blocks of a page. A fence's language is its first word; what follows it says what the block
    needs. Unclosed fences and unknown needs are errors: they would silently leave a block untested."""
    found: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and not lines[i].startswith("```"):
            i += 1
        if i == len(lines):
            raise ValueError(f"{_name(page)}:{start + 1}: a fence is never closed")
        language, need = opening.group(1), opening.group(2)
        i += 1
        if language.lower() not in ("python", "py", "python3"):
            continue
        if language != "python":
            raise ValueError(f"{_name(page)}:{start + 1}: write the fence as ```python, not ```{language}")
        source = "\n".join(lines[start + 1 : i - 1]) + "\n"
        if need == "":
            found.append(Block(page, start + 1, "run", "", source))
        elif need == "cuda":
            found.append(Block(page, start + 1, "cuda", "", source))
        elif need.startswith("no-run:") and need[len("no-run:") :].strip():
            found.append(Block(page, start + 1, "no-run", need[len("no-run:") :].strip(), source))
        else:
            raise ValueError(
                f"{_name(page)}:{start + 1}: unknown fence '```python {need}': write ```python (runs), "
                "```python cuda (needs a GPU) or ```python no-run: <why it cannot run>"
            )
    return found


def _run(page_blocks: list[Block]) -> None:
    namespace: dict[str, object] = {"__name__": "__main__"}
    for block in page_blocks:
        # Line numbers in a traceback are the page's own: the block is compiled as if it stood where it does.
        code = compile("\n" * block.line + block.source, str(block.page), "exec")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # e.g. reduce-overhead on a CPU says it captures nothing
            exec(code, namespace)
        torch._dynamo.reset()


def _cases() -> list:
    cases = []
    for page in PAGES:
        found = blocks(page)
        name = _name(page)
        if any(b.kind == "run" for b in found):
            cases.append(pytest.param(page, "run", id=name))
        if any(b.kind == "cuda" for b in found):
            cases.append(pytest.param(page, "cuda", id=f"{name}[cuda]", marks=pytest.mark.cuda))
    return cases


@pytest.mark.slow  # Inductor compiles: about two minutes for every page on the 2-core machine
@pytest.mark.parametrize(("page", "lane"), _cases())
def test_a_pages_python_blocks_run_as_written(page: Path, lane: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    wanted = ("run",) if lane == "run" else ("run", "cuda")
    _run([b for b in blocks(page) if b.kind in wanted])


def test_every_fence_is_understood_and_every_block_that_does_not_run_says_why():
    counts = {"run": 0, "cuda": 0, "no-run": 0}
    for page in PAGES:
        for block in blocks(page):  # raises on an unknown fence or a no-run without a reason
            counts[block.kind] += 1
    assert counts["run"] > counts["no-run"], counts


def test_a_block_that_fails_names_its_page_and_line(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("Text.\n\n```python\nx = 1\n```\n\nMore.\n\n```python\nassert x == 2, 'x is not 2'\n```\n")
    with pytest.raises(AssertionError, match="x is not 2") as failure:
        _run(blocks(page))
    where = failure.traceback[-1]
    assert Path(where.path) == page and where.lineno + 1 == 10


def test_fences_that_would_hide_a_block_are_refused(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text("```python later\nx = 1\n```\n")
    with pytest.raises(ValueError, match=r"page.md:1: unknown fence '```python later'.*no-run: <why"):
        blocks(page)
    page.write_text("```python no-run:\nx = 1\n```\n")
    with pytest.raises(ValueError, match="unknown fence"):
        blocks(page)
    page.write_text("```Python\nx = 1\n```\n")
    with pytest.raises(ValueError, match="write the fence as ```python"):
        blocks(page)
    page.write_text("```python\nx = 1\n")
    with pytest.raises(ValueError, match=r"page\.md:1: a fence is never closed"):
        blocks(page)
