"""The committed reader's seekable RecordIterator, and the streaming merge's conflict report."""

from __future__ import annotations

import random

import pytest

from graveler.committed.manager import CommittedManager, StoreSource
from graveler.committed.merge import MAX_CONFLICTS_REPORTED
from graveler.committed.reader import RecordIterator
from graveler.config import RangeParams
from graveler.errors import MergeConflict
from graveler.model import MergeStrategy, decode_value
from graveler.objstore import open_store
from tests.test_committed import key, value

SMALL = RangeParams(raggedness=32)


@pytest.fixture
def mgr(tmp_path):
    return CommittedManager(StoreSource(open_store(f"file://{tmp_path}/ns")), SMALL)


def test_record_iterator_seeks_like_a_sorted_list(mgr):
    recs = sorted((key(i), value(i)) for i in range(0, 3000, 3))
    mr = mgr.write_metarange(recs)
    assert len(mgr.list_ranges(mr)) > 5
    keys = [k for k, _ in recs]
    rnd = random.Random(7)
    it = RecordIterator(mgr.reader, mr)
    assert [it.next()[0] for _ in range(5)] == keys[:5]
    for _ in range(300):
        probe = key(rnd.randrange(0, 3100)) if rnd.random() < 0.8 else rnd.choice([b"", b"\xff", b"input/2024/05/"])
        it.seek_ge(probe)
        i = next((j for j, k in enumerate(keys) if k >= probe), len(keys))
        for j in range(i, min(i + rnd.randrange(1, 4), len(keys) + 1)):
            got = it.next()
            if j == len(keys):
                assert got is None
                break
            assert got[0] == keys[j] and decode_value(got[1]) == recs[j][1]
    empty = RecordIterator(mgr.reader, mgr.empty_metarange(), b"x")
    assert empty.next() is None


def test_merge_reports_every_conflict(mgr):
    n = MAX_CONFLICTS_REPORTED + 500
    base, _ = mgr.write_metarange(sorted((key(i), value(i)) for i in range(n))), None
    src, _ = mgr.apply(base, [(key(i), value(i, 1)) for i in sorted(range(n), key=key)])
    dest, _ = mgr.apply(base, [(key(i), value(i, 2)) for i in sorted(range(n), key=key)])
    with pytest.raises(MergeConflict) as ei:
        mgr.merge(base, src, dest)
    e = ei.value
    assert e.count == n and len(e.keys) == MAX_CONFLICTS_REPORTED
    assert f"merge conflict on {n} key(s)" in str(e) and f"and {n - 10} more" in str(e)
    merged, stats = mgr.merge(base, src, dest, MergeStrategy.SOURCE_WINS)
    assert stats.changed == n and merged == src
