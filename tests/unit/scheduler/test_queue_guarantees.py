"""Guarantees and borrowing at the queue levels (issue 27, item 5; docs/queues.md, "Queue
guarantees and borrowing"): each queue of the tree may set a `guarantee`, a `borrowing_limit`
and a `lending_limit`; what a queue leaves unused is lent, to its siblings first, and taken
back by preemption with the grace period when a task within the queue's guarantee needs it,
through the tenants' machinery (`Guarantees`, `state.claimed_ahead`). Fair share between
queues: siblings by their decayed dominant share above their guarantees, from the top down.

Properties over random trees and workloads, through the core: no card held twice, every
tenant and queue within its guarantee plus its borrowing limit, and a queue under its
guarantee with a one-card task waiting gets a card within the grace plus a tick."""

from __future__ import annotations

import copy

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from crater.contracts import (
    RESERVATION_TIMEOUT_MS_MAX,
    AllocationGranted,
    AllocationReleased,
    Event,
    NodeCondition,
    NodeHealthReported,
    NodeTopologyReported,
    TaskPreempted,
    TaskRejected,
    TaskStatus,
    TaskStatusReported,
)
from crater.scheduler.adapters.quotas_file import QuotasFileError, parse_quotas
from crater.scheduler.audit_state import config_from_json, config_json
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.quotas import Quota, Share, Usage
from tests.support.topologies import node
from tests.unit.scheduler.test_lending import T0, at
from tests.unit.scheduler.test_lending_fair_share import Script, scripted, scripts
from tests.unit.scheduler.test_tenant_guarantees import cluster, grants, said, stopped, submit

GRACE = 10

DEPARTMENTS = """
tenants:
  vision: {guarantee: {gpus: 2}}
queues:
  acme:
    guarantee: {gpus: 16}
    queues:
      research:
        guarantee: {gpus: 8}
        borrowing_limit: {gpus: 4}
        tenants: [vision, nlp]
      ads:
        guarantee: {gpus: 8}
        tenants: [ranking]
"""


def config_of(text: str, **settings_: object) -> SchedulerConfig:
    tenants = parse_quotas(text)
    return SchedulerConfig(
        grace_period_seconds=GRACE,
        quotas=tenants.limits,
        tenant_shares=tenants.shares,
        user_limits=tenants.users,
        queues=tenants.queues,
        queue_of=tenants.queue_of,
        **settings_,  # type: ignore[arg-type]
    )


def preempted(decisions: list[Event]) -> list[TaskPreempted]:
    return [d for d in decisions if isinstance(d, TaskPreempted)]


# -- the file -----------------------------------------------------------------------------------


def test_the_file_gives_each_queue_its_guarantee_borrowing_and_lending_limits() -> None:
    tenants = parse_quotas(
        DEPARTMENTS.replace(
            "tenants: [ranking]", "lending_limit: {gpus: 6}\n        tenants: [ranking]"
        )
    )
    assert tenants.queues["acme"].share == Share(Quota(gpus=16))
    assert tenants.queues["research"].share == Share(Quota(gpus=8), Quota(gpus=4))
    # a lending limit of 6 of 8: 2 are never lent
    assert tenants.queues["ads"].share == Share(Quota(gpus=8), Quota(), Quota(gpus=2))


