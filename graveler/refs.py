"""Refs: names, ref expressions, and the RefManager (repository record, branches, tags, commits).

Records are lakeFS's protobufs (``graveler_pb2.BranchData``, ``TagData``,
``CommitData``) stored as LMDB values in the named databases of the
repository's environment (see :mod:`graveler.kv`); the repository record is a
small JSON document.

Ref expressions (lakeFS's syntax)::

    main            a branch: reads show its staging over its head commit
    v1.0            a tag
    3f2a9c...       a full commit ID, or a unique prefix of at least 4 hex digits
    main@           the branch's committed head, ignoring staging
    REF~N  REF~     N-th first-parent ancestor (~ = ~1)
    REF^N  REF^     N-th parent (^ = ^1, ^0 = the commit itself)
    main~2^2        chains apply left to right

Resolution order is lakeFS's: a full 64-hex commit ID, then a branch, then a
tag, then a commit-ID prefix. Anything with a modifier resolves to a read-only
commit.

Every public method opens and closes its own transaction; the ``*_txn``
functions take the caller's transaction so that graveler can read a branch
and write staging (or seal, or compare-and-set) atomically.
"""

from __future__ import annotations

import enum
import heapq
import json
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Iterator

import lmdb

from graveler import ident
from graveler.errors import AlreadyExists, AmbiguousRef, CorruptedData, InvalidArgument, NotFound
from graveler.kv import DB_BRANCHES, DB_COMMITS, DB_REPO, DB_TAGS, Env
from graveler.proto import graveler_pb2

COMMIT_ID_LENGTH = 64
MIN_COMMIT_PREFIX = 4
COMMIT_VERSION = 1
INITIAL_COMMIT_MESSAGE = "Repository created"

# --- names --------------------------------------------------------------------

_BRANCH_RE = re.compile(r"^\w[-\w]*$", re.ASCII)
_REPO_RE = re.compile(r"^[a-z0-9][a-z0-9-]{2,62}$")
_HEX_RE = re.compile(r"^[0-9a-fA-F]+$")
_TAG_FORBIDDEN = set("~^:?*[\\@$/")


def validate_repository_name(name: str) -> str:
    """lakeFS's rule: 3-63 characters of ``a-z0-9-``, not starting with ``-``."""
    if not isinstance(name, str) or not _REPO_RE.match(name):
        raise InvalidArgument(
            f"invalid repository name {name!r}: use 3-63 characters a-z, 0-9 and '-', starting with a letter or digit"
        )
    return name


def validate_branch_name(name: str) -> str:
    """lakeFS's rule ``^\\w[-\\w]*$`` (ASCII word characters and '-', not starting with '-')."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument("invalid branch name: empty")
    if len(name) > 255:
        raise InvalidArgument(f"invalid branch name {name[:40]!r}...: longer than 255 characters")
    if not _BRANCH_RE.match(name):
        raise InvalidArgument(
            f"invalid branch name {name!r}: use letters, digits, '_' and '-', not starting with '-'"
        )
    return name


def validate_tag_name(name: str) -> str:
    """git's check-ref-format rules, minus '/', and nothing that ref expressions use (~ ^ @ $)."""
    if not isinstance(name, str) or not name:
        raise InvalidArgument("invalid tag name: empty")

    def bad(reason: str) -> InvalidArgument:
        return InvalidArgument(f"invalid tag name {name!r}: {reason}")

    if len(name.encode("utf-8", "surrogatepass")) > 255:
        raise bad("longer than 255 bytes")
    if name.startswith("-") or name.startswith("."):
        raise bad("must not start with '-' or '.'")
    if name.endswith(".") or name.endswith(".lock"):
        raise bad("must not end with '.' or '.lock'")
    if ".." in name:
        raise bad("must not contain '..'")
    for ch in name:
        if ord(ch) <= 0x20 or ord(ch) == 0x7F:
            raise bad("must not contain spaces or control characters")
        if ch in _TAG_FORBIDDEN:
            raise bad(f"must not contain {ch!r} (one of ~ ^ : ? * [ \\ @ $ /)")
    return name


# --- records ------------------------------------------------------------------


