"""Directory listing: the mount root, ``.lakefuse`` directories, and a tree's directories.

A directory of a tree is listed a page at a time (``FsConfig.readdir_page``
entries from graveler per call), with the path rule of :mod:`graveler.paths`
applied (a key that is no valid name is hidden; an object shadowed by a
directory of the same name is hidden). A :class:`DirHandle` keeps the page read
last and a mark per page, so ``readdir`` resumes without re-reading and a seek
restarts from the entry it names when that entry is one handed out lately (the
names of the last :data:`RECENT_MAX` entries are kept by offset: a reader with a
small buffer asks again from inside the last reply, and a directory changed
meanwhile must not shift it), else from the nearest mark, skipping entries by count
(exact while the directory is unchanged). Marks are names relative to the directory, never
keys: a rename of the directory or of one above it while it is open (the node's path
changes) leaves them true, and the page read under the old path is read again under
the new one (its entries name the old paths), so the listing goes on where it was,
no entry twice, none skipped. The root and ``.lakefuse`` directories are small
and held whole.

Every directory also lists ``.`` and ``..`` (for FUSE the kernel fills in neither):
they take the first :data:`DOTS` offsets of a ``readdir`` (:func:`dots`), before the
listing, whose own offsets the adapter shifts by :data:`DOTS`. The kernel takes no
lookup of either (it links neither), so they are handed over without one.

A directory's link count is 2 + the subdirectories its listing shows (:func:`nlink`; the
root's are the refs it lists). Counting reads the directory's listing, so it is bounded:
a directory whose listing has more than ``FsConfig.nlink_scan`` names shows 1, Linux's
"subdirectories not counted" (btrfs's directories, ext4's beyond 65,000 subdirectories),
and a listing's directory entries are handed out uncounted (:meth:`AttrRules.uncounted`):
their count is read when they are stat'ed, not once per entry listed.

A directory's whole listing, once read, answers lookups there without a read
(:func:`from_held`, :mod:`lakefuse.mount.dircache`): a commit's for good, a branch's only
while the branch's change stamp is the one it was read at (:func:`branch_held`).
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import logging
import stat
import threading
from contextlib import nullcontext
from typing import TYPE_CHECKING

from graveler import paths
from graveler.errors import GravelerError
from graveler.model import entry_stats
from lakefuse.mount import special
from lakefuse.mount.attrs import Attr, DirEntry
from lakefuse.mount.errors import FsError
from lakefuse.mount.handles import Handle
from lakefuse.mount.inodes import Kind, Node
from lakefuse.mount.trees import FRESH_NS

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from lakefuse.mount.trees import Tree


DOTS = 2  # "." and "..": the first offsets of every directory's readdir
LISTED_MAX = 100_000  # commit-tree files a plain READDIR reported, held for their first lookup
RECENT_MAX = 16_384  # names kept by offset of the entries an open directory's buffer held last
AHEAD_PAGES = 8  # a readdir read-ahead takes what the last reply took (a plain READDIR: ~4,000 names), up to this


def dots(node: Node) -> list[tuple[bytes, Attr]]:
    """``.`` and ``..`` of directory ``node``, at offsets 1 and 2: only their inode numbers
    and type reach ``readdir`` (the kernel keeps no attributes of either). The root is its
    own parent. Never blocks."""
    return [(b".", Attr(node.ino, stat.S_IFDIR)), (b"..", Attr(node.parent_ino, stat.S_IFDIR))]


class DirHandle(Handle):
    __slots__ = ("lock", "buf", "buf_start", "buf_from", "buf_path", "marks", "recent", "top", "next_off",
                 "next_after", "done", "entries")

    def __init__(self, node: Node):
        super().__init__(node)
        self.lock = threading.Lock()
        self.buf: list[DirEntry] = []
        self.buf_start = 0  # buf[i] is the entry at offset buf_start + i + 1
        self.buf_from = 0  # the offset buf was read for (a new run of offsets: buf[0] follows it)
        self.buf_path = node.path  # the directory's path when buf was read
        # offset -> the name (relative to the directory: a key less its prefix) to resume after
        self.marks: dict[int, bytes] = {0: b""}
        self.recent: dict[int, bytes] = {}  # offset -> the relative name to resume after (entries buf held)
        self.top = 0  # the highest offset handed out: a read from elsewhere numbers its entries above it
        self.next_off = 0
        self.next_after = b""  # relative, as the marks
        self.done = False
        self.entries: list[DirEntry] | None = None  # a small directory held whole (root, .lakefuse)

    def ready(self, offset: int) -> list[DirEntry] | None:
        """Entries from ``offset`` on that are already read (``[]``: the end), or None."""
        if self.entries is not None:
            return self.entries[offset:]
        if self.node.path != self.buf_path:  # renamed (or one above it) since: read again under the new path
            return None
        i = 0 if offset == self.buf_from else offset - self.buf_start
        if 0 <= i < len(self.buf):
            return self.buf[i:]
        if i == len(self.buf) and self.done and (offset == self.next_off or offset == self.buf_from):
            return []
        return None


def fill(fs, h: DirHandle, offset: int) -> None:
    """Read the entries of ``h``'s directory from ``offset`` on (blocking)."""
    node = h.node
    if node.kind == Kind.ROOT:
        with h.lock:
            h.entries = root_entries(fs)
    elif node.kind == Kind.INFO_DIR:
        with h.lock:
            h.entries = special_entries(fs, node)
    elif node.tree.immutable:
        with h.lock:
            _fill_tree_dir(fs, h, offset)
    else:
        with fs.tree_lock(node.tree).shared(), h.lock:
            _fill_tree_dir(fs, h, offset)


