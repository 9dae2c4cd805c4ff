"""S3 answers cut short inside their headers: refused before botocore reads them, and retried.

When a connection closes in the middle of a response's headers, Python's HTTP client takes
the end of the connection for the end of the headers, and for the end of a body whose length
nothing stated: botocore then parses a "200" that has no ETag (a PUT "succeeded" with no
etag), no Content-Length (a GET of an empty body) or an empty listing. :func:`install` makes a
client send through a check that refuses such an answer as :class:`CutShortRetried` -- a
connection error to botocore, which retries it as it retries a reset (the store's
``max_attempts`` in all) -- and, after the last attempt, the store maps it to StoreUnavailable
("cut short"): a mount's failed save is kept and retried, a command fails with exit 6, never
a traceback or a wrong result. A request that may not be sent twice (completing a multipart
upload: the first may have done it) is refused at once (:class:`CutShort`, not retried).
The check asks only what S3 always sends: a successful answer with a body states its length
(Content-Length, or chunked transfer encoding), and a body read whole is as long as it says
(else a listing cut before its body parses as an empty one); a HEAD or a GET of an object
states its ETag and Last-Modified (a HEAD its Content-Length, the object's size, too); a PUT of
an object or a part states its ETag.
"""

from __future__ import annotations

import logging
import time

import botocore.exceptions as bex

log = logging.getLogger("graveler.objstore.s3")

_ETAG_IN_HEADERS = frozenset({"PutObject", "UploadPart", "HeadObject", "GetObject"})
_DATED = frozenset({"HeadObject", "GetObject"})  # (an object's Last-Modified)
_ONCE = frozenset({"CompleteMultipartUpload"})  # (sent again after it took effect, it fails: NoSuchUpload)


class CutShort(bex.BotoCoreError):
    fmt = "the S3 endpoint's answer to {operation} was cut short ({what}): the connection closed early"


class CutShortRetried(bex.ConnectionClosedError):
    """A cut answer botocore retries (a ConnectionClosedError, as a reset connection is)."""

    fmt = "the S3 endpoint's answer to {operation} was cut short ({what}): the connection closed early"


def what_is_missing(status: int, headers, body, operation: str, head: bool) -> str | None:
    """Why a successful answer is cut short (see the module docstring), or None: a whole answer
    or an error (errors are botocore's to read). ``headers``: case-insensitive; ``body``: the
    bytes read whole, or None (a streamed body: botocore checks its length as it is read)."""
    if not 200 <= status < 300 or status == 204:
        return None  # (204 has no body)
    missing = []
    if head:  # (its Content-Length is the object's, no body's)
        if operation == "HeadObject" and "content-length" not in headers:  # (the object's size)
            missing.append("Content-Length")
    elif "content-length" not in headers and "transfer-encoding" not in headers:
        missing.append("Content-Length")
    if operation in _ETAG_IN_HEADERS and "etag" not in headers:
        missing.append("ETag")
    if operation in _DATED and "last-modified" not in headers:
        missing.append("Last-Modified")
    if missing:
        return "no " + " and no ".join(missing)
    if not head and isinstance(body, (bytes, bytearray)) and "content-encoding" not in headers:
        stated = headers.get("content-length")
        if stated is not None and stated.isdigit() and len(body) != int(stated):
            # (a listing of 503 bytes whose body never came parsed as an empty listing)
            return f"{len(body)} of its {int(stated)} bytes"
    return None


def install(client) -> None:
    """Send every request of ``client`` (an S3 client) through the check: botocore's
    ``before-send`` event, answered with the response of the client's own HTTP session (what
    the endpoint would have sent it with), so that a refusal is a send's failure, which
    botocore's retry handler sees."""
    http = client._endpoint.http_session  # (botocore's: the endpoint's _send is this session's send)

    def send_checked(request, event_name: str, **_):
        operation = event_name.rpartition(".")[2]
        response = http.send(request)
        body = None if request.stream_output else response.content
        what = what_is_missing(response.status_code, response.headers, body, operation, request.method == "HEAD")
        if what is not None:
            if request.stream_output:
                response.raw.close()  # (its connection ended with the cut)
            if operation in _ONCE:
                raise CutShort(operation=operation, what=what)
            raise CutShortRetried(operation=operation, what=what, endpoint_url=request.url)
        return response

    client.meta.events.register_last("before-send.s3", send_checked)


def completed_anyway(client, bucket: str, k: str, parts: list[dict], size: int, tries: int = 4) -> dict | None:
    """The HEAD of key ``k`` if it is the object a multipart upload of ``parts`` (``size`` bytes)
    made -- its ETag the MD5 of the parts' MD5s, ``-<parts>`` -- asked up to ``tries`` times a
    second apart (a first completion may still be assembling it); None if it is not there so, or
    the store does not answer (no more waiting: the upload's failure stands). A completion whose
    answer was lost (botocore sends one that did not come in time again, and the store refuses the
    second: NoSuchUpload) is the caller's success then."""
    import hashlib

    try:
        digests = b"".join(bytes.fromhex(p["ETag"].strip('"')) for p in parts)
    except ValueError:
        return None  # (parts whose ETags are no MD5s: nothing to compare)
    want = f"{hashlib.md5(digests).hexdigest()}-{len(parts)}"
    for attempt in range(tries):
        if attempt:
            time.sleep(1.0)
        try:
            head = client.head_object(Bucket=bucket, Key=k)
        except bex.ClientError:
            continue  # (not there, yet)
        except bex.BotoCoreError:
            return None
        if head.get("ETag", "").strip('"') == want and head.get("ContentLength") == size:
            log.info("put_file %s: the completion's answer was lost; the object is there", k)
            return head
    return None


__all__ = ["CutShort", "CutShortRetried", "completed_anyway", "install", "what_is_missing"]
