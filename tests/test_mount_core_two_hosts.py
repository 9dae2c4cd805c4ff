"""Two mount cores on one PostgreSQL repository, driven directly (no kernel): what one host
learns by writing must not be contradicted by what it then answers from memory."""

from __future__ import annotations

import errno
import os
import stat
import uuid

import pytest

from graveler import Graveler, GravelerConfig
from graveler.config import KVConfig
from lakefuse.mount import fs as fs_module
from lakefuse.mount.attrs import Caller
from lakefuse.mount.errors import errno_for
from tests.mount_core_testutil import ino_of, writable_core

ME = Caller(uid=0, gid=0)


@pytest.fixture
def two_hosts(postgres_cluster, tmp_path):
    name = "h" + uuid.uuid4().hex[:12]
    kv = KVConfig(url=postgres_cluster.url)
    ga = Graveler(GravelerConfig(home=tmp_path / "a", kv=kv))
    ra = ga.create_repository(name, f"file://{tmp_path}/ns")
    gb = Graveler(GravelerConfig(home=tmp_path / "b", kv=kv))
    rb = gb.repository(name)
    with writable_core(ra, tmp_path / "ca") as a, writable_core(rb, tmp_path / "cb") as b:
        yield a, b
    ga.close()
    gb.close()


def _errno(fn, *args) -> int:
    with pytest.raises(Exception) as ei:
        fn(*args)
    return errno_for(ei.value)


@pytest.mark.parametrize("op", ["mkdir", "symlink", "rename_noreplace"])
def test_a_name_another_host_made_is_found_right_after_this_host_is_told_it_exists(two_hosts, monkeypatch, op):
    """A directory this host made is answered from memory for a while (a lookup of a name not in
    it: ENOENT without a read). Another host makes a name there; this host's mkdir of it is
    EEXIST (a symlink's, a rename's without replacing too) -- and the lookup that follows
    (``mkdir -p``, ``os.makedirs(exist_ok=True)``) must find it, not answer ENOENT from that
    memory (it did for up to 50 ms: 6 races in 10 failed). (An O_EXCL create right after such a
    lookup reads nothing more: across hosts it is not exclusive, docs/SEMANTICS.md says so.)"""
    monkeypatch.setattr(fs_module, "FRESH_NS", 60 * 10**9)  # memory that stays fresh: no timing luck
    a, b = two_hosts
    d_a = a.mkdir(ino_of(a, "main"), b"race", 0o755, ME).ino  # this host made it: it knows its names
    d_b = ino_of(b, "main/race")
    if op == "rename_noreplace":
        opened, _ = a.create(d_a, b"mine", stat.S_IFREG | 0o644, os.O_WRONLY, ME)
        a.flush(opened.fh)
        a.release(opened.fh)
    b.mkdir(d_b, b"p1", 0o755, ME)  # the other host
    assert a.lookup_absent(d_a, b"p1")  # (what the memory says: the documented window)
    if op == "mkdir":
        code = _errno(a.mkdir, d_a, b"p1", 0o755, ME)
    elif op == "symlink":
        code = _errno(a.symlink, d_a, b"p1", b"target", ME)
    else:
        code = _errno(a.rename, d_a, b"mine", d_a, b"p1", 1)  # RENAME_NOREPLACE
    assert code == errno.EEXIST
    assert not a.lookup_absent(d_a, b"p1")
    assert stat.S_ISDIR(a.lookup(d_a, b"p1").mode)


def test_two_hosts_renaming_one_file_at_once_move_it_once(two_hosts, monkeypatch):
    """Both hosts read the file, then stage its move: both renames succeeded and the content
    was at both targets (the "claim by rename" pattern broken). The move now stages only if the
    source is still what was read: the host that comes second gets ENOENT, as on one machine."""
    a, b = two_hosts
    opened, _ = a.create(ino_of(a, "main"), b"src.txt", stat.S_IFREG | 0o644, os.O_WRONLY, ME)
    a.write(opened.fh, 0, b"claimed once")
    a.flush(opened.fh)
    a.release(opened.fh)
    main_a, main_b = ino_of(a, "main"), ino_of(b, "main")
    assert b.lookup(main_b, b"src.txt").size == 12
    real = a.writes._touch_parent
    raced = []

    def other_host_first(tree, path, now, leaving=frozenset()):
        if leaving and not raced:  # after this host read the source, before it stages the move
            raced.append(True)
            b.rename(main_b, b"src.txt", main_b, b"by-b.txt", 0)
        return real(tree, path, now, leaving)

    monkeypatch.setattr(a.writes, "_touch_parent", other_host_first)
    assert _errno(a.rename, main_a, b"src.txt", main_a, b"by-a.txt", 0) == errno.ENOENT
    assert raced
    names = {it.path for it in a.repo.view("main").list_page(b"", b"", 10)}
    assert names == {b"by-b.txt"}
