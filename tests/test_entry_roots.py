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
