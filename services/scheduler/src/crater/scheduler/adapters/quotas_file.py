"""Tenant quotas from a YAML file:

tenants:
  search: {gpus: 16, gpu_memory_mb: 1310720, cpu_cores: 256, memory_mb: 2097152}
  research: {gpus: 8}
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

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


def load_quotas(path: Path) -> dict[str, Quota]:
    spec = _QuotasFile.model_validate(yaml.safe_load(path.read_text()))
    return {tenant: Quota(**q.model_dump()) for tenant, q in spec.tenants.items()}
