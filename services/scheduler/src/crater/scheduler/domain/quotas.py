"""Tenant quotas: how much of the cluster a tenant may hold at once, across its tasks; and
the tenants held by their hard budget (`budget_exceeded`), whose new work waits.

A tenant's quota is either a hard limit (`Quota`: it never holds more) or elastic (`Share`:
a guarantee, a borrowing limit above it and a reserved part of it; docs/pools.md, "Tenant
guarantees"). An elastic tenant's hard limit is its guarantee plus its borrowing limit;
what it holds above its guarantee is reclaimable (`guarantees.Guarantees`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from crater.contracts import TenantBudgetExceeded
from crater.scheduler.domain.demand import Demand

# What stops a tenant taking more now: (resource, wanted, limit) for each limit passed; the
# resource "budget" (its cost, its hard budget) when its budget holds it; "claimed" when
# it would borrow past its guarantee while another tenant waits for its own guarantee, and
# "reserved" when that would take capacity reserved for another tenant (guarantees.py).
Over = tuple[str, float, float]
BUDGET = "budget"
CLAIMED = "claimed"
RESERVED = "reserved"
# The user's own limit of GPUs held at once (`UserLimit.running_gpus`), inside its tenant.
USER_GPUS = "user.running_gpus"
# A queue above the tenant (`Queue`) at its limit: "queue.<name>.<resource>".
QUEUE = "queue"


@dataclass(frozen=True)
class Usage:
    gpus: float = 0  # a shared card counts its share
    gpu_memory_mb: int = 0
    cpu_cores: int = 0
    memory_mb: int = 0
    disk_gb: int = 0  # asked (resource_requirements.ssd.capacity_gb), checked per node

    @classmethod
    def of(cls, demand: Demand) -> Usage:
        return cls(
            gpus=demand.gpus * demand.gpu_milli / 1000,
            gpu_memory_mb=demand.gpus * demand.gpu_memory_mb,
            cpu_cores=demand.cpu_cores,
            memory_mb=demand.memory_mb,
            disk_gb=demand.disk_gb,
        )

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.gpus + other.gpus,
            self.gpu_memory_mb + other.gpu_memory_mb,
            self.cpu_cores + other.cpu_cores,
            self.memory_mb + other.memory_mb,
            self.disk_gb + other.disk_gb,
        )

    def times(self, copies: int) -> Usage:
        return Usage(
            self.gpus * copies,
            self.gpu_memory_mb * copies,
            self.cpu_cores * copies,
            self.memory_mb * copies,
            self.disk_gb * copies,
        )

    def __bool__(self) -> bool:
        return any((self.gpus, self.gpu_memory_mb, self.cpu_cores, self.memory_mb, self.disk_gb))

    def brief(self) -> str:
        """In a reason: its GPUs, else its CPU cores ("4 GPUs")."""
        if self.gpus:
            return f"{self.gpus:g} GPU" + ("" if self.gpus == 1 else "s")
        if self.cpu_cores or not (self.memory_mb or self.disk_gb):
            return f"{self.cpu_cores} CPU cores"
        if self.memory_mb:
            return f"{self.memory_mb} MiB of memory"
        return f"{self.disk_gb} GB of disk"

    def __sub__(self, other: Usage) -> Usage:
        return Usage(
            self.gpus - other.gpus,
            self.gpu_memory_mb - other.gpu_memory_mb,
            self.cpu_cores - other.cpu_cores,
            self.memory_mb - other.memory_mb,
            self.disk_gb - other.disk_gb,
        )


# The request field each quota limits, named when a task is refused or waits on it.
QUOTA_FIELDS = {
    "gpus": "resource_requirements.gpu.count",
    "gpu_memory_mb": "resource_requirements.gpu.memory_mb",
    "cpu_cores": "resource_requirements.cpu.cores",
    "memory_mb": "resource_requirements.memory.capacity_mb",
    "disk_gb": "resource_requirements.ssd.capacity_gb",
}


@dataclass(frozen=True)
class Quota:
    """Limits for one tenant; None means unlimited."""

    gpus: int | None = None
    gpu_memory_mb: int | None = None
    cpu_cores: int | None = None
    memory_mb: int | None = None
    disk_gb: int | None = None

    def excess(self, usage: Usage) -> list[Over]:
        """(resource, wanted, limit) for every limit `usage` would pass."""
        over: list[Over] = []
        for resource in QUOTA_FIELDS:
            limit = getattr(self, resource)
            wanted = getattr(usage, resource)
            if limit is not None and wanted > limit:
                over.append((resource, wanted, limit))
        return over

    def plus(self, more: Quota) -> Quota:
        """Each resource this sets, raised by `more`'s (unlimited where `more` sets none)."""
        return Quota(
            **{
                r: None
                if (mine := getattr(self, r)) is None or (extra := getattr(more, r)) is None
                else mine + extra
                for r in QUOTA_FIELDS
            }
        )

    def unused(self, usage: Usage) -> Usage:
        """What of each resource this sets `usage` leaves (0 where it is reached or passed)."""
        return Usage(
            **{
                r: max(0, limit - getattr(usage, r))
                for r in QUOTA_FIELDS
                if (limit := getattr(self, r)) is not None
            }
        )


