"""Control files: version control through ``<ref>/.lakefuse/`` and the mount root's ``.lakefuse/``.

A program writes a request into a control file and closes it; the mount runs
the request when the file is flushed (close) or fsynced, and close/fsync fails
with an errno when the request fails. Reading the file back returns the last
outcome as JSON (``{"ok": true, ...}`` or ``{"ok": false, "error": ...}``).

In every branch tree (``<branch>/.lakefuse/``):

=========  =====================================================================
``commit``  plain text (the message; trailing newlines dropped) or a JSON object
            ``{"message": str, "metadata": {str: str}, "allow_empty": bool}`` (JSON when
            the text opens an object with a name, ``{"``, or is ``{}``)
``merge``   ``SOURCE_REF [dest-wins|source-wins]``: merge into this branch;
            a conflict fails and the read-back lists the conflicting paths
``reset``   ``*`` (everything), ``PATH`` (a file; or a directory: everything
            under it; as written, spaces included), ``PREFIX/`` (every path under it): discard staged changes;
            one that names nothing (staged or in the head commit) is NotFound
``revert``  ``REF [PARENT_NUMBER]``: revert that commit on this branch
``status``  read-only: uncommitted changes, ``A|M|D path`` per line
=========  =====================================================================

At the mount root (``.lakefuse/``): ``branch`` (``NEW [SOURCE_REF]``; the
default branch's head when no source is given) and ``tag`` (``NAME REF``).

Every request is one graveler operation, which is atomic: a request either
happens entirely or not at all. Malformed input raises ``InvalidArgument``
(EINVAL at the FUSE edge) with the reason, which is also kept for the read-back
and logged; graveler's own errors (NotFound, Conflict, NothingToCommit, ...)
pass through the same way. This module is plain blocking code over the graveler
``Repository`` API.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone

from graveler.errors import GravelerError, InvalidArgument, MergeConflict, NotFound, NothingToCommit
from graveler.model import DiffType, Entry, MergeStrategy
from graveler.objects import POSIX_ATIME, POSIX_MTIME, ROOT_MARKER
from graveler.refs import Commit
from graveler.staging import as_path
from lakefuse.names import decode_key, show_name
from lakefuse.users import committer as committer_of

log = logging.getLogger(__name__)

CONTROL_DIR = ".lakefuse"
BRANCH_REQUESTS = ("commit", "merge", "reset", "revert")  # writable control files of a branch tree
ROOT_REQUESTS = ("branch", "tag")  # writable control files of the mount root
MAX_REQUEST_BYTES = 1 << 20
# A write that ends a line runs the request at once only when it is shorter than this: the
# block writers fill (cat, stdio and Python buffer st_blksize, 128 KiB; the kernel splits one
# write(2) into FUSE writes of at least that much), so a full block is a piece of a longer
# request, whatever its last byte, and the request runs at close.
RUN_AT_NEWLINE_BELOW = 128 * 1024
_STRATEGIES = {"dest-wins": MergeStrategy.DEST_WINS, "source-wins": MergeStrategy.SOURCE_WINS}
_STATUS_LETTER = {DiffType.ADDED: "A", DiffType.CHANGED: "M", DiffType.REMOVED: "D"}
# A commit request is JSON when it opens an object with a name or closes it at once (``{"message":
# ...}``, ``{}``); other text, ``{WIP} fix`` included, is the message itself.
_JSON_REQUEST = re.compile(r'\s*\{\s*["}]')


# ---------------------------------------------------------------- requests (parsing only)


@dataclass(frozen=True)
class CommitRequest:
    message: str
    metadata: dict[str, str] = field(default_factory=dict)
    allow_empty: bool = False


@dataclass(frozen=True)
class MergeRequest:
    source: str
    strategy: MergeStrategy = MergeStrategy.NONE


@dataclass(frozen=True)
class ResetRequest:
    kind: str  # "all", "path" (a file or a directory) or "prefix"
    value: str = ""


@dataclass(frozen=True)
class RevertRequest:
    ref: str
    parent_number: int = 0


@dataclass(frozen=True)
class BranchRequest:
    name: str
    source: str | None = None


@dataclass(frozen=True)
class TagRequest:
    name: str
    ref: str


def _text(data: bytes, what: str) -> str:
    if len(data) > MAX_REQUEST_BYTES:
        raise InvalidArgument(f"{what}: request of {len(data)} bytes, at most {MAX_REQUEST_BYTES}")
    try:
        s = data.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidArgument(f"{what}: request is not UTF-8 text") from None
    if "\x00" in s:
        raise InvalidArgument(f"{what}: request contains NUL")
    return s


def _words(data: bytes, what: str, usage: str, lo: int, hi: int) -> list[str]:
    text = _text(data, what).strip()
    if "\n" in text:
        raise InvalidArgument(f"{what}: one request per write, on one line (usage: {usage})")
    words = text.split()
    if not lo <= len(words) <= hi:
        raise InvalidArgument(f"{what}: expected {usage!r}, got {text!r}")
    return words


def _encodable(s: str, what: str) -> str:
    """``s`` if it can be stored (UTF-8): JSON's ``\\udcff`` escapes make unpaired surrogates."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidArgument(f"commit: {what} holds an unpaired surrogate (\\ud800-\\udfff), "
                              "which is not text") from None
    return s


