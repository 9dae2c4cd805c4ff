"""Where the project's shared material is: ``../shared`` beside the checkout (CI clones it so), or
``$LAKEFUSE_SHARED``; never an absolute path of one machine."""

from __future__ import annotations

import os
from pathlib import Path

SHARED = Path(os.environ.get("LAKEFUSE_SHARED", Path(__file__).resolve().parents[2] / "shared"))
FIXTURES = Path(os.environ.get("LAKEFUSE_FIXTURES", SHARED / "fixtures"))
LAKEFS_FIXTURES = FIXTURES / "lakefs"
PJDFSTEST = SHARED / "tools" / "pjdfstest.sh"
