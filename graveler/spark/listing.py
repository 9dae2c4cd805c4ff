"""Listing a large prefix in parallel: delimiter fan-out, then one flat listing per part.

A flat listing of N objects is N/1000 sequential LIST requests on S3.  The fan-out reads
the key hierarchy breadth-first with delimited listings (:meth:`ObjectStore.list_level`,
``Delimiter="/"`` on S3; one level at a time, the prefixes of a level listed on threads)
until there are enough sub-prefixes, then lists each sub-prefix flat, in parallel: on
threads in this process (:func:`list_parallel`) or in Spark tasks
(:func:`graveler.spark.importer.listing_df`).  The objects met on the way down (keys at
the expanded levels) are part of the result, so it is the flat listing exactly.

Only valid object keys are listed (:func:`listable`): S3 "folder markers" (keys ending
in "/") and keys with an empty, ".", ".." or ".lakefuse" segment or one over 255 bytes are skipped by the flat and the
fanned-out listing alike (a delimited listing cannot even name the "a//" level), and
counted.  A progress line (objects listed, prefixes done/known, rate) goes to stderr.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterator

from graveler.objects import RESERVED_NAME
from graveler.objstore.base import ObjectInfo

log = logging.getLogger(__name__)

PART_SEP = "\x00"  # joins the prefixes of one Spark task (NUL is in no key)


def listable(key: str) -> bool:
    """Whether a listed key is an object the import takes: a valid object key (no empty,
    "." or ".." segment, so no folder marker "dir/") that the mount can show (no ".lakefuse"
    segment, the name of its control files; no segment over 255 bytes)."""
    if not key or key[-1] == "/" or key[0] == "/" or "//" in key or "\x00" in key:
        return False
    if "." in key:
        for s in key.split("/"):
            if s == "." or s == ".." or s == RESERVED_NAME:
                return False
    if len(key) > 255 or (len(key) > 63 and not key.isascii()):  # (a segment of over 255 bytes is possible)
        for s in key.split("/"):
            if len(s.encode("utf-8", "surrogateescape")) > 255:
                return False
    return True


class Progress:
    """A progress line on stderr: objects listed, prefixes done / known, objects per second.

    On a terminal it is one line redrawn in place (rich, a dependency); elsewhere (logs, CI) a
    plain line at most every ``interval`` seconds.  Thread-safe; :meth:`close` prints the final line."""

    def __init__(self, what: str, stream=None, interval: float = 5.0, enabled: bool = True,
                 terminal: bool | None = None):
        self.what = what
        self.stream = stream if stream is not None else sys.stderr
        self.interval = interval
        self.enabled = enabled
        self.objects = 0
        self.skipped = 0
        self.prefixes_done = 0
        self.prefixes_known = 0
        self.t0 = time.monotonic()
        self._last = self.t0
        self._lock = threading.Lock()
        self._closed = False
        self._rich = None
        if enabled and (terminal if terminal is not None else _isatty(self.stream)):
            from rich.console import Console
            from rich.progress import Progress as RichProgress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._rich = RichProgress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                      console=Console(file=self.stream, force_terminal=True), transient=False)
            self._task = self._rich.add_task(self.line(), total=None)
            self._rich.start()

    def add(self, objects: int = 0, prefixes_done: int = 0, prefixes_found: int = 0, skipped: int = 0) -> None:
        with self._lock:
            self.objects += objects
            self.skipped += skipped
            self.prefixes_done += prefixes_done
            self.prefixes_known += prefixes_found
        self._tick()

    def set(self, objects: int, prefixes_done: int, prefixes_known: int, skipped: int = 0) -> None:
        with self._lock:
            self.objects, self.prefixes_done, self.prefixes_known, self.skipped = (
                objects, prefixes_done, prefixes_known, skipped)
        self._tick()

    def rate(self) -> float:
        return self.objects / max(time.monotonic() - self.t0, 1e-9)

    def line(self) -> str:
        s = (f"listing {self.what}: {self.objects:,} objects, {self.prefixes_done:,}/{self.prefixes_known:,} "
             f"prefixes, {self.rate():,.0f} objects/s")
        return s + (f", {self.skipped:,} keys skipped (no object, or a name the mount cannot show)"
                    if self.skipped else "")

    def _tick(self) -> None:
        if not self.enabled or self._closed:
            return
        if self._rich is not None:
            self._rich.update(self._task, description=self.line())
            return
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self._print(self.line())

    def _print(self, s: str) -> None:
        try:
            self.stream.write(s + "\n")
            self.stream.flush()
        except (OSError, ValueError):
            self.enabled = False  # a closed stderr never fails the listing

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if not self.enabled:
            return
        line = self.line() + f" in {time.monotonic() - self.t0:.1f} s"
        if self._rich is not None:
            self._rich.update(self._task, description=line)
            self._rich.stop()
        else:
            self._print(line)


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


@dataclass
class FanOut:
    """The objects met at the expanded levels and the sub-prefixes left to list flat (sorted)."""

    objects: list[ObjectInfo] = field(default_factory=list)
    prefixes: list[str] = field(default_factory=list)
    levels: int = 0  # the deepest level met
    calls: int = 0  # delimited listings made
    skipped: int = 0


def fan_out(store, min_parts: int, max_levels: int = 8, threads: int = 8, progress: Progress | None = None,
            start: str = "", max_calls: int | None = None) -> FanOut:
    """Breadth-first delimited listing from ``start``, one prefix at a time (in batches of
    ``threads``, listed on threads), until at least ``min_parts`` sub-prefixes are left to list
    (or none is, or ``max_calls`` delimited listings were made; prefixes ``max_levels`` below
    ``start`` are not expanded).  A prefix with a single child does not lose a part; one with
    none (an empty "directory") is dropped."""
    out = FanOut()
    queue: deque[str] = deque([start])
    final: list[str] = []  # too deep to expand
    base = start.count("/")
    calls = 0
    budget = max_calls if max_calls is not None else 16 * max(min_parts, 1)
    if progress:
        progress.add(prefixes_found=1)
    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="fan-out") as pool:
        while queue and len(queue) + len(final) < min_parts and calls < budget:
            batch = [queue.popleft() for _ in range(min(threads, len(queue), budget - calls))]
            calls += len(batch)
            for objs, subs, passed in pool.map(store.list_level_counted, batch):
                good = [o for o in objs if listable(o.key)]
                out.objects.extend(good)
                out.skipped += len(objs) - len(good) + passed
                for sub in subs:
                    depth = sub.count("/") - base
                    out.levels = max(out.levels, depth)
                    (final if depth >= max_levels else queue).append(sub)
                if progress:
                    progress.add(objects=len(good), prefixes_done=1, prefixes_found=len(subs),
                                 skipped=len(objs) - len(good) + passed)
    out.prefixes = sorted(list(queue) + final)
    out.calls = calls
    return out


def common_dir(a: str, b: str) -> str:
    """The longest "/"-terminated prefix of both ``a`` and ``b`` ("" if none)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return a[:n].rpartition("/")[0] + "/" if "/" in a[:n] else ""


