"""What every command module of the CLI shares: exit codes, store options, terminal-safe text,
argument checks. A leaf module: it imports nothing of ``lakefuse.cli``, so the command
modules import it without reaching back into the package (which imports them)."""

from __future__ import annotations

import argparse
import re

from graveler.errors import (
    AlreadyExists,
    Conflict,
    CorruptedData,
    GravelerError,
    InvalidArgument,
    NotFound,
    ReadOnlyRef,
    StoreUnavailable,
    UnsupportedFormat,
)

# Exit codes: 1 generic failure, 2 usage / invalid argument, 3 not found, 4 conflict, 5 corrupted, 6 unavailable.
EXIT_CODES: list[tuple[type[GravelerError], int]] = [
    (InvalidArgument, 2),
    (NotFound, 3),
    (AlreadyExists, 4),
    (Conflict, 4),
    (ReadOnlyRef, 2),  # (a tag or commit named where a branch must be: the wrong input)
    (UnsupportedFormat, 2),  # (a healthy file of a form we do not read: the wrong input, not damage)
    (CorruptedData, 5),
    (StoreUnavailable, 6),
]


TIMEOUT_HELP = ("seconds an S3 request may wait for the server (to connect, and between bytes) before it is "
                "tried again (default: $LAKEFUSE_S3_READ_TIMEOUT, else 8)")
ATTEMPTS_HELP = ("attempts of each S3 request, the first one included (default: $LAKEFUSE_S3_MAX_ATTEMPTS, "
                 "else 3); a dead endpoint fails a command after about attempts x timeout seconds")


KV_HELP = ("where refs and staging live: 'lmdb' (the default: under the home) or "
           "postgresql://USER[:PASS]@HOST[:PORT]/DB?OPTIONS (shared by every host that reaches it; "
           "the password is better in ~/.pgpass or $PGPASSWORD); default: $LAKEFUSE_KV, else lmdb")


def checked_config(config):
    """``config`` unless its home is something other than a directory (a file: every command
    then said "no repositories" or blamed a storage path), or its KV is ``memory://`` (the
    tests' in-process backend keeps nothing past the process: a command would report success
    and lose everything). InvalidArgument: exit 2."""
    from graveler.errors import InvalidArgument

    home = config.home
    if home.exists() and not home.is_dir():
        raise InvalidArgument(f"the lakefuse home {home} is not a directory (--home, $LAKEFUSE_HOME)")
    if config.kv.url.startswith("memory://"):
        raise InvalidArgument(f"{config.kv.url} is an in-process KV for tests: nothing of it outlives this "
                              "command. Use 'lmdb' or 'postgresql://...'")
    return config


def add_kv_option(p: argparse.ArgumentParser, default=argparse.SUPPRESS) -> None:
    """``--kv URL`` (on the main parser and on every command that opens a home)."""
    p.add_argument("--kv", metavar="URL", default=default, help=KV_HELP)


def add_store_options(p: argparse.ArgumentParser, default=argparse.SUPPRESS) -> None:
    """``--timeout`` and ``--max-attempts`` (on the main parser and on every command)."""
    p.add_argument("--timeout", metavar="SECONDS", type=float, default=default, help=TIMEOUT_HELP)
    p.add_argument("--max-attempts", metavar="N", type=int, default=default, help=ATTEMPTS_HELP)


def store_config(args: argparse.Namespace):
    """The object-store configuration of a command: environment defaults, then ``--timeout`` / ``--max-attempts``."""
    from graveler.config import StoreConfig

    timeout, attempts = getattr(args, "timeout", None), getattr(args, "max_attempts", None)
    if timeout is not None and not timeout > 0:  # (NaN too)
        raise InvalidArgument(f"--timeout must be a positive number of seconds, not {timeout}")
    if attempts is not None and attempts < 1:
        raise InvalidArgument(f"--max-attempts must be at least 1, not {attempts}")
    return StoreConfig().with_timeout(timeout, attempts)


# What a terminal would act on instead of showing: C0/C1 controls (ESC starts every escape
# sequence; CR, BS rewrite the line), DEL, and the bidi overrides that reorder text.
_TERMINAL_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\udc80-\udcff]")


def _escape_char(m: re.Match) -> str:
    c = ord(m.group())
    if 0xDC80 <= c <= 0xDCFF:  # an undecodable byte of a name (surrogateescape)
        return f"\\x{c - 0xDC00:02x}"
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def terminal_text(text: str, stream=None) -> str:
    """``text`` as it may be shown to a person: on a terminal (``stream.isatty()``), control
    characters and bidi overrides become ``\\xNN`` / ``\\uNNNN`` so a name or a commit message
    cannot move the cursor, retitle the window or hide text; undecodable bytes of names are
    always shown as ``\\xNN``. Output to a file or a pipe is otherwise left exact (and
    ``--json`` output is JSON, exact everywhere)."""
    tty = stream is not None and _isatty(stream)
    if tty:
        return _TERMINAL_UNSAFE.sub(_escape_char, text)
    if any(0xDC80 <= ord(c) <= 0xDCFF for c in text):
        return re.sub("[\udc80-\udcff]", _escape_char, text)
    return text


def one_line(text: str) -> str:
    """``text`` with its control characters (C0, DEL and C1: newlines and tabs too) as ``\\xNN``:
    an error message stays one line whatever names it quotes."""
    return re.sub("[\x00-\x1f\x7f-\x9f]", lambda m: f"\\x{ord(m.group()):02x}", text)


def _isatty(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _escape_arg(arg: str) -> str:
    """An argument for an error message: undecodable bytes and control characters as \\xNN."""
    return one_line(arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"))


def check_argv(argv: list[str]) -> None:
    """Refuse an argument that is not valid UTF-8 (``InvalidArgument``), once, before parsing.

    Python hands undecodable argument bytes over as lone surrogates; every name
    lakefuse takes (repositories, refs, paths, messages, metadata, URIs) is UTF-8
    text, so such an argument is refused here rather than deep inside a command.
    """
    for i, arg in enumerate(argv, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"argument {i} is not valid UTF-8: '{_escape_arg(arg)}'") from None


def exit_code(e: GravelerError) -> int:
    """The exit code of a graveler error (see EXIT_CODES; 1 for anything else)."""
    for cls, code in EXIT_CODES:
        if isinstance(e, cls):
            return code
    return 1
