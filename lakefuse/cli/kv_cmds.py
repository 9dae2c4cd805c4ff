"""``lakefuse kv copy``: move repositories' refs and staging between KV backends.

::

    lakefuse kv copy --from lmdb --to postgresql://USER@HOST/DB [lakefs://REPO ...]

The copy itself is :mod:`graveler.kv.copy` (the protocol only); this module opens the two
backends (``lmdb`` is the home's) and prints what was copied.
"""

from __future__ import annotations

import argparse

from graveler.config import GravelerConfig
from graveler.errors import InvalidArgument
from graveler.kv.base import BRANCHES, COMMITS, STAGING, TAGS
from lakefuse.cli.common import checked_config
from lakefuse.cli.uri import is_uri, parse_uri
from lakefuse.cli.vc_common import add_group, check_shared_namespace, emit_json, note, out

COPY_EPILOG = """\
URL is 'lmdb' (the home's embedded store, --home / $LAKEFUSE_HOME) or a PostgreSQL URL
postgresql://USER[:PASS]@HOST[:PORT]/DB?OPTIONS (a password is better in ~/.pgpass or
$PGPASSWORD). Without REPO every repository of --from is copied.

Copied: every branch, tag and commit and the uncommitted changes (staged writes and
deletions) of each repository, exactly (same commit IDs); the data stays in the storage
namespace. The source is read in one snapshot and left unchanged. A repository --to
already holds is refused (exit 4) before anything is written, and so is (exit 2) a repository
with a file:// namespace copied to a shared KV unless --allow-local-storage; each repository is written
in one transaction and its row counts verified, and a failed copy is removed again.
Stop mounts and writers of the source first: changes made after the snapshot stay there
(with an LMDB source, a repository another process of this host has open is refused, exit 4).

examples:
  lakefuse kv copy --from lmdb --to postgresql://lakefuse@db.example/lakefuse lakefs://sales
  lakefuse kv copy --from postgresql://lakefuse@db.example/lakefuse --to lmdb
"""


def register(sub) -> None:
    g = add_group(sub, "kv", "manage where refs and staging live (the KV backend)")
    p = g.add_parser("copy", help="copy repositories' refs and uncommitted changes to another KV backend",
                     description="Copy repositories' refs and uncommitted changes from one KV backend to "
                                 "another.", epilog=COPY_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.set_defaults(func=cmd_kv_copy)
    p.add_argument("--home", metavar="DIR", default=argparse.SUPPRESS,
                   help="the home whose LMDB 'lmdb' means (default: $LAKEFUSE_HOME, else ~/.local/share/lakefuse)")
    p.add_argument("--json", action="store_true", help="print one JSON object per repository copied")
    p.add_argument("--allow-local-storage", action="store_true",
                   help="copy to a shared KV (postgresql://...) a repository whose storage namespace is a "
                        "file:// directory of this host (refused otherwise: other hosts could not read its data)")
    p.add_argument("--from", dest="source", metavar="URL", required=True,
                   help="the KV to copy from: lmdb or postgresql://...")
    p.add_argument("--to", dest="target", metavar="URL", required=True,
                   help="the KV to copy to: lmdb or postgresql://...")
    p.add_argument("repositories", metavar="REPO", nargs="*",
                   help="repositories to copy (lakefs://REPO or REPO); default: all of --from")


def _name(text: str) -> str:
    if is_uri(text):
        return parse_uri(text).repo_only().repository
    from graveler.refs import validate_repository_name

    validate_repository_name(text)
    return text


def cmd_kv_copy(args: argparse.Namespace) -> int:
    from graveler.kv import open_backend
    from graveler.kv.copy import copy_repositories

    names = [_name(n) for n in args.repositories]
    if args.source == args.target:
        raise InvalidArgument("--from and --to name the same KV: nothing to copy")
    home = getattr(args, "home", None)
    src_cfg = checked_config(GravelerConfig.from_home(home, kv_url=args.source))
    dst_cfg = checked_config(GravelerConfig.from_home(home, kv_url=args.target))
    src = open_backend(src_cfg.kv, src_cfg.home)
    dst = open_backend(dst_cfg.kv, dst_cfg.home)
    if dst.url != "lmdb" and not args.allow_local_storage:
        _check_namespaces(src, dst_cfg, names)
    for name in names or src.names():  # (LMDB: a mount of the source here would go on writing only there)
        src.refuse_in_use(name, "copying it (what it writes after the copy's snapshot would stay behind)")
    copied = copy_repositories(src, dst, names)
    a, b = _where(src.url, src_cfg.home), _where(dst.url, dst_cfg.home)  # backend URLs carry no password
    for c in copied:
        if args.json:
            emit_json({"repository": c.name, "from": a, "to": b, "rows": c.counts})
        else:
            out(f"copied {c.name}: {c.counts[BRANCHES]} branches, {c.counts[TAGS]} tags, "
                f"{c.counts[COMMITS]} commits, {c.counts[STAGING]} staged entries ({a} -> {b})")
    if not copied:
        note(f"no repositories in {a}: nothing copied")
    return 0


def _check_namespaces(src, dst_cfg, names: list[str]) -> None:
    """Refuse (before anything is written) to put a repository with a file:// namespace on a shared KV."""
    from graveler.errors import NotFound
    from graveler.refs import RefManager

    for n in names or src.names():
        try:
            with src.borrowed(n) as store:
                ns = RefManager(store).get_repository().storage_namespace
        except NotFound:
            continue  # copy_repositories says so, or skips a store without a record
        check_shared_namespace(dst_cfg, ns, False, f"repository {n!r}: ")


def _where(url: str, home) -> str:
    return f"lmdb ({home})" if url == "lmdb" else url


__all__ = ["register"]
