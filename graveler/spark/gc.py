"""Garbage collection of a storage namespace's ``data/`` objects, lakeFS's way, in two steps.

**Rules** (:class:`GCRules`) are kept in the namespace, in lakeFS's JSON form
(``default_retention_days`` and per-branch ``retention_days``), at
``_lakefs/retention/gc/rules.json``.  Without rules every commit is kept and only
objects that nothing references (uploads that were never committed or whose
staging was reset) are collected.

**Active commits** (:func:`active_commits`, on the driver, lakeFS's rules): from
every branch head, walking first parents, a commit is active if it is the head,
or if its child on that walk is newer than the branch's retention threshold (so
the newest commit at or before the threshold is active too); a commit reached
from several branches keeps the longest retention.  Commits that are no branch's
ancestor-by-first-parent and have no child (dangling) start a walk with the
default retention, as in lakeFS; tagged commits are always active (our choice:
a tag is a promise to be able to read that version).

**Mark** (:func:`mark`): live addresses = the entries of every range of every
active commit's metarange (one task per distinct range) + every staged address
of every branch; the namespace's ``data/`` is listed in parallel by its hourly
slices; candidates = listed objects older than the minimum age (default 24 h)
that no live address names.  The minimum age is what protects an object written but
not staged yet (a mount's upload before its staging, the mount's shared empty
object, which it uses for up to ten minutes): keep it well above those times.  FULL addresses outside the namespace are never
listed, so imported objects are never candidates.  Before the report is
written the refs are read again and the active commits found again: the live
set is extended with the trees of the commits active now that were not before
(a branch created or moved, a tag, a commit made during the run -- also one
another commit has followed since: the rules keep it) and every address staged now.  The
report is Parquet under ``_lakefs/retention/gc/<run_id>/deleted/`` plus
``summary.json`` written last; a dry run writes nothing and returns the
candidates.

**Sweep** (:func:`sweep`) deletes the objects of a complete report, after
finding the active commits once more (a commit active now that the mark did not
count -- made since, or an expired one a new branch made active again -- and
every address staged now keep their objects), with bulk
deletes and exponential backoff on failures, in parallel by report part.  On a
local namespace it also removes the temp files of writers killed mid-write that
were last written before the mark's cutoff (and at least an hour ago).  What the
sweep does not see: a branch created from an expired commit (or a reset to one)
*while its deletes run* -- as in lakeFS, do not bring expired commits back during a
sweep; the objects that branch needs may be gone.
"""

from __future__ import annotations

import io
import json
import logging
import os
import random
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from graveler.errors import CorruptedData, GravelerError, InvalidArgument, NotFound
from graveler import model
from graveler.model import AddressType, decode_value
from graveler.model import Entry as _Entry
from graveler.objects import DATA_PREFIX
from graveler.proto import catalog_pb2
from graveler.spark.tables import Namespace, fault_point, iter_range_records, read_metarange, worker_store

log = logging.getLogger(__name__)

GC_PREFIX = "_lakefs/retention/gc/"
RULES_KEY = GC_PREFIX + "rules.json"
DEFAULT_MIN_AGE = timedelta(hours=24)
MAX_RETENTION_DAYS = 100_000  # (a threshold "now - days" must stay a date: Python's end at year 1)
MAX_MIN_AGE = timedelta(days=MAX_RETENTION_DAYS)
REPORT_SCHEMA = "address string, size long, last_modified timestamp"
_ADDR_SCHEMA = "address string"
_LIVE_CHUNK = 65536  # entries decoded per call in a live-set task


# -- rules -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GCRules:
    default_retention_days: int
    branches: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        days = [self.default_retention_days, *self.branches.values()]
        if any(not isinstance(d, int) or not 0 <= d <= MAX_RETENTION_DAYS for d in days):
            raise InvalidArgument(f"retention days must be whole numbers from 0 to {MAX_RETENTION_DAYS:,} "
                                  "(about 270 years; a date further back than that no commit has)")

    def retention_days(self, branch: str) -> int:
        return self.branches.get(branch, self.default_retention_days)

    def to_json(self) -> str:
        return json.dumps({
            "default_retention_days": self.default_retention_days,
            "branches": [{"branch_id": b, "retention_days": d} for b, d in sorted(self.branches.items())],
        }, indent=2)

    @staticmethod
    def from_json(text: str | bytes) -> "GCRules":
        try:
            d = json.loads(text)
            branches = {str(b["branch_id"]): int(b["retention_days"]) for b in d.get("branches") or []}
            return GCRules(int(d["default_retention_days"]), branches)
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptedData(f"malformed GC rules ({e})", RULES_KEY) from None


