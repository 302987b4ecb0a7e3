"""AllData's formats, exactly as AllData sends them (../shared/compat, copied byte for byte
into tests/fixtures/alldata): never edited to fit the code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "alldata"
SHARED = ROOT.parent / "shared" / "compat"


def fixture(name: str) -> bytes:
    """The fixture's bytes: the shared original where this checkout has it, else the copy."""
    shared = SHARED / name
    return shared.read_bytes() if shared.is_file() else (FIXTURES / name).read_bytes()


def shape(value: Any) -> Any:
    """A parsed JSON document with every value masked by its JSON type, objects as their
    (key, shape) pairs in order: two documents of the same byte-level shape (keys, key order,
    types, at every level) compare equal. A list is the distinct shapes of its items, so
    two lists of ints compare equal whatever their lengths."""
    if isinstance(value, dict):
        return [(key, shape(item)) for key, item in value.items()]
    if isinstance(value, list):
        kinds: list[Any] = []
        for item in value:
            if shape(item) not in kinds:
                kinds.append(shape(item))
        return kinds
    return type(value).__name__
