"""``commit``, ``log``, ``show``, ``diff``, ``merge`` and ``revert``."""

from __future__ import annotations

import argparse
import logging
from typing import Iterator

from graveler.errors import InvalidArgument, MergeConflict, NotFound, ReadOnlyRef
from graveler import Repository
from graveler.model import DiffRecord, DiffType, Entry
from graveler.refs import Commit
from lakefuse.cli.vc_common import (
    add_command,
    commit_json,
    decode_key,
    emit_json,
    entry_json,
    local_time,
    note,
    out,
    parse_meta,
    print_commit,
    ref_arg,
    session,
    show_name,
    uri_arg,
)

log = logging.getLogger(__name__)

_SIGN = {DiffType.ADDED: "+", DiffType.REMOVED: "-", DiffType.CHANGED: "~"}

DIFF_EPILOG = """\
With two refs: the committed differences from LEFT to RIGHT (a branch counts as
its head commit; its uncommitted changes are not included), as git's `diff A B`
(two-dot); with --three-dot, RIGHT's changes since its merge base with LEFT, as
git's `diff A...B` and lakectl's default: what a merge of RIGHT into LEFT brings (with
several best common ancestors, over the same virtual base the merge takes). git's
forms in one argument are taken too: lakefs://REPO/A..B is LEFT A and RIGHT B,
lakefs://REPO/A...B the same with --three-dot. With one branch: its uncommitted
changes against its head commit.

Each line is `+ path` (added), `- path` (removed) or `~ path` (changed);
--json prints one object per line: type, path, and the left / right entries."""


def register(sub) -> None:
    p = add_command(sub, "commit", "commit a branch's staged changes", cmd_commit,
                    epilog="The commit (as every merge, revert and import) names $LAKEFUSE_COMMITTER as its committer,\n"
                           "else the login name of the user running the command.\n\n"
                           "A commit waits (60 s at most) while a mount renames a large directory on the branch, and\n"
                           "is refused at once (exit 4) while a mount, on this host or another, holds files written\n"
                           "there whose saves failed and are being retried: the message names them and the mount.\n"
                           "Commit again once they are saved; a killed mount's files are recovered when it is\n"
                           "mounted again (same --cache-dir); `branch reset` discards them.")
    p.add_argument("branch", metavar="lakefs://REPO/BRANCH")
    p.add_argument("-m", "--message", required=True, help="commit message")
    p.add_argument("--meta", metavar="KEY=VALUE", action="append", help="commit metadata (repeatable)")
    p.add_argument("--allow-empty", action="store_true", help="commit even if nothing changed")
    p.add_argument("--allow-empty-message", action="store_true",
                   help="take an empty (or blank) message; refused without it, as git and lakectl do")

    p = add_command(sub, "log", "show the history of a ref, newest first", cmd_log,
                    epilog="Every ancestor once, as lakectl log (and git log) show them: newest first by creation\n"
                           "date (among commits of one time, a child before its parent, then the higher commit\n"
                           "ID); one line each, a merge's marked '(merge)' unless its message says so. --first-parent\n"
                           "follows first parents only: the branch's own line, a merge standing for what it\n"
                           "brought in.")
    p.add_argument("ref", metavar="lakefs://REPO/REF")
    p.add_argument("--amount", "-n", type=int, metavar="N", help="show at most N commits")
    p.add_argument("--first-parent", action="store_true", help="follow first parents only")

    p = add_command(sub, "show", "show the commit a ref points at", cmd_show)
    p.add_argument("ref", metavar="lakefs://REPO/REF")

    p = add_command(sub, "fsck", "check a whole repository: every record and table, and (--objects) every object",
                    cmd_fsck,
                    epilog="Reads everything once and lists every problem (commit records that do not hash to\n"
                           "their IDs, missing parents, branches and tags naming no commit, a branch\n"
                           "whose record is lost (its birth is there), metaranges and\n"
                           "ranges missing, damaged or under the wrong name; with --objects, entries whose\n"
                           "object is missing or of another size, with --objects md5 also of another MD5).\n"
                           "Changes nothing. Exit 0: healthy; 5: problems found (each on a line).")
    p.add_argument("repository", metavar="lakefs://REPO")
    p.add_argument("--objects", choices=("none", "exist", "md5"), default="none",
                   help="also check the objects entries name (committed and staged): exist (there, of the entry's "
                        "size: one HEAD each) or md5 (read whole and hashed); default: none")

    p = add_command(sub, "diff", "show the differences between two refs, or a branch's uncommitted changes",
                    cmd_diff, epilog=DIFF_EPILOG)
    p.add_argument("left", metavar="lakefs://REPO/LEFT")
    p.add_argument("right", metavar="RIGHT", nargs="?", help="lakefs://REPO/REF, or a plain ref of LEFT's repository")
    p.add_argument("--three-dot", action="store_true",
                   help="RIGHT's changes since the merge base of LEFT and RIGHT (lakectl's default)")

    p = add_command(
        sub, "merge", "merge a ref into a branch (three-way, with a merge commit)", cmd_merge,
        epilog="Without --strategy, paths changed differently on both sides fail the merge.\n"
               "The destination branch must have no uncommitted changes.",
    )
    p.add_argument("source", metavar="SOURCE", help="lakefs://REPO/REF, or a plain ref of DEST's repository")
    p.add_argument("dest", metavar="lakefs://REPO/DEST")
    p.add_argument("--strategy", choices=("dest-wins", "source-wins"),
                   help="resolve conflicts in favour of the destination or the source")
    p.add_argument("-m", "--message", help="merge commit message (default: Merge 'SOURCE' into 'DEST')")
    p.add_argument("--meta", metavar="KEY=VALUE", action="append", help="merge commit metadata (repeatable)")

    p = add_command(sub, "revert", "commit the inverse of a commit's changes on a branch", cmd_revert)
    p.add_argument("branch", metavar="lakefs://REPO/BRANCH")
    p.add_argument("commit", metavar="COMMIT", help="the commit to revert: a ref (commit ID, main~1, a tag) or lakefs://REPO/REF")
    p.add_argument("--parent-number", "-p", type=int, default=None, metavar="N",
                   help="for a merge commit: revert against its N-th parent (1-based)")
    p.add_argument("-m", "--message", help="commit message (default: Revert <commit ID>)")