def get_rules(repo) -> GCRules | None:
    try:
        return GCRules.from_json(repo.store.get(RULES_KEY))
    except NotFound:
        return None


def set_rules(repo, rules: GCRules) -> None:
    repo.store.put(RULES_KEY, rules.to_json().encode())


def delete_rules(repo) -> None:
    repo.store.delete(RULES_KEY)


# -- refs snapshot and active commits ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RefsSnapshot:
    branches: dict[str, str]  # name -> head commit ID
    tokens: dict[str, tuple[str, ...]]  # name -> staging tokens (current and sealed)
    tags: dict[str, str]

    def to_json(self) -> dict:
        return {"branches": self.branches, "tokens": {k: list(v) for k, v in self.tokens.items()}, "tags": self.tags}

    @staticmethod
    def from_json(d: dict) -> "RefsSnapshot":
        return RefsSnapshot(dict(d["branches"]), {k: tuple(v) for k, v in d["tokens"].items()}, dict(d["tags"]))


def snapshot_refs(repo) -> RefsSnapshot:
    branches = repo.list_branches()
    return RefsSnapshot({b.name: b.commit_id for b in branches}, {b.name: tuple(b.tokens) for b in branches},
                        {t.name: t.commit_id for t in repo.list_tags()})


def _main_parent(c) -> str | None:
    if not c.parents:
        return None
    return c.parents[0] if c.version >= 1 else c.parents[-1]  # lakeFS's CommitVersionParentSwitch


def active_commits(repo, rules: GCRules | None, now: datetime | None = None,
                   refs: RefsSnapshot | None = None) -> dict[str, str]:
    """commit ID -> metarange ID of every commit whose objects must be kept."""
    commits = {c.id: c for c in repo.list_commits()}
    refs = refs or snapshot_refs(repo)
    if rules is None:
        return {cid: c.meta_range_id for cid, c in commits.items()}
    now = now or datetime.now(timezone.utc)
    has_child = {p for c in commits.values() if (p := _main_parent(c))}
    heads = set(refs.branches.values())
    starts: list[tuple[str, str | None]] = sorted(refs.branches.items(), key=lambda kv: kv[1])
    starts = [(cid, name) for name, cid in starts]
    starts += [(cid, None) for cid in sorted(commits) if cid not in has_child and cid not in heads]
    active: set[str] = set(refs.tags.values()) & set(commits)
    processed: dict[str, datetime] = {}

    def get(cid: str):
        c = commits.get(cid)
        if c is None:  # committed after the listing: read it
            c = commits[cid] = repo.get_commit(cid)
        return c

    for cid, branch in starts:
        node = get(cid)
        days = rules.default_retention_days if branch is None else rules.retention_days(branch)
        threshold = now - timedelta(days=days)
        if branch is not None:
            active.add(cid)
            processed[cid] = threshold
            created, parent = node.creation_date, _main_parent(node)
        else:  # a dangling commit: walk from a hypothetical head just as old as it
            created, parent = node.creation_date, cid
        while parent:
            if created > threshold:  # its child on this walk is within the retention: it was a head then
                active.add(parent)
            prev = processed.get(parent)
            if prev is not None and prev <= threshold:
                break  # reached before with a longer (or equal) retention: that walk decides its ancestors
            node = get(parent)
            processed[parent] = threshold
            created, parent = node.creation_date, _main_parent(node)
    return {cid: commits[cid].meta_range_id for cid in active}


# -- live addresses ----------------------------------------------------------------------------------------------


def relative_address(ns_uri: str, address: str, address_type: AddressType) -> str | None:
    """The namespace key an entry's object lives at, or None when it is outside the namespace."""
    if address_type == AddressType.RELATIVE or (address_type == AddressType.BY_PREFIX_DEPRECATED
                                                and "://" not in address):
        return address
    root = ns_uri.rstrip("/") + "/"
    if address.startswith(root):
        return address[len(root):]
    return None