def parse_commit(data: bytes) -> CommitRequest:
    text = _text(data, "commit")
    if _JSON_REQUEST.match(text):
        try:
            obj = json.loads(text)
        except RecursionError:
            raise InvalidArgument("commit: JSON nested too deeply") from None
        except ValueError as e:
            raise InvalidArgument(f"commit: malformed JSON ({e}); a message that starts with '{{\"' "
                                  "goes as JSON: {\"message\": ...}") from None
        if not isinstance(obj, dict):
            raise InvalidArgument("commit: JSON request must be an object")
        unknown = set(obj) - {"message", "metadata", "allow_empty"}
        if unknown:
            raise InvalidArgument(f"commit: unknown field(s) {sorted(unknown)}: use message, metadata, allow_empty")
        message = obj.get("message")
        if not isinstance(message, str) or not message.strip():
            raise InvalidArgument("commit: 'message' must be a non-empty string")
        md = obj.get("metadata", {})
        if md is None:
            md = {}
        if not isinstance(md, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in md.items()):
            raise InvalidArgument("commit: 'metadata' must be an object of string values")
        allow_empty = obj.get("allow_empty", False)
        if not isinstance(allow_empty, bool):
            raise InvalidArgument("commit: 'allow_empty' must be true or false")
        for k, v in md.items():
            if not k.strip() or "\0" in k or "\0" in v:
                raise InvalidArgument(f"commit: metadata key {k!r}: a key must be non-empty, and no key or value "
                                      "may hold a NUL (the CLI's --meta KEY=VALUE cannot give them either)")
            _encodable(k, "a metadata key")
            _encodable(v, f"metadata value {k!r}")
        return CommitRequest(_no_nul(_encodable(message, "the message")), dict(md), allow_empty)
    message = text.rstrip("\r\n")
    if not message.strip():
        raise InvalidArgument("commit: the commit message is empty")
    return CommitRequest(_no_nul(message))


def _no_nul(message: str) -> str:
    if "\0" in message:
        raise InvalidArgument("commit: the message holds a NUL (as git, which refuses one in a commit message)")
    return message


def parse_merge(data: bytes) -> MergeRequest:
    words = _words(data, "merge", "SOURCE_REF [dest-wins|source-wins]", 1, 2)
    strategy = MergeStrategy.NONE
    if len(words) == 2:
        strategy = _STRATEGIES.get(words[1].lower())
        if strategy is None:
            raise InvalidArgument(f"merge: unknown strategy {words[1]!r}: use dest-wins or source-wins")
    return MergeRequest(words[0], strategy)


