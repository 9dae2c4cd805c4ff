"""Hostile input at the CLI's edge: undecodable arguments, special files. One line, the right exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lakefuse.cli import main

ROOT = Path(__file__).resolve().parent.parent
BAD = "\udcff"  # how Python hands over the byte 0xFF of an argument (surrogateescape)


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A home with repository rep1 (one commit on main) for the commands to aim at."""
    h = tmp_path_factory.mktemp("badinput") / "home"
    src = h.parent / "f.txt"
    src.write_bytes(b"hello\n")
    for args in (("repo", "create", "lakefs://rep1"), ("fs", "upload", "lakefs://rep1/main/a/f.txt", "-s", str(src)),
                 ("commit", "lakefs://rep1/main", "-m", "one")):
        assert main([*args, "--home", str(h)]) == 0
    return h


@pytest.mark.parametrize("args", [
    ("log", f"lakefs://rep1/m{BAD}"),
    ("show", f"lakefs://rep1/m{BAD}"),
    ("diff", "lakefs://rep1/main", f"lakefs://rep1/x{BAD}"),
    ("merge", f"lakefs://rep1/x{BAD}", "lakefs://rep1/main"),
    ("revert", "lakefs://rep1/main", f"x{BAD}"),
    ("branch", "create", "lakefs://rep1/b", "-s", f"main{BAD}"),
    ("branch", "delete", f"lakefs://rep1/b{BAD}", "--yes"),
    ("tag", "create", f"lakefs://rep1/t{BAD}", "main"),
    ("tag", "delete", f"lakefs://rep1/t{BAD}"),
    ("commit", "lakefs://rep1/main", "-m", f"msg{BAD}"),
    ("commit", "lakefs://rep1/main", "-m", "m", "--meta", f"k=v{BAD}"),
    ("fs", "ls", f"lakefs://rep1/main/a{BAD}"),
    ("fs", "rm", "-r", f"lakefs://rep1/main/a{BAD}"),
    ("branch", "reset", "lakefs://rep1/main", "--prefix", f"a{BAD}"),
    ("repo", "create", "lakefs://rep2", "--storage", f"/tmp/x{BAD}"),
], ids=lambda a: " ".join(a[:2]))
def test_undecodable_argument_is_usage_error(home, capsys, args):
    capsys.readouterr()
    assert main([*args, "--home", str(home)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lakefuse: argument ") and "not valid UTF-8" in err[0], err
    assert "\\xff" in err[0]


def run(home: Path | None, *args) -> subprocess.CompletedProcess:
    home_args = ["--home", str(home)] if home else []
    return subprocess.run([sys.executable, "-m", "lakefuse", *args, *home_args], capture_output=True,
                          timeout=60, cwd=ROOT)


def test_undecodable_bytes_from_a_shell(home):
    r = run(home, "log", b"lakefs://rep1/m\xff\x1b[2J")
    assert r.returncode == 2, r.stderr
    assert r.stderr.decode().strip() == "lakefuse: argument 2 is not valid UTF-8: 'lakefs://rep1/m\\xff\\x1b[2J'"


def test_sst_dump_refuses_special_files(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for target in (str(fifo), "/dev/zero", str(tmp_path)):
        r = run(None, "sst", "dump", target)  # used to hang forever on the FIFO and /dev/zero
        assert r.returncode == 2, (target, r.stderr)
        assert r.stderr.decode().count("\n") == 1 and b"Traceback" not in r.stderr
    r = run(None, "sst", "dump", str(tmp_path / "absent.sst"))
    assert r.returncode == 3 and b"no such file" in r.stderr
