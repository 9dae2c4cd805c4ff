"""xfstests' fsx (the file-operation exerciser) on a file of a branch tree, then the same
bytes read back from the commit made right after.

fsx does random reads, writes, truncates, mapped reads and mapped writes, copy_file_range
(the kernel does it as reads and writes: the mount has no handler of its own) and, now
and then, a close and reopen (the mount saves the file at each close), checking every
read against its own model of the file, and with ``-X`` the whole file after every
operation; ``fallocate(2)`` in the modes the mount takes (preallocation, keep size, punch
hole, zero range: :mod:`lakefuse.mount.falloc`, through the handler the vendored pyfuse3
patch adds). What the mount cannot do is turned off by flag rather than left to fsx's
probes: collapse, insert and unshare range (the kernel itself refuses them on FUSE), the
reflink ioctls clone, dedupe and exchange range, and atomic writes (those need O_DIRECT).
See :data:`FSX_OFF`.

fsx's source is vendored (``scripts/vendor/xfstests-fsx-*.tar.gz``, from xfstests' git:
no package registry here carries it) and ``scripts/setup.sh`` builds it into
``.venv/opt/fsx/fsx``. The test runs the binary given as ``$LAKEFUSE_FSX``, else that one,
else ``fsx`` on the PATH or the one an xfstests package installs; without any it fails
under CI (``$CI`` set: the setup should have built it) and is skipped elsewhere. ``$LAKEFUSE_FSX_OPS`` sets the number of operations on a local store (default
100,000); on S3 (moto) a fifth of that."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tests.mount_testutil import clean_mount, commit_and_read_back, empty_repo_on, needs_fuse

REPO = "fsxrepo"
OPS = int(os.environ.get("LAKEFUSE_FSX_OPS", "100000"))
SEED = 20  # issue 20

# What the mount does not support, off by flag (fsx would probe and turn each off itself,
# but a flag says so, and a probe that succeeded by mistake would not go unnoticed):
FSX_OFF = [
    "-C",  # collapse range (fallocate FALLOC_FL_COLLAPSE_RANGE): the kernel refuses it on FUSE
    "-I",  # insert range (fallocate FALLOC_FL_INSERT_RANGE): likewise
    "-u",  # unshare range (fallocate FALLOC_FL_UNSHARE_RANGE): likewise
    "-J",  # clone range (FICLONERANGE): no reflinks on an object store
    "-B",  # dedupe range (FIDEDUPERANGE): likewise
    "-0",  # exchange range (XFS_IOC_EXCHANGE_RANGE): an XFS ioctl
    "-a",  # atomic writes: need O_DIRECT (-Z), which this run does not use
]
# Kept on: reads, writes, truncates, mapped reads and writes, copy_file_range, fallocate
# (preallocation with and without keep size, punch hole, zero range), and a close + reopen
# once in 500 operations (each close saves the file); -X checks the whole
# file after every operation.
FSX_ON = ["-X", "-c", "500"]

BUILT = Path(__file__).resolve().parent.parent / ".venv" / "opt" / "fsx" / "fsx"
FSX_PATHS = ("/usr/lib/xfstests/ltp/fsx", "/var/lib/xfstests/ltp/fsx")


def find_fsx() -> str | None:
    given = os.environ.get("LAKEFUSE_FSX")
    if given:
        return given
    if os.access(BUILT, os.X_OK):
        return str(BUILT)
    found = shutil.which("fsx")
    if found:
        return found
    return next((p for p in FSX_PATHS if os.access(p, os.X_OK)), None)


FSX = find_fsx()
if FSX is None and os.environ.get("CI"):
    raise RuntimeError(f"no fsx binary under CI: scripts/setup.sh builds it into {BUILT}")

pytestmark = [needs_fuse, pytest.mark.skipif(FSX is None, reason="no fsx binary: run scripts/setup.sh or set LAKEFUSE_FSX (see the docstring)")]


def fsx_ops(opsfile: Path) -> tuple[Counter, int]:
    """Operations fsx ran (not those it skipped), by name, and how many it logged, from its
    ``--record-ops`` file (fsx keeps the last 10,000 operations)."""
    ran = Counter()
    logged = 0
    for line in opsfile.read_text().splitlines():
        words = line.split()
        if not words or words[0] == "#":
            continue
        logged += 1
        if words[0] != "skip":
            ran[words[0]] += 1
    return ran, logged


@pytest.mark.slow
@pytest.mark.parametrize("store", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_fsx_on_a_branch_file_and_the_commit_reads_it_back(tmp_path, request, store):
    home, env = empty_repo_on(tmp_path, request, store, REPO)
    logs = tmp_path / "fsxlogs"
    logs.mkdir()
    with clean_mount(home, REPO, tmp_path / "mnt", "--cache-dir", str(tmp_path / "cache"), env=env) as mp:
        f = mp / "main" / "fsx.dat"
        ops = OPS if store == "local" else OPS // 5  # S3: the same code paths, a fifth of the time
        cmd = [FSX, "-q", "-N", str(ops), "-S", str(SEED), "-P", str(logs), *FSX_OFF, *FSX_ON,
               "--record-ops", str(f)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600 + ops // 50)
        out = r.stdout + r.stderr
        if r.returncode != 0 or f"All {ops} operations completed A-OK!" not in out:
            log = logs / "fsx.dat.fsxlog"
            raise AssertionError(f"fsx failed ({r.returncode}): {' '.join(cmd)}\n{out[-4000:]}\n"
                                 f"{log.read_text()[-4000:] if log.exists() else ''}")
        ran, logged = fsx_ops(logs / "fsx.dat.fsxops")
        assert logged == min(ops, 10_000), logged
        for op in ("read", "write", "mapread", "mapwrite", "truncate", "copy_range", "fallocate", "punch_hole",
                   "zero_range"):  # each ~1 in 17
            assert ran[op] > logged // 50, f"fsx ran only {ran[op]} {op} operations of {logged}: {dict(ran)}"
        assert not {"collapse_range", "insert_range"} & set(ran), ran
        print(f"\nfsx on a {store} branch file: {ops} operations A-OK; of the last {logged}, ran {dict(ran)}")

        data = f.read_bytes()
        assert len(data) == os.stat(f).st_size
        commit_and_read_back(mp, "fsx.dat", data, "after fsx")