def _ts_to_datetime(ts) -> datetime:
    return datetime.fromtimestamp(ts.seconds, tz=timezone.utc).replace(microsecond=ts.nanos // 1000)


def unix_seconds(dt: datetime) -> int:
    """Go's ``time.Unix()``: whole seconds, floored."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    delta = dt - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return delta.days * 86400 + delta.seconds


@dataclass(frozen=True, slots=True)
class Commit:
    """A commit (lakeFS's ``CommitData``). ``id`` is computed by :func:`graveler.ident.commit_id`."""

    id: str
    committer: str
    message: str
    creation_date: datetime  # UTC
    meta_range_id: str
    metadata: dict[str, str] = field(default_factory=dict)
    parents: tuple[str, ...] = ()
    version: int = COMMIT_VERSION
    generation: int = 1

    @staticmethod
    def create(
        committer: str,
        message: str,
        meta_range_id: str,
        parents: tuple[str, ...] | list[str],
        generation: int,
        metadata: dict[str, str] | None = None,
        creation_date: datetime | None = None,
    ) -> "Commit":
        """A new commit record with its ID computed as lakeFS does."""
        when = creation_date or datetime.now(timezone.utc)
        when = when.replace(microsecond=0) if when.tzinfo else when.replace(microsecond=0, tzinfo=timezone.utc)
        md = dict(metadata or {})
        parents = tuple(parents)
        cid = ident.commit_id(committer, message, meta_range_id, unix_seconds(when), md, parents)
        return Commit(cid, committer, message, when, meta_range_id, md, parents, COMMIT_VERSION, generation)

    def computed_id(self) -> str:
        return ident.commit_id(
            self.committer, self.message, self.meta_range_id, unix_seconds(self.creation_date), self.metadata, self.parents
        )

    def to_proto(self) -> graveler_pb2.CommitData:
        pb = graveler_pb2.CommitData(
            id=self.id,
            committer=self.committer,
            message=self.message,
            meta_range_id=self.meta_range_id,
            parents=list(self.parents),
            version=self.version,
            generation=self.generation,
        )
        pb.creation_date.seconds = unix_seconds(self.creation_date)
        pb.creation_date.nanos = self.creation_date.microsecond * 1000
        pb.metadata.update(self.metadata)
        return pb

    def to_bytes(self) -> bytes:
        return self.to_proto().SerializeToString(deterministic=True)

    @staticmethod
    def from_proto(pb: graveler_pb2.CommitData) -> "Commit":
        return Commit(
            id=pb.id,
            committer=pb.committer,
            message=pb.message,
            creation_date=_ts_to_datetime(pb.creation_date),
            meta_range_id=pb.meta_range_id,
            metadata=dict(pb.metadata),
            parents=tuple(pb.parents),
            version=pb.version,
            generation=pb.generation,
        )

    @staticmethod
    def from_bytes(raw: bytes, name: str | None = None) -> "Commit":
        pb = graveler_pb2.CommitData()
        try:
            pb.ParseFromString(raw)
        except Exception as e:
            raise CorruptedData(f"malformed commit record ({e})", name) from None
        return Commit.from_proto(pb)


@dataclass(frozen=True, slots=True)
class Branch:
    """A branch (lakeFS's ``BranchData``): head commit, staging token, sealed tokens (newest first)."""

    name: str
    commit_id: str
    staging_token: str
    sealed_tokens: tuple[str, ...] = ()

    @property
    def tokens(self) -> tuple[str, ...]:
        """Staging tokens in read precedence: current first, then sealed newest first."""
        return (self.staging_token, *self.sealed_tokens)

    def to_bytes(self) -> bytes:
        return graveler_pb2.BranchData(
            id=self.name, commit_id=self.commit_id, staging_token=self.staging_token, sealed_tokens=list(self.sealed_tokens)
        ).SerializeToString(deterministic=True)

    @staticmethod
    def from_bytes(raw: bytes, name: str | None = None) -> "Branch":
        pb = graveler_pb2.BranchData()
        try:
            pb.ParseFromString(raw)
        except Exception as e:
            raise CorruptedData(f"malformed branch record ({e})", name) from None
        return Branch(pb.id, pb.commit_id, pb.staging_token, tuple(pb.sealed_tokens))


@dataclass(frozen=True, slots=True)
class Tag:
    name: str
    commit_id: str


@dataclass(frozen=True, slots=True)
class RepositoryRecord:
    """A repository: name, storage namespace URI, default branch, creation date."""

    name: str
    storage_namespace: str
    default_branch: str
    creation_date: datetime

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "name": self.name,
                "storage_namespace": self.storage_namespace,
                "default_branch": self.default_branch,
                "creation_date": self.creation_date.isoformat(),
            },
            sort_keys=True,
        ).encode()

    @staticmethod
    def from_bytes(raw: bytes) -> "RepositoryRecord":
        try:
            d = json.loads(raw)
            return RepositoryRecord(
                d["name"], d["storage_namespace"], d["default_branch"], datetime.fromisoformat(d["creation_date"])
            )
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptedData(f"malformed repository record ({e})") from None


