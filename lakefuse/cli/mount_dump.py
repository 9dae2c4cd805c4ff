"""``lakefuse mount --refs-dump URL MOUNTPOINT``: a read-only mount from the object store alone.

For hosts that cannot reach the refs database (a training cluster reading one commit
on every node): the refs come from the lakeFS refs dump in the storage namespace
(``_lakefs/refs_manifest.json`` and the metaranges it names, written by
``lakefuse refs dump``), loaded into an in-memory KV backend inside the daemon
(:meth:`graveler.home.Graveler.open_refs_dump`). No KV database is opened or
written (``--kv`` / ``$LAKEFUSE_KV`` are not consulted), nothing is written to the
namespace, and every tree -- branch trees too, frozen as of the dump -- is read-only
(``FsConfig.read_only``). Caches (the table disk tier, the data cache) stay per host
under the home or ``--cache-dir``.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

from graveler.errors import GravelerError

log = logging.getLogger(__name__)

DUMP_HELP = ("mount read-only from the lakeFS refs dump in this storage namespace (file:///... or "
             "s3://BUCKET/PREFIX, as written by `lakefuse refs dump`) instead of a repository of the home: "
             "every commit and tag, branches as of the dump, no refs database needed; give only MOUNTPOINT")
NAME_HELP = ("the repository name a --refs-dump mount shows (default: the manifest's \"repository\" field if "
             "it has one, else the last path element of the URL, e.g. 'sales' for s3://b/lake/sales)")

DUMP_EPILOG = """\
mount from a refs dump (hosts that cannot reach the refs database):
  lakefuse mount --refs-dump s3://BUCKET/PREFIX MOUNTPOINT [--name NAME]
  Everything is read-only (mounted ro unless -o rw; EROFS on writes either way; no control
  files; .lakefuse/head and log work);
  branch trees show the branches as of the dump; the default branch is main if the dump has
  it, else its first branch by name. .lakefuse/stats says "source": "refs-dump". No KV
  database is opened (--kv / $LAKEFUSE_KV are ignored); caches stay under the home or
  --cache-dir; without -f the daemon logs to <home>/logs/mount-dump-<last path element>.log.
  A namespace without a dump: exit 3; a bad or incomplete dump: exit 5.
"""

# One in-process space per daemon: the refs live in its memory only.
DUMP_KV_URL = "memory://lakefuse-refs-dump"


def log_name(url: str) -> str:
    """A file name for the daemon log of a dump mount (before the dump is read)."""
    last = url.rstrip("/").rsplit("/", 1)[-1] or "root"
    return "mount-dump-" + (re.sub(r"[^A-Za-z0-9._-]", "_", last)[:60] or "root") + ".log"


def _graveler(args, cache_budget):
    from graveler import CacheConfig, Graveler, GravelerConfig
    from graveler.config import KVConfig
    from lakefuse.cli.common import store_config

    cache_dir, table_bytes, _ = cache_budget(args)
    cache = CacheConfig(disk_bytes=table_bytes, disk_dir=str(cache_dir / "tables") if cache_dir else None)
    config = GravelerConfig.from_home(getattr(args, "home", None), kv=KVConfig(url=DUMP_KV_URL), cache=cache,
                                      store=store_config(args))
    return Graveler(config)


def serve_dump(args, mp: str, cache_budget, fuse_options) -> int:
    """The ``-f`` daemon of a dump mount: load the dump, then serve it read-only. A bad
    dump is one line on stderr (and ``STATUS=`` for the parent) and the exit code of
    its error (:data:`lakefuse.cli.common.EXIT_CODES`): nothing is mounted."""
    from lakefuse.cli.common import exit_code
    from lakefuse.mount import daemon
    from lakefuse.mount.fs import FsConfig

    g = None
    try:
        daemon.check_mountpoint(mp)  # the usual mistakes first: the dump may take a while to load
        g = _graveler(args, cache_budget)
        repo = g.open_refs_dump(args.refs_dump, args.name)
        source = {"source": "refs-dump", "refs_dump": repo.storage_namespace, "read_only": True}
        fs_config = FsConfig(branch_timeout=args.branch_timeout, read_only=True, extra_stats=lambda: source)
        data_cache = None
        if not repo.storage_namespace.startswith("file:"):
            from graveler.objstore.chunked import DataCache

            cache_dir, _, data_bytes = cache_budget(args)
            cache_dir = cache_dir / "data" if cache_dir else Path(g.config.home) / "data-cache"
            data_cache = DataCache(str(cache_dir), data_bytes)
        log.info("serving lakefs://%s read-only from the refs dump in %s (%d branches, %d tags)", repo.name,
                 repo.storage_namespace, len(repo.list_branches()), len(repo.list_tags()))
        # the kernel is told too (unless -o rw): EROFS for every user before a request reaches us,
        # and `findmnt` shows ro; the core refuses writes either way
        options = fuse_options if "rw" in fuse_options else fuse_options | {"ro"}
        cache_dir = cache_budget(args)[0]  # statfs reports its filesystem's space (None: the home's cache)
        daemon.serve(repo, daemon.MountConfig(repo.name, mp, options, cache_dir=str(cache_dir) if cache_dir else None),
                     fs_config, data_cache)
        return 0
    except (daemon.MountError, GravelerError) as e:
        reason = str(e)
        code = 1
        if isinstance(e, GravelerError):
            reason = f"cannot mount from {args.refs_dump}: {e}"
            code = exit_code(e)
        daemon.sd_notify(f"STATUS={reason}\nERRNO=1")
        print(f"lakefuse: {reason}", file=sys.stderr)  # one line on stderr
        if args.log:  # and in the log file, when there is one
            log.error("%s", reason)
        return code
    finally:
        if g is not None:
            g.close()


def daemon_argv(args) -> list[str]:
    """What replaces ``lakefs://REPO`` on the daemon's command line."""
    out = ["--refs-dump", args.refs_dump]
    if args.name:
        out += ["--name", args.name]
    return out


__all__ = ["DUMP_EPILOG", "DUMP_HELP", "NAME_HELP", "daemon_argv", "log_name", "serve_dump"]
