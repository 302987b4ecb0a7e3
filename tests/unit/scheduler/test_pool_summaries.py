"""The pools read model (`crater.v1.query.pools`, the console's pools page): each pool's
capacity and allocation, fragmentation, the tenants' holdings and quotas."""

from __future__ import annotations

from crater.contracts import AllocationGranted, NodeTopologyReported, TaskPending
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.quotas import Quota, Share
from crater.scheduler.domain.views import pool_summaries
from tests.support.topologies import node
from tests.unit.scheduler.test_core import at, profiled


def scheduler_with_work() -> Scheduler:
    scheduler = Scheduler(SchedulerConfig(quotas={"search": Quota(gpus=6, cpu_cores=64)}))
    for topology in (
        node("a100-01", gpus=8, pool="training"),
        node("a100-02", gpus=8, pool="training"),
        node("t4-01", gpus=4, gpu_memory_mb=15360, pool="inference"),
    ):
        scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=topology))
    grants = [
        *scheduler.handle(profiled("big", gpus=4, cores=8, pool="training", tenant="search")),
        *scheduler.handle(profiled("small", gpus=1, cores=4, pool="training", tenant="ads")),
        *scheduler.handle(
            profiled("serve", gpus=1, gpu_mb=8000, cores=2, pool="inference", tenant="ads")
        ),
    ]
    assert all(isinstance(g, AllocationGranted) for g in grants)
    # over the quota of 6 GPUs: waits
    [waits] = scheduler.handle(profiled("more", gpus=4, pool="training", tenant="search"))
    assert isinstance(waits, TaskPending)
    return scheduler


def test_each_pool_adds_up_its_nodes_and_the_allocations_on_them() -> None:
    answer = pool_summaries(scheduler_with_work())
    pools = {p.pool: p for p in answer.pools}
    assert list(pools) == ["inference", "training"]
    training = pools["training"]
    assert (training.nodes, training.nodes_ready) == (2, 2)
    assert (training.gpus.total, training.gpus.allocated) == (16, 5)
    assert training.gpus_free_whole == 11
    assert training.gpu_memory_mb.total == 16 * 81920
    assert training.gpu_memory_mb.allocated == 5 * 40000  # what the tasks asked per card
    assert (training.cpu_cores.total, training.cpu_cores.allocated) == (64, 12)
    assert training.memory_mb.allocated == 2 * 16000
    assert training.disk_gb.total == 2 * 3800
    assert (training.tasks_placed, training.tasks_waiting) == (2, 1)
    inference = pools["inference"]
    assert (inference.gpus.total, inference.gpus.allocated) == (4, 1)
    assert inference.gpu_memory_mb.allocated == 8000


def test_tenants_holdings_by_share_and_quotas_with_their_limits() -> None:
    answer = pool_summaries(scheduler_with_work())
    training = next(p for p in answer.pools if p.pool == "training")
    assert [(h.tenant, h.gpus) for h in training.tenants] == [("search", 4), ("ads", 1)]
    assert training.tenants[0].share == 4 / 16
    quotas = {q.tenant: {r.resource: (r.used, r.limit) for r in q.resources} for q in answer.quotas}
    assert quotas["search"]["gpus"] == (4, 6)
    assert quotas["search"]["cpu_cores"] == (8, 64)
    assert quotas["search"]["memory_mb"] == (16000, None)
    assert quotas["ads"]["gpus"] == (2, None)  # no quota: holdings only


def test_an_elastic_tenant_shows_its_guarantee_cap_reserved_and_what_it_borrows() -> None:
    share = Share(Quota(gpus=2, disk_gb=100), Quota(gpus=4), Quota(gpus=1))
    scheduler = Scheduler(SchedulerConfig(tenant_shares={"acme": share}))
    scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node("a100-01", gpus=8)))
    [granted] = scheduler.handle(profiled("wide", gpus=5, tenant="acme"))
    assert isinstance(granted, AllocationGranted)
    [acme] = pool_summaries(scheduler).quotas
    uses = {r.resource: r for r in acme.resources}
    gpus = uses["gpus"]
    assert (gpus.used, gpus.guarantee, gpus.limit, gpus.reserved) == (5, 2, 6, 1)
    assert gpus.borrowed == 3  # above its guarantee: what owners may take back
    disk = uses["disk_gb"]
    assert (disk.guarantee, disk.limit, disk.borrowed) == (100, None, 0)  # no borrow limit set
    assert uses["cpu_cores"].guarantee is None  # the guarantee does not set it


def test_a_tenant_sees_its_own_holdings_and_quota_and_one_pool_can_be_asked_for() -> None:
    answer = pool_summaries(scheduler_with_work(), pool="training", tenant="ads")
    [training] = answer.pools
    assert [h.tenant for h in training.tenants] == ["ads"]
    assert [q.tenant for q in answer.quotas] == ["ads"]


def test_fragmentation_counts_free_cards_the_shapes_seen_cannot_use() -> None:
    scheduler = Scheduler()
    scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node("a100-01", gpus=8)))
    assert pool_summaries(scheduler).pools[0].fragmentation is None  # nothing seen yet
    # 7-GPU tasks only: once one runs, the one card left is of no use to the next
    [granted] = scheduler.handle(profiled("seven", gpus=7, cores=4))
    assert isinstance(granted, AllocationGranted)
    [pool] = pool_summaries(scheduler).pools
    assert pool.fragmented_gpus == 1.0
    assert pool.fragmentation == 1.0
    # a 1-GPU task takes that card: nothing free, nothing stranded
    scheduler.handle(profiled("one", gpus=1, cores=4))
    [pool] = pool_summaries(scheduler).pools
    assert (pool.fragmented_gpus, pool.fragmentation) == (0.0, None)
