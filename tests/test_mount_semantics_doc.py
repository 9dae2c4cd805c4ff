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
