"""The version-control commands, lakectl-shaped, on ``lakefs://REPO/REF/PATH`` URIs.

``register(sub)`` is the one entry point; the commands live in modules along
the seams of the command line itself:

* :mod:`lakefuse.cli.vc_refs`: ``repo``, ``branch``, ``tag``, ``refs``
* :mod:`lakefuse.cli.vc_fs`: ``fs upload / cat / ls / stat / rm``
* :mod:`lakefuse.cli.vc_history`: ``commit``, ``log``, ``show``, ``diff``, ``merge``, ``revert``
* :mod:`lakefuse.cli.vc_common`: options (``--home``, ``--json``), the graveler
  session, output helpers and the JSON conventions
* :mod:`lakefuse.cli.uri`: ``lakefs://`` URI parsing

Each command takes ``--home DIR`` (else ``$LAKEFUSE_HOME``, else
``~/.local/share/lakefuse``) and ``--kv URL`` (else ``$LAKEFUSE_KV``, else
``lmdb``: where refs and staging live), builds a ``GravelerConfig`` from them
and closes what it opened before returning. Errors are graveler's (``InvalidArgument``,
``NotFound``, ...): ``lakefuse.cli.main`` turns them into one-line messages and
exit codes.
"""

from __future__ import annotations

from lakefuse.cli import vc_fs, vc_history, vc_refs


def register(sub) -> None:
    vc_refs.register(sub)
    vc_fs.register(sub)
    vc_history.register(sub)
