"""Tenant quotas: how much of the cluster a tenant may hold at once, across its tasks; and
the tenants held by their hard budget (`budget_exceeded`), whose new work waits."""

from __future__ import annotations

from dataclasses import dataclass, field

from crater.contracts import TenantBudgetExceeded
from crater.scheduler.domain.demand import Demand

# What stops a tenant taking more now: (resource, wanted, limit) for each limit passed; the
# resource "budget" (its cost, its hard budget) when its budget holds it.
Over = tuple[str, float, float]
BUDGET = "budget"


@dataclass(frozen=True)
class Usage:
    gpus: float = 0  # a shared card counts its share
    gpu_memory_mb: int = 0
    cpu_cores: int = 0
    memory_mb: int = 0

    @classmethod
    def of(cls, demand: Demand) -> Usage:
        return cls(
            gpus=demand.gpus * demand.gpu_milli / 1000,
            gpu_memory_mb=demand.gpus * demand.gpu_memory_mb,
            cpu_cores=demand.cpu_cores,
            memory_mb=demand.memory_mb,
        )

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.gpus + other.gpus,
            self.gpu_memory_mb + other.gpu_memory_mb,
            self.cpu_cores + other.cpu_cores,
            self.memory_mb + other.memory_mb,
        )

    def times(self, copies: int) -> Usage:
        return Usage(
            self.gpus * copies,
            self.gpu_memory_mb * copies,
            self.cpu_cores * copies,
            self.memory_mb * copies,
        )

    def __bool__(self) -> bool:
        return any((self.gpus, self.gpu_memory_mb, self.cpu_cores, self.memory_mb))

    def brief(self) -> str:
        """In a reason: its GPUs, else its CPU cores ("4 GPUs")."""
        if self.gpus:
            return f"{self.gpus:g} GPU" + ("" if self.gpus == 1 else "s")
        return f"{self.cpu_cores} CPU cores"

    def __sub__(self, other: Usage) -> Usage:
        return Usage(
            self.gpus - other.gpus,
            self.gpu_memory_mb - other.gpu_memory_mb,
            self.cpu_cores - other.cpu_cores,
            self.memory_mb - other.memory_mb,
        )


# The request field each quota limits, named when a task is refused or waits on it.
QUOTA_FIELDS = {
    "gpus": "resource_requirements.gpu.count",
    "gpu_memory_mb": "resource_requirements.gpu.memory_mb",
    "cpu_cores": "resource_requirements.cpu.cores",
    "memory_mb": "resource_requirements.memory.capacity_mb",
}


@dataclass(frozen=True)
class Quota:
    """Limits for one tenant; None means unlimited."""

    gpus: int | None = None
    gpu_memory_mb: int | None = None
    cpu_cores: int | None = None
    memory_mb: int | None = None

    def excess(self, usage: Usage) -> list[Over]:
        """(resource, wanted, limit) for every limit `usage` would pass."""
        over: list[Over] = []
        for resource in QUOTA_FIELDS:
            limit = getattr(self, resource)
            wanted = getattr(usage, resource)
            if limit is not None and wanted > limit:
                over.append((resource, wanted, limit))
        return over


@dataclass
class Quotas:
    limits: dict[str, Quota] = field(default_factory=dict)
    used: dict[str, Usage] = field(default_factory=dict)
    # Tenants over their hard budget, each with what said so: until its period ends or the
    # budget is raised (`budget_restored`), their work not yet placed waits.
    holds: dict[str, TenantBudgetExceeded] = field(default_factory=dict)

    def blocking(self, tenant: str, demand: Demand, copies: int = 1) -> list[Over]:
        """What stops `tenant` taking `copies` of `demand` (a gang's members) now, given
        what it holds: its hard budget alone when that holds it, else its quota's limits."""
        hold = self.holds.get(tenant)
        if hold is not None:
            return [(BUDGET, float(hold.cost), float(hold.budget))]
        quota = self.limits.get(tenant)
        if quota is None:
            return []
        return quota.excess(self.used.get(tenant, Usage()) + Usage.of(demand).times(copies))

    def never(self, tenant: str, demand: Demand, copies: int = 1) -> list[Over]:
        """What `copies` of `demand` alone exceed: it could never run for this tenant."""
        quota = self.limits.get(tenant)
        return [] if quota is None else quota.excess(Usage.of(demand).times(copies))

    def take(self, tenant: str, usage: Usage) -> None:
        self.used[tenant] = self.used.get(tenant, Usage()) + usage

    def give_back(self, tenant: str, usage: Usage) -> None:
        self.used[tenant] = self.used.get(tenant, Usage()) - usage
