"""A pyfuse3 + trio filesystem that keeps its names and attributes in dicts and its files'
bytes nowhere: each request answered on the trio thread with no I/O. What it costs per file is
the binding's own floor (libfuse, pyfuse3's dispatch, trio), under any pyfuse3 daemon's;
``mount_write.py`` runs it beside lakefuse. Not a filesystem to keep data in.

    python scripts/bench/nullfs.py MOUNTPOINT   # serves until unmounted
"""

from __future__ import annotations

import errno
import os
import stat
import sys
import time

import pyfuse3
import trio


class NullFs(pyfuse3.Operations):
    def __init__(self) -> None:
        super().__init__()
        self.next_ino = pyfuse3.ROOT_INODE + 1
        self.names: dict[tuple[int, bytes], int] = {}
        self.attrs: dict[int, list[int]] = {pyfuse3.ROOT_INODE: [stat.S_IFDIR | 0o755, 0]}  # ino -> [mode, size]

    def _attr(self, ino: int) -> pyfuse3.EntryAttributes:
        mode, size = self.attrs[ino]
        a = pyfuse3.EntryAttributes()
        a.st_ino, a.st_mode, a.st_size, a.st_nlink = ino, mode, size, 1
        a.st_uid, a.st_gid = os.getuid(), os.getgid()
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = time.time_ns()
        a.attr_timeout = a.entry_timeout = 1.0  # as lakefuse's branch trees
        return a

    def _new(self, parent: int, name, mode: int) -> pyfuse3.EntryAttributes:
        key = (parent, bytes(name))
        if key in self.names:
            raise pyfuse3.FUSEError(errno.EEXIST)
        ino, self.next_ino = self.next_ino, self.next_ino + 1
        self.names[key] = ino
        self.attrs[ino] = [mode, 0]
        return self._attr(ino)

    async def lookup(self, parent_inode, name, ctx=None):
        ino = self.names.get((parent_inode, bytes(name)))
        if ino is None:
            raise pyfuse3.FUSEError(errno.ENOENT)
        return self._attr(ino)

    async def getattr(self, inode, ctx=None):
        return self._attr(inode)

    async def setattr(self, inode, attr, fields, fh, ctx):
        if fields.update_size:
            self.attrs[inode][1] = attr.st_size
        return self._attr(inode)

    async def mkdir(self, parent_inode, name, mode, ctx):
        return self._new(parent_inode, name, stat.S_IFDIR | (mode & 0o7777))

    async def create(self, parent_inode, name, mode, flags, ctx):
        attr = self._new(parent_inode, name, stat.S_IFREG | (mode & 0o7777))
        return pyfuse3.FileInfo(fh=attr.st_ino), attr

    async def open(self, inode, flags, ctx):
        return pyfuse3.FileInfo(fh=inode)

    async def write(self, fh, off, buf):
        a = self.attrs[fh]
        a[1] = max(a[1], off + len(buf))
        return len(buf)

    async def read(self, fh, off, size):
        return b"\0" * max(0, min(size, self.attrs[fh][1] - off))

    async def flush(self, fh):
        pass

    async def fsync(self, fh, datasync):
        pass

    async def release(self, fh):
        pass

    async def opendir(self, inode, ctx):
        return inode

    async def readdir(self, fh, start_id, token):
        pass

    async def releasedir(self, fh):
        pass

    async def getxattr(self, inode, name, ctx):
        raise pyfuse3.FUSEError(errno.ENODATA)

    async def statfs(self, ctx):
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = 4096
        s.f_namemax = 255
        return s


def main() -> None:
    opts = set(pyfuse3.default_options) | {"fsname=nullfs"}
    opts.discard("default_permissions")
    pyfuse3.init(NullFs(), sys.argv[1], opts)
    try:
        trio.run(pyfuse3.main)
    finally:
        pyfuse3.close(unmount=True)


if __name__ == "__main__":
    main()