def wants_ahead(h: DirHandle, offset: int, n: int) -> bool:
    """Whether a readdir that just handed out ``n`` entries, up to ``offset``, should read
    the next page now (:func:`fill_ahead`): the next request would likely run out of what
    ``h`` holds. Never blocks."""
    if h.entries is not None or h.done or h.node.kind != Kind.DIR:
        return False
    return h.buf_start <= offset and h.buf_start + len(h.buf) - offset < n


def fill_ahead(fs, h: DirHandle, keep_from: int, n: int = 0) -> None:
    """Read the page after what ``h`` holds (at least ``n`` entries, what the last readdir
    took, up to :data:`AHEAD_PAGES` pages), keeping what it holds from offset ``keep_from``
    on (blocking): the FUSE adapter runs it while the kernel takes in its last reply, so the
    next readdir finds its entries read. Nothing to do when a seek or a rename moved
    ``h`` meanwhile (that readdir then reads what it needs itself)."""
    node = h.node
    with (nullcontext() if node.tree.immutable else fs.tree_lock(node.tree).shared()), h.lock:
        if (h.entries is not None or h.done or node.path != h.buf_path
                or not h.buf_start <= keep_from <= h.buf_start + len(h.buf)
                or h.next_off != h.buf_start + len(h.buf)):
            return
        keep = h.buf[keep_from - h.buf_start:]
        _fill_tree_dir(fs, h, h.next_off, min(n, AHEAD_PAGES * fs.config.readdir_page))
        h.buf = keep + h.buf
        h.buf_start = h.buf_from = keep_from


def _fill_tree_dir(fs, h: DirHandle, offset: int, at_least: int = 0) -> None:
    node = h.node
    tree: Tree = node.tree
    path = node.path  # the tree lock (shared) keeps a rename from changing it meanwhile
    if offset == h.next_off:  # going on: the run of offsets goes on
        rel, skip, base = h.next_after, 0, offset
    else:
        # from elsewhere (a seek, a reader that took part of the last reply): after the entry at
        # ``offset`` when known, else from the nearest mark at or before it, skipping by count. Its
        # entries get offsets above every one handed out so far: an offset the kernel or a telldir
        # holds never names another entry than the one it followed (an immutable tree's entries keep
        # their places: numbered as from the start)
        known = _name_at(h, offset) if offset else None
        if known is not None:
            rel, skip = known, 0
        else:
            mark = max(o for o in h.marks if o <= offset)
            rel, skip = h.marks[mark], offset - mark
        base = offset if tree.immutable else h.top + 1
    stamp = tree.repin()
    prefix = paths.dir_prefix(path)
    after = prefix + rel if rel else b""
    page_size = fs.config.readdir_page
    entries: list[DirEntry] = []
    want = skip + max(page_size, at_least)
    done = False
    last = after
    raw = 0  # keys and common prefixes read (the link count's rule counts them)
    while len(entries) < want and not done:
        page = tree.view.list_page(prefix, last, page_size)
        raw += len(page)
        done = len(page) < page_size
        if not page:
            break
        last = page[-1].path
        if not tree.immutable:
            tree.witness(path, page)  # (BranchWrites._remains: removing them all, no scan per name)
        entries.extend(_page_entries(fs, tree, path, page, done, stamp))
    if not raw and not rel and path and not tree.immutable and not tree.view.stat(path).is_dir:
        # nothing under a branch directory that is no directory now: renamed or removed elsewhere
        # since the kernel looked it up (another mount or host): its listing is no empty one
        raise FsError(errno.ENOENT, f"{path!r} is gone from branch {tree.name!r}")
    if skip:
        rel = _rel(entries[skip - 1]) if len(entries) >= skip else last[len(prefix):]
        entries = entries[skip:]
    for i, e in enumerate(entries):  # the entry at index i resumes at base + i + 1
        e.offset = base + i + 1
    h.marks[base] = rel
    if not tree.immutable:  # (an immutable tree's offsets are positions: a resume by count is exact)
        _remember(h, h.buf)
    h.buf = entries
    h.buf_start = base
    h.buf_from = offset
    h.buf_path = path
    h.next_off = base + len(entries)
    h.top = max(h.top, h.next_off)
    h.next_after = last[len(prefix):] if last else b""
    h.done = done
    if not h.buf and not done:  # nothing visible in what was read: keep going later
        h.done = False
    if done and base == 0:  # the whole directory, read in one go: lookups answer from it
        if tree.immutable:
            fs.dircache.put(tree.key, path, entries, _nlink_of(fs, entries, raw))
        else:  # while the branch stays at this stamp
            fs.branch_dirs.put(tree.key, path, entries, _nlink_of(fs, entries, raw), stamp)