@dataclass(frozen=True)
class Share:
    """An elastic tenant's quota (Kueue's nominal quota and borrowing limit): it may always
    hold its `guarantee` (a task of its own within it takes back what others borrowed of it,
    by preemption with the grace period), and up to `borrow_limit` more while others leave
    theirs idle; what it holds above its guarantee is reclaimable. `reserved`, part of the
    guarantee, is never lent: others borrow only what leaves it free. Only the resources the
    guarantee sets count; a `borrow_limit` resource left out is unlimited."""

    guarantee: Quota
    borrow_limit: Quota = field(default_factory=Quota)
    reserved: Quota = field(default_factory=Quota)

    @property
    def cap(self) -> Quota:
        """The most it ever holds: its hard limit."""
        return self.guarantee.plus(self.borrow_limit)

    def above(self, usage: Usage) -> Usage:
        """What of `usage` is above the guarantee (its borrowed part), per resource it sets
        (shared cards' fractions summed and taken back leave float residue: not borrowing)."""
        return Usage(
            **{
                r: excess if (excess := getattr(usage, r) - limit) > 1e-9 else 0
                for r in QUOTA_FIELDS
                if (limit := getattr(self.guarantee, r)) is not None
            }
        )


@dataclass(frozen=True)
class UserLimit:
    """What one user of a tenant may have at once; None: no limit (Slurm's MaxTRESPerUser
    and MaxSubmitJobs, Run:ai's per-user interactive limits). `running_gpus`: GPUs held
    (placed, a shared card its share): over it the task waits. `queued_tasks`: tasks
    waiting: one more is refused. `notebooks`: interactive tasks waiting or placed: one more
    is refused."""

    running_gpus: float | None = None
    queued_tasks: int | None = None
    notebooks: int | None = None

    def over(self, other: UserLimit) -> UserLimit:
        """These limits, each one `other` sets replaced by its."""
        return UserLimit(
            self.running_gpus if other.running_gpus is None else other.running_gpus,
            self.queued_tasks if other.queued_tasks is None else other.queued_tasks,
            self.notebooks if other.notebooks is None else other.notebooks,
        )


@dataclass(frozen=True)
class UserLimits:
    """A tenant's per-user limits: `each` for every user, `named` users' own over it."""

    each: UserLimit = field(default_factory=UserLimit)
    named: dict[str, UserLimit] = field(default_factory=dict)

    def of(self, user: str) -> UserLimit:
        named = self.named.get(user)
        return self.each if named is None else self.each.over(named)

    def source(self, tenant: str, user: str, limit: str) -> str:
        """Where the quotas file sets `limit` for `user` (for a reason to name it)."""
        named = self.named.get(user)
        if named is not None and getattr(named, limit) is not None:
            return f"tenants.{tenant}.users.{user}.{limit}"
        return f"tenants.{tenant}.per_user.{limit}"


@dataclass(frozen=True)
class Queue:
    """A queue above tenants (an organisation, a department): what the tenants under it hold
    together stays within its `limit`, except what keeps an elastic tenant within its own
    guarantee (a guarantee is always honoured: the limit caps borrowing and the tenants
    without one). `parent`: the queue it is part of (None: a root, an organisation)."""

    limit: Quota = field(default_factory=Quota)
    parent: str | None = None


