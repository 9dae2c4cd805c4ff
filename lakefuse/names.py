"""How a key is shown to a person, by the CLI and by the mount's text files alike.

git's rule for paths in its human-readable output: a name is shown bare when it is plain, else
in double quotes with C escapes, so that no name can fake a line or a field of the output.
"""

from __future__ import annotations

import re

# C0 and C1 controls, DEL, the Unicode line and paragraph separators (str.splitlines() and some
# terminals break lines at U+0085, U+2028 and U+2029), the quote, the backslash, undecodable bytes
_QUOTED = re.compile('[\x00-\x1f\x7f-\x9f\u2028\u2029"\\\\\udc80-\udcff]')
_QUOTE_AS = {"\n": "\\n", "\t": "\\t", "\r": "\\r", '"': '\\"', "\\": "\\\\"}


def decode_key(key: bytes) -> str:
    return key.decode("utf-8", "surrogateescape")


def show_name(name: str) -> str:
    """A key as the human-readable output shows it, as git shows paths: bare when plain, else
    in double quotes with C escapes (``\\n``, ``\\t``, ``\\"``, ``\\\\``, ``\\xNN`` for any other C0
    control character, DEL or undecodable byte, ``\\uNNNN`` for a C1 control character or a Unicode
    line or paragraph separator) -- a name can never fake a line or a field of the output, on a
    terminal or in a pipe. (``--json`` output keeps names exact.)"""
    if not _QUOTED.search(name):
        return name

    def esc(m: re.Match) -> str:
        c = m.group()
        if c in _QUOTE_AS:
            return _QUOTE_AS[c]
        o = ord(c)
        if o >= 0xDC80:  # an undecodable byte
            return f"\\x{o - 0xDC00:02x}"
        return f"\\x{o:02x}" if o <= 0x7F else f"\\u{o:04x}"

    return '"' + _QUOTED.sub(esc, name) + '"'