def _rel(e: DirEntry) -> bytes:
    """The name to resume a listing after, past entry ``e`` (a directory: past all under it)."""
    return e.name + b"/" if e.kind == Kind.DIR else e.name


def _name_at(h: DirHandle, offset: int) -> bytes | None:
    """The relative name to resume after at ``offset``, if ``h`` knows which entry it follows."""
    i = offset - h.buf_start - 1
    if 0 <= i < len(h.buf) and h.buf[i].offset == offset:
        return _rel(h.buf[i])
    return h.recent.get(offset)


def _remember(h: DirHandle, entries: list[DirEntry]) -> None:
    """Keep the names of ``entries`` (leaving ``h``'s buffer) by offset, the last :data:`RECENT_MAX`."""
    recent = h.recent
    for e in entries:
        recent[e.offset] = _rel(e)
    over = len(recent) - RECENT_MAX
    if over > 0:
        for k in list(itertools.islice(recent, over)):
            del recent[k]


def whole(fs, node: Node, stamp: int | None = None) -> dict[bytes, DirEntry] | None:
    """The whole listing of directory ``node``, read now and held in
    :class:`lakefuse.mount.dircache.DirCache` (the caller found it not held), or None when it
    has more than ``FsConfig.readdir_page`` names (blocking). ``stamp``: ``node`` is a branch
    directory, held at that stamp (the branch's, read just before, under the tree lock:
    ``Filesystem.branch_dirs``)."""
    tree: Tree = node.tree
    limit = fs.config.readdir_page
    page = tree.view.list_page(paths.dir_prefix(node.path), b"", limit)
    if len(page) >= limit:
        (fs.dircache if stamp is None else fs.branch_dirs).too_big(tree.key, node.path)
        return None
    return _hold(fs, tree, node.path, page, stamp)


def _hold(fs, tree: "Tree", path: bytes, page, stamp: int | None = None) -> dict[bytes, DirEntry]:
    """Hold ``page``, the whole listing of ``path`` in immutable ``tree`` (or in a branch tree
    at ``stamp``), in the directory cache; its entries at the offsets a readdir from the
    start gives them."""
    entries = _page_entries(fs, tree, path, page, True, stamp or 0) if page else []
    for i, e in enumerate(entries):
        e.offset = i + 1
    cache = fs.dircache if stamp is None else fs.branch_dirs
    return cache.put(tree.key, path, entries, _nlink_of(fs, entries, len(page)), stamp)


def _nlink_of(fs, entries: list[DirEntry], raw: int) -> int:
    """:func:`nlink` of a directory from its whole listing (``raw``: the keys and common
    prefixes read, hidden ones included)."""
    return 1 if raw > fs.config.nlink_scan else 2 + sum(1 for e in entries if e.kind == Kind.DIR)