def _py_live_addresses(values: list[bytes], rid: str, ns_uri: str, pa):
    """The data/ namespace keys a block's entries reference, by protobuf (the reference)."""
    out = []
    pb = catalog_pb2.Entry()
    for raw in values:  # only the address is needed: no Entry objects
        try:
            pb.ParseFromString(decode_value(raw, rid).data)
        except Exception as e:  # protobuf's DecodeError
            raise CorruptedData(f"malformed catalog entry ({e})", rid) from None
        a = relative_address(ns_uri, pb.address, AddressType(pb.address_type)
                             if pb.address_type in (0, 1, 2) else AddressType.RELATIVE)
        if a is not None and a.startswith(DATA_PREFIX):
            out.append(a)
    return pa.array(out, pa.string())


def _c_live_addresses(values: list[bytes], rid: str, ns_uri: str, pa):
    """The same by the compiled decoder and Arrow compute (:func:`relative_address` over columns)."""
    import pyarrow.compute as pc

    (ao, ad, _eo, _ed, _io, _id, _lm, _valid, _nulls, _sizes, types, _md) = model.entry_columns(
        values, rid, int(AddressType.RELATIVE))
    n = len(values)
    addr = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(ao), pa.py_buffer(ad)])
    try:
        addr.validate(full=True)
    except pa.ArrowInvalid as e:
        raise CorruptedData(f"malformed catalog entry (invalid UTF-8: {e})", rid) from None
    t = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(types)])
    root = ns_uri.rstrip("/") + "/"
    is_rel = pc.or_(pc.equal(t, int(AddressType.RELATIVE)),
                    pc.and_(pc.equal(t, int(AddressType.BY_PREFIX_DEPRECATED)),
                            pc.invert(pc.match_substring(addr, "://"))))
    rel = pc.if_else(is_rel, addr, pc.utf8_slice_codeunits(addr, len(root)))
    keep = pc.and_(pc.or_(is_rel, pc.starts_with(addr, root)), pc.starts_with(rel, DATA_PREFIX))
    return rel.filter(keep)


def _live_task(ns: Namespace):
    import pyarrow as pa

    addresses_of = _py_live_addresses if model.entry_columns is None else _c_live_addresses

    def fn(batches):
        store = worker_store(ns)
        for b in batches:
            for rid in b.column(0).to_pylist():
                # Decoded in chunks of many data blocks: a block holds some tens of entries, and the fixed
                # cost of a decode call and its Arrow kernels per block would dominate the decoding itself.
                pending: list[bytes] = []
                for _, values in iter_range_records(store, rid):
                    pending.extend(values)
                    if len(pending) >= _LIVE_CHUNK:
                        yield pa.RecordBatch.from_arrays([addresses_of(pending, rid, ns.uri, pa)], names=["address"])
                        pending = []
                if pending:
                    yield pa.RecordBatch.from_arrays([addresses_of(pending, rid, ns.uri, pa)], names=["address"])
        fault_point("gc_live")

    return fn


def _ranges_of(store, metarange_ids) -> list[str]:
    seen: dict[str, None] = {}
    for mr in sorted(set(metarange_ids)):
        for r in read_metarange(store, mr):
            seen.setdefault(r.id, None)
    return list(seen)


def _staged_addresses(repo, ns_uri: str, tokens) -> list[str]:
    out = []
    for tok in sorted(set(tokens)):
        for _, v in repo.iter_staged(tok):
            if v is None:
                continue
            e = _Entry.from_value(v)
            a = relative_address(ns_uri, e.address, e.address_type)
            if a is not None and a.startswith(DATA_PREFIX):
                out.append(a)
    return out


def live_df(spark, ns: Namespace, metarange_ids):
    """Addresses (namespace keys under data/) that the given metaranges reference; and how many ranges."""
    from graveler.spark.entries import grouped_df

    rids = _ranges_of(ns.open(), metarange_ids)
    return grouped_df(spark, rids).mapInArrow(_live_task(ns), _ADDR_SCHEMA), len(rids)


