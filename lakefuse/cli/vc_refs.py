"""``repo``, ``branch``, ``tag`` and ``refs`` commands."""

from __future__ import annotations

import argparse
import logging
import sys

from graveler.errors import AlreadyExists, Conflict, CorruptedData, GravelerError, InvalidArgument, NotFound
from graveler.objstore.uri import StorageURI
from graveler.refs.names import validate_branch_name
from graveler.refsdump import MANIFEST_KEY, parse_manifest
from lakefuse.cli.common import exit_code
from lakefuse.cli.vc_common import (
    ALLOW_LOCAL_HELP,
    add_command,
    check_shared_namespace,
    add_group,
    emit_json,
    iso,
    local_time,
    note,
    out,
    ref_arg,
    session,
    table,
    uri_arg,
)

log = logging.getLogger(__name__)



def default_storage(home, repo: str) -> str:
    """The storage namespace of a repository created without ``--storage``."""
    return str(StorageURI("file", "", str(home / "storage" / repo)))


def register(sub) -> None:
    # repo ---------------------------------------------------------------------
    g = add_group(sub, "repo", "create, list and delete repositories")
    p = add_command(
        g, "create", "create a repository and its initial commit", cmd_repo_create,
        epilog="Without --storage the namespace is a local directory under the home:\n"
               "  file://<home>/storage/<REPO>\n"
               "A namespace that holds a refs dump (_lakefs/refs_manifest.json) is refused:\n"
               "bring that repository back with `lakefuse refs restore` instead.\n"
               "So is one that another repository of this KV uses, or one inside or around it\n"
               "(each one's garbage collection would sweep the other's objects).\n"
               "On a shared KV (--kv postgresql://...) a file:// namespace is refused unless\n"
               "--allow-local-storage: other hosts would see the repository but not its data.",
    )
    p.add_argument("repository", metavar="lakefs://REPO")
    p.add_argument("--storage", metavar="URI",
                   help="storage namespace: file:///abs/path (or the absolute path) or s3://bucket/prefix "
                        "(default: file://<home>/storage/<REPO>)")
    p.add_argument("--default-branch", metavar="NAME", default="main", help="name of the default branch (default: main)")
    p.add_argument("--allow-local-storage", action="store_true", help=ALLOW_LOCAL_HELP)
    add_command(g, "list", "list the repositories of the home (or of the shared KV: every host's)", cmd_repo_list)
    p = add_command(
        g, "delete", "forget a repository (its refs and staged changes; the storage namespace is kept)",
        cmd_repo_delete,
        epilog="Committed data stays in the namespace; run `lakefuse refs dump` first to be able to\n"
               "restore the repository's commits, branches and tags later. Refused (exit 4) while another\n"
               "process on this host has the repository open (a mount: unmount it first); on a shared\n"
               "PostgreSQL KV, mounts on other hosts are not seen: unmount them first.",
    )
    p.add_argument("repository", metavar="lakefs://REPO")
    p.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")

    # branch -------------------------------------------------------------------
    g = add_group(sub, "branch", "create, list, delete and reset branches")
    p = add_command(g, "create", "create a branch at a ref", cmd_branch_create)
    p.add_argument("branch", metavar="lakefs://REPO/NEW")
    p.add_argument("--source", "-s", metavar="REF", required=True,
                   help="where the branch starts: a ref (main, v1, main~2, a commit ID) or lakefs://REPO/REF")
    p = add_command(g, "list", "list the branches of a repository", cmd_branch_list)
    p.add_argument("repository", metavar="lakefs://REPO")
    p = add_command(g, "delete", "delete a branch and its uncommitted changes", cmd_branch_delete)
    p.add_argument("branch", metavar="lakefs://REPO/BRANCH")
    p = add_command(g, "reset", "discard uncommitted changes: all of them, one path, or a prefix", cmd_branch_reset)
    p.add_argument("branch", metavar="lakefs://REPO/BRANCH")
    m = p.add_mutually_exclusive_group()
    m.add_argument("--prefix", metavar="P", help="discard only the changes to paths starting with P, as lakeFS's "
                   "reset of a prefix (a raw prefix: 'dir' takes 'dirx.txt' too; 'dir/' the directory alone)")
    m.add_argument("--path", metavar="P", help="discard only the change to the object at P")

    # tag ----------------------------------------------------------------------
    g = add_group(sub, "tag", "create, list and delete tags")
    p = add_command(g, "create", "tag the commit a ref points at", cmd_tag_create)
    p.add_argument("tag", metavar="lakefs://REPO/TAG")
    p.add_argument("ref", metavar="REF", help="a ref (main, main~1, a commit ID) or lakefs://REPO/REF")
    p.add_argument("-f", "--force", action="store_true",
                   help="move the tag if it exists, in one step (readers of the tag never find it missing)")
    p = add_command(g, "list", "list the tags of a repository", cmd_tag_list)
    p.add_argument("repository", metavar="lakefs://REPO")
    p = add_command(g, "delete", "delete a tag", cmd_tag_delete)
    p.add_argument("tag", metavar="lakefs://REPO/TAG")

    # refs ---------------------------------------------------------------------
    g = add_group(sub, "refs", "dump and restore a repository's refs (lakeFS's refs-dump form)")
    p = add_command(
        g, "dump", "write commits, branches and tags as metaranges plus a manifest into the namespace",
        cmd_refs_dump,
        epilog=f"The manifest is written to <namespace>/{MANIFEST_KEY} and printed.\n"
               "Staged (uncommitted) changes are not part of a dump.",
    )
    p.add_argument("repository", metavar="lakefs://REPO")
    p = add_command(
        g, "restore", "load a refs dump into a new repository", cmd_refs_restore,
        epilog="If the repository does not exist in the home it is created (bare) on --storage\n"
               "(default: file://<home>/storage/<REPO>); an existing one is refused unless it has no branches\n"
               "(as `repo create` makes none without its first commit: give a new name, or delete it first).\n"
               f"The manifest is read from --manifest FILE, else from <namespace>/{MANIFEST_KEY}.\n"
               "Unlike `repo create`, it takes a namespace another repository of this KV uses (as lakeFS's\n"
               "restore does: the dump is that namespace's own). Then only one of the two may run\n"
               "garbage collection: each one's would sweep the objects only the other's commits hold.",
    )
    p.add_argument("repository", metavar="lakefs://REPO")
    p.add_argument("--manifest", metavar="FILE", help="a local refs manifest (JSON) to restore instead of the namespace's")
    p.add_argument("--storage", metavar="URI", help="the namespace, when the repository must be created")
    p.add_argument("--default-branch", metavar="NAME", default="main",
                   help="default branch, when the repository must be created (default: main)")
    p.add_argument("--allow-local-storage", action="store_true", help=ALLOW_LOCAL_HELP)


