"""Tenant quotas from a YAML file:

tenants:
  search: {gpus: 16, gpu_memory_mb: 1310720, cpu_cores: 256, memory_mb: 2097152}
  research: {gpus: 8}
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from crater.scheduler.adapters.yaml_spec import parse_yaml_spec
from crater.scheduler.domain.quotas import Quota


class _QuotaSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpus: int | None = Field(default=None, ge=0)
    gpu_memory_mb: int | None = Field(default=None, ge=0)
    cpu_cores: int | None = Field(default=None, ge=0)
    memory_mb: int | None = Field(default=None, ge=0)


class _QuotasFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenants: dict[str, _QuotaSpec]


class QuotasFileError(ValueError):
    """A quotas file that cannot be used, with the field and the reason."""


def parse_quotas(text: str, origin: str = "quotas file") -> dict[str, Quota]:
    spec = parse_yaml_spec(text, _QuotasFile, QuotasFileError, origin)
    return {tenant: Quota(**q.model_dump()) for tenant, q in spec.tenants.items()}


def load_quotas(path: Path) -> dict[str, Quota]:
    return parse_quotas(path.read_text(), str(path))
