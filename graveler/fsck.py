"""Check a whole repository: every record, every table, and (on request) every object.

The reads of everyday use check what they touch (a table's blocks and ID as it is opened, an
object's size as it is read, a commit record against its ID); damage elsewhere waits until
something reads it. ``fsck`` reads everything once, on purpose, as an operator wants after a
disk incident or a restore, and lists each problem it finds without stopping at the first:

* **refs** -- every commit record parses and hashes to its ID, every parent is there; every
  branch and tag record parses and names a commit that is there, and every branch that has a
  birth (made and dropped with its record) has its record (LMDB keeps no checksums: a damaged
  page can hide a key, and this is how a lost branch record shows);
* **trees** -- every metarange a commit names, and every range those list, is in the
  namespace, parses, every block's checksum holds, and its content hashes to its name (read
  whole, whatever the table-check memo remembers);
* **objects** (``objects="exist"``) -- every object an entry of a committed tree or of a
  branch's staging names is there, of the entry's size; ``objects="md5"`` reads each and checks
  its MD5 too (where the entry's etag is one).

Each distinct table and object is checked once, however many commits share it. Nothing is
changed. Healthy repositories -- made by commits, merges, reverts, imports, restores, gc --
report no problem (``tests/test_fsck.py``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from graveler.committed.reader import metarange_infos, verify_table
from graveler.committed.writer import table_key
from graveler.errors import CorruptedData, GravelerError, NotFound
from graveler.model import Entry, decode_value
from graveler.objects import is_md5_etag
from graveler.objstore import LocalStore

log = logging.getLogger(__name__)

OBJECT_CHECKS = ("none", "exist", "md5")


@dataclass
class Problem:
    kind: str  # commit, branch, tag, metarange, range, object
    name: str  # what is damaged: an ID, a ref name, an object's address
    detail: str


@dataclass
class FsckReport:
    commits: int = 0
    branches: int = 0
    tags: int = 0
    metaranges: int = 0
    ranges: int = 0
    entries: int = 0
    objects: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        return not self.problems


def _why(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def fsck(refs, store, entries, staged: Callable, objects: str = "none",
         progress: Callable[[str], None] | None = None) -> FsckReport:
    """Check the repository of ``refs`` (its RefManager), ``store`` (its namespace), ``entries`` (its EntryReader) and ``staged`` (a staging token ->
    its (path, value or None) pairs); see the module docstring."""
    if objects not in OBJECT_CHECKS:
        raise ValueError(f"objects must be one of {OBJECT_CHECKS}")
    rep = FsckReport()
    say = progress or (lambda s: None)

    def bad(kind: str, name: str, e: Exception | str) -> None:
        rep.problems.append(Problem(kind, name, e if isinstance(e, str) else _why(e)))

    # -- refs
    ids = refs.iter_commit_ids()
    idset = set(ids)
    trees: dict[str, str] = {}  # metarange ID -> a commit that names it
    for cid in ids:
        try:
            c = refs.get_commit(cid)
        except CorruptedData as e:
            bad("commit", cid, e)
            continue
        rep.commits += 1
        for p in c.parents:
            if p not in idset:
                bad("commit", cid, f"its parent {p} is not in the repository")
        if c.meta_range_id:
            trees.setdefault(c.meta_range_id, cid)
    named: dict[str, list] = {}
    for kind, listed in (("branch", refs.list_branches), ("tag", refs.list_tags)):
        try:
            named[kind] = listed()
        except CorruptedData as e:
            bad(kind, "(records)", e)
            named[kind] = []
        for r in named[kind]:
            if r.commit_id not in idset:
                bad(kind, r.name, f"names commit {r.commit_id}, which is not in the repository")
    branches = named["branch"]
    # a birth is made and dropped with its branch's record, in one transaction: one without the other is a
    # record lost (LMDB keeps no checksums: a damaged page can hide a key, which fsck sees only this way)
    have = {b.name for b in branches}
    for name in refs.birth_names():
        if name not in have:
            bad("branch", name, f"its record is missing, its birth is there: a damaged refs database "
                                f"(`lakefuse branch create` makes a branch of this name again, from a commit)")
    rep.branches, rep.tags = len(branches), len(named["tag"])
    say(f"refs: {rep.commits} commits, {rep.branches} branches, {rep.tags} tags")

    # -- trees, and the objects their entries name (each table read once)
    seen: set[tuple[int, str]] = set()

    def check(where: str, entry: Entry) -> None:
        rep.entries += 1
        k = (int(entry.address_type), entry.address)
        if k in seen:
            return
        seen.add(k)
        rep.objects += 1
        try:
            st, key = entries.locate(entry)
            if objects == "md5" and is_md5_etag(entry.etag):
                for _ in entries.iter(entry):
                    pass
            else:
                got = _size(st, key)
                if got != entry.size:
                    raise CorruptedData(f"its object is {got} bytes, the entry says {entry.size}")
        except GravelerError as e:
            bad("object", f"{where} ({entry.address})", e)

    ranges: set[str] = set()
    for mr, cid in trees.items():
        t = _table("metarange", mr, store, bad, f"the tree of commit {cid}")
        if t is None:
            continue
        rep.metaranges += 1
        try:
            ranges.update(info.id for info in metarange_infos(mr, t))
        except GravelerError as e:
            bad("metarange", mr, e)
    for rid in sorted(ranges):
        t = _table("range", rid, store, bad)
        if t is None:
            continue
        rep.ranges += 1
        if objects == "none":
            continue
        try:
            for key, raw in t:
                check(key.decode("utf-8", "replace"), Entry.from_value(decode_value(raw, t.name)))
        except GravelerError as e:
            bad("range", rid, e)
    say(f"trees: {rep.metaranges} metaranges, {rep.ranges} ranges")
    if objects == "none":
        return rep
    for b in branches:
        for token in b.tokens:
            try:
                for key, v in staged(token):
                    if v is not None:
                        check(f"{b.name}: {key.decode('utf-8', 'replace')} (staged)", Entry.from_value(v))
            except GravelerError as e:
                bad("branch", b.name, e)
    say(f"objects: {rep.objects} objects of {rep.entries} entries")
    return rep


def _size(st, key: str) -> int:
    """An object's size: a local file's by fstat (its head may hash it for its etag), else a HEAD."""
    if isinstance(st, LocalStore):
        r = st.open_reader(key)
        try:
            return r.size
        finally:
            r.close()
    return st.head(key).size


def _table(kind: str, tid: str, store, bad, whose: str = ""):
    """Table ``tid`` read from the namespace and checked whole (blocks, checksums, ID), or None
    after saying what is wrong with it."""
    key = table_key(tid)
    try:
        return verify_table(key, store.get(key))
    except NotFound:
        bad(kind, tid, f"missing from the namespace ({key}){': ' + whose if whose else ''}")
    except GravelerError as e:
        bad(kind, tid, e)
    return None


__all__ = ["FsckReport", "OBJECT_CHECKS", "Problem", "fsck"]
