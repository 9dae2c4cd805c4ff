"""The lakefuse mount: every ref of a repository as a directory tree (pyfuse3 + trio).

Layers, outermost first:

* :mod:`lakefuse.mount.daemon` -- mount / run / unmount: pyfuse3 init and main loop,
  signals, ``READY=1`` on ``$NOTIFY_SOCKET``, daemonizing, ``lakefuse umount``.
* :mod:`lakefuse.mount.fuse` -- the thin pyfuse3 ``Operations`` adapter: every handler
  logs, calls the core (blocking calls through :mod:`lakefuse.mount.offload`), converts
  plain data to pyfuse3's types, and maps errors through :mod:`lakefuse.mount.errors`
  behind one error boundary.
* :mod:`lakefuse.mount.fs` -- the filesystem core: the semantics (docs/SEMANTICS.md),
  synchronous, thread-safe, returning plain data; tested without a kernel.
* :mod:`lakefuse.mount.writes` -- branch trees writable (create, write, rename, unlink, ...), over
  :mod:`lakefuse.mount.spool` (the local files a file being written lives in until close/fsync).
* :mod:`lakefuse.mount.inodes` -- the inode table (lookup counts, ``forget``).
* :mod:`lakefuse.mount.control` -- the ``.lakefuse`` control files of a branch (commit, merge, reset,
  revert) and of the root (branch, tag); the read-only info files (head, log, stats) are
  answered by :mod:`lakefuse.mount.fs`, their counters kept in :mod:`lakefuse.mount.stats`.

graveler underneath is used through :class:`graveler.view.View`, a pinned read handle.
"""