def new_staging_token() -> str:
    """A fresh staging token: 16 random hex characters (never reused)."""
    return secrets.token_hex(8)


# --- ref expressions -----------------------------------------------------------


class RefType(enum.Enum):
    BRANCH = "branch"
    TAG = "tag"
    COMMIT = "commit"


@dataclass(frozen=True, slots=True)
class ResolvedRef:
    """What a ref expression points at.

    ``type`` is BRANCH only for a plain branch name: then ``branch`` is its name
    and ``tokens`` its staging tokens in read precedence (current, then sealed
    newest first), so reads show staging over ``commit_id``. ``BRANCH@`` and any
    expression with ``~``/``^`` are COMMIT refs (read-only); ``branch`` then
    still names the branch they started from, if any.
    """

    type: RefType
    commit_id: str
    branch: str | None = None
    tokens: tuple[str, ...] = ()

    @property
    def is_branch(self) -> bool:
        return self.type is RefType.BRANCH

    @property
    def read_only(self) -> bool:
        return self.type is not RefType.BRANCH


@dataclass(frozen=True, slots=True)
class RawRef:
    base: str
    modifiers: tuple[tuple[str, int], ...]  # ("~" | "^" | "@", amount)


_MOD_RE = re.compile(r"[~^@]\d*")


def parse_ref(expr: str) -> RawRef:
    """Split a ref expression into its base and modifiers (``~N``, ``^N``, ``@``)."""
    if not isinstance(expr, str) or not expr:
        raise InvalidArgument("empty ref")
    if any(ord(c) <= 0x20 or c == "\x7f" for c in expr):
        raise InvalidArgument(f"invalid ref {expr!r}: contains spaces or control characters")
    if "$" in expr:
        raise InvalidArgument(f"invalid ref {expr!r}: '$' is not supported")
    i = 0
    while i < len(expr) and expr[i] not in "~^@":
        i += 1
    base = expr[:i]
    if not base:
        raise InvalidArgument(f"invalid ref {expr!r}: no branch, tag or commit before the modifier")
    mods: list[tuple[str, int]] = []
    pos = i
    while pos < len(expr):
        m = _MOD_RE.match(expr, pos)
        if m is None:
            raise InvalidArgument(f"invalid ref {expr!r}: unexpected {expr[pos:]!r}")
        tok = m.group(0)
        kind, digits = tok[0], tok[1:]
        if kind == "@" and digits:
            raise InvalidArgument(f"invalid ref {expr!r}: '@' takes no number")
        if len(digits) > 9:
            raise InvalidArgument(f"invalid ref {expr!r}: number too large")
        mods.append((kind, int(digits) if digits else 1))
        pos = m.end()
    if any(k == "@" for k, _ in mods) and len(mods) != 1:
        raise InvalidArgument(f"invalid ref {expr!r}: '@' must be the only modifier (BRANCH@)")
    return RawRef(base, tuple(mods))


# --- the manager ------------------------------------------------------------------

_RECORD_KEY = b"record"


