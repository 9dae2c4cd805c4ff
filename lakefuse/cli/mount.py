"""``lakefuse mount`` and ``lakefuse umount``: a repository as a filesystem.

::

    lakefuse mount lakefs://REPO MOUNTPOINT [-f] [--cache-dir D] [--cache-size BYTES] [-o OPT,...]
    lakefuse mount --refs-dump s3://BUCKET/PREFIX MOUNTPOINT [--name NAME] [-f] ...   (lakefuse.cli.mount_dump)
    lakefuse umount MOUNTPOINT [--lazy]

Without ``-f`` the mount daemonizes and the command returns once the mount
answers (or fails with the reason). With ``-f`` this process is the daemon
(systemd, tests); it logs to stderr and stops on SIGTERM / SIGINT or unmount.
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys
from pathlib import Path

from graveler.config import KV_ENV
from graveler.errors import GravelerError, InvalidArgument
from lakefuse.cli import logsafe, mount_dump
from lakefuse.cli.common import add_kv_option, add_store_options, checked_config, store_config
from lakefuse.cli.uri import parse_uri

log = logging.getLogger(__name__)

MOUNT_EPILOG = """\
The mount root lists every branch and tag as a directory; any other ref expression
(main~1, v1^2, a commit-ID prefix, main@) is reachable by path. Trees of commits,
tags and expressions are immutable (EROFS on writes); branch trees show staging over
the head and are writable: a file is uploaded and staged when it is closed, as ext4
closes a file (visible to every reader, kept if the daemon is killed, in the next
commit); fsync/fdatasync of the file and every commit put it on disk before
returning (sync(1) does not reach the mount). Each ref has .lakefuse/head and
.lakefuse/log; a branch also has .lakefuse/commit, status, merge, reset and revert
(write a request, read back the outcome); the root has .lakefuse/branch and tag, and
.lakefuse/stats (JSON counters); mkdir at the root makes a branch. Files being written
are spooled under --cache-dir (spool/REPO/). After a killed mount, the next one stages
what was written to files whose close never returned (unless another writer saved them
since: then they are kept in spool/REPO/recovered/) and says so here. See
docs/SEMANTICS.md.

As a mount helper (an fstab line of type fuse.lakefuse; mount.fuse3 runs
`lakefuse lakefs://REPO MOUNTPOINT -o OPTIONS`), OPTIONS take home=, kv=, cache_dir=,
cache_size=, branch_timeout= and log= beside FUSE's own (systemd/README.md).

environment (read by the daemon):
  LAKEFUSE_PASSTHROUGH=0         no FUSE passthrough: the daemon serves every read
  LAKEFUSE_BRANCH_PASSTHROUGH=1  branch files no handle writes read by the kernel too
                                 (faster warm re-reads; a writer that opens a file
                                 readers hold then gets another inode: locks, appends
                                 and inotify not shared with them). Default: the daemon
  LAKEFUSE_INLINE_READS=0        page-cached reads go through a worker thread too
  LAKEFUSE_RECEIVE_BURST=0       each FUSE request waited for in the event loop (not read
                                 at once after the last one was answered)
  LAKEFUSE_READDIR_MANY=0        readdir replies made an entry at a time (not a page in
                                 one call)
  LAKEFUSE_READDIR_PLAIN=0       every readdir reply READDIRPLUS (by default the kernel
                                 asks for plain READDIR where nothing stats the names)
  LAKEFUSE_DEFERRED_REPLIES=0    a write, close or fsync answered from the event loop (not
                                 by the worker thread that did it)
  LAKEFUSE_CACHE_WHOLE_MAX=SIZE  largest S3 object kept whole in the data cache (0: none)
  LAKEFUSE_S3_LANES=N            most GETs at once for a sequential read of a large S3
                                 object (its stream and parallel parts; 1: one stream)
  LAKEFUSE_RECEIVE_SPIN_US=N     after answering a request, how long the daemon looks for
                                 the next one before it sleeps (default 500, 0 on one CPU;
                                 0: sleeps at once)
  LAKEFUSE_MAX_INODES=N          inodes kept for the kernel (1-2 KB each) above which the
                                 kernel is asked to drop names of files of the commit and
                                 tag trees known longest (default 250000; 0: no bound)

