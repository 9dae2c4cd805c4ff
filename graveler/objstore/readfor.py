"""Reads of local files on behalf of a repository's owner, by a process of another user.

A repository's entries name its objects: RELATIVE addresses in its storage namespace, FULL
ones anywhere (an import of a local directory leaves the files where they are). Whoever can
write a repository -- its refs, a refs dump, its namespace -- chooses those names. When the
process reading them runs as the same user, the kernel's own checks apply and nothing more is
needed. When it runs as another one -- root mounting a user's repository for everyone with
``allow_other``, root exporting it -- an entry naming ``/etc/shadow`` (or a symbolic link in the
namespace pointing there) would be served with root's rights. So such a process reads a local
file only if one of these holds, checked on the open descriptor (no race with a rename):

* the file belongs to the repository's owner (the owner of the namespace directory);
* it belongs to this process's user and lies, with no symbolic link on the way, in the
  namespace itself (the objects this process wrote there);
* its owner may read it by its mode bits (owner, group, other; every directory above it
  searchable), the answer the kernel would give that user (ACLs are not read: a file an
  ACL alone opens to the owner is refused).

Anything else is :class:`graveler.errors.Forbidden`.
"""

from __future__ import annotations

import os
import pwd
import stat

from graveler.errors import Forbidden


class ReadFor:
    """Checks that the owner ``uid`` of a repository may read a file this process opened."""

    def __init__(self, uid: int, own_root: str | None):
        self.uid = uid
        self.euid = os.geteuid()
        self.own_root = os.path.join(os.path.realpath(own_root), "") if own_root else None
        try:
            pw = pwd.getpwuid(uid)
            self.groups = frozenset(os.getgrouplist(pw.pw_name, pw.pw_gid))
            self.who = f"{pw.pw_name} (uid {uid})"
        except (KeyError, OSError):
            self.groups = frozenset()
            self.who = f"uid {uid}"

    def check(self, fd: int, st: os.stat_result, uri: str) -> None:
        """Forbidden unless the repository's owner may read the file open on ``fd`` (``st``: its fstat)."""
        if self.uid == 0 or st.st_uid == self.uid:
            return
        try:
            real = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            real = None
        if real is not None and st.st_uid == self.euid and self.own_root is not None and real.startswith(self.own_root):
            return
        if real is not None and self._may(st, stat.S_IROTH) and self._searchable(os.path.dirname(real)):
            return
        raise Forbidden(f"{uri}: refused: the repository's owner, {self.who}, may not read it, and this process "
                        f"(uid {self.euid}) reads a repository of another user only what its owner may read")

    def _may(self, st: os.stat_result, other_bit: int) -> bool:
        if st.st_uid == self.uid:
            return bool(st.st_mode & (other_bit << 6))
        if st.st_gid in self.groups:
            return bool(st.st_mode & (other_bit << 3))
        return bool(st.st_mode & other_bit)

    def _searchable(self, d: str) -> bool:
        while True:
            try:
                st = os.stat(d)
            except OSError:
                return False
            if not self._may(st, stat.S_IXOTH):
                return False
            parent = os.path.dirname(d)
            if parent == d:
                return True
            d = parent


def reads_for(root: str) -> ReadFor | None:
    """A :class:`ReadFor` for the owner of directory ``root`` (a repository's namespace) when
    that is not this process's user; None when it is (or ``root`` cannot be read: its store
    says so at its first use)."""
    try:
        owner = os.stat(root).st_uid
    except OSError:
        return None
    return None if owner == os.geteuid() else ReadFor(owner, root)


__all__ = ["ReadFor", "reads_for"]
