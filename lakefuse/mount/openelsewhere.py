"""Whether a file of the mount is still open in some process: for a control file's empty close.

The kernel sends a flush for every close(2) of a descriptor, and a release only for the last.
A control file closed with nothing written is an empty request (EINVAL) -- but only if it is
its last descriptor: ``echo msg > commit`` in bash opens the file, moves it to descriptor 1 and
closes the first before ``echo`` writes, and a parent that hands the file to a child as its
output closes its own copy first too. A flush carries no count of the file's other
descriptors, so :func:`open_elsewhere` looks for one in ``/proc/*/fd`` (the links name the
file by its path as the process sees it: a process in another mount namespace is not found,
and its empty close stays EINVAL). It reads links only (``readlink``: no request comes back to
the mount) and stops after :data:`MAX_LINKS` of them.
"""

from __future__ import annotations

import os

MAX_LINKS = 100_000  # links read at most per question (a host with very many open files: not found)


def _writing(fdinfo: bytes) -> bool:
    """Whether the descriptor ``/proc/PID/fdinfo/FD`` describes is open for writing (not O_RDONLY)."""
    try:
        with open(fdinfo, "rb") as f:
            for line in f:
                if line.startswith(b"flags:"):
                    return int(line.split()[1], 8) & os.O_ACCMODE != os.O_RDONLY
    except (OSError, ValueError, IndexError):
        pass
    return False


def open_elsewhere(path: bytes, proc: bytes = b"/proc") -> bool:
    """Whether a descriptor of some process (this one excepted) names ``path`` open for writing
    (a reader of the file's outcome is none: the request cannot come through it)."""
    me = str(os.getpid()).encode()
    seen = 0
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit() and p != me]
    except OSError:
        return False
    for pid in pids:
        fd_dir = proc + b"/" + pid + b"/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or not ours to look at
            continue
        for fd in fds:
            seen += 1
            if seen > MAX_LINKS:
                return False
            try:
                if os.readlink(fd_dir + b"/" + fd) == path and _writing(proc + b"/" + pid + b"/fdinfo/" + fd):
                    return True
            except OSError:
                continue
    return False


__all__ = ["MAX_LINKS", "open_elsewhere"]
