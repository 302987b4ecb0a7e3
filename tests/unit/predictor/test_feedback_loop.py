"""The demo's feedback loop, an hour of it in simulated time: `crater up`'s tasks, predicted by
the predictor's model and its learned corrections, reserved as the scheduler sizes them
(prediction + margin, or the request when larger), run on the simulated demo fleet, whose
cards show what each task really uses (`true_use_mb`), and those readings learned from by the
predictor's rule, as the service does it: whole cards, while running, on release.

Placement here is a plain first fit (pool, card model, taints, free whole cards, card memory,
anti-affinity); what matters is what is reserved and what is read back. Pure: no clock, no bus,
no database; an hour takes a few seconds.
"""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from crater.cli.demo import DEMO_ENV, SHORT_NAMES, WORKLOAD
from crater.contracts import NodeTopology, TaskRequest
from crater.predictor.domain.estimate import Assumptions, Correction, family, predict
from crater.predictor.domain.learning import (
    Held,
    Outcome,
    Rule,
    Sample,
    Track,
    judge,
    learn,
    observe,
    overlaps,
)
from crater.probe.sim.fleet import open_fleet
from crater.probe.sim.simulation import FleetSimulator, Load, plan_run, true_use_mb
from crater.scheduler.domain.demand import Demand

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
METRICS_EVERY = 5  # the probe's default metrics interval, seconds
TASK_SECONDS = (
    float(DEMO_ENV["CRATER_PROBE_TASK_SECONDS_MIN"]),
    float(DEMO_ENV["CRATER_PROBE_TASK_SECONDS_MAX"]),
)
Key = tuple[str, str]
Workload = list[tuple[int, str, dict[str, Any]]]


@dataclass
class Task:
    task_id: str
    kind: str  # model name and task type: one line of the workload
    request: TaskRequest
    key: Key
    raw_mb: int
    predicted_mb: int
    reserved_mb: int
    gpus: int
    models: list[str]
    true_mb: int | None