def _page_entries(fs, tree: "Tree", dir_path: bytes, page, complete: bool, stamp: int) -> list[DirEntry]:
    """Visible entries of one listing page, with the path rule applied (a listing's hot
    path: one pass, names looked up once)."""
    prefixes = {it.path for it in page if it.value is None}
    last = page[-1].path
    out: list[DirEntry] = []
    append = out.append
    plen = len(dir_path) + 1 if dir_path else 0
    rules = fs.rules
    file_attr = rules.file_attr
    name_problem = paths.name_problem
    odd = paths.REFUSED_NAMES
    max_name = paths.MAX_NAME_BYTES
    tkey = tree.key
    # (size, mtime) of the entries without user metadata, decoded in one call: their attributes
    # are made when first asked (a plain READDIR needs only their mode); the rest: file_attr now
    plain_mode, make = rules.plain_file(tree)
    for it, st in zip(page, entry_stats([it.value for it in page])):
        key = it.path
        value = it.value
        if value is None:  # a common prefix: "<dir>/<name>/"
            name = key[plen:-1]
            why = name_problem(name)
            if why is not None:
                hidden(fs, tree, key, why)
                continue
            path = key[:-1]
            marker = tree.view.get(key)  # the common prefix "d/" is also d's marker key
            append(DirEntry(name, 0, ("d", tkey, path), Kind.DIR, tree, path, None,
                            rules.uncounted(rules.tree_dir_attr(tree, path, marker)), stamp))
            continue
        name = key[plen:]
        # (name_problem's rule, its common case inline: the listing's hot path; a listed object's
        # name holds no "/", the listing made a common prefix of any that did)
        if not name or len(name) > max_name or name in odd or b"\x00" in name:
            if name:  # an empty name is the directory's own marker ("d/"), not a hidden key
                hidden(fs, tree, key, name_problem(name))
            continue
        # shadowed by a directory of the same name: one this page lists, or (the page not the
        # last) one after it -- "key/" sorts after the page's last key only when that key starts
        # with ``key`` and goes on with a byte below "/" (or is ``key``)
        if (prefixes and key + b"/" in prefixes) or (
                not complete and last.startswith(key)
                and (len(last) == len(key) or last[len(key)] < 0x2F) and tree.view.stat(key).is_dir):
            shadowed(fs, tree, key)
            continue
        if st is not None:
            append(DirEntry(name, 0, ("f", tkey, key), Kind.FILE, tree, key, value, None, stamp, plain_mode, st,
                            make))
            continue
        try:
            attr = file_attr(value, tree)
        except Exception as e:  # a damaged entry hides that one file, not the directory
            fs.log_once(logging.WARNING, ("bad", tree.key, key), "%s/%s: cannot show %r: %s",
                        fs.repo.name, tree.name, key.decode("utf-8", "replace"), e)
            continue
        append(DirEntry(name, 0, ("f", tkey, key), Kind.FILE, tree, key, value, attr, stamp, attr.mode))
    return out


# ------------------------------------------------------------------ lookups from a held listing


def branch_held(fs, parent: Node) -> dict[bytes, DirEntry] | None:
    """The listing of branch directory ``parent`` when it may answer a lookup without a read
    (never blocks): read whole at the branch's stamp, which is still the stamp and known
    current within :data:`FRESH_NS` (no change since, this mount's or another's: the rule
    ``Filesystem.getattr_fast`` answers by), and no file this mount created waits to be staged
    (:mod:`lakefuse.mount.creates`: the listing would not have it)."""
    tree = parent.tree
    held = fs.branch_dirs.get_at(tree.key, parent.path)
    return held[0] if held is not None and _branch_stands(fs, tree, held[1]) else None


def _branch_stands(fs, tree: "Tree", stamp: int) -> bool:
    """Whether what was read of branch ``tree`` at ``stamp`` may answer now: ``stamp`` is still the
    branch's and known current within :data:`FRESH_NS`, and no file this mount created waits to
    be staged. Never blocks."""
    return stamp == tree.stamp and tree.fresh(FRESH_NS) and not (fs.spool is not None and fs.spool.unstaged)


def from_memory(fs, h: DirHandle, offset: int) -> list[DirEntry] | None:
    """The entries of ``h``'s directory from ``offset`` on when its whole listing is held (no
    KV read, no thread; never blocks): an immutable tree's (``h`` keeps it from then on), a
    branch's while the branch stands (:func:`fill_held`). None: not held."""
    node = h.node
    if h.entries is not None or node.kind != Kind.DIR:
        return None
    if not node.tree.immutable:
        return h.ready(offset) if fill_held(fs, h, offset) else None
    names = fs.dircache.get(node.tree.key, node.path)
    if names is None:
        return None
    h.entries = list(names.values())
    return h.entries[offset:]


