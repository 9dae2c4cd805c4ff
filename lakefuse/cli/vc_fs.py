"""``fs`` commands: upload, cat, ls, stat, rm objects on a ref."""

from __future__ import annotations

import argparse
import logging
import mimetypes
import os
import stat as stat_mod
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from graveler.errors import InvalidArgument, NotFound
from graveler import Repository
from graveler.model import Entry
from graveler.objects import RESERVED_NAME, is_md5_etag
from graveler.staging import as_path
from lakefuse.cli.vc_common import (
    add_command,
    add_group,
    decode_key,
    emit_json,
    entry_json,
    human_size,
    local_time_ns,
    note,
    one_line,
    out,
    physical_address,
    session,
    show_name,
    uri_arg,
)

log = logging.getLogger(__name__)

DEFAULT_CONTENT_TYPE = "application/octet-stream"
STAGE_BATCH = 1000  # entries staged per LMDB transaction in a recursive upload
UPLOAD_THREADS = 8
CAT_CHUNK = 8 << 20
CAT_WHOLE_MAX = 256 << 20  # fs cat holds an object up to this size while it checks it; a larger one is read twice

UPLOAD_EPILOG = """\
With --recursive, SOURCE is a local directory and PATH a prefix: every regular
file under SOURCE is uploaded to PATH/<its path relative to SOURCE>; the files
are uploaded in parallel and staged in batches of %d. Symbolic links are
skipped, not followed (following could leave the tree or loop; the mount keeps
symlinks as symlinks), and so are other special files; each skipped one is
reported on stderr. Paths are checked before anything is uploaded.

Without --recursive, a PATH that is empty or ends in '/' gets SOURCE's file
name appended. The content type is --content-type, else guessed from the file
name, else %s.

A progress bar is shown on stderr when it is a terminal, or with --progress.""" % (STAGE_BATCH, DEFAULT_CONTENT_TYPE)

LS_EPILOG = """\
PREFIX is a key prefix, as in lakectl: `lakefs://repo/main/data/` lists the
contents of data/, `lakefs://repo/main/data` lists what starts with "data"
(for instance the common prefix data/). Without --recursive, keys below the next
'/' are folded into common prefixes (directories); names are shown relative to
the prefix's last '/' (a directory marker, the key of the prefix itself, by its
whole key)."""


def register(sub) -> None:
    g = add_group(sub, "fs", "upload, read, list, inspect and delete objects")
    p = add_command(g, "upload", "upload a local file (or a directory tree) and stage it on a branch", cmd_upload,
                    epilog=UPLOAD_EPILOG)
    p.add_argument("dest", metavar="lakefs://REPO/BRANCH/PATH")
    p.add_argument("--source", "-s", metavar="LOCAL", required=True, help="local file (directory with --recursive)")
    p.add_argument("--recursive", "-r", action="store_true", help="upload a directory tree under the PATH prefix")
    p.add_argument("--content-type", metavar="T", help="content type of the object(s) (default: guessed)")
    p.add_argument("--progress", action="store_true", help="show a progress bar even if stderr is not a terminal")
    p = add_command(g, "cat", "write an object's content to stdout, checked before its first byte (an object "
                              "over 256 MiB with an MD5 etag is read twice: to check it, then to write it)",
                    cmd_cat, json_output=False)
    p.add_argument("path", metavar="lakefs://REPO/REF/PATH")
    p = add_command(g, "ls", "list objects and common prefixes under a prefix", cmd_ls, epilog=LS_EPILOG)
    p.add_argument("prefix", metavar="lakefs://REPO/REF/[PREFIX]")
    p.add_argument("--recursive", "-r", action="store_true", help="list every object under the prefix, no folding")
    p = add_command(g, "stat", "show an object's entry: address, size, etag, mtime, content type, metadata", cmd_stat)
    p.add_argument("path", metavar="lakefs://REPO/REF/PATH")
    p = add_command(g, "rm", "delete an object (or every object under a prefix) on a branch", cmd_rm,
                    epilog="With --recursive, PATH is a directory prefix ('/' is appended if missing). An empty\n"
                           "PATH (lakefs://REPO/BRANCH/) means every object on the branch and needs --all.")
    p.add_argument("path", metavar="lakefs://REPO/BRANCH/PATH")
    p.add_argument("--recursive", "-r", action="store_true", help="delete every object under the PATH prefix")
    p.add_argument("--all", action="store_true",
                   help="with --recursive and an empty PATH: really delete every object on the branch")


