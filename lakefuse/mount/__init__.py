"""The lakefuse mount: every ref of a repository as a directory tree (pyfuse3 + trio).

Layers, outermost first:

* :mod:`lakefuse.mount.daemon` -- mount / run / unmount: pyfuse3 init and main loop,
  signals, ``READY=1`` on ``$NOTIFY_SOCKET``, daemonizing, ``lakefuse umount``; owns the
  spool and the read-ahead workers for the daemon's lifetime.
* :mod:`lakefuse.mount.fuse` -- the thin pyfuse3 ``Operations`` adapter: every handler
  logs, calls the core's public methods (blocking calls, releases with work included,
  through :mod:`lakefuse.mount.offload`), converts plain data to pyfuse3's types, and maps
  errors through :mod:`lakefuse.mount.errors` (the one errno policy) behind one boundary.
* :mod:`lakefuse.mount.fs` -- the filesystem core: one class that dispatches; the semantics
  (docs/SEMANTICS.md), synchronous, thread-safe, returning plain data; tested without a kernel.
  Its collaborators:

  * :mod:`lakefuse.mount.handles` -- open files (committed object, local object, spool file,
    control file, info file), each owning read / write / flush / release;
  * :mod:`lakefuse.mount.special` -- the one registry of ``.lakefuse`` files (info and control);
  * :mod:`lakefuse.mount.listing` -- directory listing (root, ``.lakefuse``, tree directories);
  * :mod:`lakefuse.mount.writes` -- branch operations: writes on branch trees, branch creation,
    over :mod:`lakefuse.mount.spool` (the local files a file being written lives in until
    close/fsync);
  * :mod:`lakefuse.mount.control` -- the requests of control files (commit, merge, reset,
    revert; branch, tag), parsed and run;
  * :mod:`lakefuse.mount.attrs` -- the plain data handed out and how entries become attributes;
  * :mod:`lakefuse.mount.trees` -- a ref as a tree (re-pinned as its branch moves), rename locks;
  * :mod:`lakefuse.mount.inodes` -- the inode table (lookup counts, ``forget``);
  * :mod:`lakefuse.mount.stats` -- the counters of ``.lakefuse/stats``.

graveler underneath is used through :class:`graveler.view.View`, a pinned read handle.
"""
