"""Object store on S3 (or anything that speaks its API: MinIO, Ceph, moto...).

One boto3 client per store, built from the standard credential chain and a
``StoreConfig``; botocore retries throttling, 5xx and connection errors itself
("standard" or "adaptive" mode, ``max_attempts`` attempts in all).  Whatever
still fails is wrapped here, where it enters graveler:

  NoSuchKey / 404                                  -> NotFound
  NoSuchBucket, AccessDenied, InvalidAccessKeyId,
  SignatureDoesNotMatch, other 403s                -> StoreUnavailable (names the bucket/endpoint)
  connection refused, DNS, timeouts (after retries)-> StoreUnavailable (names the endpoint)
  missing credentials                              -> StoreUnavailable
  KeyTooLongError, bad parameters                  -> InvalidArgument
  anything else from S3                            -> StoreUnavailable (code and HTTP status)

A HEAD has no error body, so ``head`` of a key in a missing bucket is NotFound.
Messages name the endpoint and bucket, never credentials.

Large files move in parts: ``put_file`` uploads by multipart above
``multipart_threshold`` (parts of ``multipart_chunksize``, in parallel), and
``get_to_file`` downloads in ranged GETs of ``multipart_chunksize`` pinned to
the first response's ETag with ``If-Match``, so a file never mixes two versions.
"""

from __future__ import annotations

import email.utils
import hashlib
import http.client
import logging
import os
import re
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Iterator

import boto3
import botocore.config
import botocore.session
import botocore.exceptions as bex

from graveler.errors import CorruptedData, GravelerError, InvalidArgument, NotFound, StoreUnavailable
from graveler.objstore import s3_answers
from graveler.objstore.base import (ObjectInfo, ObjectStore, ObjectStream, StoreConfig, check_level_prefix, check_range,
                                    validate_key, validate_prefix)
from graveler.objstore.uri import S3, StorageURI

log = logging.getLogger(__name__)

_NOT_FOUND_CODES = frozenset({"NoSuchKey", "404", "NotFound"})
_ACCESS_CODES = frozenset({
    "AccessDenied", "403", "Forbidden", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
    "InvalidToken", "TokenRefreshRequired", "AllAccessDisabled", "AccountProblem", "InvalidSecurity",
})
_BAD_REQUEST_CODES = frozenset({"KeyTooLongError", "InvalidArgument", "EntityTooLarge", "InvalidObjectName"})
_CREDENTIAL_ERRORS = (
    bex.NoCredentialsError, bex.PartialCredentialsError, bex.CredentialRetrievalError,
    bex.ProfileNotFound, bex.NoAuthTokenError, bex.TokenRetrievalError,
)
# Failures while reading a response body: botocore's retries are over by then; we retry the GET.
# A body that fails botocore's response checksum (FlexibleChecksumError) is fetched again too; if
# every attempt fails it, the store's copy is damaged: CorruptedData.
_BODY_ERRORS = (bex.IncompleteReadError, bex.ResponseStreamingError, bex.ReadTimeoutError,
                bex.ConnectionClosedError, bex.FlexibleChecksumError)
# (as many body attempts as the store's --max-attempts: one read's bound is those attempts' timeouts)
# S3's bucket rules, with the legacy (us-east-1) upper case and underscores that botocore still accepts.
_BUCKET_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{1,61})[A-Za-z0-9]\Z")
_IO_CHUNK = 1 << 20
_MAX_PARTS = 10_000  # S3's limit on parts per multipart upload
_TMP_PREFIX = ".lakefuse-tmp-"  # same shape as the local store's temp files


_loader_lock = threading.Lock()
_shared_loader = None


def _new_session() -> boto3.session.Session:
    """A fresh boto3 session (its own credential resolution) sharing one botocore data loader.

    Parsing the S3 service model takes ~0.1 s per session; the loader only caches
    read-only JSON, so sessions may share it.
    """
    global _shared_loader
    with _loader_lock:
        core = botocore.session.Session()
        if _shared_loader is None:
            _shared_loader = core.get_component("data_loader")
        else:
            core.register_component("data_loader", _shared_loader)
        return boto3.session.Session(botocore_session=core)


class _ObjectChanged(Exception):
    """The object was replaced during a ranged download (If-Match failed)."""


def _userinfo(url: str | None) -> str | None:
    """The ``user:password@`` written in an endpoint URL (None: none)."""
    if not url or "://" not in url:
        return None
    netloc = url.split("://", 1)[1].split("/", 1)[0]
    return netloc.rsplit("@", 1)[0] + "@" if "@" in netloc else None


