"""A process of one user (root) reading a local repository of another reads only what its owner may.

Found by a security tour: alice staged an entry whose FULL address named a root-only file,
committed and wrote a refs dump; root mounted her home (or the dump) with ``allow_other`` and
bob read the file through the mount. A symbolic link planted in her namespace did the same
with a RELATIVE address. Now such reads are refused (``Forbidden``; ``EACCES`` through the
mount), and the check cuts both ways: what ordinary use made -- objects the owner uploaded,
objects root's own mount wrote into her namespace, files imported from places she may read --
is served as before.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from graveler import Graveler, GravelerConfig
from graveler.errors import Forbidden
from graveler.model import AddressType, Entry
from tests.mount_testutil import MountProc, needs_fuse

OWNER = 54321  # a user of no name: the namespace's owner (the tests run as root)

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to give files to another user)")


@pytest.fixture
def base():
    d = Path(tempfile.mkdtemp(prefix="lakefuse-readfor-", dir="/tmp"))  # (pytest's tmp is root-only: 0700)
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _full(path: Path) -> Entry:
    data = path.read_bytes()
    return Entry(address=f"file://{path}", size=len(data), etag=hashlib.md5(data).hexdigest(),
                 last_modified_ns=time.time_ns(), address_type=AddressType.FULL)


def _file(path: Path, data: bytes, mode: int, uid: int = 0) -> Path:
    path.write_bytes(data)
    os.chmod(path, mode)
    os.chown(path, uid, -1)
    return path


def _repository(base: Path):
    """A repository in ``base``/ns (entries of every kind), the namespace then given to OWNER."""
    ns = base / "ns"
    g = Graveler(GravelerConfig(home=base / "home"))
    repo = g.create_repository("readfor", f"file://{ns}")
    repo.upload("main", "uploaded-by-root.txt", b"root's own write into the namespace\n")
    for d, mode in (("secret", 0o755), ("hidden", 0o700), ("public", 0o755)):
        (base / d).mkdir(mode=mode)
        os.chmod(base / d, mode)
    items = {
        "root-only.txt": _full(_file(base / "secret" / "s.txt", b"ROOT ONLY SECRET\n", 0o600)),
        "behind-0700.txt": _full(_file(base / "hidden" / "h.txt", b"readable, in a root-only dir\n", 0o644)),
        "public.txt": _full(_file(base / "public" / "p.txt", b"anyone may read it\n", 0o644)),
        "owners.txt": _full(_file(base / "public" / "o.txt", b"the owner's own, mode 0600\n", 0o600, OWNER)),
    }
    planted = ns / "data" / "planted"
    planted.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(base / "secret" / "s.txt", planted)
    secret = base / "secret" / "s.txt"
    items["planted-link.txt"] = Entry(address="data/planted", size=secret.stat().st_size,
                                      etag=hashlib.md5(secret.read_bytes()).hexdigest(), last_modified_ns=time.time_ns())
    repo.stage_many("main", list(items.items()))
    repo.upload("main", "by-owner.txt", b"written as the owner would\n")
    repo.commit("main", "every kind")
    owner_written = repo.get("main", "by-owner.txt")
    os.chown(ns / owner_written.address, OWNER, -1)  # (an object the owner's own process wrote)
    g.close()
    os.chown(ns, OWNER, -1)
    return ns


SERVED = {"uploaded-by-root.txt", "public.txt", "owners.txt", "by-owner.txt"}
REFUSED = {"root-only.txt", "behind-0700.txt", "planted-link.txt"}


def test_another_users_repository_serves_only_what_its_owner_may_read(base):
    _repository(base)
    repo = Graveler(GravelerConfig(home=base / "home")).repository("readfor")
    for name in SERVED:
        assert repo.read("main", name)
    for name in REFUSED:
        with pytest.raises(Forbidden, match=r"uid 54321, may not read it"):
            repo.read("main", name)
        with pytest.raises(Forbidden):
            repo.view("main").open(repo.get("main", name)).read(0, 4)


def test_the_owners_own_process_reads_everything_the_kernel_lets_it(base):
    """The check is for a process of another user only: the namespace's owner reading its
    repository is the kernel's business (root here: everything)."""
    ns = _repository(base)
    os.chown(ns, 0, -1)
    repo = Graveler(GravelerConfig(home=base / "home")).repository("readfor")
    for name in SERVED | REFUSED:
        assert repo.read("main", name)


@needs_fuse
def test_a_mount_of_another_users_repository_answers_eacces_for_what_its_owner_may_not_read(base):
    _repository(base)
    mp = base / "mnt"
    mp.mkdir()
    with MountProc(base / "home", "readfor", mp, log_dir=base) as m:
        for name in SERVED:
            assert (mp / "main" / name).read_bytes()
        for name in REFUSED:
            with pytest.raises(PermissionError) as e:
                (mp / "main" / name).read_bytes()
            assert e.value.errno == errno.EACCES
        (mp / "main" / "new.txt").write_bytes(b"written through the mount\n")  # root's write into her namespace
        assert (mp / "main" / "new.txt").read_bytes() == b"written through the mount\n"
        assert "may not read it" in m.log()