class RefManager:
    """Repository record, branches, tags and commits in one LMDB environment."""

    def __init__(self, env: Env):
        self.env = env
        self._db_repo = env.dbs[DB_REPO]
        self._db_branches = env.dbs[DB_BRANCHES]
        self._db_tags = env.dbs[DB_TAGS]
        self._db_commits = env.dbs[DB_COMMITS]

    # repository record
    def get_repository_txn(self, txn: lmdb.Transaction) -> RepositoryRecord:
        raw = txn.get(_RECORD_KEY, db=self._db_repo)
        if raw is None:
            raise NotFound(f"repository record missing in {self.env.path}")
        return RepositoryRecord.from_bytes(raw)

    def get_repository(self) -> RepositoryRecord:
        with self.env.read() as txn:
            return self.get_repository_txn(txn)

    def put_repository_txn(self, txn: lmdb.Transaction, rec: RepositoryRecord, overwrite: bool = False) -> None:
        if not txn.put(_RECORD_KEY, rec.to_bytes(), db=self._db_repo, overwrite=overwrite):
            raise AlreadyExists(f"repository {rec.name!r} already exists")

    # commits
    def get_commit_txn(self, txn: lmdb.Transaction, commit_id: str) -> Commit:
        raw = txn.get(commit_id.encode("ascii", "replace"), db=self._db_commits)
        if raw is None:
            raise NotFound(f"commit {commit_id} not found")
        return Commit.from_bytes(raw, commit_id)

    def get_commit(self, commit_id: str) -> Commit:
        """The commit with this full ID (NotFound if absent)."""
        with self.env.read() as txn:
            return self.get_commit_txn(txn, commit_id)

    def put_commit_txn(self, txn: lmdb.Transaction, commit: Commit) -> None:
        """Store a commit; storing the same ID again is a no-op (commits are content addressed)."""
        txn.put(commit.id.encode("ascii"), commit.to_bytes(), db=self._db_commits, overwrite=False)

    def put_commit(self, commit: Commit) -> None:
        self.env.write(lambda txn: self.put_commit_txn(txn, commit))

    def commit_by_prefix_txn(self, txn: lmdb.Transaction, prefix: str) -> Commit | None:
        """The one commit whose ID starts with ``prefix``; None if none; AmbiguousRef if several."""
        p = prefix.lower().encode("ascii")
        cur = txn.cursor(db=self._db_commits)
        found: list[bytes] = []
        if cur.set_range(p):
            for k in cur.iternext(keys=True, values=False):
                if not k.startswith(p):
                    break
                found.append(k)
                if len(found) > 1:
                    raise AmbiguousRef(f"commit prefix {prefix!r} is ambiguous (matches {len(found)}+ commits)")
        if not found:
            return None
        return self.get_commit_txn(txn, found[0].decode())

    def iter_commit_ids(self) -> list[str]:
        with self.env.read() as txn:
            return [k.decode() for k in txn.cursor(db=self._db_commits).iternext(keys=True, values=False)]

    def list_commits(self) -> Iterator[Commit]:
        """Every commit, in commit-ID order (read in batches of 1000, one transaction each)."""
        start = b""
        while True:
            batch: list[Commit] = []
            with self.env.read() as txn:
                cur = txn.cursor(db=self._db_commits)
                if cur.set_range(start):
                    for k, v in cur:
                        batch.append(Commit.from_bytes(v, k.decode()))
                        if len(batch) >= 1000:
                            break
            yield from batch
            if len(batch) < 1000:
                return
            start = batch[-1].id.encode() + b"\x00"

    # branches
    def get_branch_txn(self, txn: lmdb.Transaction, name: str) -> Branch:
        raw = txn.get(name.encode(), db=self._db_branches)
        if raw is None:
            raise NotFound(f"branch {name!r} not found")
        return Branch.from_bytes(raw, name)

    def branch_raw_txn(self, txn: lmdb.Transaction, name: str) -> bytes | None:
        """The stored bytes of a branch record (to notice that it changed)."""
        return txn.get(name.encode(), db=self._db_branches)

    def get_branch(self, name: str) -> Branch:
        with self.env.read() as txn:
            return self.get_branch_txn(txn, name)

    def put_branch_txn(self, txn: lmdb.Transaction, branch: Branch) -> None:
        txn.put(branch.name.encode(), branch.to_bytes(), db=self._db_branches)

    def create_branch_txn(self, txn: lmdb.Transaction, name: str, commit_id: str) -> Branch:
        validate_branch_name(name)
        self.get_commit_txn(txn, commit_id)
        b = Branch(name, commit_id, new_staging_token(), ())
        if not txn.put(name.encode(), b.to_bytes(), db=self._db_branches, overwrite=False):
            raise AlreadyExists(f"branch {name!r} already exists")
        return b

    def delete_branch_txn(self, txn: lmdb.Transaction, name: str) -> Branch:
        b = self.get_branch_txn(txn, name)
        txn.delete(name.encode(), db=self._db_branches)
        return b

    def list_branches(self) -> list[Branch]:
        """All branches, by name."""
        with self.env.read() as txn:
            return [Branch.from_bytes(v, k.decode()) for k, v in txn.cursor(db=self._db_branches)]

    # tags
    def get_tag_txn(self, txn: lmdb.Transaction, name: str) -> Tag:
        raw = txn.get(name.encode(), db=self._db_tags)
        if raw is None:
            raise NotFound(f"tag {name!r} not found")
        pb = graveler_pb2.TagData()
        try:
            pb.ParseFromString(raw)
        except Exception as e:
            raise CorruptedData(f"malformed tag record ({e})", name) from None
        return Tag(pb.id, pb.commit_id)

    def create_tag_txn(self, txn: lmdb.Transaction, name: str, commit_id: str) -> Tag:
        validate_tag_name(name)
        self.get_commit_txn(txn, commit_id)
        raw = graveler_pb2.TagData(id=name, commit_id=commit_id).SerializeToString(deterministic=True)
        if not txn.put(name.encode(), raw, db=self._db_tags, overwrite=False):
            raise AlreadyExists(f"tag {name!r} already exists")
        return Tag(name, commit_id)

    def delete_tag_txn(self, txn: lmdb.Transaction, name: str) -> None:
        if not txn.delete(name.encode(), db=self._db_tags):
            raise NotFound(f"tag {name!r} not found")

    def list_tags(self) -> list[Tag]:
        """All tags, by name."""
        out = []
        with self.env.read() as txn:
            for k, v in txn.cursor(db=self._db_tags):
                pb = graveler_pb2.TagData()
                pb.ParseFromString(v)
                out.append(Tag(pb.id, pb.commit_id))
        return out

    # resolution
    def resolve_txn(self, txn: lmdb.Transaction, expr: str) -> ResolvedRef:
        raw = parse_ref(expr)
        rr = self._resolve_base(txn, raw.base)
        if not raw.modifiers:
            return rr
        if raw.modifiers[0][0] == "@":
            if rr.type is not RefType.BRANCH:
                raise InvalidArgument(f"invalid ref {expr!r}: '@' applies to branches only")
            return ResolvedRef(RefType.COMMIT, rr.commit_id, branch=rr.branch)
        cid = rr.commit_id
        for kind, n in raw.modifiers:
            if kind == "~":
                for _ in range(n):
                    c = self.get_commit_txn(txn, cid)
                    if not c.parents:
                        raise NotFound(f"ref {expr!r}: commit {cid[:12]} has no parent")
                    cid = c.parents[0]
            else:  # "^"
                if n == 0:
                    continue
                c = self.get_commit_txn(txn, cid)
                if n > len(c.parents):
                    raise NotFound(f"ref {expr!r}: commit {cid[:12]} has {len(c.parents)} parent(s), not {n}")
                cid = c.parents[n - 1]
        return ResolvedRef(RefType.COMMIT, cid, branch=rr.branch)

    def resolve(self, expr: str) -> ResolvedRef:
        """Resolve a ref expression (see the module docstring)."""
        with self.env.read() as txn:
            return self.resolve_txn(txn, expr)

    def _resolve_base(self, txn: lmdb.Transaction, base: str) -> ResolvedRef:
        is_hex = bool(_HEX_RE.match(base))
        if is_hex and len(base) == COMMIT_ID_LENGTH:
            raw = txn.get(base.lower().encode(), db=self._db_commits)
            if raw is not None:
                return ResolvedRef(RefType.COMMIT, base.lower())
        raw = txn.get(base.encode(), db=self._db_branches) if _BRANCH_RE.match(base) else None
        if raw is not None:
            b = Branch.from_bytes(raw, base)
            return ResolvedRef(RefType.BRANCH, b.commit_id, branch=b.name, tokens=b.tokens)
        raw = txn.get(base.encode(), db=self._db_tags)
        if raw is not None:
            pb = graveler_pb2.TagData()
            pb.ParseFromString(raw)
            return ResolvedRef(RefType.TAG, pb.commit_id)
        if is_hex and MIN_COMMIT_PREFIX <= len(base) < COMMIT_ID_LENGTH:
            c = self.commit_by_prefix_txn(txn, base)
            if c is not None:
                return ResolvedRef(RefType.COMMIT, c.id)
        raise NotFound(f"ref {base!r} not found (no such branch, tag or commit)")

    # history
    def log(self, commit_id: str, first_parent: bool = True, amount: int | None = None) -> Iterator[Commit]:
        """Commits from ``commit_id`` back: first parents only, or the full history
        (every ancestor once, highest generation first, newest first among equals)."""
        if first_parent:
            yield from self._log_first_parent(commit_id, amount)
        else:
            yield from self._log_by_generation(commit_id, amount)

    def _log_first_parent(self, commit_id: str, amount: int | None) -> Iterator[Commit]:
        remaining = amount if amount is not None else -1
        cid: str | None = commit_id
        while cid is not None and remaining != 0:
            batch: list[Commit] = []
            with self.env.read() as txn:
                while cid is not None and remaining != 0 and len(batch) < 512:
                    c = self.get_commit_txn(txn, cid)
                    batch.append(c)
                    remaining -= 1
                    cid = c.parents[0] if c.parents else None
            yield from batch

    def _log_by_generation(self, commit_id: str, amount: int | None) -> Iterator[Commit]:
        remaining = amount if amount is not None else -1
        with self.env.read() as txn:
            first = self.get_commit_txn(txn, commit_id)
        heap: list[tuple[int, float, str, Commit]] = [(-first.generation, -first.creation_date.timestamp(), first.id, first)]
        seen = {first.id}
        while heap and remaining != 0:
            batch: list[Commit] = []
            with self.env.read() as txn:
                while heap and remaining != 0 and len(batch) < 512:
                    _, _, _, c = heapq.heappop(heap)
                    batch.append(c)
                    remaining -= 1
                    for p in c.parents:
                        if p not in seen:
                            seen.add(p)
                            pc = self.get_commit_txn(txn, p)
                            heapq.heappush(heap, (-pc.generation, -pc.creation_date.timestamp(), pc.id, pc))
            yield from batch

    def find_merge_base(self, left_id: str, right_id: str) -> Commit | None:
        """A best common ancestor of two commits (git-merge-base's sense: no other
        common ancestor descends from it); None if the histories never meet.

        lakeFS's walk: both histories from a queue ordered by generation (highest
        first, newest first among equals), each commit marked with the sides it is
        reached from. A commit is the answer when it is taken off the queue with
        both marks: all its descendants have been taken off before it (they have
        higher generations), so it has every mark it will get. (lakeFS answers as
        soon as a parent gets its second mark, which in criss-cross histories can
        be an ancestor of a better base.)
        """
        LEFT, RIGHT = 1, 2
        with self.env.read() as txn:
            left = self.get_commit_txn(txn, left_id)
            if left_id == right_id:
                return left
            right = self.get_commit_txn(txn, right_id)
            reached = {left_id: LEFT, right_id: RIGHT}
            heap = [
                (-left.generation, -left.creation_date.timestamp(), left.id, left),
                (-right.generation, -right.creation_date.timestamp(), right.id, right),
            ]
            heapq.heapify(heap)
            while heap:
                _, _, cid, c = heapq.heappop(heap)
                flags = reached[cid]
                if flags == LEFT | RIGHT:
                    return c
                for p in c.parents:
                    if p not in reached:
                        pc = self.get_commit_txn(txn, p)
                        heapq.heappush(heap, (-pc.generation, -pc.creation_date.timestamp(), pc.id, pc))
                        reached[p] = 0
                    reached[p] |= flags
        return None

    def is_ancestor(self, ancestor_id: str, commit_id: str) -> bool:
        """True if ``ancestor_id`` is ``commit_id`` or one of its ancestors."""
        with self.env.read() as txn:
            target = self.get_commit_txn(txn, ancestor_id)
            stack = [commit_id]
            seen = set()
            while stack:
                cid = stack.pop()
                if cid == ancestor_id:
                    return True
                if cid in seen:
                    continue
                seen.add(cid)
                c = self.get_commit_txn(txn, cid)
                if c.generation <= target.generation and c.generation > 0 and target.generation > 0:
                    continue
                stack.extend(c.parents)
        return False


__all__ = [
    "Branch",
    "Commit",
    "RawRef",
    "RefManager",
    "RefType",
    "RepositoryRecord",
    "ResolvedRef",
    "Tag",
    "new_staging_token",
    "parse_ref",
    "validate_branch_name",
    "validate_repository_name",
    "validate_tag_name",
]
