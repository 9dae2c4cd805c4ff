"""Extended attributes: which names the mount takes, and how they are kept in entry metadata.

The mount shows two kinds of names (``docs/SEMANTICS.md``, "Extended attributes"):

* ``user.lakefs.*`` -- computed from the entry and its tree (commit, etag, ...):
  reserved, never stored; setting or removing one is ``EPERM``;
* every other ``user.*`` name -- the user's own, set with ``setxattr`` on a branch
  tree's file or directory, kept in the metadata of the entry that carries the
  file (a directory's: its marker ``<dir>/``), so it is committed with the entry
  and shown (read-only) on every commit and tag tree that holds it.

Storage, one metadata key per attribute (metadata is ``str -> str``, names and
values are bytes):

* key: :data:`KEY_PREFIX` (``lakefuse-xattr-``) + the whole name, percent-encoded
  (:func:`urllib.parse.quote` with no safe characters: ``A-Z a-z 0-9 _ . - ~`` stay
  as they are, every other byte is ``%XX``): ``user.comment`` is kept as
  ``lakefuse-xattr-user.comment``, ``user.a b`` as ``lakefuse-xattr-user.a%20b``;
* value: ``t:`` + the value itself when it is UTF-8 text without NUL, else ``b:`` +
  its standard base64 (with padding). Any bytes round-trip; a key written by other
  means without either prefix reads as its UTF-8 bytes.

The prefix is not ``lakefuse-posix-``: chmod, chown, utimens and content saves
rewrite those keys and keep every other key as it is, so attributes survive them.

Limits (ext4's where it has one): a name of 1 to 255 bytes (``ERANGE``; the kernel
checks this too), a value up to 64 KiB (``E2BIG``; the kernel too), and per entry at
most :data:`TOTAL_MAX` bytes of names and values and :data:`LIST_MAX` bytes of names
(``ENOSPC``, as ext4 answers when an inode's attribute space is full), so a
``listxattr`` with the computed names stays under the kernel's 64 KiB list limit.
Only the ``user`` namespace is kept: ``security.*``, ``trusted.*``, ``system.*``
and any other are ``ENOTSUP``.
"""

from __future__ import annotations

import base64
import binascii
import errno
import functools
import stat
from urllib.parse import quote_from_bytes, unquote_to_bytes

from graveler.model import Entry
from graveler.objects import POSIX_KEYS, user_metadata
from lakefuse.mount.attrs import XATTR_PREFIX
from lakefuse.mount.errors import FsError
from lakefuse.mount.inodes import Kind

USER = b"user."
KEY_PREFIX = "lakefuse-xattr-"
NAME_MAX = 255  # XATTR_NAME_MAX
VALUE_MAX = 65536  # XATTR_SIZE_MAX
TOTAL_MAX = 256 * 1024  # names + values of one entry
LIST_MAX = 32 * 1024  # names (each with its NUL) of one entry: the computed names fit beside them in 64 KiB
XATTR_LIST_MAX = 65536  # the kernel's limit of a listxattr answer (names, each with its NUL)

XATTR_CREATE = 1
XATTR_REPLACE = 2


def check_name(name: bytes, writing: bool) -> None:
    """Refuse a name the mount does not keep (FsError with the errno Linux gives)."""
    if not name or len(name) > NAME_MAX:
        raise FsError(errno.ERANGE, f"an attribute name has 1 to {NAME_MAX} bytes, not {len(name)}")
    if not name.startswith(USER):
        raise FsError(errno.ENOTSUP, "only user.* extended attributes are kept")
    if name == USER:  # (Linux's handlers: a namespace with no name in it)
        raise FsError(errno.EINVAL, "an attribute name after 'user.' is needed")
    if writing and name.startswith(XATTR_PREFIX):
        raise FsError(errno.EPERM, f"{XATTR_PREFIX.decode()}* attributes are the mount's, read-only")


def is_key(key: str) -> bool:
    return key.startswith(KEY_PREFIX)


def encode_value(value: bytes) -> str:
    if b"\0" not in value:
        try:
            return "t:" + value.decode("utf-8")
        except UnicodeDecodeError:
            pass
    return "b:" + base64.b64encode(value).decode("ascii")


