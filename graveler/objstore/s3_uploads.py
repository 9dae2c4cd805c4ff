"""Multipart uploads an S3 writer left open when its process died mid-upload.

An S3 store uploads a large file in parts (:meth:`graveler.objstore.s3.S3Store.put_file`):
it starts a multipart upload, sends the parts, completes it -- or aborts it when the upload
fails. A writer killed in between (a daemon saving a large file, a Spark task of an import,
an export) leaves the upload open: its parts are kept and billed, belong to no object, show
in no listing, and nothing removes them unless the bucket has a lifecycle rule
(``AbortIncompleteMultipartUpload``, what lakeFS leaves it to; many buckets have none).
This is the S3 twin of :mod:`graveler.objstore.local_temp`: GC's sweep aborts the open
uploads under the namespace whose last activity -- their newest part, else their start --
is older than the run's cutoff and at least an hour old whatever the cutoff
(:data:`~graveler.objstore.local_temp.TEMP_MIN_AGE_S`: a writer that is alive sends a part
every few seconds, or fails within its bounded retries). Best effort as that sweep: an
upload that could not be listed or aborted is counted in ``failed`` (the caller logs it) and
never fails the GC run.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import botocore.exceptions as bex

from graveler.objstore.local_temp import TEMP_MIN_AGE_S, TempSweep

log = logging.getLogger(__name__)
THREADS = 8  # uploads looked at (parts listed, aborted) at once


def sweep_uploads(store, cutoff: float, dry_run: bool = False, now: float | None = None,
                  min_age_s: float = TEMP_MIN_AGE_S) -> TempSweep:
    """Abort (or, in a dry run, count) the open multipart uploads under ``store``'s prefix
    (an :class:`~graveler.objstore.s3.S3Store`) last active before ``cutoff`` and at least
    ``min_age_s`` before ``now`` (POSIX seconds); ``bytes`` counts their parts. The uploads of
    a listing page are looked at by :data:`THREADS` requests at once."""
    cutoff = min(cutoff, (time.time() if now is None else now) - min_age_s)
    client, bucket = store._client, store.bucket
    res = TempSweep(kind="multipart upload")

    def one(up) -> tuple[str, int]:
        """("aborted" or "kept" or "failed", the parts' bytes) of one upload."""
        key, upload_id = up["Key"], up["UploadId"]
        if up["Initiated"].timestamp() >= cutoff:
            return "kept", 0  # started after the cutoff: its writer may be alive
        try:
            last, size = _parts(client, bucket, key, upload_id)
            if max(last, up["Initiated"].timestamp()) >= cutoff:
                return "kept", 0  # a part came after the cutoff: its writer may be alive
            if not dry_run:
                client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
        except bex.ClientError as exc:
            if str(exc.response.get("Error", {}).get("Code", "")) == "NoSuchUpload":
                return "kept", 0  # completed or aborted while we looked
            log.debug("gc sweep: upload %s of %s: %s", upload_id, key, exc)
            return "failed", 0
        except bex.BotoCoreError as exc:
            log.debug("gc sweep: upload %s of %s: %s", upload_id, key, type(exc).__name__)
            return "failed", 0
        return "aborted", size

    try:
        pages = client.get_paginator("list_multipart_uploads").paginate(
            Bucket=bucket, Prefix=f"{store.prefix}/" if store.prefix else "")
        with ThreadPoolExecutor(THREADS, thread_name_prefix="graveler-upload-sweep") as pool:
            for page in pages:
                for what, size in pool.map(one, page.get("Uploads") or ()):
                    if what == "aborted":
                        res.files += 1
                        res.bytes += size
                    elif what == "failed":
                        res.failed += 1
    except (bex.ClientError, bex.BotoCoreError) as exc:  # the listing itself: what was done stays done
        log.debug("gc sweep: listing the multipart uploads of %s: %s", store.uri, type(exc).__name__)
        res.failed += 1
    return res


def _parts(client, bucket: str, key: str, upload_id: str) -> tuple[float, int]:
    """(when the newest part of the upload came, 0 if none; the bytes of its parts)."""
    last, size = 0.0, 0
    for page in client.get_paginator("list_parts").paginate(Bucket=bucket, Key=key, UploadId=upload_id):
        for part in page.get("Parts") or ():
            last = max(last, part["LastModified"].timestamp())
            size += int(part.get("Size") or 0)
    return last, size


def sweep_left_behind(store, cutoff: float, dry_run: bool = False,
                      min_age_s: float = TEMP_MIN_AGE_S) -> TempSweep | None:
    """What writers killed mid-write left in ``store``, last active before ``cutoff``: a local
    store's temp files removed (:func:`graveler.objstore.local_temp.sweep_temp_files`), an S3
    store's open uploads aborted (:func:`sweep_uploads`); None for a store that leaves neither."""
    from graveler.objstore.local import LocalStore
    from graveler.objstore.local_temp import sweep_temp_files
    from graveler.objstore.s3 import S3Store

    if isinstance(store, LocalStore):
        return sweep_temp_files(store.root, cutoff, dry_run, min_age_s=min_age_s)
    if isinstance(store, S3Store):
        return sweep_uploads(store, cutoff, dry_run, min_age_s=min_age_s)
    return None


__all__ = ["sweep_left_behind", "sweep_uploads"]

