"""`lakefuse sst dump` and `lakefuse sst id`, run as a user runs them (a subprocess)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.test_sstable import LAKEFS, ROCKS


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lakefuse", *args], capture_output=True, text=True, timeout=60)


def test_sst_id_of_lakefs_range_matches_its_metarange():
    r = run("sst", "id", str(LAKEFS / "range.sst"))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "a83af763ba098c15369d9d6d723731eb9ce18b8dfac4f88c6f1287e772393d0e"


def test_sst_dump_json_lines():
    r = run("sst", "dump", "--json", str(LAKEFS / "ok1.sst"))
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert lines[0]["properties"]["type"] == "ranges"
    assert lines[0]["properties"]["rocksdb.num.entries"] == 105
    recs = lines[1:]
    spec = json.loads((LAKEFS / "lakefs-spark-sstable__ok1.sst.json").read_text())["records"]
    assert [r["key"] for r in recs] == [s["key"] for s in spec]
    assert [r["identity"] for r in recs] == [s["identity_hex"] for s in spec]
    assert recs[0]["entry"]["etag"] == spec[0]["entry"]["e_tag"]


def test_sst_dump_text_of_metarange_and_rocksdb_table():
    r = run("sst", "dump", str(LAKEFS / "metarange.sst"))
    assert r.returncode == 0 and "a83af763" in r.stdout and "type: metaranges" in r.stdout
    r = run("sst", "dump", "--limit", "2", str(ROCKS / "h.sst"))
    assert r.returncode == 0 and '"value": "97"' in r.stdout
    r = run("sst", "dump", "--limit", "-1", str(ROCKS / "h.sst"))  # (it printed no record and exited 0)
    assert r.returncode == 2 and "must be >= 0, not -1" in r.stderr and r.stdout == ""


def test_damaged_and_missing_files_fail_cleanly(tmp_path):
    bad = tmp_path / "trunc.sst"
    bad.write_bytes((LAKEFS / "range.sst").read_bytes()[:500])
    r = run("sst", "dump", str(bad))
    assert r.returncode == 5
    assert r.stderr.startswith("lakefuse: ") and "trunc.sst" in r.stderr and "Traceback" not in r.stderr
    r = run("sst", "id", str(tmp_path / "absent.sst"))
    assert r.returncode == 3 and "no such file" in r.stderr
    r = run("sst", "id", str(ROCKS / "h.sst"))  # a healthy table of another kind: the wrong input, not damage
    assert r.returncode == 2 and "not a lakeFS range" in r.stderr


def test_help_everywhere():
    for args in (["--help"], ["sst", "--help"], ["sst", "dump", "--help"], ["sst", "id", "--help"]):
        r = run(*args)
        assert r.returncode == 0 and "usage:" in r.stdout


def test_sst_dump_reads_a_refs_dumps_own_tables_and_keeps_binary_keys_apart(tmp_path):
    """Found by a lakeFS user's exploration: the commit, branch and tag tables of a refs dump
    (``type: ranges``, their ``entity`` property naming what the values are) were decoded as
    catalog entries and called damaged (exit 5, naming no file); and a key or value that is not
    UTF-8 printed as "0x..." -- the same text as a key spelled that way."""
    import rocksdict

    from tests.graveler_testutil import make_graveler

    g = make_graveler(tmp_path)
    r = g.create_repository("dumped", f"file://{tmp_path}/ns")
    r.upload("main", "a", b"A")
    c = r.commit("main", "one")
    r.create_tag("v1", "main")
    manifest = r.dump_refs()
    got = {}
    for field, entity in (("commits_meta_range_id", "commit"), ("branches_meta_range_id", "branch"),
                          ("tags_meta_range_id", "tag")):
        ranges = r._committed.list_ranges(manifest[field])
        out = run("sst", "dump", "--json", str(tmp_path / "ns" / "_lakefs" / ranges[0].id))
        assert out.returncode == 0, out.stderr
        got[entity] = [json.loads(x)[entity] for x in out.stdout.splitlines()[1:]]
    g.close()
    assert c.id in [x["id"] for x in got["commit"]] and {"id": "main", "commit_id": c.id} in got["branch"]
    assert got["tag"] == [{"id": "v1", "commit_id": c.id}]
    # a binary key beside a text key that reads like its old hex rendering
    path = str(tmp_path / "bin.sst")
    opts = rocksdict.Options(raw_mode=True)
    bbo = rocksdict.BlockBasedOptions()
    bbo.set_format_version(2)
    bbo.set_checksum_type(rocksdict.ChecksumType.crc32c())
    opts.set_block_based_table_factory(bbo)
    w = rocksdict.SstFileWriter(opts)
    w.open(path)
    w[b"\x00\xff"] = b"\xff\xfe"
    w[b"0x00ff"] = b"0xfffe"
    w.finish()
    out = run("sst", "dump", "--json", path)
    assert out.returncode == 0, out.stderr
    recs = [json.loads(x) for x in out.stdout.splitlines()[1:]]
    assert {"key_hex": "00ff", "value_hex": "fffe"} in recs and {"key": "0x00ff", "value": "0xfffe"} in recs


def test_a_healthy_table_in_a_form_lakefuse_does_not_read_is_exit_2_by_name(tmp_path):
    """Not "corrupted" (exit 5): the wrong input (exit 2), named (LZ4, not "unknown type 4")."""
    import rocksdict

    from tests.test_sstable import _records, _rocks_table

    path = _rocks_table(tmp_path / "lz4.sst", sorted(_records(3000, value_size=40)),
                        compression=rocksdict.DBCompressionType.lz4())
    r = run("sst", "dump", str(path))
    assert r.returncode == 2 and "LZ4 compression is not supported" in r.stderr, r.stderr


def test_sst_dump_json_of_a_commit_no_json_date_can_hold_is_exit_5(tmp_path):
    """Found by fuzzing: a refs dump's commit record dated beyond year 9999 parses, and `sst dump
    --json` died in protobuf's JSON form (a traceback, exit 1). Exit 5 naming the record; the
    same table with the commit's real date dumps."""
    from graveler.model import Value
    from graveler.refsdump import _metadata
    from tests.graveler_testutil import entry, make_graveler

    g = make_graveler(tmp_path)
    r = g.create_repository("big", f"file://{tmp_path}/ns")
    r.stage("main", "a", entry("a"))
    c = r.commit("main", "one")
    pb = c.to_proto()
    files = {}
    for label, seconds in (("healthy", pb.creation_date.seconds), ("damaged", 1 << 40)):
        pb.creation_date.seconds = seconds
        mr = r._committed.write_metarange([(c.id.encode(), Value(c.id.encode(), pb.SerializeToString()))],
                                          _metadata("commit"))
        (rng,) = r._committed.list_ranges(mr)
        files[label] = tmp_path / "ns" / "_lakefs" / rng.id
    g.close()
    ok = run("sst", "dump", "--json", str(files["healthy"]))
    assert ok.returncode == 0 and json.loads(ok.stdout.splitlines()[1])["commit"]["id"] == c.id, ok.stderr
    bad = run("sst", "dump", "--json", str(files["damaged"]))
    assert bad.returncode == 5 and bad.stderr.count("\n") == 1 and "damaged commit record" in bad.stderr, bad.stderr


def test_sst_dump_says_when_a_tables_blocks_carry_no_checksum(tmp_path):
    """A table written without block checksums (its footer's type 0) dumps -- its blocks read
    unverified, as RocksDB reads them -- and says so on stderr and in the JSON footer; a table
    with CRC32C trailers (every lakeFS table) says nothing of the kind."""
    import rocksdict

    def table(path, checksum):
        opts = rocksdict.Options(raw_mode=True)
        bbo = rocksdict.BlockBasedOptions()
        bbo.set_format_version(2)
        bbo.set_checksum_type(checksum)
        opts.set_block_based_table_factory(bbo)
        w = rocksdict.SstFileWriter(opts)
        w.open(str(path))
        w[b"k"] = b"v"
        w.finish()
        return str(path)

    bare = table(tmp_path / "bare.sst", rocksdict.ChecksumType.no_checksum())
    crc = table(tmp_path / "crc.sst", rocksdict.ChecksumType.crc32c())
    for path, checked in ((bare, False), (crc, True)):
        out = run("sst", "dump", "--json", path)
        assert out.returncode == 0, out.stderr
        lines = [json.loads(x) for x in out.stdout.splitlines()]
        assert lines[0]["footer"]["blocks_verified"] is checked
        assert {"key": "k", "value": "v"} in lines[1:]
        assert ("carry no checksum" in out.stderr) is not checked, out.stderr
        text = run("sst", "dump", path)
        assert text.returncode == 0 and ("read unverified" in text.stderr) is not checked, text.stderr


def test_sst_dump_keeps_a_binary_property_apart_from_text_that_reads_like_it(tmp_path):
    """Found by a lakeFS user's tour: ok1.sst's binary min_key (2b 40 b3 6c a8) printed as the text
    "0x2b40b36ca8", which a range whose first key is that text also printed. A property (and a
    metarange's range bound) that is no UTF-8 is NAME_hex now, as records' keys and values."""
    out = run("sst", "dump", "--json", str(LAKEFS / "ok1.sst"))
    props = json.loads(out.stdout.splitlines()[0])["properties"]
    assert props["min_key_hex"] == "2b40b36ca8" and "min_key" not in props and props["max_key"] == "xyzzy"
    assert "min_key (hex): 2b40b36ca8" in run("sst", "dump", "--limit", "0", str(LAKEFS / "ok1.sst")).stdout
    from tests.graveler_testutil import make_graveler

    g = make_graveler(tmp_path)
    r = g.create_repository("hexlike", f"file://{tmp_path}/ns")
    r.upload("main", "0x2b40b36ca8", b"A")
    c = r.commit("main", "one")
    ranges = r._committed.list_ranges(c.meta_range_id)
    g.close()
    out = run("sst", "dump", "--json", str(tmp_path / "ns" / "_lakefs" / ranges[0].id))
    props = json.loads(out.stdout.splitlines()[0])["properties"]
    assert props["min_key"] == "0x2b40b36ca8" and "min_key_hex" not in props
    out = run("sst", "dump", "--json", str(tmp_path / "ns" / "_lakefs" / c.meta_range_id))
    rng = json.loads(out.stdout.splitlines()[1])["range"]
    assert rng["min_key"] == "0x2b40b36ca8" and rng["max_key"] == "0x2b40b36ca8"
