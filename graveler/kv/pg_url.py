"""PostgreSQL URLs for the KV backend (:mod:`graveler.kv.postgres`): libpq's parameters, how
messages name the server, and every message kept free of the password, whatever the URL's shape."""

from __future__ import annotations

import os
import re
from urllib.parse import unquote, urlsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict

from graveler.errors import InvalidArgument, StoreUnavailable



def password_of(url: str) -> str | None:
    """The password written in ``url`` (to keep it out of every message), if any."""
    try:
        pw = urlsplit(url).password
    except ValueError:
        pw = None
    if pw:
        return unquote(pw)
    m = re.search(r"://[^:/@\s]*:([^@\s]+)@", url)  # a URL urlsplit cannot take ("@[::1", a bad port...)
    if m:
        return unquote(m.group(1))
    for part in url.replace("&", " ").replace("?", " ").split():
        if part.startswith("password="):
            return unquote(part[len("password="):])
    return None


def redact(url: str) -> str:
    """``url`` with its password (``user:PASS@`` or ``password=PASS``) replaced by ``***``."""
    url = re.sub(r"(://[^/@?]*?):[^/@?]*@", r"\1:***@", url)
    return re.sub(r"(password=)[^&\s]*", r"\1***", url)


def one_line(e: BaseException, secret: str | None) -> str:
    """An exception as one line (libpq's messages span several), the secret blanked."""
    text = "; ".join(s.strip() for s in str(e).splitlines() if s.strip()) or type(e).__name__
    if secret:
        text = text.replace(secret, "***")
    return redact(text)  # (libpq quotes a URL it cannot parse: whatever its password's shape)


def _userinfo(url: str) -> str | None:
    """The user and password as written: between ``scheme://`` and the last ``@`` before the query."""
    head = url.split("://", 1)[1].split("?", 1)[0] if "://" in url else ""
    return head.rsplit("@", 1)[0] if "@" in head else None


def parse_url(url: str) -> tuple[dict[str, str], str]:
    """libpq's parameters of ``url`` and how messages name the server (never the password)."""
    info = _userinfo(url)
    if info is not None and any(c in info for c in "/@#"):
        # libpq would end the user or password at that character and take the rest for the host
        # or the database: messages naming the server would then show part of the password
        raise InvalidArgument("bad PostgreSQL URL: its user or password holds '/', '@' or '#': "
                              "percent-encode them (%2F, %40, %23), or give the password in ~/.pgpass "
                              "or $PGPASSWORD")
    secret = password_of(url)
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error as e:
        raise InvalidArgument(f"bad PostgreSQL URL: {one_line(e, secret)}") from None
    host = params.get("host") or os.environ.get("PGHOST") or "the default socket"
    port = params.get("port") or os.environ.get("PGPORT")
    user = params.get("user") or os.environ.get("PGUSER")
    db = params.get("dbname") or os.environ.get("PGDATABASE") or user or ""
    where = f"{user + '@' if user else ''}{host}{':' + port if port else ''}/{db}"
    return params, f"PostgreSQL server {where}"


# libpq's and the server's words for a login the server refused (connection errors carry no
# SQLSTATE): a wrong or missing password, an unknown role or database, no pg_hba.conf entry.
_LOGIN_REFUSED = re.compile(r"authentication failed|no password supplied|pg_hba\.conf|"
                            r"(role|database) \"[^\"]*\" does not exist|not permitted to log in")


# libpq's words for a URL setting it refused at connect time (``port=notaport``, ``sslmode=bogus``),
# and psycopg's for one it reads itself (``connect_timeout=abc``: "bad value for connect_timeout")
_BAD_OPTION = re.compile(r"invalid [\w ]*value|invalid port number|invalid connection option|bad value for \w+")


def unavailable(server: str, e: BaseException, secret: str | None) -> StoreUnavailable | InvalidArgument:
    """A failed connect: the server refused the login (a wrong password, an unknown role or
    database) is ``InvalidArgument`` -- retrying cannot help; anything else (unreachable, stopped,
    starting up) is ``StoreUnavailable``."""
    text = one_line(e, secret)
    if _LOGIN_REFUSED.search(text):
        return InvalidArgument(f"{server} refused the login: {text}")
    if _BAD_OPTION.search(text):  # a setting of the URL libpq checks only when it connects
        return InvalidArgument(f"bad PostgreSQL URL: {text}")
    return StoreUnavailable(f"{server}: {text}")
