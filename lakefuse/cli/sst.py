"""``lakefuse sst``: inspect SSTable files (like RocksDB's sst_dump), for operators."""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys

from graveler.errors import CorruptedData, InvalidArgument, NotFound
from graveler.committed.reader import computed_table_id
from graveler.model import Entry, RangeInfo, decode_value
from graveler.refsdump import ENTITIES, ENTITY_TYPE_KEY
from graveler.sstable.reader import BlockCache, SSTable
from lakefuse.cli.common import terminal_text

def _count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, not {n}")
    return n


def register(sub) -> None:
    p = sub.add_parser("sst", help="inspect SSTable (range / metarange) files",
                       description="Inspect SSTable files: lakeFS ranges and metaranges, or any RocksDB table.")
    s = p.add_subparsers(dest="sst_command", metavar="SUBCOMMAND")
    s.required = True
    d = s.add_parser("dump", help="print a table's properties and records",
                     description="Print a table's properties and records.", epilog=(
        "Records are decoded by the table's type property: a range's values as catalog entries, a "
        "metarange's as range records, a refs dump's commit / branch / tag tables (their entity "
        "property) as CommitData / BranchData / TagData, any other table's as text. With --json, a "
        "key or value that is not UTF-8 is given as key_hex / value_hex, a property as NAME_hex (in the\n"
        "text form: NAME (hex))."))
    d.add_argument("file", metavar="FILE", help="path of the .sst file")
    d.add_argument("--json", action="store_true", help="one JSON object per line: properties first, then records")
    d.add_argument("--limit", type=_count, default=None, metavar="N", help="print at most N records (N >= 0)")
    d.set_defaults(func=cmd_dump)
    i = s.add_parser("id", help="print the table's lakeFS range / metarange ID",
                     description="Print the table's lakeFS range / metarange ID.")
    i.add_argument("file", metavar="FILE", help="path of the .sst file")
    i.add_argument("--json", action="store_true",
                   help='print {"id": ..., "type": ...}: the ID and the table\'s lakeFS type property (ranges, metarange)')
    i.set_defaults(func=cmd_id)


