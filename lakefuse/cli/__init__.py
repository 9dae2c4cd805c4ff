"""The ``lakefuse`` command line: lakectl-shaped commands over graveler.

Each command group lives in its own module and registers its sub-commands on
the parser; ``main`` maps graveler errors to one-line messages and exit codes.
"""

from __future__ import annotations

import argparse
import logging
import sys

from graveler.errors import GravelerError, InvalidArgument
from lakefuse.cli.common import (  # noqa: F401  (re-exported: the package's helpers by their old names)
    EXIT_CODES,
    add_kv_option,
    add_store_options,
    check_argv,
    exit_code,
    one_line,
    store_config,
    terminal_text,
)

log = logging.getLogger(__name__)


def _modules():
    from lakefuse.cli import kv_cmds, mount, spark_cmds, sst, vc

    return [vc, kv_cmds, sst, mount, spark_cmds]


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
    add_kv_option(p, None)
    add_store_options(p, argparse.SUPPRESS)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for mod in _modules():
        mod.register(sub)
    return p


def _fail(e: GravelerError) -> int:
    # one line, whatever the names in it hold (a key with a newline or a tab: \x0a, \x09)
    print(terminal_text(one_line(f"lakefuse: {e}"), sys.stderr), file=sys.stderr)
    return exit_code(e)


def _own_parsers(parser: argparse.ArgumentParser) -> None:
    """Each (sub)command's parser names itself in what it parses (``_parser``), for its own usage."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in set(action.choices.values()):
                sub.set_defaults(_parser=sub)
                _own_parsers(sub)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    try:
        check_argv(argv)
    except InvalidArgument as e:
        return _fail(e)
    from lakefuse.cli import logsafe
    from lakefuse.cli.mount import from_mount_helper

    argv = from_mount_helper(argv)  # `lakefuse lakefs://REPO MOUNTPOINT -o ...` (mount -t fuse.lakefuse)
    parser = build_parser()
    _own_parsers(parser)
    args, extra = parser.parse_known_args(argv)
    if extra:  # (the command's usage, not the top level's: found by a docs tour)
        getattr(args, "_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    logsafe.guard_root()  # (botocore's -vv debug log prints request headers: credentials blanked)
    if not args.verbose and args.func.__name__ != "cmd_mount":
        # the pool's note that it replaced a connection the server closed (a restart): the command
        # goes on, and its own error, if any, is the one line on stderr (-v shows the note)
        logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    try:
        return int(args.func(args) or 0)
    except GravelerError as e:
        return _fail(e)
    except BrokenPipeError:  # `lakefuse sst dump x | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("lakefuse: interrupted", file=sys.stderr)
        return 130
    except OSError as e:
        print(f"lakefuse: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr)
        return 1
    except Exception as e:  # a graveler error raised in a Spark task reaches here wrapped in Spark's
        err = _from_spark(e)
        if err is None:
            raise
        _stop_spark()  # (its workers' shutdown noise comes before the one line, not after it)
        return _fail(err)


def _stop_spark() -> None:
    """Stop the Spark session a command started, if any (a failed job's workers print as they go)."""
    if "pyspark" not in sys.modules:
        return
    try:
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None:
            active.stop()
    except Exception:  # noqa: BLE001 -- stopping is a courtesy: the error is what the user must see
        pass


def _from_spark(e: Exception):
    """The graveler error a Spark task raised, from Spark's wrapper of it (PythonException,
    Py4JJavaError): one line and its exit code, not a page of traceback. None: not one."""
    import re

    import graveler.errors as errors

    if type(e).__name__ not in ("PythonException", "Py4JJavaError", "SparkException"):
        return None
    m = re.search(r"graveler\.errors\.(\w+): ([^\n]*)", str(e))
    cls = getattr(errors, m.group(1), None) if m else None
    if not (isinstance(cls, type) and issubclass(cls, errors.GravelerError)):
        return None
    err = errors.GravelerError.__new__(cls)
    Exception.__init__(err, m.group(2))
    return err


def submit_main(command: str, argv: list[str]) -> int:
    """The entry of ``scripts/spark_<command>.py`` under spark-submit: ``lakefuse <command> ARGS``."""
    return main([command, *argv])