@dataclass
class Held_:
    task: Task
    allocation_id: str
    node: str
    gpu_ids: tuple[int, ...]
    granted_at: float
    running_at: float
    ends_at: float
    released_at: float | None = None
    samples: list[Sample] = field(default_factory=list)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class FeedbackLoop:
    def __init__(
        self,
        workload: Workload,
        seed: int = 7,
        rate: float = 1.0,
        fleet_seed: int | None = None,
        knows_use: bool = True,
    ) -> None:
        fleet = open_fleet(seed=fleet_seed)  # None: the demo fleet's own seed, 42
        self.knows_use = knows_use
        self.fleet_seed = fleet.seed
        self.simulator = FleetSimulator(fleet.nodes, fleet.seed)
        self.nodes: dict[str, NodeTopology] = {t.node_id: t for t in fleet.topologies}
        self.pools = {t.pool for t in self.nodes.values()}
        self.free = {n: {g.index for g in t.gpus} for n, t in self.nodes.items()}
        self.groups: dict[str, Counter[str]] = defaultdict(Counter)  # node -> anti-affinity
        self.workload = workload
        self.rng = random.Random(seed)  # as demo._submit_tasks draws it
        self.rate = rate
        self.rule = Rule()
        self.assumptions = Assumptions()
        self.tracks: dict[Key, Track] = {}
        self.queue: list[Task] = []
        self.running: dict[str, Held_] = {}
        self.history: dict[str, list[Held_]] = defaultdict(list)  # node -> allocations
        self.predicted: dict[str, list[tuple[float, int]]] = defaultdict(list)
        self.measured: dict[str, list[tuple[float, int]]] = defaultdict(list)
        self.reserved: dict[str, list[tuple[int, int]]] = defaultdict(list)  # (reserved, used)
        self.factors: list[float] = []
        self.outcomes: Counter[Outcome] = Counter()
        self.never_fits: dict[int, Counter[str]] = defaultdict(Counter)  # minute -> kind
        self.placed: dict[int, Counter[str]] = defaultdict(Counter)
        self.cards: dict[str, int] = {}  # kind -> largest card it may be placed on
        self.n = 0

    # --- AllData submits, the predictor profiles, the scheduler sizes the demand ---------

    def submit(self, now: float) -> None:
        self.n += 1
        _, role, template = self.rng.choices(self.workload, [w for w, _, _ in self.workload])[0]
        body = json.loads(json.dumps(template))
        body["task_id"] = f"{SHORT_NAMES[template['task_type']]}-{self.n:04d}"
        body["pool"] = role if role in self.pools else "default"
        body["tenant"] = self.rng.choice(["search", "ads", "research"])
        request = TaskRequest.model_validate(body)
        kind = f"{request.model_spec.name} {request.task_type.value}"
        key = (family(request), request.task_type.value)
        track = self.tracks.get(key, Track())
        correction = (
            Correction(self.rule.bounded(track.factor), track.samples, track.mape)
            if self.rule.applies(track)
            else None
        )
        prediction = predict(request, self.assumptions, correction)
        raw = prediction.gpu_memory_per_gpu_mb - prediction.breakdown_mb.get(
            "learned_correction", 0
        )
        demand = Demand.of(request, prediction)
        if not demand.gpus:
            return  # CPU only: nothing on a card to learn
        # the probe, told of the profile, knows what the task will really use
        true = (
            true_use_mb(self.fleet_seed, prediction.model_family, key[1], raw, request.task_id)
            if raw > 0 and prediction.parameters and prediction.model_family and self.knows_use
            else None
        )
        task = Task(
            request.task_id,
            kind,
            request,
            key,
            raw,
            prediction.gpu_memory_per_gpu_mb,
            demand.gpu_memory_mb,
            demand.gpus,
            demand.gpu_models,
            true,
        )
        self.predicted[kind].append((now, task.predicted_mb))
        candidates = [n for n in self.nodes.values() if self.eligible(task, n)]
        self.cards[kind] = max((n.gpus[0].memory_mb for n in self._pool_nodes(task)), default=0)
        if not any(n.gpus[0].memory_mb >= task.reserved_mb for n in candidates):
            self.never_fits[int(now // 60)][kind] += 1
            return
        self.queue.append(task)

    def _pool_nodes(self, task: Task) -> list[NodeTopology]:
        return [
            n
            for n in self.nodes.values()
            if n.pool == task.request.pool and n.gpus and not n.taints
        ]

    def eligible(self, task: Task, node: NodeTopology) -> bool:
        if node.pool != task.request.pool or node.taints or len(node.gpus) < task.gpus:
            return False
        return not task.models or any(m.upper() in node.gpus[0].model.upper() for m in task.models)

    # --- the scheduler places, the probe runs -----------------------------------------------

    def place(self, now: float) -> None:
        failed: set[tuple[str, int]] = set()
        waiting = []
        for task in self.queue:
            shape = (task.kind, task.reserved_mb)
            node = None if shape in failed else self._fit(task)
            if node is None:
                failed.add(shape)
                waiting.append(task)
                continue
            self._grant(task, node, now)
        self.queue = waiting

    def _fit(self, task: Task) -> str | None:
        group = task.request.anti_affinity.group
        for node in self.nodes.values():
            if (
                self.eligible(task, node)
                and len(self.free[node.node_id]) >= task.gpus
                and node.gpus[0].memory_mb >= task.reserved_mb
                and not (group and self.groups[node.node_id][group])
            ):
                return node.node_id
        return None

    def _grant(self, task: Task, node: str, now: float) -> None:
        gpu_ids = tuple(sorted(self.free[node])[: task.gpus])
        self.free[node] -= set(gpu_ids)
        group = task.request.anti_affinity.group
        if group:
            self.groups[node][group] += 1
        allocation_id = f"alloc-{task.task_id}"
        plan = plan_run(
            allocation_id,
            self.fleet_seed,
            seconds_min=TASK_SECONDS[0],
            seconds_max=TASK_SECONDS[1],
        )
        self.simulator.place(
            node,
            Load(
                allocation_id,
                gpu_ids,
                task.reserved_mb,
                task.request.resource_requirements.cpu.cores or 1,
                0,
                used_mb=task.true_mb,
            ),
        )
        running_at = now + plan.start_delay_seconds
        held = Held_(
            task, allocation_id, node, gpu_ids, now, running_at, running_at + plan.duration_seconds
        )
        self.running[allocation_id] = held
        self.history[node].append(held)
        self.placed[int(now // 60)][task.kind] += 1

    def release_ended(self, now: float) -> None:
        for allocation_id, held in list(self.running.items()):
            if held.ends_at > now:
                continue
            del self.running[allocation_id]
            held.released_at = now
            self.simulator.release(allocation_id)
            self.free[held.node] |= set(held.gpu_ids)
            group = held.task.request.anti_affinity.group
            if group:
                self.groups[held.node][group] -= 1
            self.learn(held, now)

    # --- the predictor: readings while it runs, learned on release -------------------------

    def read_metrics(self, now: float) -> None:
        self.simulator.advance_to(now)
        for report in self.simulator.step():
            cards = {g.index: g for g in report.gpus}
            for held in self.running.values():
                if held.node != report.node_id:
                    continue
                top = max((cards[i] for i in held.gpu_ids), key=lambda g: g.memory_used_mb)
                held.samples.append(Sample(at(now), top.memory_used_mb, top.memory_total_mb))

    def learn(self, held: Held_, now: float) -> None:
        task = held.task
        others = [
            Held(at(o.granted_at), at(o.released_at) if o.released_at is not None else None)
            for o in self.history[held.node]
            if o is not held
            and overlaps(o.gpu_ids, held.gpu_ids)
            and o.granted_at < now
            and (o.released_at is None or o.released_at > held.granted_at)
        ]
        observation = observe(held.samples, at(held.running_at), at(now), others, self.rule)
        outcome = judge(observation, task.raw_mb, self.rule)
        self.outcomes[outcome] += 1
        if outcome is not Outcome.LEARNED:
            return
        self.measured[task.kind].append((now, observation.peak_mb))
        self.reserved[task.kind].append((task.reserved_mb, observation.peak_mb))
        track = learn(
            self.tracks.get(task.key, Track()),
            task.raw_mb,
            task.predicted_mb,
            observation.peak_mb,
            self.rule,
        )
        self.tracks[task.key] = track
        self.factors.append(track.factor)

    # --- the clock -----------------------------------------------------------------------

    def run(self, seconds: int) -> FeedbackLoop:
        next_arrival = 0.0
        for now in range(seconds + 1):
            self.release_ended(now)
            arrived = False
            while next_arrival <= now:
                self.submit(now)
                next_arrival += self.rng.expovariate(self.rate)
                arrived = True
            if arrived or now % METRICS_EVERY == 0:
                self.place(now)
            if now % METRICS_EVERY == 0:
                self.read_metrics(now)
        return self


# The demo fleet's seed (42: every model needs less than modelled), and one (51) under which
# every model needs more, so corrections must rise as well as fall.
@pytest.fixture(scope="module", params=[42, 51], ids=["fleet-seed-42", "fleet-seed-51"])
def hour(request: pytest.FixtureRequest) -> FeedbackLoop:
    return FeedbackLoop(WORKLOAD, fleet_seed=request.param).run(3600)


def mean(values: list[int]) -> float:
    return sum(values) / len(values)


def test_an_hour_of_the_demo_learns_from_hundreds_of_measured_peaks(hour: FeedbackLoop) -> None:
    assert hour.outcomes[Outcome.LEARNED] >= 500
    learned = {kind for kind, peaks in hour.measured.items() if len(peaks) >= 20}
    assert learned >= {
        "meta-llama/Llama-2-7b-hf training",
        "mistralai/Mistral-7B-v0.1 fine-tuning",
        "meta-llama/Llama-3-8b-chat-hf inference",
        "resnet-50 inference",
    }


def test_predictions_converge_to_the_measured_use_and_stay_on_the_card(
    hour: FeedbackLoop,
) -> None:
    for kind, peaks in hour.measured.items():
        if len(peaks) < 20:
            continue
        measured = mean([mb for t, mb in peaks if t >= 3000])  # the last ten minutes
        late = [mb for t, mb in hour.predicted[kind] if t >= 3000]
        assert late, kind
        for predicted in late:
            assert abs(predicted - measured) / measured <= 0.10, (kind, predicted, measured)
        # never above the card, nor so close to it that the margin pushes it off
        card = hour.cards[kind]
        assert all(mb * 1.1 <= card for _, mb in hour.predicted[kind]), kind


def test_corrections_stay_bounded_and_never_run_away(hour: FeedbackLoop) -> None:
    assert all(hour.rule.minimum <= f <= hour.rule.maximum for f in hour.factors)
    for kind, series in hour.predicted.items():
        if kind not in hour.measured:
            continue
        first, top = series[0][1], max(mb for _, mb in series)
        true = max(mb for _, mb in hour.measured[kind])
        # the highest prediction of the hour is the first one or the measured peak, no more
        assert top <= max(first, true) * 1.05, (kind, first, top, true)


def test_the_demo_keeps_placing_its_workloads_for_the_whole_hour(hour: FeedbackLoop) -> None:
    early = set().union(*(hour.never_fits[m] for m in range(5)))
    late = set().union(*(hour.never_fits[m] for m in range(55, 61)))
    # only the 16-GPU task, which no node of the demo fleet can hold, never fits: at the
    # start and after an hour alike (the issue: after 4 minutes, the main workloads too)
    assert early == late == {"meta-llama/Llama-3-70b training"}
    placed_late = set().union(*(hour.placed[m] for m in range(50, 60)))
    assert placed_late >= {
        "meta-llama/Llama-2-7b-hf training",
        "mistralai/Mistral-7B-v0.1 fine-tuning",
        "meta-llama/Llama-3-8b-chat-hf inference",
        "resnet-50 inference",
    }


def test_a_reservation_larger_than_use_never_raises_the_prediction() -> None:
    def workload(memory_mb: int) -> Workload:
        return [
            (1, role, _with_gpu_memory(body, memory_mb))
            for _, role, body in WORKLOAD
            if body["model_config"]["name"] == "meta-llama/Llama-3-8b-chat-hf"
        ]

    small = FeedbackLoop(workload(1024)).run(900)  # reserved: the prediction + 10%
    large = FeedbackLoop(workload(24_000)).run(900)  # reserved: most of a 24 GiB card
    kind = "meta-llama/Llama-3-8b-chat-hf inference"
    assert len(large.measured[kind]) >= 20
    assert all(reserved >= used * 1.15 for reserved, used in large.reserved[kind])
    # what was reserved changes nothing that is learned, nor any prediction
    assert large.tracks == small.tracks
    assert large.predicted[kind] == small.predicted[kind]
    top = max(mb for _, mb in large.measured[kind])
    assert max(mb for _, mb in large.predicted[kind]) <= max(large.predicted[kind][0][1], top)


def _with_gpu_memory(body: dict[str, Any], memory_mb: int) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(body))
    copy["resource_requirements"]["gpu"]["memory_mb"] = memory_mb
    return copy


def test_a_fleet_showing_the_reservation_as_use_would_run_away() -> None:
    """The issue's loop, reproduced: when a card shows what was reserved (the simulated
    fleet before it knew true use), each reservation, prediction + 10%, is read back as
    use, and even the bounded rule climbs to its ceiling until the main workloads no
    longer fit: what the tests above rule out."""
    loop = FeedbackLoop(WORKLOAD, knows_use=False).run(1200)
    kind = "meta-llama/Llama-2-7b-hf training"
    first, last = loop.predicted[kind][0][1], loop.predicted[kind][-1][1]
    assert last > first * 1.2  # to the largest card, from a first prediction near 64 GiB
    late = set().union(*(loop.never_fits[m] for m in range(15, 20)))
    assert kind in late


def test_a_simulated_card_shows_the_task_s_true_use_whatever_was_reserved() -> None:
    fleet = open_fleet()
    readings = {}
    for reserved in (20_000, 80_000):
        simulator = FleetSimulator(fleet.nodes, fleet.seed)
        simulator.place("a100-01", Load("a-1", (0, 1), reserved, 8, 0, used_mb=30_000))
        steps = [simulator.step_node("a100-01") for _ in range(20)]
        readings[reserved] = [[g.memory_used_mb for g in s.gpus[:2]] for s in steps]
        assert all(0.85 * 30_000 <= mb <= 30_000 for step in readings[reserved] for mb in step)
    assert readings[20_000] == readings[80_000]
    # the same task under the same seed uses the same; another model family, another bias
    assert true_use_mb(42, "llama", "training", 50_000, "t-1") == true_use_mb(
        42, "llama", "training", 50_000, "t-1"
    )
    uses = {true_use_mb(42, f, "training", 50_000, "t-1") for f in ("llama", "qwen2", "gpt2")}
    assert len(uses) == 3
    assert all(0.85 * 0.97 * 50_000 <= u <= 1.1 * 1.03 * 50_000 for u in uses)


def test_the_runner_learns_true_use_from_the_profile_without_its_correction() -> None:
    from crater.contracts import TaskProfiled
    from crater.probe.sim.runner import TaskRunner

    async def publish(_: object) -> None:
        return None

    fleet = open_fleet()
    runner = TaskRunner(
        FleetSimulator(fleet.nodes, fleet.seed), publish, seed=42, seconds_min=1, seconds_max=2
    )
    body = json.loads(json.dumps(WORKLOAD[0][2])) | {"task_id": "t-1", "pool": "training"}
    request = TaskRequest.model_validate(body)
    plain = predict(request)
    corrected = predict(request, correction=Correction(1.5, 10, 0.1))
    assert corrected.gpu_memory_per_gpu_mb > plain.gpu_memory_per_gpu_mb
    assert runner.profiled(TaskProfiled(task=request, prediction=corrected))
    expected = true_use_mb(42, "llama", "training", plain.gpu_memory_per_gpu_mb, "t-1")
    assert runner.true_use("t-1") == expected  # the learned correction does not leak into use
    cpu = TaskRequest.model_validate(json.loads(json.dumps(WORKLOAD[5][2])) | {"task_id": "e"})
    assert not runner.profiled(TaskProfiled(task=cpu, prediction=predict(cpu)))


async def test_a_grant_ahead_of_its_profile_shows_the_true_use_once_the_profile_is_in() -> None:
    from crater.contracts import AllocationGranted, TaskProfiled
    from crater.probe.sim.runner import TaskRunner

    async def publish(_: object) -> None:
        return None

    fleet = open_fleet()
    simulator = FleetSimulator(fleet.nodes, fleet.seed)
    runner = TaskRunner(simulator, publish, seed=42, seconds_min=60, seconds_max=60)
    body = json.loads(json.dumps(WORKLOAD[0][2])) | {"task_id": "t-1", "pool": "training"}
    request = TaskRequest.model_validate(body)
    grant = AllocationGranted(
        allocation_id="a-1",
        task_id="t-1",
        node="a100-01",
        pool="training",
        tenant="t",
        gpu_ids=[0, 1],
        gpu_memory_mb=80_000,
        cpu_cores=[0, 1],
        numa_node=0,
        memory_mb=0,
        checkpoint_path=None,
        reservation_token="r",
        reservation_expires_at=T0 + timedelta(days=36500),
        score=1.0,
        explanation="test",
        environment={},
    )
    try:
        runner.granted(grant)  # the probe's grant consumer ran ahead of its profile consumer
        unknown = simulator.step_node("a100-01")
        assert all(g.memory_used_mb >= 0.85 * 80_000 for g in unknown.gpus[:2])
        assert runner.profiled(TaskProfiled(task=request, prediction=predict(request)))
        true = runner.true_use("t-1")
        assert true is not None
        assert true < 0.85 * 80_000
        known = simulator.step_node("a100-01")
        assert all(0.85 * true <= g.memory_used_mb <= true for g in known.gpus[:2])
        # a model the fleet cannot know keeps filling its reservation
        other = request.model_copy(update={"task_id": "t-2"})
        runner.granted(
            grant.model_copy(update={"allocation_id": "a-2", "task_id": "t-2", "gpu_ids": [2]})
        )
        guess = predict(other).model_copy(update={"parameters": None})
        assert not runner.profiled(TaskProfiled(task=other, prediction=guess))
        filled = simulator.step_node("a100-01").gpus[2].memory_used_mb
        assert 0.85 * 80_000 <= filled <= 80_000
    finally:
        await runner.close()