def moved_since(spark, repo, ns: Namespace, known_active: set[str], known_mrs: set[str]):
    """What became live since the active commits ``known_active`` were found: the trees of the
    commits active now that were not then -- a branch created or moved, a tag, and every commit
    made meanwhile that the rules keep even once it is no head (a commit of what was staged,
    then another over it: its objects were neither staged nor a head's when the refs were read
    again) or that a new child made active again (a branch from an expired commit) -- plus
    every address staged now.  Returns (DataFrame or None when there is nothing, snapshot now,
    their metarange IDs)."""
    now = snapshot_refs(repo)
    active_now = active_commits(repo, get_rules(repo), datetime.now(timezone.utc), now)
    appeared = {cid: mr for cid, mr in active_now.items() if cid not in known_active}
    mrs = set(appeared.values()) - known_mrs
    if mrs:
        log.info("gc: %d commits became active since the refs were read: their objects are kept", len(appeared))
    tokens = {t for ts in now.tokens.values() for t in ts}
    addrs = _staged_addresses(repo, ns.uri, tokens)
    if not mrs and not addrs:
        return None, now, mrs
    staged = spark.createDataFrame([(a,) for a in addrs], _ADDR_SCHEMA)
    if mrs:
        committed, _ = live_df(spark, ns, mrs)
        return staged.unionByName(committed).hint("merge"), now, mrs
    from pyspark.sql import functions as F

    return F.broadcast(staged), now, mrs  # staging is small next to the tree: no shuffle of the candidates


# -- listing data/ -------------------------------------------------------------------------------------------------


def _slice_start(prefix: str) -> datetime | None:
    """The hour a ``data/YYYYMMDDHH/`` slice starts at (None for any other name)."""
    name = prefix[len(DATA_PREFIX):].rstrip("/")
    if len(name) != 10 or not name.isdigit():
        return None
    try:
        return datetime.strptime(name, "%Y%m%d%H").replace(tzinfo=timezone.utc)
    except ValueError:
        return None


def _list_task(ns: Namespace, cutoff_us: int):
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")

    def fn(batches):
        store = worker_store(ns)
        for b in batches:
            for prefix in b.column(0).to_pylist():
                objs = [o for o in store.list(prefix) if int(o.mtime * 1e6) < cutoff_us]
                for i in range(0, len(objs), 8192):
                    chunk = objs[i : i + 8192]
                    yield pa.RecordBatch.from_arrays(
                        [pa.array([o.key for o in chunk], pa.string()), pa.array([o.size for o in chunk], pa.int64()),
                         pa.array([int(o.mtime * 1e6) for o in chunk], pa.int64()).cast(ts)],
                        names=["address", "size", "last_modified"])
        fault_point("gc_list")

    return fn


def old_objects_df(spark, ns: Namespace, cutoff: datetime):
    """Objects under the namespace's data/ last modified before ``cutoff``, listed by hourly slice.
    A slice that starts after the cutoff holds only younger objects and is not listed."""
    store = ns.open()
    top, subs = store.list_level(DATA_PREFIX)
    slices = [p for p in subs if (s := _slice_start(p)) is None or s <= cutoff]
    cutoff_us = int(cutoff.timestamp() * 1e6)
    rows = [(o.key, o.size, datetime.fromtimestamp(o.mtime, tz=timezone.utc)) for o in top
            if int(o.mtime * 1e6) < cutoff_us]
    df = spark.createDataFrame(rows, REPORT_SCHEMA)
    if slices:
        from graveler.spark.entries import per_task_df

        listed = per_task_df(spark, slices).mapInArrow(_list_task(ns, cutoff_us), REPORT_SCHEMA)
        df = df.unionByName(listed)
    log.info("gc: listing %d slices of data/ (%d skipped as too young)", len(slices), len(subs) - len(slices))
    return df


# -- mark ----------------------------------------------------------------------------------------------------------


@dataclass
class MarkResult:
    run_id: str
    candidates: int
    bytes: int
    active_commits: int
    ranges_read: int
    report_prefix: str | None  # None for a dry run
    sample: list[str]  # up to 100 candidate addresses, sorted
    seconds: float = 0.0
    addresses: list[str] | None = None  # every candidate, when asked for (dry run, tests)
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase


def new_run_id(now: datetime) -> str:
    return now.strftime("%Y%m%dT%H%M%SZ") + "-" + uuid.uuid4().hex[:8]


def _write_report_task(ns: Namespace, prefix: str):
    import pyarrow as pa
    import pyarrow.parquet as pq

    def fn(batches):
        from pyspark import TaskContext

        tables = [pa.Table.from_batches([b]) for b in batches if b.num_rows]
        part = TaskContext.get().partitionId()
        n = 0
        if tables:
            t = pa.concat_tables(tables)
            n = t.num_rows
            buf = io.BytesIO()
            pq.write_table(t, buf)
            worker_store(ns).put(f"{prefix}part-{part:05d}.parquet", buf.getvalue())  # same content on a retry
        fault_point("gc_report")
        yield pa.RecordBatch.from_arrays([pa.array([n], pa.int64())], names=["n"])

    return fn