@dataclass(frozen=True)
class TenantQuotas:
    """A quotas file: the tenants with a hard limit, the elastic ones, per-user limits, and
    the queues above tenants with the queue each tenant is part of."""

    limits: dict[str, Quota] = field(default_factory=dict)
    shares: dict[str, Share] = field(default_factory=dict)
    users: dict[str, UserLimits] = field(default_factory=dict)
    queues: dict[str, Queue] = field(default_factory=dict)
    queue_of: dict[str, str] = field(default_factory=dict)


def ancestors(queues: dict[str, Queue], queue: str | None) -> list[str]:
    """`queue` and the queues above it, nearest first (the file's validation keeps the tree a
    tree: a cycle stops at the first queue seen twice)."""
    found: list[str] = []
    while queue is not None and queue in queues and queue not in found:
        found.append(queue)
        queue = queues[queue].parent
    return found


class BorrowCheck(Protocol):
    """`guarantees.Guarantees` (an object, not a function: the core is pickled whole)."""

    def refusal(self, tenant: str, pool: str, adding: Usage) -> list[Over]:
        """Why an elastic tenant may not borrow `adding` more now in `pool` ([]: it may)."""
        ...


@dataclass
class Quotas:
    # hard limits: a `Quota`'s, and each elastic tenant's cap (guarantee + borrowing)
    limits: dict[str, Quota] = field(default_factory=dict)
    used: dict[str, Usage] = field(default_factory=dict)
    shares: dict[str, Share] = field(default_factory=dict)
    borrow_check: BorrowCheck | None = field(default=None, repr=False, compare=False)
    # Tenants over their hard budget, each with what said so: until its period ends or the
    # budget is raised (`budget_restored`), their work not yet placed waits.
    holds: dict[str, TenantBudgetExceeded] = field(default_factory=dict)
    # Counts every change of `used` and of the configuration: what reads them may memoize.
    version: int = field(default=0, compare=False)
    # Per-user limits by tenant, and the GPUs each (tenant, user) holds now.
    users: dict[str, UserLimits] = field(default_factory=dict)
    user_gpus: dict[tuple[str, str], float] = field(default_factory=dict)
    # Queues above tenants: each tenant's queues, nearest first, and what each queue's
    # tenants hold together now.
    queues: dict[str, Queue] = field(default_factory=dict)
    tenant_queues: dict[str, tuple[str, ...]] = field(default_factory=dict)
    queue_used: dict[str, Usage] = field(default_factory=dict)

    def blocking(
        self, tenant: str, demand: Demand, copies: int = 1, user: str | None = None
    ) -> list[Over]:
        """What stops `tenant` (its `user`) taking `copies` of `demand` (a gang's members)
        now, given what it holds: its hard budget alone when that holds it, else its user's
        running-GPU limit, else its quota's limits."""
        hold = self.holds.get(tenant)
        if hold is not None:
            return [(BUDGET, float(hold.cost), float(hold.budget))]
        if over := self.user_over(tenant, user, demand, copies):
            return over
        adding = Usage.of(demand).times(copies)
        if tenant in self.tenant_queues and (over := self.over_queues(tenant, adding)):
            return over
        quota = self.limits.get(tenant)
        if quota is None:
            return []
        after = self.used.get(tenant, Usage()) + adding
        over = quota.excess(after)
        share = self.shares.get(tenant)
        if over or share is None or self.borrow_check is None or not share.above(after):
            return over
        return self.borrow_check.refusal(tenant, demand.pool, adding)

    def user_over(
        self, tenant: str, user: str | None, demand: Demand, copies: int = 1
    ) -> list[Over]:
        """[(USER_GPUS, wanted, limit)] when `copies` of `demand` would take `user` of
        `tenant` past its running-GPU limit; [] otherwise (or without a user)."""
        if user is None or (limits := self.users.get(tenant)) is None:
            return []
        cap = limits.of(user).running_gpus
        wanted = self.user_gpus.get((tenant, user), 0.0) + Usage.of(demand).gpus * copies
        if cap is not None and wanted > cap + 1e-9:  # shared cards' fractions: no residue
            return [(USER_GPUS, wanted, cap)]
        return []

    def over_queues(self, tenant: str, adding: Usage) -> list[Over]:
        """("queue.<name>.<resource>", wanted, limit) for the nearest queue above `tenant`
        that `adding` would take past its limit; [] when none, or when `adding` keeps an
        elastic tenant within its guarantee (honoured whatever its queues hold)."""
        share = self.shares.get(tenant)
        if share is not None and not share.above(self.used.get(tenant, Usage()) + adding):
            return []
        for queue in self.tenant_queues[tenant]:
            after = self.queue_used.get(queue, Usage()) + adding
            over = self.queues[queue].limit.excess(after)
            if over:
                return [(f"{QUEUE}.{queue}.{r}", wanted, limit) for r, wanted, limit in over]
        return []

    def configure(
        self,
        limits: dict[str, Quota],
        shares: dict[str, Share],
        users: dict[str, UserLimits] | None = None,
        queues: dict[str, Queue] | None = None,
        queue_of: dict[str, str] | None = None,
    ) -> None:
        """The hard limits, elastic shares, per-user limits and queues in force from now on.
        What each queue's tenants hold is counted again from what they hold now."""
        self.queues = dict(queues or {})
        self.tenant_queues = {
            tenant: tuple(ancestors(self.queues, queue))
            for tenant, queue in sorted((queue_of or {}).items())
        }
        self.queue_used = {}
        for tenant, used in self.used.items():
            for queue in self.tenant_queues.get(tenant, ()):
                self.queue_used[queue] = self.queue_used.get(queue, Usage()) + used
        self.users = dict(users or {})
        self.shares = dict(shares)
        self.limits = {**limits, **{tenant: s.cap for tenant, s in shares.items()}}
        self.version += 1

    def would_borrow(self, tenant: str, demand: Demand, copies: int = 1) -> bool:
        """Whether `copies` of `demand` would take an elastic tenant above its guarantee."""
        share = self.shares.get(tenant)
        if share is None:
            return False
        return bool(share.above(self.used.get(tenant, Usage()) + Usage.of(demand).times(copies)))

    def borrowing(self, tenant: str) -> Usage:
        """What `tenant` holds above its guarantee now (nothing without a share)."""
        share = self.shares.get(tenant)
        return Usage() if share is None else share.above(self.used.get(tenant, Usage()))

    def never(
        self, tenant: str, demand: Demand, copies: int = 1, user: str | None = None
    ) -> list[Over]:
        """What `copies` of `demand` alone exceed: it could never run for this tenant (or
        this user of it)."""
        quota = self.limits.get(tenant)
        over = [] if quota is None else quota.excess(Usage.of(demand).times(copies))
        for queue in self.tenant_queues.get(tenant, ()):
            over += [
                (f"{QUEUE}.{queue}.{r}", wanted, limit)
                for r, wanted, limit in self.queues[queue].limit.excess(
                    Usage.of(demand).times(copies)
                )
            ]
        if user is not None and (limits := self.users.get(tenant)) is not None:
            cap = limits.of(user).running_gpus
            wanted = Usage.of(demand).gpus * copies
            if cap is not None and wanted > cap + 1e-9:
                over.append((USER_GPUS, wanted, cap))
        return over

    def limited(self, tenant: str) -> bool:
        """A tenant whose holdings decide whether its waiting tasks may take more."""
        return tenant in self.limits or tenant in self.users or tenant in self.tenant_queues

    def related(self, tenant: str) -> set[str]:
        """`tenant` and the tenants sharing a queue with it: what one holds, the others may
        take or not."""
        mine = set(self.tenant_queues.get(tenant, ()))
        if not mine:
            return {tenant}
        return {tenant} | {t for t, qs in self.tenant_queues.items() if mine.intersection(qs)}

    def take_user(self, tenant: str, user: str | None, gpus: float) -> None:
        """`user` of `tenant` holds `gpus` more (fewer, negative)."""
        if user is None or not gpus:
            return
        key = (tenant, user)
        left = self.user_gpus.get(key, 0.0) + gpus
        if abs(left) < 1e-9:
            self.user_gpus.pop(key, None)  # no float residue of shared cards
        else:
            self.user_gpus[key] = left
        self.version += 1

    def take(self, tenant: str, usage: Usage) -> None:
        self.used[tenant] = self.used.get(tenant, Usage()) + usage
        for queue in self.tenant_queues.get(tenant, ()):
            self.queue_used[queue] = self.queue_used.get(queue, Usage()) + usage
        self.version += 1

    def give_back(self, tenant: str, usage: Usage) -> None:
        self.used[tenant] = self.used.get(tenant, Usage()) - usage
        for queue in self.tenant_queues.get(tenant, ()):
            self.queue_used[queue] = self.queue_used.get(queue, Usage()) - usage
        self.version += 1
