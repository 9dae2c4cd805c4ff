"""PySpark pipelines over graveler: bulk import, commits and diffs as DataFrames,
garbage collection, export.

graveler is a plain library inside the executors.  Executors only write
immutable, content-addressed objects (range files, copied data) and only when
absent, so a retried or speculative task cannot do harm; refs and staging (LMDB)
change only on the driver.  Nothing assumes that the driver's disk is visible to
the executors except through the object store (a local-directory store counts as
the object store in local mode).

Modules: :mod:`.session` (a SparkSession with the project's interpreter),
:mod:`.tables` (reading ranges, writing metaranges in parallel),
:mod:`.entries` (``entries_df``), :mod:`.diff` (``diff_df``), :mod:`.importer` (with
:mod:`.listing`, the parallel listing of a prefix), :mod:`.gc`, :mod:`.export`.  pyspark is imported only here, never by the rest of graveler.
"""