def parse_reset(data: bytes) -> ResetRequest:
    # the path as written, spaces included (a key may begin or end with one): only the line's end goes
    text = _text(data, "reset").removesuffix("\n").removesuffix("\r")
    if not text.strip():
        raise InvalidArgument("reset: expected '*', a path or a prefix ending in '/'")
    if "\n" in text:
        raise InvalidArgument("reset: one path per write")
    if text == "*":
        return ResetRequest("all")
    p = text.lstrip("/")
    if not p:  # "/": the branch root's own attributes (its marker, "M /" in status), nothing under it
        return ResetRequest("root", "/")
    as_path(p, "reset path")  # NUL, '.', '..', UTF-8, length
    if p.endswith("/"):
        return ResetRequest("prefix", p)
    return ResetRequest("path", p)


def parse_revert(data: bytes) -> RevertRequest:
    words = _words(data, "revert", "REF [PARENT_NUMBER]", 1, 2)
    parent = 0
    if len(words) == 2:
        if not (words[1].isascii() and words[1].isdigit()) or int(words[1]) < 1:
            raise InvalidArgument(f"revert: parent number must be a positive integer, not {words[1]!r}")
        parent = int(words[1])
    return RevertRequest(words[0], parent)


def parse_branch(data: bytes) -> BranchRequest:
    words = _words(data, "branch", "NEW_BRANCH [SOURCE_REF]", 1, 2)
    return BranchRequest(words[0], words[1] if len(words) == 2 else None)


def parse_tag(data: bytes) -> TagRequest:
    words = _words(data, "tag", "NAME REF", 2, 2)
    return TagRequest(words[0], words[1])


# ---------------------------------------------------------------- outcomes


def commit_summary(c: Commit) -> dict:
    return {
        "id": c.id,
        "message": c.message,
        "committer": c.committer,
        "creation_date": c.creation_date.astimezone(timezone.utc).isoformat(),
        "parents": list(c.parents),
        "metadata": dict(c.metadata),
        "meta_range_id": c.meta_range_id,
    }


def _committer(uid: int | None) -> str | None:
    """A new commit's committer for user ``uid`` (looked up only when a commit is made);
    None: the repository's configured one."""
    return None if uid is None else committer_of(uid)


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


_TIMES = (POSIX_MTIME, POSIX_ATIME)


def _removed_between(repo, before: str, after: str, removed: list[bytes]) -> None:
    """Add to ``removed`` the keys commit ``after`` no longer has of ``before`` (a merge's or a
    revert's: the names the mount drops). The request is done already: a failure here (the
    store) is no failure of it -- the names then time out."""
    try:
        removed.extend(d.key for d in repo.diff(before, after) if d.type is DiffType.REMOVED)
    except GravelerError as e:
        log.warning("%s: cannot list what %s..%s removed (the kernel's names of it time out): %s",
                    repo.name, before[:12], after[:12], e)


def times_only(d) -> bool:
    """Whether change ``d`` is a directory marker's (``dir/``) whose times alone changed: every
    create or delete inside a directory updates its mtime, which git, keeping no directories,
    never sees. A mode or owner change of a directory is a change."""
    if d.type != DiffType.CHANGED or not d.key.endswith(b"/"):
        return False
    a, b = Entry.from_value(d.left), Entry.from_value(d.right)
    strip = lambda md: {k: v for k, v in md.items() if k not in _TIMES}  # noqa: E731
    return (a.address, a.size, a.etag, strip(a.metadata)) == (b.address, b.size, b.etag, strip(b.metadata))


def _drop_times_only(repo, branch: str) -> None:
    """Before a merge or a revert: when every uncommitted change of ``branch`` is a directory's
    times (:func:`times_only`: ``status`` empty, a commit "nothing to commit"), give them up -- they
    made the branch "dirty" to the merge, which then refused a branch the mount calls clean. Any
    other change keeps them all, and the merge refuses the branch as before."""
    changes = list(repo.diff_uncommitted(branch))
    if changes and all(times_only(d) for d in changes):
        for d in changes:
            repo.reset(branch, path=d.key)


