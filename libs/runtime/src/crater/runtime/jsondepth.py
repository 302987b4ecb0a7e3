"""How deeply a JSON text nests, found by a scan rather than a decode.

Python's json module (and FastStream's decoder on it) recurses once per level: a
1,000-level document raises RecursionError, and anything deep costs stack and time before
any validation runs. The bus and the gateway check the depth first, with this scan.
"""

from __future__ import annotations

import json
import re
from itertools import accumulate

# A JSON string, escapes included (the unrolled form: no backtracking on long strings).
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = b"[]{}"
_NOT_BRACKETS = bytes(b for b in range(256) if b not in _BRACKETS)
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


class TooDeep(ValueError):
    """A JSON text nests deeper than the limit; names the limit and what was found."""

    def __init__(self, depth: int, limit: int) -> None:
        super().__init__(
            f"JSON nested {depth} levels deep; at most {limit} are accepted (max_json_depth)"
        )
        self.depth, self.limit = depth, limit


def json_depth(body: bytes | str) -> int:
    """The deepest nesting of arrays and objects in `body` (0 for a scalar).

    Brackets inside strings do not count. On text that is not JSON the figure is still
    bounded by the brackets it holds; decoding then refuses it anyway.
    """
    data = body.encode() if isinstance(body, str) else body
    if b"[" not in data and b"{" not in data:
        return 0
    # Strings removed, then everything but brackets: what is left is usually tiny.
    brackets = _STRING.sub(b"", data).translate(None, _NOT_BRACKETS)
    return max(accumulate(_STEP[b] for b in brackets), default=0)


def check_json_depth(body: bytes | str, limit: int) -> None:
    """Raise TooDeep when `body` nests deeper than `limit`."""
    data = body.encode() if isinstance(body, str) else body
    if data.count(b"[") + data.count(b"{") <= limit:
        return  # no deeper than its opening brackets: most messages, without the scan
    depth = json_depth(data)
    if depth > limit:
        raise TooDeep(depth, limit)


# What JSON's \u escapes can spell but no database or UTF-8 encoder takes: a lone UTF-16
# surrogate (half of a pair) and NUL.
_NOT_TEXT = re.compile("[\ud800-\udfff\x00]")


class NotText(ValueError):
    """A JSON string that is not Unicode text; names the field (a dotted path)."""

    def __init__(self, field: str, what: str) -> None:
        super().__init__(f"{field}: {what}")
        self.field, self.what = field, what


def check_json_text(body: bytes | str) -> None:
    """Raise NotText when a string (or a key) of `body` holds a lone surrogate or NUL, which
    only an escape can write: such a body is valid JSON, but storing or encoding the string
    fails later, in a handler, on every delivery. Bodies without a \\u escape pass at once."""
    data = body.encode() if isinstance(body, str) else body
    if b"\\u" not in data and b"\\U" not in data:
        return
    try:
        decoded = json.loads(data)
    except (ValueError, RecursionError):
        return  # not JSON: decoding refuses it, naming why
    found = _first_not_text(decoded, "")
    if found is not None:
        raise NotText(*found)


def check_text(field: str, value: str) -> None:
    """Raise NotText when `value` (a query or path parameter, a header) holds a lone
    surrogate or NUL, naming `field`."""
    found = _first_not_text(value, field)
    if found is not None:
        raise NotText(*found)


def _first_not_text(value: object, path: str) -> tuple[str, str] | None:
    if isinstance(value, str):
        match = _NOT_TEXT.search(value)
        if match is None:
            return None
        char = match.group()
        what = "a NUL character" if char == "\x00" else f"a lone surrogate (U+{ord(char):04X})"
        return path or "body", f"holds {what}: not Unicode text"
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if _NOT_TEXT.search(key):
                return where, "a key that is not Unicode text"
            if (found := _first_not_text(item, where)) is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if found := _first_not_text(item, f"{path}.{index}" if path else str(index)):
                return found
    return None