@pytest.mark.parametrize(
    ("text", "field", "says"),
    [
        (
            "queues:\n  org:\n    guarantee: {gpus: 8}\n    queues:\n"
            "      a: {guarantee: {gpus: 6}}\n      b: {guarantee: {gpus: 4}}\n",
            "queues.org.guarantee.gpus",
            "8 is less than the guarantees under it (queue a 6 + queue b 4 = 10)",
        ),
        (
            "tenants:\n  t: {guarantee: {gpus: 6}}\nqueues:\n"
            "  org:\n    guarantee: {gpus: 4}\n    tenants: [t]\n",
            "queues.org.guarantee.gpus",
            "(tenant t 6 = 6): a child's guarantee is part of its parent's",
        ),
        (
            "queues:\n  org: {guarantee: {gpus: 4}, borrowing_limit: {gpus: 2}}\n",
            "queues.org.borrowing_limit",
            "a root queue has no parent to borrow within",
        ),
        (
            "queues:\n  org:\n    queues:\n      a: {borrowing_limit: {gpus: 2}}\n",
            "queues.org.queues.a.borrowing_limit",
            "needs a guarantee",
        ),
        (
            "queues:\n  org: {guarantee: {gpus: 4}, lending_limit: {gpus: 5}}\n",
            "queues.org.lending_limit.gpus",
            "5 is more than the guarantee's 4",
        ),
        (
            "queues:\n  org: {guarantee: {gpus: 4}, lending_limit: {cpu_cores: 5}}\n",
            "queues.org.lending_limit.cpu_cores",
            "the guarantee sets no cpu_cores",
        ),
        (
            "queues:\n  org: {guarantee: {gpus: 4}, limit: {gpus: 3}}\n",
            "queues.org.limit.gpus",
            "3 is less than the queue's own guarantee 4",
        ),
        (
            "queues:\n  org:\n    limit: {gpus: 4}\n    queues:\n      a: {guarantee: {gpus: 5}}\n",
            "queues.org.limit.gpus",
            "4 is less than the guarantees under it (queue a 5 = 5)",
        ),
        (  # a cycle: a queue inside itself
            "queues:\n  org:\n    queues:\n      org: {guarantee: {gpus: 1}}\n",
            "queues.org.queues.org",
            "queue 'org' is named twice",
        ),
        (
            "queues:\n  org: {guarantee: {gpus: -1}}\n",
            "queues.org.guarantee.gpus",
            "greater than or equal",
        ),
    ],
)
def test_a_bad_queue_guarantee_is_refused_naming_the_field(
    text: str, field: str, says: str
) -> None:
    with pytest.raises(QuotasFileError) as raised:
        parse_quotas(text)
    assert any(f == field and says in reason for f, reason in raised.value.problems), (
        raised.value.problems
    )


def test_queue_guarantees_are_recorded_with_the_configuration() -> None:
    config = config_of(DEPARTMENTS)
    rebuilt = config_from_json(config_json(config), config.token_secret)
    assert rebuilt.queues == config.queues
    assert rebuilt.queues["research"].share == Share(Quota(gpus=8), Quota(gpus=4))


# -- lending and reclaim between queues ---------------------------------------------------------


def test_a_department_borrows_its_sibling_s_idle_guarantee_and_gives_it_back() -> None:
    scheduler = cluster(config_of(DEPARTMENTS), 8, 8)
    placed = grants(scheduler.handle(submit("r1", 0, "ranking", 8)))
    assert placed
    assert "borrow" not in placed[0].explanation
    placed = grants(scheduler.handle(submit("r2", 1, "ranking", 8, priority="high")))
    assert "borrowed 8 GPUs from queue research (in acme) (reclaimable)" in (placed[0].explanation)
    # nlp, within research's guarantee: ranking's borrowed task goes, its priority and all
    decisions = scheduler.handle(submit("n1", 2, "nlp", 4, priority="low"))
    [yielded] = preempted(decisions)
    assert (yielded.task_id, yielded.reclaimed_by_tenant, yielded.reclaimed_by_queue) == (
        "r2",
        "nlp",
        "research",
    )
    assert yielded.must_stop_by == at(2 + GRACE)
    assert "queue research takes back its guarantee" in yielded.cause()
    assert "reclaimed_by_queue" in yielded.model_dump(mode="json")
    # ads borrows no more while research waits for its guarantee, and says so
    decisions = scheduler.handle(submit("r3", 3, "ranking", 1))
    assert (
        "tenant ranking borrows no more while queue research (in acme) waits for its guarantee"
        in said(decisions)
    )
    scheduler.handle(stopped("r3", 4))
    placed = grants(scheduler.handle(stopped("r2", 5)))
    assert [g.task_id for g in placed] == ["n1"]
    assert scheduler.quotas.queue_used["research"].gpus == 4
    assert scheduler.quotas.queue_used["ads"].gpus == 8


