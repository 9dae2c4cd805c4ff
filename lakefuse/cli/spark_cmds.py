"""``import``, ``gc`` and ``export``: the Spark jobs of :mod:`graveler.spark` on the command line.

Each runs Spark: ``--spark MASTER`` picks the master (``local[4]``,
``spark://host:7077``...); without it, an active session (``spark-submit``) or
``local[*]``.  The ``scripts/spark_*.py`` entries run the same commands under
``spark-submit``.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
from dataclasses import asdict
from datetime import timedelta

from graveler.errors import InvalidArgument, NotFound
from graveler.staging import MAX_PATH_BYTES
from lakefuse.cli.vc_common import add_command, add_group, emit_json, note, out, session, uri_arg
from lakefuse.names import show_name

log = logging.getLogger(__name__)

SPARK_HELP = "Spark master (local[N], spark://HOST:PORT ...); default: spark-submit's, else local[*]"


def _spark(args):
    from graveler.spark.session import SparkConfig, get_session

    return get_session(SparkConfig(master=getattr(args, "spark", None), app_name=f"lakefuse {args.command}"))


# the masters Spark itself takes (SparkContext refuses any other, after starting a JVM: a traceback)
_MASTER = re.compile(r"local(\[(\d+|\*)(,\d+)?\])?|local-cluster\[\d+,\d+,\d+\]|yarn|(spark|k8s|mesos)://\S+")


# a scheme with one slash (s3:/bucket): a URI mistyped, not a relative path to take as one
_HALF_URI = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/(?!/)")


def _master(text: str) -> str:
    if not _MASTER.fullmatch(text):
        raise argparse.ArgumentTypeError(f"not a Spark master: {text!r} (local, local[N], local[*], "
                                         "spark://HOST:PORT, yarn, k8s://URL)")
    return text


def _add_spark(p) -> None:
    p.add_argument("--spark", metavar="MASTER", type=_master, help=SPARK_HELP)


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, not {n}")
    return n


def register(sub) -> None:
    p = add_command(
        sub, "import", "import an object-store prefix as one commit (zero-copy, Spark)", cmd_import,
        epilog="Every object under SOURCE (a local directory or s3://BUCKET/PREFIX) becomes an entry under\n"
               "PREFIX on BRANCH that points at the object where it is (nothing is copied); whatever was\n"
               "under PREFIX before is replaced.  The branch must have no uncommitted changes.  Running the\n"
               "same import again gives the same tree and makes no commit.  SOURCE is listed in parallel:\n"
               "sub-prefixes found by delimited listings, runs of them listed by the tasks; a progress line\n"
               "(objects listed, prefixes done/known, objects/s) goes to stderr.  Keys that are not object\n"
               "keys (S3 folder markers 'dir/', even one holding bytes; empty or '.' segments) or that the\n"
               "mount cannot show (a segment over 255 bytes, one named .lakefuse) are skipped, and paths over\n"
               f"{MAX_PATH_BYTES} bytes under PREFIX left out (a branch could never change or delete them): the\n"
               "summary line and --json count both (skipped, skipped_too_long) and name a path left out.  In a\n"
               "local directory only regular files are objects: symbolic links, FIFOs, sockets, devices and\n"
               "names that are not UTF-8 are not listed (nor counted: they are no keys).\n"
               "Objects of a local SOURCE are checked at each read against the MD5 the import recorded:\n"
               "one changed in place later is refused (EIO through a mount), not read as it is now.\n"
               "A SOURCE inside a repository's storage namespace, or holding one, is refused (exit 2): that\n"
               "repository's garbage collection would delete the objects the import names.",
    )
    p.add_argument("source", metavar="SOURCE", help="a local directory or s3://BUCKET/PREFIX")
    p.add_argument("dest", metavar="lakefs://REPO/BRANCH/PREFIX/")
    p.add_argument("-m", "--message", help="commit message (default: Import SOURCE into PREFIX)")
    p.add_argument("--partitions", type=_positive, metavar="N", help="how many tasks write the ranges")
    _add_spark(p)

    g = add_group(sub, "gc", "garbage collection of a repository's data objects (Spark)")
    p = add_command(g, "rules", "show or set the retention rules (lakeFS's form)", cmd_gc_rules,
                    epilog="Without options, prints the rules as JSON (with --json, null when there are\n"
                           "none).  --default-days sets the default\n"
                           "retention; --branch NAME=DAYS (repeatable) a branch's; --delete removes the rules\n"
                           "(then every commit is kept and only unreferenced objects are collected).")
    p.add_argument("repo", metavar="lakefs://REPO")
    p.add_argument("--default-days", type=int, metavar="DAYS", help="retention in days of the commits of "
                   "branches with no rule of their own (lakeFS's default_retention_days)")
    p.add_argument("--branch", action="append", metavar="NAME=DAYS", help="that branch's own retention (repeatable)")
    p.add_argument("--delete", action="store_true", help="remove the rules (every commit is kept; unreferenced objects are "
                   "still collected)")

    for name, func, help_ in (
        ("mark", cmd_gc_mark, "find the objects to delete and write a report (or only print them: --dry-run)"),
        ("run", cmd_gc_run, "mark, then sweep the report"),
    ):
        p = add_command(g, name, help_, func, epilog=_SWEEP_EPILOG if name == "run" else None)
        p.add_argument("repo", metavar="lakefs://REPO")
        p.add_argument("--min-age", type=float, default=24.0, metavar="HOURS",
                       help="objects younger than this are never deleted (default 24); keep it above the longest "
                            "time between a write and its staging, and above 0.2 (12 minutes): a mount "
                            "reuses one empty object for up to 10 minutes")
        p.add_argument("--dry-run", action="store_true", help="print what would be deleted, write and delete nothing")
        _add_release(p)
        _add_spark(p)
    p = add_command(g, "sweep", "delete the objects of a mark run's report", cmd_gc_sweep, epilog=_SWEEP_EPILOG)
    p.add_argument("repo", metavar="lakefs://REPO")
    p.add_argument("run_id", metavar="RUN_ID")
    p.add_argument("--dry-run", action="store_true", help="count what would be deleted, delete nothing")
    _add_release(p)
    _add_spark(p)
    p = add_command(g, "runs", "list the complete mark runs", cmd_gc_runs)
    p.add_argument("repo", metavar="lakefs://REPO")

    p = add_command(
        sub, "export", "copy a commit's objects to a plain prefix (Spark)", cmd_export,
        epilog="DEST is a local directory (a relative path is from here) or s3://BUCKET/PREFIX.  Objects are\n"
               "copied; an empty directory made through a mount (a directory marker) is not: a prefix holds\n"
               "no empty directories.  In a local DEST a symbolic link is made again (its target as\n"
               "committed) and each file gets its permission bits (rwx; 0644 without any) and its mtime;\n"
               "owners are not set.  FIFOs, sockets and device entries, and links on S3 (which has none),\n"
               "are skipped and counted (links, skipped).  _SUCCESS is written last and names the\n"
               "commit; exporting onto a destination whose _SUCCESS names a commit of this repository only\n"
               "copies and deletes the difference (deletions first). While an export runs, _INCOMPLETE names\n"
               "the commit it goes to and the one it goes on from: run again after a failure, it goes on from\n"
               "there (to a newer commit too: what the failed run copied is undone; what the copies it had under\n"
               "way were writing goes: their temp files in a local DEST, their open multipart uploads on S3).\n"
               "An empty _SUCCESS (Spark's, Hadoop's) is no export's. An export writes and deletes only\n"
               "below DEST: a directory inside a local DEST that is a symbolic link is refused (exit 2), and so\n"
               "is a DEST inside the repository's storage namespace, or holding it.",
    )
    p.add_argument("ref", metavar="lakefs://REPO/REF")
    p.add_argument("dest", metavar="DEST")
    p.add_argument("--previous", metavar="REF", help="the commit the destination holds (default: from its _SUCCESS)")
    p.add_argument("--full", action="store_true",
                   help="copy everything, even if the destination has a _SUCCESS; what the export named there had "
                        "and this commit lacks is deleted (a file no export wrote is left)")
    p.add_argument("--partitions", type=_positive, metavar="N", help="how many copy tasks")
    _add_spark(p)


def _print(args, obj: dict, human: str) -> None:
    if args.json:
        emit_json(obj)
    else:
        out(human)


def _location(value: str, what: str) -> str:
    """An import source or export destination as given, refused when it names no place at all
    ('' or a half URI such as ``s3:/x``: no path to look for)."""
    if not value or _HALF_URI.match(value):
        raise InvalidArgument(f"{what} {value!r} is no directory or URI: give a local directory, "
                              "file:///PATH or s3://BUCKET/PREFIX")
    return value


def cmd_import(args) -> int:
    from graveler.spark.importer import check_clean, import_prefix

    u = uri_arg(args.dest)
    branch, prefix = u.with_prefix()
    if not prefix:
        raise InvalidArgument(f"{u}: give a destination prefix, lakefs://REPO/BRANCH/PREFIX/ (it is replaced)")
    src = _location(args.source, "import source")
    if "://" not in src or src.startswith("file://"):  # a local directory: there, before Spark starts
        path = src[len("file://"):] if src.startswith("file://") else src
        if not os.path.exists(path):
            raise NotFound(f"import source {src} not found")
        if not os.path.isdir(path):
            raise InvalidArgument(f"import source {src} is not a directory")
        if "://" not in src:
            src = os.path.abspath(src)  # a path relative to here, as `fs upload --source` takes one
    with session(args) as s:
        repo = s.repo(u)
        repo.get_branch(branch)  # fail before starting Spark
        check_clean(repo, branch)
        s.graveler.check_import_source(src)
        spark = _spark(args)
        res = import_prefix(spark, repo, branch, src, prefix, args.message, args.partitions)
    what = f"commit {res.commit_id[:12]}" if res.commit_id else "no commit (the tree is unchanged)"
    left = ""
    if res.skipped:
        left += (f"; {res.skipped} key(s) skipped: folder markers (even holding bytes), empty or dot segments, a "
                 f"segment over 255 bytes or named .lakefuse")
    if res.skipped_too_long:
        left += (f"; {res.skipped_too_long} key(s) left out, their paths over {MAX_PATH_BYTES} bytes (a branch "
                 f"cannot change them), e.g. {show_name(res.too_long_examples[0][:120])}...")
    _print(args, asdict(res), f"imported {res.imported} objects into {branch}/{prefix}: {what}, "
                              f"metarange {res.metarange_id[:12]} ({res.records} entries, {res.ranges} ranges){left}")
    return 0


def cmd_gc_rules(args) -> int:
    from graveler.spark.gc import GCRules, delete_rules, get_rules, set_rules

    u = uri_arg(args.repo).repo_only()
    with session(args) as s:
        repo = s.repo(u)
        if args.delete:
            delete_rules(repo)
            note("rules deleted: every commit is kept")
            return 0
        rules = get_rules(repo)
        if args.default_days is not None or args.branch:
            branches = dict(rules.branches) if rules else {}
            for item in args.branch or ():
                name, sep, days = item.partition("=")
                if not sep or not name or not days.strip().isdigit():
                    raise InvalidArgument(f"invalid --branch {item!r}: expected NAME=DAYS")
                branches[name] = int(days)
            default = args.default_days if args.default_days is not None else (
                rules.default_retention_days if rules else None)
            if default is None:
                raise InvalidArgument("no rules yet: give --default-days")
            rules = GCRules(default, branches)
            set_rules(repo, rules)
        if rules is None:
            note(f"{u.repository}: no retention rules (every commit is kept)")
            if args.json:
                sys.stdout.write("null\n")  # (JSON for "none": a script reading stdout gets a value)
            return 0
        sys.stdout.write(rules.to_json() + "\n")
    return 0


def _add_release(p) -> None:
    p.add_argument("--release", action="append", default=[], metavar="CLAIM",
                   help="first remove this claim of another repository on the namespace (repeatable): gc refuses "
                        "to run while another repository claims the namespace (a refs dump restored elsewhere, "
                        "a KV copy): it would delete what that one names. Only for one gone for good")


def _sole_writer(args, repo) -> None:
    """Conflict (exit 4) while another repository claims the namespace (graveler.claims)."""
    from graveler import claims

    claims.check_sole_writer(repo, args.release)


def _mark(args, repo):
    from graveler.spark.gc import mark

    from graveler.spark.gc import MAX_MIN_AGE

    limit = MAX_MIN_AGE.total_seconds() / 3600
    if not 0 <= args.min_age <= limit:  # (also NaN; inf and 1e12 overflowed a timedelta: a traceback)
        raise InvalidArgument(f"--min-age must be a number of hours from 0 to {limit:,.0f}, not {args.min_age}")
    if args.min_age < 0.2:  # (a concurrency tour: 0 deleted a running mount's shared empty object, unwarned)
        note(f"lakefuse: warning: --min-age {args.min_age:g} is under 0.2 hours: a mount of this repository running "
             "now reuses one empty object for up to 10 minutes, and objects being written are not staged yet; "
             "they may be deleted")
    _sole_writer(args, repo)
    spark = _spark(args)
    return spark, mark(spark, repo, min_age=timedelta(hours=args.min_age), dry_run=args.dry_run,
                       collect=args.dry_run)


def _report_mark(args, m) -> None:
    if args.json:
        d = asdict(m)
        d.pop("sample")
        emit_json(d)
        return
    if args.dry_run:
        for a in m.addresses or ():
            out(a)
        # (the addresses on stdout, for a pipe; the count beside the other notes)
        note(f"dry run: {_objects(m.candidates)} ({m.bytes:,} bytes) would be deleted; nothing was written")
    else:
        out(f"run {m.run_id}: {_objects(m.candidates)} ({m.bytes:,} bytes) to delete; report {m.report_prefix}")


def _objects(n: int) -> str:
    return f"{n:,} object{'' if n == 1 else 's'}"


def cmd_gc_mark(args) -> int:
    with session(args) as s:
        repo = s.repo(uri_arg(args.repo).repo_only())
        _, m = _mark(args, repo)
    _report_mark(args, m)
    return 0


# objects the store would not delete: the store's failure (exit 6, as every other), the run swept again later
_SWEEP_FAILED = 6
_SWEEP_EPILOG = ("Exit 6 when the store failed to delete some objects (counted as failed): sweep the\n"
                 "run again once the store answers; what was deleted stays deleted. The sweep also\n"
                 "removes what writers killed mid-write left, last active before the mark's cutoff and\n"
                 "over an hour ago: on a local namespace their temp files (.lakefuse-tmp-*), on S3\n"
                 "their open multipart uploads under the namespace (aborted: their parts are billed).\n"
                 "'deleted' counts the objects the store was asked to delete: one an earlier run's sweep\n"
                 "took already counts again (S3 does not say which keys it had).")


def cmd_gc_run(args) -> int:
    from graveler.spark.gc import sweep

    with session(args) as s:
        repo = s.repo(uri_arg(args.repo).repo_only())
        spark, m = _mark(args, repo)
        _report_mark(args, m)
        if not args.dry_run:
            r = sweep(spark, repo, m.run_id)
            _print(args, asdict(r), f"run {r.run_id}: {r.deleted} deleted, {r.kept} kept (live again), "
                                    f"{r.failed} failed{_temps(r, 'removed')}")
            return _SWEEP_FAILED if r.failed else 0
    return 0


def _temps(r, verb: str) -> str:
    """The sweep's stale temp files (a local namespace) or multipart uploads (S3: aborted), when
    there were any."""
    if not r.temp_files:
        return ""
    if r.temp_kind == "multipart upload":
        verb = verb.replace("removed", "aborted")
    return f"; {r.temp_files} stale {r.temp_kind}{'s' if r.temp_files != 1 else ''} ({r.temp_bytes:,} bytes) {verb}"


def cmd_gc_sweep(args) -> int:
    from graveler.spark.gc import sweep

    with session(args) as s:
        repo = s.repo(uri_arg(args.repo).repo_only())
        _sole_writer(args, repo)
        r = sweep(_spark(args), repo, args.run_id, dry_run=args.dry_run)
    if r.swept_before is not None:
        _print(args, asdict(r), f"run {r.run_id}: swept already at {r.swept_before}; nothing to delete")
        return 0
    verb = "would be deleted" if args.dry_run else "deleted"
    _print(args, asdict(r), f"run {r.run_id}: {r.deleted} {verb}, {r.kept} kept (live again), {r.failed} failed"
                            f"{_temps(r, 'would be removed' if args.dry_run else 'removed')}")
    return _SWEEP_FAILED if r.failed else 0


def cmd_gc_runs(args) -> int:
    from graveler.spark.gc import list_runs

    with session(args) as s:
        runs = list_runs(s.repo(uri_arg(args.repo).repo_only()))
    for r in runs:
        if args.json:
            emit_json({k: r[k] for k in ("run_id", "created", "cutoff", "candidates", "bytes", "report")})
        else:
            out(f"{r['run_id']}  {r['candidates']} objects  {r['bytes']} bytes")
    return 0


def cmd_export(args) -> int:
    from graveler.spark.export import export

    from graveler.objstore.uri import StorageURI

    u = uri_arg(args.ref)
    ref = u.with_ref()
    dest = _location(args.dest, "export destination")
    if "://" not in dest:  # a path relative to here, as import's SOURCE and `fs upload --source`
        dest = os.path.abspath(dest)
    StorageURI.parse(dest)  # a malformed DEST: before Spark starts
    with session(args) as s:
        repo = s.repo(u)
        repo.get_commit(ref)  # fail before starting Spark
        res = export(_spark(args), repo, ref, dest, previous=args.previous, full=args.full,
                     partitions=args.partitions)
    how = f"incremental from {res.previous[:12]}" if res.previous else "full"
    extra = (f", {res.links} links made" if res.links else "") + (
        f", {res.skipped} skipped (FIFOs, sockets, devices{', links: S3 has none' if dest.startswith('s3://') else ''})"
        if res.skipped else "")
    _print(args, asdict(res), f"exported {res.commit_id[:12]} to {args.dest}: {res.copied} copied{extra}, "
                              f"{res.deleted} deleted ({how})")
    return 0


__all__ = ["register"]