# ---------------------------------------------------------------------- upload


@dataclass(frozen=True, slots=True)
class _File:
    local: str
    path: str  # destination object path
    size: int


RESERVED_WHY = f"the name {RESERVED_NAME!r} is the mount's (its control files): it cannot show such a key"


def _content_type(args, local: str) -> str:
    if args.content_type:
        return args.content_type
    guessed, _ = mimetypes.guess_type(local, strict=False)
    return guessed or DEFAULT_CONTENT_TYPE


def _walk(root: str, prefix: str) -> tuple[list[_File], list[tuple[str, str]]]:
    """Regular files under ``root`` (sorted, symlinks not followed) and the skipped ones."""
    files: list[_File] = []
    skipped: list[tuple[str, str]] = []

    def onerror(e: OSError) -> None:
        raise e

    for dirpath, dirnames, filenames in os.walk(root, onerror=onerror, followlinks=False):
        dirnames.sort()
        for name in list(dirnames):
            if os.path.islink(os.path.join(dirpath, name)) or name == RESERVED_NAME:
                skipped.append((os.path.join(dirpath, name), "symlink" if name != RESERVED_NAME else RESERVED_WHY))
                dirnames.remove(name)
        for name in sorted(filenames):
            local = os.path.join(dirpath, name)
            if name == RESERVED_NAME:
                skipped.append((local, RESERVED_WHY))
                continue
            st = os.lstat(local)
            if stat_mod.S_ISLNK(st.st_mode):
                skipped.append((local, "symlink"))
                continue
            if not stat_mod.S_ISREG(st.st_mode):
                skipped.append((local, "not a regular file"))
                continue
            rel = os.path.relpath(local, root).replace(os.sep, "/")
            files.append(_File(local, prefix + rel, st.st_size))
    return files, skipped


def _progress(args, total: int):
    """A rich progress bar on stderr, or None when it should not show."""
    if not (args.progress or sys.stderr.isatty()):
        return None
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    console = Console(file=sys.stderr, force_terminal=True if args.progress else None)
    return Progress(
        TextColumn("[progress.description]{task.description}"), BarColumn(), DownloadColumn(),
        TransferSpeedColumn(), TimeRemainingColumn(), TextColumn("{task.fields[files]}"),
        console=console,
    )


def _upload_tree(args, repo: Repository, branch: str, root: str, prefix: str) -> dict:
    files, skipped = _walk(root, prefix)
    for local, why in skipped:
        note(f"lakefuse: skipped {local} ({why})")
    for f in files:  # every path is checked before anything is uploaded
        try:
            as_path(f.path)
        except InvalidArgument as e:  # (the file it is: a path's length alone does not tell which)
            raise type(e)(f"{show_name(f.local)}: {e} (nothing was uploaded)") from None
    repo.get_branch(branch)  # a missing branch or a tag fails before the upload
    total = sum(f.size for f in files)
    progress = _progress(args, total)
    done_bytes = 0
    staged = 0
    batch: list[tuple[str, Entry]] = []

    def flush() -> None:
        nonlocal staged, batch
        if batch:
            staged += repo.stage_many(branch, batch)
            batch = []

    def one(f: _File) -> tuple[_File, Entry]:
        return f, repo.put_object(f.local, _content_type(args, f.local))  # staged in batches below

    try:
        if progress is not None:
            progress.start()
            task = progress.add_task("uploading", total=total, files=f"0/{len(files)} files")
        with ThreadPoolExecutor(max_workers=UPLOAD_THREADS, thread_name_prefix="upload") as pool:
            for i, (f, entry) in enumerate(pool.map(one, files), 1):
                batch.append((f.path, entry))
                done_bytes += entry.size
                if progress is not None:
                    progress.update(task, completed=done_bytes, files=f"{i}/{len(files)} files")
                if len(batch) >= STAGE_BATCH:
                    flush()
        flush()
    finally:
        if progress is not None:
            progress.stop()
    return {"objects": staged, "bytes": done_bytes, "skipped": [{"path": p, "reason": r} for p, r in skipped]}


