"""The one way the scheduler's configuration files (pools, quotas) are read: YAML into a
pydantic model, every problem reported as `<origin>: <field>: <reason>`."""

from __future__ import annotations

from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

Spec = TypeVar("Spec", bound=BaseModel)


class SpecError(ValueError):
    """A configuration file that cannot be used: `<origin>: <field>: <reason>`, and each
    (field, reason) on its own (an API answer names them one by one)."""

    def __init__(self, origin: str, problems: list[tuple[str, str]]) -> None:
        super().__init__(f"{origin}: " + "; ".join(f"{f}: {r}" for f, r in problems))
        self.problems = problems


def parse_yaml_spec(text: str, model: type[Spec], error: type[SpecError], origin: str) -> Spec:
    """`text` (YAML, or JSON, which YAML reads) as `model`, or `error` naming every invalid
    field (or the YAML fault)."""
    try:
        return model.model_validate(yaml.safe_load(text))
    except yaml.YAMLError as fault:
        raise error(origin, [("body", f"not valid YAML: {fault}")]) from fault
    except ValidationError as invalid:
        problems = [
            (".".join(map(str, e["loc"])) or "body", e["msg"])
            for e in invalid.errors(include_url=False)
        ]
        raise error(origin, problems) from invalid
