"""Zero-copy import: an object-store prefix (or a listing DataFrame) becomes one commit.

The new commit's tree is the branch head's tree with everything under the
destination prefix replaced by the listed objects; entries point at the
existing objects by FULL address (nothing is copied).  The records (the head's
records outside the prefix, plus one per listed object) go through
:func:`graveler.spark.tables.write_metarange`, so the metarange ID is the one
the single-process writer gives for the same input, and re-running the same
import gives the same ID (then no new commit is made).

A listing DataFrame has the columns of :data:`LISTING_SCHEMA`: ``key`` (the
path under the destination prefix), ``address`` (the object's full URI),
``size``, ``etag`` and ``last_modified`` (timestamp).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterable

from graveler.errors import DirtyBranch, InvalidArgument, NotFound
from graveler import ident
from graveler import model
from graveler.model import AddressType, Value, encode_value
from graveler.objstore import open_store
from graveler.objstore.base import ObjectInfo, StoreConfig
from graveler.spark.entries import namespace_of, per_task_df, records_df
from graveler.staging import MAX_PATH_BYTES
from graveler.spark.listing import PART_SEP, FanOut, Progress, fan_out, group_parts, iter_group, split_part
from graveler.spark.tables import (Namespace, fault_point, worker_store, write_metarange,
                                   write_metarange_local)

log = logging.getLogger(__name__)

LISTING_SCHEMA = "key string, address string, size long, etag string, last_modified timestamp"
IMPORT_SOURCE_KEY = "lakefuse.import.source"
IMPORT_PREFIX_KEY = "lakefuse.import.prefix"


@dataclass(frozen=True)
class ImportResult:
    commit_id: str | None  # None: the tree did not change, no commit was made
    metarange_id: str
    imported: int  # listed objects
    records: int  # records of the new tree
    ranges: int
    parts: int
    seconds: dict[str, float] = field(default_factory=dict)
    # keys left out: listed keys that are no object key or that the mount cannot show (folder markers, empty
    # or dot segments, a segment over 255 bytes, a .lakefuse one); paths too long for a branch to change
    skipped: int = 0
    skipped_too_long: int = 0
    too_long_examples: list[str] = field(default_factory=list)


def check_dest_prefix(prefix: str) -> str:
    """"" (the whole branch) or a path prefix ending in "/"."""
    if prefix and not prefix.endswith("/"):
        prefix += "/"
    if prefix.startswith("/") or "\x00" in prefix or any(p in (".", "..") for p in prefix.split("/")[:-1]):
        raise InvalidArgument(f"invalid destination prefix {prefix!r}")
    if "//" in prefix:
        raise InvalidArgument(f"invalid destination prefix {prefix!r}: empty path component")
    return prefix


_EMPTY_MAP = ident.enc_string_map({})
_I64 = struct.Struct(">q")
_MASK64 = (1 << 64) - 1


def _varint(v: int) -> bytes:
    v &= _MASK64  # negative int64s as protobuf writes them: ten bytes of two's complement
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def imported_value(address: str, size: int, etag: str, last_modified_ns: int) -> bytes:
    """The encoded record value of an imported object: exactly
    ``encode_value(Entry(address, size, etag, last_modified_ns, address_type=FULL).to_value())``
    (no user metadata, no content type), built without the intermediate objects: the import's
    hot loop.  A test holds it to the library path."""
    a = address.encode("utf-8")
    e = etag.encode("utf-8")
    identity = hashlib.sha256(b"".join((b"\x02\x08", _I64.pack(size), b"\x01\x02\x08", _I64.pack(len(e)), e,
                                        _EMPTY_MAP))).digest()
    parts = []
    if a:
        parts += (b"\x0a", _varint(len(a)), a)
    if last_modified_ns:
        secs, nanos = divmod(last_modified_ns, 1_000_000_000)
        ts = (b"\x08" + _varint(secs) if secs else b"") + (b"\x10" + _varint(nanos) if nanos else b"")
        parts += (b"\x12", _varint(len(ts)), ts)
    if size:
        parts += (b"\x18", _varint(size))
    if e:
        parts += (b"\x22", _varint(len(e)), e)
    parts.append(b"\x30\x02")  # address_type FULL
    return encode_value(Value(identity, b"".join(parts)))


def encode_listing(dest_prefix: str, keys: list[str], addresses: list[str], sizes: list[int], etags: list[str],
                   mtimes_us: list[int | None]) -> list[tuple[bytes, bytes]]:
    """(key, encoded value) records of imported objects (FULL addresses, no user metadata)."""
    out = []
    pfx = dest_prefix.encode("utf-8")
    for k, a, s, e, m in zip(keys, addresses, sizes, etags, mtimes_us):
        if not k or k[0] == "/" or "\x00" in k:
            raise InvalidArgument(f"invalid listed key {k!r}")
        out.append((pfx + k.encode("utf-8"), imported_value(a, s, e, (m or 0) * 1000)))
    return out


def _bytes_view(buf) -> memoryview:
    return memoryview(buf).cast("B") if buf is not None else memoryview(b"")


def _column(b, name: str, typ, nullable: bool = False):
    """A listing column as one array of ``typ`` (string: 32-bit offsets), nulls refused (or 0)."""
    import pyarrow as pa

    col = b.column(name)
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if col.null_count:
        if not nullable:
            raise InvalidArgument(f"listing column {name!r} has {col.null_count} null value(s)")
        col = col.fill_null(0)
    return col if col.type == typ else col.cast(typ)


# a listing key staging refuses (graveler.paths.check_path): empty, NUL, a "." or ".." segment
_BAD_KEY = r"^$|\x00|(^|/)\.\.?(/|$)"


def check_listing_batch(b) -> None:
    """InvalidArgument, naming the first bad row, unless every key of listing batch ``b`` is one
    staging takes (:func:`graveler.paths.check_path`), every size >= 0 and every folder marker
    (a key ending in '/') empty: a listing made by hand (:func:`import_listing` takes any
    DataFrame) must not commit what staging refuses -- a ".." key no export can write, a
    negative size every read fails on, a directory that is an object too."""
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = _column(b, "key", pa.string())
    bad = pc.match_substring_regex(keys, _BAD_KEY)
    if pc.any(bad).as_py():
        i = pc.index(bad, True).as_py()
        raise InvalidArgument(f"listing: {keys[i].as_py()!r} is not an object key (empty, NUL, or a '.' or '..' "
                              "segment)")
    size = _column(b, "size", pa.int64())
    neg = pc.less(size, 0)
    if pc.any(neg).as_py():
        i = pc.index(neg, True).as_py()
        raise InvalidArgument(f"listing: {keys[i].as_py()!r} has a negative size ({size[i].as_py()})")
    marker = pc.and_(pc.ends_with(keys, "/"), pc.greater(size, 0))
    if pc.any(marker).as_py():
        i = pc.index(marker, True).as_py()
        raise InvalidArgument(f"listing: {keys[i].as_py()!r} is a folder marker (a key ending in '/') "
                              f"of {size[i].as_py()} bytes: a directory, not an object")


def encode_listing_batch(dest_prefix: str, b):
    """The records (``key binary, value binary`` RecordBatch) of a listing batch or table: what
    :func:`encode_listing` gives, by the compiled codec over the Arrow buffers (no Python object per
    record; the per-record reference when graveler runs its pure-Python reference). Its rows are
    checked first (:func:`check_listing_batch`)."""
    import pyarrow as pa

    check_listing_batch(b)
    if model.listing_records is None:
        recs = encode_listing(dest_prefix, b.column("key").to_pylist(), b.column("address").to_pylist(),
                              b.column("size").to_pylist(), b.column("etag").to_pylist(),
                              b.column("last_modified").cast(pa.int64()).to_pylist())
        return pa.RecordBatch.from_arrays([pa.array([k for k, _ in recs], pa.binary()),
                                           pa.array([v for _, v in recs], pa.binary())], names=["key", "value"])
    cols = [_column(b, "key", pa.string()), _column(b, "address", pa.string()), _column(b, "etag", pa.string())]
    size = _column(b, "size", pa.int64())
    mtime = b.column("last_modified")
    if isinstance(mtime, pa.ChunkedArray):
        mtime = mtime.combine_chunks()
    if pa.types.is_timestamp(mtime.type) and mtime.type.unit != "us":
        mtime = mtime.cast(pa.timestamp("us", tz=mtime.type.tz))
    mtime = mtime.cast(pa.int64())
    if mtime.null_count:
        mtime = mtime.fill_null(0)
    args = []
    for c in cols:
        _, off, data = c.buffers()
        args += (_bytes_view(off), _bytes_view(data), c.offset)
    try:
        ko, kd, vo, vd = model.listing_records(
            dest_prefix.encode("utf-8"), len(size), *args, _bytes_view(size.buffers()[1]), size.offset,
            _bytes_view(mtime.buffers()[1]), mtime.offset, int(AddressType.FULL))
    except ValueError as e:
        raise InvalidArgument(str(e)) from None
    n = len(size)
    return pa.RecordBatch.from_arrays([
        pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(ko), pa.py_buffer(kd)]),
        pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(vo), pa.py_buffer(vd)]),
    ], names=["key", "value"])


def _encode_shuffled(dest_prefix: str):
    """What the range-writing task makes of a sorted batch of the import's rows (``key`` the full key;
    ``value`` the record's value for the head's records kept, null for listed objects, whose listing
    columns follow): the ``key, value`` records, the listed ones encoded by the compiled codec."""
    import pyarrow as pa
    import pyarrow.compute as pc

    start = len(dest_prefix.encode("utf-8"))

    def fn(b):
        value = b.column("value")
        n = b.num_rows
        if value.null_count == 0:
            return pa.RecordBatch.from_arrays([b.column("key"), value], names=["key", "value"])
        listed = b if value.null_count == n else b.filter(value.is_null())
        rel = pc.binary_slice(listed.column("key"), start, 1 << 30).cast(pa.string())
        enc = encode_listing_batch(dest_prefix, pa.RecordBatch.from_arrays(
            [rel] + [listed.column(c) for c in ("address", "size", "etag", "last_modified")],
            names=["key", "address", "size", "etag", "last_modified"]))
        if listed is b:
            return enc
        return pa.RecordBatch.from_arrays([b.column("key"), pc.replace_with_mask(value, value.is_null(),
                                                                                 enc.column("value"))],
                                          names=["key", "value"])

    return fn


def _mtime_us(o: ObjectInfo) -> int:
    return int(round(o.mtime * 1_000_000))


def _listing_rows(store, objs: Iterable[ObjectInfo]) -> list[tuple]:
    from datetime import datetime, timezone

    return [(o.key, store.full_uri(o.key), o.size, o.etag,
             datetime.fromtimestamp(_mtime_us(o) / 1_000_000, tz=timezone.utc)) for o in objs]


def _list_task(source_uri: str, store_config: StoreConfig | None, counters, threads: int):
    import pyarrow as pa

    ts = pa.timestamp("us", tz="UTC")
    ns = Namespace(source_uri, store_config)

    def one(store, group):
        done = (lambda: counters[1].add(1)) if counters else None
        out = []
        for objs, skipped in iter_group(store, group, done):
            if counters:
                counters[0].add(len(objs))
                counters[2].add(skipped)
            if objs:
                out.append(_objs_batch(store, objs, pa, ts))
        return out

    def fn(batches):
        store = worker_store(ns)  # one client per worker process (workers are reused)
        for b in batches:
            for item in b.column(0).to_pylist():
                # The task's run of prefixes in up to `threads` sub-runs listed at once: S3 LIST is latency-bound.
                subs = group_parts(split_part(item), threads)
                if len(subs) == 1:
                    yield from one(store, subs[0])
                    continue
                with ThreadPoolExecutor(max_workers=len(subs), thread_name_prefix="list") as pool:
                    for out in pool.map(lambda g: one(store, g), subs):
                        yield from out
        fault_point("list")

    return fn


def _objs_batch(store, objs, pa, ts):
    return pa.RecordBatch.from_arrays(
        [
            pa.array([o.key for o in objs], pa.string()),
            pa.array([store.full_uri(o.key) for o in objs], pa.string()),
            pa.array([o.size for o in objs], pa.int64()),
            pa.array([o.etag for o in objs], pa.string()),
            pa.array([_mtime_us(o) for o in objs], pa.int64()).cast(ts),
        ],
        names=["key", "address", "size", "etag", "last_modified"],
    )


@dataclass
class ListingJob:
    """A listing DataFrame (lazy) and what its progress is read from."""

    df: object
    fan_out: FanOut
    tasks: int
    counters: tuple | None  # accumulators: objects listed, prefixes done, keys skipped (by the tasks)


def listing_job(spark, source_uri: str, store_config: StoreConfig | None = None, min_tasks: int | None = None,
                progress: Progress | None = None, task_threads: int = 4) -> ListingJob:
    """The objects under ``source_uri`` (keys relative to it) as a listing DataFrame, listed in
    parallel by delimiter fan-out: the driver reads the hierarchy breadth-first (prefixes listed on
    threads) until there are ``min_tasks * task_threads`` sub-prefixes (``min_tasks``: default 4 per
    core), then each of ``min_tasks`` tasks lists a run of them flat, in ``task_threads`` sub-runs
    at once.  The result is the flat
    listing (:mod:`.listing`)."""
    sc = spark.sparkContext
    min_tasks = min_tasks or 4 * sc.defaultParallelism
    store = open_store(source_uri, store_config)
    try:
        threads = getattr(store_config, "transfer_concurrency", 8) if store_config is not None else 8
        fo = fan_out(store, min_tasks * task_threads, threads=threads, progress=progress)
        rows = _listing_rows(store, fo.objects)
    finally:
        store.close()
    groups = group_parts(fo.prefixes, min_tasks)
    log.info("listing %s: %d objects on the driver (%d levels), %d sub-prefixes in %d tasks", source_uri,
             len(rows), fo.levels, len(fo.prefixes), len(groups))
    df = spark.createDataFrame(rows, LISTING_SCHEMA)
    counters = (sc.accumulator(0), sc.accumulator(0), sc.accumulator(0)) if progress is not None else None
    if groups:
        listed = per_task_df(spark, [PART_SEP.join(g) for g in groups]).mapInArrow(
            _list_task(source_uri, store_config, counters, task_threads), LISTING_SCHEMA)
        df = df.unionByName(listed)
    return ListingJob(df, fo, len(groups), counters)


def listing_df(spark, source_uri: str, store_config: StoreConfig | None = None, min_tasks: int | None = None):
    """The listing DataFrame of :func:`listing_job` (no progress line)."""
    return listing_job(spark, source_uri, store_config, min_tasks).df


def materialize_listing(job: ListingJob, progress: Progress | None = None, poll: float = 0.5):
    """Persist and count the listing, the progress line following the tasks (their counts arrive as
    each task ends); returns the persisted DataFrame and its row count."""
    df = job.df.persist()
    if progress is None or job.counters is None:
        return df, df.count()
    base_objects, base_done = progress.objects, progress.prefixes_done
    base_skipped = progress.skipped
    known = progress.prefixes_known
    objs, done, skipped = job.counters
    stop = threading.Event()

    def follow():
        while not stop.wait(poll):
            progress.set(base_objects + objs.value, base_done + done.value, known, base_skipped + skipped.value)

    t = threading.Thread(target=follow, name="listing-progress", daemon=True)
    t.start()
    try:
        n = df.count()
    finally:
        stop.set()
        t.join()
    progress.set(base_objects + objs.value, base_done + done.value, known, base_skipped + skipped.value)
    progress.close()
    if progress.skipped:
        log.info("listing: %d keys skipped: no object key (folder markers, empty or dot segments) or a name "
                 "the mount cannot show (a segment over 255 bytes, a .lakefuse one)", progress.skipped)
    return df, n


def check_clean(repo, branch: str) -> None:
    if repo.has_uncommitted(branch):
        raise DirtyBranch(f"branch {branch!r} has uncommitted changes: commit or reset them before importing")


def import_listing(repo, branch: str, listing, dest_prefix: str, message: str | None = None,
                   partitions: int | None = None, metadata: dict[str, str] | None = None,
                   source: str = "") -> ImportResult:
    """Import a listing DataFrame under ``dest_prefix`` of ``branch`` as one commit."""
    spark = listing.sparkSession
    dest_prefix = check_dest_prefix(dest_prefix)
    check_clean(repo, branch)
    if listing.isEmpty():  # (the prefix would be emptied: as import_prefix refuses an empty source)
        raise NotFound("nothing to import: the listing is empty (an import replaces the destination prefix; "
                       "`lakefuse fs rm -r` empties one)")
    from pyspark.sql import functions as F

    # A path a branch cannot stage (its key over MAX_PATH_BYTES) could never be changed or deleted but by
    # another import or a reset: such keys stay out, counted and named (one job over the persisted listing)
    limit = MAX_PATH_BYTES - len(dest_prefix.encode("utf-8"))
    too_long = [r[0] for r in listing.filter(F.octet_length("key") > limit).select("key").limit(5).collect()]
    n_long = 0
    if too_long:
        n_long = listing.filter(F.octet_length("key") > limit).count()
        listing = listing.filter(F.octet_length("key") <= limit)
        log.warning("import into %s/%s: %d key(s) left out, their paths over %d bytes (a branch stages changes of "
                    "paths of at most %d), e.g. %s", branch, dest_prefix, n_long, MAX_PATH_BYTES, MAX_PATH_BYTES,
                    too_long[0][:80] + "...")
        if listing.isEmpty():
            raise InvalidArgument(f"nothing to import: every listed key's path is over {MAX_PATH_BYTES} bytes "
                                  f"under {dest_prefix!r}")
    head = repo.get_commit(branch)
    ns = namespace_of(repo)

    # The listed objects cross to the range-writing tasks as listing rows (their full key computed in the
    # JVM) and are encoded there, after the shuffle: one hand-over to Python, not two.
    full_key = F.concat(F.lit(dest_prefix), F.col("key")).cast("binary").alias("key")
    new = listing.select(full_key, F.lit(None).cast("binary").alias("value"), "address", "size", "etag",
                         "last_modified")
    old = records_df(spark, ns, head.meta_range_id, dest_prefix.encode("utf-8"))  # b"": the whole tree goes
    old = old.select("key", "value", *(F.lit(None).cast(t).alias(c) for c, t in (
        ("address", "string"), ("size", "long"), ("etag", "string"), ("last_modified", "timestamp"))))
    # The break-key pass needs only the keys: straight from the listing, without encoding the values.
    keys = listing.select(full_key).unionByName(old.select("key"))
    t0 = time.monotonic()
    res = write_metarange(new.unionByName(old), ns, repo.config.range_params, partitions, keys=keys,
                          finish=_encode_shuffled(dest_prefix))
    mr = res.metarange_id if res.records else ""
    log.info("import into %s/%s: %d records in %.1f s", branch, dest_prefix, res.records, time.monotonic() - t0)
    out = _finish(repo, branch, head, mr, res.records, res.ranges, res.parts, dest_prefix, message, metadata,
                  source, listing.count())
    out.seconds.update(res.seconds)
    return dataclasses.replace(out, skipped_too_long=n_long, too_long_examples=too_long)


def _finish(repo, branch, head, mr, records, ranges, parts, dest_prefix, message, metadata, source,
            imported: int) -> ImportResult:
    if mr == head.meta_range_id:
        log.info("import into %s: the tree is unchanged (%s), no commit", branch, mr[:12])
        return ImportResult(None, mr, imported, records, ranges, parts)
    md = {IMPORT_PREFIX_KEY: dest_prefix}
    if source:
        md[IMPORT_SOURCE_KEY] = source
    md.update(metadata or {})
    c = repo.commit_metarange(branch, mr, message or f"Import {source or 'listing'} into {dest_prefix or '/'}",
                              metadata=md, expected_head=head.id)  # PreconditionFailed if the branch moved
    return ImportResult(c.id, mr, imported, records, ranges, parts)


def import_prefix(spark, repo, branch: str, source_uri: str, dest_prefix: str, message: str | None = None,
                  partitions: int | None = None, store_config: StoreConfig | None = None,
                  progress: bool | None = True) -> ImportResult:
    """Import every object under ``source_uri`` (a local directory or ``s3://bucket/prefix``), listed
    by delimiter fan-out; ``progress``: the listing's progress line on stderr (None: no counting)."""
    dest_prefix = check_dest_prefix(dest_prefix)
    check_clean(repo, branch)  # before the listing, which may take long: asked again before the commit
    cfg = store_config if store_config is not None else repo.config.store
    prog = Progress(source_uri, enabled=progress) if progress is not None else None
    job = listing_job(spark, source_uri, cfg, progress=prog)
    listing, n = materialize_listing(job, prog)
    try:
        if n == 0:  # (the prefix would be emptied: a mistyped source, most likely)
            raise NotFound(f"nothing to import: {source_uri} holds no object (an import replaces the "
                           f"destination prefix; `lakefuse fs rm -r` empties one)")
        res = import_listing(repo, branch, listing, dest_prefix, message, partitions, source=source_uri)
        return dataclasses.replace(res, skipped=prog.skipped if prog is not None else 0)
    finally:
        listing.unpersist()


# -- the single-process path (benchmarks, equivalence tests, small imports) --------------------------------------


def import_records_local(repo, branch: str, records: list[tuple[bytes, bytes]], dest_prefix: str,
                         message: str | None = None, source: str = "") -> ImportResult:
    """The same import in this process: ``records`` are the encoded listing (see :func:`encode_listing`),
    as pairs or as the ``key, value`` Arrow batch of :func:`encode_listing_batch` (sorted by Arrow and
    written over its buffers, as the Spark tasks do)."""
    dest_prefix = check_dest_prefix(dest_prefix)
    check_clean(repo, branch)
    head = repo.get_commit(branch)
    ns: Namespace = namespace_of(repo)
    store = ns.open()
    pb = dest_prefix.encode("utf-8")
    old = [(k, encode_value(v)) for k, v in repo.iter_committed(head.id) if not k.startswith(pb)]
    n = records.num_rows if hasattr(records, "column") else len(records)
    if hasattr(records, "column"):
        import pyarrow as pa

        t = records if isinstance(records, pa.Table) else pa.Table.from_batches([records])
        allrecs = pa.concat_tables([pa.table({"key": pa.array([k for k, _ in old], pa.binary()),
                                              "value": pa.array([v for _, v in old], pa.binary())}),
                                    t.select(["key", "value"])])
        total = allrecs.num_rows
    else:
        allrecs = old + list(records)
        total = len(allrecs)
    mr = write_metarange_local(store, allrecs, repo.config.range_params) if total else ""
    return _finish(repo, branch, head, mr, total, 0, 1, dest_prefix, message, None, source, n)