def status_lines(repo, branch: str) -> bytes:
    """``A|M|D path`` per uncommitted change of ``branch``, in path order (a name with a control
    character or quote in double quotes with C escapes, as ``lakefuse diff`` shows it). Directory
    markers (``dir/``) are listed when added, removed or given another mode or owner, not when
    only their times changed (:func:`times_only`: then a commit says there is nothing to commit)."""
    out = []
    for d in repo.diff_uncommitted(branch):
        if times_only(d):
            continue
        out.append(f"{_STATUS_LETTER[d.type]} {show_name(decode_key(d.key))}\n")  # quoted as git and diff do
    return "".join(out).encode()


def _shadowed(repo, other: str, name: str, outcome: dict) -> dict:
    """``outcome``, with a note when a ``other`` (branch or tag) has the new ref's name too: the
    name shows the branch, here and in the CLI (git warns of such an ambiguous name as well)."""
    if repo.prefix_commits(name):
        outcome = {**outcome, "note": f"{name!r} is also a commit-ID prefix: the name now shows this "
                                      f"{'tag' if other == 'branch' else 'branch'}, the commit a longer prefix"}
    if not repo.has_ref(other, name):
        return outcome
    shows = "the tag is reached by its commit ID" if other == "branch" else "the name now shows this branch"
    return {**outcome, "note": f"a {other} {name!r} exists too: {shows}"}


