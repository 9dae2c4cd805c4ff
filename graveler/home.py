"""``Graveler``, the lakefuse home: where repositories live; create, open, list, delete them.

Layout under the home::

    <home>/repos/<name>/refs.lmdb/     the repository's refs + staging, on the embedded LMDB backend
                                       (the KV backend is ``config.kv.url``: see :mod:`graveler.kv`)
    <home>/cache/                      the disk tier of range/metarange files of remote namespaces
    <home>/table-memo/                 which table files were checked against their IDs (graveler.cache.CheckMemo)

The home is ``--home`` (passed in), else ``$LAKEFUSE_HOME``, else
``~/.local/share/lakefuse`` (:func:`graveler.config.resolve_home` decides).
The committed data (ranges, metaranges, objects) lives in the repository's
storage namespace, not in the home. One repository's operations are
:class:`graveler.repository.Repository`.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from graveler import claims
from graveler.cache import ImmutableCache, shared_memo
from graveler.committed.manager import CommittedManager, StoreSource, verify_table
from graveler.config import HOME_ENV, GravelerConfig, resolve_home  # noqa: F401 (re-exported)
from graveler.errors import AlreadyExists, CorruptedData, GravelerError, InvalidArgument, NotFound
from graveler.kv import open_backend
from graveler.objstore import LocalStore, StorageURI, open_store
from graveler.objstore.uri import place
from graveler.refs import (
    INITIAL_COMMIT_MESSAGE,
    Branch,
    Commit,
    RefManager,
    RepositoryRecord,
    new_staging_token,
    validate_branch_name,
    validate_repository_name,
)
from graveler.refsdump import MANIFEST_KEY, read_dump_manifest, restore_refs
from graveler.repository import Repository

log = logging.getLogger(__name__)

CACHE_DIR = "cache"
MEMO_DIR = "table-memo"


StoreFactory = Callable[[str], object]
CommittedFactory = Callable[[object, GravelerConfig], CommittedManager]


def default_committed_factory(store, config: GravelerConfig) -> CommittedManager:
    """A local namespace is read in place; a remote one through the disk tier under ``<home>/cache``.

    One cache directory serves every repository of the home (entries are keyed by full URI)
    and every process using it (diskcache is multi-process safe); files are verified on fill.
    """
    memo = shared_memo(str(Path(config.home) / MEMO_DIR), config.cache.memo_bytes)
    if isinstance(store, LocalStore):
        source = StoreSource(store)
    else:
        disk_dir = config.cache.disk_dir or str(Path(config.home) / CACHE_DIR)
        source = ImmutableCache(store, disk_dir, max_bytes=config.cache.disk_bytes,
                                verify=verify_table, memo=memo)
    return CommittedManager(source, config.range_params, cache=config.cache, memo=memo)


def _valid_repository_name(name: str) -> bool:
    try:
        validate_repository_name(name)
    except InvalidArgument:
        return False
    return True



class Graveler:
    """The lakefuse home: create, open, list and delete repositories.

    ``store_factory(uri)`` opens the object store of a storage namespace (default
    :func:`graveler.objstore.open_store` with ``config.store``); ``committed_factory(store, config)``
    builds its CommittedManager (default: uncached, straight from the store).
    """

    def __init__(
        self,
        config: GravelerConfig | None = None,
        store_factory: StoreFactory | None = None,
        committed_factory: CommittedFactory | None = None,
    ):
        self.config = config or GravelerConfig()
        self.store_factory = store_factory or (lambda uri: open_store(uri, self.config.store))
        self.committed_factory = committed_factory or default_committed_factory
        self.kv = open_backend(self.config.kv, Path(self.config.home))
        self._lock = threading.Lock()
        self._repos: dict[str, Repository] = {}

    def create_repository(
        self,
        name: str,
        storage_namespace: str,
        default_branch: str = "main",
        committer: str | None = None,
        bare: bool = False,
    ) -> "Repository":
        """Create a repository and its initial commit "Repository created" (empty
        metarange, generation 1) on ``default_branch``. ``bare=True`` creates no
        commit and no branch (for :meth:`Repository.restore_refs`)."""
        validate_repository_name(name)
        validate_branch_name(default_branch)
        try:
            storage_namespace = str(StorageURI.parse(storage_namespace))  # canonical
        except InvalidArgument:
            raise InvalidArgument(f"storage namespace must be file:///PATH, an absolute path or s3://BUCKET[/PREFIX], "
                                  f"not {storage_namespace!r}") from None
        if self.kv.exists(name) and not self._record_missing(name):  # (a create that never finished: made over)
            raise AlreadyExists(f"repository {name!r} already exists")
        if not bare:  # (a bare one receives a refs dump: lakeFS restores into a namespace in use too)
            self.check_namespace_free(storage_namespace)
        store = self.store_factory(storage_namespace)
        store.check_namespace()  # a namespace that cannot work fails here, not at the first upload
        committed = self.committed_factory(store, self.config)
        empty = committed.empty_metarange()
        env = self.kv.open(name)
        refs = RefManager(env)
        now = datetime.now(timezone.utc)
        rec = RepositoryRecord(name, storage_namespace, default_branch, now)
        initial = Commit.create(committer or self.config.committer, INITIAL_COMMIT_MESSAGE, empty, (), 1, {}, now)

        def fn(txn):
            refs.put_repository_txn(txn, rec)
            if not bare:
                refs.put_commit_txn(txn, initial)
                refs.put_branch_txn(txn, Branch(default_branch, initial.id, new_staging_token(), ()))
                refs.new_birth_txn(txn, default_branch)  # (so an opening of a repository deleted since tells them apart)

        env.write(fn)
        log.info("created repository %s at %s", name, storage_namespace)
        repo = Repository(self.config, env, rec, store, committed, self.store_factory, self._forget)
        with self._lock:
            self._repos[name] = repo
        if not bare:  # (a restore claims once its refs are in: Repository.restore_refs)
            _claim(repo)
        return repo

    def repository(self, name: str) -> "Repository":
        """Open an existing repository (NotFound if there is none)."""
        with self._lock:
            repo = self._repos.get(name)
        if repo is not None:
            return repo
        validate_repository_name(name)
        if not self.kv.exists(name):
            raise NotFound(f"repository {name!r} not found")
        env = self.kv.open(name, create=False)
        rec = RefManager(env).get_repository()
        store = self.store_factory(rec.storage_namespace)
        committed = self.committed_factory(store, self.config)
        repo = Repository(self.config, env, rec, store, committed, self.store_factory, self._forget)
        with self._lock:
            return self._repos.setdefault(name, repo)

    def has_repository(self, name: str) -> bool:
        """Whether the home holds a repository ``name`` (its refs database exists)."""
        validate_repository_name(name)
        return self.kv.exists(name)

    def unfinished(self, name: str) -> bool:
        """Whether ``name``'s refs database exists without a repository record: a create that
        never finished (killed before its record's transaction). :meth:`create_repository`
        makes it over again; :meth:`delete_repository` removes it; no other call sees it."""
        validate_repository_name(name)
        if not self.kv.exists(name):
            return False
        try:
            return self._record_missing(name)
        except GravelerError:  # (damaged, unreadable: a repository all the same, as repo list says)
            return False

    def _record_missing(self, name: str) -> bool:
        """Whether the existing refs database of ``name`` has no repository record (raises what
        reading it raises: a damaged one is CorruptedData)."""
        try:
            with self.kv.borrowed(name) as env:
                RefManager(env).get_repository()
        except NotFound:
            return True
        return False

    def has_refs_dump(self, storage_namespace: str) -> bool:
        """Whether a storage namespace holds a refs dump (``_lakefs/refs_manifest.json``)."""
        return self.store_factory(str(StorageURI.parse(storage_namespace))).exists(MANIFEST_KEY)

    def open_refs_dump(self, storage_namespace: str, name: str | None = None) -> "Repository":
        """A repository from the refs dump in ``storage_namespace`` alone (see
        :mod:`graveler.refsdump`): its commits, tags and branches as of the dump are loaded
        into this home's KV backend -- meant to be an in-memory one (``memory://NAME``), so
        that no refs database is needed or written -- and nothing is written to the
        namespace (no probe object: read-only credentials are enough). Staging is empty.

        The name is ``name``, else the manifest's ``repository`` field when it is a valid
        name, else the namespace's last path element (the bucket of a bare ``s3://bucket``).
        The default branch is ``main`` if the dump has it, else its first branch by name.
        NotFound: no dump there; CorruptedData: a bad manifest, a missing metarange or
        range, a commit whose ID does not match its content, a dump without branches;
        InvalidArgument: a bad URI or name; AlreadyExists: the KV holds that name already.
        On any failure the KV is left as it was."""
        try:
            uri = StorageURI.parse(storage_namespace)
        except InvalidArgument:
            raise InvalidArgument(f"a refs dump location must be file:///... or s3://bucket/prefix, "
                                  f"not {storage_namespace!r}") from None
        ns = str(uri)
        store = self.store_factory(ns)
        manifest, hints = read_dump_manifest(store)
        if name is None:
            name = hints.get("repository")
            if name is None or not _valid_repository_name(name):
                name = (uri.path.rstrip("/").rsplit("/", 1)[-1] if uri.path.strip("/") else uri.bucket) or "/"
                if not _valid_repository_name(name):
                    raise InvalidArgument(f"the last path element of {ns}, {name!r}, is not a repository name "
                                          "(3-63 characters a-z, 0-9 and '-'): give a name")
        validate_repository_name(name)
        if self.kv.exists(name):
            raise AlreadyExists(f"repository {name!r} already exists")
        committed = self.committed_factory(store, self.config)
        env = self.kv.open(name)
        refs = RefManager(env)
        now = datetime.now(timezone.utc)
        try:
            env.write(lambda txn: refs.put_repository_txn(txn, RepositoryRecord(name, ns, "main", now)))
            try:
                restore_refs(refs, committed, store, manifest)
            except NotFound as e:  # a range or metarange the manifest leads to is gone
                raise CorruptedData(f"refs dump in {ns} is incomplete: {e}") from None
            branches = sorted(b.name for b in refs.list_branches())
            if not branches:
                raise CorruptedData(f"refs dump in {ns} has no branch")
            rec = RepositoryRecord(name, ns, "main" if "main" in branches else branches[0], now)
            env.write(lambda txn: refs.put_repository_txn(txn, rec, overwrite=True))
        except BaseException:
            self.kv.remove(name)
            raise
        log.info("opened repository %s from the refs dump in %s", name, ns)
        repo = Repository(self.config, env, rec, store, committed, self.store_factory, self._forget)
        with self._lock:
            self._repos[name] = repo
        return repo

    def check_namespace_free(self, storage_namespace: str) -> None:
        """AlreadyExists if a repository of this KV keeps its data in ``storage_namespace``, or in a
        namespace inside it or around it (as lakeFS refuses a namespace in use): two repositories
        sharing ``_lakefs/`` and ``data/`` would each collect the other's objects as garbage."""
        for rec, how in self._namespaces_at(storage_namespace):
            raise AlreadyExists(f"storage namespace {storage_namespace} {how} the namespace of repository "
                                f"{rec.name!r} ({rec.storage_namespace}): each repository needs its own")

    def check_import_source(self, source: str) -> None:
        """InvalidArgument if ``source`` (an import's) is a repository's storage namespace, inside one or
        holds one: the objects imported stay where they are, and that repository's garbage collection
        deletes every one of them it does not name itself."""
        for rec, how in self._namespaces_at(source):
            raise InvalidArgument(f"import source {source} {how} the storage namespace of repository {rec.name!r} "
                                  f"({rec.storage_namespace}): its garbage collection would delete the imported "
                                  "objects; import from outside every repository's namespace")

    def _namespaces_at(self, uri: str):
        """(record, "is" / "overlaps") of each repository whose namespace is ``uri``, in it or around it."""
        mine = place(uri)
        for rec in self.list_repositories(damaged=[]):
            theirs = place(rec.storage_namespace)
            if mine.startswith(theirs) or theirs.startswith(mine):
                yield rec, "is" if mine == theirs else "overlaps"

    def list_repositories(self, damaged: list[tuple[str, GravelerError]] | None = None) -> list[RepositoryRecord]:
        """Every repository in the home, by name (environments not open already are
        opened only for the look).

        A repository whose refs database cannot be read (damaged, unreadable) raises,
        unless ``damaged`` is a list: then ``(name, error)`` is appended to it and
        the others are still listed -- one damaged repository never hides the rest.
        """
        out = []
        for name in self.kv.names():
            try:
                with self.kv.borrowed(name) as env:
                    try:
                        out.append(RefManager(env).get_repository())
                    except NotFound:
                        continue  # a store without a record: a create that never finished
            except GravelerError as e:
                if damaged is None:
                    raise
                if not isinstance(e, CorruptedData):
                    log.debug("repository %s cannot be read: %s", name, e)
                damaged.append((name, e))
        return out

    def delete_repository(self, name: str) -> None:
        """Forget a repository: its refs and staging, and its claim on its storage namespace
        (:mod:`graveler.claims`). The storage namespace is left as it is otherwise."""
        validate_repository_name(name)
        if not self.kv.exists(name):
            raise NotFound(f"repository {name!r} not found")
        try:
            claims.drop_own(self.repository(name))
        except GravelerError:  # (a damaged or unfinished one: removed all the same; its claim, if any, stays)
            pass
        with self._lock:
            self._repos.pop(name, None)
        self.kv.remove(name)
        log.info("deleted repository %s", name)

    def _forget(self, name: str) -> None:
        """A repository was closed: drop it and close its KV store in this process."""
        with self._lock:
            self._repos.pop(name, None)
        self.kv.close(name)

    def close(self) -> None:
        with self._lock:
            repos = list(self._repos.values())
            self._repos.clear()
        for r in repos:
            self.kv.close(r.name)


def _claim(repo: "Repository") -> None:
    """Put ``repo``'s claim in its namespace (:mod:`graveler.claims`); a store that refuses it now
    only delays it to the repository's first gc."""
    try:
        claims.own_claim(repo)
    except GravelerError as e:
        log.warning("%s: could not claim %s yet (%s): its first gc will", repo.name, repo.storage_namespace, e)

