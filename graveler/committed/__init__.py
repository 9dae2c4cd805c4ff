"""The committed layer: immutable range and metarange files in a storage namespace (lakeFS's).

* :mod:`~graveler.committed.writer`   splitting records into ranges, range and metarange IDs
* :mod:`~graveler.committed.reader`   the table and metarange LRUs, get, seekable iterators
* :mod:`~graveler.committed.diff`     diff of two metaranges, skipping shared ranges and blocks
* :mod:`~graveler.committed.merge`    three-way merge as a stream of changes
* :mod:`~graveler.committed.apply`    apply's per-range step (the reference) and its stats
* :mod:`~graveler.committed.manager`  CommittedManager: apply, merge, writing metaranges
* :mod:`~graveler.committed.fnv`      FNV-1a, lakeFS's range-break hash (the reference)
* :mod:`~graveler.committed.kernel`   the layer's compiled/reference switch (writer, diff, FNV)
"""