# ---------------------------------------------------------------------- helpers


def _change_counts(repo: Repository, c: Commit) -> dict[str, int]:
    counts = {"added": 0, "removed": 0, "changed": 0}
    if c.parents:
        for d in repo.diff(c.parents[0], c.id):
            counts[d.type.value] += 1
    return counts


def _report_commit(args, repo: Repository, branch: str, c: Commit) -> None:
    counts = _change_counts(repo, c)
    if args.json:
        emit_json({**commit_json(c), "branch": branch, "changes": counts})
        return
    first = c.message.splitlines()[0] if c.message else ""
    out(f"[{branch} {c.id[:12]}] {first} (+{counts['added']} -{counts['removed']} ~{counts['changed']})")


def _entry_or_none(repo: Repository, path: str, v) -> dict | None:
    if v is None:
        return None
    d = entry_json(repo, path, Entry.from_value(v))
    del d["path"]
    return d


def _print_diff(args, repo: Repository, records: Iterator[DiffRecord]) -> None:
    for d in records:
        path = decode_key(d.key)
        if args.json:
            emit_json({"type": d.type.value, "path": path,
                       "left": _entry_or_none(repo, path, d.left), "right": _entry_or_none(repo, path, d.right)})
        else:
            out(f"{_SIGN[d.type]} {show_name(path)}")


# ---------------------------------------------------------------------- commands


def cmd_commit(args: argparse.Namespace) -> int:
    u = uri_arg(args.branch)
    branch = u.with_ref("branch")
    metadata = parse_meta(args.meta)
    if not args.message.strip() and not args.allow_empty_message:
        raise InvalidArgument("the commit message is empty (--allow-empty-message commits with it anyway)")
    with session(args) as s:
        repo = s.repo(u)
        c = repo.commit(branch, args.message, metadata=metadata, allow_empty=args.allow_empty)
        _report_commit(args, repo, branch, c)
    return 0


