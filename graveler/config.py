"""graveler's configuration: frozen dataclasses built at the edge (CLI, mount) and passed down.

This module owns every tunable of graveler and where the lakefuse home is:

* :class:`KVConfig`      where refs and staging live and how LMDB is opened (:mod:`graveler.kv`)
* :class:`RangeParams`   lakeFS's range-splitting parameters (:mod:`graveler.committed.writer`)
* :class:`StoreConfig`   how to reach an object store (:mod:`graveler.objstore`)
* :class:`CacheConfig`   memory and disk budgets of the committed layer, in bytes
* :class:`GravelerConfig` (alias ``Config``) all of the above plus the home and commit policy

It imports nothing of graveler but its errors, so every other module may import it.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path

from graveler.errors import InvalidArgument

HOME_ENV = "LAKEFUSE_HOME"
KV_ENV = "LAKEFUSE_KV"
DEFAULT_KV = "lmdb"
DEFAULT_HOME = "~/.local/share/lakefuse"
DEFAULT_COMMITTER = "lakefuse"

MiB = 1 << 20
GiB = 1 << 30

# S3 refuses multipart parts smaller than this (except the last one).
S3_MIN_PART_SIZE = 5 * MiB

_ADDRESSING_STYLES = ("path", "virtual", "auto")
_RETRY_MODES = ("standard", "adaptive")


def resolve_home(home: str | os.PathLike | None = None) -> Path:
    """The lakefuse home: ``home`` if given, else ``$LAKEFUSE_HOME``, else ``~/.local/share/lakefuse``."""
    if home:
        return Path(home).expanduser().absolute()
    env = os.environ.get(HOME_ENV)
    if env:
        return Path(env).expanduser().absolute()
    return Path(DEFAULT_HOME).expanduser().absolute()


def resolve_kv_url(url: str | None = None) -> str:
    """Where refs and staging live: ``url`` if given, else ``$LAKEFUSE_KV``, else ``lmdb``
    (the embedded default under the home). Not checked here: :func:`graveler.kv.open_backend`
    refuses what it cannot open."""
    if url:
        return url
    return os.environ.get(KV_ENV) or DEFAULT_KV


PG_SCHEMES = ("postgresql://", "postgres://")  # a KV URL naming a PostgreSQL server (libpq's two forms)


@dataclass(frozen=True, slots=True)
class KVConfig:
    """Where refs and staging live (``url``: ``lmdb``, the embedded default, or ``memory://NAME`` for
    tests; see :mod:`graveler.kv`) and how a repository's LMDB environment is opened."""

    url: str = "lmdb"  # or "memory://NAME", or a libpq URL "postgresql://USER@HOST/DB" (graveler.kv.postgres)
    map_size: int = 1 << 30  # initial map size; doubles on demand (virtual, sparse on disk)
    max_map_size: int = 1 << 40
    max_readers: int = 1024
    # durable writes and sync() fdatasync; LMDB keeps its redo log (graveler.kv.lmdb_redo), the
    # file intact across a power loss. False only for benchmarks / tests: nothing survives one
    sync: bool = True
    sync_interval: float = 5.0  # LMDB: commits are checkpointed (flushed) within this (s)

    @property
    def embedded(self) -> bool:
        """True when the KV lives in this process (LMDB, ``memory://``), False for a server (PostgreSQL)."""
        return not self.url.startswith(PG_SCHEMES)