# ---------------------------------------------------------------------- repo


def _repo_json(rec) -> dict:
    return {
        "name": rec.name,
        "storage_namespace": rec.storage_namespace,
        "default_branch": rec.default_branch,
        "creation_date": iso(rec.creation_date),
    }


def cmd_repo_create(args: argparse.Namespace) -> int:
    u = uri_arg(args.repository).repo_only()
    validate_branch_name(args.default_branch)  # (before anything is made: a namespace's directory)
    with session(args) as s:
        ns = args.storage or default_storage(s.home, u.repository)
        if s.graveler.has_repository(u.repository) and not s.graveler.unfinished(u.repository):
            raise AlreadyExists(f"repository {u.repository!r} already exists")  # (a killed create's: made again)
        check_shared_namespace(s.config, ns, args.allow_local_storage)
        try:  # before anything opens it (a malformed one: create_repository says why)
            s.graveler.check_namespace_free(str(StorageURI.parse(ns)))
        except InvalidArgument:
            pass
        if "://" in ns:
            if s.graveler.has_refs_dump(ns):
                raise AlreadyExists(
                    f"storage namespace {ns} holds a refs dump of a repository: "
                    f"restore it with `lakefuse refs restore {u}` or choose another --storage"
                )
        repo = s.graveler.create_repository(u.repository, ns, default_branch=args.default_branch)
        head = repo.get_commit(repo.default_branch)
        if args.json:
            emit_json({**_repo_json(repo.record), "commit_id": head.id})
        else:
            out(f"Repository {u.repository!r} created")
            out(f"  storage namespace: {repo.record.storage_namespace}")
            out(f"  default branch:    {repo.default_branch} ({head.id[:12]} {head.message})")
    return 0


