"""A commit's entries as a DataFrame (the difference of two commits: :mod:`.diff`).

``entries_df`` runs a few tasks per core, each over a run of the commit's ranges.  The columns are
those of lakeFS's Spark client: key, address, etag, last_modified, size, range_id, user_metadata,
address_type (``RELATIVE``, ``FULL``, ``BY_PREFIX_DEPRECATED``).
"""

from __future__ import annotations

import logging

from graveler.errors import CorruptedData
from graveler import model
from graveler.model import AddressType, decode_value
from graveler.proto import catalog_pb2
from graveler.spark.tables import (
    RECORD_SCHEMA,
    Namespace,
    fault_point,
    iter_range_records,
    read_metarange,
    worker_store,
)

log = logging.getLogger(__name__)

ENTRY_FIELDS = (
    "key string, address string, etag string, last_modified timestamp, size long, range_id string, "
    "user_metadata map<string,string>, address_type string"
)
ENTRY_SCHEMA_WITH_IDENTITY = ENTRY_FIELDS + ", identity binary"
ENTRY_COLUMNS = ("key", "address", "etag", "last_modified", "size", "range_id", "user_metadata", "address_type")
_ADDRESS_NAMES = {int(t): t.name for t in AddressType}
ENTRIES_CHUNK = 65536  # entries decoded per call in an entries task


def namespace_of(repo) -> Namespace:
    """How executors reach ``repo``'s storage namespace."""
    return Namespace(repo.record.storage_namespace, repo.config.store)


def metarange_of(repo, ref: str) -> str:
    return repo.get_commit(ref).meta_range_id


def per_task_df(spark, items: list[str]):
    """One row ``item`` and one partition (one task) per item: range IDs, listing prefixes, report parts.

    Built on the JVM side (a range of row numbers indexing an array literal), so no Python
    RDD is needed to start the tasks."""
    from pyspark.sql import functions as F

    if not items:
        return spark.createDataFrame([], "item string")
    n = len(items)
    return spark.range(0, n, 1, n).select(F.element_at(F.lit(list(items)), (F.col("id") + 1).cast("int")).alias("item"))


def grouped_df(spark, items: list[str], per_core: int = 4):
    """One row ``item`` per item, in a few tasks (``per_core`` per core of the session), each taking a run
    of consecutive items.  A Python task costs tens of milliseconds of CPU to start; a range decodes in
    about as much, so one task per range would spend half its time starting tasks."""
    from pyspark.sql import functions as F

    if not items:
        return spark.createDataFrame([], "item string")
    n = len(items)
    tasks = max(1, min(n, per_core * spark.sparkContext.defaultParallelism))
    return spark.range(0, n, 1, tasks).select(
        F.element_at(F.lit(list(items)), (F.col("id") + 1).cast("int")).alias("item"))


def _py_entry_arrays(keys: list[bytes], values: list[bytes], rid: str, pa) -> tuple[list, list]:
    """The entry columns of a block's records, by protobuf (the reference, when graveler runs its pure-Python one)."""
    cols: dict[str, list] = {c: [] for c in ENTRY_COLUMNS}
    idents = []
    pb = catalog_pb2.Entry()  # parsed in place: no Entry objects on the hot path
    for k, raw in zip(keys, values):
        v = decode_value(raw, rid)
        try:
            pb.ParseFromString(v.data)
        except Exception as e:  # protobuf's DecodeError
            raise CorruptedData(f"malformed catalog entry ({e})", rid) from None
        cols["key"].append(k.decode("utf-8", "surrogateescape"))
        cols["address"].append(pb.address)
        cols["etag"].append(pb.e_tag)
        if pb.HasField("last_modified"):
            ts = pb.last_modified
            cols["last_modified"].append(ts.seconds * 1_000_000 + ts.nanos // 1000)
        else:
            cols["last_modified"].append(None)
        cols["size"].append(pb.size)
        cols["user_metadata"].append(list(pb.metadata.items()))
        cols["address_type"].append(_ADDRESS_NAMES.get(pb.address_type, "RELATIVE"))
        idents.append(v.identity)
    n = len(keys)
    arrays = [
        pa.array(cols["key"], pa.string()),
        pa.array(cols["address"], pa.string()),
        pa.array(cols["etag"], pa.string()),
        pa.array(cols["last_modified"], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        pa.array(cols["size"], pa.int64()),
        pa.array([rid] * n, pa.string()),
        pa.array(cols["user_metadata"], pa.map_(pa.string(), pa.string())),
        pa.array(cols["address_type"], pa.string()),
    ]
    return arrays, idents


_TYPE_NAMES = [_ADDRESS_NAMES[i] for i in range(3)]


def _c_entry_arrays(keys: list[bytes], values: list[bytes], rid: str, pa) -> tuple[list, object]:
    """The same columns by the compiled decoder (``graveler._centries``): Arrow buffers filled in C;
    only entries with user metadata go through protobuf, for that column."""
    (ao, ad, eo, ed, io, idata, lm, valid, nulls, sizes, types, md_rows) = model.entry_columns(
        values, rid, int(AddressType.RELATIVE))
    n = len(values)
    buf = pa.py_buffer
    try:
        key = pa.array(keys, pa.binary()).cast(pa.string())  # validates the UTF-8
        address = pa.Array.from_buffers(pa.string(), n, [None, buf(ao), buf(ad)])
        etag = pa.Array.from_buffers(pa.string(), n, [None, buf(eo), buf(ed)])
        address.validate(full=True)
        etag.validate(full=True)
    except (pa.ArrowInvalid, UnicodeDecodeError) as e:
        raise CorruptedData(f"malformed catalog entry (invalid UTF-8: {e})", rid) from None
    md_type = pa.map_(pa.string(), pa.string())
    if md_rows:
        pb = catalog_pb2.Entry()
        metadata = [[]] * n
        for i in md_rows:
            pb.ParseFromString(decode_value(values[i], rid).data)
            metadata[i] = list(pb.metadata.items())
        md = pa.array(metadata, md_type)
    else:  # no user metadata in the block: n empty maps, built without a Python object each
        md = pa.MapArray.from_arrays(pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(bytes(4 * (n + 1)))]),
                                     pa.array([], pa.string()), pa.array([], pa.string()))
    arrays = [
        key,
        address,
        etag,
        pa.Array.from_buffers(pa.timestamp("us", tz="UTC"), n, [buf(valid) if nulls else None, buf(lm)],
                              null_count=nulls),
        pa.Array.from_buffers(pa.int64(), n, [None, buf(sizes)]),
        pa.repeat(pa.scalar(rid, pa.string()), n),
        md,
        pa.array(_TYPE_NAMES, pa.string()).take(pa.Array.from_buffers(pa.int32(), n, [None, buf(types)])),
    ]
    return arrays, pa.Array.from_buffers(pa.binary(), n, [None, buf(io), buf(idata)])


