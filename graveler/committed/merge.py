"""Three-way merge of metaranges, as a stream of changes onto the destination.

The base->source diff (:mod:`graveler.committed.diff`, which skips ranges and
blocks the two share) is walked together with a seekable cursor over the
destination; each differing key is decided with the three-way table and the
decision is yielded at once, so ``CommittedManager.apply`` writes the result
while the walk goes on: nothing is held in memory but the current blocks, and
dest's untouched ranges are reused by ID. The cost follows the changes on the
source side, not the size of the trees.
"""

from __future__ import annotations

from typing import Iterator

from graveler.committed.kernel import diff
from graveler.committed.reader import RecordIterator, TableReader
from graveler.errors import MergeConflict
from graveler.model import Entry, MergeStrategy, Value, decode_value
from graveler.objects import POSIX_ATIME, POSIX_GID, POSIX_MODE, POSIX_MTIME, POSIX_UID

MAX_CONFLICTS_REPORTED = 1000  # conflicting keys kept for the error; all of them are counted
# A key two merge bases added with different content, in their virtual base: a value no entry can
# have (its identity is not a digest), an empty object's entry to a reader, so that the outer merge
# sees each side's version of it as that side's change -- a side that deleted it and one that kept
# it conflict (git: modify/delete), where with no value at all the kept one came back as an addition.
_ADDED_APART = Value(b"lakefuse: added apart in a virtual merge base", Entry("", 0, "").to_value().data)


def _same(a: Value | None, b: Value | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.identity == b.identity


def _marker_change(key: bytes, src_v: Value | None, dest_v: Value | None) -> tuple[bool, Value | None]:
    """Two sides that changed the directory marker ``key`` (``d/``: a directory's attributes,
    no content) differently: ``(True, change)`` decides it without a conflict -- a change over
    a deletion (the directory stays, with the attributes the changing side gave it), else the
    version changed last (``last_modified``; the destination's on a tie). A mount writes a
    directory's marker whenever something inside it changes (its mtime), so two branches that
    wrote different files into one directory, or a revert of a load into a directory a later
    load also wrote, both touched it: as git, which keeps no directories, such merges are clean.
    ``(False, None)`` for any other key."""
    if not key.endswith(b"/"):
        return False, None
    if src_v is None or dest_v is None:
        return True, src_v if dest_v is None else None  # (None: the destination's stays)
    newer = Entry.from_value(src_v).last_modified_ns > Entry.from_value(dest_v).last_modified_ns
    return True, src_v if newer else None


_TIMES = (POSIX_MTIME, POSIX_ATIME)  # a touch
_OWNERSHIP = (POSIX_MODE, POSIX_UID, POSIX_GID)  # a chmod, a chown


def _parts(e: Entry) -> tuple[tuple, dict[str, str]]:
    """An entry's content (everything but its times and ownership: size, etag, content type, the
    rest of its metadata -- a symlink's target, a device's number, xattrs) and its ownership."""
    md = e.metadata
    rest = tuple(sorted((k, v) for k, v in md.items() if k not in _TIMES and k not in _OWNERSHIP))
    return (e.size, e.etag, e.content_type, rest), {k: md[k] for k in _OWNERSHIP if k in md}


def _apart(key: bytes, base_v: Value | None, src_v: Value | None, dest_v: Value | None) -> tuple[bool, Value | None]:
    """Two sides that changed file ``key`` differently, merged as git merges content and mode:
    ``(True, change)`` when one side changed only its times (a touch: the other side's stays) or
    one only its ownership (chmod/chown) and the other only its content and times (the content
    side's entry with the other's ownership); ``change`` None: the destination's stays.
    ``(False, None)``: a conflict (both changed the same part, or a side deleted or added it)."""
    if base_v is None or src_v is None or dest_v is None or key.endswith(b"/"):
        return False, None
    base, src, dest = Entry.from_value(base_v), Entry.from_value(src_v), Entry.from_value(dest_v)
    (bc, bo), (sc, so), (dc, do) = _parts(base), _parts(src), _parts(dest)
    if sc == bc and so == bo:
        return True, None  # the source only touched it
    if dc == bc and do == bo:
        return True, src_v  # the destination only touched it
    if sc == bc and do == bo:  # ownership on the source, content on the destination
        return True, _with_ownership(dest, so)
    if dc == bc and so == bo:  # content on the source, ownership on the destination
        return True, _with_ownership(src, do)
    return False, None


def _with_ownership(e: Entry, own: dict[str, str]) -> Value:
    md = {k: v for k, v in e.metadata.items() if k not in _OWNERSHIP}
    md.update(own)
    return Entry(e.address, e.size, e.etag, e.last_modified_ns, md, e.address_type, e.content_type).to_value()


def merge_changes(reader: TableReader, base_id: str, source_id: str, dest_id: str,
                  strategy: MergeStrategy, conflicts_to_base: bool = False) -> Iterator[tuple[bytes, Value | None]]:
    """The changes that merge source into dest over their common base, in key order.

    | base->source          | dest vs base      | result                     |
    |-----------------------|-------------------|----------------------------|
    | unchanged             | anything          | dest                       |
    | changed/added/deleted | unchanged         | source                     |
    | changed               | changed the same  | either (same identity)     |
    | changed               | changed otherwise | conflict (or the strategy) |

    Deletions count as changes; a key added on both sides with the same identity is
    no conflict, nor are two changes of a directory marker (:func:`_marker_change`), nor
    a touch against anything, nor a chmod/chown against a new content (:func:`_apart`).
    After the first conflict nothing more is yielded (the merge fails) but the walk
    goes on to count every conflict; at the end MergeConflict is raised with the
    count and up to MAX_CONFLICTS_REPORTED keys.

    ``conflicts_to_base``: a conflict takes the base's value instead (never fails): the merge of
    two merge bases into a virtual one (:meth:`graveler.commits.Commits.merge`), where, as in
    git's recursive merges of binary files, what the two bases disagree on stays as their own
    base had it -- the outer merge then sees each side's value as its own change; a key both
    added differently takes a value of its own (``_ADDED_APART``), for the same reason.
    """
    conflicts: list[bytes] = []
    n_conflicts = 0
    dest = RecordIterator(reader, dest_id)
    for d in diff(reader, base_id, source_id):
        key, base_v, src_v = d.key, d.left, d.right
        dest.seek_ge(key)
        item = dest.next()
        dest_v = decode_value(item[1]) if item is not None and item[0] == key else None
        if _same(dest_v, base_v):
            change = src_v  # only source changed it
        elif _same(dest_v, src_v):
            continue  # both made the same change
        elif strategy is MergeStrategy.SOURCE_WINS:
            change = src_v
        elif strategy is MergeStrategy.DEST_WINS:
            continue
        elif conflicts_to_base:
            # (both sides added the key, each its own way: a value no side has, as git's virtual base
            # keeps such a path with content of its own, so the outer merge sees each side's as a change)
            change = base_v if base_v is not None else _ADDED_APART
        elif (decided := _marker_change(key, src_v, dest_v))[0] or (decided := _apart(key, base_v, src_v, dest_v))[0]:
            if decided[1] is None:
                continue  # the destination's stays
            change = decided[1]
        else:
            n_conflicts += 1
            if len(conflicts) < MAX_CONFLICTS_REPORTED:
                conflicts.append(key)
            continue
        if not n_conflicts:
            yield key, change
    if n_conflicts:
        raise MergeConflict.on("merge", conflicts, n_conflicts)


__all__ = ["MAX_CONFLICTS_REPORTED", "merge_changes"]