def cmd_log(args: argparse.Namespace) -> int:
    u = uri_arg(args.ref)
    ref = u.with_ref()
    if args.amount is not None and args.amount < 0:
        raise InvalidArgument(f"--amount must be >= 0, not {args.amount}")
    with session(args) as s:
        repo = s.repo(u)
        for c in repo.log(ref, amount=args.amount, first_parent=args.first_parent):
            if args.json:
                emit_json(commit_json(c))
            else:
                first = c.message.splitlines()[0] if c.message else ""
                # (a merge marked as such: "Merge: " read as lakectl's line of parent IDs -- a refs tour)
                merge = "(merge) " if len(c.parents) > 1 and not first.lower().startswith("merge") else ""
                out(f"{c.id[:12]}  {local_time(c.creation_date)}  {c.committer:<12}  {merge}{first}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    u = uri_arg(args.ref)
    ref = u.with_ref()
    with session(args) as s:
        c = s.repo(u).get_commit(ref)
    if args.json:
        emit_json(commit_json(c))
    else:
        print_commit(c)
    return 0


def cmd_diff(args: argparse.Namespace) -> int:
    left = uri_arg(args.left)
    lref = left.with_ref()
    rref, three_dot = None, args.three_dot
    if args.right is None and ".." in lref:  # git's A..B (A B) and A...B (--three-dot): ".." is in no ref name
        dots = "..." if "..." in lref else ".."
        lref, rref = lref.split(dots, 1)
        if not lref or not rref:
            raise InvalidArgument(f"{args.left}: give both sides of {dots!r} (there is no HEAD here)")
        three_dot = three_dot or dots == "..."
    with session(args) as s:
        repo = s.repo(left)
        if args.right is None and rref is None:
            if three_dot:
                raise InvalidArgument("--three-dot compares two refs: give RIGHT too")
            try:
                records = repo.diff_uncommitted(lref)
            except ReadOnlyRef as e:  # a tag or a commit: nothing uncommitted, and nothing changes (bad input)
                what = str(e).replace(": it cannot be changed", "")
                raise InvalidArgument(f"{what}: uncommitted changes are a branch's; give two refs to compare "
                                      f"(lakefuse diff {args.left} lakefs://{left.repository}/OTHER)") from None
            except NotFound:  # no such branch: an expression's own error says why (main^2, main~1a)
                repo.get_commit(lref)
                raise
        else:
            if rref is None:
                rref = ref_arg(args.right, left.repository)  # (a plain ref too, as revert's and tag's)
            if three_dot:  # (against the base a merge takes: a virtual one in criss-cross histories)
                records = repo.diff_since_base(lref, rref)
                if records is None:
                    raise InvalidArgument(f"{lref} and {rref} have no common ancestor: --three-dot has no base")
            else:
                records = repo.diff(lref, rref)
        _print_diff(args, repo, records)
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    dest = uri_arg(args.dest)
    dbranch = dest.with_ref("branch")
    sref = ref_arg(args.source, dest.repository, "source")  # (a plain ref too, as revert's and tag's)
    src = dest
    if args.message is not None and not args.message.strip():  # (as commit's -m; none given: the default)
        raise InvalidArgument("the merge message is empty: leave out -m for the default one")
    metadata = parse_meta(args.meta)
    with session(args) as s:
        repo = s.repo(src)
        try:
            c = repo.merge(sref, dbranch, strategy=args.strategy or "none", message=args.message, metadata=metadata)
        except MergeConflict as e:
            if args.json:  # the conflicting paths, as the control file's read-back gives them (exit 4 still)
                emit_json({"merged": False, "conflicts": [decode_key(k) for k in e.keys], "count": e.count})
            raise MergeConflict(f"{e}; use --strategy dest-wins or source-wins to resolve", e.keys, e.count) from None
        _report_commit(args, repo, dbranch, c)
    return 0


def cmd_revert(args: argparse.Namespace) -> int:
    u = uri_arg(args.branch)
    branch = u.with_ref("branch")
    if args.parent_number is not None and args.parent_number < 1:
        raise InvalidArgument(f"--parent-number must be >= 1, not {args.parent_number}")
    with session(args) as s:
        repo = s.repo(u)
        ref = ref_arg(args.commit, u.repository, "commit")
        c = repo.revert(branch, ref, parent_number=args.parent_number or 0, message=args.message)
        _report_commit(args, repo, branch, c)
    return 0


def cmd_fsck(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    u = uri_arg(args.repository).repo_only()
    with session(args) as s:
        repo = s.repo(u)
        rep = repo.fsck(args.objects, progress=None if args.json else (lambda line: note(f"fsck: {line}")))
    if args.json:
        emit_json({"repository": u.repository, "healthy": rep.healthy, **asdict(rep)})
    else:
        for p in rep.problems:
            out(f"{p.kind} {p.name}: {p.detail}")
        checked = (f"{rep.commits} commits, {rep.branches} branches, {rep.tags} tags, {rep.metaranges} metaranges, "
                   f"{rep.ranges} ranges" + (f", {rep.objects} objects" if args.objects != "none" else ""))
        out(f"{u.repository}: {'healthy' if rep.healthy else f'{len(rep.problems)} problem(s)'} ({checked} checked)")
    return 0 if rep.healthy else 5

