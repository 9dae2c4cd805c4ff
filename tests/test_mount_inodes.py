"""The inode table's numbers for a plain READDIR (``InodeTable.numbers``): no node made, no
lookup counted, and the number a listing shows is the one the name's first lookup gets."""

from __future__ import annotations

from types import SimpleNamespace

from lakefuse.mount import inodes
from lakefuse.mount.inodes import InodeTable, Kind

TAG = SimpleNamespace(key=("tag", "v1"), immutable=True)
BRANCH = SimpleNamespace(key=("branch", "main"), immutable=False)


def _key(tree, path: bytes) -> tuple:
    return ("f", tree.key, path)


def test_listed_numbers_are_the_numbers_of_the_first_lookups():
    t = InodeTable()
    keys = [_key(tree, p) for tree in (TAG, BRANCH) for p in (b"d/a", b"d/b", b"d/c")]
    nums = t.numbers(keys)
    assert len(set(nums)) == len(nums) and len(t) == 1  # distinct; no node made (the root only)
    assert t.numbers(keys) == nums  # listed again: the same numbers
    for key, ino in zip(keys, nums):
        node, new = t.acquire(key, Kind.FILE, TAG if key[1] == TAG.key else BRANCH, key[2], 1)
        assert new and node.ino == ino and node.nlookup == 1


def test_a_live_node_is_listed_under_its_number_and_keeps_its_lookup_count():
    t = InodeTable()
    node, _ = t.acquire(_key(BRANCH, b"x"), Kind.FILE, BRANCH, b"x", 1, lookups=2)
    assert t.numbers([_key(BRANCH, b"x")]) == [node.ino]
    assert node.nlookup == 2


def test_a_forgotten_commit_file_is_listed_under_the_number_it_had():
    t = InodeTable()
    node, _ = t.acquire(_key(TAG, b"x"), Kind.FILE, TAG, b"x", 1)
    t.forget(node.ino, 1)
    assert t.peek(node.ino) is None
    assert t.numbers([_key(TAG, b"x")]) == [node.ino]


def test_a_replaced_branch_file_is_listed_under_a_new_number():
    t = InodeTable()
    old, _ = t.acquire(_key(BRANCH, b"x"), Kind.FILE, BRANCH, b"x", 1)
    t.replace(old)  # (a writer after a kernel reader: the kernel still holds the old inode)
    [ino] = t.numbers([_key(BRANCH, b"x")])
    assert ino != old.ino
    assert t.acquire(_key(BRANCH, b"x"), Kind.FILE, BRANCH, b"x", 1)[0].ino == ino


def test_listed_numbers_are_bounded(monkeypatch):
    monkeypatch.setattr(inodes, "KEEP_GONE", 10)
    t = InodeTable()
    nums = t.numbers([_key(TAG, b"f%d" % i) for i in range(25)])
    assert len(set(nums)) == 25 and len(t._gone) <= 10
    # past the bound a name may get another number at its lookup, never one in use
    node, _ = t.acquire(_key(TAG, b"f0"), Kind.FILE, TAG, b"f0", 1)
    assert node.ino not in nums[1:]
