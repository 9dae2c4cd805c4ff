"""Range and metarange files in Spark: reading ranges in tasks, writing a metarange in parallel.

Writing: lakeFS's break rule closes a range after a record whose key's FNV-1a
hash is 0 modulo the raggedness (``min_range_size`` 0, the default), or when the
range reaches the size guard.  A range that starts right after a hash break is
therefore written the same way whatever came before it: the size guard only
counts records since the last break.  So the records are cut into *parts* only
at hash-break keys (found by a first, cheap pass that hashes the keys), each
part goes to one task, which sorts it by key bytes and writes its ranges with
the ordinary :class:`~graveler.committed.writer.MetaRangeWriter`; the driver
collects the range descriptions, orders them by key and writes the metarange.
The ranges, their IDs and the metarange ID are exactly those of the
single-process writer (:func:`write_metarange_local`) for any partitioning.

With ``min_range_size > 0`` a hash break only counts once the range is big
enough, so breaks depend on everything before them: the records then go
through one task (still on an executor).

Tasks write range files only if absent (content-addressed: a retried or
speculative task writes the same bytes under the same name, or nothing).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Iterable, Iterator

from graveler.committed.kernel import fnv1a64_batch
from graveler.committed.kernel import MetaRangeWriter
from graveler.committed.writer import RangeParams, table_key
from graveler.errors import CorruptedData, InvalidArgument, NotFound
from graveler.model import RangeInfo, decode_value
from graveler.objstore import ObjectStore, open_store
from graveler.objstore.base import StoreConfig
from graveler.sstable.reader import BlockCache, SSTable

log = logging.getLogger(__name__)

RECORD_SCHEMA = "key binary, value binary"
# Fault injection for tests: "first-attempt" makes the first attempt of every task fail once it has
# done its work (written its files), so that the retry must cope with what the failed attempt left.
FAULT_ENV = "LAKEFUSE_SPARK_FAULT"
RANGE_SCHEMA = "id string, min_key binary, max_key binary, count long, estimated_size long"
_BATCH = 4096
# Records of a part up to which its task sorts it in memory (Arrow) rather than Spark (~250 MB of an import).
SORT_IN_TASK_MAX = 1_000_000


@dataclass(frozen=True)
class Namespace:
    """A storage namespace as executors reach it: its URI and how to open its store."""

    uri: str
    store: StoreConfig | None = None

    def open(self) -> ObjectStore:
        return worker_store(self)


_stores: dict[Namespace, ObjectStore] = {}
_stores_lock = threading.Lock()


def worker_store(ns: Namespace) -> ObjectStore:
    """The store of ``ns``, opened once per Python worker process (workers are reused)."""
    with _stores_lock:
        st = _stores.get(ns)
        if st is None:
            st = _stores[ns] = open_store(ns.uri, ns.store)
        return st


def fault_point(where: str) -> None:
    """Raise in a task's first attempt when fault injection is on (see FAULT_ENV)."""
    if os.environ.get(FAULT_ENV) != "first-attempt":
        return
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is not None and ctx.attemptNumber() == 0:
        raise RuntimeError(f"injected failure at the end of {where} (stage {ctx.stageId()}, "
                           f"partition {ctx.partitionId()}, attempt 0)")


def put_if_absent(store: ObjectStore, key: str, data: bytes) -> bool:
    """Store an immutable, content-addressed object unless it is there already; True if written."""
    if store.exists(key):
        return False
    store.put(key, data)
    return True


def open_table(store: ObjectStore, table_id: str) -> SSTable:
    key = table_key(table_id)
    try:
        data = store.get(key)
    except NotFound:
        raise NotFound(f"table {table_id} not found in the namespace ({key})") from None
    return SSTable(data, key, cache_key=table_id, block_cache=BlockCache(0))


def iter_range_records(store: ObjectStore, range_id: str) -> Iterator[tuple[list[bytes], list[bytes]]]:
    """The (keys, encoded values) of one range, a data block at a time."""
    t = open_table(store, range_id)
    for blk in t.iter_blocks():
        if blk.keys:
            yield blk.keys, blk.values


