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
    guarantee: _Amounts | None = Field(
        default=None,
        description="What the tenants under it may always hold together; unused, lent to "
        "its siblings first, then further up (reclaimed with the grace period).",
    )
    borrowing_limit: _Amounts | None = Field(
        default=None,
        description="How much above its guarantee its tenants may hold together while others "
        "leave theirs idle (a resource left out: unlimited); not on a root.",
    )
    lending_limit: _Amounts | None = Field(
        default=None,
        description="How much of its unused guarantee others may borrow at once (a resource "
        "left out: all of it); the rest is kept free for its own tenants.",
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
        queues[name] = Queue((spec.limit or _Amounts()).quota(), parent, _queue_share(spec))
        problems += _queue_problems(where, spec, parent)
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
    problems += _nested_guarantees(queues, queue_of, shares)
    if problems:
        raise QuotasFileError(origin, problems)
    return queues, queue_of


def _queue_share(spec: _QueueSpec) -> Share | None:
    """A queue's guarantee as an elastic tenant's: its borrowing limit, and the part of its
    guarantee it never lends (the guarantee less its lending limit)."""
    if spec.guarantee is None:
        return None
    guarantee = spec.guarantee.quota()
    lend = spec.lending_limit
    reserved = Quota(
        **{
            r: None
            if lend is None or getattr(lend, r) is None or getattr(guarantee, r) is None
            else max(0, getattr(guarantee, r) - getattr(lend, r))
            for r in QUOTA_FIELDS
        }
    )
    return Share(guarantee, (spec.borrowing_limit or _Amounts()).quota(), reserved)


def _queue_problems(where: str, spec: _QueueSpec, parent: str | None) -> list[tuple[str, str]]:
    """A queue's own fields that contradict each other: limits without a guarantee, a
    borrowing limit on a root, a resource the guarantee does not set, a lending limit above
    the guarantee, a limit below it."""
    problems: list[tuple[str, str]] = []
    if spec.guarantee is None:
        for part in ("borrowing_limit", "lending_limit"):
            if getattr(spec, part) is not None:
                problems.append(
                    (
                        f"{where}.{part}",
                        "needs a guarantee: a queue lends or borrows only "
                        "around a guarantee of its own",
                    )
                )
        return problems
    if spec.borrowing_limit is not None and parent is None:
        problems.append(
            (
                f"{where}.borrowing_limit",
                "a root queue has no parent to borrow within: its limit caps what its tenants hold",
            )
        )
    for part in ("borrowing_limit", "lending_limit"):
        amounts: _Amounts | None = getattr(spec, part)
        for r in QUOTA_FIELDS:
            value = None if amounts is None else getattr(amounts, r)
            if value is None:
                continue
            promised = getattr(spec.guarantee, r)
            if promised is None:
                problems.append((f"{where}.{part}.{r}", f"the guarantee sets no {r}"))
            elif part == "lending_limit" and value > promised:
                problems.append(
                    (f"{where}.{part}.{r}", f"{value} is more than the guarantee's {promised}")
                )
    for r in QUOTA_FIELDS:
        limit = None if spec.limit is None else getattr(spec.limit, r)
        promised = getattr(spec.guarantee, r)
        if limit is not None and promised is not None and limit < promised:
            problems.append(
                (f"{where}.limit.{r}", f"{limit} is less than the queue's own guarantee {promised}")
            )
    return problems


def _nested_guarantees(
    queues: dict[str, Queue], queue_of: dict[str, str], shares: dict[str, Share]
) -> list[tuple[str, str]]:
    """Each queue's guarantee (or, without one, its limit) against what the queues and
    elastic tenants directly under it are guaranteed (a queue without a guarantee passes on
    its own children's): a guarantee is a part of its parent's, never more than it."""
    problems: list[tuple[str, str]] = []

    def promised(queue: str, resource: str) -> tuple[int, list[str]]:
        """What is guaranteed under `queue` (directly or through queues without a guarantee
        of their own), and its parts for a reason."""
        total, parts = 0, []
        for child, node in sorted(queues.items()):
            if node.parent != queue:
                continue
            own = None if node.share is None else getattr(node.share.guarantee, resource)
            if own is None:
                below, _ = promised(child, resource)
                if below:
                    total += below
                    parts.append(f"queue {child} {below}")
            else:
                total += own
                parts.append(f"queue {child} {own}")
        for tenant, home in sorted(queue_of.items()):
            if home == queue and tenant in shares:
                amount = getattr(shares[tenant].guarantee, resource)
                if amount is not None:
                    total += amount
                    parts.append(f"tenant {tenant} {amount}")
        return total, parts

    for name, queue in queues.items():
        if not any(q.share is not None for q in queues.values()):
            break  # no queue guarantees: the tenants' guarantees are checked above
        for resource in QUOTA_FIELDS:
            total, parts = promised(name, resource)
            if not parts:
                continue
            own = None if queue.share is None else getattr(queue.share.guarantee, resource)
            if own is not None and total > own:
                problems.append(
                    (
                        f"{_path(queues, name)}.guarantee.{resource}",
                        f"{own} is less than the guarantees under it ({' + '.join(parts)} = "
                        f"{total}): a child's guarantee is part of its parent's",
                    )
                )
            limit = getattr(queue.limit, resource)
            by_queues = any(part.startswith("queue ") for part in parts)
            if own is None and by_queues and limit is not None and total > limit:
                problems.append(
                    (
                        f"{_path(queues, name)}.limit.{resource}",
                        f"{limit} is less than the guarantees under it ({' + '.join(parts)} = "
                        f"{total}): a guarantee is always honoured",
                    )
                )
    return problems


def _path(queues: dict[str, Queue], name: str) -> str:
    """Where the file sets queue `name`: queues.acme.queues.research."""
    return "queues." + ".queues.".join(reversed(ancestors(queues, name)))


def load_quotas(path: Path) -> TenantQuotas:
    return parse_quotas(path.read_text(), str(path))
