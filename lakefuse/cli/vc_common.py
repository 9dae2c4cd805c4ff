"""What the version-control commands share: options, the graveler session, output.

Output conventions (every vc command):

* Human output goes to stdout as aligned columns or short ``key: value``
  blocks; notes and progress go to stderr.
* ``--json``: a command that prints one thing (a commit, an entry, a result)
  prints ONE JSON object; a command that prints a listing (``repo list``,
  ``branch list``, ``tag list``, ``fs ls``, ``log``, ``diff``) prints JSON
  lines, one object per line, so that long listings stream. Times are ISO 8601
  in UTC; sizes are bytes.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Iterable, Iterator, Sequence

from graveler.errors import InvalidArgument
from graveler import Graveler, GravelerConfig, Repository
from graveler.model import Entry
from graveler.refs import Commit
from lakefuse.cli.common import (add_kv_option, add_store_options, checked_config, one_line,  # noqa: F401 (theirs too)
                                 store_config, terminal_text)
from lakefuse.cli.uri import LakeFSURI, is_uri, parse_uri
from lakefuse.names import decode_key, show_name  # noqa: F401 (the commands take them from here)
from lakefuse.users import committer

log = logging.getLogger(__name__)

JSON_HELP = "print JSON: one object, or one object per line for listings"
HOME_HELP = "lakefuse home (default: $LAKEFUSE_HOME, else ~/.local/share/lakefuse)"


def options(json_output: bool = True) -> argparse.ArgumentParser:
    """The parent parser of every vc command: ``--home``, ``--kv`` (and ``--json``).

    ``--home`` and ``--kv`` default to SUPPRESS so that the main parser's
    ``--home`` / ``--kv`` (given before the command) are not overwritten by the
    sub-command's default.
    """
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--home", metavar="DIR", default=argparse.SUPPRESS, help=HOME_HELP)
    add_kv_option(p)
    add_store_options(p)
    if json_output:
        p.add_argument("--json", action="store_true", help=JSON_HELP)
    return p


def add_group(sub, name: str, help: str, description: str | None = None):
    """A command group (``repo``, ``branch`` ...) and its sub-command action."""
    p = sub.add_parser(name, help=help, description=description or help[:1].upper() + help[1:] + ".")
    s = p.add_subparsers(dest=f"{name}_command", metavar="SUBCOMMAND")
    s.required = True
    return s


def add_command(sub, name: str, help: str, func, description: str | None = None, json_output: bool = True,
                epilog: str | None = None):
    p = sub.add_parser(
        name,
        help=help,
        description=description or help[:1].upper() + help[1:] + ".",
        parents=[options(json_output)],
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=func)
    return p


# ---------------------------------------------------------------------- session


class Session:
    """One command's graveler: built from ``--home`` at the edge, closed at the end."""

    def __init__(self, args: argparse.Namespace):
        self.config = checked_config(GravelerConfig.from_home(
            getattr(args, "home", None), kv_url=getattr(args, "kv", None), store=store_config(args),
            committer=committer()))
        self.graveler = Graveler(self.config)

    @property
    def home(self):
        return self.config.home

    def repo(self, name: str | LakeFSURI) -> Repository:
        if isinstance(name, LakeFSURI):
            name = name.repository
        return self.graveler.repository(name)

    def close(self) -> None:
        self.graveler.close()


ALLOW_LOCAL_HELP = ("allow a file:// storage namespace although the KV is shared (--kv postgresql://...): "
                    "only this host can read or write it")


def check_shared_namespace(config: GravelerConfig, namespace: str, allow_local: bool, what: str = "") -> None:
    """Refuse a host-local (``file://``) storage namespace for a repository whose refs are on a
    shared KV (not ``lmdb``, not ``memory://``) unless ``allow_local``: the other hosts that see the
    repository could not read its data."""
    from graveler.objstore.uri import StorageURI

    url = config.kv.url
    if allow_local or url == "lmdb" or url.startswith("memory://"):
        return
    if StorageURI.parse(namespace).scheme == "file":
        raise InvalidArgument(
            f"{what}storage namespace {namespace} is a directory of this host, but the refs are on a shared KV: "
            "other hosts would see the repository and not its data. Use s3://BUCKET/PREFIX, "
            "or --allow-local-storage if only this host will use it")


@contextmanager
def session(args: argparse.Namespace) -> Iterator[Session]:
    s = Session(args)
    try:
        yield s
    finally:
        s.close()


# ---------------------------------------------------------------------- arguments


def uri_arg(text: str) -> LakeFSURI:
    return parse_uri(text)


