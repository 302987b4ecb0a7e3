"""How deeply a JSON text nests, found by a scan rather than a decode.

Python's json module (and FastStream's decoder on it) recurses once per level: a
1,000-level document raises RecursionError, and anything deep costs stack and time before
any validation runs. The bus and the gateway check the depth first, with this scan.
"""

from __future__ import annotations

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
    depth = json_depth(body)
    if depth > limit:
        raise TooDeep(depth, limit)
