"""Model-based: commit random trees (odd names included) and compare what a real mount shows
(os.walk + contents) with a model of the path rule (graveler/paths.py, docs/SEMANTICS.md)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from graveler import paths
from graveler import Graveler
from graveler import GravelerConfig
from tests.graveler_testutil import FAST_KV
from tests.mount_testutil import MountProc, needs_fuse

pytestmark = needs_fuse

_plain = st.text(alphabet="abcxyz019-_.~#@ %+=,\u00e9\u4e2d", min_size=1, max_size=12).filter(
    lambda s: s not in (".", ".."))
component = st.one_of(
    _plain, _plain, _plain,
    st.just(".lakefuse"),
    st.just(""),  # an empty component: "a//b", or a marker "d/" at the end
    st.integers(250, 262).map(lambda n: "L" * n),  # around NAME_MAX
)


@st.composite
def trees(draw) -> dict[str, bytes]:
    keys = draw(st.lists(st.lists(component, min_size=1, max_size=4).map("/".join), min_size=1, max_size=14))
    out = {}
    for k in keys:
        if not k or k.startswith("/") and k == "/":
            continue
        kb = k.encode()
        try:
            paths.check_path(kb, max_bytes=480)
        except Exception:
            continue
        out[k] = b"" if k.endswith("/") else draw(st.binary(max_size=40))
    # an object and a directory of the same name, now and then
    if out and draw(st.booleans()):
        k = next(iter(out)).rstrip("/")
        if k and paths.fs_path_problem(k.encode()) is None:
            out[k + "/inner"] = b"inner"
            out.setdefault(k, b"shadowed")
    return out


def model(tree: dict[str, bytes]) -> tuple[set[str], dict[str, bytes]]:
    """(directories, files -> content) that the mount shows for ``tree``."""
    keys = [k.encode() for k in tree]
    dirs: set[str] = set()
    for kb in keys:
        parts = kb.split(b"/")
        for i in range(1, len(parts)):
            if any(paths.name_problem(p) for p in parts[:i]):
                break
            dirs.add(b"/".join(parts[:i]).decode())
    files = {}
    for k, v in tree.items():
        kb = k.encode()
        if k.endswith("/") or paths.fs_path_problem(kb) is not None:
            continue
        if k in dirs:
            continue  # the directory wins
        files[k] = v
    return dirs, files


@pytest.fixture(scope="module")
def mounted(tmp_path_factory):
    base = tmp_path_factory.mktemp("model")
    g = Graveler(GravelerConfig(home=base / "home", kv=FAST_KV))
    r = g.create_repository("model", f"file://{base}/ns")
    empty = r.get_commit("main").id
    m = MountProc(base / "home", "model", base / "mnt").start()
    try:
        yield r, base / "mnt", empty
    finally:
        m.stop()
        g.close()


_counter = [0]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(tree=trees())
def test_mount_shows_the_model(mounted, tree):
    r, mp, empty = mounted
    _counter[0] += 1
    branch = f"h{_counter[0]}"
    r.create_branch(branch, empty)
    for k, v in tree.items():
        r.upload(branch, k, v)
    c = r.commit(branch, "random tree", allow_empty=True)
    want_dirs, want_files = model(tree)
    for ref in (c.id, branch):
        root = mp / ref
        got_dirs, got_files = set(), {}
        for d, dnames, fnames in os.walk(root):
            rel = Path(d).relative_to(root).as_posix()
            if rel != ".":
                got_dirs.add(rel)
            for f in fnames:
                p = Path(d) / f
                got_files[p.relative_to(root).as_posix()] = p.read_bytes()
        assert got_dirs == want_dirs, (ref, tree)
        assert got_files == want_files, (ref, tree)