def test_a_tenant_within_its_guarantee_takes_it_back_from_a_sibling_not_another_queue() -> None:
    scheduler = cluster(config_of(DEPARTMENTS), 8, 8)
    assert grants(scheduler.handle(submit("r1", 0, "ranking", 8)))  # ads's guarantee
    # nlp (no guarantee of its own) takes research's 8: all it holds is borrowed
    placed = grants(scheduler.handle(submit("n1", 1, "nlp", 8)))
    assert "borrowed 8 GPUs from queue research (in acme) (reclaimable)" in (placed[0].explanation)
    # vision, within its own 2, takes them back from nlp, not from ads (within its own)
    [yielded] = preempted(scheduler.handle(submit("v1", 2, "vision", 2)))
    assert (yielded.task_id, yielded.reclaimed_by_tenant, yielded.reclaimed_by_queue) == (
        "n1",
        "vision",
        None,
    )
    assert "tenant vision takes back its guarantee" in yielded.cause()
    placed = grants(scheduler.handle(stopped("n1", 5)))
    assert [g.task_id for g in placed] == ["v1"]


def test_a_queue_stops_at_its_borrowing_limit_and_says_why() -> None:
    scheduler = cluster(config_of(DEPARTMENTS), 8, 8)
    assert grants(scheduler.handle(submit("n1", 0, "nlp", 8)))
    assert grants(scheduler.handle(submit("n2", 1, "nlp", 4)))  # 4 borrowed of ads's
    decisions = scheduler.handle(submit("n3", 2, "nlp", 1))
    assert not grants(decisions)
    assert (
        "queue research (in acme) of tenant nlp at its borrowing limit: its tenants hold 12 of "
        "12 gpus (guarantee 8 + borrowing 4), the task would take it to 13" in said(decisions)
    )
    # a task no borrowing could ever hold is refused, naming the field
    [refused] = [
        d for d in scheduler.handle(submit("n4", 3, "nlp", 13)) if isinstance(d, TaskRejected)
    ]
    assert refused.errors[0].field == "resource_requirements.gpu.count"
    assert "its guarantee and borrowing limit" in refused.errors[0].reason


def test_a_lending_limit_keeps_part_of_the_guarantee_for_the_queue_s_own() -> None:
    text = DEPARTMENTS.replace(
        "borrowing_limit: {gpus: 4}", "borrowing_limit: {gpus: 4}\n        lending_limit: {gpus: 5}"
    )
    scheduler = cluster(config_of(text), 8, 8)
    assert grants(scheduler.handle(submit("r1", 0, "ranking", 8)))
    assert grants(scheduler.handle(submit("r2", 1, "ranking", 5)))  # research lends 5
    decisions = scheduler.handle(submit("r3", 2, "ranking", 1))
    assert not grants(decisions)
    assert "would borrow capacity reserved for other tenants: gpus 2 free after it, 3 reserved" in (
        said(decisions)
    )


def test_without_queue_guarantees_a_queue_holds_nothing_back() -> None:
    # the same tree with limits only: ranking is no borrower, nlp reclaims nothing
    text = (
        "queues:\n  acme:\n    queues:\n      research: {tenants: [nlp]}\n"
        "      ads: {tenants: [ranking]}\n"
    )
    scheduler = cluster(config_of(text), 8, 8)
    for i in range(2):
        placed = grants(scheduler.handle(submit(f"r{i}", i, "ranking", 8)))
        assert placed
        assert "borrow" not in placed[0].explanation
    assert not preempted(scheduler.handle(submit("n1", 1, "nlp", 4)))


def test_a_restored_core_knows_what_each_queue_borrows_and_takes_it_back() -> None:
    live = cluster(config_of(DEPARTMENTS), 8, 8)
    live.handle(submit("r1", 0, "ranking", 8))
    live.handle(submit("r2", 1, "ranking", 8))  # borrowed from research
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
    assert restored.quotas.queue_used["ads"].gpus == 16
    assert (
        restored.quotas.share_of("queue/ads").above(restored.quotas.used_by("queue/ads")).gpus == 8
    )
    [yielded] = preempted(restored.handle(submit("n1", 2, "nlp", 2)))
    assert (yielded.reclaimed_by_queue, yielded.preempted_by) == ("research", "n1")