def read_metarange(store: ObjectStore, metarange_id: str) -> list[RangeInfo]:
    """The ranges of a metarange (``""``: the empty tree)."""
    if metarange_id == "":
        return []
    t = open_table(store, metarange_id)
    kind = t.raw_properties.get("type")
    if kind not in (None, b"metaranges"):
        raise CorruptedData(f"table {metarange_id} is not a metarange")
    return [RangeInfo.from_value(decode_value(raw, t.name), t.name) for _, raw in t]


# -- writing -------------------------------------------------------------------------------


@dataclass(frozen=True)
class WriteResult:
    metarange_id: str
    records: int
    ranges: int
    parts: int
    seconds: dict[str, float] = field(default_factory=dict)  # per phase: break_keys, write_ranges, metarange


def write_metarange_local(store: ObjectStore, records: Iterable[tuple[bytes, bytes]],
                          params: RangeParams = RangeParams(), metadata: dict[str, str] | None = None) -> str:
    """The single-process writer: sort (key, encoded value) records by key bytes, write ranges and
    the metarange; returns the metarange ID.  ``records``: pairs, or an Arrow table (or record batch)
    of ``key binary, value binary``, then sorted by Arrow and written over its buffers, as the Spark
    tasks do."""
    w = MetaRangeWriter(lambda k, d: put_if_absent(store, k, d), params, metadata)
    if hasattr(records, "column"):
        import pyarrow as pa
        import pyarrow.compute as pc

        t = records if isinstance(records, pa.Table) else pa.Table.from_batches([records])
        prev = None
        for b in t.take(pc.sort_indices(t.column("key"))).to_batches(max_chunksize=1 << 16):
            prev = write_record_batch(w, b, prev)
        return w.close()
    recs = sorted(records)
    for i in range(0, len(recs), _BATCH):
        w.write_batch(recs[i : i + _BATCH])
    return w.close()


def _break_keys_task(raggedness: int, counted=None):
    import pyarrow as pa

    def fn(batches):
        n = 0
        for b in batches:
            n += b.num_rows
            keys = b.column(0).to_pylist()
            hs = fnv1a64_batch(keys)
            sel = [k for k, h in zip(keys, hs) if h % raggedness == 0]
            yield pa.RecordBatch.from_arrays([pa.array(sel, pa.binary())], names=["key"])
        if counted is not None:
            counted.add(n)

    return fn


def _part_column(spark, bounds: list[bytes]):
    """A column that sends the records of part ``i`` (keys in ``(bounds[i-1], bounds[i]]``) to
    shuffle partition ``i`` under ``repartition(len(bounds) + 1, col)``.

    All in the JVM: the part is a CASE over the cut keys (binary comparison in Spark is
    unsigned byte order, as in Python), and its value is a tag chosen so that Spark's hash
    partitioning (``pmod(hash(tag), n)``) puts it in partition ``i`` -- no sampling job (as
    ``repartitionByRange`` would run) and no two parts sharing a task by hash collision.
    """
    from pyspark.sql import functions as F

    n = len(bounds) + 1
    if n == 1:
        return F.lit(0)
    probe = spark.range(0, 64 * n).select(F.col("id").cast("int").alias("t"))
    rows = probe.select("t", F.expr(f"pmod(hash(t), {n})").alias("p")).collect()
    tag: dict[int, int] = {}
    for r in sorted(rows, key=lambda r: r.t):
        tag.setdefault(r.p, r.t)
    if len(tag) < n:  # cannot happen with 64 candidates per partition, but never guess
        raise InvalidArgument(f"no partition tag found for {n - len(tag)} of {n} parts")
    col = F.when(F.col("key") <= F.lit(bounds[0]), F.lit(tag[0]))
    for i in range(1, len(bounds)):
        col = col.when(F.col("key") <= F.lit(bounds[i]), F.lit(tag[i]))
    return col.otherwise(F.lit(tag[n - 1])).cast("int")


