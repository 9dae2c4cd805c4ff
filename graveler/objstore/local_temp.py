"""Temp files a local store's writer left behind when its process died mid-write.

A put writes ``<dir>/.lakefuse-tmp-<uuid hex>`` and renames it over the key (see
:mod:`graveler.objstore.local`); a writer killed between the two (``kill -9`` of a
daemon adopting a large file, a Spark task killed during an import) leaves the temp
file, which listings skip and nothing else ever removes. GC's sweep removes those
whose last write is older than the run's cutoff (the mark's ``--min-age``, 24 h by
default) and at least an hour old whatever the cutoff (:data:`TEMP_MIN_AGE_S`; a
``--min-age 0`` run must not fail a put under way): a writer that is alive writes
to its temp file every few seconds, or fails within its store's bounded retries,
so a file untouched for longer has no writer. An export to a local directory writes
the same way; the run that goes on from one cut short removes its temp files (every one
older than that run: ``min_age_s=0``). The walk does
not follow symlinks. A directory a removed temp file leaves empty goes too, and so do its
parents left empty (never the root), as a store's delete prunes them: a put that was about to
write into one makes it again (:mod:`graveler.objstore.local`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from graveler.objstore.local import _TMP_NAME

TEMP_MIN_AGE_S = 3600.0


@dataclass
class TempSweep:
    files: int = 0
    bytes: int = 0
    # stale files that could not be removed, and directories that could not be listed: the
    # sweep is best effort (it never fails the GC run or the export it serves); the caller logs
    failed: int = 0
    kind: str = "temp file"  # what ``files`` counts: "temp file" (a local store), "multipart upload" (S3)
    dirs: int = 0  # directories left empty by the removed files, removed too


def sweep_temp_files(root: str, cutoff: float, dry_run: bool = False, now: float | None = None,
                     min_age_s: float = TEMP_MIN_AGE_S) -> TempSweep:
    """Remove (or, in a dry run, count) the temp files under ``root`` last written before
    ``cutoff`` and at least ``min_age_s`` before ``now``."""
    cutoff = min(cutoff, (time.time() if now is None else now) - min_age_s)
    res = TempSweep()
    stack = [root]
    while stack:
        directory = stack.pop()
        try:
            it = os.scandir(directory)
        except (FileNotFoundError, NotADirectoryError):
            continue  # removed while we walked
        except OSError:
            res.failed += 1
            continue
        with it:
            for entry in it:
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                        continue
                    if not (_TMP_NAME.match(entry.name) and entry.is_file(follow_symlinks=False)):
                        continue
                    st = entry.stat(follow_symlinks=False)
                    if st.st_mtime >= cutoff:
                        continue
                    if not dry_run:
                        os.unlink(entry.path)
                        res.dirs += _prune(root, directory)
                except FileNotFoundError:
                    continue  # renamed into place or removed while we looked
                except OSError:
                    res.failed += 1
                    continue
                res.files += 1
                res.bytes += st.st_size
    return res


def _prune(root: str, directory: str) -> int:
    """Remove ``directory`` and its parents below ``root`` while they are empty; how many went."""
    n = 0
    root = os.path.normpath(root)
    directory = os.path.normpath(directory)
    while directory != root and directory.startswith(root + os.sep):
        try:
            os.rmdir(directory)  # (fails, and stops here, unless empty)
        except OSError:
            break
        n += 1
        directory = os.path.dirname(directory)
    return n


__all__ = ["TEMP_MIN_AGE_S", "TempSweep", "sweep_temp_files"]