def test_a_reload_that_raises_a_queues_guarantee_lets_it_take_back_what_is_lent() -> None:
    small = DEPARTMENTS.replace("gpus: 8}\n        borrowing", "gpus: 2}\n        borrowing")
    scheduler = cluster(config_of(small), 8, 8)
    scheduler.handle(submit("r1", 0, "ranking", 8))
    scheduler.handle(submit("r2", 1, "ranking", 8))
    # research guarantees 2: nlp's 4 would borrow, so it waits and preempts nobody
    decisions = scheduler.handle(submit("n1", 2, "nlp", 4))
    assert not preempted(decisions)
    assert not grants(decisions)
    assert scheduler.reconfigure(config_of(DEPARTMENTS)) is None  # research guarantees 8
    [yielded] = preempted(scheduler.handle(stopped("nothing", 3)))
    assert (yielded.task_id, yielded.reclaimed_by_queue) == ("r2", "research")


# -- fair share between queues ---------------------------------------------------------------

FAIR = """
queues:
  org:
    guarantee: {gpus: 8}
    queues:
      a: {guarantee: {gpus: 2}, borrowing_limit: {gpus: 6}, tenants: [ta]}
      b: {guarantee: {gpus: 2}, borrowing_limit: {gpus: 6}, tenants: [tb]}
"""


def fair_day(half_life: float | None) -> tuple[Scheduler, list[str]]:
    scheduler = cluster(config_of(FAIR, borrow_half_life_seconds=half_life), 8)
    placed: list[str] = []
    for message in (
        submit("a1", 0, "ta", 2),  # within a's guarantee
        submit("b1", 0, "tb", 2),  # within b's
        submit("a2", 1, "ta", 4),  # a borrows 4 until t=50
        submit("a3", 10, "ta", 4),  # first in the queue, would borrow again
        submit("b2", 11, "tb", 4),  # would borrow for the first time
        TaskStatusReported(occurred_at=at(50), task_id="a2", status=TaskStatus.SUCCEEDED),
    ):
        placed += [g.task_id for g in grants(scheduler.handle(message))]
    return scheduler, placed


def test_without_a_half_life_borrowing_queues_go_in_queue_order() -> None:
    _, placed = fair_day(None)
    assert placed == ["a1", "b1", "a2", "a3"]


def test_with_a_half_life_the_queue_that_borrowed_least_lately_goes_first() -> None:
    scheduler, placed = fair_day(300)
    assert placed == ["a1", "b1", "a2", "b2"]
    assert scheduler.guarantees.history["queue/a"] > 0
    assert scheduler.guarantees.history.get("queue/b", 0.0) == 0.0
    assert scheduler.guarantees.standing("tb") < scheduler.guarantees.standing("ta")


NESTED_FAIR = """
queues:
  org:
    guarantee: {gpus: 8}
    queues:
      a: {guarantee: {gpus: 2}, borrowing_limit: {gpus: 6}, tenants: [ta, tc]}
      b: {guarantee: {gpus: 2}, borrowing_limit: {gpus: 6}, tenants: [tb]}
"""


@pytest.mark.parametrize(("half_life", "first"), [(None, "ta1"), (300.0, "tb2")])
def test_siblings_are_compared_at_their_queue_before_their_teams(
    half_life: float | None, first: str
) -> None:
    """ta has borrowed nothing itself, but its department a has, through tc: b's team goes
    first (compared as tenants alone, ta would)."""
    scheduler = cluster(config_of(NESTED_FAIR, borrow_half_life_seconds=half_life), 8)
    placed: list[str] = []
    for message in (
        submit("tb1", 0, "tb", 2),  # b within its guarantee (tb, without one, borrows it)
        submit("tc1", 0, "tc", 2),  # a within its guarantee
        submit("tc2", 1, "tc", 4),  # a borrows 4 until t=50
        submit("ta1", 10, "ta", 4),  # first in the queue, would borrow for a
        submit("tb2", 11, "tb", 4),  # would borrow for b, which has not
        TaskStatusReported(occurred_at=at(50), task_id="tc2", status=TaskStatus.SUCCEEDED),
    ):
        placed += [g.task_id for g in grants(scheduler.handle(message))]
    assert placed == ["tb1", "tc1", "tc2", first]
    if half_life is not None:
        history = scheduler.guarantees.history
        assert history["queue/a"] > history.get("queue/b", 0.0)
        assert history.get("ta", 0.0) < history["tb"]  # as tenants alone, ta would go first