def _refuse_unshowable(path: str) -> None:
    """InvalidArgument for a destination key the mount cannot show (and export cannot write)."""
    if path.startswith("/") or "//" in path:  # (lakefs://R/B//x: the key "/x")
        meant = "/".join(p for p in path.split("/") if p) + ("/" if path.endswith("/") else "")
        raise InvalidArgument(f"{path!r} has an empty path segment ('//' or a leading '/'): the mount cannot show "
                              f"such a key and export cannot write it (did you mean {meant!r}?)")
    for seg in path.split("/"):
        if seg == RESERVED_NAME:
            raise InvalidArgument(f"{path!r} has a path segment {RESERVED_NAME!r}, the name the mount keeps for its "
                                  "control files in every directory: the mount cannot show such a key")
        if len(seg.encode("utf-8", "surrogateescape")) > 255:
            raise InvalidArgument(f"{path!r} has a path segment longer than 255 bytes: the mount cannot show such "
                                  "a key and export cannot write it")


def cmd_upload(args: argparse.Namespace) -> int:
    u = uri_arg(args.dest)
    if u.ref is None:
        raise InvalidArgument(f"{u}: expected lakefs://REPO/BRANCH/PATH")
    branch, path = u.ref, u.path or ""
    _refuse_unshowable(path)
    src = args.source
    if not os.path.lexists(src):
        raise NotFound(f"local file not found: {src}")
    if not args.recursive and not os.path.isdir(src) and not os.path.isfile(src):
        raise InvalidArgument(f"{src} is not a regular file (a FIFO, device or socket cannot be uploaded)")
    with session(args) as s:
        repo = s.repo(u)
        if args.recursive:
            if not os.path.isdir(src):
                raise InvalidArgument(f"--recursive needs a directory, and {src} is not one")
            prefix = path if not path or path.endswith("/") else path + "/"
            res = _upload_tree(args, repo, branch, src, prefix)
            dest = f"lakefs://{u.repository}/{branch}/{prefix}"
            if args.json:
                emit_json({"destination": dest, **res})
            else:
                out(f"Uploaded {res['objects']} objects ({human_size(res['bytes'])}) to {show_name(dest)}"
                    + (f"; skipped {len(res['skipped'])}" if res["skipped"] else ""))
            return 0
        if os.path.isdir(src):
            raise InvalidArgument(f"{src} is a directory: use --recursive")
        if not path or path.endswith("/"):
            path += os.path.basename(src)
        entry = repo.upload(branch, path, src, content_type=_content_type(args, src))
        if args.json:
            emit_json(entry_json(repo, path, entry))
        else:
            out(f"Uploaded {show_name(src)} to {show_name(f'lakefs://{u.repository}/{branch}/{path}')} "
                f"({human_size(entry.size)})")
    return 0


# ---------------------------------------------------------------------- reads