def _scrubbed(text: str, userinfo: str | None) -> str:
    return text.replace(userinfo, "***@") if userinfo else text


def _error_code(exc: bex.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _strip_etag(etag: str) -> str:
    return etag.strip('"')


def _response_time(resp: dict) -> float:
    """The server's clock from a write response (``Date`` header); S3 sets LastModified from it."""
    date = resp.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if date:
        try:
            return email.utils.parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError):
            pass
    return time.time()


def _range_total(resp: dict) -> int:
    """The object size from a ranged GET ("bytes 0-9/1234"), or the body length of a full one."""
    content_range = resp.get("ContentRange")
    if content_range and "/" in content_range:
        total = content_range.rpartition("/")[2]
        if total.isdigit():
            return int(total)
    return int(resp["ContentLength"])


def _check_range(store: "S3Store", key: str, resp: dict, start: int, length: int | None) -> None:
    """A ranged GET's answer is the range asked for: its Content-Range starts at ``start`` and ends
    where the range (or the object) does. A response without one is a server that ignored Range
    (it sent the whole object: the caller skips to ``start``). StoreUnavailable otherwise: a server
    or proxy answering another range (of the right length or not) would have its bytes served,
    and kept in the data cache, as the ones asked for; its body is closed then."""
    content_range = resp.get("ContentRange")
    if not content_range:
        return
    m = _CONTENT_RANGE.fullmatch(content_range.strip())
    if m is not None:
        first, last = int(m.group(1)), int(m.group(2))
        total = int(m.group(3)) if m.group(3) != "*" else None
        want_last = None if length is None else start + length - 1
        if total is not None and (want_last is None or want_last >= total):
            want_last = total - 1
        if first == start and (want_last is None or last == want_last):
            return
    resp["Body"].close()  # (refused: nothing more is read of it)
    asked = f"{start}-" if length is None else f"{start}-{start + length - 1}"
    raise StoreUnavailable(f"get_range {store.full_uri(key)}: asked for bytes {asked}, the store answered "
                           f"Content-Range {content_range!r}")


_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")


class _EmptyStream(ObjectStream):
    def __init__(self, total: int):  # noqa: super().__init__ would ask the store again
        self.total = total

    def read(self, n: int) -> bytes:
        return b""

    def close(self) -> None:
        pass


class _S3Stream(ObjectStream):
    """The body of one ranged GET, read as asked; errors of the body are the store's."""

    def __init__(self, store: "S3Store", key: str, resp: dict, start: int, length: int | None):
        self.store, self.key = store, key
        self.total = _range_total(resp)
        self._body = resp["Body"]
        self._left = None if length is None else length
        self._fp = None
        if not resp.get("ContentRange") and start:  # a server that ignored Range sent it all: skip to start
            self._skip(start)
        else:
            _check_range(store, key, resp, start, length)
        self._fp = self._plain_fp()

    def _skip(self, n: int) -> None:
        while n > 0:
            piece = self._raw(min(n, _IO_CHUNK))
            if not piece:
                return
            n -= len(piece)

    def _raw(self, n: int) -> bytes:
        try:
            return self._body.read(n)
        except _BODY_ERRORS as exc:
            raise self.store._map(exc, "get_range", self.key) from exc
        except (bex.BotoCoreError, OSError) as exc:
            raise self._broke_off(exc) from exc

    def read(self, n: int) -> bytes:
        if self._left is not None:
            n = min(n, self._left)
        if n <= 0:
            return b""
        data = self._raw(n)
        if self._left is not None:
            self._left -= len(data)
        return data

    def readinto(self, buf) -> int:
        """Up to ``len(buf)`` bytes received straight into ``buf`` (no bytes object on the way: the
        socket's bytes land in the caller's buffer); 0 at the end of the range."""
        fp = self._fp
        if fp is None:  # not a plain http.client body: through botocore (a copy)
            return super().readinto(buf)
        view = memoryview(buf)[:self._left]  # (a plain body has a known length: _plain_fp)
        if not view:
            return 0
        try:
            n = fp.readinto(view)
        except (OSError, http.client.HTTPException) as exc:  # (TimeoutError is an OSError)
            raise self._broke_off(exc) from exc
        self._left -= n
        if self._left == 0 and fp.isclosed():
            self._release()  # read to its end: the connection goes back to botocore's pool
        return n

    def _plain_fp(self):
        """The ``http.client`` response under botocore's and urllib3's wrappers when reading it
        directly skips no check: a body of known length (every stream's), without content
        decoding or chunked transfer. botocore's response checksum (a CRC32 of every byte, when
        the server sends one -- moto does, for the whole object, on a ranged GET too) is not
        computed then: botocore compares it only on a read past the body's end, which a read of
        a range to its length never makes, so it never checked a stream. Else None."""
        body = self._body
        raw = getattr(body, "_raw_stream", None)
        if raw is None:
            return None
        fp = getattr(raw, "_fp", None)
        if not isinstance(fp, http.client.HTTPResponse) or fp.chunked or self._left is None:
            return None
        if raw.headers.get("content-encoding", "identity").lower() not in ("", "identity"):
            return None
        if len(getattr(raw, "_decoded_buffer", ())):  # bytes urllib3 holds already (none after a skip)
            return None
        return fp

    def _release(self) -> None:
        release = getattr(getattr(self._body, "_raw_stream", None), "release_conn", None)
        if release is not None:
            try:
                release()
            except Exception:  # a connection not put back is closed with the body: no harm
                pass

    def _broke_off(self, exc: BaseException) -> GravelerError:
        if isinstance(exc, TimeoutError):
            return StoreUnavailable(
                f"get_range {self.store.full_uri(self.key)}: S3 endpoint {self.store._endpoint} did not answer "
                f"within {self.store.config.read_timeout:g} s (see --timeout / $LAKEFUSE_S3_READ_TIMEOUT)")
        return StoreUnavailable(f"get_range {self.store.full_uri(self.key)}: the response broke off "
                                f"({type(exc).__name__})")

    def close(self) -> None:
        try:
            self._body.close()
        except Exception:  # closing a broken connection: nothing to keep from it
            pass