def mark(spark, repo, min_age: timedelta = DEFAULT_MIN_AGE, now: datetime | None = None, dry_run: bool = False,
         run_id: str | None = None, collect: bool = False, inventory=None) -> MarkResult:
    """Find the objects of ``data/`` that nothing active references; write the report (unless a dry run).

    ``inventory``: a DataFrame of the namespace's objects (``REPORT_SCHEMA``: address relative to the
    namespace, size, last_modified) to use instead of listing ``data/`` -- an S3 Inventory report, as
    lakeFS accepts, or a benchmark's synthetic listing.  Its rows outside ``data/`` are ignored.
    """
    from pyspark.sql import functions as F

    t0 = time.monotonic()
    if not timedelta(0) <= min_age <= MAX_MIN_AGE:
        raise InvalidArgument(f"the minimum age must be from 0 to {MAX_MIN_AGE.days:,} days")
    now = now or datetime.now(timezone.utc)
    run_id = run_id or new_run_id(now)
    cutoff = now - min_age
    ns = Namespace(repo.record.storage_namespace, repo.config.store)
    _check_there(ns)
    rules = get_rules(repo)
    refs = snapshot_refs(repo)
    active = active_commits(repo, rules, now, refs)
    phases = {"active_commits": time.monotonic() - t0}
    log.info("gc %s: %d active commits (rules: %s)", run_id, len(active), "none" if rules is None else "set")
    mrs = set(active.values())
    live, nranges = live_df(spark, ns, mrs)
    if inventory is None:
        old = old_objects_df(spark, ns, cutoff)
    else:
        old = inventory.select("address", "size", "last_modified").where(
            F.col("address").startswith(DATA_PREFIX) & (F.col("last_modified") < F.lit(cutoff)))
    # A sort-merge anti-join: it spills, where the broadcast hash join Spark may pick for a live
    # side of unknown size runs the driver out of memory (10M listed / 5M live).
    cands = old.join(live.hint("merge"), on="address", how="left_anti").persist()
    try:
        t1 = time.monotonic()
        cands.count()
        phases["live_list_antijoin"] = time.monotonic() - t1
        t1 = time.monotonic()
        # Read the refs and staging again now: a branch created or moved during the run, and whatever is
        # staged (uploads staged during the run are younger than the cutoff anyway), keep their objects.
        extra, again, extra_mrs = moved_since(spark, repo, ns, set(active), mrs)
        if extra is not None:
            prev = cands
            cands = prev.join(extra, on="address", how="left_anti").persist()
            cands.count()
            prev.unpersist()
        refs = RefsSnapshot({**refs.branches, **again.branches}, {**refs.tokens, **again.tokens},
                            {**refs.tags, **again.tags})
        phases["recheck_refs"] = time.monotonic() - t1
        t1 = time.monotonic()
        agg = cands.agg(F.count("*").alias("n"), F.sum("size").alias("b")).collect()[0]
        n, nbytes = int(agg["n"]), int(agg["b"] or 0)
        if collect:
            addresses = sorted(r.address for r in cands.select("address").collect())
            sample = addresses[:100]
        else:
            addresses = None
            sample = [r.address for r in cands.select("address").orderBy("address").limit(100).collect()] \
                if dry_run else []
        prefix = None
        if not dry_run:
            prefix = f"{GC_PREFIX}{run_id}/"
            # One Parquet part per partition of the (cached, so deterministic on a retry) candidates.
            written = cands.mapInArrow(_write_report_task(ns, prefix + "deleted/"), "n long").collect()
            if sum(r.n for r in written) != n:
                raise CorruptedData(f"GC report of run {run_id} holds {sum(r.n for r in written)} rows, not {n}")
            summary = {
                "run_id": run_id,
                "repository": repo.name,
                "storage_namespace": ns.uri,
                "created": now.isoformat(),
                "cutoff": cutoff.isoformat(),
                "min_age_seconds": int(min_age.total_seconds()),
                "rules": None if rules is None else json.loads(rules.to_json()),
                "active_commits": sorted(active),
                "refs": refs.to_json(),
                "candidates": n,
                "bytes": nbytes,
                "report": prefix + "deleted/",
            }
            ns.open().put(prefix + "summary.json", json.dumps(summary, indent=1).encode())  # last: the run is complete
        phases["report"] = time.monotonic() - t1
    finally:
        cands.unpersist()
    res = MarkResult(run_id, n, nbytes, len(active), nranges, prefix, sample, time.monotonic() - t0, addresses,
                     phases)
    log.info("gc %s: %d candidates (%d bytes) in %.1f s%s", run_id, n, nbytes, res.seconds,
             " (dry run)" if dry_run else "")
    return res