def cmd_cat(args: argparse.Namespace) -> int:
    u = uri_arg(args.path)
    ref, path = u.with_path()
    with session(args) as s:
        repo = s.repo(u)
        entry = repo.get(ref, path)
        w = sys.stdout.buffer
        if is_md5_etag(entry.etag):
            # checked whole (its MD5) before its first byte goes out: a damaged object is exit 5
            # with nothing written, never bytes a reader might take for the object
            if entry.size <= CAT_WHOLE_MAX:
                w.write(b"".join(repo.iter_entry(entry, CAT_CHUNK)))
                w.flush()
                return 0
            for _ in repo.iter_entry(entry, CAT_CHUNK):  # a first pass: the check
                pass
        for chunk in repo.iter_entry(entry, CAT_CHUNK):  # (sizes checked with every chunk, the MD5 again)
            w.write(chunk)
        w.flush()
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    u = uri_arg(args.prefix)
    ref, prefix = u.with_prefix()
    trim = prefix[: prefix.rfind("/") + 1]
    with session(args) as s:
        repo = s.repo(u)
        for item in repo.list(ref, prefix, delimiter="" if args.recursive else "/"):
            name = decode_key(item.path)
            if item.is_prefix:
                if args.json:
                    emit_json({"type": "prefix", "path": name})
                else:
                    out(f"{'prefix':<7} {'':16} {'':>10}  {show_name(name[len(trim):])}")
                continue
            e = item.entry
            if args.json:
                emit_json({"type": "object", **entry_json(repo, name, e)})
            else:
                # (the prefix's own directory marker, ``data/`` under ``data/``: by its key, not as "")
                out(f"{'object':<7} {local_time_ns(e.last_modified_ns):16} {human_size(e.size):>10}  "
                    f"{show_name(name[len(trim):] or name)}")
    return 0


def cmd_stat(args: argparse.Namespace) -> int:
    u = uri_arg(args.path)
    ref, path = u.with_path()
    with session(args) as s:
        repo = s.repo(u)
        e = repo.get(ref, path)
        if args.json:
            emit_json(entry_json(repo, path, e))
            return 0
        out(f"Path:             {path}")
        out(f"Modified Time:    {local_time_ns(e.last_modified_ns, zone=True)}")
        out(f"Size:             {e.size} bytes")
        out(f"Human Size:       {human_size(e.size)}")
        out(f"Physical Address: {physical_address(repo, e)}")
        out(f"Checksum:         {e.etag}")
        # (each field one line whatever it holds -- a value's newline faked rows; --json is exact)
        out(f"Content-Type:     {one_line(e.content_type) or '-'}")
        if e.metadata:
            out("Metadata:")
            shown = sorted((one_line(k), one_line(v)) for k, v in e.metadata.items())
            width = max(len(k) for k, _ in shown)
            for k, v in shown:
                out(f"  {k:<{width}} = {v}")
    return 0


# ---------------------------------------------------------------------- rm


def cmd_rm(args: argparse.Namespace) -> int:
    u = uri_arg(args.path)
    if u.ref is None:
        raise InvalidArgument(f"{u}: expected lakefs://REPO/BRANCH/PATH")
    branch, path = u.ref, u.path or ""
    with session(args) as s:
        repo = s.repo(u)
        if not args.recursive:
            if not path:
                raise InvalidArgument(f"{u}: expected lakefs://REPO/BRANCH/PATH (use --recursive for a prefix)")
            repo.delete(branch, path)
            if args.json:
                emit_json({"deleted": 1, "path": path})
            else:
                out(f"Deleted {show_name(f'lakefs://{u.repository}/{branch}/{path}')}")
            return 0
        prefix = path if not path or path.endswith("/") else path + "/"
        if not prefix and not args.all:
            raise InvalidArgument(f"refusing to delete every object on branch {branch!r} of {u.repository!r}: "
                                  "give --all to mean it (or a PATH prefix)")
        n = repo.delete_prefix(branch, prefix, batch=STAGE_BATCH, allow_all=args.all)  # a tag or commit: ReadOnlyRef
        if n == 0:
            raise NotFound(f"no objects under lakefs://{u.repository}/{branch}/{prefix}")
        if args.json:
            emit_json({"deleted": n, "prefix": prefix})
        else:
            out(f"Deleted {n} objects under {show_name(f'lakefs://{u.repository}/{branch}/{prefix}')}")
    return 0