@dataclass(frozen=True, slots=True)
class RangeParams:
    """lakeFS's range-splitting parameters (its defaults)."""

    min_range_size: int = 0
    max_range_size: int = 20 * 1024 * 1024
    raggedness: int = 50_000


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Budgets of the committed layer's caches, in bytes.

    ``table_bytes``: open table files kept in memory (LRU, by file size);
    ``block_bytes``: decoded data / index blocks (LRU, by encoded block size);
    ``metarange_bytes``: parsed metaranges (LRU, by metarange file size);
    ``disk_bytes``: the disk tier for range and metarange files of remote (S3) namespaces,
    in ``disk_dir`` (None: ``<home>/cache``). A local namespace is read in place and uses
    no disk tier.
    ``memo_bytes``: what the home remembers of table files (which ones were checked
    against their IDs, and what rewriting them needs), in ``<home>/table-memo``.
    """

    table_bytes: int = 512 * MiB
    block_bytes: int = 256 * MiB
    metarange_bytes: int = 64 * MiB
    disk_bytes: int = 4 * GiB
    disk_dir: str | None = None
    memo_bytes: int = 256 * MiB

    def __post_init__(self) -> None:
        for name in ("table_bytes", "block_bytes", "metarange_bytes", "disk_bytes", "memo_bytes"):
            if getattr(self, name) < 0:
                raise InvalidArgument(f"{name} must be >= 0, not {getattr(self, name)}")


def _endpoint_from_env() -> str | None:
    return os.environ.get("LAKEFUSE_S3_ENDPOINT") or os.environ.get("AWS_ENDPOINT_URL") or None


ENV_CONNECT_TIMEOUT = "LAKEFUSE_S3_CONNECT_TIMEOUT"
ENV_READ_TIMEOUT = "LAKEFUSE_S3_READ_TIMEOUT"
ENV_MAX_ATTEMPTS = "LAKEFUSE_S3_MAX_ATTEMPTS"
DEFAULT_CONNECT_TIMEOUT = 5.0
DEFAULT_READ_TIMEOUT = 8.0
DEFAULT_MAX_ATTEMPTS = 3


def _env_number(name: str, default, kind=float):
    def factory():
        raw = os.environ.get(name)
        if raw is None or raw.strip() == "":
            return default
        try:
            return kind(raw)
        except ValueError:
            raise InvalidArgument(f"${name} must be a {'whole ' if kind is int else ''}number, not {raw!r}") from None
    return factory


@dataclass(frozen=True)
class StoreConfig:
    """How to reach an object store; built at the edge (CLI, mount) and passed down.

    Only the S3 backend reads most of these fields; the local store ignores them.
    ``s3_endpoint_url`` defaults to ``$LAKEFUSE_S3_ENDPOINT``, then
    ``$AWS_ENDPOINT_URL`` (read when the config is built).  ``addressing_style``
    ``None`` means "path" when an endpoint URL is set (MinIO, moto, Ceph...) and
    "auto" otherwise.

    How long a request may take, and how often it is tried: ``connect_timeout``
    (seconds to open a connection), ``read_timeout`` (seconds the server may stay
    silent, before the answer or in the middle of a body), ``max_attempts`` (every
    attempt of a request, the first one included; 1 = no retries).  A hung or
    unreachable endpoint is ``StoreUnavailable`` after about
    :attr:`worst_case_seconds` (attempts x timeouts, plus backoff): with the
    defaults (5 s, 8 s, 3 attempts) under 45 s, typically ~25 s for a server that
    accepts connections and never answers.  The defaults come from
    ``$LAKEFUSE_S3_CONNECT_TIMEOUT``, ``$LAKEFUSE_S3_READ_TIMEOUT`` and
    ``$LAKEFUSE_S3_MAX_ATTEMPTS`` when set; the CLI's ``--timeout`` and
    ``--max-attempts`` (and a mount's options, through :meth:`with_timeout`) override them.
    """

    s3_endpoint_url: str | None = field(default_factory=_endpoint_from_env)
    region: str | None = None  # None: boto3's chain (AWS_REGION, AWS_DEFAULT_REGION, profile)
    max_attempts: int = field(default_factory=_env_number(ENV_MAX_ATTEMPTS, DEFAULT_MAX_ATTEMPTS, int))
    retry_mode: str = "standard"  # botocore retry mode: "standard" or "adaptive"
    connect_timeout: float = field(default_factory=_env_number(ENV_CONNECT_TIMEOUT, DEFAULT_CONNECT_TIMEOUT))
    read_timeout: float = field(default_factory=_env_number(ENV_READ_TIMEOUT, DEFAULT_READ_TIMEOUT))
    multipart_threshold: int = 64 * MiB
    multipart_chunksize: int = 16 * MiB
    transfer_concurrency: int = 8  # parallel part uploads / ranged downloads of one file
    max_pool_connections: int = 32  # HTTP connections kept by one S3 client
    addressing_style: str | None = None

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise InvalidArgument(f"max_attempts must be >= 1, not {self.max_attempts}")
        if self.retry_mode not in _RETRY_MODES:
            raise InvalidArgument(f"retry_mode must be one of {_RETRY_MODES}, not {self.retry_mode!r}")
        if self.connect_timeout <= 0 or self.read_timeout <= 0:
            raise InvalidArgument("connect_timeout and read_timeout must be positive")
        if self.multipart_threshold < 1:
            raise InvalidArgument(f"multipart_threshold must be >= 1, not {self.multipart_threshold}")
        if self.multipart_chunksize < S3_MIN_PART_SIZE:
            raise InvalidArgument(
                f"multipart_chunksize must be >= {S3_MIN_PART_SIZE} (S3's minimum part size), "
                f"not {self.multipart_chunksize}"
            )
        if self.transfer_concurrency < 1 or self.max_pool_connections < 1:
            raise InvalidArgument("transfer_concurrency and max_pool_connections must be >= 1")
        if self.addressing_style is not None and self.addressing_style not in _ADDRESSING_STYLES:
            raise InvalidArgument(
                f"addressing_style must be one of {_ADDRESSING_STYLES}, not {self.addressing_style!r}"
            )

    @property
    def worst_case_seconds(self) -> float:
        """About the longest one request can take against a dead endpoint before it fails."""
        return self.max_attempts * (self.connect_timeout + self.read_timeout) + 2.0 * (self.max_attempts - 1)

    def with_timeout(self, timeout: float | None = None, max_attempts: int | None = None) -> "StoreConfig":
        """A copy with ``read_timeout = timeout`` (and ``connect_timeout`` at most that) and/or ``max_attempts``."""
        changes: dict = {}
        if timeout is not None:
            changes["read_timeout"] = timeout
            changes["connect_timeout"] = min(self.connect_timeout, timeout)
        if max_attempts is not None:
            changes["max_attempts"] = max_attempts
        return dataclasses.replace(self, **changes)

    @property
    def effective_addressing_style(self) -> str:
        if self.addressing_style is not None:
            return self.addressing_style
        return "path" if self.s3_endpoint_url else "auto"


@dataclass(frozen=True)
class GravelerConfig:
    """Everything graveler needs to know, built at the edge (CLI, mount) and passed down.

    A commit / merge / revert that loses its compare-and-set race (another one
    moved the branch first) re-reads the branch and tries again, backing off with
    jitter (5 ms doubling to 0.5 s); it gives up with PreconditionFailed only after
    at least ``commit_retries`` tries AND ``commit_retry_seconds`` of trying, so
    ordinary contention (a few committers on one branch) never surfaces as a
    failure while a branch that can never be won still fails in bounded time.
    """

    home: Path = field(default_factory=resolve_home)
    kv: KVConfig = KVConfig()
    range_params: RangeParams = RangeParams()
    committer: str = DEFAULT_COMMITTER
    commit_retries: int = 8
    commit_retry_seconds: float = 30.0
    store: StoreConfig | None = None  # object stores (None: StoreConfig() defaults)
    upload_spool_dir: str | None = None  # where file-like uploads are spooled (None: the system temp dir)
    cache: CacheConfig = CacheConfig()

    @staticmethod
    def from_home(home: str | os.PathLike | None = None, kv_url: str | None = None, **kw) -> "GravelerConfig":
        """The configuration of a home: ``home`` / ``$LAKEFUSE_HOME``, and the KV backend
        ``kv_url`` / ``$LAKEFUSE_KV`` / ``lmdb`` (unless a whole ``kv=KVConfig(...)`` is given)."""
        if "kv" not in kw:
            kw["kv"] = KVConfig(url=resolve_kv_url(kv_url))
        return GravelerConfig(home=resolve_home(home), **kw)


Config = GravelerConfig

__all__ = [
    "CacheConfig",
    "Config",
    "DEFAULT_COMMITTER",
    "GravelerConfig",
    "HOME_ENV",
    "KV_ENV",
    "KVConfig",
    "RangeParams",
    "StoreConfig",
    "resolve_home",
    "resolve_kv_url",
]
