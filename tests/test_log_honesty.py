"""The conftest rule that an unexpected WARNING/ERROR log line fails a test, both ways."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SAMPLE = textwrap.dedent('''
    import logging
    import pytest

    log = logging.getLogger("graveler.sample")

    def test_unexpected_warning():
        log.warning("nobody expects this")

    @pytest.mark.expect_log("it provokes the warning on purpose")
    def test_expected_warning():
        log.warning("expected")

    def test_checked_with_caplog(caplog):
        log.error("asserted below")
        assert "asserted below" in caplog.text

    def test_info_is_fine():
        log.info("just information")

    def test_other_libraries_are_not_ours():
        logging.getLogger("botocore.sample").warning("not graveler's or lakefuse's")
''')


def test_an_unexpected_warning_fails_and_an_expected_one_does_not(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "__init__.py").write_text("")
    for name in ("conftest.py", "graveler_testutil.py"):
        shutil.copy(ROOT / "tests" / name, tmp_path / "tests" / name)
    (tmp_path / "tests" / "test_sample.py").write_text(SAMPLE)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout
    assert r.returncode == 1, out
    assert "5 passed, 1 error" in out, out  # the call passes; its teardown reports the line
    assert "test_unexpected_warning" in out and "nobody expects this" in out
