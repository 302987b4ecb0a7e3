"""Tenant quotas from a YAML (or JSON) file: per tenant, a hard limit, or an elastic share.

tenants:
  search: {gpus: 16, gpu_memory_mb: 1310720, cpu_cores: 256, memory_mb: 2097152}
  research: {gpus: 8}                  # a hard limit: it never holds more
  acme:                                # elastic (docs/pools.md, "Tenant guarantees")
    guarantee: {gpus: 8, cpu_cores: 64, disk_gb: 2000}
    borrow: {gpus: 8}                  # up to 16 GPUs while others leave theirs idle
    reserved: {gpus: 2}                # of its guarantee, never lent to others' borrowing
    per_user: {running_gpus: 4, queued_tasks: 20, notebooks: 2}   # each user of acme
    users:
      alice: {running_gpus: 8}         # her own, the rest as per_user

A resource left out of a hard limit is unlimited. An elastic tenant's resources are those
its guarantee sets; `borrow` left out (or a resource of it) is unlimited, `borrow` and
`reserved` may name only resources the guarantee sets, and `reserved` at most the guarantee.

Per-user limits (docs/queues.md) count the tasks that name their `user`: `per_user` for each
user of the tenant, `users` a named user's own (a limit it leaves out is `per_user`'s); a
tenant may have them with no quota of its own.

Queues above tenants (docs/queues.md, "Nested queues"): an organisation, its departments,
each with a `limit` on what the tenants under it hold together, and the `tenants` (teams)
directly in it:

queues:
  acme:                                # an organisation
    limit: {gpus: 64}
    queues:
      research:                        # a department
        limit: {gpus: 32}
        tenants: [vision, nlp]         # teams: their own quotas under tenants

A queue's limit may not be less than the guarantees of the elastic tenants under it (a
guarantee is always honoured); a tenant is in one queue at most, a queue named once.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from crater.contracts.tasks import Name
from crater.scheduler.adapters.yaml_spec import SpecError, parse_yaml_spec
from crater.scheduler.domain.quotas import (
    QUOTA_FIELDS,
    Queue,
    Quota,
    Share,
    TenantQuotas,
    UserLimit,
    UserLimits,
    ancestors,
)


class _Amounts(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpus: int | None = Field(default=None, ge=0, description="Cards (a shared card: its share).")
    gpu_memory_mb: int | None = Field(default=None, ge=0, description="GPU memory, MiB.")
    cpu_cores: int | None = Field(default=None, ge=0, description="CPU cores.")
    memory_mb: int | None = Field(default=None, ge=0, description="Host memory, MiB.")
    disk_gb: int | None = Field(default=None, ge=0, description="Disk (ssd.capacity_gb), GB.")

    def quota(self) -> Quota:
        return Quota(**{r: getattr(self, r) for r in QUOTA_FIELDS})


class _UserSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    running_gpus: float | None = Field(
        default=None, ge=0, description="GPUs the user holds at once; over it a task waits."
    )
    queued_tasks: int | None = Field(
        default=None, ge=0, description="Tasks the user has waiting; one more is refused."
    )
    notebooks: int | None = Field(
        default=None,
        ge=0,
        description="Interactive tasks the user has, waiting or placed; one more is refused.",
    )

    def limit(self) -> UserLimit:
        return UserLimit(self.running_gpus, self.queued_tasks, self.notebooks)


class _QuotaSpec(_Amounts):
    guarantee: _Amounts | None = None
    borrow: _Amounts | None = None
    reserved: _Amounts | None = None
    per_user: _UserSpec | None = None
    users: dict[Name, _UserSpec] = Field(default_factory=dict)

    @property
    def users_only(self) -> bool:
        """Per-user limits and no quota of the tenant's own."""
        hard = any(getattr(self, r) is not None for r in QUOTA_FIELDS)
        return (self.per_user is not None or bool(self.users)) and not (
            hard or self.guarantee is not None
        )

    def user_limits(self) -> UserLimits | None:
        if self.per_user is None and not self.users:
            return None
        return UserLimits(
            (self.per_user or _UserSpec()).limit(),
            {user: spec.limit() for user, spec in self.users.items()},
        )

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


