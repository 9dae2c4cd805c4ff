"""Emptying a large directory through a branch tree costs each name the same, whatever the order.

A directory made by the CLI (or an import) has no marker: each unlink must tell whether entries
remain (else a marker keeps the emptied directory, as POSIX says), and the kernel asks for the
directory's attributes after each unlink. Both used to read the directory from its start, past
every name already removed (their staged tombstones): ``rm -rf`` of 4,000 names took 16 s and
``rsync --delete`` of 20,000 fell behind for good. Counted here: the staged entries read.
"""

from __future__ import annotations

import pytest

from graveler.staging import StagingManager
from tests.mount_core_testutil import ino_of, readdir_all, seeded_repo, writable_core

N = 1500


def _names(fs, ino: int) -> list[bytes]:
    return [e.name for e, _ in readdir_all(fs, ino) if e.name not in (b".", b"..")]


@pytest.fixture
def staged_reads(monkeypatch):
    """How many staged entries the branch's reads took from the KV (every scan, summed)."""
    count = [0]
    scan_txn = StagingManager.scan_txn

    def counting(self, *args, **kwargs):
        out = scan_txn(self, *args, **kwargs)
        count[0] += len(out)
        return out

    monkeypatch.setattr(StagingManager, "scan_txn", counting)
    return count


@pytest.mark.parametrize("order", ["forward", "reverse", "listed-forward"])
def test_emptying_a_committed_directory_reads_no_more_per_name_as_it_goes(tmp_path, staged_reads, order):
    names = [f"f{i:05d}".encode() for i in range(N)]
    with seeded_repo(tmp_path, "unl", {f"big/{n.decode()}": b"x" for n in names} | {"other": b"o"}) as repo:
        with writable_core(repo, tmp_path / "cache") as fs:
            big = ino_of(fs, "main/big")
            if order == "listed-forward":  # as rm -rf and rsync --delete: the directory read first
                assert len(_names(fs, big)) == N
            staged_reads[0] = 0
            for name in (reversed(names) if order == "reverse" else names):
                fs.unlink(big, name)
                fs.getattr(big)  # what the kernel asks after each unlink
            # linear: a few entries per name (it was about N * N / 2 = 1.1M here)
            assert staged_reads[0] < 40 * N, staged_reads[0]
            # the emptied directory stays, with a marker, and is empty; its sibling is untouched
            assert _names(fs, big) == []
            assert repo.view("main").stat(b"big").marker is not None
            assert set(_names(fs, ino_of(fs, "main"))) >= {b"big", b"other"}
            fs.rmdir(ino_of(fs, "main"), b"big")
            assert [it.path for it in repo.view("main").list_page(b"", b"", 10)] == [b"other"]


def test_a_directory_keeps_no_marker_while_names_remain_after_its_witness_went(tmp_path):
    """The name last seen in a directory (its witness) removed by another writer: the next
    unlink finds what remains by reading, and adds no marker while names remain."""
    with seeded_repo(tmp_path, "wit", {"d/a": b"a", "d/b": b"b", "d/c": b"c"}) as repo:
        with writable_core(repo, tmp_path / "cache") as fs:
            d = ino_of(fs, "main/d")
            readdir_all(fs, d)  # the witness: d/c
            repo.stage_many("main", [("d/c", None)])  # gone behind the mount
            fs.unlink(d, b"a")
            assert repo.view("main").stat(b"d").marker is None  # d/b remains: no marker
            fs.unlink(d, b"b")
            assert repo.view("main").stat(b"d").marker is not None  # emptied: it stays, with one