def decode_value(text: str) -> bytes:
    if text.startswith("t:"):
        return text[2:].encode("utf-8")
    if text.startswith("b:"):
        try:
            return base64.b64decode(text[2:], validate=True)
        except (binascii.Error, ValueError):
            pass
    return text.encode("utf-8")


def key_of(name: bytes) -> str:
    return KEY_PREFIX + quote_from_bytes(name, safe="")


def read(metadata: dict[str, str]) -> dict[bytes, bytes]:
    """The user's attributes kept in ``metadata``, by name (sorted)."""
    out = {}
    for k in sorted(metadata):
        if is_key(k):
            name = unquote_to_bytes(k[len(KEY_PREFIX):])
            if name.startswith(USER) and not name.startswith(XATTR_PREFIX) and 0 < len(name) <= NAME_MAX:
                out[name] = decode_value(metadata[k])
    return out


def changed(metadata: dict[str, str], name: bytes, value: bytes | None, flags: int = 0) -> dict[str, str]:
    """``metadata`` with attribute ``name`` set to ``value`` (removed when None), as
    ``setxattr``/``removexattr`` would change it; the name is checked already."""
    if value is not None and len(value) > VALUE_MAX:
        raise FsError(errno.E2BIG, f"an attribute value has at most {VALUE_MAX} bytes, not {len(value)}")
    key = key_of(name)
    # the keys that read as ``name``: ours, and any other spelling of it another client wrote
    # (``user.a b`` unencoded, lower-case ``%2f``): a change replaces them all, a removal removes
    # them all (one was listed, read, and then could not be removed, or came back after a removal)
    spelled = [k for k in metadata if is_key(k) and k != key and unquote_to_bytes(k[len(KEY_PREFIX):]) == name]
    have = key in metadata or bool(spelled)
    if value is None or flags & XATTR_REPLACE:
        if not have:
            raise FsError(errno.ENODATA, f"no attribute {name!r}")
    elif flags & XATTR_CREATE and have:
        raise FsError(errno.EEXIST, f"attribute {name!r} exists")
    md = dict(metadata)
    for k in spelled:
        del md[k]
    if value is None:
        md.pop(key, None)
        return md
    md[key] = encode_value(value)
    cur = read(md)
    if sum(len(n) + 1 for n in cur) > LIST_MAX or sum(len(n) + len(v) for n, v in cur.items()) > TOTAL_MAX:
        raise FsError(errno.ENOSPC, f"no room for more extended attributes on this entry "
                                    f"({LIST_MAX} bytes of names, {TOTAL_MAX} of names and values)")
    return md


__all__ = ["KEY_PREFIX", "NAME_MAX", "VALUE_MAX", "TOTAL_MAX", "LIST_MAX", "XATTR_CREATE", "XATTR_REPLACE",
           "changed", "check_name", "decode_value", "encode_value", "is_key", "key_of", "read"]


@functools.lru_cache(maxsize=64)
def _entry(value) -> Entry:
    """The entry of ``value`` (a :class:`graveler.model.Value`), decoded once for the reads of its
    names that follow (``getfattr -d``: a listxattr, then a getxattr a name). Read only."""
    return Entry.from_value(value)


