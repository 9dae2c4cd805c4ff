"""pjdfstest (the POSIX filesystem suite) on a branch tree, mounted -o allow_other as root.

Runs ``../shared/tools/pjdfstest.sh`` (it builds the vendored suite once) group by
group. Every subtest passes except those docs/SEMANTICS.md lists (section
"pjdfstest": each follows a ``link(2)``, and hard links are EPERM by design); the
test reads that table and compares it with the run both ways, so a subtest that
starts passing and a new failure both fail it, and the list in the docs stays true.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.mount_testutil import MountProc, lakefuse_cmd, needs_fuse
from tests.shared_paths import PJDFSTEST

TOOL = PJDFSTEST
SEMANTICS = Path(__file__).resolve().parents[1] / "docs" / "SEMANTICS.md"

# group -> subtests the tool runs (PATH_MAX files skipped): a script that stops early is a failure
TOTALS = {
    "open": 333, "unlink": 436, "rename": 4845, "mkdir": 115, "rmdir": 140, "truncate": 79,
    "ftruncate": 84, "symlink": 89, "utimensat": 121, "chmod": 322, "chown": 1487,
}


def documented_failures(doc: str) -> tuple[dict[str, set[int]], int]:
    """The table of docs/SEMANTICS.md's pjdfstest section: {"rename/00.t": {8, 9, ...}},
    and how many of the subtests are ``link`` calls."""
    section = doc[doc.index("### pjdfstest"):]
    section = section[:section.index("\n#", 1)]
    out: dict[str, set[int]] = {}
    links = 0
    for f, nums, why in re.findall(r"^\| `(\w+/\d+\.t)` \| ([\d, ]+) \| (.*) \|$", section, re.M):
        got = {int(n) for n in nums.split(",")}
        out.setdefault(f, set()).update(got)
        if why.startswith("`link`"):
            links += len(got)
    return out, links


def _numbers(text: str) -> set[int]:
    out = set()
    for part in text.replace(" ", "").split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.update(range(int(lo), int(hi or lo) + 1))
    return out


def failed_subtests(out: str) -> dict[str, set[int]]:
    """prove's summary as {"rename/00.t": {8, 9, ...}} (its "Failed tests:" lists)."""
    failed: dict[str, set[int]] = {}
    cur, listing = None, False
    for line in out.splitlines():
        m = re.match(r"^\S*/tests/(\w+/\d+\.t) \(Wstat: (\d+) Tests: \d+ Failed: (\d+)\)", line)
        if m:
            cur, listing = m.group(1), False
            failed[cur] = set()
            if m.group(2) != "0":
                failed[cur].add(-1)  # the script died: never as documented
            continue
        if cur is not None and line.strip().startswith("Failed tests:"):
            failed[cur] |= _numbers(line.split(":", 1)[1])
            listing = True
        elif listing and re.fullmatch(r"[\d,\s-]+", line):
            failed[cur] |= _numbers(line)
        else:
            listing = False
    return failed


def run_group(d: Path, group: str) -> tuple[int, dict[str, set[int]], str]:
    r = subprocess.run(["bash", str(TOOL), str(d), group], capture_output=True, text=True, timeout=1200)
    out = r.stdout + r.stderr
    m = re.search(r"Files=\d+, Tests=(\d+)", out)
    if m is None:
        raise AssertionError(f"pjdfstest {group}: no summary\n{out[-3000:]}")
    assert "Parse errors" not in out, f"pjdfstest {group}: a script did not finish its plan\n{out[-3000:]}"
    return int(m.group(1)), failed_subtests(out), out


def test_prove_summary_is_parsed():
    out = """/x/tests/rename/00.t (Wstat: 0 Tests: 122 Failed: 6)
  Failed tests:  8-10, 12
                74-75
Files=23, Tests=4845, 27 wallclock secs
"""
    assert failed_subtests(out) == {"rename/00.t": {8, 9, 10, 12, 74, 75}}
    doc, links = documented_failures(SEMANTICS.read_text())
    assert links == 16 and sum(map(len, doc.values())) == 68


@pytest.mark.slow
@needs_fuse
@pytest.mark.skipif(os.geteuid() != 0 or not TOOL.exists(), reason="pjdfstest runs as root, with the shared tool")
def test_pjdfstest_on_a_branch_tree(tmp_path):
    home = tmp_path / "home"
    subprocess.run(lakefuse_cmd(home, "repo", "create", "lakefs://pjd"), check=True, capture_output=True)
    mp = tmp_path / "mnt"
    totals, failed = {}, {}
    with MountProc(home, "pjd", mp, "-o", "allow_other") as m:
        for group in TOTALS:
            d = mp / "main" / f"pjd-{group}"
            d.mkdir()
            totals[group], got, _ = run_group(d, group)
            failed.update((f, n) for f, n in got.items() if n)  # "Failed: 0" files: TODO subtests passed
        stats = json.loads((mp / ".lakefuse" / "stats").read_text())
    print("\npjdfstest on a branch tree, failed subtests by file:")
    for f, nums in sorted(failed.items()):
        print(f"  {f:14} {len(nums):4}  {sorted(nums)}")
    log = m.log()
    assert "Traceback" not in log, log[log.find("Traceback") - 200:][:4000]
    assert totals == TOTALS
    want, links = documented_failures(SEMANTICS.read_text())
    new = {f: sorted(n - want.get(f, set())) for f, n in failed.items() if n - want.get(f, set())}
    fixed = {f: sorted(n - failed.get(f, set())) for f, n in want.items() if n - failed.get(f, set())}
    assert not new, f"failures docs/SEMANTICS.md does not list: {new}"
    assert not fixed, f"subtests docs/SEMANTICS.md lists as failing now pass (update the table): {fixed}"
    # each documented link(2) reached the daemon (none failed in the kernel before it)
    assert stats["requests"].get("link", 0) == links, stats["requests"]
