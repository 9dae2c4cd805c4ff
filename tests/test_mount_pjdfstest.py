"""pjdfstest (the POSIX filesystem suite) on a branch tree, mounted -o allow_other as root.

Runs ``../shared/tools/pjdfstest.sh`` (it builds the vendored suite once) group by
group and prints the pass count of each. Hard links and device files answer EPERM
by design (docs/SEMANTICS.md), so the subtests that create them -- and the checks
that follow them in the same script -- fail; the floors below are the counts this
mount reaches, so a regression fails the test.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.mount_testutil import MountProc, lakefuse_cmd, needs_fuse

TOOL = Path(__file__).resolve().parents[2] / "shared" / "tools" / "pjdfstest.sh"
if not TOOL.exists():
    TOOL = Path("/work/shared/tools/pjdfstest.sh")

# group -> minimum passing subtests (measured; the rest are hard links / device files and what follows them)
FLOORS = {
    "open": 380, "unlink": 340, "rename": 4000, "mkdir": 115, "rmdir": 150, "truncate": 100,
    "ftruncate": 105, "symlink": 100, "utimensat": 100, "chmod": 440, "chown": 1050,
}


def run_group(d: Path, group: str) -> tuple[int, int, str]:
    r = subprocess.run(["bash", str(TOOL), str(d), group], capture_output=True, text=True, timeout=1200)
    out = r.stdout + r.stderr
    m = re.search(r"Files=\d+, Tests=(\d+)", out)
    if m is None:
        raise AssertionError(f"pjdfstest {group}: no summary\n{out[-3000:]}")
    total = int(m.group(1))
    failed = sum(int(x) for x in re.findall(r"\(Wstat: \d+ Tests: \d+ Failed: (\d+)\)", out))
    return total - failed, total, out


@pytest.mark.slow
@needs_fuse
@pytest.mark.skipif(os.geteuid() != 0 or not TOOL.exists(), reason="pjdfstest runs as root, with the shared tool")
def test_pjdfstest_on_a_branch_tree(tmp_path):
    home = tmp_path / "home"
    subprocess.run(lakefuse_cmd(home, "repo", "create", "lakefs://pjd"), check=True, capture_output=True)
    mp = tmp_path / "mnt"
    results = {}
    with MountProc(home, "pjd", mp, "-o", "allow_other") as m:
        for group in FLOORS:
            d = mp / "main" / f"pjd-{group}"
            d.mkdir()
            results[group] = run_group(d, group)[:2]
    print("\npjdfstest on a branch tree (passed/total):")
    for group, (passed, total) in results.items():
        print(f"  {group:10} {passed:5}/{total}")
    assert "Traceback" not in m.log()
    low = {g: r for g, r in results.items() if r[0] < FLOORS[g]}
    assert not low, f"below the floors {FLOORS}: {low}"