class Controls:
    """Runs control-file requests of one repository and keeps each file's last
    outcome (per branch, or for the root) for the read-back. Thread-safe."""

    def __init__(self, repo):
        self.repo = repo
        self._lock = threading.Lock()
        self._outcomes: dict[tuple[str | None, str], bytes] = {}
        # before_commit(branch): raises when the branch must not be committed now (the mount's
        # spool: a file whose save failed would be published without what was written)
        self.before_commit = None
        # before_request(branch=...): called before every request and status read of a branch (the
        # mount stages the files it created there and has not saved yet: what the branch shows
        # must hold them; another branch's stay as they are)
        self.before_request = None
        # after_change(branch, removed): called after a request changed a branch's files (reset,
        # merge, revert; ``removed``: the keys it took away): the mount drops the kernel's caches of
        # them before the request is answered
        self.after_change = None

    def outcome(self, branch: str | None, name: str) -> bytes:
        """What reading ``name`` returns: the last outcome, or ``{}`` before any request."""
        if branch is not None and name == "status":
            if self.before_request is not None:
                self.before_request(branch=branch)
            return status_lines(self.repo, branch)
        with self._lock:
            return self._outcomes.get((branch, name), b"{}\n")

    def _record(self, branch: str | None, name: str, obj: dict) -> None:
        raw = (json.dumps(obj, sort_keys=True, indent=1) + "\n").encode()
        with self._lock:
            self._outcomes[(branch, name)] = raw

    def refuse(self, branch: str | None, name: str, reason: str, error_type: str = "NotRun") -> None:
        """Record (for the read-back) and log a request refused before it could run: one
        whose write failed (e.g. over :data:`MAX_REQUEST_BYTES`: NotRun), or an empty one
        (nothing written: InvalidArgument)."""
        self._record(branch, name, {"ok": False, "operation": name, "error": reason, "error_type": error_type,
                                    "at": _now()})
        where = f"branch {branch}" if branch else "the mount root"
        log.warning("%s: %s request on %s not run: %s", self.repo.name, name, where, reason)

    def execute(self, branch: str | None, name: str, data: bytes, uid: int | None = None) -> dict:
        """Run the request ``data`` written to control file ``name`` of ``branch``
        (None: the mount root) for user ``uid`` (a commit, merge or revert names
        :func:`lakefuse.users.committer` of it; None: the repository's configured committer). Returns
        the success outcome; raises the GravelerError (InvalidArgument for malformed input)
        after recording it."""
        try:
            if self.before_request is not None and branch is not None:  # (the root's requests read no staging)
                self.before_request(branch=branch)
            removed: list[bytes] = []
            result = self._run(branch, name, data, uid, removed)
        except GravelerError as e:
            obj = {"ok": False, "operation": name, "error": str(e), "error_type": type(e).__name__, "at": _now()}
            if isinstance(e, MergeConflict):
                obj["conflicts"] = [k.decode("utf-8", "replace") for k in e.keys]
            self._record(branch, name, obj)
            where = f"branch {branch}" if branch else "the mount root"
            log.warning("%s: %s request on %s failed: %s", self.repo.name, name, where, e)
            e.logged = True  # (the FUSE adapter's error boundary does not log it again)
            raise
        except Exception as e:  # a defect (answered EIO): the read-back says so, not the last outcome
            self._record(branch, name, {"ok": False, "operation": name, "error": f"unexpected error: {e}",
                                        "error_type": type(e).__name__, "at": _now()})
            raise
        obj = {"ok": True, "operation": name, "at": _now(), **result}
        self._record(branch, name, obj)
        if name in ("reset", "merge", "revert") and self.after_change is not None:
            self.after_change(branch, removed)
        return obj

    def _run(self, branch: str | None, name: str, data: bytes, uid: int | None, removed: list[bytes]) -> dict:
        """The request's outcome; the keys a reset, merge or revert took away are added to ``removed``."""
        repo = self.repo
        if branch is None:
            if name == "branch":
                r = parse_branch(data)
                b = repo.create_branch(r.name, r.source)
                return _shadowed(repo, "tag", b.name, {"branch": b.name, "commit_id": b.commit_id,
                                                       "source": r.source or repo.default_branch})
            if name == "tag":
                r = parse_tag(data)
                t = repo.create_tag(r.name, r.ref)
                return _shadowed(repo, "branch", t.name, {"tag": t.name, "commit_id": t.commit_id})
            raise InvalidArgument(f"{name!r} is not a control file of the mount root")
        if name == "commit":
            r = parse_commit(data)
            if self.before_commit is not None:
                self.before_commit(branch)
            if not r.allow_empty and all(times_only(d) for d in repo.diff_uncommitted(branch)):
                # (nothing but directories' times, or nothing at all: as git, which sees no directories;
                # what is staged stays, and goes with the next commit)
                raise NothingToCommit(f"nothing to commit on branch {branch!r} (.lakefuse/status is empty)")
            c = repo.commit(branch, r.message, _committer(uid), metadata=r.metadata or None, allow_empty=r.allow_empty)
            return {"commit": commit_summary(c)}
        if name == "merge":
            r = parse_merge(data)
            _drop_times_only(repo, branch)
            before = repo.get_branch(branch).commit_id
            c = repo.merge(r.source, branch, r.strategy, committer=_committer(uid))
            _removed_between(repo, before, c.id, removed)
            return {"commit": commit_summary(c), "source": r.source}
        if name == "revert":
            r = parse_revert(data)
            _drop_times_only(repo, branch)
            before = repo.get_branch(branch).commit_id
            c = repo.revert(branch, r.ref, parent_number=r.parent_number, committer=_committer(uid))
            _removed_between(repo, before, c.id, removed)
            return {"commit": commit_summary(c), "reverted": r.ref}
        if name == "reset":
            r = parse_reset(data)
            if r.kind == "root":
                repo.reset(branch, path=ROOT_MARKER)
                return {"reset": "/"}
            if r.kind != "all" and not repo.names_anything(branch, **{r.kind: r.value}):
                # as `git restore nosuchfile`: a path that names nothing is an error, not a silent success
                what = "prefix" if r.kind == "prefix" else "path"
                raise NotFound(f"reset: {what} {r.value!r} matches nothing on branch {branch!r} "
                               "(no file or directory there, staged or committed)")
            # what the reset takes away: the files staged as new in its scope
            path = b"" if r.kind == "all" else r.value.encode()  # (a path: the file, or all under it)
            removed.extend(d.key for d in repo.diff_uncommitted(branch, path) if d.type is DiffType.ADDED
                           and (r.kind != "path" or d.key == path or d.key.startswith(path + b"/")))
            if r.kind == "all":
                repo.reset(branch)
            elif r.kind == "prefix":
                repo.reset(branch, prefix=r.value)
            else:
                # A file, or a directory: everything under it (and its marker), in one transaction.
                repo.reset(branch, tree=r.value)
            return {"reset": r.value or "*"}
        raise InvalidArgument(f"{name!r} is not a writable control file")
