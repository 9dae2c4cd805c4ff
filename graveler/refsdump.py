"""Refs dump and restore in lakeFS's form (``DumpRefs`` / ``RestoreRefs``).

A dump writes three metaranges into the storage namespace through the
committed manager, one record per ref, in key order:

* commits:  key = commit ID, value identity = commit ID, data = ``CommitData``
* branches: key = branch name, identity = its commit ID, data = ``BranchData``
  (ID and commit ID only: staging is not part of a dump)
* tags:     key = tag name, identity = its commit ID, data = ``TagData``

each with the metadata lakeFS puts on them (``entity``, ``schema_name``,
``schema_definition``), and then the manifest ``_lakefs/refs_manifest.json``::

    {"branches_meta_range_id": "...", "commits_meta_range_id": "...", "tags_meta_range_id": "..."}

Restoring loads commits (each ID is recomputed and must match: lakeFS's
integrity check), then branches (with fresh staging tokens), then tags, into a
repository that has no commits yet (one created with ``bare=True``).
"""

from __future__ import annotations

import json
import logging
import re
from google.protobuf import descriptor_pb2, json_format

from graveler.errors import Conflict, CorruptedData, InvalidArgument, NotFound
from graveler.model import Value
from graveler.proto import graveler_pb2
from graveler.committed.manager import CommittedManager
from graveler.refs import Branch, Commit, RefManager, new_staging_token
from graveler.refs.names import validate_branch_name, validate_lakefs_tag_name

log = logging.getLogger(__name__)

MANIFEST_KEY = "_lakefs/refs_manifest.json"

ENTITY_TYPE_KEY = "entity"
ENTITY_SCHEMA_KEY = "schema_name"
ENTITY_SCHEMA_DEFINITION_KEY = "schema_definition"
ENTITIES = {
    "commit": ("io.treeverse.lakefs.graveler.CommitData", graveler_pb2.CommitData),
    "branch": ("io.treeverse.lakefs.graveler.BranchData", graveler_pb2.BranchData),
    "tag": ("io.treeverse.lakefs.graveler.TagData", graveler_pb2.TagData),
}


def _schema_definition(msg_cls) -> str:
    """protojson of the message's DescriptorProto, named as in lakeFS's package."""
    d = descriptor_pb2.DescriptorProto()
    msg_cls.DESCRIPTOR.CopyToProto(d)
    text = json.dumps(json.loads(json_format.MessageToJson(d, indent=None)), separators=(",", ":"))
    return text.replace(".lakefuse.graveler.", ".io.treeverse.lakefs.graveler.")


def _metadata(entity: str) -> dict[str, str]:
    schema, cls = ENTITIES[entity]
    return {
        ENTITY_TYPE_KEY: entity,
        ENTITY_SCHEMA_KEY: schema,
        ENTITY_SCHEMA_DEFINITION_KEY: _schema_definition(cls),
    }


def dump_refs(refs: RefManager, committed: CommittedManager, store) -> dict[str, str]:
    """Dump the refs of ``refs`` as metaranges through ``committed`` and the manifest into ``store``."""
    name = refs.get_repository().name
    commits = sorted(refs.list_commits(), key=lambda c: c.id)
    by_id = {c.id: c for c in commits}
    heads = [(f"branch {b.name}", b.commit_id) for b in refs.list_branches()]
    heads += [(f"tag {t.name}", t.commit_id) for t in refs.list_tags()]
    for what, cid in heads:  # a dump of trees the namespace lost would be no backup (found by a DR tour)
        c = by_id.get(cid)
        mr = c.meta_range_id if c is not None else None
        try:
            if mr is None:
                raise NotFound(f"commit {cid} not found")
            committed.list_ranges(mr)
        except NotFound as e:
            raise CorruptedData(f"{name}: refs not dumped: the tree of {what} is not in the namespace "
                                f"({e}): a dump of it would restore nothing readable") from None
    commit_records = [(c.id.encode(), Value(c.id.encode(), c.to_bytes())) for c in commits]
    branch_records = [
        (
            b.name.encode(),
            Value(
                b.commit_id.encode(),
                graveler_pb2.BranchData(id=b.name, commit_id=b.commit_id).SerializeToString(deterministic=True),
            ),
        )
        for b in refs.list_branches()
    ]
    tag_records = [
        (
            t.name.encode(),
            Value(t.commit_id.encode(), graveler_pb2.TagData(id=t.name, commit_id=t.commit_id).SerializeToString(deterministic=True)),
        )
        for t in refs.list_tags()
    ]
    cm = committed
    manifest = {
        "branches_meta_range_id": cm.write_metarange(branch_records, _metadata("branch")),
        "commits_meta_range_id": cm.write_metarange(commit_records, _metadata("commit")),
        "tags_meta_range_id": cm.write_metarange(tag_records, _metadata("tag")),
    }
    store.put(MANIFEST_KEY, json.dumps(manifest, indent=2, sort_keys=True).encode())
    log.info(
        "%s: dumped refs (%d commits, %d branches, %d tags)", name, len(commit_records), len(branch_records), len(tag_records)
    )
    return manifest


