"""S3 answers cut short inside their headers: refused before botocore reads them.

When a connection closes in the middle of a response's headers, Python's HTTP client takes
the end of the connection for the end of the headers, and for the end of a body whose length
nothing stated: botocore then parses a "200" that has no ETag (a PUT "succeeded" with no
etag), no Content-Length (a GET of an empty body) or an empty listing. :func:`install` adds a
check to a client that refuses such an answer as :class:`CutShort` (a BotoCoreError: the
store maps it to StoreUnavailable, so a mount's failed save is kept and retried, and a command
fails with exit 6, never a traceback or a wrong result). The check asks only what S3 always
sends: a successful answer with a body states its length (Content-Length, or chunked transfer
encoding), and a body read whole is as long as it says (else a listing cut before its body
parses as an empty one); a HEAD or a GET of an object states its ETag and Last-Modified (a
HEAD its Content-Length, the object's size, too); a PUT of an object or a part states its ETag.
"""

from __future__ import annotations

import botocore.exceptions as bex

_ETAG_IN_HEADERS = frozenset({"PutObject", "UploadPart", "HeadObject", "GetObject"})
_DATED = frozenset({"HeadObject", "GetObject"})  # (an object's Last-Modified)


class CutShort(bex.BotoCoreError):
    fmt = "the S3 endpoint's answer to {operation} was cut short ({what}): the connection closed early"


def check_answer(response_dict: dict, operation_model, **_) -> None:
    """botocore's ``before-parse`` event: CutShort for a successful answer missing what every
    S3 answer of its kind has (see the module docstring)."""
    status = response_dict.get("status_code", 0)
    if not 200 <= status < 300 or status == 204:
        return  # (errors are botocore's to read; 204 has no body)
    headers = response_dict.get("headers") or {}
    name = operation_model.name
    head = operation_model.http.get("method") == "HEAD"  # (its Content-Length is the object's, no body's)
    missing = []
    if head:
        if name == "HeadObject" and "content-length" not in headers:  # (the object's size)
            missing.append("Content-Length")
    elif "content-length" not in headers and "transfer-encoding" not in headers:
        missing.append("Content-Length")
    if name in _ETAG_IN_HEADERS and "etag" not in headers:
        missing.append("ETag")
    if name in _DATED and "last-modified" not in headers:
        missing.append("Last-Modified")
    if missing:
        raise CutShort(operation=name, what="no " + " and no ".join(missing))
    body = response_dict.get("body")
    if not head and isinstance(body, (bytes, bytearray)) and "content-encoding" not in headers:  # (read whole)
        stated = headers.get("content-length")
        if stated is not None and stated.isdigit() and len(body) != int(stated):
            # (a listing of 503 bytes whose body never came parsed as an empty listing)
            raise CutShort(operation=name, what=f"{len(body)} of its {int(stated)} bytes")


def install(client) -> None:
    """Check every answer ``client`` (an S3 client) parses."""
    client.meta.events.register("before-parse.s3", check_answer)


__all__ = ["CutShort", "check_answer", "install"]
