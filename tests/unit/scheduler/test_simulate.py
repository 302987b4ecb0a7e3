"""The openb trace simulator: the protocol's accounting on a trace small enough to check by
hand, determinism under a seed, and `|` alternatives in the GPU model filter."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from crater.contracts import AllocationGranted, TaskRejected, TaskStatus, TaskStatusReported
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.plugins import TaskShape, policy_pipeline, typical_shapes
from crater.scheduler.domain.plugins.baselines import _fragment, fgd_score
from crater.scheduler.sim.openb import (
    CPU_UNIT_MILLI,
    SIM_TIME,
    OpenbNode,
    OpenbPod,
    load_nodes,
    load_pods,
    node_event,
    task_event,
)
from crater.scheduler.sim.protocol import arrivals, replay, simulate
from tests.unit.scheduler.test_fragmentation import cluster, demand

NODES = [
    OpenbNode("node-a", 16000, 65536, 2, "T4"),
    OpenbNode("node-b", 16000, 65536, 1, "V100M16"),
]


def pod(name: str, cpu: int, gpus: int, milli: int, spec: str = "") -> OpenbPod:
    return OpenbPod(name, cpu, 1024, gpus, milli if gpus else 0, spec)


# Worked by hand with the paper's BestFit score
# waste = 0.5 * (cpu_left - cpu) / 128000 + 0.5 * (gpu_left - gpu) / 8000, least wins.
QUEUE = [
    pod("p1", 2000, 1, 500),  # a: 0.0547+0.0938, b: 0.0547+0.0313 -> b [500]
    pod("p2", 2000, 1, 600),  # b has 500 < 600 -> a, card 0 -> a [400, 1000]
    pod("p3", 1000, 1, 400),  # a: 0.0508+0.0625, b: 0.0508+0.0063 -> b [100]
    pod("p4", 1000, 2, 1000),  # a has one whole card, b none -> fails
    pod("p5", 1000, 1, 100, "V100|A100"),  # only b's model; b [0]
    pod("p6", 4000, 0, 0),  # CPU only: a 0.0391+0.0875, b 0.0313+0 -> b
    pod("p7", 1000, 1, 1000, "T4"),  # a card 1 -> a [400, 0]
]


def placements(policy: str, queue: list[OpenbPod]) -> dict[str, str | None]:
    pipeline = policy_pipeline(policy, cpu_milli_per_unit=CPU_UNIT_MILLI)
    scheduler = Scheduler(SchedulerConfig(pipeline=pipeline))
    for node in NODES:
        scheduler.handle(node_event(node))
    out: dict[str, str | None] = {}
    for k, p in enumerate(queue):
        granted = [
            d
            for d in scheduler.handle(task_event(p, f"{p.name}.{k}"))
            if isinstance(d, AllocationGranted)
        ]
        out[p.name] = granted[0].node if granted else None
        if not granted:  # as the simulator does: a pod that fails now does not wait for room
            withdrawn = TaskStatusReported(
                occurred_at=SIM_TIME, task_id=f"{p.name}.{k}", status=TaskStatus.CANCELLED
            )
            scheduler.handle(withdrawn)
    return out


def test_bestfit_places_as_worked_by_hand() -> None:
    assert placements("bestfit", QUEUE) == {
        "p1": "node-b",
        "p2": "node-a",
        "p3": "node-b",
        "p4": None,
        "p5": "node-b",
        "p6": "node-b",
        "p7": "node-a",
    }


def test_whole_cores_place_the_same_here() -> None:
    """Every request above is whole cores: CPUs of a whole core change nothing."""
    assert replay(NODES, QUEUE, "bestfit", cpu_unit_milli=1000).allocated_gpu == (
        replay(NODES, QUEUE, "bestfit").allocated_gpu
    )


def test_fractional_cpu_is_held_to_a_tenth_of_a_core() -> None:
    """Two half-core pods share a 1.1-core node in tenths; whole cores round each up to 1."""
    tiny = [OpenbNode("node-c", 1100, 4096, 1, "T4")]
    pods = [pod("c1", 500, 1, 100), pod("c2", 500, 1, 100)]
    assert replay(tiny, pods, "bestfit").failed[-1] == 0
    assert replay(tiny, pods, "bestfit", cpu_unit_milli=1000).failed[-1] == 1


def test_protocol_accounting_counts_failed_pods_as_arrived() -> None:
    result = replay(NODES, QUEUE, "bestfit")
    assert result.gpu_capacity_milli == 3000
    assert result.arrived_gpu == [500, 1100, 1500, 3500, 3600, 3600, 4600]
    assert result.allocated_gpu == [500, 1100, 1500, 1500, 1600, 1600, 2600]
    assert result.failed == [0, 0, 0, 1, 1, 1, 1]
    assert result.failed_names == ["p4.3"]
    assert result.allocated_cpu[-1] == 2000 + 2000 + 1000 + 1000 + 4000 + 1000
    curve = result.curve()
    # x = round(arrived / 3000 * 100): 17, 37, 50, 117, 120 (twice: averaged), 153
    assert sorted(curve) == [17, 37, 50, 117, 120, 153]
    assert curve[120][0] == pytest.approx(1600 / 3000 * 100)
    assert curve[153][0] == pytest.approx(2600 / 3000 * 100)


def test_a_failed_pod_does_not_wait_for_room() -> None:
    """Only p4 fails; nothing stays pending to be placed later (pods never leave anyway)."""
    result = replay(NODES, [*QUEUE, pod("p8", 1000, 1, 100)], "bestfit")
    assert result.failed[-1] == 1


def test_gpu_model_alternatives() -> None:
    scheduler = Scheduler()
    for node in NODES:
        scheduler.handle(node_event(node))
    cases = {"A100|V100": "node-b", "T4|H100": "node-a", "v100m16": "node-b"}
    for k, (spec, where) in enumerate(cases.items()):
        [granted] = scheduler.handle(task_event(pod("q", 1000, 1, 100, spec), f"q.{k}"))
        assert isinstance(granted, AllocationGranted)
        assert granted.node == where
    [rejected] = scheduler.handle(task_event(pod("q", 1000, 1, 100, "A100|H100"), "q.9"))
    assert isinstance(rejected, TaskRejected)


def test_arrivals_shuffle_then_draw_up_to_130_percent() -> None:
    pods = [pod(f"p{i}", 1000, 1, 100 * (i % 10 + 1)) for i in range(12)]  # 5800 in all
    queue = arrivals(pods, 10_000, seed=42)
    # every pod once, shuffled, then draws with replacement
    assert sorted(p.name for p in queue[:12]) == sorted(p.name for p in pods)
    assert [p.name for p in queue[:12]] != [p.name for p in pods]
    total = sum(p.gpu_request for p in queue)
    assert 13_000 - 1000 < total <= 13_000  # stopped before the first that would pass 130%
    assert arrivals(pods, 10_000, seed=42) == queue
    assert arrivals(pods, 10_000, seed=43) != queue
    # a trace bigger than 130% is cut at the first pod that would pass it
    assert sum(p.gpu_request for p in arrivals(pods, 3000, seed=42)) <= 3900


@pytest.mark.parametrize("policy", ["random", "bestfit", "fgd", "crater"])
def test_same_seed_same_run(policy: str) -> None:
    pods = [*QUEUE, pod("p9", 3000, 1, 250), pod("p10", 2000, 1, 750)]
    first = simulate(NODES, pods, policy, seed=7)
    again = simulate(NODES, pods, policy, seed=7)
    assert first.allocated_gpu == again.allocated_gpu
    assert first.failed_names == again.failed_names


def test_fragment_of_a_node_against_one_shape() -> None:
    cards = np.array([[1000, 300], [1000, 0]])
    cpu = np.array([8, 8])
    ok = np.array([True, True])
    # a 500-milli task fits a card on both: only the cards with less than 500 free strand
    share = TaskShape(1, 500, 1, 1.0)
    assert _fragment(cards, cpu, ok, share).tolist() == [300, 0]
    # two whole cards fit nowhere: every free card is a fragment
    assert _fragment(cards, cpu, ok, TaskShape(2, 1000, 1, 1.0)).tolist() == [1300, 1000]
    # no CPU: nothing fits
    assert _fragment(cards, np.array([0, 0]), ok, share).tolist() == [1300, 1000]


def test_typical_shapes_are_the_papers_95_percent() -> None:
    requests = [(1, 1000, 4, None)] * 80 + [(1, 1000, 8, None)] * 10 + [(1, 500, 2, None)] * 6
    shapes = typical_shapes([*requests, *[(0, 0, 16, None)] * 4])
    # distinct requests, CPU included, most frequent first, until 95% of them are covered
    # (80 + 10 + 6 = 96 of 100); a request without GPUs counts as one of them
    assert [(s.gpus, s.gpu_milli, s.cpu_cores) for s in shapes] == [
        (1, 1000, 4),
        (1, 1000, 8),
        (1, 500, 2),
    ]
    assert shapes[0].popularity == pytest.approx(80 / 96)
    # equal counts: the larger request first, as the paper's simulator sorts them
    tied = typical_shapes([(1, 500, 2, None), (0, 0, 16, None)], coverage=0.5)
    assert [(s.gpus, s.cpu_cores) for s in tied] == [(0, 16)]


def test_the_fgd_score_is_the_papers_integer_score_and_picks_the_share_card() -> None:
    # two nodes of two cards; the workload: half-card shares and whole cards
    workload = (TaskShape(1, 500, 1, 0.5), TaskShape(1, 1000, 1, 0.5))
    c = cluster(OpenbNode("a", 8000, 65536, 2, "T4"), OpenbNode("b", 8000, 65536, 2, "T4"))
    c.nodes[0].take((1,), 400, (), 0, None)
    c.refresh("a")
    score = fgd_score(1.0, workload)
    share = demand(gpus=1, milli=500)
    points = score.rate(c, share, np.arange(2))
    # F = 0.5 x (free on cards under 500) + 0.5 x (free on cards under 1000), all the free
    # where a shape fits nowhere. a [1000, 600]: F = 300; the share on its 600 card leaves
    # [1000, 100]: F = 100, a gain of 200 (on its whole card: [500, 600], F = 550, -250).
    # b [1000, 1000]: F = 0; after [500, 1000]: F = 250, -250.
    assert points.tolist() == [
        math.floor(100 / (1 + math.exp(-200 / 1000))) / 100,
        math.floor(100 / (1 + math.exp(250 / 1000))) / 100,
    ]
    assert score.card is not None
    assert score.card(c, share, 0) == 1
    assert score.card(c, demand(gpus=1), 0) is None


def test_loads_the_openb_csv_format(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes.csv"
    nodes.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\nn-1,32000,131072,2,P100\nn-2,8000,4096,0,\n"
    )
    pods = tmp_path / "pods.csv"
    pods.write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
        "deletion_time,scheduled_time\np-1,2500,1024,1,460,,LS,Running,0,10,0\n"
        "p-2,1000,512,0,0,,BE,Running,0,10,0\n"
    )
    [n1, n2] = load_nodes(nodes)
    assert (n1.gpus, n1.model, n2.gpus, n2.model) == (2, "P100", 0, "")
    [p1, p2] = load_pods(pods)
    assert (p1.gpu_request, p1.cpu_cores, p2.gpu_request) == (460, 3, 0)


def test_a_share_lands_on_the_card_fgd_chose_not_the_fullest() -> None:
    # the workload is 300-milli shares: a 200 share on the 450 card would strand 250 there
    # (best fit's choice), on the whole card nothing; FGD takes the whole card
    pipeline = policy_pipeline("fgd", workload=(TaskShape(1, 300, 1, 1.0),))
    scheduler = Scheduler(SchedulerConfig(pipeline=pipeline))
    scheduler.handle(node_event(OpenbNode("n", 8000, 65536, 2, "T4")))
    first = scheduler.handle(task_event(OpenbPod("p1", 1000, 1024, 1, 550, ""), "t1"))
    second = scheduler.handle(task_event(OpenbPod("p2", 1000, 1024, 1, 200, ""), "t2"))
    [granted1] = [d for d in first if isinstance(d, AllocationGranted)]
    [granted2] = [d for d in second if isinstance(d, AllocationGranted)]
    assert granted1.gpu_ids == [0]
    assert granted2.gpu_ids == [1]