def cmd_repo_list(args: argparse.Namespace) -> int:
    """Every repository; a damaged one is listed as such (and the exit code says so), never hides the others."""
    damaged: list = []
    with session(args) as s:
        recs = s.graveler.list_repositories(damaged)
    if args.json:
        rows = [(rec.name, _repo_json(rec)) for rec in recs]
        rows += [(name, {"name": name, "damaged": str(e)}) for name, e in damaged]
        for _, obj in sorted(rows, key=lambda r: r[0]):
            emit_json(obj)
    elif recs or damaged:
        rows = [(r.name, r.default_branch, local_time(r.creation_date), r.storage_namespace) for r in recs]
        rows += [(name, "-", "-", ("DAMAGED" if isinstance(e, CorruptedData) else "UNREADABLE") + " (see below)")
                 for name, e in damaged]
        table(sorted(rows), ("REPOSITORY", "DEFAULT BRANCH", "CREATED", "STORAGE NAMESPACE"))
    else:
        note(f"no repositories in {s.home if s.config.kv.url == 'lmdb' else s.graveler.kv.url}")
    for _, e in damaged:
        note(f"lakefuse: {e}")
    return max((exit_code(e) for _, e in damaged), default=0)


def _confirm(question: str) -> bool:
    if not sys.stdin.isatty():
        raise InvalidArgument("refusing to delete without --yes (stdin is not a terminal to ask on)")
    sys.stderr.write(question + " [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def cmd_repo_delete(args: argparse.Namespace) -> int:
    u = uri_arg(args.repository).repo_only()
    with session(args) as s:
        unfinished = s.graveler.unfinished(u.repository)  # (a create killed before its record: nothing to read)
        try:
            ns = None if unfinished else s.repo(u).record.storage_namespace
        except CorruptedData as e:  # a damaged refs database can still be removed (what else could be done with it)
            note(f"lakefuse: {e}")
            ns = None
        where = (f"the data in {ns} is kept" if ns else "a create that never finished" if unfinished
                 else "its storage namespace, unreadable here, is not touched")
        if not args.yes and not _confirm(
            f"Delete repository {u.repository!r} (its branches, tags, commits and staged changes; {where})?"
        ):
            note("not deleted")
            return 1
        s.graveler.delete_repository(u.repository)
    if args.json:
        emit_json({"deleted": u.repository, "storage_namespace": ns})
    elif ns:
        out(f"Repository {u.repository!r} deleted (its storage namespace {ns} was kept)")
    elif unfinished:
        out(f"Repository {u.repository!r} deleted (its create had never finished)")
    else:
        out(f"Repository {u.repository!r} deleted (its refs database was damaged; its storage namespace was not touched)")
    return 0


# ---------------------------------------------------------------------- branch


def _shadow_note(repo, other: str, name: str, what: str) -> None:
    """Say so (stderr) when a new branch or tag shares its name with a tag or branch: a ref
    resolves to the branch first (git warns of such an ambiguous name too)."""
    if repo.has_ref(other, name):
        note(f"note: a {other} {name!r} exists too: {what}")
    if repo.prefix_commits(name):
        note(f"note: {name!r} is also a commit-ID prefix: lakefs://{repo.name}/{name} now names the {other_of(other)}, "
             "reach the commit by a longer prefix")


def other_of(kind: str) -> str:
    return "branch" if kind == "tag" else "tag"


def cmd_branch_create(args: argparse.Namespace) -> int:
    u = uri_arg(args.branch)
    name = u.with_ref("branch")
    with session(args) as s:
        repo = s.repo(u)
        b = repo.create_branch(name, ref_arg(args.source, u.repository, "source ref"))
        _shadow_note(repo, "tag", name, f"lakefs://{u.repository}/{name} now names this branch, not the tag")
    if args.json:
        emit_json({"name": b.name, "commit_id": b.commit_id})
    else:
        out(f"Branch {b.name!r} created at {b.commit_id[:12]}")
    return 0


def cmd_branch_list(args: argparse.Namespace) -> int:
    u = uri_arg(args.repository).repo_only()
    with session(args) as s:
        repo = s.repo(u)
        branches = repo.list_branches()
        default = repo.default_branch
    if args.json:
        for b in branches:
            emit_json({"name": b.name, "commit_id": b.commit_id, "default": b.name == default})
    else:
        table([(("* " if b.name == default else "  ") + b.name, b.commit_id[:12]) for b in branches],
              ("  BRANCH", "COMMIT"))
    return 0


def cmd_branch_delete(args: argparse.Namespace) -> int:
    u = uri_arg(args.branch)
    name = u.with_ref("branch")
    with session(args) as s:
        repo = s.repo(u)
        # (counted just before: what the delete takes with it, which nothing brings back -- said so)
        dropped = sum(1 for _ in repo.diff_uncommitted(name)) if name != repo.default_branch else 0
        was = repo.delete_branch(name)
    if args.json:
        emit_json({"deleted": name, "commit_id": was.commit_id, "discarded_changes": dropped})
    else:  # (as git's "(was 70e3a2f)": the one way back to commits no other ref holds)
        back = f"lakefuse branch create lakefs://{u.repository}/{name} --source {was.commit_id[:12]}"
        if dropped:
            out(f"Branch {name!r} deleted (was {was.commit_id[:12]}) with its {dropped} uncommitted change(s), "
                f"discarded: {back} brings back its commit, not them")
        else:
            out(f"Branch {name!r} deleted (was {was.commit_id[:12]}; {back} brings it back)")
    return 0


def _value(repo, ref: str, path: str):
    """The record at ``path`` on ``ref`` (None: none)."""
    try:
        return repo.get_value(ref, path)
    except NotFound:
        return None


def cmd_branch_reset(args: argparse.Namespace) -> int:
    u = uri_arg(args.branch)
    name = u.with_ref("branch")
    with session(args) as s:
        repo = s.repo(u)
        matched = True  # (a path or prefix with no uncommitted change: said so)
        if args.path is not None:  # two point reads: the branch's value and its head's
            matched = _value(repo, name, args.path) != _value(repo, repo.get_branch(name).commit_id, args.path)
        elif args.prefix is not None:
            key = args.prefix.encode()
            matched = any(d.key.startswith(key) for d in repo.diff_uncommitted(name))
        what = (f"path {args.path!r}" if args.path is not None
                else f"prefix {args.prefix!r}" if args.prefix is not None else "all")
        if not matched and not repo.names_anything(name, args.path, args.prefix):
            # as `git restore nosuchfile`, and the mount's reset control file: an error, not a silent success
            raise NotFound(f"{what} matches nothing on branch {name!r} (no object or directory there, staged "
                           f"or committed)")
        repo.reset(name, path=args.path, prefix=args.prefix)
    if args.json:
        emit_json({"branch": name, "reset": "all" if what == "all" else (args.path or args.prefix),
                   "kind": "path" if args.path is not None else "prefix" if args.prefix is not None else "all",
                   "matched": matched})
    elif not matched:
        out(f"Branch {name!r}: no uncommitted change at {what}; nothing discarded"
            + (" (--path names one object; --prefix P/ what is under a directory)" if args.path is not None else ""))
    else:
        out(f"Branch {name!r}: uncommitted changes discarded ({what})")
    return 0


# ---------------------------------------------------------------------- tag


def cmd_tag_create(args: argparse.Namespace) -> int:
    u = uri_arg(args.tag)
    name = u.with_ref("tag")
    with session(args) as s:
        repo = s.repo(u)
        was: list[str] = []
        t = repo.create_tag(name, ref_arg(args.ref, u.repository), force=args.force, previous=was)
        _shadow_note(repo, "branch", name, f"lakefs://{u.repository}/{name} names the branch: this tag is "
                                           "reached only by its commit")
    if args.json:
        emit_json({"name": t.name, "commit_id": t.commit_id, **({"was": was[-1]} if was else {})})
    elif was:  # (what a move replaced, as git's "Updated tag (was ...)": the move can be undone)
        out(f"Tag {t.name!r} moved to {t.commit_id[:12]} (was {was[-1][:12]})")
    else:
        out(f"Tag {t.name!r} created at {t.commit_id[:12]}")
    return 0


def cmd_tag_list(args: argparse.Namespace) -> int:
    u = uri_arg(args.repository).repo_only()
    with session(args) as s:
        tags = s.repo(u).list_tags()
    if args.json:
        for t in tags:
            emit_json({"name": t.name, "commit_id": t.commit_id})
    elif tags:
        table([(t.name, t.commit_id[:12]) for t in tags], ("TAG", "COMMIT"))
    return 0


def cmd_tag_delete(args: argparse.Namespace) -> int:
    u = uri_arg(args.tag)
    name = u.with_ref("tag")
    with session(args) as s:
        was = s.repo(u).delete_tag(name)
    if args.json:
        emit_json({"deleted": name, "commit_id": was.commit_id})
    else:
        out(f"Tag {name!r} deleted (was {was.commit_id[:12]}; `lakefuse tag create lakefs://{u.repository}/{name} "
            f"{was.commit_id}` makes it again)")
    return 0


# ---------------------------------------------------------------------- refs


def cmd_refs_dump(args: argparse.Namespace) -> int:
    u = uri_arg(args.repository).repo_only()
    with session(args) as s:
        repo = s.repo(u)
        manifest = repo.dump_refs()
        where = StorageURI.parse(repo.record.storage_namespace).object_uri(MANIFEST_KEY)
        try:  # (one manifest per namespace: a dump of another repository there replaces this one)
            from graveler import claims

            own = claims.own_claim(repo)
            others = sorted(v.get("repository", "?") for k, v in claims.list_claims(repo).items() if k != own)
        except GravelerError:
            others = []
        if others:
            note(f"lakefuse: warning: {repo.record.storage_namespace} is written by other repositories too "
                 f"({', '.join(others)}): a dump of one of them replaces this one's manifest; keep it elsewhere "
                 f"(this command's --json output) and restore with --manifest")
    if args.json:
        emit_json(manifest)
    else:
        for k in sorted(manifest):
            out(f"{k}: {manifest[k]}")
        note(f"refs manifest written to {where}")
    return 0


def _read_manifest_file(path: str) -> dict[str, str]:
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise NotFound(f"manifest file not found: {path}") from None
    except IsADirectoryError:
        raise InvalidArgument(f"manifest {path} is a directory") from None
    return parse_manifest(raw, path)


def cmd_refs_restore(args: argparse.Namespace) -> int:
    u = uri_arg(args.repository).repo_only()
    manifest = _read_manifest_file(args.manifest) if args.manifest else None
    with session(args) as s:
        created = False
        try:
            repo = s.repo(u)
            if args.storage and StorageURI.parse(args.storage) != StorageURI.parse(repo.record.storage_namespace):
                raise InvalidArgument(
                    f"repository {u.repository!r} exists with namespace {repo.record.storage_namespace}, not {args.storage}"
                )
            if repo.list_branches():  # say so before looking for a dump
                raise Conflict(f"repository {u.repository!r} exists and has branches: refs are restored only into "
                               "a new repository (give another name, or `lakefuse repo delete` it first)")
        except NotFound:
            ns = args.storage or default_storage(s.home, u.repository)
            check_shared_namespace(s.config, ns, args.allow_local_storage)
            if manifest is None and not s.graveler.has_refs_dump(ns):  # (before anything is made there)
                raise NotFound(f"no refs dump in {StorageURI.parse(ns)} ({MANIFEST_KEY} missing)")
            repo = s.graveler.create_repository(u.repository, ns, default_branch=args.default_branch, bare=True)
            created = True
        try:
            repo.restore_refs(manifest)
        except BaseException:
            if created:  # leave nothing half-made behind
                s.graveler.delete_repository(u.repository)
            raise
        branches = repo.list_branches()
        tags = repo.list_tags()
        n_commits = repo.count_commits()
        if repo.default_branch not in {b.name for b in branches}:
            note(f"lakefuse: warning: the dump has no branch {repo.default_branch!r} (the default branch); "
                 f"branches: {', '.join(b.name for b in branches) or 'none'}")
    if args.json:
        emit_json({"repository": u.repository, "storage_namespace": repo.record.storage_namespace,
                   "commits": n_commits, "branches": [b.name for b in branches], "tags": [t.name for t in tags]})
    else:
        out(f"Repository {u.repository!r} restored from {repo.record.storage_namespace}: "
            f"{n_commits} commits, {len(branches)} branches, {len(tags)} tags")
    return 0
