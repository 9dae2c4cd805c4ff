"""The RefManager (lakeFS's): the repository record, branches, tags and commits.

Records (:mod:`graveler.refs.records`) are stored in the named tables of the
repository's KV store (the protocol of :mod:`graveler.kv.base`; any backend). Resolution of a ref
expression (:mod:`graveler.refs.expr`) follows lakeFS's order: a full 64-hex
commit ID, then a branch, then a tag, then a commit-ID prefix; anything with a
modifier resolves to a read-only commit.

Every public method opens and closes its own transaction; the ``*_txn``
methods take the caller's transaction so that graveler can read a branch and
write staging (or seal, or compare-and-set) atomically.
"""

from __future__ import annotations

import itertools

import os
import socket
import zlib
from typing import Iterator

from graveler import fences
from graveler.errors import AlreadyExists, AmbiguousRef, CorruptedData, InvalidArgument, NotFound, RepositoryGone
from graveler.kv.base import BRANCHES, COMMITS, REPO, STAMPS, TAGS, Store, Txn, prefix_successor
from graveler.refs import graph
from graveler.refs.expr import RefType, ResolvedRef, parse_ref
from graveler.refs.names import (
    BRANCH_RE,
    COMMIT_ID_LENGTH,
    HEX_RE,
    MIN_COMMIT_PREFIX,
    validate_branch_name,
    validate_lakefs_tag_name,
    validate_tag_name,
)
from graveler.refs.records import Branch, Commit, RepositoryRecord, Tag, new_staging_token

_RECORD_KEY = b"record"
_VERIFIED: dict[str, bytes] = {}  # commit ID -> the record that hashed to it (RefManager._commit)
_VERIFIED_MAX = 16384
_EXPR_CHARS = frozenset("~^@$/")  # in a ref expression, or only in a tag lakeFS's rule lets through
_STRIPES = 256  # stamp stripes per branch (see RefManager.bump_staged_stamp_txn)
_stripes: dict[int, int] = {}  # pid -> this process's stripe


def _stripe() -> int:
    """This process's stamp stripe: its PID offset by a hash of the host name, so processes of one
    host whose PIDs lie within 256 of each other (a job's workers) never share one."""
    pid = os.getpid()
    s = _stripes.get(pid)
    if s is None:
        s = _stripes[pid] = (pid + zlib.crc32(socket.gethostname().encode())) % _STRIPES
    return s


def _sum(rows) -> int:
    return sum(int.from_bytes(v, "big") for _, v in rows)


_BORN = b"born\0"  # + a branch's name, in the repo table: its birth (get_born_txn)
_OWN = b"own\0"  # + a key of RefManager._OWN_KEYS, in the repo table (graveler.claims)


