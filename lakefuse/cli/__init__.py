"""The ``lakefuse`` command line: lakectl-shaped commands over graveler.

Each command group lives in its own module and registers its sub-commands on
the parser; ``main`` maps graveler errors to one-line messages and exit codes.
"""

from __future__ import annotations

import argparse
import logging
import sys

from graveler.errors import (
    AlreadyExists,
    Conflict,
    CorruptedData,
    GravelerError,
    InvalidArgument,
    NotFound,
    ReadOnlyRef,
    StoreUnavailable,
)

log = logging.getLogger(__name__)

# Exit codes: 1 generic failure, 2 usage / invalid argument, 3 not found, 4 conflict, 5 corrupted, 6 unavailable.
EXIT_CODES: list[tuple[type[GravelerError], int]] = [
    (InvalidArgument, 2),
    (NotFound, 3),
    (AlreadyExists, 4),
    (Conflict, 4),
    (ReadOnlyRef, 4),
    (CorruptedData, 5),
    (StoreUnavailable, 6),
]


def _modules():
    from lakefuse.cli import mount, spark_cmds, sst, vc

    return [vc, sst, mount, spark_cmds]


def build_parser() -> argparse.ArgumentParser:
    from lakefuse import __version__

    p = argparse.ArgumentParser(
        prog="lakefuse",
        description="Git-style version control for data lakes (lakeFS-compatible storage).",
    )
    p.add_argument("--version", action="version", version=f"lakefuse {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    p.add_argument("--home", metavar="DIR", default=None,
                   help="lakefuse home (refs, staging, default storage); else $LAKEFUSE_HOME, "
                        "else ~/.local/share/lakefuse")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for mod in _modules():
        mod.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    from lakefuse.cli.mount import from_mount_helper

    argv = from_mount_helper(argv)  # `lakefuse lakefs://REPO MOUNTPOINT -o ...` (mount -t fuse.lakefuse)
    parser = build_parser()
    args = parser.parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except GravelerError as e:
        for cls, code in EXIT_CODES:
            if isinstance(e, cls):
                break
        else:
            code = 1
        print(f"lakefuse: {e}", file=sys.stderr)
        return code
    except BrokenPipeError:  # `lakefuse sst dump x | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("lakefuse: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        print(f"lakefuse: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr)
        return 1
