"""Random operation sequences on a branch tree of a real mount, against a local directory.

Every operation is applied to a plain local directory (the reference) and to a
branch tree of the mount; results -- success or the errno -- must agree, and so
must the whole tree (names, kinds, file contents) after each step. Commits through
the control file, resets, changes made behind the mount's back through graveler
(as the CLI would), and remounts are mixed in (mountpoint-s3's reftests, in
hypothesis's RuleBasedStateMachine form).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from graveler.home import Graveler
from graveler.config import GravelerConfig
from tests.mount_testutil import MountProc, lakefuse_cmd, needs_fuse

pytestmark = needs_fuse

REPO = "wmodel"
NAMES = st.sampled_from(["a", "b", "c", "d.txt", "e e"])
DATA = st.binary(max_size=3000)


def _snapshot(root: Path) -> dict:
    out = {}
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != ".lakefuse")
        rel = os.path.relpath(d, root)
        for x in dirs:
            out[os.path.normpath(os.path.join(rel, x))] = "dir"
        for f in files:
            out[os.path.normpath(os.path.join(rel, f))] = (Path(d) / f).read_bytes()
    return out


class _State:
    home: Path
    mount: MountProc | None = None
    counter = 0


_S = _State()


def _outcome(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return e.errno


class WritableBranchModel(RuleBasedStateMachine):
    @initialize()
    def setup(self):
        _S.counter += 1
        self.branch = f"m{_S.counter}"
        self.mp = Path(_S.mount.mountpoint)
        os.mkdir(self.mp / self.branch)  # a fresh branch from main (empty)
        self.ref = Path(tempfile.mkdtemp(prefix="lakefuse-model-"))
        self.committed = Path(tempfile.mkdtemp(prefix="lakefuse-model-c-"))
        self.paths: list[str] = []  # paths that may exist (for picking targets)
        self.remounts = 0

    def teardown(self):
        shutil.rmtree(self.ref, ignore_errors=True)
        shutil.rmtree(self.committed, ignore_errors=True)

    @property
    def tree(self) -> Path:
        return self.mp / self.branch

    def both(self, op):
        a = _outcome(lambda: op(self.ref))
        b = _outcome(lambda: op(self.tree))
        assert a == b, f"reference: {a}, mount: {b}"

    def pick(self, data) -> str:
        choices = self.paths + ["a", "b/c"]
        return data.draw(st.sampled_from(choices))

    def _remember(self, p: str):
        if p not in self.paths:
            self.paths.append(p)

    # -- operations
    @rule(dirname=st.sampled_from(["", "x", "x/y", "z"]), name=NAMES, data=DATA)
    def write_file(self, dirname, name, data):
        p = os.path.join(dirname, name)
        self.both(lambda r: (r / p).write_bytes(data))
        self._remember(p)

    @rule(data=st.data(), extra=DATA)
    def append(self, data, extra):
        p = self.pick(data)

        def op(r):
            with open(r / p, "ab") as f:
                f.write(extra)
        self.both(op)

    @rule(data=st.data(), size=st.integers(0, 4000))
    def truncate(self, data, size):
        p = self.pick(data)
        self.both(lambda r: os.truncate(r / p, size))

    @rule(data=st.data())
    def unlink(self, data):
        p = self.pick(data)
        self.both(lambda r: os.unlink(r / p))

    @rule(d=st.sampled_from(["x", "x/y", "z", "x/y/w"]))
    def mkdir(self, d):
        self.both(lambda r: os.mkdir(r / d))
        self._remember(d)

    @rule(data=st.data())
    def rmdir(self, data):
        p = self.pick(data)
        self.both(lambda r: os.rmdir(r / p))

    @rule(data=st.data(), dst=st.sampled_from(["a", "x/a", "z", "q", "x/y/q"]))
    def rename(self, data, dst):
        src = self.pick(data)
        if dst.startswith(src + "/"):
            return  # moving into itself: EINVAL both, already covered by the unit tests
        self.both(lambda r: os.rename(r / src, r / dst))
        self._remember(dst)

    @rule(mode=st.sampled_from([0o600, 0o644, 0o755]), data=st.data())
    def chmod(self, mode, data):
        p = self.pick(data)
        self.both(lambda r: os.chmod(r / p, mode))

    @rule()
    def commit(self):
        ok = _outcome(lambda: (self.tree / ".lakefuse" / "commit").write_text("model step\n"))
        assert ok in ("ok", 16)  # EBUSY: nothing to commit
        shutil.rmtree(self.committed)
        shutil.copytree(self.ref, self.committed, symlinks=True)

    @rule()
    def reset_all(self):
        (self.tree / ".lakefuse" / "reset").write_text("*\n")
        shutil.rmtree(self.ref)
        shutil.copytree(self.committed, self.ref, symlinks=True)

    @rule(name=NAMES, data=DATA)
    def behind_the_mount(self, name, data):
        """A write through graveler (as the CLI does) while the mount is up."""
        p = f"cli/{name}"
        g = Graveler(GravelerConfig.from_home(_S.home))
        try:
            g.repository(REPO).upload(self.branch, p, data)
        finally:
            g.close()
        os.makedirs(self.ref / "cli", exist_ok=True)
        if (self.ref / p).is_dir():
            shutil.rmtree(self.ref / p)
        (self.ref / p).write_bytes(data)
        self._remember(p)

    @precondition(lambda self: self.remounts < 1)
    @rule()
    def remount(self):
        self.remounts += 1
        _S.mount.stop()
        _S.mount = MountProc(_S.home, REPO, _S.mount.mountpoint, "--branch-timeout", "0").start()

    @invariant()
    def same_tree(self):
        want = _snapshot(self.ref)
        got = _snapshot(self.tree)
        assert got == want


@pytest.fixture(scope="module")
def model_mount(tmp_path_factory):
    import subprocess

    home = tmp_path_factory.mktemp("mhome")
    subprocess.run(lakefuse_cmd(home, "repo", "create", f"lakefs://{REPO}"), check=True, capture_output=True)
    _S.home = home
    _S.mount = MountProc(home, REPO, tmp_path_factory.mktemp("mmnt"), "--branch-timeout", "0").start()
    yield
    _S.mount.stop()


@pytest.mark.slow
def test_branch_tree_matches_a_local_directory(model_mount):
    run = WritableBranchModel.TestCase
    run.settings = settings(max_examples=12, stateful_step_count=30, deadline=None,
                            suppress_health_check=list(HealthCheck))
    run().runTest()
