"""The semantic mount suites once more with FUSE passthrough off (``LAKEFUSE_PASSTHROUGH=0``
in the environment every mount of theirs inherits): the daemon then serves every read, and
every promise they check holds on that path too. (The default run has passthrough on where
the kernel offers it: commits' and unchanged branch files' reads go to the kernel.)

Chosen to keep the suite's time modest: the read and write semantics through a real mount
(``test_mount_fuse``, ``test_mount_writable``, the two model tests), without the tests that
do not read files (mount failures, daemonizing, a listing of 100,000 entries, the kill -9
crash loop). ``LAKEFUSE_PASSTHROUGH=0 pytest tests/test_mount_*.py`` runs every mount suite
that way."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.mount_testutil import REPO_ROOT, needs_fuse

pytestmark = [needs_fuse, pytest.mark.slow]

SUITES = ["tests/test_mount_fuse.py", "tests/test_mount_writable.py", "tests/test_mount_write_model.py",
          "tests/test_mount_model.py"]
NOT_READS = "not kill_9 and not 100000 and not failures_say_why and not daemonized and not killed_daemon"


def test_the_semantic_mount_suites_pass_with_passthrough_off(tmp_path):
    env = {**os.environ, "LAKEFUSE_PASSTHROUGH": "0", "PYTHONPATH": str(REPO_ROOT)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--basetemp",
                        str(tmp_path / "t"), "-m", "slow or not slow", "-k", NOT_READS, *SUITES],
                       env=env, cwd=str(REPO_ROOT), capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and " skipped" not in r.stdout.splitlines()[-1], r.stdout[-2000:]