# -- sweep ---------------------------------------------------------------------------------------------------------


@dataclass
class SweepResult:
    run_id: str
    deleted: int
    kept: int  # candidates that became live again since the mark
    failed: int
    dry_run: bool
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)  # seconds per phase
    # an earlier sweep of the run that deleted all it had to: when (nothing is done again), else None
    swept_before: str | None = None
    # what writers killed mid-write left, older than the cutoff: a local namespace's temp files,
    # an S3 namespace's open multipart uploads (temp_kind says which; bytes: the uploads' parts)
    temp_files: int = 0
    temp_bytes: int = 0
    temp_kind: str = "temp file"


def _swept(ns: Namespace, run_id: str) -> dict | None:
    """What an earlier (not dry) sweep of ``run_id`` recorded, or None."""
    try:
        return json.loads(ns.open().get(f"{GC_PREFIX}{run_id}/swept.json"))
    except NotFound:
        return None


def read_summary(repo, run_id: str) -> dict:
    if not run_id or "/" in run_id or run_id in (".", ".."):
        raise InvalidArgument(f"invalid GC run ID {run_id!r}")
    key = f"{GC_PREFIX}{run_id}/summary.json"
    try:
        raw = repo.store.get(key)
    except NotFound:
        raise NotFound(f"GC run {run_id!r} has no complete report (no {key})") from None
    try:
        return json.loads(raw)
    except ValueError as e:
        raise CorruptedData(f"malformed GC summary ({e})", key) from None


def list_runs(repo) -> list[dict]:
    """The summaries of the complete mark runs, oldest first."""
    _, subs = repo.store.list_level(GC_PREFIX)
    out = []
    for p in subs:
        try:
            out.append(read_summary(repo, p[len(GC_PREFIX):].rstrip("/")))
        except NotFound:
            continue
    return out


def _report_task(ns: Namespace):
    import pyarrow.parquet as pq

    def fn(batches):
        store = worker_store(ns)
        for b in batches:
            for key in b.column(0).to_pylist():
                t = pq.read_table(io.BytesIO(store.get(key)), columns=["address"])
                for rb in t.to_batches():
                    yield rb
        fault_point("gc_read_report")

    return fn


def _delete_task(ns: Namespace, dry_run: bool, max_attempts: int = 6, existing_only: bool = False):
    """``existing_only``: a sweep run again (the earlier one failed for some): what is gone already
    is neither deleted nor counted again."""
    import pyarrow as pa

    def fn(batches):
        store = worker_store(ns)
        deleted = failed = 0
        for b in batches:
            keys = [k for k in b.column(0).to_pylist() if k.startswith(DATA_PREFIX)]  # never outside data/
            if existing_only:
                keys = [k for k in keys if store.exists(k)]
            for i in range(0, len(keys), 1000):
                chunk = keys[i : i + 1000]
                if dry_run:
                    deleted += len(chunk)
                    continue
                pending = chunk
                for attempt in range(max_attempts):
                    try:
                        bad = store.delete_many(pending)
                    except GravelerError as e:  # unreachable / throttled: back off, retry the chunk
                        bad = [(k, str(e)) for k in pending]
                    pending = [k for k, _ in bad]
                    if not pending or attempt == max_attempts - 1:
                        break
                    time.sleep(min(0.1 * 2**attempt, 5.0) * (0.5 + random.random()))
                if pending:
                    log.warning("gc sweep: %d objects could not be deleted (%s)", len(pending), bad[0][1])
                failed += len(pending)
                deleted += len(chunk) - len(pending)
        fault_point("gc_delete")
        yield pa.RecordBatch.from_arrays([pa.array([deleted], pa.int64()), pa.array([failed], pa.int64())],
                                         names=["deleted", "failed"])

    return fn