def _shown(out: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """Only what getxattr can hand out (metadata another client wrote, or a 70 KB content type,
    was listed, then refused: getfattr -d, rsync -aX and cp --preserve=xattr failed)."""
    return {n: v for n, v in out.items() if len(USER) < len(n) <= NAME_MAX and b"\0" not in n and len(v) <= VALUE_MAX}


def _users(metadata: dict[str, str], only: bytes | None) -> dict[bytes, bytes]:
    """The user's attributes kept in ``metadata`` (:func:`read`); ``only``: at least that one, if it
    is there -- its key looked up, every key decoded only when it is kept under another spelling."""
    if only is not None:
        v = metadata.get(key_of(only))
        if v is not None:
            return _shown({only: decode_value(v)})
    return _shown(read(metadata))


class XattrReads:
    """The extended-attribute reads of :class:`lakefuse.mount.fs.Filesystem` (which supplies
    ``inodes``, ``revalidate``, ``spooled`` and ``repo``); the writes are in
    :mod:`lakefuse.mount.writes`."""

    def _xattrs(self, ino: int, only: bytes | None = None) -> dict[bytes, bytes]:
        """Every name and value the node shows: the computed ``user.lakefs.*`` ones, then
        the user's (:mod:`lakefuse.mount.xattrs`: kept in the entry's metadata, a
        directory's in its marker; a file being written shows its spool file's). ``only``: the
        one name a getxattr asks for (at least): a user's name is looked up, not every one
        decoded (``getfattr -d`` of 1,000 names took 11 s, each of its reads decoding them all)."""
        node = self.inodes.get(ino)
        if node.kind not in (Kind.DIR, Kind.FILE, Kind.INFO_DIR) or node.tree is None:
            return {}
        if node.kind == Kind.FILE and not node.tree.immutable:
            sf = self.spooled(ino)
            if sf is not None and sf.detached:  # unlinked while open: its handles keep its names, as ext4's
                return _users(sf.user_metadata, only)  # (no entry any more: no user.lakefs.* names; it was ENOENT)
            if sf is None and node.unnamed and node.value is not None and not self.inodes.attached(node):
                return _users(_entry(node.value).metadata, only)  # (the same, open for reading: writes.py)
        if node.kind != Kind.INFO_DIR:
            if node.tree.immutable:
                node = self.revalidate(node)
            else:  # (as every read of a branch: a directory rename's keys are never seen half moved)
                with self.tree_lock(node.tree).shared():
                    node = self.revalidate(node)
        if node.kind == Kind.FILE and node.attr is not None and not stat.S_ISREG(node.attr.mode):
            return {}  # Linux reads user.* names of regular files and directories only: none to list
        tree = node.tree
        computed = only is None or only.startswith(XATTR_PREFIX)
        out = {XATTR_PREFIX + b"commit": tree.view.commit_id.encode()} if computed else {}
        if node.kind == Kind.FILE:
            e = _entry(node.value)
            sf = self.spooled(ino) if not tree.immutable else None
            if not computed:
                return _users(sf.user_metadata if sf is not None else e.metadata, only)
            out[XATTR_PREFIX + b"etag"] = e.etag.encode()
            out[XATTR_PREFIX + b"physical_address"] = self.repo.physical_address(e).encode()
            if e.content_type:
                out[XATTR_PREFIX + b"content_type"] = e.content_type.encode()
            for k, v in sorted(user_metadata(e.metadata).items()):
                if k not in POSIX_KEYS and not is_key(k):
                    out[XATTR_PREFIX + b"meta." + k.encode()] = v.encode()
            out.update(read(sf.user_metadata if sf is not None else e.metadata))
        elif node.kind == Kind.DIR:
            marker = tree.view.get(node.path + b"/") if node.path else tree.root_marker()
            if marker is not None:
                out.update(_users(_entry(marker).metadata, None if computed else only))
        return _shown(out)

    @staticmethod
    def check_xattr_name(name: bytes) -> None:
        """Refuse at once (never blocks) a name the mount holds no value for: a namespace
        other than ``user`` (ENOTSUP), a name longer than 255 bytes (ERANGE)."""
        check_name(name, writing=False)

    def getxattr(self, ino: int, name: bytes) -> bytes:
        check_name(name, writing=False)
        v = self._xattrs(ino, name).get(name)
        if v is None:
            raise FsError(errno.ENODATA)
        return v

    def listxattr(self, ino: int) -> list[bytes]:
        """The names, as many as the kernel's 64 KiB list takes (the user's own always fit: ``LIST_MAX``;
        past it, computed ``user.lakefs.meta.*`` names of another client's metadata are left out)."""
        names, room = [], XATTR_LIST_MAX
        have = list(self._xattrs(ino))
        for n in sorted(have, key=lambda n: n.startswith(XATTR_PREFIX + b"meta.")):  # (stable: those last)
            room -= len(n) + 1
            if room < 0:
                break
            names.append(n)
        return names
