"""Nested queues (issue 27, item 5; docs/queues.md, "Nested queues"): an organisation, its
departments and their teams (tenants), each level with a limit on what the tenants under it
hold together, on top of the tenants' own quotas and elastic guarantees; a guarantee is always
honoured (a queue's limit caps borrowing and unguaranteed work). A task held by a queue says
which; the file is validated, reloaded and restored as the rest of the quotas file."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crater.contracts import (
    AllocationGranted,
    Event,
    NodeTopologyReported,
    TaskPending,
    TaskProfiled,
    TaskRejected,
    TaskRequest,
)
from crater.scheduler.adapters.quotas_file import QuotasFileError, parse_quotas
from crater.scheduler.audit_state import config_from_json, config_json
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.quotas import Queue, Quota, Usage
from tests.support.topologies import node
from tests.unit.scheduler.test_core import at
from tests.unit.scheduler.test_gpu_model_order import PREDICTION
from tests.unit.scheduler.test_preemption_thrashing import of, stopped

QUOTAS = """
tenants:
  vision: {guarantee: {gpus: 4}, borrow: {gpus: 8}}
  ads: {gpus: 8}
queues:
  acme:                                 # the organisation
    limit: {gpus: 12}
    tenants: [ads]
    queues:
      research:                         # a department
        limit: {gpus: 8}
        tenants: [vision, nlp]          # teams; nlp has no quota of its own
"""


def config_of(text: str) -> SchedulerConfig:
    tenants = parse_quotas(text)
    return SchedulerConfig(
        quotas=tenants.limits,
        tenant_shares=tenants.shares,
        user_limits=tenants.users,
        queues=tenants.queues,
        queue_of=tenants.queue_of,
    )


def cluster(text: str = QUOTAS, nodes: int = 3) -> Scheduler:
    scheduler = Scheduler(config=config_of(text))
    for i in range(nodes):
        scheduler.handle(NodeTopologyReported(occurred_at=at(0), node=node(f"n{i}", gpus=8)))
    return scheduler


def submit(task_id: str, when: float, tenant: str, gpus: int) -> TaskProfiled:
    request = TaskRequest.model_validate(
        {
            "task_id": task_id,
            "task_type": "training",
            "model_config": {"name": "m"},
            "tenant": tenant,
            "resource_requirements": {
                "gpu": {"count": gpus},
                "cpu": {"cores": 1},
                "memory": {"capacity_mb": 1000},
            },
        }
    )
    return TaskProfiled(occurred_at=at(when), task=request, prediction=PREDICTION)


def granted(decisions: list[Event]) -> list[str]:
    return [g.task_id for g in of(decisions, AllocationGranted)]


def pending(decisions: list[Event]) -> TaskPending:
    [waits] = of(decisions, TaskPending)
    return waits


# -- the file -----------------------------------------------------------------------------------


def test_the_file_gives_each_queue_its_limit_and_parent_and_each_team_its_queue() -> None:
    tenants = parse_quotas(QUOTAS)
    assert tenants.queues == {
        "acme": Queue(Quota(gpus=12), None),
        "research": Queue(Quota(gpus=8), "acme"),
    }
    assert tenants.queue_of == {"ads": "acme", "vision": "research", "nlp": "research"}
    assert "nlp" not in tenants.limits  # a team with no quota of its own: only its queues'


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        (
            "queues:\n  a: {tenants: [t]}\n  b: {tenants: [t]}\n",
            "queues.b.tenants.0",
            "tenant 't' is in queue 'a' already",
        ),
        (
            "queues:\n  a: {queues: {x: {}}}\n  b: {queues: {x: {}}}\n",
            "queues.b.queues.x",
            "queue 'x' is named twice",
        ),
        (
            "tenants:\n  t: {guarantee: {gpus: 6}}\n  u: {guarantee: {gpus: 4}}\n"
            "queues:\n  org:\n    queues:\n      dept: {limit: {gpus: 8}, tenants: [t, u]}\n",
            "queues.org.queues.dept.limit.gpus",
            "8 is less than the guarantees of the tenants under it (t 6 + u 4 = 10)",
        ),
        ("queues:\n  a: {limit: {gpus: -1}}\n", "queues.a.limit.gpus", "greater than or equal"),
        ("queues:\n  A!: {}\n", "queues.A!.[key]", "should match pattern"),
        ("queues:\n  a: {guarantee: {gpus: 1}}\n", "queues.a.guarantee", "Extra inputs"),
    ],
)
def test_a_bad_queue_tree_is_refused_naming_the_field(text: str, field: str, says: str) -> None:
    with pytest.raises(QuotasFileError) as raised:
        parse_quotas(text)
    assert any(f == field and says in reason for f, reason in raised.value.problems), (
        raised.value.problems
    )


def test_the_audit_record_of_the_configuration_keeps_the_queues() -> None:
    config = config_of(QUOTAS)
    again = config_from_json(config_json(config), config.token_secret)
    assert (again.queues, again.queue_of) == (config.queues, config.queue_of)


# -- each level's limit -------------------------------------------------------------------------


def test_a_departments_limit_holds_its_teams_together_and_says_so() -> None:
    scheduler = cluster()
    assert granted(scheduler.handle(submit("nlp-1", 1, "nlp", 6))) == ["nlp-1"]
    waits = pending(scheduler.handle(submit("nlp-2", 2, "nlp", 4)))
    [why] = waits.reasons
    assert (why.filter, why.code) == ("QueueLimit", "QueueLimitReached")
    assert why.message == (
        "queue research (in acme) of tenant nlp at its limit: its tenants hold 6 of 8 gpus, "
        "the task would take it to 10"
    )
    # ads is not in research: only acme's limit (12) counts for it
    assert granted(scheduler.handle(submit("ads-1", 3, "ads", 6))) == ["ads-1"]
    # nlp-1 ends: the department has room again
    assert granted(scheduler.handle(stopped("nlp-1", 4))) == ["nlp-2"]


def test_an_organisations_limit_holds_its_departments_and_teams_together() -> None:
    scheduler = cluster()
    scheduler.handle(submit("nlp-1", 1, "nlp", 8))
    waits = pending(scheduler.handle(submit("ads-1", 2, "ads", 6)))
    assert waits.reasons[0].message == (
        "queue acme of tenant ads at its limit: its tenants hold 8 of 12 gpus, the task would "
        "take it to 14"
    )
    assert granted(scheduler.handle(submit("ads-2", 3, "ads", 4))) == ["ads-2"]


def test_a_teams_guarantee_is_honoured_whatever_its_department_holds() -> None:
    """nlp (no quota) fills research; vision's task within its guarantee of 4 is still
    placed; its borrowing above the guarantee is held by the department's limit."""
    scheduler = cluster()
    scheduler.handle(submit("nlp-1", 1, "nlp", 8))
    assert granted(scheduler.handle(submit("v-1", 2, "vision", 4))) == ["v-1"]
    waits = pending(scheduler.handle(submit("v-2", 3, "vision", 1)))
    assert waits.reasons[0].code == "QueueLimitReached"
    assert "its tenants hold 12 of 8 gpus" in waits.reasons[0].message


