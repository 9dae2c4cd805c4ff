"""Issue 7.1: a damaged data object is CorruptedData (CLI exit 5) on every read path, never wrong bytes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from graveler.errors import CorruptedData
from lakefuse.cli import main

REPO = "lakefs://rep1"


def run(capsysbinary, home: Path, *args: str) -> tuple[int, bytes, str]:
    capsysbinary.readouterr()
    rc = main([*args, "--home", str(home)])
    res = capsysbinary.readouterr()
    return rc, res.out, res.err.decode()


@pytest.fixture
def repo_with_file(tmp_path, capsysbinary):
    home = tmp_path / "home"
    src = tmp_path / "f.txt"
    src.write_bytes(b"hello\n")
    assert run(capsysbinary, home, "repo", "create", REPO, "--storage", f"file://{tmp_path}/ns")[0] == 0
    assert run(capsysbinary, home, "fs", "upload", f"{REPO}/main/f.txt", "-s", str(src))[0] == 0
    rc, out, _ = run(capsysbinary, home, "fs", "stat", f"{REPO}/main/f.txt", "--json")
    physical = Path(unquote(urlsplit(json.loads(out)["physical_address"]).path))
    assert physical.read_bytes() == b"hello\n"
    return home, physical


@pytest.mark.parametrize("damage", [b"", b"hel", b"hello\nworld\n", b"jello\n"],
                         ids=["emptied", "truncated", "grown", "bit-flipped"])
def test_fs_cat_of_a_damaged_object_is_exit_5(repo_with_file, capsysbinary, damage):
    home, physical = repo_with_file
    physical.write_bytes(damage)
    rc, out, err = run(capsysbinary, home, "fs", "cat", f"{REPO}/main/f.txt")
    assert rc == 5, (rc, out, err)  # it printed the damaged bytes with exit 0
    assert out == b""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "data object" in lines[0] and physical.name in lines[0], err
    rc, out, _ = run(capsysbinary, home, "fs", "stat", f"{REPO}/main/f.txt")
    assert rc == 0  # the entry itself is fine


def test_object_replaced_by_a_symlink(repo_with_file, capsysbinary, tmp_path):
    home, physical = repo_with_file
    other = tmp_path / "other"
    other.write_bytes(b"other\n")
    physical.unlink()
    physical.symlink_to(other)
    rc, out, _ = run(capsysbinary, home, "fs", "cat", f"{REPO}/main/f.txt")
    assert rc == 5 and out == b""


def _big_object(tmp_path, capsysbinary, monkeypatch) -> tuple[Path, bytes, Path]:
    """A home with a 1 MiB object (fs cat reads it in 64 KiB chunks): (home, its bytes, its file)."""
    from lakefuse.cli import vc_fs

    monkeypatch.setattr(vc_fs, "CAT_CHUNK", 64 << 10)
    home = tmp_path / "home"
    src = tmp_path / "big"
    data = os.urandom(1 << 20)
    src.write_bytes(data)
    run(capsysbinary, home, "repo", "create", REPO, "--storage", f"file://{tmp_path}/ns")
    assert run(capsysbinary, home, "fs", "upload", f"{REPO}/main/big", "-s", str(src))[0] == 0
    assert run(capsysbinary, home, "fs", "cat", f"{REPO}/main/big") == (0, data, "")
    return home, data, [p for p in (tmp_path / "ns" / "data").rglob("*") if p.is_file()][0]


def test_large_object_cut_in_half_is_caught_while_streaming(tmp_path, capsysbinary, monkeypatch):
    home, data, physical = _big_object(tmp_path, capsysbinary, monkeypatch)
    os.truncate(physical, len(data) // 2)
    rc, out, err = run(capsysbinary, home, "fs", "cat", f"{REPO}/main/big")
    assert rc == 5 and len(out) == 0 and "entry says 1048576" in err


@pytest.mark.parametrize("whole_max", [256 << 20, 128 << 10], ids=["held-whole", "read-twice"])
def test_fs_cat_writes_nothing_of_an_object_damaged_midway(tmp_path, capsysbinary, monkeypatch, whole_max):
    """A byte changed in the middle of a many-chunk object: the size is right, only the MD5
    tells, at the end. fs cat checks it before its first byte goes out (held whole, or above
    CAT_WHOLE_MAX read twice), so the output holds nothing rather than 15 chunks of which one
    is wrong (it used to write them, then exit 5); a healthy object comes out whole either way."""
    from lakefuse.cli import vc_fs

    monkeypatch.setattr(vc_fs, "CAT_WHOLE_MAX", whole_max)
    home, data, physical = _big_object(tmp_path, capsysbinary, monkeypatch)
    with open(physical, "r+b") as f:
        f.seek(700_000)
        f.write(bytes([data[700_000] ^ 0xFF]))
    rc, out, err = run(capsysbinary, home, "fs", "cat", f"{REPO}/main/big")
    assert rc == 5 and out == b"" and "MD5" in err


def test_library_reads_refuse_a_damaged_object(tmp_path):
    from graveler.config import GravelerConfig
    from graveler.home import Graveler

    g = Graveler(GravelerConfig(home=tmp_path / "home"))
    repo = g.create_repository("rep1", f"file://{tmp_path}/ns")
    e = repo.upload("main", "f.txt", b"hello\n")
    repo.commit("main", "one")
    assert repo.read("main", "f.txt") == b"hello\n"
    physical = tmp_path / "ns" / e.address
    physical.write_bytes(b"jello\n")  # same size: only the MD5 of a whole read can tell
    with pytest.raises(CorruptedData, match="etag"):
        repo.read("main", "f.txt")
    assert repo.read("main", "f.txt", 1, 2) == b"el"  # a part cannot be checked beyond its size
    physical.write_bytes(b"hello")
    with pytest.raises(CorruptedData, match="5 bytes but its entry says 6"):
        repo.read("main", "f.txt", 1, 2)
    g.close()