FAIR_TREE = """
tenants:
  ta: {guarantee: {gpus: 1}}
queues:
  org:
    guarantee: {gpus: 8}
    queues:
      a: {guarantee: {gpus: 4}, borrowing_limit: {gpus: 4}, tenants: [ta, tc]}
      b: {guarantee: {gpus: 2}, borrowing_limit: {gpus: 6}, tenants: [tb]}
"""


@settings(max_examples=40, deadline=None)
@given(scripts(("ta", "tb", "tc")), st.sampled_from((10.0, 100.0, 3600.0)))
def test_queue_fair_share_is_decided_the_same_way_every_time_within_every_limit(
    script: Script, half_life: float
) -> None:
    events = scripted(script, lambda name, t, tenant, gpus, _: submit(name, t, tenant, gpus))
    runs = []
    for _ in range(2):
        scheduler = cluster(config_of(FAIR_TREE, borrow_half_life_seconds=half_life), 8)
        decided = [d for e in events for d in scheduler.handle(e)]
        assert all(n.whole_gpus_free >= 0 for n in scheduler.cluster.nodes)
        quotas = scheduler.quotas
        honoured = min(quotas.used.get("ta", Usage()).gpus, 1)
        assert quotas.queue_used.get("a", Usage()).gpus <= 8 + honoured
        assert quotas.queue_used.get("b", Usage()).gpus <= 8
        runs.append((decided, dict(scheduler.guarantees.history)))
    assert runs[0] == runs[1]
    assert all(v >= 0 for v in runs[0][1].values())


# -- properties ------------------------------------------------------------------------------

# Two departments under one organisation, two teams each: the first team elastic, the
# second with no quota of its own (the department's guarantee is its only one).
TEAMS = (("a0", "a1"), ("b0", "b1"))
steps = st.lists(
    st.one_of(
        st.tuples(
            st.just("submit"),
            st.integers(1, 2),
            st.integers(0, 3),
            st.integers(0, 2),
            st.integers(1, 6),
        ),
        st.tuples(
            st.just("finish"), st.integers(0, 100), st.just(0), st.just(0), st.integers(1, 2)
        ),
        st.tuples(st.just("wait"), st.integers(1, 3 * GRACE), st.just(0), st.just(0), st.just(1)),
    ),
    min_size=1,
    max_size=30,
)


