"""Properties of the core under random event sequences: nothing allocated twice, nothing
over capacity, and the arrays always agree with the nodes they mirror."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Confidence,
    NodeTopologyReported,
    ResourcePrediction,
    TaskProfiled,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.quotas import Quota
from tests.support.topologies import node

T0 = datetime(2026, 1, 1, tzinfo=UTC)
PREDICTION = ResourcePrediction(
    gpu_memory_per_gpu_mb=30000,
    host_memory_mb=1000,
    confidence=Confidence.LOW,
    method="test",
    dataloader_num_workers=1,
    dataloader_prefetch_factor=1,
)

task_shapes = st.tuples(
    st.sampled_from([0, 1, 1, 2, 4, 8, 9]),  # GPUs
    st.sampled_from([1000, 1000, 100, 250, 500, 700]),  # share of a card (with 1 GPU)
    st.sampled_from([0, 16000, 24000, 40000, 80000]),  # memory per card
    st.integers(0, 40),  # CPU cores
    st.integers(0, 600_000),  # memory MiB
    st.sampled_from(["strict", "best-effort"]),
    st.sampled_from(["high", "medium", "low", 0, 700, 1000]),
    st.booleans(),  # preemptible
    st.sampled_from([1, 1, 1, 2, 3]),  # gang size
    st.sampled_from([None, "same-node"]),  # a gang's members together or spread
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("submit"), task_shapes),
        st.tuples(st.just("finish"), st.integers(0, 200)),
        st.tuples(st.just("cancel"), st.integers(0, 200)),
        st.tuples(st.just("wait"), st.integers(1, 40)),
    ),
    min_size=1,
    max_size=60,
)


Shape = tuple[int, int, int, int, int, str, str | int, bool, int, str | None]


def profiled(i: int, clock: int, shape: Shape) -> TaskProfiled:
    gpus, milli, gpu_mb, cores, mem, numa, priority, preemptible, gang, together = shape
    request = TaskRequest.model_validate(
        {
            "task_id": f"t{i}",
            "task_type": "training",
            "model_config": {"name": "m"},
            "resource_requirements": {
                "gpu": {
                    "count": gpus,
                    "memory_mb": gpu_mb if gpus else 0,
                    "milli": milli if gpus == 1 else 1000,
                },
                "cpu": {"cores": cores},
                "memory": {"capacity_mb": mem},
            },
            "affinity": {"numa": numa, "gpu": together},
            "priority": priority,
            "preemptible": preemptible,
            "gang_size": gang,
            "tenant": ("search", "research")[i % 2],
        }
    )
    return TaskProfiled(
        occurred_at=T0 + timedelta(seconds=clock), task=request, prediction=PREDICTION
    )


@settings(max_examples=150, deadline=None)
@given(steps)
def test_no_resource_is_ever_held_twice_beyond_capacity_or_beyond_quota(
    script: list[tuple[str, object]],
) -> None:
    quotas = {"search": Quota(gpus=6, cpu_cores=48, memory_mb=700_000)}
    scheduler = Scheduler(config=SchedulerConfig(quotas=quotas))
    for topology in (
        node("a100-01", gpus=8),
        node("v100-01", gpus=2, gpu_memory_mb=16384, cores=16, memory_mb=128_000),
        node("cpu-01", cores=64, numa_nodes=2),
    ):
        scheduler.handle(NodeTopologyReported(occurred_at=T0, node=topology))
    granted: dict[str, AllocationGranted] = {}  # by allocation: a gang has one per member
    submitted: list[str] = []
    clock = 0
    for i, (kind, arg) in enumerate(script, start=1):
        clock += 1
        if kind == "wait":
            clock += int(arg)  # type: ignore[call-overload]
            continue
        if kind == "submit":
            decisions = scheduler.handle(profiled(i, clock, arg))  # type: ignore[arg-type]
            submitted.append(f"t{i}")
        elif kind == "cancel":
            if not submitted:
                continue
            decisions = scheduler.handle(
                TaskStatusReported(
                    occurred_at=T0 + timedelta(seconds=clock),
                    task_id=submitted[int(arg) % len(submitted)],  # type: ignore[call-overload]
                    status=TaskStatus.CANCELLED,
                )
            )
        else:
            live = sorted({g.task_id for g in granted.values()})
            if not live:
                continue
            task_id = live[int(arg) % len(live)]  # type: ignore[call-overload]
            decisions = scheduler.handle(
                TaskStatusReported(
                    occurred_at=T0 + timedelta(seconds=clock),
                    task_id=task_id,
                    status=TaskStatus.SUCCEEDED,
                )
            )
        for d in decisions:
            if isinstance(d, AllocationReleased):
                granted.pop(d.allocation_id)  # finished, cancelled, expired unconfirmed
        granted.update({d.allocation_id: d for d in decisions if isinstance(d, AllocationGranted)})

        members: dict[str, list[AllocationGranted]] = {}
        for g in granted.values():
            members.setdefault(g.task_id, []).append(g)
        for task_members in members.values():  # a gang holds all its members or none
            assert sorted(g.gang_index for g in task_members) == list(
                range(task_members[0].gang_size)
            ), "a gang partly placed"
        assert not set(members) & set(scheduler.pending), "a waiting task holds resources"

        held: dict[tuple[str, int], int] = {}
        for g in granted.values():
            for gpu in g.gpu_ids:
                held[(g.node, gpu)] = held.get((g.node, gpu), 0) + g.gpu_milli
        held_cores = [(g.node, core) for g in granted.values() for core in g.cpu_cores]
        assert all(share <= 1000 for share in held.values()), "a GPU allocated past whole"
        assert len(held_cores) == len(set(held_cores)), "a CPU core allocated twice"
        search = [g for g in granted.values() if g.tenant == "search"]
        assert sum(len(g.gpu_ids) * g.gpu_milli for g in search) <= 6000, "GPU quota exceeded"
        assert sum(len(g.cpu_cores) for g in search) <= 48, "CPU quota exceeded"
        assert sum(g.memory_mb for g in search) <= 700_000, "memory quota exceeded"
        cluster = scheduler.cluster
        for row, n in enumerate(cluster.nodes):
            memory = sum(g.memory_mb for g in granted.values() if g.node == n.name)
            assert memory <= n.topology.memory_mb, "memory over capacity"
            assert n.memory_free_mb == n.topology.memory_mb - memory
            assert cluster.gpus_free[row] == n.whole_gpus_free
            assert all(0 <= m <= 1000 for m in n.gpu_milli_free), "a card over-committed"
            assert cluster.cpu_free[row] == len(n.cpu_free)
            cards = cluster.card_milli[row]  # the matrix fragmentation reads
            assert cards[: len(n.gpu_milli_free)].tolist() == n.gpu_milli_free
            assert not cards[len(n.gpu_milli_free) :].any()
            for g in (g for g in granted.values() if g.node == n.name):
                assert all(n.gpu_milli_free[i] <= 1000 - g.gpu_milli for i in g.gpu_ids)
