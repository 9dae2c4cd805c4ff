"""Where a spool file says what it is: branch, key, last acknowledged save (for recovery).

Each spool data file (``<sid>.data``) has a record -- a small JSON object, written by
:class:`lakefuse.mount.spool.SpoolFile` -- that recovery reads after a crash. The records of
one spool instance are lines appended to one file, ``spool.journal`` (:class:`Journal`): one
``write(2)`` to a descriptor kept open, never a file of its own to create (a file creation
costs as much as the rest of a small file's close), nothing synced (the data files are not
either: both survive the death of the daemon in the page cache). The last line of a
``sid`` wins. A record is written right after its data file is made, before its first byte,
so a data file a crash left never lacks its record once it holds content. The journal is
rewritten with the live records only (a rename over it) when it grows past
:data:`JOURNAL_LIMIT`.

Spool files of older versions carry their record as a file beside them, ``<sid>.json``:
:func:`records` reads those too.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

JOURNAL_NAME = "spool.journal"
JOURNAL_LIMIT = 4 << 20  # bytes: the journal is rewritten with the live records past this


def write_new_json(path: Path, obj: dict) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(obj, sort_keys=True).encode())
    finally:
        os.close(fd)


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, sort_keys=True))
    os.replace(tmp, path)


def write_synced_json(path: Path, obj: dict) -> None:
    """``obj`` at ``path``, whole and on disk when this returns (written aside, fsynced, renamed)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _line(sid: str, record: dict) -> bytes:
    return json.dumps({**record, "sid": sid}, sort_keys=True, separators=(",", ":")).encode() + b"\n"


class Journal:
    """The records of one spool instance's data files (see the module docstring). Thread-safe."""

    def __init__(self, directory: Path, limit: int = JOURNAL_LIMIT):
        self.path = Path(directory) / JOURNAL_NAME
        self.limit = limit
        self._lock = threading.Lock()
        self._live: dict[str, bytes] = {}  # sid -> its last line, for data files that have a name
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self._size = os.fstat(self._fd).st_size
        self.rewrites = 0

    def put(self, sid: str, record: dict) -> None:
        """``record`` is now what recovery reads for ``<sid>.data``."""
        line = _line(sid, record)
        with self._lock:
            if self._size + len(line) > self.limit:
                self._rewrite()
            self._live[sid] = line
            os.write(self._fd, line)
            self._size += len(line)

    def forget(self, sid: str) -> None:
        """``<sid>.data`` has no name any more: its record is not kept at the next rewrite."""
        with self._lock:
            self._live.pop(sid, None)

    def _rewrite(self) -> None:
        """The journal with the live records only, in place of the old one (one rename:
        a crash leaves one or the other, whole)."""
        tmp = self.path.with_name(JOURNAL_NAME + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC, 0o600)
        try:
            data = b"".join(self._live.values())
            os.write(fd, data)
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            raise
        os.close(self._fd)
        self._fd, self._size = fd, len(data)
        self.rewrites += 1

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def records(directory: Path) -> dict[str, dict]:
    """sid -> record of the data files of one spool instance directory: the journal's last
    line for each (an unreadable line -- the daemon died while writing it -- is skipped)."""
    out: dict[str, dict] = {}
    try:
        raw = (Path(directory) / JOURNAL_NAME).read_bytes()
    except OSError:
        return out
    for line in raw.splitlines():
        try:
            rec = json.loads(line)
            out[rec.pop("sid")] = rec
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return out


def read(data: Path, journal: dict[str, dict] | None = None) -> dict:
    """The record of the spool data file ``data``: from its instance's journal (``journal``:
    :func:`records` of its directory, read once by the caller), else ``<sid>.json`` beside it
    (an older version's); ``{}`` when it has none."""
    rec = (records(data.parent) if journal is None else journal).get(data.stem)
    if rec is not None:
        return rec
    try:
        return json.loads(data.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return {}
