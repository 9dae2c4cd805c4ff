"""``Repository``: one repository's operations, the API the CLI and the mount build on.

Branches and tags, staging writes (stage, delete, reset), reads and listings
(staging over committed), data (upload, read), history and diff; commit,
merge, revert and adopting a metarange are :mod:`graveler.commits`'s, behind
the same object. Get one from :class:`graveler.home.Graveler`::

    g = Graveler(GravelerConfig.from_home(None))
    repo = g.create_repository("demo", "file:///data/demo")   # or g.repository("demo")
    repo.upload("main", "a/b.csv", b"x,y\\n")
    repo.commit("main", "first")

Thread-safe; any number of threads and processes may use the same repository
(see :mod:`graveler.core` for how writes and commits stay consistent). The
managers are private: everything a caller needs is a method here.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Callable, Iterable, Iterator

from graveler.commits import Commits
from graveler.committed.manager import CommittedManager
from graveler.config import GravelerConfig
from graveler.core import BranchMoved, RepoCore
from graveler.errors import Conflict, InvalidArgument, NotFound, ReadOnlyRef
from graveler.kv.base import STAGING, Store
from graveler.listing import ListItem, MergedIterator, list_items
from graveler.model import AddressType, DiffRecord, Entry, MergeStrategy, RangeInfo, Value, encode_records
from graveler.objects import EntryReader, UploadSource, put_object
from graveler.objstore.uri import StorageURI
from graveler.refs import Branch, Commit, RepositoryRecord, ResolvedRef, Tag, new_staging_token, validate_branch_name
from graveler.refs.names import COMMIT_ID_LENGTH, HEX_RE
from graveler.refsdump import dump_refs, restore_refs
from graveler.staging import as_path, as_prefix
from graveler.view import View

log = logging.getLogger(__name__)

ANY_BIRTH = object()  # (staging's ``born`` left out: whichever branch has the name now)


class Repository:
    """One repository's operations. Thread-safe; get it from :class:`graveler.home.Graveler`."""

    def __init__(self, config: GravelerConfig, env: Store, record: RepositoryRecord, store, committed: CommittedManager,
                 store_factory: Callable[[str], object], on_close: Callable[[str], None] | None = None):
        """Built by :class:`graveler.home.Graveler`: ``env`` is the repository's KV store,
        ``store`` its namespace's object store, ``store_factory`` opens the store of another
        URI (entries imported from elsewhere), ``on_close(name)`` tells the home it closed."""
        self._core = core = RepoCore(config, env, record, store, committed)
        self._commits = Commits(core)
        self._env = env
        self._refs = core.refs
        self._staging = core.staging
        self._committed = committed
        self._store = store
        self._entries = EntryReader(record.storage_namespace, store, store_factory)
        self._on_close = on_close

    def close(self) -> None:
        """Close the repository's KV store in this process (the home forgets it; reopen with
        ``Graveler.repository``)."""
        if self._on_close is not None:
            self._on_close(self.name)

    @property
    def config(self) -> GravelerConfig:
        return self._core.config

    @property
    def record(self) -> RepositoryRecord:
        return self._core.record

    @property
    def name(self) -> str:
        return self._core.record.name

    @property
    def default_branch(self) -> str:
        return self._core.record.default_branch

    @property
    def storage_namespace(self) -> str:
        return self._core.record.storage_namespace

    @property
    def store(self):
        """The object store of the storage namespace (data objects, ranges, metaranges, reports)."""
        return self._store

    @property
    def refs_label(self) -> str:
        """Where this repository's refs live, as messages name it (never a password)."""
        return self._env.label

    def refs_value(self, key: bytes, default: bytes | str | None = None, replace: bool = False) -> str | None:
        """A value of the repository's own table (:meth:`graveler.core.RepoCore.own_value`)."""
        return self._core.own_value(key, default, replace)

    # ------------------------------------------------------------------ refs

    def resolve(self, ref: str) -> ResolvedRef:
        """Resolve a ref expression (branch, tag, commit ID or prefix, ``~N``, ``^N``, ``BRANCH@``)."""
        return self._refs.resolve(ref)

    def get_commit(self, ref: str) -> Commit:
        """The commit a ref expression points at (a branch's head)."""
        return self._core.resolve_commit(ref)[1]

    def count_commits(self) -> int:
        """How many commits the repository holds (all of them, reachable or not)."""
        return self._refs.count_commits()

    def list_commits(self) -> Iterator[Commit]:
        """Every commit of the repository, reachable or not, in commit-ID order (for GC)."""
        return self._refs.list_commits()

    def iter_staged(self, token: str) -> Iterator[tuple[bytes, Value | None]]:
        """Every (path, value) staged under one staging token (``None``: a tombstone), in path
        order; a branch's tokens are ``get_branch(name).tokens`` (for GC)."""
        return self._staging.stream(token)

    def get_branch(self, name: str) -> Branch:
        """A branch record (head commit, staging token, sealed tokens)."""
        with self._env.read() as txn:
            return self._core.branch_txn(txn, name)

    def list_branches(self) -> list[Branch]:
        """All branches, by name."""
        return self._refs.list_branches()

    def create_branch(self, name: str, source: str | None = None) -> Branch:
        """Create branch ``name`` at the commit ``source`` resolves to (default: the
        default branch's head). Staged changes of a source branch are not copied. A name of
        64 hex digits is refused: a ref like that resolves as a commit ID (lakeFS's order), so
        such a branch (a restored lakeFS one may be) is never reached by its name."""
        validate_branch_name(name)
        if len(name) == COMMIT_ID_LENGTH and HEX_RE.fullmatch(name):
            raise InvalidArgument(f"invalid branch name {name!r}: 64 hex digits are read as a commit ID")

        def fn(txn):
            self._core.same_txn(txn)
            rr = self._refs.resolve_txn(txn, source or self.default_branch)
            return self._refs.create_branch_txn(txn, name, rr.commit_id)

        b = self._env.write(fn)
        log.info("%s: created branch %s at %s", self.name, name, b.commit_id[:12])
        return b

    def delete_branch(self, name: str) -> Branch:
        """Delete a branch and its staged changes (not the default branch); the branch as it was
        (its commit: what ``create_branch`` from that commit brings back)."""
        if name == self.default_branch:
            raise Conflict(f"cannot delete the default branch {name!r}")
        def fn(txn):
            self._core.write_branch_txn(txn, name)
            return self._refs.delete_branch_txn(txn, name)

        b = self._env.write(fn)
        self._core.drop_tokens(b.tokens, f"deleted branch {name}")
        log.info("%s: deleted branch %s (was %s)", self.name, name, b.commit_id[:12])
        return b

    def get_tag(self, name: str) -> Tag:
        with self._env.read() as txn:
            return self._refs.get_tag_txn(txn, name)

    def list_tags(self) -> list[Tag]:
        """All tags, by name."""
        return self._refs.list_tags()

    def create_tag(self, name: str, ref: str, force: bool = False, previous: list | None = None) -> Tag:
        """Tag the commit ``ref`` resolves to (a branch's head, not its staging). ``force``: a tag of that name is
        moved in the same transaction (no reader finds it missing); ``previous`` gets the commit it named."""

        def fn(txn):
            self._core.same_txn(txn)
            rr = self._refs.resolve_txn(txn, ref)
            return self._refs.create_tag_txn(txn, name, rr.commit_id, replace=force, replaced=previous)

        return self._env.write(fn)

    def delete_tag(self, name: str) -> Tag:
        """Delete tag ``name``; the tag it was."""
        return self._env.write(lambda txn: (self._core.same_txn(txn), self._refs.delete_tag_txn(txn, name))[1])

    # ------------------------------------------------------------------ staging writes

    def stage(self, branch: str, path: str | bytes, entry: Entry | Value) -> None:
        """Stage an entry (or raw record value) at ``path`` on ``branch``."""
        self.stage_many(branch, [(path, entry)])

    def stage_many(self, branch: str, items: Iterable[tuple[str | bytes, Entry | Value | None]],
                   durable: bool = True) -> int:
        """Stage many entries (None = delete) in one transaction; return how many.
        ``durable=False``: return before the transaction is on disk (see
        :meth:`graveler.kv.base.Store.write`); the next durable write makes it durable."""
        return self._stage_many(branch, items, durable, False)[0]

    def stage_stamped(self, branch: str, items: Iterable[tuple[str | bytes, Entry | Value | None]],
                      durable: bool = True, born: str | None | object = ANY_BIRTH) -> tuple[int, int, bytes]:
        """:meth:`stage_many`, and what a reader that made the change needs not read again:
        (how many, the branch's change stamp as of this write -- :meth:`change_stamp`,
        read in its transaction --, the branch record's stored bytes then). ``born``: only on
        the branch of that birth (:meth:`branch_born`; NotFound for a later branch of its name)."""
        return self._stage_many(branch, items, durable, True, born)

    @staticmethod
    def _encoded(items) -> tuple[list[bytes], list]:
        """The paths and staging records of ``items`` (path, entry/value/None): one compiled call,
        made outside the write transaction."""
        paths: list[bytes] = []
        values: list[Entry | Value | None] = []
        for p, e in items:
            paths.append(as_path(p))
            if type(e) is Entry and e.size < 0:
                raise InvalidArgument(f"entry {p!r}: size {e.size} (an object's size is >= 0)")
            values.append(e)
        return paths, encode_records(values)

    def _stage_many(self, branch: str, items, durable: bool, stamped: bool,
                    born: str | None | object = ANY_BIRTH) -> tuple[int, int, bytes | None]:
        paths, records = self._encoded(items)  # (outside the (shared) write transaction)
        refs = self._refs

        def fn(txn):
            b = self._branch_of_birth_txn(txn, branch, born)  # locked until the commit (see Store.write_grouped)
            refs.bump_staged_stamp_txn(txn, branch)
            n = self._staging.put_records_txn(txn, b.staging_token, paths, records)
            if not stamped:
                return n, 0, None
            return n, refs.stamp_txn(txn, branch), refs.branch_raw_txn(txn, branch)

        return self._env.write_grouped(fn, durable)  # concurrent stagers share a transaction

    def _branch_of_birth_txn(self, txn, branch: str, born):
        """``branch``'s record in ``txn``; NotFound if its birth is not ``born`` (unless ANY_BIRTH):
        the branch was deleted and made again since. The two are read in one round trip where the
        store is a server's (``read_branch_and_born_txn``); the reads below then come from it."""
        if born is ANY_BIRTH:
            return self._core.write_branch_txn(txn, branch)
        self._refs.read_branch_and_born_txn(txn, branch)
        b = self._core.branch_txn(txn, branch)
        if self._refs.get_born_txn(txn, branch) != born:
            self._core.same_txn(txn)  # (or the whole repository was made again: say so)
            raise NotFound(f"branch {branch!r} was deleted (a branch of that name was made again since)")
        return b

    def branch_born(self, name: str) -> str | None:
        """The birth of branch ``name`` (:meth:`graveler.refs.RefManager.get_born_txn`): what
        tells it from a later branch of its name; NotFound if there is none."""
        with self._env.read() as txn:
            self._core.write_branch_txn(txn, name)
            return self._refs.get_born_txn(txn, name)

    def stage_stamped_if(self, branch: str, items: Iterable[tuple[str | bytes, Entry | Value | None]],
                         expected: dict[bytes, bytes | None],
                         durable: bool = True, born: str | None | object = ANY_BIRTH) -> tuple[int, int, bytes] | None:
        """:meth:`stage_stamped`, only if ``branch`` still shows at each path of ``expected`` the
        entry whose identity is given there (None: no entry); else None, and nothing is staged.
        What two writers read and then change at once -- a rename of one file on two hosts --
        is changed by one of them: the check and the change are one transaction."""
        paths, records = self._encoded(items)
        core, refs = self._core, self._refs

        def attempt(n: int):
            b, head = core.branch_head(branch)
            committed = {p: self._committed.get(head.meta_range_id, p) for p in expected}  # (may read the store)

            def fn(txn):
                b2 = self._branch_of_birth_txn(txn, branch, born)
                if b2.commit_id != b.commit_id:
                    return None  # committed meanwhile: look again
                for p, ident in expected.items():
                    found, cur = self._staging.get_txn(txn, b2.tokens, p)
                    if not found:
                        cur = committed[p]
                    if (None if cur is None else cur.identity) != ident:
                        return False
                refs.bump_staged_stamp_txn(txn, branch)
                n = self._staging.put_records_txn(txn, b2.staging_token, paths, records)
                return n, refs.stamp_txn(txn, branch), refs.branch_raw_txn(txn, branch)

            return self._env.write(fn, durable)

        got = core.retry(attempt, f"branch {branch!r} kept changing while staging; try again")
        return None if got is False else got

    def stage_if(self, branch: str, path: str | bytes, entry: Entry | Value, expected: bytes | None,
                 born: str | None | object = ANY_BIRTH) -> bool:
        """Stage ``entry`` at ``path`` only if ``branch`` still shows the entry whose identity is
        ``expected`` there (None: no entry), or already shows ``entry`` itself; False (nothing
        changed) if anything else is there -- another writer saved a newer version meanwhile.
        For a retried or recovered save, which must never put stale bytes over a newer write; a
        first save is :meth:`stage` (the last one wins). The staging record is replaced by
        compare-and-set (``Txn.set_if``) against what the same transaction read."""
        p = as_path(path)
        value = entry.to_value() if isinstance(entry, Entry) else entry
        record = encode_records([value])[0]
        core = self._core

        def attempt(n: int) -> bool | None:
            b, head = core.branch_head(branch)
            committed = self._committed.get(head.meta_range_id, p)  # may read the store: not in the transaction

            def fn(txn) -> bool | None:
                b2 = self._branch_of_birth_txn(txn, branch, born)
                if b2.commit_id != b.commit_id:
                    return None  # committed meanwhile: look again
                found, cur = self._staging.get_txn(txn, b2.tokens, p)
                if not found:
                    cur = committed
                ident = None if cur is None else cur.identity
                if ident == value.identity:
                    return True  # already there (an earlier try that reported a failure went through)
                if ident != expected:
                    return False
                key = self._staging.key(b2.staging_token, p)
                if not txn.set_if(STAGING, key, record, txn.get(STAGING, key)):
                    return None
                self._refs.bump_stamp_txn(txn, branch)
                return True

            return self._env.write(fn)

        return core.retry(attempt, f"branch {branch!r} kept changing while staging {p.decode()!r}; try again")

    def sync(self) -> None:
        """Make every staging change of this process durable (after ``durable=False`` ones)."""
        self._env.sync()

    def delete(self, branch: str, path: str | bytes, must_exist: bool = True) -> None:
        """Delete ``path`` on ``branch`` (stages a tombstone). NotFound if the
        path does not exist on the branch and ``must_exist``."""
        p = as_path(path)
        if must_exist:
            self.get_value(branch, p)  # NotFound, or ReadOnlyRef-worthy refs fail below
        self.stage_many(branch, [(p, None)])

    def delete_prefix(self, branch: str, prefix: str | bytes, batch: int = 1000, allow_all: bool = False) -> int:
        """Delete every path under ``prefix`` on ``branch`` (tombstones, ``batch`` per
        transaction); return how many. An empty prefix (everything) needs ``allow_all``."""
        pfx = as_prefix(prefix)
        if not pfx and not allow_all:
            raise InvalidArgument("delete_prefix needs a non-empty prefix")
        with self._env.read() as txn:
            self._core.branch_txn(txn, branch)
        n = 0
        pending: list[tuple[bytes, None]] = []
        for item in self.list(branch, pfx, delimiter=b""):
            pending.append((item.path, None))
            if len(pending) >= batch:
                n += self.stage_many(branch, pending)
                pending = []
        if pending:
            n += self.stage_many(branch, pending)
        return n

    def reset(self, branch: str, path: str | bytes | None = None, prefix: str | bytes | None = None,
              tree: str | bytes | None = None) -> None:
        """Discard uncommitted changes on ``branch``: all of them, one ``path``, every
        path under ``prefix``, or a ``tree`` (the path itself and everything under
        ``tree + "/"``, as a filesystem names a file or a directory) -- each in one
        transaction."""
        if sum(x is not None for x in (path, prefix, tree)) > 1:
            raise InvalidArgument("reset takes one of a path, a prefix or a tree")
        core = self._core
        if path is None and prefix is None and tree is None:
            b = self._env.write(lambda txn: self._reset_all_txn(txn, branch))
            self._core.drop_tokens(b.tokens, f"reset branch {branch}")
            log.info("%s: reset branch %s", self.name, branch)
            return
        if tree is not None:
            key = as_path(tree)
            specs = [(False, key), (True, as_prefix(key + b"/"))]
        elif prefix is not None:
            specs = [(True, as_prefix(prefix))]
        else:
            specs = [(False, as_path(path))]

        def attempt(n: int) -> bool | None:
            b, head = core.branch_head(branch)
            # Paths that sealed tokens (an unfinished commit) change: override them in the
            # current token with the committed value. Sealed tokens themselves never change.
            sealed_keys: list[bytes] = []
            if b.sealed_tokens:
                for is_prefix, key in specs:
                    if is_prefix:
                        it = MergedIterator([self._staging.iterator(t, key) for t in b.sealed_tokens],
                                            keep_tombstones=True)
                        for k, _ in it:
                            if not k.startswith(key):
                                break
                            sealed_keys.append(k)
                    else:
                        found, _ = self._staging.get(b.sealed_tokens, key)
                        if found:
                            sealed_keys.append(key)
            overrides = [(k, self._committed.get(head.meta_range_id, k)) for k in sealed_keys]

            def fn(txn) -> bool | None:
                b2 = core.write_branch_txn(txn, branch)
                if b2.commit_id != b.commit_id or b2.sealed_tokens != b.sealed_tokens:
                    return None
                for is_prefix, key in specs:
                    if is_prefix:
                        self._staging.drop_prefix_txn(txn, b2.staging_token, key)
                    else:
                        self._staging.remove_txn(txn, b2.staging_token, key)
                self._staging.set_many_txn(txn, b2.staging_token, overrides)
                self._refs.bump_stamp_txn(txn, branch)
                return True

            return self._env.write(fn)

        core.retry(attempt, f"branch {branch!r} kept changing during reset; try again")

    def _reset_all_txn(self, txn, branch: str) -> Branch:
        b = self._core.write_branch_txn(txn, branch)
        self._refs.put_branch_txn(txn, Branch(b.name, b.commit_id, new_staging_token(), ()))
        self._refs.drop_fence_txn(txn, branch)  # (what a change cut short left is discarded with the rest)
        self._refs.drop_unsaved_txn(txn, branch)  # (a mount still retrying puts its record back)
        return b

    def fence(self, branch: str, fence: dict | None) -> None:
        """Put ``fence`` (:func:`graveler.fences.new_fence`) on ``branch`` -- None: remove its
        fence: a change made in several transactions is under way, and commits wait for it to
        be removed (:mod:`graveler.fences`). NotFound if the branch is gone."""
        def fn(txn) -> None:
            if fence is None:
                self._refs.drop_fence_txn(txn, branch)
            else:
                self._core.write_branch_txn(txn, branch)
                self._refs.put_fence_txn(txn, branch, fence)
        self._env.write(fn)

    def set_unsaved(self, writer: str, records: dict[str, dict | None]) -> None:
        """Put (or, for None, remove) ``writer``'s record of unsaved writes on each branch of
        ``records`` (:func:`graveler.fences.new_unsaved`): commits of those branches are refused
        while one stands (:mod:`graveler.fences`). A branch that is gone is skipped."""
        def fn(txn) -> None:
            for branch, record in records.items():
                if record is not None and self._refs.branch_raw_txn(txn, branch) is None:
                    continue
                self._refs.put_unsaved_txn(txn, branch, writer, record)
        self._env.write(fn)

    def drop_unsaved_of(self, writer: str) -> int:
        """Remove ``writer``'s records of unsaved writes on every branch (its leftovers were
        recovered); how many there were."""
        return self._env.write(lambda txn: self._refs.drop_unsaved_of_txn(txn, writer))

    def unsaved_of(self, branch: str) -> list[dict]:
        """The records of unsaved writes on ``branch`` (every writer's)."""
        with self._env.read() as txn:
            return [r for _, r in self._refs.unsaved_txn(txn, branch)]

    def fence_of(self, branch: str) -> dict | None:
        """The fence on ``branch`` (None: none)."""
        with self._env.read() as txn:
            return self._refs.get_fence_txn(txn, branch)

    # ------------------------------------------------------------------ reads

    def get_value(self, ref: str, path: str | bytes) -> Value:
        """The record value at ``path`` (staging over committed for a branch); NotFound if none."""
        p = as_path(path)
        v = self._core.value_of(ref, p)
        if v is None:
            raise NotFound(f"{p.decode()!r} not found on {ref!r}")
        return v

    def value_or_none(self, ref: str, path: str | bytes) -> Value | None:
        """:meth:`get_value`, None where there is no record."""
        return self._core.value_of(ref, as_path(path))

    def get(self, ref: str, path: str | bytes) -> Entry:
        """The entry at ``path`` on ``ref``; NotFound if none."""
        return Entry.from_value(self.get_value(ref, path))

    def exists(self, ref: str, path: str | bytes) -> bool:
        """Whether ``path`` exists on ``ref`` (staging over committed for a branch)."""
        try:
            self.get_value(ref, path)
            return True
        except NotFound:
            return False

    def names_anything(self, branch: str, path: str | None = None, prefix: str | None = None) -> bool:
        """Whether ``path`` (an object, or a directory: keys under ``path/``) or ``prefix`` names
        anything on ``branch``, as staged or in its head commit (a deletion to undo): what a reset
        of it could touch (a reset of a name that is nowhere is an error, as ``git restore``'s)."""
        under = prefix if path is None else path + "/"
        for ref in (branch, self.get_branch(branch).commit_id):
            if path is not None and self.exists(ref, path):
                return True
            if next(iter(self.list(ref, under)), None) is not None:
                return True
        return False

    def prefix_commits(self, name: str) -> bool:
        """Whether ``name`` is also the ID prefix of a commit (a branch or tag of that name hides it)."""
        return self._refs.prefix_commits(name)

    def has_ref(self, kind: str, name: str) -> bool:
        """Whether a ``kind`` ("branch" or "tag") named ``name`` exists."""
        try:
            (self.get_tag if kind == "tag" else self.get_branch)(name)
            return True
        except (NotFound, ReadOnlyRef):  # (get_branch of a tag's name: ReadOnlyRef)
            return False

    def iter_committed(self, ref: str, start: str | bytes = b"") -> Iterator[tuple[bytes, Value]]:
        """Every (path, value) of the commit ``ref`` points at (a branch's head, without
        its staging), path >= ``start``, in path order, straight from the committed tree."""
        _, commit = self._core.resolve_commit(ref)
        return self._committed.iterator(commit.meta_range_id, as_prefix(start))

    def list(
        self,
        ref: str,
        prefix: str | bytes = b"",
        delimiter: str | bytes = b"/",
        start_after: str | bytes = b"",
    ) -> Iterator[ListItem]:
        """Objects and common prefixes under ``prefix`` on ``ref``, in byte order of
        their names, names > ``start_after`` (a previous name: resumes a listing).
        A branch lists staging over committed (tombstones hide committed keys). A
        common prefix costs one seek, however much is under it. ``delimiter=""``
        lists recursively. The iterator holds no transaction between items."""
        pfx = as_prefix(prefix)
        delim = delimiter.encode() if isinstance(delimiter, str) else bytes(delimiter)
        after = as_prefix(start_after)
        return self._list(ref, self._core.pin(ref), pfx, delim, after)

    def _list(self, ref, pin, pfx: bytes, delim: bytes, after: bytes) -> Iterator[ListItem]:
        last = after
        while True:
            try:
                for item in list_items(self._core.iterator(pin), pfx, delim, last):
                    yield item
                    last = item.path
                return
            except BranchMoved:
                log.debug("%s: branch %s moved during a listing; resuming after %r", self.name,
                          pin.resolved.branch, last)
                pin = self._core.pin(ref)

    # ------------------------------------------------------------------ data

    def put_object(self, source: UploadSource, content_type: str = "", metadata: dict[str, str] | None = None,
                   adopt: bool = False, etag: str | None = None, durable: bool = True,
                   fd: int | None = None, last_modified_ns: int | None = None) -> Entry:
        """Upload bytes, a local file (path) or a binary file object to a new object
        under ``data/`` in the namespace, WITHOUT staging it: the entry (RELATIVE
        address, md5 etag) is the caller's to stage (e.g. many at once with
        :meth:`stage_many`). ``adopt``/``etag``/``durable``/``last_modified_ns``: see
        :func:`graveler.objects.put_object` (a local file handed over, linked into a local
        store instead of copied; ``durable=False``: not fsynced -- :meth:`sync_entry` or
        the next :meth:`commit` makes it durable)."""
        return put_object(self._store, source, content_type, metadata, self.config.upload_spool_dir, adopt, etag,
                          durable, fd, last_modified_ns)

    def sync_entry(self, entry: Entry) -> None:
        """Make the object of ``entry`` (in this namespace) durable if ``put_object(durable=False)``
        left it in the page cache only; a no-op on a store whose writes are durable at once (S3)
        and for an object elsewhere (FULL address). NotFound if the object is missing."""
        if entry.address_type == AddressType.FULL or "://" in entry.address:
            return
        self._store.sync_object(entry.address)

    def upload(
        self,
        branch: str,
        path: str | bytes,
        source: UploadSource,
        content_type: str = "",
        metadata: dict[str, str] | None = None,
        adopt: bool = False,
        etag: str | None = None,
    ) -> Entry:
        """Upload (see :meth:`put_object`), then stage the entry at ``path`` on ``branch``.
        Returns the staged entry."""
        p = as_path(path)
        with self._env.read() as txn:
            self._core.branch_txn(txn, branch)  # fail before uploading
        entry = self.put_object(source, content_type, metadata, adopt, etag)
        self.stage(branch, p, entry)
        return entry

    def physical_address(self, entry: Entry) -> str:
        """Where an entry's object is: its URI (FULL), or the namespace URI joined with its address."""
        if entry.address_type == AddressType.FULL or "://" in entry.address:
            return entry.address
        return StorageURI.parse(self.storage_namespace).object_uri(entry.address)

    def read_entry(self, entry: Entry, offset: int = 0, length: int | None = None) -> bytes:
        """The bytes of an entry's object (RELATIVE: in the namespace; FULL: the URI),
        never other bytes than the entry describes: a whole read is checked by size
        and MD5 etag, a part by the object's size; ``CorruptedData`` otherwise
        (:class:`graveler.objects.EntryReader`)."""
        return self._entries.read(entry, offset, length)

    def iter_entry(self, entry: Entry, chunk: int = 8 << 20) -> Iterator[bytes]:
        """An entry's whole object in chunks: the size checked with every chunk, the
        MD5 etag before the last one is handed out (``CorruptedData``)."""
        return self._entries.iter(entry, chunk)

    def read(self, ref: str, path: str | bytes, offset: int = 0, length: int | None = None) -> bytes:
        """The content of ``path`` on ``ref`` (or ``length`` bytes from ``offset``)."""
        return self.read_entry(self.get(ref, path), offset, length)

    # ------------------------------------------------------------------ history and diff

    def log(self, ref: str, amount: int | None = None, first_parent: bool = True) -> Iterator[Commit]:
        """Commits from ``ref`` back, newest first: first parents only (default), or
        the whole history ordered by generation."""
        rr = self.resolve(ref)
        return self._refs.log(rr.commit_id, first_parent=first_parent, amount=amount)

    def find_merge_base(self, left: str, right: str) -> Commit | None:
        """A best common ancestor of the commits two refs point at (None: unrelated)."""
        return self._refs.find_merge_base(self.resolve(left).commit_id, self.resolve(right).commit_id)

    def diff(self, left: str, right: str) -> Iterator[DiffRecord]:
        """Committed differences between two refs (branches as their heads), in key
        order: ADDED = only in right, REMOVED = only in left."""
        _, lc = self._core.resolve_commit(left)
        _, rc = self._core.resolve_commit(right)
        return self._committed.diff(lc.meta_range_id, rc.meta_range_id)

    def diff_since_base(self, left: str, right: str) -> Iterator[DiffRecord] | None:
        """What ``right`` changed since its merge base with ``left`` (git's ``left...right``), against
        the base a merge of the two takes -- with several best common ancestors (criss-cross
        histories) the same virtual base -- so this preview and the merge agree; None when the two
        share no ancestor."""
        _, lc = self._core.resolve_commit(left)
        _, rc = self._core.resolve_commit(right)
        base = self._commits.merge_base_tree(lc.id, rc.id)
        return None if base is None else self._committed.diff(base, rc.meta_range_id)

    def diff_uncommitted(self, branch: str, prefix: bytes = b"") -> Iterator[DiffRecord]:
        """The uncommitted changes of ``branch`` (staging vs its head; of keys under ``prefix``),
        in key order; left = committed value, right = staged value. Staged no-ops are skipped."""
        return self._core.diff_uncommitted(branch, prefix)

    def has_uncommitted(self, branch: str) -> bool:
        """True if ``branch`` has staged changes that differ from its head."""
        return self._core.has_uncommitted(branch)

    # ------------------------------------------------------------------ commit, merge, revert

    def commit(
        self,
        branch: str,
        message: str,
        committer: str | None = None,
        metadata: dict[str, str] | None = None,
        allow_empty: bool = False,
        date: datetime | None = None,
    ) -> Commit:
        """Commit the staged changes of ``branch``.

        Seals the staging token (later writes go to the next commit), makes the objects
        of the store durable (:meth:`ObjectStore.sync`: what ``put_object(durable=False)``
        left in the page cache, from any process), applies the sealed changes to the
        head's metarange, writes the commit and moves the branch by compare-and-set
        (a durable KV write: every earlier staging write is durable with it), retrying
        on a lost race. NothingToCommit when
        there are no changes and not ``allow_empty``; PreconditionFailed when the
        branch kept moving (the sealed changes stay staged and readable).
        """
        return self._commits.commit(branch, message, committer, metadata, allow_empty, date)

    def merge(
        self,
        source: str,
        dest_branch: str,
        strategy: MergeStrategy | str = MergeStrategy.NONE,
        message: str | None = None,
        committer: str | None = None,
        metadata: dict[str, str] | None = None,
        allow_empty: bool = False,
    ) -> Commit:
        """Three-way merge of the commit ``source`` resolves to into ``dest_branch``.

        The merge base is found through parents (lakeFS's generation walk). Always
        makes a merge commit with parents [dest head, source] and lakeFS's
        ``.lakefs.merge.strategy`` metadata. A source branch contributes its head
        (not its staging). DirtyBranch if the destination has uncommitted changes;
        MergeConflict (with ``keys`` and ``count``) unless the strategy decides;
        NothingToCommit if the source has no changes since the merge base and not
        ``allow_empty``.
        """
        return self._commits.merge(source, dest_branch, strategy, message, committer, metadata, allow_empty)

    def revert(
        self,
        branch: str,
        ref: str,
        parent_number: int = 0,
        message: str | None = None,
        committer: str | None = None,
        metadata: dict[str, str] | None = None,
        allow_empty: bool = False,
    ) -> Commit:
        """Commit on ``branch`` the inverse of the changes that commit ``ref`` made
        relative to its parent (``parent_number``, 1-based, is required for a merge
        commit). lakeFS's way: merge the parent into the branch with the commit as
        the base. MergeConflict if later changes touched the same paths;
        NothingToCommit if nothing would change; DirtyBranch if uncommitted changes."""
        return self._commits.revert(branch, ref, parent_number, message, committer, metadata, allow_empty)

    def commit_metarange(
        self,
        branch: str,
        metarange_id: str,
        message: str,
        committer: str | None = None,
        metadata: dict[str, str] | None = None,
        expected_head: str | None = None,
    ) -> Commit:
        """Adopt an existing metarange of the namespace (e.g. one lakeFS wrote) as a
        new commit on ``branch`` (parent: its head). The branch must be clean; with
        ``expected_head``, its head must be that commit (else PreconditionFailed): a tree
        computed from that head is never committed over a newer one."""
        return self._commits.commit_metarange(branch, metarange_id, message, committer, metadata, expected_head)

    # ------------------------------------------------------------------ caches

    def change_stamp(self, branch: str) -> int:
        """A counter that changes (in the same LMDB transaction) with every staging write,
        commit, head move, creation and deletion of ``branch``: a reader that cached what
        the branch showed at one stamp knows it is still valid while the stamp is equal.
        0 for a name that never was a branch. One short read transaction."""
        return self._core.change_stamp(branch)

    def view(self, ref: str) -> View:
        """A pinned read handle on ``ref`` (resolved once): see :class:`graveler.view.View`.
        NotFound / InvalidArgument for a ref that does not resolve."""
        return View(self._core, self._entries, ref)

    def list_ranges(self, ref: str) -> list[RangeInfo]:
        """The ranges of the commit ``ref`` points at (ID, key span, size), in key order."""
        _, commit = self._core.resolve_commit(ref)
        return self._committed.list_ranges(commit.meta_range_id)

    def write_metarange(self, records: Iterable[tuple[bytes, Value]]) -> str:
        """Write a tree of (path, value) records, in path order, to the namespace as
        ranges and a metarange; return the metarange ID (commit it with
        :meth:`commit_metarange`)."""
        return self._committed.write_metarange(records)

    def check_store(self) -> None:
        """Reach the storage namespace once (one listing request): StoreUnavailable if it
        does not answer, whatever is cached locally."""
        next(iter(self._store.list("_lakefs/")), None)

    def cache_stats(self) -> dict:
        """Counters of the committed layer's caches: ``tables_read`` (table files fetched),
        ``block_cache`` hits / misses, and ``table_disk_cache`` (the disk tier's, if any)."""
        cm = self._committed
        out = {"tables_read": cm.tables_read,
               "block_cache": {"hits": cm.block_cache.hits, "misses": cm.block_cache.misses}}
        src_stats = getattr(cm.source, "stats", None)
        if src_stats is not None:
            out["table_disk_cache"] = src_stats.snapshot()
        return out

    # ------------------------------------------------------------------ refs dump

    def dump_refs(self) -> dict[str, str]:
        """Write commits, tags and branches as metaranges in the namespace plus the
        manifest ``_lakefs/refs_manifest.json`` (lakeFS's refs-dump form); return the
        manifest."""
        return dump_refs(self._refs, self._committed, self._store)

    def fsck(self, objects: str = "none", progress=None):
        """Check every record and table of the repository, and on request every object
        (:func:`graveler.fsck.fsck`): a :class:`graveler.fsck.FsckReport`; nothing is changed."""
        from graveler.fsck import fsck

        return fsck(self._refs, self._store, self._entries, self._staging.stream, objects, progress)

    def restore_refs(self, manifest: dict[str, str] | None = None) -> None:
        """Load a refs dump (default: the namespace's ``_lakefs/refs_manifest.json``)
        into this repository, which must have no commits yet (create it bare)."""
        restore_refs(self._refs, self._committed, self._store, manifest)
        from graveler import claims

        claims.after_restore(self)


__all__ = ["ListItem", "Repository"]