examples:
  lakefuse mount lakefs://sales /mnt/sales
  ls /mnt/sales/main/raw/   cat /mnt/sales/v1/raw/a.csv   ls /mnt/sales/main~1/
  cp -r data/ /mnt/sales/main/raw/ && cat /mnt/sales/main/.lakefuse/status
  echo "Add raw data" > /mnt/sales/main/.lakefuse/commit
  lakefuse umount /mnt/sales
"""


def _size(text: str) -> int:
    t = text.strip().upper().removesuffix("B")
    mult = 1
    for suffix, m in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30), ("T", 1 << 40)):
        if t.endswith(suffix) or t.endswith(suffix + "I"):
            t = t.removesuffix("I").removesuffix(suffix)
            mult = m
            break
    try:
        v = int(float(t) * mult)
    except (ValueError, OverflowError):  # (inf, nan, 1e999)
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (bytes, or with K/M/G/T)") from None
    if v <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    if v > 1 << 60:  # (an exabyte: no disk holds more; 1e30T is a typo)
        raise argparse.ArgumentTypeError(f"size too large: {text!r}")
    return v


def _home_option() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--home", metavar="DIR", default=argparse.SUPPRESS,
                   help="lakefuse home (default: $LAKEFUSE_HOME, else ~/.local/share/lakefuse)")
    add_kv_option(p)  # the daemon gets it through its environment ($LAKEFUSE_KV), never its argv
    add_store_options(p)  # --timeout, --max-attempts: how long an S3 read may take before EIO
    return p


def register(sub) -> None:
    p = sub.add_parser(
        "mount", help="mount a repository: every branch and tag as a directory",
        description="Mount every ref of a repository as a directory tree (FUSE): branches writable, "
                    "commits and tags read-only.",
        parents=[_home_option()], epilog=MOUNT_EPILOG + "\n" + mount_dump.DUMP_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        usage="%(prog)s [options] lakefs://REPO MOUNTPOINT\n"
              "       %(prog)s [options] --refs-dump URL [--name NAME] MOUNTPOINT",
    )
    p.add_argument("repository", metavar="lakefs://REPO", nargs="?")
    p.add_argument("mountpoint", metavar="MOUNTPOINT", nargs="?")
    p.add_argument("--refs-dump", metavar="URL", default=None, help=mount_dump.DUMP_HELP)
    p.add_argument("--name", metavar="NAME", default=None, help=mount_dump.NAME_HELP)
    p.add_argument("-f", "--foreground", action="store_true",
                   help="stay in the foreground: this process is the daemon (systemd, tests)")
    p.add_argument("--cache-dir", metavar="DIR", default=None,
                   help="the mount's local disk: DIR/spool/REPO holds every file being written on a "
                        "branch tree until close/fsync saves it, on every store, local ones too (so a "
                        "written file cannot outgrow this disk's free space; df on the mount shows it); "
                        "DIR/tables (range/metarange files) and DIR/data (object data) are the caches "
                        "of remote (S3) stores (default: <home>/cache, object data in <home>/data-cache)")
    p.add_argument("--cache-size", metavar="BYTES", type=_size, default=None,
                   help="bound of the disk caches together, e.g. 10G: a quarter for tables, the rest for "
                        "data (half of it for S3 objects kept whole, each up to 1G or "
                        "$LAKEFUSE_CACHE_WHOLE_MAX, checked by size and MD5 when filled); not the spool, "
                        "which holds what is being written (default: 16G)")
    p.add_argument("-o", dest="options", metavar="OPT[,OPT...]", action="append", default=[],
                   help="FUSE mount options, e.g. allow_other (not set unless asked)")
    p.add_argument("--log", metavar="FILE", default=None,
                   help="the daemon's log file (default: <home>/logs/mount-REPO.log; with -f: stderr)")
    p.add_argument("--branch-timeout", metavar="SECONDS", type=_seconds, default=1.0,
                   help="how long the kernel keeps names and attributes of branch trees (default 1)")
    p.add_argument("--ready-timeout", metavar="SECONDS", type=float, default=60.0, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_mount)

    u = sub.add_parser("umount", help="unmount a lakefuse mount and wait for its daemon to exit",
                       description="Unmount a lakefuse mount (also one left behind by a killed daemon) "
                                   "and wait for its daemon to exit.")
    u.add_argument("mountpoint", metavar="MOUNTPOINT")
    u.add_argument("-z", "--lazy", action="store_true",
                   help="detach now even if files are open there (returns at once: the daemon serves them and "
                        "exits with the last)")
    u.add_argument("--timeout", metavar="SECONDS", type=float, default=30.0,
                   help="how long to wait for the daemon to exit (default 30)")
    u.set_defaults(func=cmd_umount)


# mount(8) / fstab options that are not FUSE's: dropped when called as a mount helper
_FSTAB_ONLY = frozenset({"defaults", "auto", "noauto", "user", "nouser", "users", "nofail", "_netdev", "owner"})
# lakefuse's own options in an fstab line (name=value), as command-line options
_FSTAB_OWN = {"home": "--home", "kv": "--kv", "cache_dir": "--cache-dir", "cache_size": "--cache-size",
              "branch_timeout": "--branch-timeout", "log": "--log"}
_FSTAB_GLOBAL = ("home", "kv")  # options of the main parser: before the command


def from_mount_helper(argv: list[str]) -> list[str]:
    """``lakefuse lakefs://REPO MOUNTPOINT [-o OPTS]`` -- how mount.fuse3 runs us for an fstab
    line of type ``fuse.lakefuse`` -- as ``lakefuse [--home H] [--kv URL] mount lakefs://REPO MOUNTPOINT ...``.
    Any other command line is returned as it is."""
    if len(argv) < 2 or not argv[0].startswith("lakefs://"):
        return argv
    source, mountpoint, rest = argv[0], argv[1], argv[2:]
    head: list[str] = []
    tail: list[str] = []
    fuse: list[str] = []
    i = 0
    while i < len(rest):
        a = rest[i]
        if a == "-o" and i + 1 < len(rest):
            for opt in rest[i + 1].split(","):
                name, eq, value = opt.partition("=")
                if not opt or opt in _FSTAB_ONLY or name.startswith("x-") or name == "comment":
                    continue
                if name in _FSTAB_OWN and eq:
                    (head if name in _FSTAB_GLOBAL else tail).extend([_FSTAB_OWN[name], value])
                else:
                    fuse.append(opt)
            i += 2
        else:
            tail.append(a)
            i += 1
    out = head + ["mount", source, mountpoint] + tail
    if fuse:
        out += ["-o", ",".join(fuse)]
    return out


def _fuse_options(args) -> frozenset[str]:
    out = set()
    for group in args.options:
        for opt in group.split(","):
            opt = opt.strip()
            name = opt.partition("=")[0]
            if name in _FSTAB_OWN:  # (libfuse said only "unknown option(s)": found by a docs tour)
                raise InvalidArgument(f"-o {opt}: {name}= is an fstab (mount helper) option; with 'lakefuse mount' "
                                      f"use {_FSTAB_OWN[name]}")
            if opt:
                out.add(opt)
    return frozenset(out)


DEFAULT_CACHE_SIZE = 16 << 30


def _cache_budget(args) -> tuple[Path | None, int, int]:
    """(cache directory or None for the default, table bytes, data bytes)."""
    total = args.cache_size or DEFAULT_CACHE_SIZE
    return (Path(args.cache_dir).absolute() if args.cache_dir else None), total // 4, total - total // 4


def _graveler(args):
    from graveler import CacheConfig, Graveler, GravelerConfig
    from lakefuse.users import committer

    cache_dir, table_bytes, _ = _cache_budget(args)
    # the tables' disk tier is shared with the CLI (<home>/cache) unless --cache-dir is given
    cache = CacheConfig(disk_bytes=table_bytes, disk_dir=str(cache_dir / "tables") if cache_dir else None)

    # (a control request's commit names the user who opened the control file: lakefuse.users)
    return Graveler(checked_config(GravelerConfig.from_home(
        getattr(args, "home", None), kv_url=getattr(args, "kv", None), cache=cache, store=store_config(args),
        committer=committer())))


def _sources(args) -> None:
    """``lakefs://REPO MOUNTPOINT``, or ``--refs-dump URL MOUNTPOINT`` (InvalidArgument otherwise)."""
    if args.refs_dump is not None:
        if args.mountpoint is not None:
            raise InvalidArgument("with --refs-dump give only the MOUNTPOINT, not a repository")
        args.repository, args.mountpoint = None, args.repository
    elif args.name is not None:
        raise InvalidArgument("--name is for --refs-dump mounts (a repository of the home has its own name)")
    if args.mountpoint is None:
        raise InvalidArgument("expected lakefs://REPO MOUNTPOINT, or --refs-dump URL MOUNTPOINT")