def fill_held(fs, h: DirHandle, offset: int) -> bool:
    """Fill a branch directory's fresh handle ``h`` from the directory's held listing when the
    branch stands (:func:`branch_held`), as a readdir from the start would have read it (one
    page, done): no read, no thread. Its entries keep the held listing's path and stamp, and
    a rename of the directory meanwhile makes ``h`` read again (:meth:`DirHandle.ready`).
    Never blocks."""
    node = h.node
    if offset != 0 or h.next_off != 0 or h.buf:
        return False
    names = branch_held(fs, node)
    if names is None:
        return False
    entries = list(names.values())
    with h.lock:
        if h.next_off != 0 or h.buf:  # (filled meanwhile)
            return False
        h.buf, h.buf_start, h.buf_from, h.buf_path = entries, 0, 0, node.path
        h.marks[0] = b""
        h.next_off = h.top = len(entries)
        h.next_after = entries[-1].name if entries else b""
        h.done = True
    return True


def numbered(fs, entries: list[DirEntry]) -> list[int]:
    """The inode number of each of ``entries`` for a plain READDIR (never blocks): no lookup
    counted, no node made (:meth:`InodeTable.numbers`: the number is the one the name's first
    lookup gets). The files are held too (the last :data:`LISTED_MAX`), so that first lookup,
    when the directory is too big to be held whole, is answered from memory as a held listing's
    are -- a branch's only while the branch is as it was at the page's stamp
    (:func:`_branch_stands`): a name listed and then opened costs no read more than after
    READDIRPLUS."""
    if entries:
        listed = fs.listed
        if len(listed) + len(entries) > LISTED_MAX:
            listed.clear()
        listed.update({e.key: e for e in entries if e.kind == Kind.FILE})
    return fs.inodes.numbers([e.key for e in entries])


def from_held(fs, parent: Node, name: bytes, counts=("lookups_memory",)) -> Attr | None:
    """A file's lookup answered from its directory's held listing, or from what a plain READDIR
    reported of it (a branch's while the branch stands: :func:`_branch_stands`) (``counts`` +1),
    else None (never blocks)."""
    tree = parent.tree
    if len(name) > paths.MAX_NAME_BYTES or name in (b".", b"..", special.INFO_NAME):
        return None
    names = fs.dircache.get(tree.key, parent.path) if tree.immutable else branch_held(fs, parent)
    if names is None:  # what a plain READDIR reported of it (numbered), a branch's while it stands
        # taken either way: a branch's that no longer stands never will again (stamps only grow,
        # and the thread's lookup that follows reads the key and makes the node)
        e = fs.listed.pop(("f", tree.key, paths.join(parent.path, name)), None)
        if e is None or not (tree.immutable or (e.tree is tree and _branch_stands(fs, tree, e.stamp))):
            return None
    else:
        e = names.get(name)
        if e is None:
            fs.stats.count(*counts)
            if tree.immutable:
                raise FsError(errno.ENOENT, "", fs.config.immutable_timeout)
            fs.note_absent(parent.ino, name, tree.stamp)
            raise FsError(errno.ENOENT)  # (a branch's missing names are not cached by the kernel)
        if e.kind != Kind.FILE or e.tree is not tree:  # a directory's link count needs a listing read
            return None
    fs.stats.count(*counts)
    if tree.immutable:  # (a key of such a tree keeps its inode: the listing's Attr may be the node's)
        return fs.acquire(e.key, Kind.FILE, tree, e.path, parent.ino, e.attr, e.value, 0)
    # a branch node may be replaced by a new inode for the same key (a writer after a
    # passthrough reader): each node gets its own Attr, or the old one would show the new number
    attr = fs.acquire(e.key, Kind.FILE, tree, e.path, parent.ino, dataclasses.replace(e.attr), e.value, e.stamp)
    sf = fs.spool.peek(attr.ino) if fs.spool is not None else None
    if sf is not None:  # being written: as its spool file says (what lookup answers)
        return fs.rules.spooled(sf, attr)
    return attr


