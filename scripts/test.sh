#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite, slow tests included (a plain
# pytest skips them: pyproject.toml's addopts; a -m given here replaces this one).
# Extra arguments go to pytest, e.g.  bash scripts/test.sh -k sstable
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
set +e
.venv/bin/python -m pytest -m "slow or not slow" "$@"
rc=$?
set -e
if [ "$rc" = 5 ]; then
    echo "test: pytest collected no tests: that is a failure here" >&2
    exit 1
fi
exit "$rc"