MANIFEST_FIELDS = ("branches_meta_range_id", "commits_meta_range_id", "tags_meta_range_id")
_TABLE_ID = re.compile(r"[0-9a-f]{64}\Z")


def parse_manifest(raw: bytes | str, where: str) -> dict[str, str]:
    """A refs manifest from its JSON text: an object with the three metarange IDs (64 hex
    digits, or "" for an empty list). ``InvalidArgument`` naming ``where`` otherwise --
    also for JSON nested too deep to parse (RecursionError)."""
    try:
        m = json.loads(raw)
    except (ValueError, RecursionError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else f"not JSON: {e}"
        raise InvalidArgument(f"{where} is not a refs manifest ({reason})") from None
    if not isinstance(m, dict):
        raise InvalidArgument(f"{where} is not a refs manifest (a JSON {type(m).__name__}, not an object)")
    out = {}
    for k in MANIFEST_FIELDS:
        v = m.get(k)
        if not isinstance(v, str) or not (v == "" or _TABLE_ID.match(v)):
            what = "missing" if v is None else f"{v!r} is not a metarange ID (64 hex digits)"
            raise InvalidArgument(f"{where} is not a refs manifest: {k} {what}")
        out[k] = v
    return out


def read_manifest(store) -> dict[str, str]:
    """The refs manifest of the namespace ``store`` is rooted at (a bad one is CorruptedData)."""
    return read_dump_manifest(store)[0]


# Fields a manifest may carry besides lakeFS's three (lakeFS ignores unknown fields);
# ``lakefuse refs dump`` writes lakeFS's form exactly, so these come from other writers.
MANIFEST_HINTS = ("repository",)


def read_dump_manifest(store) -> tuple[dict[str, str], dict[str, str]]:
    """(the refs manifest, its optional hints) of the namespace ``store`` is rooted at:
    NotFound when there is no dump, CorruptedData for a bad manifest. A hint is kept only
    when it is a string (the caller validates it)."""
    try:
        raw = store.get(MANIFEST_KEY)
    except NotFound:
        raise NotFound(f"no refs dump in {store.uri} ({MANIFEST_KEY} missing)") from None
    try:
        manifest = parse_manifest(raw, MANIFEST_KEY)
    except InvalidArgument as e:
        raise CorruptedData(f"malformed refs manifest ({e})", store.full_uri(MANIFEST_KEY)) from None
    doc = json.loads(raw)
    hints = {k: doc[k] for k in MANIFEST_HINTS if isinstance(doc.get(k), str)}
    return manifest, hints


def _parse(cls, raw: bytes, what: str):
    pb = cls()
    try:
        pb.ParseFromString(raw)
    except Exception as e:
        raise CorruptedData(f"malformed {what} record in refs dump ({e})") from None
    return pb


def _check_ref_record(what: str, key: bytes, name: str, validate) -> None:
    """A branch or tag record of a dump: keyed by its own name (a record under another key would
    silently stand for it), a name the refs may hold. CorruptedData: the dump is not one lakeFS
    or lakefuse writes."""
    if key != name.encode("utf-8"):
        raise CorruptedData(f"refs dump: a {what} record keyed {key.decode('utf-8', 'replace')!r} "
                            f"names {what} {name!r}")
    try:
        validate(name)
    except InvalidArgument as e:
        raise CorruptedData(f"refs dump: {e}") from None


def _check_closed(commits: list[Commit], branches: list[Branch], tags: list[tuple[str, str]]) -> None:
    """Every commit a commit, branch or tag of the dump names is in it (the history whole): else
    the dump is incomplete (CorruptedData), not a repository whose log fails later."""
    ids = {c.id for c in commits}
    for c in commits:
        for p in c.parents:
            if p not in ids:
                raise CorruptedData(f"refs dump is incomplete: commit {c.id} names parent {p}, which it does not hold")
    for what, name, cid in [("branch", b.name, b.commit_id) for b in branches] + [("tag", t, cid) for t, cid in tags]:
        if cid not in ids:
            raise CorruptedData(f"refs dump is incomplete: {what} {name!r} names commit {cid}, which it does not hold")


def restore_refs(refs: RefManager, committed: CommittedManager, store, manifest: dict[str, str] | None = None) -> None:
    """Load a refs dump (``manifest``, default: the one in ``store``) into the bare repository of ``refs``."""
    name = refs.get_repository().name
    if manifest is None:
        manifest = read_manifest(store)
    if refs.count_commits() or refs.list_branches():
        raise Conflict(f"repository {name!r} is not bare: refs can only be restored into an empty repository")
    for k in MANIFEST_FIELDS:
        mr = manifest.get(k)
        if not isinstance(mr, str) or not (mr == "" or _TABLE_ID.match(mr)):
            raise InvalidArgument(f"refs manifest: {k} {mr!r} is not a metarange ID (64 hex digits)")
        try:
            committed.list_ranges(mr)
        except NotFound:
            raise CorruptedData(f"refs dump is incomplete: its {k} {mr} is not in the namespace") from None
    cm = committed

    commits: list[Commit] = []
    for key, v in cm.iterator(manifest["commits_meta_range_id"]):
        pb = _parse(graveler_pb2.CommitData, v.data, "commit")
        if pb.generation == 0:
            raise InvalidArgument(f"commit {pb.id} has no generation (dumps from lakeFS before v0.61 are not supported)")
        c = Commit.from_proto(pb)
        computed = c.computed_id()
        if computed != c.id or key.decode() != c.id:
            raise CorruptedData(f"commit ID does not match its content: {c.id} (computed {computed})")
        commits.append(c)
    branches = []
    for key, v in cm.iterator(manifest["branches_meta_range_id"]):
        pb = _parse(graveler_pb2.BranchData, v.data, "branch")
        _check_ref_record("branch", key, pb.id, validate_branch_name)
        branches.append(Branch(pb.id, pb.commit_id, new_staging_token(), ()))
    tags = []
    for key, v in cm.iterator(manifest["tags_meta_range_id"]):
        pb = _parse(graveler_pb2.TagData, v.data, "tag")
        _check_ref_record("tag", key, pb.id, validate_lakefs_tag_name)
        tags.append((pb.id, pb.commit_id))
    _check_closed(commits, branches, tags)
    trees = {c.id: c.meta_range_id for c in commits}
    for what, cid in [(f"branch {b.name}", b.commit_id) for b in branches] + [(f"tag {t}", c) for t, c in tags]:
        try:  # (the heads' trees: a namespace moved away keeps the dump's tables, not them)
            cm.list_ranges(trees[cid])
        except NotFound:
            raise CorruptedData(f"refs dump is incomplete: the tree of {what} ({trees[cid]}) is not in the "
                                f"namespace") from None

    def fn(txn):
        for c in commits:
            refs.put_commit_txn(txn, c)
        for b in branches:
            refs.get_commit_txn(txn, b.commit_id)
            refs.put_branch_txn(txn, b)
            refs.new_birth_txn(txn, b.name)
        for tag, cid in tags:
            refs.create_tag_txn(txn, tag, cid, restored=True)

    refs.env.write(fn)
    log.info("%s: restored %d commits, %d branches, %d tags", name, len(commits), len(branches), len(tags))