def read_regular_file(path: str) -> bytes:
    """The bytes of a regular file: ``NotFound`` if missing, ``InvalidArgument`` for anything else
    (a FIFO or a device would block or never end; a directory is no table)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # O_NONBLOCK: a FIFO must not hang open()
    except FileNotFoundError:
        raise NotFound(f"no such file: {path}") from None
    except OSError as e:
        raise InvalidArgument(f"cannot read {path}: {e.strerror or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidArgument(f"{path} is not a regular file")
        with open(fd, "rb", closefd=False) as f:
            return f.read()
    except OSError as e:
        raise InvalidArgument(f"cannot read {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)


def open_table(path: str) -> SSTable:
    return SSTable(read_regular_file(path), path, block_cache=BlockCache(64 << 20))


def table_id(t: SSTable) -> str:
    return computed_table_id(t)


def _bytes_field(out: dict, name: str, b: bytes) -> None:
    """``name`` as text when it is UTF-8, else ``name_hex`` (never a text that reads the same)."""
    try:
        out[name] = b.decode("utf-8")
    except UnicodeDecodeError:
        out[name + "_hex"] = b.hex()


def _props_json(props: dict) -> dict:
    """A table's properties for JSON: a bytes value as text when it is UTF-8, else under
    ``<name>_hex`` (as records' keys and values: never a text that reads the same -- a
    ``min_key`` that is the text ``0x2b40`` and one of the bytes 2b 40 were both "0x2b40")."""
    out: dict = {}
    for k, v in sorted(props.items()):
        if isinstance(v, bytes):
            _bytes_field(out, k, v)
        else:
            out[k] = v
    return out


def record_json(kind: str | None, key: bytes, raw: bytes, name: str, entity: str | None = None) -> dict:
    out: dict = {}
    _bytes_field(out, "key", key)
    if kind == "ranges" and entity in ENTITIES:  # a refs dump's commits, branches or tags (lakeFS's form)
        from google.protobuf import json_format

        v = decode_value(raw, name)
        pb = ENTITIES[entity][1]()
        try:
            pb.ParseFromString(v.data)
        except Exception as e:  # (protobuf's DecodeError)
            raise CorruptedData(f"malformed {entity} record {key!r} ({e})", name) from None
        out["identity"] = v.identity.hex()
        try:
            out[entity] = json_format.MessageToDict(pb, preserving_proto_field_name=True)
        except json_format.Error as e:  # parsed, but holds what no JSON form has (a date beyond year 9999)
            raise CorruptedData(f"damaged {entity} record {key!r} ({e})", name) from None
    elif kind == "ranges":
        v = decode_value(raw, name)
        try:
            e = Entry.from_value(v)
        except CorruptedData as exc:  # (it names no file: the record does not know its table)
            raise CorruptedData(f"{exc} in record {key!r}", name) from None
        out["identity"] = v.identity.hex()
        out["entry"] = {
            "address": e.address, "address_type": e.address_type.name, "size": e.size, "etag": e.etag,
            "last_modified_ns": e.last_modified_ns, "content_type": e.content_type, "metadata": e.metadata,
        }
    elif kind == "metaranges":
        v = decode_value(raw, name)
        r = RangeInfo.from_value(v, name)
        out["identity"] = r.id
        rng: dict = {}
        _bytes_field(rng, "min_key", r.min_key)
        _bytes_field(rng, "max_key", r.max_key)
        out["range"] = {**rng, "count": r.count, "estimated_size": r.estimated_size}
    else:
        _bytes_field(out, "value", raw)
    return out


def cmd_dump(args: argparse.Namespace) -> int:
    t = open_table(args.file)
    props = _props_json(t.properties)
    kind = t.raw_properties.get("type", b"").decode("utf-8", "replace") or None
    entity = t.raw_properties.get(ENTITY_TYPE_KEY, b"").decode("utf-8", "replace") or None
    out = sys.stdout
    if not t.crc32c_trailers:  # (the footer says so: a table written without block checksums)
        print(terminal_text(f"warning: {args.file}: its footer says its blocks carry no checksum (type "
                            f"{t.footer.checksum_type}): they are read unverified", sys.stderr), file=sys.stderr)
    if args.json:
        out.write(json.dumps({"file": args.file, "footer": {
            "magic": t.footer.magic, "version": t.footer.version, "checksum_type": t.footer.checksum_type,
            "blocks_verified": t.crc32c_trailers, "two_level_index": t.two_level}, "properties": props}) + "\n")
    else:
        out.write(f"file: {args.file}\nfooter: {t.footer.magic} v{t.footer.version}, checksum type "
                  f"{t.footer.checksum_type}, {'two-level' if t.two_level else 'one-level'} index\n")
        out.write("properties:\n")
        for k, v in props.items():
            if k.endswith("_hex") and k[:-4] in t.properties:  # (bytes that are no UTF-8 text: as hex, said so)
                k, v = k[:-4] + " (hex)", v
            out.write(terminal_text(f"  {k}: {v!r}" if isinstance(v, str) and not v.isprintable() else f"  {k}: {v}",
                                    out) + "\n")
        out.write("records:\n")
    n = 0
    for key, raw in t:
        if args.limit is not None and n >= args.limit:
            break
        rec = record_json(kind, key, raw, args.file, entity)
        if args.json:
            out.write(json.dumps(rec) + "\n")
        else:
            rest = {k: v for k, v in rec.items() if k not in ("key", "key_hex")}
            shown = rec["key"] if "key" in rec else "0x" + rec["key_hex"]
            out.write(terminal_text(f"  {shown} {json.dumps(rest)}", out) + "\n")
        n += 1
    return 0


def cmd_id(args: argparse.Namespace) -> int:
    t = open_table(args.file)
    if "type" not in t.raw_properties:
        # a table that reads whole but is not lakeFS's: the wrong input (2), not damage (5)
        raise InvalidArgument(f"{args.file}: not a lakeFS range or metarange (no 'type' property): it has no lakeFS ID")
    if args.json:
        print(json.dumps({"id": table_id(t), "type": t.raw_properties["type"].decode("utf-8", "replace")}))
    else:
        print(table_id(t))
    return 0