def test_a_task_no_queue_above_it_could_ever_hold_is_refused_naming_the_field() -> None:
    [rejection] = of(cluster().handle(submit("big", 1, "nlp", 9)), TaskRejected)
    assert [e.field for e in rejection.errors] == ["resource_requirements.gpu.count"]
    assert rejection.errors[0].reason == (
        "queue 'research' above tenant 'nlp' may hold 8 gpus for all its tenants; the task alone: 9"
    )


def test_a_tenant_in_no_queue_is_held_by_none() -> None:
    scheduler = cluster()
    for i in range(3):  # 24 GPUs, past every queue's limit
        assert granted(scheduler.handle(submit(f"x{i}", 1 + i, "other", 8))) == [f"x{i}"]


# -- reload and restore ---------------------------------------------------------------------------


def test_a_reloaded_tree_counts_what_is_held_now_and_lets_a_waiting_task_go() -> None:
    scheduler = cluster()
    scheduler.handle(submit("nlp-1", 1, "nlp", 6))
    assert of(scheduler.handle(submit("nlp-2", 2, "nlp", 4)), TaskPending)
    assert (
        scheduler.reconfigure(
            config_of(QUOTAS.replace("{gpus: 8}\n        tenants", "{gpus: 10}\n        tenants"))
        )
        is None
    )
    assert scheduler.quotas.queue_used["research"].gpus == 6
    assert granted(scheduler.handle(stopped("nothing", 3))) == ["nlp-2"]


def test_a_restored_core_counts_each_queues_tenants_grants() -> None:
    live = cluster()
    live.handle(submit("nlp-1", 1, "nlp", 6))
    live.handle(submit("ads-1", 2, "ads", 2))
    held = [copy.copy(a) for a in live.allocations.values()]
    for allocation in held:
        allocation.peers = []
    restored = Scheduler(config=live.config)
    restored.restore(
        nodes=[(n.topology, n.condition, n.last_heartbeat_at) for n in live.cluster.nodes],
        allocations=held,
        pending=[],
        next_seq=10,
    )
    assert restored.quotas.queue_used["research"].gpus == 6
    assert restored.quotas.queue_used["acme"].gpus == 8
    assert pending(restored.handle(submit("nlp-2", 3, "nlp", 4))).reasons[0].code == (
        "QueueLimitReached"
    )


# -- as a property --------------------------------------------------------------------------------

STEPS = st.lists(
    st.tuples(
        st.sampled_from(["vision", "nlp", "ads", "other"]),
        st.integers(min_value=1, max_value=6),  # GPUs
        st.one_of(st.none(), st.none(), st.integers(min_value=0, max_value=30)),  # stop one
    ),
    min_size=1,
    max_size=30,
)
UNDER = {"research": ("vision", "nlp"), "acme": ("vision", "nlp", "ads")}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=STEPS)
def test_no_queue_holds_past_its_limit_beyond_its_tenants_guarantees(
    steps: list[tuple[str, int, int | None]],
) -> None:
    """Whatever arrives and ends: each queue's count is exactly what its tenants hold, and
    what they hold beyond their guarantees stays within the queue's limit."""
    scheduler = cluster(QUOTAS, nodes=4)
    quotas = scheduler.quotas
    submitted: list[str] = []
    for i, (tenant, gpus, stop) in enumerate(steps):
        if stop is not None and submitted:
            scheduler.handle(stopped(submitted[stop % len(submitted)], i + 0.5))
        scheduler.handle(submit(f"t{i}", i + 1, tenant, gpus))
        submitted.append(f"t{i}")
        for queue, tenants in UNDER.items():
            held = sum(quotas.used.get(t, Usage()).gpus for t in tenants)
            assert quotas.queue_used.get(queue, Usage()).gpus == pytest.approx(held)
            guaranteed = sum(
                min(quotas.used.get(t, Usage()).gpus, share.guarantee.gpus or 0)
                for t in tenants
                if (share := quotas.shares.get(t)) is not None
            )
            limit = quotas.queues[queue].limit.gpus
            assert limit is not None
            assert held - guaranteed <= limit + 1e-9