class _QueueSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    limit: _Amounts | None = Field(
        default=None, description="What the tenants under it hold together, at most."
    )
    queues: dict[Name, _QueueSpec] = Field(default_factory=dict)
    tenants: list[Name] = Field(default_factory=list, description="Tenants directly in it.")


class _QuotasFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    tenants: dict[str, _QuotaSpec] = Field(default_factory=dict)
    queues: dict[Name, _QueueSpec] = Field(default_factory=dict)


class QuotasFileError(SpecError):
    """A quotas file that cannot be used, with the field and the reason."""


def parse_quotas(text: str, origin: str = "quotas file") -> TenantQuotas:
    spec = parse_yaml_spec(text, _QuotasFile, QuotasFileError, origin)
    limits: dict[str, Quota] = {}
    shares: dict[str, Share] = {}
    users: dict[str, UserLimits] = {}
    for tenant, q in spec.tenants.items():
        if (per_user := q.user_limits()) is not None:
            users[tenant] = per_user
        share = q.share()
        if share is not None:
            shares[tenant] = share
        elif not q.users_only:
            limits[tenant] = q.quota()
    queues, queue_of = _queue_tree(spec.queues, shares, origin)
    return TenantQuotas(limits, shares, users, queues, queue_of)


def _queue_tree(
    roots: dict[str, _QueueSpec], shares: dict[str, Share], origin: str
) -> tuple[dict[str, Queue], dict[str, str]]:
    """The queues, each with its parent, and the queue of each tenant; QuotasFileError naming
    every queue named twice, tenant placed twice, or limit below its tenants' guarantees."""
    queues: dict[str, Queue] = {}
    queue_of: dict[str, str] = {}
    problems: list[tuple[str, str]] = []
    walk: list[tuple[str, str, _QueueSpec, str | None]] = [
        (f"queues.{name}", name, spec, None) for name, spec in roots.items()
    ]
    while walk:
        where, name, spec, parent = walk.pop(0)
        if name in queues:
            problems.append((where, f"queue {name!r} is named twice: each queue once"))
            continue
        queues[name] = Queue((spec.limit or _Amounts()).quota(), parent)
        for index, tenant in enumerate(spec.tenants):
            if tenant in queue_of:
                problems.append(
                    (
                        f"{where}.tenants.{index}",
                        f"tenant {tenant!r} is in queue {queue_of[tenant]!r} already: a tenant "
                        "is in one queue",
                    )
                )
            else:
                queue_of[tenant] = name
        walk += [(f"{where}.queues.{c}", c, s, name) for c, s in spec.queues.items()]
    for name, queue in queues.items():
        under = sorted(t for t, q in queue_of.items() if name in ancestors(queues, q))
        for resource in QUOTA_FIELDS:
            limit = getattr(queue.limit, resource)
            promised = {
                t: amount
                for t in under
                if t in shares and (amount := getattr(shares[t].guarantee, resource)) is not None
            }
            if limit is not None and sum(promised.values()) > limit:
                parts = " + ".join(f"{t} {amount}" for t, amount in promised.items())
                problems.append(
                    (
                        f"{_path(queues, name)}.limit.{resource}",
                        f"{limit} is less than the guarantees of the tenants under it ({parts} "
                        f"= {sum(promised.values())}): a guarantee is always honoured",
                    )
                )
    if problems:
        raise QuotasFileError(origin, problems)
    return queues, queue_of


def _path(queues: dict[str, Queue], name: str) -> str:
    """Where the file sets queue `name`: queues.acme.queues.research."""
    return "queues." + ".queues.".join(reversed(ancestors(queues, name)))


def load_quotas(path: Path) -> TenantQuotas:
    return parse_quotas(path.read_text(), str(path))