def tree(capacity: int, departments: list[int], teams: list[int], borrow: list[int | None]) -> str:
    """A quotas file: departments' guarantees scaled to fit the cluster, each elastic team's
    within its department's."""
    total = sum(departments) or 1
    scaled = [d * capacity // total if total > capacity else d for d in departments]
    lines = ["tenants:"]
    for (team, _), guarantee, own in zip(TEAMS, scaled, teams, strict=True):
        lines.append(f"  {team}: {{guarantee: {{gpus: {min(own, guarantee)}}}}}")
    lines += ["queues:", "  org:", f"    guarantee: {{gpus: {capacity}}}", "    queues:"]
    for name, (team, other), guarantee, limit in zip(
        ("a", "b"), TEAMS, scaled, borrow, strict=True
    ):
        lines.append(f"      {name}:")
        lines.append(f"        guarantee: {{gpus: {guarantee}}}")
        if limit is not None:
            lines.append(f"        borrowing_limit: {{gpus: {limit}}}")
        lines.append(f"        tenants: [{team}, {other}]")
    return "\n".join(lines) + "\n"


# Derandomized: CI checks the same cases every run; wider random searches are run by hand
# (docs/queues.md). The cases the searches found run as explicit examples: a team without a
# guarantee of its own waiting behind its elastic sibling's claim (a department owed two
# cards gets one a grace period); an owner inside a department taking a card back from its
# sibling while the department stays above its guarantee (the other department's owner
# was kept waiting for that claim, then a grace period more); a team's claims ripe first and
# held by its sibling's claim to its own guarantee, never tried again after the sibling went.
@settings(max_examples=120, deadline=None, derandomize=True)
@example(
    node_gpus=[2],
    departments=[0, 2],
    teams=[0, 1],
    borrow=[None, None],
    victims_report=False,
    filler=0,
    script=[("submit", 1, 3, 0, 2), ("submit", 1, 2, 0, 1)],
    half_life=None,
)
@example(
    node_gpus=[2],
    departments=[2, 0],
    teams=[1, 0],
    borrow=[None, None],
    victims_report=False,
    filler=2,
    script=[("submit", 1, 0, 0, 1), ("submit", 1, 1, 0, 1)],
    half_life=None,
)
@example(
    node_gpus=[2],
    departments=[1, 1],
    teams=[1, 0],
    borrow=[None, None],
    victims_report=False,
    filler=1,
    script=[("submit", 1, 0, 0, 1), ("submit", 1, 2, 0, 1)],
    half_life=None,
)
@example(
    node_gpus=[4, 4],
    departments=[4, 4],
    teams=[2, 0],
    borrow=[None, None],
    victims_report=False,
    filler=3,
    script=[("submit", 1, 0, 0, 4), ("wait", 5, 0, 0, 1), ("submit", 1, 1, 0, 2)],
    half_life=None,
)
@given(
    node_gpus=st.lists(st.sampled_from([2, 4, 8]), min_size=1, max_size=3),
    departments=st.lists(st.integers(0, 8), min_size=2, max_size=2),
    teams=st.lists(st.integers(0, 4), min_size=2, max_size=2),
    borrow=st.lists(st.one_of(st.none(), st.integers(0, 8)), min_size=2, max_size=2),
    victims_report=st.booleans(),
    filler=st.integers(0, 3),
    script=steps,
    half_life=st.sampled_from([None, 100.0]),  # fair share between queues, or queue order
)
def test_queues_get_their_guarantee_within_the_grace_and_nobody_passes_a_limit(
    node_gpus: list[int],
    departments: list[int],
    teams: list[int],
    borrow: list[int | None],
    victims_report: bool,
    filler: int,
    script: list[tuple[str, int, int, int, int]],
    half_life: float | None,
) -> None:
    capacity = sum(node_gpus)
    config = config_of(
        tree(capacity, departments, teams, borrow),
        reservation_timeout_ms=RESERVATION_TIMEOUT_MS_MAX,  # held until it ends or yields
        borrow_half_life_seconds=half_life,
    )
    scheduler = cluster(config, *node_gpus)
    scheduler.handle(
        NodeTopologyReported(occurred_at=T0, node=node("clock", cores=2, pool="clock"))
    )
    tenants = [t for pair in TEAMS for t in pair]
    queue_of = {t: q for q, pair in zip(("a", "b"), TEAMS, strict=True) for t in pair}
    granted: dict[str, AllocationGranted] = {}
    owed: dict[str, int] = {}  # holder (a queue or an elastic team) -> waiting since
    stop_at: dict[str, int] = {}
    clock = 0
    priorities = ["low", "medium", "high"]

    def held(who: str) -> int:
        return sum(
            len(g.gpu_ids)
            for g in granted.values()
            if g.tenant == who or queue_of.get(g.tenant) == who or who == "org"
        )

    def feed(message: Event) -> None:
        decisions = scheduler.handle(message)
        for d in decisions:
            if isinstance(d, AllocationReleased):
                granted.pop(d.allocation_id)
        for g in grants(decisions):
            granted[g.allocation_id] = g
            owed.pop(g.tenant, None)  # a card it is owed may go to any of its tasks
            owed.pop(queue_of[g.tenant], None)
        for d in decisions:
            if isinstance(d, TaskPreempted) and d.reclaimed_by_queue is not None:
                event("a queue took its guarantee back")
            if isinstance(d, TaskPreempted) and victims_report:
                stop_at.setdefault(d.task_id, clock + GRACE // 2)
        check(clock)

    def check(now: int) -> None:
        cards = [(g.node, gpu) for g in granted.values() for gpu in g.gpu_ids]
        assert len(cards) == len(set(cards)), "a GPU held twice"
        assert held("org") <= capacity
        quotas = scheduler.quotas
        for queue in ("a", "b"):
            used = quotas.queue_used.get(queue)
            assert held(queue) == (used.gpus if used else 0), "the queue ledger drifts"
            share = quotas.queues[queue].share
            assert share is not None
            cap = share.cap.gpus
            # A task within its own tenant's guarantee is never held by a queue (as by its
            # `limit`): what the queue's elastic teams hold within their guarantees is outside
            # its borrowing limit; everything else is inside it.
            honoured = sum(
                min(held(t), quotas.shares[t].guarantee.gpus or 0)
                for t in TEAMS[("a", "b").index(queue)]
                if t in quotas.shares
            )
            assert cap is None or held(queue) <= cap + honoured, (
                f"queue {queue} past its borrowing limit"
            )
        for tenant, share in quotas.shares.items():
            assert share.cap.gpus is None or held(tenant) <= share.cap.gpus
        # Owed: a queue under its guarantee (or an elastic team under its own) with a
        # one-card task of its own waiting that nothing of its own holds back.
        for who, guarantee, members in [
            *[
                (q, quotas.queues[q].share.guarantee.gpus, pair)  # type: ignore[union-attr]
                for q, pair in zip(("a", "b"), TEAMS, strict=True)
            ],
            *[(t, s.guarantee.gpus, (t,)) for t, s in quotas.shares.items()],
        ]:
            waits = any(
                t.request.tenant in members
                and t.demand.gpus == 1
                and t.not_before is None
                and not quotas.user_over(t.request.tenant, None, t.demand)
                for t in scheduler.pending.values()
            )
            if not (waits and held(who) < (guarantee or 0)):
                owed.pop(who, None)
                continue
            if who not in owed:
                owed[who] = now
                event("a holder under its guarantee waited")
            assert now - owed[who] <= GRACE + 1, f"{who} waited {now - owed[who]} s"

    def tick(seconds: int) -> None:
        nonlocal clock
        for _ in range(seconds):
            clock += 1
            for task_id in sorted(t for t, when in stop_at.items() if when <= clock):
                del stop_at[task_id]
                feed(stopped(task_id, clock))
            feed(
                NodeHealthReported(
                    occurred_at=at(clock), node_id="clock", condition=NodeCondition.READY, score=100
                )
            )
            if clock % 10 == 0:
                for n in scheduler.cluster.nodes:
                    feed(
                        NodeHealthReported(
                            occurred_at=at(clock),
                            node_id=n.name,
                            condition=NodeCondition.READY,
                            score=100,
                        )
                    )

    script = [("submit", 1, filler, 2, capacity), *script]
    for i, (kind, size, who, rank, copies) in enumerate(script):
        tick(1)
        if kind == "wait":
            tick(size)
        elif kind == "submit":
            tenant = tenants[who]
            for copy in range(copies):
                feed(submit(f"{tenant}-{i}-{copy}", clock, tenant, size, priority=priorities[rank]))
        else:
            for _ in range(copies):
                live = sorted({g.task_id for g in granted.values()})
                if live:
                    task_id = live[size % len(live)]
                    stop_at.pop(task_id, None)
                    feed(
                        TaskStatusReported(
                            occurred_at=at(clock), task_id=task_id, status=TaskStatus.SUCCEEDED
                        )
                    )
    for _ in range(10):
        tick(GRACE + 2)
    assert not owed, "a holder under its guarantee still waits for it"
