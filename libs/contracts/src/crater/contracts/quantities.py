"""Kubernetes quantities ("40Gi", "500Gi", "1.5Ti", "40G"), as operators write resources.

A resource field of a request takes a number in the field's own unit, as it always has, or a
quantity string with a unit suffix, turned into the field's unit and rounded up to a whole
one: a request never shrinks in translation. A string of digits alone keeps the field's unit
(`"40960"` for memory_mb is 40960 MiB), as pydantic read it before quantities were accepted.
"""

from __future__ import annotations

import re
from decimal import Decimal
from fractions import Fraction
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

# Kubernetes' suffixes: binary (powers of 1024) and decimal (powers of 1000).
BINARY_SUFFIXES = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
DECIMAL_SUFFIXES = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_SUFFIXES = {**BINARY_SUFFIXES, **DECIMAL_SUFFIXES}
_QUANTITY = re.compile(r"^(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?P<suffix>[KMGTPE]i|[kMGTPE])?$")

# For the JSON Schema: what a quantity string looks like.
QUANTITY_PATTERN = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[kMGTPE])?$"
ACCEPTED_QUANTITIES = (
    "a number, or a Kubernetes quantity <number><suffix>: binary Ki Mi Gi Ti Pi Ei or "
    "decimal k M G T P E, e.g. 40Gi, 500Gi, 1.5Ti, 40G, 512Mi"
)

MIB = 2**20
GB = 10**9


def parse_quantity(text: str) -> Fraction:
    """The amount a quantity string stands for, exactly (bytes for a size; a bare number is
    itself); ValueError naming the accepted forms."""
    match = _QUANTITY.match(text.strip()) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"{text!r} is not a quantity; accepted: {ACCEPTED_QUANTITIES}")
    number = Fraction(Decimal(match["number"]))
    return number * _SUFFIXES.get(match["suffix"] or "", 1)


def in_unit(value: object, unit: int, unit_name: str) -> object:
    """Before validation of a field counted in `unit` bytes: a quantity string with a suffix
    becomes whole units, rounded up; anything else is left for the field's own checks."""
    if not isinstance(value, str):
        return value
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise ValueError(
            f"{value!r} is neither a number of {unit_name} nor a quantity; accepted: "
            f"{ACCEPTED_QUANTITIES}"
        )
    if match["suffix"] is None:
        return value  # a bare number is in the field's own unit, as before quantities
    amount = parse_quantity(value)
    return -(-amount.numerator // (amount.denominator * unit))  # ceiling: never shrink


def quantity_schema(schema: dict[str, Any]) -> None:
    """json_schema_extra of a quantity field: its integer schema, or a quantity string."""
    number = {k: schema.pop(k) for k in ("type", "minimum", "maximum") if k in schema}
    schema["anyOf"] = [number, {"type": "string", "pattern": QUANTITY_PATTERN}]


# Resource fields counted in MiB (`*_mb`) or in decimal GB (`*_gb`, as disks are sold, and as
# the probe reports a disk's capacity_gb): a number of that unit, or a quantity string.
MiBQuantity = Annotated[
    int,
    BeforeValidator(lambda value: in_unit(value, MIB, "MiB")),
    Field(json_schema_extra=quantity_schema),
]
GBQuantity = Annotated[
    int,
    BeforeValidator(lambda value: in_unit(value, GB, "GB")),
    Field(json_schema_extra=quantity_schema),
]