class S3Store(ObjectStore):
    """An ``ObjectStore`` on ``s3://bucket[/prefix]``."""

    def __init__(self, bucket: str, prefix: str = "", config: StoreConfig | None = None):
        if not _BUCKET_NAME.match(bucket or ""):
            raise InvalidArgument(f"bad S3 bucket name {bucket!r}: expected 3-63 characters a-z, 0-9, '.' and '-' "
                                  "(legacy buckets: also A-Z and '_'), starting and ending with a letter or digit")
        prefix = prefix.strip("/")
        if prefix:
            try:
                validate_key(prefix)
            except InvalidArgument as exc:
                raise InvalidArgument(f"bad S3 store prefix {prefix!r}: {exc}") from exc
        self.bucket = bucket
        self.prefix = prefix
        self._root_uri = StorageURI(S3, bucket, prefix)
        self.uri = str(self._root_uri)
        self.config = config or StoreConfig()
        cfg = self.config
        client_config = botocore.config.Config(
            region_name=cfg.region,
            connect_timeout=cfg.connect_timeout,
            read_timeout=cfg.read_timeout,
            retries={"mode": cfg.retry_mode, "total_max_attempts": cfg.max_attempts},
            max_pool_connections=max(cfg.max_pool_connections, cfg.transfer_concurrency),
            s3={"addressing_style": cfg.effective_addressing_style},
            user_agent_appid="lakefuse",
        )
        try:
            session = _new_session()
            self._client = session.client("s3", endpoint_url=cfg.s3_endpoint_url, config=client_config)
            s3_answers.install(self._client)  # (an answer cut short inside its headers: retried, then StoreUnavailable)
        except ValueError as exc:  # a malformed endpoint URL
            raise InvalidArgument(_scrubbed(f"bad S3 endpoint URL {cfg.s3_endpoint_url!r}: {exc}",
                                            _userinfo(cfg.s3_endpoint_url))) from exc
        except bex.BotoCoreError as exc:
            raise StoreUnavailable(f"cannot set up an S3 client for {self.uri}: {type(exc).__name__}") from exc
        # how messages name the endpoint: a user and password written in its URL never shown
        self._userinfo = _userinfo(self._client.meta.endpoint_url)
        self._endpoint = _scrubbed(self._client.meta.endpoint_url, self._userinfo)
        self._fewer: dict[int, S3Store] = {}  # attempts -> this store with that many (after_stall)
        self._unaborted: list[tuple[str, str]] = []  # multipart uploads a failed abort left (_abort_upload)
        self._unaborted_lock = threading.Lock()
        self._part_checksums = self._client.meta.config.request_checksum_calculation == "when_supported"
        log.debug("opened %s at %s", self.uri, self._endpoint)

    # -- keys and errors -------------------------------------------------------------------

    def _k(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def full_uri(self, key: str) -> str:
        validate_key(key)
        return self._root_uri.object_uri(key)

    def _map(self, exc: Exception, op: str, key: str | None) -> GravelerError:
        err = self._map_raw(exc, op, key)
        if self._userinfo and any(isinstance(a, str) and self._userinfo in a for a in err.args):
            # (botocore's own text names the URL it asked, user and password included)
            err.args = tuple(_scrubbed(a, self._userinfo) if isinstance(a, str) else a for a in err.args)
        return err

    def _map_raw(self, exc: Exception, op: str, key: str | None) -> GravelerError:
        target = self.full_uri(key) if key is not None else self.uri
        what = f"{op} {target}"
        if isinstance(exc, bex.ClientError):
            code = _error_code(exc)
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            message = exc.response.get("Error", {}).get("Message", "")
            if code in _NOT_FOUND_CODES:
                return NotFound(f"{target} not found")
            if code == "NoSuchBucket":
                return StoreUnavailable(f"{what}: bucket {self.bucket!r} does not exist at {self._endpoint}")
            if code in _ACCESS_CODES or status == 403:
                return StoreUnavailable(
                    f"{what}: access denied by {self._endpoint} ({code}); "
                    "check the credentials and the bucket's policy"
                )
            if code in _BAD_REQUEST_CODES:
                return InvalidArgument(f"{what}: {code}: {message}")
            return StoreUnavailable(f"{what}: S3 error {code} (HTTP {status}) from {self._endpoint}: {message}")
        if isinstance(exc, _CREDENTIAL_ERRORS):
            return StoreUnavailable(
                f"{what}: no usable AWS credentials ({type(exc).__name__}); set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or run with an instance/pod role"
            )
        if isinstance(exc, bex.FlexibleChecksumError):
            return CorruptedData(f"{what}: the object's content fails its S3 checksum ({exc})", target)
        if isinstance(exc, (bex.ReadTimeoutError, bex.ConnectTimeoutError)):
            limit = self.config.read_timeout if isinstance(exc, bex.ReadTimeoutError) else self.config.connect_timeout
            return StoreUnavailable(
                f"{what}: S3 endpoint {self._endpoint} did not answer within {limit:g} s "
                f"({self.config.max_attempts} attempt(s); see --timeout / $LAKEFUSE_S3_READ_TIMEOUT)"
            )
        if isinstance(exc, s3_answers.CutShortRetried):  # (retried, cut again each time)
            return StoreUnavailable(f"{what}: {exc} ({self.config.max_attempts} attempt(s))")
        if isinstance(exc, (bex.ConnectionError, bex.HTTPClientError)):
            return StoreUnavailable(
                f"{what}: S3 endpoint {self._endpoint} unreachable after {self.config.max_attempts} "
                f"attempt(s) ({type(exc).__name__}: {exc})"
            )
        if isinstance(exc, bex.ParamValidationError):
            return InvalidArgument(f"{what}: {' '.join(str(exc).split())}")  # one line
        return StoreUnavailable(f"{what}: {type(exc).__name__}: {exc}")

    @contextmanager
    def _errors(self, op: str, key: str | None):
        try:
            yield
        except (bex.ClientError, bex.BotoCoreError) as exc:
            raise self._map(exc, op, key) from exc

    # -- reads -----------------------------------------------------------------------------

    def _get_object(self, op: str, key: str, **kwargs) -> tuple[dict | None, bytes]:
        """One GET with its body read whole, retried on body errors; (None, b"") for a 416."""
        k = self._k(key)
        attempts = max(1, self.config.max_attempts)
        for attempt in range(1, attempts + 1):
            try:
                resp = self._client.get_object(Bucket=self.bucket, Key=k, **kwargs)
            except bex.ClientError as exc:
                if "Range" in kwargs and _error_code(exc) == "InvalidRange":
                    return None, b""
                raise self._map(exc, op, key) from exc
            except bex.BotoCoreError as exc:
                raise self._map(exc, op, key) from exc
            body = resp["Body"]
            try:
                return resp, body.read()
            except _BODY_ERRORS as exc:
                if attempt == attempts:
                    raise self._map(exc, op, key) from exc
                log.debug("%s %s: body read failed (%s), retrying", op, k, type(exc).__name__)
            finally:
                body.close()
        raise AssertionError("unreachable")

    def get(self, key: str) -> bytes:
        return self._get_object("get", key)[1]

    def get_range(self, key: str, start: int, length: int) -> bytes:
        check_range(start, length)
        if length == 0:
            self.head(key)  # still NotFound for a missing key
            return b""
        resp, data = self._get_object("get_range", key, Range=f"bytes={start}-{start + length - 1}")
        if resp is not None and not resp.get("ContentRange"):
            data = data[start:start + length]  # a server that ignored Range sent it all
        elif resp is not None:
            _check_range(self, key, resp, start, length)
        return data

    def get_range_sized(self, key: str, start: int, length: int) -> tuple[bytes, int]:
        check_range(start, length)
        if length == 0:
            return b"", self.head(key).size
        resp, data = self._get_object("get_range", key, Range=f"bytes={start}-{start + length - 1}")
        if resp is None:  # 416: the object ends before ``start``
            return b"", self.head(key).size
        if not resp.get("ContentRange"):
            data = data[start:start + length]  # a server that ignored Range sent it all
        else:
            _check_range(self, key, resp, start, length)
        return data, _range_total(resp)

    def open_stream(self, key: str, start: int = 0, length: int | None = None) -> ObjectStream:
        """One GET for the whole range, its body read as the caller asks (see :class:`ObjectStream`):
        what a sequential reader keeps open instead of one request per piece."""
        check_range(start, 0 if length is None else length)
        if length == 0:
            return _EmptyStream(self.head(key).size)
        rng = f"bytes={start}-" if length is None else f"bytes={start}-{start + length - 1}"
        try:
            resp = self._client.get_object(Bucket=self.bucket, Key=self._k(key), Range=rng)
        except bex.ClientError as exc:
            if _error_code(exc) == "InvalidRange":  # the object ends before ``start``
                return _EmptyStream(self.head(key).size)
            raise self._map(exc, "get_range", key) from exc
        except bex.BotoCoreError as exc:
            raise self._map(exc, "get_range", key) from exc
        return _S3Stream(self, key, resp, start, length)

    def after_stall(self, stalls: int = 1) -> "S3Store | None":
        n = self.config.max_attempts - stalls
        if n < 1:
            return None
        fewer = self._fewer.get(n)
        if fewer is None:  # (two threads may make one each: either serves)
            fewer = self._fewer[n] = S3Store(self.bucket, self.prefix, self.config.with_timeout(None, n))
        return fewer

    def head(self, key: str) -> ObjectInfo:
        with self._errors("head", key):
            resp = self._client.head_object(Bucket=self.bucket, Key=self._k(key))
        return ObjectInfo(key, int(resp["ContentLength"]), resp["LastModified"].timestamp(),
                          _strip_etag(resp["ETag"]))

    def get_to_file(self, key: str, path: str) -> ObjectInfo:
        self._k(key)
        dest = os.path.abspath(path)
        attempts = max(1, self.config.max_attempts)
        for attempt in range(1, attempts + 1):
            tmp = os.path.join(os.path.dirname(dest), _TMP_PREFIX + uuid.uuid4().hex)
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
            except OSError as exc:
                raise InvalidArgument(f"cannot write destination file {path!r}: {exc.strerror or exc}") from exc
            try:
                try:
                    info = self._download(key, fd)
                finally:
                    os.close(fd)
                os.replace(tmp, dest)
                return info
            except (_ObjectChanged, *_BODY_ERRORS) as exc:
                _unlink_quietly(tmp)
                if attempt == attempts:
                    if isinstance(exc, _ObjectChanged):
                        raise StoreUnavailable(
                            f"get_to_file {self.full_uri(key)}: the object kept changing during the download"
                        ) from exc
                    raise self._map(exc, "get_to_file", key) from exc
                log.debug("get_to_file %s: %s, starting over", key, type(exc).__name__)
            except BaseException as exc:
                _unlink_quietly(tmp)
                if isinstance(exc, OSError):
                    raise StoreUnavailable(
                        f"get_to_file {self.full_uri(key)}: writing {path!r} failed: {exc.strerror or exc}"
                    ) from exc
                raise
        raise AssertionError("unreachable")

    def _download(self, key: str, fd: int) -> ObjectInfo:
        """Fill ``fd``: the first part tells size and ETag, the others follow in parallel."""
        k = self._k(key)
        chunk = self.config.multipart_chunksize
        try:
            resp = self._client.get_object(Bucket=self.bucket, Key=k, Range=f"bytes=0-{chunk - 1}")
        except bex.ClientError as exc:
            if _error_code(exc) != "InvalidRange":
                raise self._map(exc, "get_to_file", key) from exc
            info = self.head(key)  # 416 on bytes=0-: the object is empty
            if info.size != 0:
                raise _ObjectChanged() from exc
            return info
        except bex.BotoCoreError as exc:
            raise self._map(exc, "get_to_file", key) from exc
        _check_range(self, key, resp, 0, chunk)
        total = _range_total(resp)
        etag = resp["ETag"]
        self._write_body(resp["Body"], fd, 0)
        ranges = []
        if resp.get("ContentRange"):  # else the server ignored Range and sent it all
            ranges = [(off, min(off + chunk, total) - 1) for off in range(chunk, total, chunk)]
        if ranges:
            def fetch(r: tuple[int, int]) -> None:
                try:
                    part = self._client.get_object(Bucket=self.bucket, Key=k, Range=f"bytes={r[0]}-{r[1]}",
                                                   IfMatch=etag)
                except bex.ClientError as exc:
                    if _error_code(exc) in ("PreconditionFailed", "412"):
                        raise _ObjectChanged() from exc
                    raise self._map(exc, "get_to_file", key) from exc
                except bex.BotoCoreError as exc:
                    raise self._map(exc, "get_to_file", key) from exc
                _check_range(self, key, part, r[0], r[1] - r[0] + 1)
                self._write_body(part["Body"], fd, r[0])

            self._run_parallel(fetch, ranges, "s3-download")
        log.debug("downloaded %s (%d bytes, %d parts)", k, total, len(ranges) + 1)
        return ObjectInfo(key, total, resp["LastModified"].timestamp(), _strip_etag(etag))

    @staticmethod
    def _write_body(body, fd: int, offset: int) -> None:
        try:
            for piece in body.iter_chunks(_IO_CHUNK):
                view = memoryview(piece)
                while view:
                    n = os.pwrite(fd, view, offset)
                    view = view[n:]
                    offset += n
        finally:
            body.close()

    def _run_parallel(self, fn, items: list, name: str) -> list:
        """``fn`` over ``items`` on up to transfer_concurrency threads; the first error cancels the rest."""
        workers = min(self.config.transfer_concurrency, len(items))
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        try:
            futures = [pool.submit(fn, item) for item in items]
            return [f.result() for f in futures]
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    # -- writes ----------------------------------------------------------------------------

    def put(self, key: str, data: bytes) -> ObjectInfo:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidArgument(f"object data must be bytes-like, not {type(data).__name__}")
        k = self._k(key)
        body = bytes(data)
        with self._errors("put", key):
            resp = self._client.put_object(Bucket=self.bucket, Key=k, Body=body)
        self._check_stored("put", key, resp, body)
        log.debug("put %s (%d bytes)", k, len(data))
        self._abort_unaborted()
        return ObjectInfo(key, len(data), _response_time(resp), _strip_etag(resp["ETag"]))

    def put_file(self, key: str, path: str, md5: str | None = None) -> ObjectInfo:
        k = self._k(key)
        try:
            f = open(path, "rb")
            size = os.fstat(f.fileno()).st_size
        except OSError as exc:
            raise InvalidArgument(f"cannot read source file {path!r}: {exc.strerror or exc}") from exc
        with f:
            if size < self.config.multipart_threshold:
                if md5 is None:  # (for _check_stored: the caller's, else one pass now)
                    try:
                        md5 = hashlib.file_digest(f, lambda: hashlib.md5(usedforsecurity=False)).hexdigest()
                        f.seek(0)
                    except OSError as exc:
                        raise InvalidArgument(f"cannot read source file {path!r}: {exc.strerror or exc}") from exc
                with self._errors("put_file", key):
                    resp = self._client.put_object(Bucket=self.bucket, Key=k, Body=f)
                self._check_stored("put_file", key, resp, sent=md5)
                log.debug("put_file %s (%d bytes)", k, size)
                self._abort_unaborted()
                return ObjectInfo(key, size, _response_time(resp), _strip_etag(resp["ETag"]))
            return self._multipart_upload(key, f.fileno(), size)

    def _multipart_upload(self, key: str, fd: int, size: int) -> ObjectInfo:
        k = self._k(key)
        chunk = max(self.config.multipart_chunksize, -(-size // _MAX_PARTS))
        nparts = -(-size // chunk)
        # Mirror s3transfer: with botocore's default checksums the upload is CRC32 end to end.
        extra = {"ChecksumAlgorithm": "CRC32"} if self._part_checksums else {}
        with self._errors("put_file", key):
            upload_id = self._client.create_multipart_upload(Bucket=self.bucket, Key=k, **extra)["UploadId"]
        try:
            def send(number: int) -> dict:
                offset = (number - 1) * chunk
                body = os.pread(fd, min(chunk, size - offset), offset)
                with self._errors("put_file", key):
                    r = self._client.upload_part(Bucket=self.bucket, Key=k, UploadId=upload_id,
                                                 PartNumber=number, Body=body, **extra)
                self._check_stored("put_file", key, r, body, part=number)
                part = {"PartNumber": number, "ETag": r["ETag"]}
                if extra and "ChecksumCRC32" in r:
                    part["ChecksumCRC32"] = r["ChecksumCRC32"]
                return part

            parts = self._run_parallel(send, list(range(1, nparts + 1)), "s3-upload")
            try:
                with self._errors("put_file", key):
                    resp = self._client.complete_multipart_upload(
                        Bucket=self.bucket, Key=k, UploadId=upload_id, MultipartUpload={"Parts": parts})
            except GravelerError:  # (its answer lost: s3_answers.completed_anyway)
                if (resp := s3_answers.completed_anyway(self._client, self.bucket, k, parts, size)) is None:
                    raise
        except BaseException:
            self._abort_upload(k, upload_id)
            raise
        log.debug("put_file %s (%d bytes, %d parts)", k, size, nparts)
        self._abort_unaborted()
        return ObjectInfo(key, size, _response_time(resp), _strip_etag(resp["ETag"]))

    def _check_stored(self, op: str, key: str, resp: dict, body: bytes = b"", part: int | None = None,
                      sent: str | None = None) -> None:
        """The store kept the bytes sent: the ETag a PUT (or a part's upload) answers is the MD5 of
        what the store kept, where it is a plain MD5 -- not under SSE-KMS or SSE-C, whose ETags are
        not, nor a store whose ETag has another shape. A body damaged on the way (a store that
        checks no checksum of it, as moto does not) otherwise made an upload, or a commit's
        tables, succeed with its data gone. StoreUnavailable (the caller's retry sends it again);
        a whole object so kept is deleted."""
        from graveler.objects import is_md5_etag, md5_hex  # (lazily: graveler.objects imports the store package)

        etag = _strip_etag(resp.get("ETag", "")).lower()
        if (not is_md5_etag(etag) or resp.get("SSECustomerAlgorithm")
                or resp.get("ServerSideEncryption") == "aws:kms"):
            return
        if sent is None:
            sent = md5_hex(body)
        if sent == etag:
            return
        if part is None:
            try:
                self._client.delete_object(Bucket=self.bucket, Key=self._k(key))
            except Exception as exc:  # the object is unreferenced either way (GC sweeps it)
                log.debug("deleting %s after a damaged upload: %s", key, exc)
        where = f" (part {part})" if part is not None else ""
        raise StoreUnavailable(f"{op} {self.full_uri(key)}{where}: the store kept other bytes than were sent "
                               f"(its ETag {etag}, the MD5 sent {sent}): damaged on the way, or the file changed "
                               "while it was sent")

    def _abort_upload(self, k: str, upload_id: str) -> None:
        """Abort a multipart upload (its parts are billed until then); one the store did not take
        (it is down: why the upload failed) is tried again after the next upload that succeeds."""
        try:
            self._client.abort_multipart_upload(Bucket=self.bucket, Key=k, UploadId=upload_id)
        except bex.ClientError as exc:
            if _error_code(exc) != "NoSuchUpload":
                self._keep_unaborted(k, upload_id, exc)
        except bex.BotoCoreError as exc:
            self._keep_unaborted(k, upload_id, exc)

    def _keep_unaborted(self, k: str, upload_id: str, exc: BaseException) -> None:
        log.warning("could not abort multipart upload %s of %s (%s): tried again after the next upload",
                    upload_id, k, type(exc).__name__)
        with self._unaborted_lock:
            if len(self._unaborted) < 1000:
                self._unaborted.append((k, upload_id))

    def _abort_unaborted(self) -> None:
        """After an upload that succeeded (the store answers again): abort what failed aborts left."""
        if self._unaborted:
            with self._unaborted_lock:
                left, self._unaborted = self._unaborted, []
            for k, upload_id in left:
                self._abort_upload(k, upload_id)

    def delete(self, key: str) -> None:
        with self._errors("delete", key):
            self._client.delete_object(Bucket=self.bucket, Key=self._k(key))

    # -- listing ---------------------------------------------------------------------------

    def list(self, prefix: str = "", start_after: str = "") -> Iterator[ObjectInfo]:
        validate_prefix(prefix)
        validate_prefix(start_after, "start_after")
        return self._list(prefix, start_after)

    def _list(self, prefix: str, start_after: str) -> Iterator[ObjectInfo]:
        root = f"{self.prefix}/" if self.prefix else ""
        kwargs = {"Bucket": self.bucket, "Prefix": root + prefix}
        if start_after:
            kwargs["StartAfter"] = root + start_after
        with self._errors("list", None):
            pages = iter(self._client.get_paginator("list_objects_v2").paginate(**kwargs))
        while True:
            with self._errors("list", None):
                page = next(pages, None)
            if page is None:
                return
            for obj in page.get("Contents", ()):
                key = obj["Key"][len(root):]
                if key:  # skip a "prefix/" folder marker
                    yield ObjectInfo(key, int(obj["Size"]), obj["LastModified"].timestamp(),
                                     _strip_etag(obj["ETag"]))

    def list_level(self, prefix: str = "") -> tuple[list[ObjectInfo], list[str]]:
        objs, subs, _ = self.list_level_counted(prefix)
        return objs, subs

    def list_level_counted(self, prefix: str = "") -> tuple[list[ObjectInfo], list[str], int]:
        check_level_prefix(prefix)
        root = f"{self.prefix}/" if self.prefix else ""
        objs: list[ObjectInfo] = []
        subs: list[str] = []
        skipped = 0
        with self._errors("list", None):
            for page in self._client.get_paginator("list_objects_v2").paginate(
                    Bucket=self.bucket, Prefix=root + prefix, Delimiter="/"):
                for obj in page.get("Contents", ()):
                    key = obj["Key"][len(root):]
                    if key and not key.endswith("/"):
                        objs.append(ObjectInfo(key, int(obj["Size"]), obj["LastModified"].timestamp(),
                                               _strip_etag(obj["ETag"])))
                    else:
                        skipped += 1  # a folder marker
                for cp in page.get("CommonPrefixes", ()):
                    sub = cp["Prefix"][len(root):]
                    if sub != prefix + "/":
                        subs.append(sub)
                    else:  # "a//b" keys: no valid key lives there -- counted, not listed further
                        for odd in self._client.get_paginator("list_objects_v2").paginate(
                                Bucket=self.bucket, Prefix=cp["Prefix"]):
                            skipped += int(odd.get("KeyCount", len(odd.get("Contents", ()))))
        return objs, subs, skipped

    def delete_many(self, keys: list[str]) -> list[tuple[str, str]]:
        for k in keys:
            validate_key(k)
        failed: list[tuple[str, str]] = []
        for i in range(0, len(keys), 1000):
            chunk = keys[i : i + 1000]
            with self._errors("delete", None):
                resp = self._client.delete_objects(
                    Bucket=self.bucket, Delete={"Objects": [{"Key": self._k(k)} for k in chunk], "Quiet": True})
            root = f"{self.prefix}/" if self.prefix else ""
            for err in resp.get("Errors", ()):
                failed.append((err.get("Key", "")[len(root):], f"{err.get('Code')}: {err.get('Message')}"))
        return failed

    def check_namespace(self) -> None:
        """The bucket must exist and be ours to write (HEAD bucket, then the probe object of
        :meth:`ObjectStore.check_namespace`); a missing bucket is ``InvalidArgument``."""
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except bex.ClientError as exc:
            if _error_code(exc) in ("404", "NoSuchBucket", "NotFound"):
                raise InvalidArgument(f"storage namespace {self.uri}: bucket {self.bucket!r} does not exist "
                                      f"at {self._endpoint}") from exc
            raise self._map(exc, "check", None) from exc
        except bex.BotoCoreError as exc:
            raise self._map(exc, "check", None) from exc
        super().check_namespace()

    def close(self) -> None:
        for fewer in list(self._fewer.values()):  # (after_stall's clients)
            fewer.close()
        self._client.close()
