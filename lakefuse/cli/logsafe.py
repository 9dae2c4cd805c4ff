"""Credentials never reach a log line: a filter on every handler the CLI and the daemon set up.

``-vv`` turns on botocore's debug log, which prints each request's headers: the session token
(``X-Amz-Security-Token``) and the access key ID (``Authorization: ... Credential=AKIA...``) went
into the mount's log file and onto stderr. The filter blanks those fields, any value of the
AWS credentials in the environment, and the user and password of any URL (an S3 endpoint written
``http://user:password@host``, which botocore's debug lines print), wherever a message holds them.
"""

from __future__ import annotations

import logging
import os
import re

# a secret's value runs to a quote, a space, a comma, "}" or "&" -- a session token or a secret
# key holds "/" and "+" (base64); the access key ID of "Credential=" ends at the "/" of its scope
_FIELDS = re.compile(
    r"((?:X-Amz-Security-Token|x-amz-security-token|Signature|aws_secret_access_key|"
    r"aws_session_token|SecretAccessKey|SessionToken)['\"]?\s*[:=]\s*b?['\"]?)[^'\"\s,}&]+"
    r"|(Credential['\"]?\s*[:=]\s*b?['\"]?)[^'\"\s,/}&]+")
# scheme://user:password@ (a URL's userinfo with a password): what follows the scheme, up to the "@"
_USERINFO = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s@:'\"]*:[^/\s@'\"]*@")
_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_ACCESS_KEY_ID", "PGPASSWORD")


class NoCredentials(logging.Filter):
    """Rewrites a record's message with its credentials blanked (``***``); never drops one."""

    def __init__(self) -> None:
        super().__init__()
        # (values shorter than 8 characters are no credential worth the false hits: "x" in tests)
        self._secrets = sorted({v for k in _ENV if len(v := os.environ.get(k, "")) >= 8}, key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 -- a malformed record is the handler's to report
            return True
        clean = self._clean(msg)
        if clean != msg:
            record.msg, record.args = clean, None
        # a traceback's text too (botocore's debug record of a failed request ends with the URL)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self._clean(record.exc_text)
        if record.stack_info:
            record.stack_info = self._clean(record.stack_info)
        return True

    def _clean(self, text: str) -> str:
        for secret in self._secrets:  # (first: the fields' rule below must not cut one in two)
            text = text.replace(secret, "***")
        text = _FIELDS.sub(lambda m: (m.group(1) or m.group(2)) + "***", text)
        return _USERINFO.sub(r"\1***@", text)


def guard(handler: logging.Handler) -> logging.Handler:
    """``handler`` with the credentials filter (once)."""
    if not any(isinstance(f, NoCredentials) for f in handler.filters):
        handler.addFilter(NoCredentials())
    return handler


def guard_root() -> None:
    """Every handler of the root logger gets the filter."""
    for h in logging.getLogger().handlers:
        guard(h)
