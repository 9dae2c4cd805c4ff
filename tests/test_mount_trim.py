"""The inode bound's trim (lakefuse/mount/trim.py) against a table of nodes: what it asks the kernel
to drop, that it does not ask a kept name again, and that it does not read the whole table at
every round while what is over the bound is not its to drop. (The real mount's trim:
``test_mount_open_flags``.)"""

from __future__ import annotations

from types import SimpleNamespace

from lakefuse.mount.inodes import Kind
from lakefuse.mount.trim import ASKED_S, RESCAN_S, Trimmer


class _Inodes:
    def __init__(self):
        self.nodes: list = []
        self.snapshots = 0

    def __len__(self):
        return len(self.nodes)

    def snapshot(self):
        self.snapshots += 1
        return list(self.nodes)


class _Stats:
    def __init__(self):
        self.counts: dict = {}

    def add(self, name, n=1):
        self.counts[name] = self.counts.get(name, 0) + n


def _fs(bound: int):
    fs = SimpleNamespace(config=SimpleNamespace(max_inodes=bound), inodes=_Inodes(), stats=_Stats(), trees=[])
    fs.immutable_trees = lambda: list(fs.trees)
    return fs


def _add(fs, tree, n: int, kind=Kind.FILE, opens=0):
    for _ in range(n):
        ino = len(fs.inodes.nodes) + 10
        fs.inodes.nodes.append(SimpleNamespace(ino=ino, tree=tree, kind=kind, opens=opens, parent_ino=1,
                                               path=b"d/f%d" % ino, trim_asked=float("-inf")))


def test_it_drops_files_of_the_oldest_commit_trees_and_never_asks_for_a_name_the_kernel_kept_again():
    fs = _fs(100)
    old, new, newest, branch = (SimpleNamespace(key=k, immutable=imm) for k, imm in
                                (("c1", True), ("c2", True), ("c3", True), ("b", False)))
    fs.trees = [old, new, newest]  # (the oldest first)
    _add(fs, branch, 30)
    _add(fs, newest, 40)
    _add(fs, new, 40)
    _add(fs, old, 40)
    _add(fs, old, 5, opens=1)  # (open: never dropped)
    names = {n.path.rpartition(b"/")[2]: n for n in fs.inodes.nodes}
    asked: list = []
    now = [1000.0]
    t = Trimmer(fs, lambda parent, name: asked.append(name), clock=lambda: now[0])
    # 155 inodes, 80 to keep: the oldest trees' unopened files, a tree at a time, until 75 are asked
    assert t() == 80 and fs.stats.counts["inodes_handed_back"] == 80
    assert [names[a].tree.key for a in asked] == ["c1"] * 40 + ["c2"] * 40
    assert all(names[a].opens == 0 for a in asked)
    # the kernel kept every name (none forgotten): the next rounds ask for none of them again
    asked.clear()
    now[0] += 0.25
    assert t() == 40 and [names[a].tree.key for a in asked] == ["c3"] * 40
    asked.clear()
    now[0] += RESCAN_S
    assert t() == 0 and asked == []
    now[0] += ASKED_S
    assert t() == 80  # long after: asked again (the oldest first)
    # names the kernel forgot and looked up again are new nodes: asked for at once
    asked.clear()
    now[0] += RESCAN_S
    fs.inodes.nodes = [n if n.tree is not newest else SimpleNamespace(**{**vars(n), "trim_asked": float("-inf")})
                       for n in fs.inodes.nodes]
    assert t() == 40 and [names[a].tree.key for a in asked] == ["c3"] * 40


def test_while_what_is_over_the_bound_is_not_its_to_drop_it_reads_the_table_again_only_later_or_on_growth():
    fs = _fs(1000)
    branch = SimpleNamespace(key="b", immutable=False)
    _add(fs, branch, 1200)  # over the bound with branch files only: nothing to drop
    now = [0.0]
    t = Trimmer(fs, lambda parent, name: None, clock=lambda: now[0])
    assert t() == 0 and t.passes == 1
    for _ in range(10):  # the stamp watch's rounds, 0.25 s apart: no pass over the table
        now[0] += 0.25
        assert t() == 0
    assert t.passes == 1 and fs.inodes.snapshots == 1
    _add(fs, branch, 60)  # grew by 6% of the bound: looked at again
    assert t() == 0 and t.passes == 2
    now[0] += RESCAN_S  # and after a while anyway
    assert t() == 0 and t.passes == 3
    tag = SimpleNamespace(key="t", immutable=True)
    fs.trees = [tag]
    now[0] += RESCAN_S
    _add(fs, tag, 500)
    assert t() == 500 and t.passes == 4  # what it may drop, it drops (and still too few: it waits again)
