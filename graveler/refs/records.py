"""The ref records: commits, branches, tags (lakeFS's protobufs) and the repository record (JSON).

Each knows its stored bytes (``to_bytes`` / ``from_bytes``); a commit computes
its ID as lakeFS does (:mod:`graveler.ident`).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from graveler import ident
from graveler.errors import CorruptedData
from graveler.proto import graveler_pb2
from graveler.refs.names import COMMIT_ID_LENGTH

_COMMIT_ID_RE = re.compile(rf"[0-9a-f]{{{COMMIT_ID_LENGTH}}}\Z")

COMMIT_VERSION = 1
INITIAL_COMMIT_MESSAGE = "Repository created"


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def _ts_to_datetime(ts, name: str | None = None) -> datetime:
    """A protobuf Timestamp as a UTC datetime; CorruptedData for one no date can be (beyond years
    1-9999, or nanos outside 0-999,999,999: protobuf's own range is narrower still)."""
    if not 0 <= ts.nanos < 1_000_000_000:
        raise CorruptedData(f"damaged commit record: its date's nanoseconds {ts.nanos} are out of range", name)
    try:
        return _EPOCH + timedelta(seconds=ts.seconds, microseconds=ts.nanos // 1000)
    except OverflowError:
        raise CorruptedData(f"damaged commit record: its date ({ts.seconds} s from 1970) is out of range",
                            name) from None


def unix_seconds(dt: datetime) -> int:
    """Go's ``time.Unix()``: whole seconds, floored."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    delta = dt - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return delta.days * 86400 + delta.seconds


def _check_ref_record(what: str, pb, name: str | None) -> None:
    """A branch's or tag's parsed record can be the one stored under ``name`` (None: not
    checked against a name): its ``id`` that name, its ``commit_id`` a commit ID. CorruptedData
    otherwise (protobuf parses many damaged byte strings without an error)."""
    if name is not None and pb.id != name:
        raise CorruptedData(f"damaged {what} record: it names {what} {pb.id!r}", name)
    if not _COMMIT_ID_RE.match(pb.commit_id):
        raise CorruptedData(f"damaged {what} record: its commit {pb.commit_id!r} is not a commit ID "
                            f"({COMMIT_ID_LENGTH} lowercase hex digits)", name or pb.id)


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
    def from_proto(pb: graveler_pb2.CommitData, name: str | None = None) -> "Commit":
        return Commit(
            id=pb.id,
            committer=pb.committer,
            message=pb.message,
            creation_date=_ts_to_datetime(pb.creation_date, name or pb.id),
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
        return Commit.from_proto(pb, name)


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
        """The branch stored under ``name`` (None: not checked against it). CorruptedData for a
        record that is not a ``BranchData`` or cannot be this branch's: its ``id`` another name,
        its ``commit_id`` not a commit ID (as :meth:`Tag.from_bytes` checks)."""
        pb = graveler_pb2.BranchData()
        try:
            pb.ParseFromString(raw)
        except Exception as e:
            raise CorruptedData(f"malformed branch record ({e})", name) from None
        _check_ref_record("branch", pb, name)
        return Branch(pb.id, pb.commit_id, pb.staging_token, tuple(pb.sealed_tokens))


@dataclass(frozen=True, slots=True)
class Tag:
    """A tag (lakeFS's ``TagData``): its name and the commit it points at."""

    name: str
    commit_id: str

    def to_bytes(self) -> bytes:
        return graveler_pb2.TagData(id=self.name, commit_id=self.commit_id).SerializeToString(deterministic=True)

    @staticmethod
    def from_bytes(raw: bytes, name: str) -> "Tag":
        """The tag stored under ``name``. CorruptedData (naming the tag) for a record that is
        not a ``TagData``, or one that parses but cannot be this tag's: its ``id`` another
        name, its ``commit_id`` not a commit ID (64 lowercase hex digits, as every commit
        graveler or lakeFS makes) -- protobuf parses many damaged byte strings without error."""
        pb = graveler_pb2.TagData()
        try:
            pb.ParseFromString(raw)
        except Exception as e:  # protobuf's DecodeError (and its RuntimeWarnings' kin)
            raise CorruptedData(f"malformed tag record ({e})", name) from None
        _check_ref_record("tag", pb, name)
        return Tag(name, pb.commit_id)


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
        except (ValueError, KeyError, TypeError, RecursionError) as e:
            raise CorruptedData(f"malformed repository record ({type(e).__name__}: {e})") from None


def new_staging_token() -> str:
    """A fresh staging token: 16 random hex characters (never reused)."""
    return secrets.token_hex(8)


__all__ = [
    "COMMIT_VERSION",
    "INITIAL_COMMIT_MESSAGE",
    "Branch",
    "Commit",
    "RepositoryRecord",
    "Tag",
    "new_staging_token",
    "unix_seconds",
]
