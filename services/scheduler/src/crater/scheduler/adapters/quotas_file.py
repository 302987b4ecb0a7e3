"""Tenant quotas from a YAML (or JSON) file: per tenant, a hard limit, or an elastic share.

tenants:
  search: {gpus: 16, gpu_memory_mb: 1310720, cpu_cores: 256, memory_mb: 2097152}
  research: {gpus: 8}                  # a hard limit: it never holds more
  acme:                                # elastic (docs/pools.md, "Tenant guarantees")
    guarantee: {gpus: 8, cpu_cores: 64, disk_gb: 2000}
    borrow: {gpus: 8}                  # up to 16 GPUs while others leave theirs idle
    reserved: {gpus: 2}                # of its guarantee, never lent to others' borrowing

A resource left out of a hard limit is unlimited. An elastic tenant's resources are those
its guarantee sets; `borrow` left out (or a resource of it) is unlimited, `borrow` and
`reserved` may name only resources the guarantee sets, and `reserved` at most the guarantee.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from crater.scheduler.adapters.yaml_spec import SpecError, parse_yaml_spec
from crater.scheduler.domain.quotas import QUOTA_FIELDS, Quota, Share, TenantQuotas


class _Amounts(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpus: int | None = Field(default=None, ge=0, description="Cards (a shared card: its share).")
    gpu_memory_mb: int | None = Field(default=None, ge=0, description="GPU memory, MiB.")
    cpu_cores: int | None = Field(default=None, ge=0, description="CPU cores.")
    memory_mb: int | None = Field(default=None, ge=0, description="Host memory, MiB.")
    disk_gb: int | None = Field(default=None, ge=0, description="Disk (ssd.capacity_gb), GB.")

    def quota(self) -> Quota:
        return Quota(**{r: getattr(self, r) for r in QUOTA_FIELDS})


class _QuotaSpec(_Amounts):
    guarantee: _Amounts | None = None
    borrow: _Amounts | None = None
    reserved: _Amounts | None = None

    @model_validator(mode="after")
    def _one_shape(self) -> _QuotaSpec:
        hard = [r for r in QUOTA_FIELDS if getattr(self, r) is not None]
        if self.guarantee is None:
            if self.borrow is not None or self.reserved is not None:
                raise ValueError("borrow and reserved need a guarantee")
            return self
        if hard:
            raise ValueError(
                f"a tenant has a hard limit ({', '.join(hard)}) or a guarantee, not both"
            )
        for part in ("borrow", "reserved"):
            amounts: _Amounts | None = getattr(self, part)
            for r in QUOTA_FIELDS:
                value = None if amounts is None else getattr(amounts, r)
                if value is None:
                    continue
                promised = getattr(self.guarantee, r)
                if promised is None:
                    raise ValueError(f"{part}.{r}: the guarantee sets no {r}")
                if part == "reserved" and value > promised:
                    raise ValueError(
                        f"reserved.{r}: {value} is more than the guarantee's {promised}"
                    )
        return self

    def share(self) -> Share | None:
        if self.guarantee is None:
            return None
        return Share(
            self.guarantee.quota(),
            (self.borrow or _Amounts()).quota(),
            (self.reserved or _Amounts()).quota(),
        )


class _QuotasFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenants: dict[str, _QuotaSpec]


class QuotasFileError(SpecError):
    """A quotas file that cannot be used, with the field and the reason."""


def parse_quotas(text: str, origin: str = "quotas file") -> TenantQuotas:
    spec = parse_yaml_spec(text, _QuotasFile, QuotasFileError, origin)
    limits: dict[str, Quota] = {}
    shares: dict[str, Share] = {}
    for tenant, q in spec.tenants.items():
        share = q.share()
        if share is None:
            limits[tenant] = q.quota()
        else:
            shares[tenant] = share
    return TenantQuotas(limits, shares)


def load_quotas(path: Path) -> TenantQuotas:
    return parse_quotas(path.read_text(), str(path))