def _entries_task(ns: Namespace, with_identity: bool):
    import pyarrow as pa

    arrays_of = _py_entry_arrays if model.entry_columns is None else _c_entry_arrays

    def fn(batches):
        store = worker_store(ns)
        names = list(ENTRY_COLUMNS) + (["identity"] if with_identity else [])

        def batch(keys, values, rid):
            arrays, idents = arrays_of(keys, values, rid, pa)
            if with_identity:
                arrays.append(idents if isinstance(idents, pa.Array) else pa.array(idents, pa.binary()))
            return pa.RecordBatch.from_arrays(arrays, names=names)

        for b in batches:
            for rid in b.column(0).to_pylist():
                # Decoded in chunks of many data blocks (a block holds some tens of entries: a decode
                # call and its Arrow steps per block would cost more than the decoding itself).
                keys: list[bytes] = []
                values: list[bytes] = []
                for ks, vs in iter_range_records(store, rid):
                    keys.extend(ks)
                    values.extend(vs)
                    if len(keys) >= ENTRIES_CHUNK:
                        yield batch(keys, values, rid)
                        keys, values = [], []
                if keys:
                    yield batch(keys, values, rid)
        fault_point("entries")

    return fn


def ranges_entries_df(spark, ns: Namespace, range_ids: list[str], with_identity: bool = False):
    """The entries of the given ranges, in their order, a few tasks per core (:func:`grouped_df`)."""
    schema = ENTRY_SCHEMA_WITH_IDENTITY if with_identity else ENTRY_FIELDS
    return grouped_df(spark, range_ids).mapInArrow(_entries_task(ns, with_identity), schema)


def entries_df(spark, repo, ref: str):
    """Every entry of the commit ``ref`` resolves to (a branch: its head; staged changes are not included)."""
    ns = namespace_of(repo)
    ranges = read_metarange(ns.open(), metarange_of(repo, ref))
    return ranges_entries_df(spark, ns, [r.id for r in ranges])


def _records_task(ns: Namespace, exclude_prefix: bytes | None):
    import pyarrow as pa

    def fn(batches):
        store = worker_store(ns)
        for b in batches:
            for rid in b.column(0).to_pylist():
                for keys, values in iter_range_records(store, rid):
                    if exclude_prefix is not None:
                        kv = [(k, v) for k, v in zip(keys, values) if not k.startswith(exclude_prefix)]
                        keys, values = [k for k, _ in kv], [v for _, v in kv]
                    yield pa.RecordBatch.from_arrays([pa.array(keys, pa.binary()), pa.array(values, pa.binary())],
                                                     names=["key", "value"])
        fault_point("records")

    return fn


def records_df(spark, ns: Namespace, metarange_id: str, exclude_prefix: bytes | None = None):
    """The raw ``key binary, value binary`` records of a metarange (minus a key prefix), one task per range."""
    ranges = read_metarange(ns.open(), metarange_id)
    return per_task_df(spark, [r.id for r in ranges]).mapInArrow(_records_task(ns, exclude_prefix), RECORD_SCHEMA)
