"""The one way the scheduler's configuration files (pools, quotas) are read: YAML into a
pydantic model, every problem reported as `<origin>: <field>: <reason>`."""

from __future__ import annotations

from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

Spec = TypeVar("Spec", bound=BaseModel)


def parse_yaml_spec(text: str, model: type[Spec], error: type[ValueError], origin: str) -> Spec:
    """`text` as `model`, or `error` naming every invalid field (or the YAML fault)."""
    try:
        return model.model_validate(yaml.safe_load(text))
    except yaml.YAMLError as fault:
        raise error(f"{origin}: not valid YAML: {fault}") from fault
    except ValidationError as invalid:
        reasons = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}"
            for e in invalid.errors(include_url=False)
        )
        raise error(f"{origin}: {reasons}") from invalid