def iter_group(store, prefixes: list[str], on_prefix=None) -> Iterator[tuple[list[ObjectInfo], int]]:
    """The listable objects under a consecutive run of the (sorted, disjoint) fan-out prefixes, in
    batches of up to 8192, with the count of keys skipped: ONE flat listing of the run's common
    directory from its first prefix, stopped after its last (requests: the objects / 1000, not one
    per prefix); keys between the prefixes (objects the fan-out met itself) are passed over.
    ``on_prefix()`` is called as each prefix is done."""
    batch: list[ObjectInfo] = []
    skipped = 0
    i, n = 0, len(prefixes)
    if not n:
        return
    # from just before the first prefix: a folder marker named as it is a key of it (start_after
    # is exclusive: from the prefix itself, such a marker was never seen, nor counted as skipped)
    it = store.list(common_dir(prefixes[0], prefixes[-1]), start_after=prefixes[0][:-1])
    try:
        for o in it:
            k = o.key
            while i < n and k > prefixes[i] and not k.startswith(prefixes[i]):
                i += 1
                if on_prefix:
                    on_prefix()
            if i == n:
                break
            if not k.startswith(prefixes[i]):
                continue  # between two prefixes
            if not listable(k):
                skipped += 1
                continue
            batch.append(o)
            if len(batch) >= 8192:
                yield batch, skipped
                batch, skipped = [], 0
    finally:
        close = getattr(it, "close", None)
        if close:
            close()
    if on_prefix:
        for _ in range(n - i):
            on_prefix()
    if batch or skipped:
        yield batch, skipped


def group_parts(prefixes: list[str], max_tasks: int) -> list[list[str]]:
    """Consecutive runs of the (sorted) prefixes, at most ``max_tasks`` of them, sizes within one."""
    n = len(prefixes)
    k = max(1, min(max_tasks, n))
    return [prefixes[i * n // k:(i + 1) * n // k] for i in range(k) if prefixes[i * n // k:(i + 1) * n // k]]


def flat_listing(store, prefix: str = "") -> list[ObjectInfo]:
    """The reference: one flat listing, the same key filter."""
    return [o for o in store.list(prefix) if listable(o.key)]


def list_parallel(store, min_parts: int = 32, threads: int = 8, progress: Progress | None = None,
                  start: str = "") -> list[ObjectInfo]:
    """Every listable object under ``start``, in key order: fan-out to ``min_parts`` prefixes, then
    ``min_parts`` runs of them listed flat on ``threads`` threads of this process."""
    fo = fan_out(store, min_parts, threads=threads, progress=progress, start=start)
    done = (lambda: progress.add(prefixes_done=1)) if progress else None

    def one(group: list[str]) -> list[ObjectInfo]:
        objs: list[ObjectInfo] = []
        for batch, skipped in iter_group(store, group, done):
            objs.extend(batch)
            if progress:
                progress.add(objects=len(batch), skipped=skipped)
        return objs

    out = list(fo.objects)
    with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="list") as pool:
        for objs in pool.map(one, group_parts(fo.prefixes, min_parts)):
            out.extend(objs)
    out.sort(key=lambda o: o.key.encode("utf-8"))
    if progress:
        progress.close()
    return out


def split_part(item: str) -> list[str]:
    return item.split(PART_SEP)