def binary_buffers(col) -> tuple:
    """An Arrow binary array (no nulls) as what ``MetaRangeWriter.write_buffers`` takes: its int32 offsets
    and data buffers and its offset."""
    b = col.buffers()
    return (memoryview(b[1]).cast("B") if b[1] is not None else memoryview(b""),
            memoryview(b[2]).cast("B") if b[2] is not None else memoryview(b""), col.offset)


def write_record_batch(w, b, prev: bytes | None) -> bytes | None:
    """Write a sorted ``key binary, value binary`` batch with the writer ``w`` over its Arrow buffers
    (no Python object per record); ``prev``: the last key written before. Duplicate keys (neighbours
    once sorted) and null values are refused. Returns the batch's last key."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = b.num_rows
    if not n:
        return prev
    kcol, vcol = b.column("key"), b.column("value")
    if isinstance(kcol, pa.ChunkedArray):
        kcol, vcol = kcol.combine_chunks(), vcol.combine_chunks()
    if kcol.type != pa.binary():
        kcol = kcol.cast(pa.binary())
    if vcol.type != pa.binary():
        vcol = vcol.cast(pa.binary())
    if kcol.null_count or vcol.null_count:
        raise InvalidArgument(f"{kcol.null_count + vcol.null_count} null key(s) or value(s) in the records")
    dup = kcol[0].as_py() == prev
    if not dup and n > 1:
        dup = pc.any(pc.equal(kcol.slice(1), kcol.slice(0, n - 1))).as_py()
    if dup:
        keys = kcol.to_pylist()
        k = next(k for i, k in enumerate(keys) if (keys[i - 1] if i else prev) == k)
        raise InvalidArgument(f"duplicate key {k!r} in the records")
    w.write_buffers(n, *binary_buffers(kcol), *binary_buffers(vcol))
    return kcol[n - 1].as_py()


def _write_ranges_task(ns: Namespace, params: RangeParams, metadata: dict[str, str] | None, finish=None,
                       sort: bool = False):
    """The task writing one part's ranges; ``sort``: the part comes unsorted and is sorted here, in
    memory, by Arrow (cheaper than Spark's sort of the rows and their conversion back to Arrow)."""
    import pyarrow as pa

    def fn(batches):
        store = worker_store(ns)
        w = MetaRangeWriter(lambda k, d: put_if_absent(store, k, d), params, metadata)
        prev = None
        if sort:
            import pyarrow.compute as pc

            got = [b for b in batches if b.num_rows]
            batches = ()
            if got:
                t = pa.Table.from_batches(got)  # Arrow sorts binary as unsigned bytes, as the writer orders keys
                batches = t.take(pc.sort_indices(t.column("key"))).to_batches(max_chunksize=1 << 16)
        for b in batches:
            if b.num_rows:  # sorted by the shuffle: duplicates are neighbours (within and across batches)
                prev = write_record_batch(w, finish(b) if finish is not None else b, prev)
        w.close_range()
        fault_point("write_ranges")
        rs = w.ranges
        yield pa.RecordBatch.from_arrays(
            [
                pa.array([r.id for r in rs], pa.string()),
                pa.array([r.min_key for r in rs], pa.binary()),
                pa.array([r.max_key for r in rs], pa.binary()),
                pa.array([r.count for r in rs], pa.int64()),
                pa.array([r.estimated_size for r in rs], pa.int64()),
            ],
            names=["id", "min_key", "max_key", "count", "estimated_size"],
        )

    return fn


def choose_bounds(break_keys: list[bytes], parts: int) -> list[bytes]:
    """Up to ``parts - 1`` cut keys among the sorted break keys, spread evenly; a part is
    ``(previous cut, cut]``, so every part but the last ends on a break key."""
    n = len(break_keys)
    if parts <= 1 or n == 0:
        return []
    if n <= parts - 1:
        return list(break_keys)
    out = [break_keys[(i * n) // parts - 1] for i in range(1, parts)]
    return sorted(set(out))


def spark_error_message(exc: BaseException) -> str:
    """The graveler error inside a failed Spark job's Python traceback, else the exception text."""
    text = str(exc)
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("graveler.errors."):
            return line[len("graveler.errors."):]
    return text.strip().splitlines()[-1] if text.strip() else type(exc).__name__


def write_metarange(records, ns: Namespace, params: RangeParams = RangeParams(), partitions: int | None = None,
                    metadata: dict[str, str] | None = None, keys=None, finish=None) -> WriteResult:
    """Write ranges and a metarange from a DataFrame of ``key binary, value binary`` records
    (unique keys, any order, any partitioning); returns the metarange ID and counts.

    ``partitions``: how many parts to cut the records into (default: the default parallelism).
    ``keys``: a DataFrame (one ``key binary`` column) of the same keys, cheaper to compute than
    the records (e.g. straight from a listing, before the values are encoded): the break-key
    pass then reads it instead of caching the records.  It must hold only keys of the records.
    ``finish``: what makes a ``key, value`` batch of a batch of ``records`` in the range-writing task
    (``records`` then has a ``key binary`` column and whatever ``finish`` reads): the import encodes
    the listing's values there, after the shuffle, so that they cross to the JVM and back once.
    """
    spark = records.sparkSession
    recs = records.select("key", "value") if finish is None else records
    parts = partitions or spark.sparkContext.defaultParallelism
    if params.min_range_size > 0:
        parts = 1
    bounds: list[bytes] = []
    total: int | None = None  # records, counted by the break-key pass
    persisted = False
    secs: dict[str, float] = {}
    t0 = time.monotonic()
    try:
        if parts > 1:
            if keys is None:
                recs = recs.persist()  # computed once for both passes
                persisted = True
                keys = recs.select("key")
            counted = spark.sparkContext.accumulator(0)
            rows = keys.mapInArrow(_break_keys_task(params.raggedness, counted), "key binary").collect()
            total = counted.value
            # Parts small enough to sort in a task's memory (where the break keys allow it).
            parts = max(parts, -(-total // SORT_IN_TASK_MAX))
            bounds = choose_bounds(sorted(bytes(r.key) for r in rows), parts)
            secs["break_keys"] = time.monotonic() - t0  # includes computing (and caching) the input
        nparts = len(bounds) + 1
        # Sorted in the tasks when the parts are known to be small (break keys fall evenly among the
        # records: they are hash-chosen), else by Spark, which can spill.
        sort_in_task = total is not None and total <= SORT_IN_TASK_MAX * nparts
        t1 = time.monotonic()
        parted = recs.withColumn("part", _part_column(spark, bounds))
        parted = parted.repartition(nparts, "part")
        if not sort_in_task:
            parted = parted.sortWithinPartitions("key")
        parted = parted.drop("part")
        rows = parted.mapInArrow(_write_ranges_task(ns, params, metadata, finish, sort_in_task),
                                 RANGE_SCHEMA).collect()
        secs["write_ranges"] = time.monotonic() - t1
    except Exception as e:
        if type(e).__module__.startswith(("pyspark", "py4j")):
            raise InvalidArgument(f"writing ranges failed: {spark_error_message(e)}") from e
        raise
    finally:
        if persisted:
            recs.unpersist()
    infos = sorted((RangeInfo(r.id, bytes(r.min_key), bytes(r.max_key), r["count"], r.estimated_size) for r in rows),
                   key=lambda i: i.min_key)
    t2 = time.monotonic()
    store = ns.open()
    w = MetaRangeWriter(lambda k, d: put_if_absent(store, k, d), params, metadata)
    for info in infos:
        w.copy_range(info)  # checks that ranges do not overlap (duplicate keys across parts)
    mr_id = w.close()
    secs["metarange"] = time.monotonic() - t2
    n = sum(i.count for i in infos)
    log.info("wrote metarange %s: %d records, %d ranges, %d parts", mr_id, n, len(infos), nparts)
    return WriteResult(mr_id, n, len(infos), nparts, secs)