def read_whole(fs, parent: Node, stamp: int) -> bool:
    """Whether directory ``parent``'s whole listing is held, read now if
    ``DirCache.wants_whole`` says so (blocking). A branch directory's: held at ``stamp``, the
    branch's stamp just read. A listing that cannot be read (a damaged range under some of
    its names, the store away) is not tried again there: the lookup reads its one key, so a
    name outside the damage still answers."""
    tree = parent.tree
    if tree.immutable:
        cache, at = fs.dircache, None
        if cache.get(tree.key, parent.path) is not None:
            return True
    else:
        cache, at = fs.branch_dirs, stamp
        held = cache.get_at(tree.key, parent.path)
        if held is not None and held[1] == stamp:
            return True
    if not cache.wants_whole(tree.key, parent.path, at):
        return False
    try:
        return whole(fs, parent, at) is not None
    except (GravelerError, OSError) as e:
        log.debug("%s: %r: listing not held: %s", fs.repo.name, parent.path, e)
        cache.too_big(tree.key, parent.path)
        return False


def hidden(fs, tree: "Tree", key: bytes, why: str) -> None:
    fs.log_once(logging.INFO, ("hidden", tree.key, key), "%s/%s: key %r is not shown (%s)",
                fs.repo.name, tree.name, key.decode("utf-8", "replace"), why)


def shadowed(fs, tree: "Tree", path: bytes) -> None:
    fs.log_once(logging.INFO, ("shadow", tree.key, path),
                "%s/%s: the object %r is hidden by the directory of the same name",
                fs.repo.name, tree.name, path.decode("utf-8", "replace"))


def root_names(fs) -> list[bytes]:
    """The names the root lists: one per branch and tag (a branch wins a name both have)."""
    names: dict[str, None] = {}
    for b in fs.repo.list_branches():
        names[b.name] = None
    for t in fs.repo.list_tags():
        names.setdefault(t.name, None)
    out = [ref.encode() for ref in names]
    return sorted(n for n in out if paths.name_problem(n) is None)


def root_entries(fs) -> list[DirEntry]:
    """One directory per branch and tag (:func:`root_names`)."""
    out = []
    for name in root_names(fs):
        try:
            tree = fs.tree(name)
        except FsError:
            continue  # deleted meanwhile
        out.append(DirEntry(name, len(out) + 1, fs.dir_key(tree, b""), Kind.DIR, tree, b"", None,
                            fs.rules.uncounted(fs.rules.tree_dir_attr(tree, b"", tree.root_marker())), tree.stamp))
    return out


def nlink(fs, tree: "Tree | None", path: bytes, stamp: int | None = None) -> int:
    """A directory's link count: 2 + the subdirectories its listing shows, or 1 when its
    listing has more than ``FsConfig.nlink_scan`` names (not counted: see the module
    docstring). ``tree`` None: the mount root, whose subdirectories are its refs. A listing
    that fails (a damaged range, the KV away) leaves it uncounted (1): reading a path answers
    the error, a stat of the directory does not. The listing read is held (its readdir and
    lookups then need no read): an immutable tree's for good, a branch's at ``stamp`` (the
    branch's, read just before under the tree lock; None: not held). Blocking."""
    limit = fs.config.nlink_scan
    try:
        if tree is None:
            return 2 + len(root_names(fs))
        page = tree.view.list_page(paths.dir_prefix(path), b"", limit + 1)
    except (GravelerError, OSError) as e:  # e.g. a damaged range: its paths answer EIO, the directory's stat does not
        log.debug("%s: %r: subdirectories not counted: %s", fs.repo.name, path, e)
        return 1
    if len(page) > limit:
        return 1
    if tree.immutable:  # the whole directory was read: held, its readdir and lookups need no KV read
        return fs.dircache.nlink(tree.key, path) if _hold(fs, tree, path, page) is not None else 1
    if stamp is not None and len(page) < fs.config.readdir_page:  # held while the branch stands
        return fs.branch_dirs.nlink(tree.key, path) if _hold(fs, tree, path, page, stamp) is not None else 1
    plen = len(path) + 1 if path else 0
    return 2 + sum(1 for it in page if it.value is None and paths.name_problem(it.path[plen:-1]) is None)


def special_entries(fs, node: Node) -> list[DirEntry]:
    """The files of a ``.lakefuse`` directory (:mod:`lakefuse.mount.special`)."""
    tree = node.tree
    out = []
    for spec in special.files_in(tree, fs.writable):
        out.append(DirEntry(spec.name, len(out) + 1, spec.key(tree), Kind.INFO_FILE, tree, spec.name, None,
                            special.attr(fs, spec, tree), 0))
    return out
