"""Reading an open file of the mount (:class:`Reads`, a part of
:class:`lakefuse.mount.fs.Filesystem`): the four ways a read is answered, each counted in
``.lakefuse/stats``. The FUSE adapter tries them in order -- from memory, from the page cache
on the trio thread, waiting for a chunk a stream is bringing, and last in a worker thread.
"""

from __future__ import annotations


class Reads:
    """The read path of :class:`lakefuse.mount.fs.Filesystem` (which supplies ``_handle``
    and ``stats``)."""

    def read_fast(self, fh: int, offset: int, size: int) -> bytes | None:
        """The bytes when they are in memory already (a small file read at open, or what a
        sequential read fetched ahead), else None."""
        data = self._handle(fh).read_fast(offset, size)
        if data is not None:
            self.stats.add("bytes_memory", len(data))
            self.stats.add("bytes_read", len(data))  # (every read path adds: bytes_read is their sum)
        return data

    def read_nowait(self, fh: int, offset: int, size: int) -> bytes | bytearray | None:
        """The bytes when a local file's page cache holds them all (on the trio thread,
        never blocks; counted ``reads_inline``), else None: then :meth:`read`."""
        data = self._handle(fh).read_nowait(offset, size)
        if data is not None:
            self.stats.add("reads_inline")
            self.stats.add("bytes_inline", len(data))
            self.stats.add("bytes_read", len(data))
        return data

    def read_pending(self, fh: int, offset: int, size: int):
        """A future another thread completes once :meth:`read_fast` can answer this read (a
        chunk a remote object's stream is bringing; counted ``reads_awaited``), else None.
        Never blocks."""
        f = self._handle(fh).read_pending(offset, size)
        if f is not None:
            self.stats.add("reads_awaited")
        return f

    def read(self, fh: int, offset: int, size: int) -> bytes:
        """A read that may block (in a worker thread; counted ``reads_thread``)."""
        self.stats.add("reads_thread")
        data = self._handle(fh).read(offset, size)
        self.stats.add("bytes_thread", len(data))
        self.stats.add("bytes_read", len(data))
        return data