class RefManager:
    """Repository record, branches, tags and commits in one repository's KV store."""

    def __init__(self, env: Store):
        self.env = env
        self._same_raw: bytes | None = None  # the record's bytes check_same_txn found to be the opened one

    # repository record
    def get_repository_txn(self, txn: Txn) -> RepositoryRecord:
        raw = txn.get(REPO, _RECORD_KEY)
        if raw is None:
            for key, _ in txn.scan(REPO, values=False):  # a record under a damaged key: not a create unfinished
                if key.startswith((_BORN, _OWN, fences.FENCE_PREFIX, fences.UNSAVED_PREFIX)):
                    continue  # (a branch's rows, not the record)
                raise CorruptedData(f"damaged repository record in {self.env.label}: none under {_RECORD_KEY!r}, "
                                    f"one under {key!r}")
            raise NotFound(f"repository record missing in {self.env.label}")
        return RepositoryRecord.from_bytes(raw)

    def get_repository(self) -> RepositoryRecord:
        with self.env.read() as txn:
            return self.get_repository_txn(txn)

    def record_key(self) -> tuple[str, bytes]:
        """Where the repository record is (for a batched read: ``txn.get_many``)."""
        return REPO, _RECORD_KEY

    def check_same_txn(self, txn: Txn, rec: RepositoryRecord) -> None:
        """NotFound unless the repository in this KV is still the one whose record was ``rec``:
        on a shared KV another host may delete the repository and create one of its name (another
        storage namespace, another creation date) while this process has the first one open; what
        it wrote next would go into the new one with its objects in the old namespace."""
        raw = txn.get(REPO, _RECORD_KEY)
        if raw is not None and raw == self._same_raw:
            return  # (the bytes found to be this repository's record before: nothing to decode)
        try:
            cur = self.get_repository_txn(txn)
        except NotFound:
            cur = None
        if cur is not None and cur.creation_date == rec.creation_date and cur.storage_namespace == rec.storage_namespace:
            self._same_raw = raw
            return
        again = "" if cur is None else f" and one of its name made again (at {cur.storage_namespace})"
        raise RepositoryGone(f"repository {rec.name!r} was deleted{again} since this process opened it: open it again "
                       f"(a mount: lakefuse umount, then mount again)")

    def put_repository_txn(self, txn: Txn, rec: RepositoryRecord, overwrite: bool = False) -> None:
        if overwrite:
            txn.put(REPO, _RECORD_KEY, rec.to_bytes())
        elif not txn.insert(REPO, _RECORD_KEY, rec.to_bytes()):
            raise AlreadyExists(f"repository {rec.name!r} already exists")

    _OWN_KEYS = (b"claim",)  # the repository table's other keys a caller may read and set (graveler.claims)

    def _own_key(self, key: bytes) -> bytes:
        if key not in self._OWN_KEYS:
            raise InvalidArgument(f"no repository value {key!r}")
        return _OWN + key

    def repo_value_txn(self, txn: Txn, key: bytes) -> bytes | None:
        return txn.get(REPO, self._own_key(key))

    def put_repo_value_txn(self, txn: Txn, key: bytes, value: bytes) -> None:
        txn.put(REPO, self._own_key(key), value)

    # commits
    def get_commit_txn(self, txn: Txn, commit_id: str) -> Commit:
        raw = txn.get(COMMITS, commit_id.encode("ascii", "replace"))
        if raw is None:
            raise NotFound(f"commit {commit_id} not found")
        return self._checked(Commit.from_bytes(raw, commit_id), raw, commit_id)

    def _checked(self, c: Commit, raw: bytes, key: str) -> Commit:
        """Commit ``c``, parsed from ``raw`` stored under ``key``, checked against it: a commit's ID is the hash of its
        content (lakeFS's), so a record that does not hash to its key is damage -- another tree, a
        changed message, served under the ID (found by a damage tour). Each (ID, record) checked
        once per process (the hash costs about as much as the parse)."""
        if _VERIFIED.get(key) != raw:
            computed = c.computed_id() if c.id == key else c.id
            if computed != key:
                raise CorruptedData(f"damaged commit record {key}: its content is not the commit its ID names "
                                    f"(it hashes to {computed[:16]}...)", self.env.label)
            if len(_VERIFIED) >= _VERIFIED_MAX:
                _VERIFIED.clear()
            _VERIFIED[key] = raw
        return c

    def get_commit(self, commit_id: str) -> Commit:
        """The commit with this full ID (NotFound if absent)."""
        with self.env.read() as txn:
            return self.get_commit_txn(txn, commit_id)

    def put_commit_txn(self, txn: Txn, commit: Commit) -> None:
        """Store a commit; storing the same ID again is a no-op (commits are content addressed)."""
        txn.insert(COMMITS, commit.id.encode("ascii"), commit.to_bytes())

    def put_commit(self, commit: Commit) -> None:
        self.env.write(lambda txn: self.put_commit_txn(txn, commit))

    def commit_by_prefix_txn(self, txn: Txn, prefix: str) -> Commit | None:
        """The one commit whose ID starts with ``prefix``; None if none; AmbiguousRef if several."""
        p = prefix.lower().encode("ascii")
        found: list[bytes] = []
        for k, _ in txn.scan(COMMITS, p, values=False):
            if not k.startswith(p):
                break
            found.append(k)
            if len(found) > 1:
                raise AmbiguousRef(f"commit prefix {prefix!r} is ambiguous (matches {len(found)}+ commits)")
        if not found:
            return None
        return self.get_commit_txn(txn, found[0].decode())

    def prefix_commits(self, name: str) -> bool:
        """Whether ``name`` is also a commit-ID prefix (4 to 63 hex digits) of a stored commit, one or
        more: a branch or tag so named takes the name from it in ref expressions (lakeFS's order)."""
        if not (HEX_RE.fullmatch(name) and MIN_COMMIT_PREFIX <= len(name) < COMMIT_ID_LENGTH):
            return False
        p = name.lower().encode("ascii")
        with self.env.read() as txn:
            return any(k.startswith(p) for k, _ in itertools.islice(txn.scan(COMMITS, p, values=False), 1))

    def count_commits(self) -> int:
        """How many commits are stored (the store's count: no commit is read)."""
        with self.env.read() as txn:
            return txn.count(COMMITS)

    def iter_commit_ids(self) -> list[str]:
        with self.env.read() as txn:
            return [k.decode("utf-8", "replace") for k, _ in txn.scan(COMMITS, values=False)]

    def list_commits(self) -> Iterator[Commit]:
        """Every commit, in commit-ID order (read in batches of 1000, one transaction each)."""
        start = b""
        while True:
            batch: list[Commit] = []
            with self.env.read() as txn:
                for k, v in txn.scan(COMMITS, start):
                    c = Commit.from_bytes(v, k.decode("utf-8", "replace"))
                    if c.id.encode() != k:  # (a damaged key, or a record under another commit's key)
                        raise CorruptedData(f"damaged commit record: keyed {k!r}, it is commit {c.id!r}")
                    batch.append(self._checked(c, v, c.id))
                    if len(batch) >= 1000:
                        break
            yield from batch
            if len(batch) < 1000:
                return
            start = batch[-1].id.encode() + b"\x00"

    # branches
    def get_branch_txn(self, txn: Txn, name: str) -> Branch:
        raw = txn.get(BRANCHES, name.encode())
        if raw is None:
            raise NotFound(f"branch {name!r} not found")
        return Branch.from_bytes(raw, name)

    def branch_raw_txn(self, txn: Txn, name: str) -> bytes | None:
        """The stored bytes of a branch record (to notice that it changed)."""
        return txn.get(BRANCHES, name.encode())

    def branch_raw(self, name: str) -> bytes | None:
        """:meth:`branch_raw_txn` as a read of its own (one point read)."""
        return self.env.get(BRANCHES, name.encode())

    def get_branch(self, name: str) -> Branch:
        with self.env.read() as txn:
            return self.get_branch_txn(txn, name)

    def put_branch_txn(self, txn: Txn, branch: Branch) -> None:
        txn.put(BRANCHES, branch.name.encode(), branch.to_bytes())
        self.bump_stamp_txn(txn, branch.name)

    # Change stamps: the sum of a branch's counters, bumped in the same transaction as every change
    # of what the branch shows. Changes of the branch record (head moves, seals, resets, creation,
    # deletion) bump its base counter (key: the name); staged writes bump their writer's stripe
    # (key: name + b"\0" + a stripe byte of this process), with Txn.add, so staged writes of many
    # processes never contend for one row. A sum only grows, by exactly one per change. Stripes are
    # few (256) and kept, as the base counter is: a branch made again later goes on counting.
    def bump_stamp_txn(self, txn: Txn, name: str) -> int:
        k = name.encode()
        raw = txn.get(STAMPS, k)
        n = (int.from_bytes(raw, "big") if raw else 0) + 1
        txn.put(STAMPS, k, n.to_bytes(8, "big"))
        return n

    def bump_staged_stamp_txn(self, txn: Txn, name: str) -> None:
        """A staged write's bump: this process's stripe of the branch's stamp."""
        txn.add(STAMPS, name.encode() + b"\0" + bytes((_stripe(),)), 1)

    def stamp(self, name: str) -> int:
        """The branch's change stamp, read on its own (one statement on a server: asked per
        request by a mount's branch trees)."""
        k = name.encode()
        return _sum(self.env.get_range(STAMPS, k, k + b"\x01"))

    def stamp_txn(self, txn: Txn, name: str) -> int:
        k = name.encode()
        return _sum(txn.scan(STAMPS, k, k + b"\x01"))

    def create_branch_txn(self, txn: Txn, name: str, commit_id: str) -> Branch:
        validate_branch_name(name)
        self.get_commit_txn(txn, commit_id)
        b = Branch(name, commit_id, new_staging_token(), ())
        if not txn.insert(BRANCHES, name.encode(), b.to_bytes()):
            raise AlreadyExists(f"branch {name!r} already exists")
        self.new_birth_txn(txn, name)
        return b

    def new_birth_txn(self, txn: Txn, name: str) -> None:
        """Give branch ``name``, just made (created, a repository's first, restored from a dump), a
        birth of its own (:meth:`get_born_txn`) and move its stamp."""
        txn.put(REPO, _BORN + name.encode(), os.urandom(8).hex().encode())
        self.bump_stamp_txn(txn, name)

    def get_born_txn(self, txn: Txn, name: str) -> str | None:
        """The birth of branch ``name``: an ID its creation drew, so that a reader holding it
        tells the branch from a later one of the same name (deleted, then made again), and from the
        branch of its name in a repository made again under its name. None for a branch made
        before births were kept (a repository's first branch and restored ones: until 2026-12)."""
        raw = txn.get(REPO, _BORN + name.encode())
        return None if raw is None else raw.decode("ascii", "replace")

    def birth_names(self) -> list[str]:
        """The names of the branches that have a birth (fsck: each must have its record too)."""
        with self.env.read() as txn:
            return [k[len(_BORN):].decode("utf-8", "replace")
                    for k, _ in txn.scan(REPO, _BORN, prefix_successor(_BORN), values=False)]

    def read_branch_and_born_txn(self, txn: Txn, name: str) -> None:
        """Read branch ``name``'s record and its birth at once (one round trip on a server's store):
        :meth:`get_branch_txn` and :meth:`get_born_txn` in this transaction then read nothing."""
        txn.get_many([(BRANCHES, name.encode()), (REPO, _BORN + name.encode())])

    def delete_branch_txn(self, txn: Txn, name: str) -> Branch:
        b = self.get_branch_txn(txn, name)
        txn.delete(BRANCHES, name.encode())
        self.drop_fence_txn(txn, name)  # (a branch made again later is whole)
        self.drop_unsaved_txn(txn, name)
        txn.delete(REPO, _BORN + name.encode())  # (one made again later is another branch)
        self.bump_stamp_txn(txn, name)  # kept: a branch made again later goes on counting
        return b

    # fences (graveler.fences): a change of the branch made in several transactions, under way
    def get_fence_txn(self, txn: Txn, name: str) -> dict | None:
        raw = txn.get(REPO, fences.FENCE_PREFIX + name.encode())
        return None if raw is None else fences.decode(raw)

    def put_fence_txn(self, txn: Txn, name: str, fence: dict) -> None:
        txn.put(REPO, fences.FENCE_PREFIX + name.encode(), fences.encode(fence))

    def drop_fence_txn(self, txn: Txn, name: str) -> None:
        txn.delete(REPO, fences.FENCE_PREFIX + name.encode())

    # unsaved writes (graveler.fences): files a mount wrote on the branch whose saves failed, retried
    def unsaved_txn(self, txn: Txn, name: str) -> list[tuple[bytes, dict]]:
        """The records of unsaved writes on branch ``name``: (key, record)."""
        start = fences.unsaved_prefix(name)
        return [(bytes(k), fences.decode(v)) for k, v in txn.scan(REPO, start, prefix_successor(start))]

    def put_unsaved_txn(self, txn: Txn, name: str, writer: str, record: dict | None) -> None:
        key = fences.unsaved_key(name, writer)
        if record is None:
            txn.delete(REPO, key)
        else:
            txn.put(REPO, key, fences.encode(record))

    def drop_unsaved_txn(self, txn: Txn, name: str) -> None:
        start = fences.unsaved_prefix(name)
        txn.delete_range(REPO, start, prefix_successor(start))

    def drop_unsaved_of_txn(self, txn: Txn, writer: str) -> int:
        """Remove ``writer``'s records on every branch; how many there were."""
        suffix = b"\0" + writer.encode()
        start = fences.UNSAVED_PREFIX
        keys = [bytes(k) for k, _ in txn.scan(REPO, start, prefix_successor(start), values=False)
                if bytes(k).endswith(suffix)]
        for k in keys:
            txn.delete(REPO, k)
        return len(keys)

    def list_branches(self) -> list[Branch]:
        """All branches, by name."""
        with self.env.read() as txn:
            out = []
            for k, v in txn.scan(BRANCHES):
                try:
                    out.append(Branch.from_bytes(v, k.decode("utf-8", "replace")))
                except CorruptedData as e:  # (say which record of which repository: a damaged key may be empty)
                    raise CorruptedData(f"{e.reason} (branch record {k!r})", self.env.label) from None
            return out

    # tags
    def get_tag_txn(self, txn: Txn, name: str) -> Tag:
        raw = txn.get(TAGS, name.encode())
        if raw is None:
            raise NotFound(f"tag {name!r} not found")
        return Tag.from_bytes(raw, name)

    def create_tag_txn(self, txn: Txn, name: str, commit_id: str, restored: bool = False,
                       replace: bool = False, replaced: list | None = None) -> Tag:
        """A new tag; ``restored``: one a refs dump brings, under lakeFS's looser name rule;
        ``replace``: a tag of that name is moved (in this transaction; ``replaced`` gets the commit it named)."""
        (validate_lakefs_tag_name if restored else validate_tag_name)(name)
        self.get_commit_txn(txn, commit_id)
        if replace:
            old = txn.get(TAGS, name.encode())
            if old is not None and replaced is not None:
                replaced.append(Tag.from_bytes(old, name).commit_id)
            txn.delete(TAGS, name.encode())
        if not txn.insert(TAGS, name.encode(), Tag(name, commit_id).to_bytes()):
            raise AlreadyExists(f"tag {name!r} already exists")
        return Tag(name, commit_id)

    def delete_tag_txn(self, txn: Txn, name: str) -> Tag:
        """Delete tag ``name``; the tag it was (what a `tag create` makes again)."""
        was = self.get_tag_txn(txn, name)
        txn.delete(TAGS, name.encode())
        return was

    def list_tags(self) -> list[Tag]:
        """All tags, by name."""
        out = []
        with self.env.read() as txn:
            for k, v in txn.scan(TAGS):
                out.append(Tag.from_bytes(v, k.decode(errors="replace")))
        return out

    # resolution
    def resolve_txn(self, txn: Txn, expr: str) -> ResolvedRef:
        if _EXPR_CHARS.intersection(expr):  # a restored lakeFS tag may be named so: its exact name first
            raw_tag = txn.get(TAGS, expr.encode("utf-8", "surrogateescape"))
            if raw_tag is not None:
                return ResolvedRef(RefType.TAG, Tag.from_bytes(raw_tag, expr).commit_id)
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

    def _resolve_base(self, txn: Txn, base: str) -> ResolvedRef:
        is_hex = bool(HEX_RE.fullmatch(base))
        if is_hex and len(base) == COMMIT_ID_LENGTH:
            raw = txn.get(COMMITS, base.lower().encode())
            if raw is not None:
                return ResolvedRef(RefType.COMMIT, base.lower())
        raw = txn.get(BRANCHES, base.encode()) if BRANCH_RE.fullmatch(base) else None
        if raw is not None:
            b = Branch.from_bytes(raw, base)
            return ResolvedRef(RefType.BRANCH, b.commit_id, branch=b.name, tokens=b.tokens)
        raw = txn.get(TAGS, base.encode())
        if raw is not None:
            return ResolvedRef(RefType.TAG, Tag.from_bytes(raw, base).commit_id)
        if is_hex and MIN_COMMIT_PREFIX <= len(base) < COMMIT_ID_LENGTH:
            c = self.commit_by_prefix_txn(txn, base)
            if c is not None:
                return ResolvedRef(RefType.COMMIT, c.id)
        short = f"; a commit ID prefix takes at least {MIN_COMMIT_PREFIX} hex digits" \
            if is_hex and len(base) < MIN_COMMIT_PREFIX else ""
        raise NotFound(f"ref {base!r} not found (no such branch, tag or commit{short})")

    # history (graveler.refs.graph)
    def log(self, commit_id: str, first_parent: bool = True, amount: int | None = None) -> Iterator[Commit]:
        """Commits from ``commit_id`` back: first parents only, or the full history
        (every ancestor once, newest first by creation date, as lakeFS's log)."""
        return graph.log(self, commit_id, first_parent, amount)

    def find_merge_base(self, left_id: str, right_id: str) -> Commit | None:
        """A best common ancestor of two commits; None if the histories never meet."""
        return graph.find_merge_base(self, left_id, right_id)

    def find_merge_bases(self, left_id: str, right_id: str) -> list[Commit]:
        """Every best common ancestor of two commits (``git merge-base --all``); [] if none."""
        return graph.find_merge_bases(self, left_id, right_id)

    def is_ancestor(self, ancestor_id: str, commit_id: str) -> bool:
        """True if ``ancestor_id`` is ``commit_id`` or one of its ancestors."""
        return graph.is_ancestor(self, ancestor_id, commit_id)


__all__ = ["RefManager"]
