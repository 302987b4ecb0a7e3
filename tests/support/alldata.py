"""AllData's formats, exactly as AllData sends them (../shared/compat, copied byte for byte
into tests/fixtures/alldata): never edited to fit the code."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "alldata"
SHARED = ROOT.parent / "shared" / "compat"


def fixture(name: str) -> bytes:
    """The fixture's bytes: the shared original where this checkout has it, else the copy."""
    shared = SHARED / name
    return shared.read_bytes() if shared.is_file() else (FIXTURES / name).read_bytes()
