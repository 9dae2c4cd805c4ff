"""graveler.objstore.local_temp: which leftover temp files a sweep may remove."""

from __future__ import annotations

import os
import time

from graveler.objstore.local import LocalStore
from graveler.objstore.local_temp import TEMP_MIN_AGE_S, sweep_temp_files

TMP = ".lakefuse-tmp-"


def _aged(path, age_s: float, data: bytes = b"partial") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    t = time.time() - age_s
    os.utime(path, (t, t))


def test_only_temp_names_older_than_the_cutoff_and_the_floor_are_removed(tmp_path):
    root = tmp_path / "ns"
    store = LocalStore(str(root))
    store.put("data/a/obj", b"an object")
    os.utime(root / "data/a/obj", (0, 0))  # old objects are the GC mark's, never this sweep's
    _aged(root / "data/a" / (TMP + "1" * 32), 5 * 86400)  # stale
    _aged(root / "_lakefs" / (TMP + "2" * 32), 5 * 86400, b"x" * 10)  # stale, another directory
    _aged(root / "data/a" / (TMP + "3" * 32), TEMP_MIN_AGE_S / 2)  # under the floor: a live writer, maybe
    _aged(root / "data/a" / (TMP + "short"), 5 * 86400)  # not the temp form: someone else's file
    _aged(tmp_path / "outside" / (TMP + "4" * 32), 5 * 86400)
    os.symlink(tmp_path / "outside", root / "data" / "link")  # not followed
    cutoff = time.time()  # (a --min-age 0 run's cutoff: the floor still holds)
    dry = sweep_temp_files(str(root), cutoff, dry_run=True)
    assert (dry.files, dry.bytes, dry.failed) == (2, len(b"partial") + 10, 0)
    assert (root / "data/a" / (TMP + "1" * 32)).exists()
    res = sweep_temp_files(str(root), cutoff)
    assert (res.files, res.bytes, res.failed) == (2, len(b"partial") + 10, 0)
    assert sorted(p.name for p in root.rglob(TMP + "*")) == [TMP + "3" * 32, TMP + "short"]
    assert (tmp_path / "outside" / (TMP + "4" * 32)).exists()
    assert store.get("data/a/obj") == b"an object"
    assert sweep_temp_files(str(root), cutoff).files == 0
    # an earlier cutoff spares what was written after it
    _aged(root / "data/b" / (TMP + "5" * 32), 2 * 86400)
    assert sweep_temp_files(str(root), time.time() - 3 * 86400).files == 0
    assert sweep_temp_files(str(root), time.time() - 86400).files == 1


def test_a_directory_it_cannot_list_is_counted_and_the_walk_goes_on(tmp_path, monkeypatch):
    """The sweep is best effort: a directory it cannot list (another user's, mode 0700: root is
    not stopped by modes, so the refusal is made here) is counted as failed, the rest is swept,
    and nothing raises -- a GC run or an export it serves does not fail for it."""
    import graveler.objstore.local_temp as lt

    root = tmp_path / "ns"
    _aged(root / "a" / (TMP + "1" * 32), 5 * 86400)
    _aged(root / "b" / (TMP + "2" * 32), 5 * 86400)
    real = os.scandir

    def scandir(path):
        if os.path.basename(path) == "b":
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(lt.os, "scandir", scandir)
    res = sweep_temp_files(str(root), time.time())
    assert (res.files, res.failed) == (1, 1)
    assert not (root / "a" / (TMP + "1" * 32)).exists() and (root / "b" / (TMP + "2" * 32)).exists()


def test_directories_the_removed_files_leave_empty_go_too_and_a_put_makes_them_again(tmp_path):
    """Found in "zc"'s list: a killed import's directory held only its temp file, and the sweep left
    the directory (and its emptied parents) behind for good. They go now, as a delete prunes them;
    a directory that still holds anything stays, the namespace's root too, and a dry run removes
    nothing. A put into a pruned directory makes it again."""
    root = tmp_path / "ns"
    store = LocalStore(str(root))
    store.put("data/keep/obj", b"an object")
    _aged(root / "data/keep" / (TMP + "1" * 32), 5 * 86400)
    _aged(root / "data/gone/deeper" / (TMP + "2" * 32), 5 * 86400)
    _aged(root / "data/gone" / (TMP + "3" * 32), 5 * 86400)
    _aged(root / "only" / (TMP + "4" * 32), 5 * 86400)
    dry = sweep_temp_files(str(root), time.time(), dry_run=True)
    assert (dry.files, dry.dirs) == (4, 0) and (root / "data/gone/deeper").is_dir()
    res = sweep_temp_files(str(root), time.time())
    assert (res.files, res.dirs, res.failed) == (4, 3, 0)  # data/gone/deeper, data/gone, only
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*")) == ["data", "data/keep", "data/keep/obj"]
    assert store.get("data/keep/obj") == b"an object"
    store.put("data/gone/deeper/new", b"made again")
    assert store.get("data/gone/deeper/new") == b"made again"
    only = tmp_path / "bare"
    _aged(only / (TMP + "5" * 32), 5 * 86400)
    assert sweep_temp_files(str(only), time.time()).dirs == 0 and only.is_dir()  # the root stays