def _seconds(text: str) -> float:
    """A number of seconds >= 0 (0: the kernel keeps nothing)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= v < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0: {text!r}")
    return v


def _check_log_path(path: str) -> None:
    """--log names a file in a directory that exists (as a shell's ``>`` wants: a mistyped path
    made no directories anywhere): InvalidArgument, said as such, not "File exists" from a path
    component that is a file. (The default log's ``<home>/logs`` is made before the daemon starts.)"""
    parent = d = os.path.dirname(os.path.abspath(path))
    while d and not os.path.exists(d):
        d = os.path.dirname(d)
    if d and not os.path.isdir(d):
        raise InvalidArgument(f"--log {path}: {d} is not a directory")
    if d != parent:
        raise InvalidArgument(f"--log {path}: no directory {parent}")
    if os.path.isdir(path):
        raise InvalidArgument(f"--log {path} is a directory: name a file")


def cmd_mount(args) -> int:
    from lakefuse.mount import daemon

    _sources(args)
    _fuse_options(args)  # (a helper-only option: refused here, before the daemon starts)
    if args.log:
        _check_log_path(args.log)
    dump = args.refs_dump is not None
    uri = None if dump else parse_uri(args.repository).repo_only()
    mp = daemon.canonical_mountpoint(args.mountpoint)  # (as the kernel will list it)
    if not args.foreground:
        try:
            daemon.check_mountpoint(mp)  # the usual mistakes are reported before forking
        except daemon.MountError as e:
            print(f"lakefuse: {e}", file=sys.stderr)
            return 1
        home = getattr(args, "home", None)
        from graveler.config import HOME_ENV, resolve_home, resolve_kv_url

        home_dir = resolve_home(home)
        if home_dir.exists() and not home_dir.is_dir():  # (as every other command says it: exit 2)
            print(f"lakefuse: the lakefuse home {home_dir} is not a directory (--home, ${HOME_ENV})", file=sys.stderr)
            return 2
        if not dump and resolve_kv_url(getattr(args, "kv", None)) == "lmdb" and not (home_dir / "repos").is_dir():
            # (a mistyped --home: said before the daemon starts, and no logs/ left in a new directory)
            print(f"lakefuse: cannot mount {uri}: {home_dir} holds no repositories (check --home or ${HOME_ENV}; "
                  f"'lakefuse repo create' makes one)", file=sys.stderr)
            return 3
        log_name = mount_dump.log_name(args.refs_dump) if dump else f"mount-{uri.repository}.log"
        log_path = os.path.abspath(args.log) if args.log else str(home_dir / "logs" / log_name)
        argv = [sys.executable, "-m", "lakefuse", "--home", str(home_dir)]
        argv += ["-v"] * max(args.verbose, 1)
        argv += ["mount", *(mount_dump.daemon_argv(args) if dump else [str(uri)]), mp, "-f", "--log", log_path,
                 "--branch-timeout", str(args.branch_timeout)]
        if args.cache_dir:
            argv += ["--cache-dir", os.path.abspath(args.cache_dir)]
        if args.cache_size:
            argv += ["--cache-size", str(args.cache_size)]
        if getattr(args, "timeout", None) is not None:  # (before or after the command's name)
            argv += ["--timeout", str(args.timeout)]
        if getattr(args, "max_attempts", None) is not None:
            argv += ["--max-attempts", str(args.max_attempts)]
        for o in args.options:
            argv += ["-o", o]
        try:
            # a KV URL goes to the daemon in its environment: a password never shows in its command line (ps)
            kv = getattr(args, "kv", None)
            notices: list[str] = []
            pid = daemon.start_daemon(argv, log_path, args.ready_timeout, env={KV_ENV: kv} if kv else None,
                                      notices=notices)
        except daemon.MountError as e:
            print(f"lakefuse: {e}", file=sys.stderr)
            status = getattr(e, "exit_status", None)  # the daemon's: 2 bad input, 3 not found, 6 store down...
            return status if status in (2, 3, 4, 5, 6) else 1
        for line in notices:  # what the daemon found (files recovered from a killed mount's spool)
            print(f"lakefuse: {line}", file=sys.stderr)
        print(f"mounted {uri or args.refs_dump} on {mp} (daemon pid {pid}, log {log_path}); "
              f"unmount with: lakefuse umount {shlex.quote(mp)}", file=sys.stderr)
        return 0

    if args.log:
        os.makedirs(os.path.dirname(os.path.abspath(args.log)), exist_ok=True)
        handler = daemon.LogFile(args.log)
        # (the pid: two mounts of one repository share the default log file)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s [%(process)d] %(name)s: %(message)s"))
        root = logging.getLogger()
        for h in list(root.handlers):
            root.removeHandler(h)
        root.addHandler(logsafe.guard(handler))
    if dump:
        return mount_dump.serve_dump(args, mp, _cache_budget, _fuse_options(args))
    return serve_foreground(args, uri.repository, mp)


def _whole_max() -> int | None:
    """$LAKEFUSE_CACHE_WHOLE_MAX: objects up to this size are kept whole in the data cache (0: none)."""
    text = os.environ.get("LAKEFUSE_CACHE_WHOLE_MAX", "").strip()
    if not text:
        return None
    if text == "0":
        return 0
    try:
        return _size(text)
    except argparse.ArgumentTypeError as e:
        raise InvalidArgument(f"$LAKEFUSE_CACHE_WHOLE_MAX: {e}") from None


def serve_foreground(args, repository: str, mp: str) -> int:
    from lakefuse.mount import daemon
    from lakefuse.mount.fs import FsConfig

    g = None
    try:
        g = _graveler(args)
        repo = g.repository(repository)
        from lakefuse.mount.daemon import env_int

        fs_config = FsConfig(branch_timeout=args.branch_timeout,
                             max_inodes=env_int("LAKEFUSE_MAX_INODES", FsConfig.max_inodes, 0))
        data_cache = None
        if not repo.storage_namespace.startswith("file:"):
            from graveler.objstore.chunked import DataCache

            cache_dir, _, data_bytes = _cache_budget(args)
            cache_dir = cache_dir / "data" if cache_dir else Path(g.config.home) / "data-cache"
            data_cache = DataCache(str(cache_dir), data_bytes, _whole_max())
        spool_dir = os.path.abspath(args.cache_dir) if args.cache_dir else None  # the write spool's home
        daemon.serve(repo, daemon.MountConfig(repository, mp, _fuse_options(args), cache_dir=spool_dir), fs_config,
                     data_cache)
        return 0
    except (daemon.MountError, GravelerError, OSError) as e:
        from lakefuse.cli.common import exit_code

        reason = str(e)
        code = 1  # (a mount point's problem, or a local file's: the cache directory...)
        if isinstance(e, GravelerError):
            code = exit_code(e)  # as every command's: 2 bad input, 3 not found, 6 store unavailable...
            if not isinstance(e, InvalidArgument):
                reason = f"cannot mount lakefs://{repository}: {e}"
        elif isinstance(e, OSError):  # (which file: "No space left on device" alone says nothing)
            where = f": {e.filename}" if e.filename else ""
            reason = f"cannot mount lakefs://{repository}: {e.strerror or e}{where}"
        daemon.sd_notify(f"STATUS={reason}\nERRNO=1")
        print(f"lakefuse: {reason}", file=sys.stderr)
        if args.log:  # (else the log is stderr: the line above says it once)
            log.error("%s", reason)
        return code
    finally:
        if g is not None:
            g.close()


def cmd_umount(args) -> int:
    from lakefuse.mount import daemon

    try:
        daemon.umount(args.mountpoint, lazy=args.lazy, timeout=args.timeout)
    except daemon.MountError as e:
        from lakefuse.cli.common import terminal_text

        print(terminal_text(f"lakefuse: {e}", sys.stderr), file=sys.stderr)
        return 1
    return 0
