"""Who a commit names as its committer.

git records ``user.name``; lakeFS records the authenticated user. lakefuse has no login of
its own, so a commit, merge, revert or import names ``$LAKEFUSE_COMMITTER`` when it is set
(e.g. a service account's jobs), else the operating system's login name of the user who
asked: the CLI's effective user, and through a mount the user whose process opened the
control file, as the kernel reports it (the request's text cannot change it).
"""

from __future__ import annotations

import os
import pwd

COMMITTER_ENV = "LAKEFUSE_COMMITTER"


def login_name(uid: int) -> str:
    """The login name of ``uid``, or ``uid:N`` when the user database has none."""
    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return f"uid:{uid}"


def committer(uid: int | None = None) -> str:
    """``$LAKEFUSE_COMMITTER`` (blank: unset), else the login name of ``uid`` (None: this
    process's effective user)."""
    return os.environ.get(COMMITTER_ENV, "").strip() or login_name(os.geteuid() if uid is None else uid)
