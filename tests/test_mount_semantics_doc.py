"""docs/SEMANTICS.md names, for each promise, the test that asserts it: each must exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _test_names() -> set[str]:
    names = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                names.add(node.name)
    return names


def test_every_promise_names_an_existing_test():
    doc = (ROOT / "docs" / "SEMANTICS.md").read_text()
    cited = set(re.findall(r"`(test_[a-z0-9_]+)`", doc))
    assert len(cited) >= 20
    missing = cited - _test_names()
    assert not missing, f"docs/SEMANTICS.md cites tests that do not exist: {sorted(missing)}"


def _promise_blocks(doc: str) -> list[tuple[str, str]]:
    """(section, text) of every bullet of the page (a bullet and its indented continuation lines)."""
    blocks: list[tuple[str, str]] = []
    section, cur = "", None
    for line in doc.splitlines():
        if line.startswith("#"):
            section = line
            if cur is not None:
                blocks.append(cur)
            cur = None
        elif line.startswith("- "):
            if cur is not None:
                blocks.append(cur)
            cur = (section, line)
        elif cur is not None and line.startswith("  ") and line.strip():
            cur = (cur[0], cur[1] + "\n" + line)
        elif cur is not None:
            blocks.append(cur)
            cur = None
    if cur is not None:
        blocks.append(cur)
    return blocks


# Sections that list what is NOT supported, or say how the page is built: no test asserts an absence.
_NOT_PROMISES = ("## Not supported",)


def test_every_promise_block_cites_a_test():
    doc = (ROOT / "docs" / "SEMANTICS.md").read_text()
    blocks = [b for b in _promise_blocks(doc) if not b[0].startswith(_NOT_PROMISES)]
    assert len(blocks) >= 30
    uncited = [f"{sec}: {text.splitlines()[0][:80]}" for sec, text in blocks if "`test_" not in text]
    assert not uncited, "promises in docs/SEMANTICS.md that cite no test:\n" + "\n".join(uncited)
