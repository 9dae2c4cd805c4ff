"""The structure the design promises, checked on the source (no imports run).

* no import circle among graveler's or lakefuse's modules, counting every import
  statement (module level, inside functions, under TYPE_CHECKING);
* ``import lmdb`` and ``import psycopg`` (``psycopg_pool``) only under graveler/kv/ (the KV seam);
* graveler imports nothing of lakefuse, trio or pyfuse3;
* no source file over 800 lines outside the compiled ``.pyx`` kernels;
* no subclass of the mount's filesystem core.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("graveler", "lakefuse")
MAX_LINES = 800


def modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in sorted((ROOT / pkg).rglob("*.py")):
            if "proto" in p.parts and p.name.endswith("_pb2.py"):
                continue
            rel = p.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules ``name`` imports (any statement anywhere in the file)."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known:
                    out.add(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_pkg else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                sub = f"{mod}.{a.name}"
                if sub in known:
                    out.add(sub)  # from package import submodule
                elif mod in known:
                    out.add(mod)
    out.discard(name)
    return out


def graph() -> dict[str, set[str]]:
    mods = modules()
    known = set(mods)
    return {m: imports(m, p, known) for m, p in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    # the package __init__ files re-export lazily; an edge into them is not an edge into their children
    g = graph()
    assert cycles(g) == []


def test_lmdb_and_psycopg_are_imported_only_by_the_kv_package():
    for name, path in modules().items():
        tree = ast.parse(path.read_text())
        for driver in ("lmdb", "psycopg", "psycopg_pool"):
            uses = any(isinstance(n, ast.Import) and any(a.name.split(".")[0] == driver for a in n.names)
                       or isinstance(n, ast.ImportFrom) and not n.level and (n.module or "").split(".")[0] == driver
                       for n in ast.walk(tree))
            if uses:
                assert name.startswith("graveler.kv."), f"{name} imports {driver}"


def test_graveler_knows_nothing_of_fuse_or_trio():
    for name, path in modules().items():
        if not name.startswith("graveler"):
            continue
        for n in ast.walk(ast.parse(path.read_text())):
            mods = [a.name for a in n.names] if isinstance(n, ast.Import) else (
                [n.module or ""] if isinstance(n, ast.ImportFrom) and not n.level else [])
            for m in mods:
                assert m.split(".")[0] not in ("lakefuse", "trio", "pyfuse3"), f"{name} imports {m}"


def test_no_source_file_over_800_lines():
    long = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            if p.name.endswith("_pb2.py"):
                continue
            n = len(p.read_text().splitlines())
            if n > MAX_LINES:
                long[str(p.relative_to(ROOT))] = n
    assert long == {}


def test_no_subclass_of_the_filesystem_core():
    """The mount core is one class that dispatches to small types, not a tower of overrides."""
    for name, path in modules().items():
        if not name.startswith("lakefuse.mount"):
            continue
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in n.bases}
                assert "Filesystem" not in bases, f"{name}.{n.name} subclasses the filesystem core"