def ref_arg(text: str, repo: str, what: str = "ref") -> str:
    """A ref given either plainly (``main~1``, a commit ID) or as ``lakefs://REPO/REF``
    of the same repository."""
    if is_uri(text):
        u = parse_uri(text)
        if u.repository != repo:
            raise InvalidArgument(f"{text}: expected a {what} of repository {repo!r}, not of {u.repository!r}")
        return u.with_ref(what)
    if not text:
        raise InvalidArgument(f"empty {what}")
    if "/" in text:
        raise InvalidArgument(f"invalid {what} {text!r}: refs contain no '/' (give lakefs://REPO/REF or a plain ref)")
    return text


def same_repo(a: LakeFSURI, b: LakeFSURI) -> None:
    if a.repository != b.repository:
        raise InvalidArgument(f"{a} and {b} are in different repositories")


def parse_meta(items: Sequence[str] | None) -> dict[str, str]:
    md: dict[str, str] = {}
    for item in items or ():
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise InvalidArgument(f"invalid --meta {item!r}: expected KEY=VALUE")
        md[k] = v
    return md


# ---------------------------------------------------------------------- output


def out(line: str = "") -> None:
    """A line of human output: on a terminal, control characters are escaped (see :func:`terminal_text`)."""
    sys.stdout.write(terminal_text(line, sys.stdout) + "\n")


def note(line: str) -> None:
    """A message for the person (stderr), not data."""
    sys.stderr.write(terminal_text(line, sys.stderr) + "\n")


def emit_json(obj) -> None:
    """One JSON line: non-ASCII text as it is, but a line break to ``str.splitlines()`` (U+0085 and
    the other C1 controls, U+2028, U+2029) \\u-escaped, so each object stays one line to every reader."""
    text = json.dumps(obj, ensure_ascii=False)
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):  # a name with undecodable bytes: JSON's \\udcNN escapes
        text = json.dumps(obj)
    elif _JSON_BREAKS.search(text):
        text = _JSON_BREAKS.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
    sys.stdout.write(text + "\n")


_JSON_BREAKS = re.compile("[\x80-\x9f\u2028\u2029]")


def iso(dt: datetime) -> str:
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def iso_ns(ns: int) -> str | None:
    if not ns:
        return None
    return iso(datetime.fromtimestamp(ns / 1e9, tz=timezone.utc))


def local_time(dt: datetime, zone: bool = False) -> str:
    """A date for people: local time, to the minute (or second with the zone offset)."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    lt = dt.astimezone()
    return lt.strftime("%Y-%m-%d %H:%M:%S %z") if zone else lt.strftime("%Y-%m-%d %H:%M")


def local_time_ns(ns: int, zone: bool = False) -> str:
    if not ns:
        return "-"
    return local_time(datetime.fromtimestamp(ns / 1e9, tz=timezone.utc), zone)


def human_size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        size /= 1024
        if size < 1024 or unit == "PiB":
            return f"{size:.1f} {unit}"
    raise AssertionError("unreachable")


def table(rows: Iterable[Sequence[str]], headers: Sequence[str] | None = None) -> None:
    """Aligned columns (the last column is not padded)."""
    rows = [list(map(str, r)) for r in rows]
    if headers:
        rows.insert(0, list(headers))
    if not rows:
        return
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        cells = [c.ljust(w) for c, w in zip(r[:-1], widths)] + [r[-1]]
        out("  ".join(cells).rstrip())


def commit_json(c: Commit) -> dict:
    return {
        "id": c.id,
        "parents": list(c.parents),
        "committer": c.committer,
        "message": c.message,
        "creation_date": iso(c.creation_date),
        "meta_range_id": c.meta_range_id,
        "metadata": dict(c.metadata),
        "generation": c.generation,
    }


def print_commit(c: Commit) -> None:
    """A commit for people, shaped like ``git show``'s header."""
    out(f"commit {c.id}")
    if len(c.parents) > 1:
        out("Merge:      " + " ".join(p[:12] for p in c.parents))
    elif c.parents:
        out(f"Parent:     {c.parents[0]}")
    out(f"Committer:  {c.committer}")
    out(f"Date:       {local_time(c.creation_date, zone=True)}")
    out(f"Meta range: {c.meta_range_id}")
    out(f"Generation: {c.generation}")
    for k, v in sorted(c.metadata.items()):
        out(f"Metadata:   {one_line(k)} = {one_line(v)}")  # (one line each: a newline faked rows)
    out()
    for line in c.message.splitlines() or [""]:
        out("    " + line)


def physical_address(repo: Repository, e: Entry) -> str:
    return repo.physical_address(e)


def entry_json(repo: Repository, path: str, e: Entry) -> dict:
    return {
        "path": path,
        "physical_address": physical_address(repo, e),
        "address_type": e.address_type.name.lower(),
        "size": e.size,
        "etag": e.etag,
        "mtime": iso_ns(e.last_modified_ns),
        "content_type": e.content_type,
        "metadata": dict(e.metadata),
    }


