"""What the kernel-less tests of the mount core share: a writable core over a spool, the
inode of a path, and the persistent KV backends its branch-tree tests run on."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

from lakefuse.mount.fs import FsConfig
from lakefuse.mount.inodes import ROOT_INO
from lakefuse.mount.spool import Spool, SpoolConfig
from lakefuse.mount.writes import WritableFilesystem

# the mount on LMDB, and on a PostgreSQL shared by many hosts (``kv_backend`` of tests/conftest.py)
PERSISTENT_KVS = pytest.mark.parametrize("kv_backend", ["lmdb", "postgres"], indirect=True)


@contextmanager
def writable_core(repo, cache_dir: Path, **config) -> Iterator[WritableFilesystem]:
    """A writable mount core of ``repo`` as uid 1000 / gid 100, its spool under ``cache_dir``
    (closed after the block); ``config``: more :class:`FsConfig` fields."""
    spool = Spool(repo, SpoolConfig(Path(cache_dir), repo.name))
    try:
        yield WritableFilesystem(repo, FsConfig(uid=1000, gid=100, **config), spool=spool)
    finally:
        spool.close()


def ino_of(fs, path: str) -> int:
    """The inode of ``path`` (``main/data/a.csv``; ``/`` is the root), looked up name by name."""
    ino = ROOT_INO
    for part in path.strip("/").split("/"):
        if part:
            ino = fs.lookup(ino, part.encode()).ino
    return ino


@contextmanager
def seeded_repo(tmp_path: Path, name: str, files: dict[str, bytes], request=None, tag: bool = True):
    """A repository whose ``main`` holds ``files``, committed ("base") and tagged ``v1``; on the
    KV backend a ``kv_backend`` parametrization of the test chose, when it has one."""
    from tests.graveler_testutil import make_repo

    if request is not None and "kv_backend" in request.fixturenames:
        request.getfixturevalue("kv_backend")  # before the repository is made on it
    r = make_repo(tmp_path, name)
    for path, data in files.items():
        r.upload("main", path, data)
    r.commit("main", "base")
    if tag:
        r.create_tag("v1", "main")
    try:
        yield r
    finally:
        r.close()


def readdir_page(fs, fh: int, off: int) -> list:
    """One page of a directory handle's entries from ``off``, as the adapter gets it: the fast
    path, else a fill and the fast path again (empty: the end)."""
    entries = fs.readdir_fast(fh, off)
    if entries is None:
        fs.readdir_fill(fh, off)
        entries = fs.readdir_fast(fh, off)
    return entries


def readdir_all(fs, ino: int, start: int = 0, stop_after: int | None = None) -> list[tuple[object, object]]:
    """readdir as the adapter drives it (fast path, else fill and retry): (entry, accepted attr)
    pairs from offset ``start``, at most ``stop_after``; the directory handle released after."""
    fh = fs.opendir(ino)
    out, off = [], start
    try:
        while True:
            entries = readdir_page(fs, fh, off)
            if not entries:
                return out
            for e in entries:
                out.append((e, fs.accept(fh, e)))
                off = e.offset
                if stop_after is not None and len(out) >= stop_after:
                    return out
    finally:
        fs.releasedir(fh)