def _sweep_temp_files(ns: Namespace, summary: dict, dry_run: bool):
    """What writers killed mid-write left, last active before the run's cutoff: a local
    namespace's temp files, an S3 namespace's open multipart uploads
    (:func:`graveler.objstore.s3_uploads.sweep_left_behind`)."""
    from graveler.objstore.local_temp import TempSweep
    from graveler.objstore.s3_uploads import sweep_left_behind

    store = ns.open()
    res = sweep_left_behind(store, datetime.fromisoformat(summary["cutoff"]).timestamp(), dry_run)
    if res is None:
        return TempSweep()
    if res.failed:
        log.warning("gc sweep: %d stale %ss under %s (or listings of them) failed; the sweep goes on without "
                    "them", res.failed, res.kind, store.uri)
    return res


def _check_there(ns: Namespace) -> None:
    """NotFound if ``ns`` is a local directory that is not there (moved, deleted, a disk not mounted):
    a run would find nothing to keep, write its report into a new empty directory and say all is well."""
    from graveler.claims import check_there

    check_there(ns.uri)


def sweep(spark, repo, run_id: str, dry_run: bool = False) -> SweepResult:
    """Delete the candidates of a complete mark run, except those that became live since."""
    from graveler.spark.entries import per_task_df

    t0 = time.monotonic()
    ns = Namespace(repo.record.storage_namespace, repo.config.store)
    _check_there(ns)
    summary = read_summary(repo, run_id)
    if summary.get("storage_namespace") != ns.uri:
        raise InvalidArgument(f"GC run {run_id} was made for {summary.get('storage_namespace')}, not {ns.uri}")
    before = _swept(ns, run_id)
    if before is not None and not before.get("failed"):  # done: its objects are gone, nothing to count again
        log.info("gc sweep %s: swept already at %s (%d deleted then)", run_id, before.get("swept"),
                 before.get("deleted", 0))
        return SweepResult(run_id, 0, 0, 0, dry_run, time.monotonic() - t0, {}, before.get("swept"))
    parts = [o.key for o in ns.open().list(summary["report"]) if o.key.endswith(".parquet")]
    report = per_task_df(spark, parts).mapInArrow(_report_task(ns), _ADDR_SCHEMA) if parts else \
        spark.createDataFrame([], _ADDR_SCHEMA)
    report = report.persist()
    total = report.count()
    phases = {"read_report": time.monotonic() - t0}
    t1 = time.monotonic()
    # Whatever became live since the mark (new or moved heads, tags, staged addresses) is kept.
    extra, _, _ = moved_since(spark, repo, ns, set(summary.get("active_commits") or ()), set())
    todo = report if extra is None else report.join(extra, on="address", how="left_anti")
    phases["recheck_refs"] = time.monotonic() - t1
    t1 = time.monotonic()
    nparts = max(1, min(len(parts) * 4, 64))
    rows = todo.repartition(nparts).mapInArrow(_delete_task(ns, dry_run, existing_only=before is not None),
                                               "deleted long, failed long").collect()
    phases["delete"] = time.monotonic() - t1
    deleted = sum(r.deleted for r in rows)
    failed = sum(r.failed for r in rows)
    kept = total - deleted - failed
    if before is not None:  # a re-run: those the earlier sweep deleted are neither deleted nor kept now
        kept = max(0, kept - int(before.get("deleted", 0)))
    report.unpersist()
    t1 = time.monotonic()
    temps = _sweep_temp_files(ns, summary, dry_run)
    phases["temp_files"] = time.monotonic() - t1
    res = SweepResult(run_id, deleted, kept, failed, dry_run, time.monotonic() - t0, phases,
                      temp_files=temps.files, temp_bytes=temps.bytes, temp_kind=temps.kind)
    if not dry_run:
        ns.open().put(f"{GC_PREFIX}{run_id}/swept.json", json.dumps({
            "run_id": run_id, "swept": datetime.now(timezone.utc).isoformat(),
            "deleted": deleted + (int(before.get("deleted", 0)) if before is not None else 0),  # (over every sweep)
            "kept": kept, "failed": failed, "temp_files": temps.files}).encode())
    log.info("gc sweep %s: %d deleted, %d kept, %d failed%s", run_id, deleted, kept, failed,
             " (dry run)" if dry_run else "")
    return res
