"""Where repositories live, and the configuration of graveler.

Layout under the lakefuse home::

    <home>/repos/<name>/refs.lmdb/     the repository's LMDB environment (refs + staging)

The home is ``--home`` (passed in), else ``$LAKEFUSE_HOME``, else
``~/.local/share/lakefuse`` (:func:`resolve_home` is the one place that decides).
The committed data (ranges, metaranges, objects) lives in the repository's
storage namespace, not in the home.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from graveler.committed.writer import RangeParams
from graveler.kv import KVConfig
from graveler.objstore.base import StoreConfig

HOME_ENV = "LAKEFUSE_HOME"
DEFAULT_HOME = "~/.local/share/lakefuse"
REPOS_DIR = "repos"
REFS_DIR = "refs.lmdb"
DEFAULT_COMMITTER = "lakefuse"


def resolve_home(home: str | os.PathLike | None = None) -> Path:
    """The lakefuse home: ``home`` if given, else ``$LAKEFUSE_HOME``, else ``~/.local/share/lakefuse``."""
    if home:
        return Path(home).expanduser().absolute()
    env = os.environ.get(HOME_ENV)
    if env:
        return Path(env).expanduser().absolute()
    return Path(DEFAULT_HOME).expanduser().absolute()


def repos_root(home: Path) -> Path:
    return home / REPOS_DIR


def repo_dir(home: Path, name: str) -> Path:
    return home / REPOS_DIR / name


def refs_path(home: Path, name: str) -> Path:
    return home / REPOS_DIR / name / REFS_DIR


@dataclass(frozen=True)
class GravelerConfig:
    """Everything graveler needs to know, built at the edge (CLI, mount) and passed down.

    ``commit_retries``: how many times a commit / merge / revert re-reads the
    branch and tries again when its compare-and-set loses a race before it
    gives up with PreconditionFailed.
    """

    home: Path = field(default_factory=resolve_home)
    kv: KVConfig = KVConfig()
    range_params: RangeParams = RangeParams()
    committer: str = DEFAULT_COMMITTER
    commit_retries: int = 8
    store: StoreConfig | None = None  # object stores (None: StoreConfig() defaults)
    upload_spool_dir: str | None = None  # where file-like uploads are spooled (None: the system temp dir)

    @staticmethod
    def from_home(home: str | os.PathLike | None = None, **kw) -> "GravelerConfig":
        return GravelerConfig(home=resolve_home(home), **kw)
