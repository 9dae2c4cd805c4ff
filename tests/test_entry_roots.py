"""Where an entry's FULL address may point: never at this host's files from a repository stored
remotely. (A crafted entry -- or a refs dump from shared storage, mounted with ``allow_other`` --
served any file the daemon could read, root-only ones included; a multipart-style etag left
only the size to check, which any user can learn with ``stat``.)"""

from __future__ import annotations

import hashlib
import time

import pytest

from graveler import Graveler, GravelerConfig
from graveler.errors import CorruptedData
from graveler.model import AddressType, Entry


def _full(path, data: bytes, etag: str | None = None) -> Entry:
    return Entry(f"file://{path}", len(data), etag or hashlib.md5(data).hexdigest(), time.time_ns(),
                 address_type=AddressType.FULL)


@pytest.mark.s3
def test_a_remote_repository_never_reads_a_local_file_its_entry_names(tmp_path, s3_config, s3_bucket):
    secret = tmp_path / "root-only.txt"
    secret.write_bytes(b"ROOT-ONLY-SECRET: hunter2\n")
    secret.chmod(0o600)
    g = Graveler(GravelerConfig(home=tmp_path / "home", store=s3_config))
    try:
        remote = g.create_repository("remote", f"s3://{s3_bucket}/ns")
        remote.stage("main", "data/small.txt", _full(secret, secret.read_bytes(), "0" * 32 + "-1"))
        for read in (lambda: remote.read("main", "data/small.txt"),
                     lambda: remote.read_entry(remote.get("main", "data/small.txt"), 0, 5),
                     lambda: remote.view("main").open(remote.get("main", "data/small.txt"))):
            with pytest.raises(CorruptedData, match="names a local file"):
                read()
        # a repository stored locally may: an import of a local directory keeps its files in place
        local = g.create_repository("local", f"file://{tmp_path}/ns")
        local.stage("main", "in/f.txt", _full(secret, secret.read_bytes()))
        assert local.read("main", "in/f.txt") == secret.read_bytes()
    finally:
        g.close()


def test_the_md5_memo_on_a_file_is_trusted_only_where_no_other_user_can_forge_it(tmp_path, monkeypatch):
    """A file's MD5 is remembered on it (by size and mtime) so that an unchanged file is not
    hashed again. Kept in ``user.lakefuse.md5``, its owner could forge it: changed bytes, the old
    MD5 set back with the new mtime, were served by the mount as the imported (checked) file. As
    root the memo is kept in ``trusted.*``; as another user, only on that user's own files."""
    import os

    from graveler.objstore import local

    f = tmp_path / "big.bin"
    f.write_bytes(b"A" * 300_000)
    good = hashlib.md5(b"A" * 300_000).hexdigest()
    store = local.LocalStore(str(tmp_path))

    def etag() -> str:
        fd = os.open(f, os.O_RDONLY)
        try:
            return store._etag(fd, os.fstat(fd))
        finally:
            os.close(fd)

    assert etag() == good
    f.write_bytes(b"B" * 300_000)  # changed in place, the same size; the old MD5 forged back
    st = f.stat()
    forged = f"{st.st_size}:{st.st_mtime_ns}:{good}".encode()
    os.setxattr(f, local.ETAG_XATTR, forged)
    if os.geteuid() == 0:
        assert etag() == hashlib.md5(b"B" * 300_000).hexdigest()  # the forged user.* memo is not read
        st = f.stat()
        assert os.getxattr(f, local.TRUSTED_ETAG_XATTR).decode().endswith(hashlib.md5(b"B" * 300_000).hexdigest())
    # as another user than the file's owner: no memo is trusted (nor written) on it
    monkeypatch.setattr(local.os, "geteuid", lambda: f.stat().st_uid + 1)
    os.setxattr(f, local.ETAG_XATTR, forged)
    assert etag() == hashlib.md5(b"B" * 300_000).hexdigest()
    assert local._memo_xattr(f.stat()) is None
