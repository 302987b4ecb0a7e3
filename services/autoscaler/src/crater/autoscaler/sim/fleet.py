"""A simulated inference fleet replaying a request trace, scaled by Crater's own policy (the
`Autoscaler` the service runs, fed the events the service would get) or by a baseline a user
would configure instead (`Baseline`: an HPA on slot utilisation, an HPA/KEDA on KV-cache
utilisation, a Knative-KPA-like concurrency autoscaler), so they can be compared on the same
trace.

The model, per replica: `slots` concurrent sequences (continuous batching) and a KV cache of
`kv_capacity_tokens`; a request is admitted when a slot is free and its tokens fit. Its time
to first token (TTFT, the latency the replicas report and the SLO counts) is its queueing
plus its prefill (`prefill_base_ms + input_tokens * prefill_ms_per_token`, slower as the
batch fills); it then holds its slot and KV tokens while it decodes `output_tokens` at
`tpot_ms` per token (slower as the batch fills). GPU memory pressure is the weights' share
plus the KV tokens in use. A cold replica serves `startup_s` after it is asked for (placement,
image, model load); a warm-pool standby serves `promote_s` after its promotion. A draining
replica takes no new requests and is released when its last one finishes. Requests wait in
one FIFO queue at the router until a serving replica has room (a slot free and the tokens
fit its KV cache), and go to the least busy such replica; so a replica that becomes ready
takes queued requests at once.

Faithful to what the service would know: a replica reports samples only when it started
requests since its last report (an idle replica is silent), and reports no fleet count; the
autoscaler knows the fleet by name (the initial fleet, `initial_replicas`, adopted at the
start; the replicas it asked for; those heard of), and a silent replica stays in it until its
allocation is released. Each decision is recorded with what it asked and what the fleet then
did (`ScaleEvent`): the replicas before and after, added and drained; `RunResult.disagreements`
counts the decisions the fleet did not carry out as asked, and `peak_replicas` the most
replicas (serving or starting) ever held, to hold against `max_replicas`.

Deterministic: the same trace and configuration give the same result, bit for bit.
"""

from __future__ import annotations

import heapq
import itertools
import math
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal, Protocol, cast
from uuid import NAMESPACE_URL, UUID, uuid5

from crater.autoscaler.domain import Autoscaler, ScalingPolicy
from crater.autoscaler.domain.window import nearest_rank
from crater.autoscaler.sim.trace import Request
from crater.contracts import (
    Event,
    LatencySamplesReported,
    ReplicaDrained,
    ReplicaReleaseRequested,
    ReplicasRequested,
    ScaleDecided,
    ScaleDirection,
)

SERVICE = "chat"
# A change of direction (a scale-in after a scale-out, or the reverse) this soon is a reversal:
# flapping, counted in every report.
REVERSAL_S = 120.0
T0 = datetime(2026, 1, 1, tzinfo=UTC)
DROPPED = math.inf  # the latency of a request cut off by a release


@dataclass(frozen=True)
class FleetModel:
    slots: int = 16
    kv_capacity_tokens: int = 8_000
    weights_pressure: float = 0.15
    prefill_base_ms: float = 15.0
    prefill_ms_per_token: float = 0.05
    tpot_ms: float = 12.0
    batch_slowdown: float = 0.8
    startup_s: float = 90.0
    promote_s: float = 2.0
    place_s: float = 1.0


@dataclass(frozen=True)
class Observation:
    """What a baseline autoscaler sees at one of its syncs, as its metrics pipeline would
    report it: the replicas serving or starting (`current`) and those ready, the slot
    utilisation since the last sync (busy sequences / slots, like GPU utilisation), the KV
    cache in use now (like vLLM's `gpu_cache_usage_perc`), both averaged over the ready
    replicas, and the requests in flight on them plus those queued for a replica
    (`concurrency`, what Knative's queue-proxy and activator count)."""

    now: float
    current: int
    ready: int
    slot_utilisation: float = 0.0
    kv_utilisation: float = 0.0
    concurrency: float = 0.0


@dataclass(frozen=True)
class Decision:
    desired: int
    reason: str = ""
    panic: bool = False


class Controller(Protocol):
    """A baseline's state between syncs: it sees an `Observation`, decides the replicas."""

    def decide(self, seen: Observation) -> Decision: ...


class Baseline(Protocol):
    """A baseline autoscaler as a user configures it: a name, the period it syncs at, the
    target on its metric (the knob a sweep turns), and a fresh controller per run."""

    @property
    def name(self) -> str: ...

    @property
    def sync_s(self) -> float: ...

    @property
    def target(self) -> float: ...

    def controller(self, initial: int, min_replicas: int, max_replicas: int) -> Controller: ...


HpaMetric = Literal["slots", "kv"]


@dataclass(frozen=True)
class HpaBaseline:
    """The Kubernetes HPA algorithm on one per-replica utilisation metric: every `sync_s`
    (15 s, `--horizontal-pod-autoscaler-sync-period`) desired = ceil(ready * metric /
    target), unless the ratio is within `tolerance` of 1 (0.1,
    `--horizontal-pod-autoscaler-tolerance`); scale-up by at most max(4 pods, 100%) per
    sync (the default `behavior.scaleUp`: policies Pods 4 and Percent 100 per 15 s,
    selectPolicy Max, no stabilisation); scale-down to the highest recommendation of the
    last 300 s (the default `behavior.scaleDown.stabilizationWindowSeconds`, 100% per 15 s).
    Defaults as kubernetes.io documents them ("Horizontal Pod Autoscaling", "Default
    Behavior": periodSeconds 15 for both scale-up policies); the autoscaling/v2 API
    reference's field comment says "per 60 seconds" for the same two policies, which is the
    slower reading and not what is modelled here.

    `metric` "slots" is slot utilisation (busy sequences / slots, like GPU utilisation);
    "kv" is KV-cache utilisation (tokens held / KV capacity, vLLM's
    `vllm:gpu_cache_usage_perc`, which KEDA's Prometheus scaler or a custom-metrics HPA
    would scale on), averaged over the ready replicas."""

    sync_s: float = 15.0
    target_utilisation: float = 0.7
    tolerance: float = 0.1
    scale_in_window_s: float = 300.0
    scale_out_pods: int = 4
    scale_out_percent: float = 100.0
    metric: HpaMetric = "slots"

    @property
    def name(self) -> str:
        return f"hpa-{self.metric}"

    @property
    def target(self) -> float:
        return self.target_utilisation

    def controller(self, initial: int, min_replicas: int, max_replicas: int) -> Controller:
        return _Hpa(self, initial, min_replicas, max_replicas)


class _Hpa:
    def __init__(self, spec: HpaBaseline, initial: int, low: int, high: int) -> None:
        self.spec = spec
        self.low = low
        self.high = high
        # The recommendations of the last scale-in window; the start counts as one.
        self.history: deque[tuple[float, int]] = deque([(0.0, initial)])

    def decide(self, seen: Observation) -> Decision:
        spec = self.spec
        current = seen.current
        value = seen.slot_utilisation if spec.metric == "slots" else seen.kv_utilisation
        label = "slot utilisation" if spec.metric == "slots" else "KV-cache utilisation"
        ratio = value / spec.target_utilisation
        within = abs(ratio - 1) <= spec.tolerance
        recommended = current if within else math.ceil(seen.ready * ratio)
        recommended = min(self.high, max(self.low, recommended))
        self.history.append((seen.now, recommended))
        while self.history[0][0] <= seen.now - spec.scale_in_window_s:
            self.history.popleft()
        if recommended > current:
            limit = max(
                current + spec.scale_out_pods,
                math.floor(current * (1 + spec.scale_out_percent / 100)),
            )
            desired = min(recommended, limit, self.high)
            return Decision(
                desired,
                f"{label} {value:.2f} / target {spec.target_utilisation:g}: {current} -> {desired}",
            )
        stabilised = max(r for _, r in self.history)
        if stabilised >= current:
            return Decision(current)
        return Decision(
            stabilised,
            f"highest recommendation over {spec.scale_in_window_s:g} s: {current} -> {stabilised}",
        )


@dataclass(frozen=True)
class KpaBaseline:
    """A Knative-KPA-like concurrency autoscaler: target in-flight plus queued requests per
    replica, `target_concurrency * target_utilisation` (Knative's containerConcurrency /
    `autoscaling.knative.dev/target` and `container-concurrency-target-percentage`, 70% by
    default; the default target here is the replica's slots, as a user would set
    containerConcurrency to the server's batch). Knative's defaults (config-autoscaler,
    knative.dev "Additional autoscaling configuration for Knative Pod Autoscaler"):
    `tick-interval` 2 s; `stable-window` 60 s; `panic-window-percentage` 10% (a 6 s panic
    window); `panic-threshold-percentage` 200%; `max-scale-up-rate` 1000;
    `max-scale-down-rate` 2; `scale-down-delay` 0 s.

    As its autoscaler does: desired = ceil(mean concurrency over the window / target),
    for the stable and the panic window, each bounded by the rates (at most
    ready * 1000, at least ready / 2); it panics when the panic desire reaches 200% of the
    ready replicas, then never scales in, and leaves panic a stable window after the last
    tick over the threshold; a scale-down delay keeps the highest desire over its window.
    The concurrency is sampled at each tick (Knative averages per-second samples)."""

    target_concurrency: float = 16.0
    target_utilisation: float = 0.7
    sync_s: float = 2.0
    stable_window_s: float = 60.0
    panic_window_percent: float = 10.0
    panic_threshold_percent: float = 200.0
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    scale_down_delay_s: float = 0.0

    @property
    def name(self) -> str:
        return "kpa"

    @property
    def target(self) -> float:
        return self.target_concurrency

    def controller(self, initial: int, min_replicas: int, max_replicas: int) -> Controller:
        return _Kpa(self, min_replicas, max_replicas)


class _Kpa:
    def __init__(self, spec: KpaBaseline, low: int, high: int) -> None:
        self.spec = spec
        self.low = low
        self.high = high
        self.samples: deque[tuple[float, float]] = deque()
        self.panic_since: float | None = None
        self.max_panic = 0
        self.delay: deque[tuple[float, int]] = deque()

    def decide(self, seen: Observation) -> Decision:
        spec = self.spec
        now = seen.now
        self.samples.append((now, seen.concurrency))
        while self.samples[0][0] <= now - spec.stable_window_s:
            self.samples.popleft()
        panic_window = spec.stable_window_s * spec.panic_window_percent / 100
        recent = [c for t, c in self.samples if t > now - panic_window]
        stable = sum(c for _, c in self.samples) / len(self.samples)
        burst = sum(recent) / len(recent)
        target = spec.target_concurrency * spec.target_utilisation
        ready = max(1, seen.ready)
        most = math.ceil(spec.max_scale_up_rate * ready)
        least = math.floor(ready / spec.max_scale_down_rate)
        wanted_stable = min(most, max(least, math.ceil(stable / target)))
        wanted_panic = min(most, max(least, math.ceil(burst / target)))
        over = wanted_panic / ready >= spec.panic_threshold_percent / 100
        if over:
            self.panic_since = now  # begins, or goes on
        elif self.panic_since is not None and now > self.panic_since + spec.stable_window_s:
            self.panic_since = None
            self.max_panic = 0
        if self.panic_since is not None:
            self.max_panic = max(self.max_panic, wanted_panic)  # no scale-in while panicking
            desired = self.max_panic
            why = f"panic: {burst:.1f} in flight over {panic_window:g} s"
        else:
            desired = wanted_stable
            why = f"{stable:.1f} in flight over {spec.stable_window_s:g} s"
        if spec.scale_down_delay_s > 0:
            self.delay.append((now, desired))
            while self.delay[0][0] <= now - spec.scale_down_delay_s:
                self.delay.popleft()
            desired = max(d for _, d in self.delay)
        desired = min(self.high, max(self.low, desired))
        return Decision(
            desired,
            f"{why} / target {target:g} per replica: {seen.current} -> {desired}",
            panic=self.panic_since is not None,
        )


@dataclass(frozen=True)
class SimulationConfig:
    fleet: FleetModel = field(default_factory=FleetModel)
    policy: ScalingPolicy = field(default_factory=ScalingPolicy)
    hpa: HpaBaseline = field(default_factory=HpaBaseline)
    hpa_kv: HpaBaseline = field(default_factory=lambda: HpaBaseline(metric="kv"))
    kpa: KpaBaseline = field(default_factory=KpaBaseline)
    initial_replicas: int = 2
    report_interval_s: float = 2.0
    # Replicas report each request's queueing delay beside its TTFT, as vLLM and TGI export
    # it (`LatencySamplesReported.queue_ms`); False: TTFT alone, as a server that does not.
    report_queueing: bool = True
    # Replicas report the requests waiting for them (`requests_waiting`, vLLM's
    # num_requests_waiting): the router's queue, shared out among the replicas serving as if
    # each held its part; False: no backlog, as a server that does not export it.
    report_backlog: bool = True
    slo_ms: float = 200.0
    bucket_s: float = 60.0
    seed: int = 0

    def __post_init__(self) -> None:
        policy = self.policy
        if not policy.min_replicas <= self.initial_replicas <= policy.max_replicas:
            raise ValueError(
                f"initial_replicas {self.initial_replicas} must be within min_replicas "
                f"{policy.min_replicas} and max_replicas {policy.max_replicas}"
            )


@dataclass(frozen=True)
class ScaleEvent:
    """A decision: what it asked (current -> desired, as the scaler counted) and what the
    simulated fleet did (its replicas serving or starting before and after; added, drained)."""

    at: float
    direction: str
    current: int
    desired: int
    panic: bool = False
    from_warm_pool: int = 0
    fleet_before: int | None = None
    fleet_after: int | None = None
    added: int = 0
    drained: int = 0
    reason: str = ""

    @property
    def agrees(self) -> bool:
        """The fleet was what the decision counted, and became what it asked for."""
        return (self.fleet_before, self.fleet_after) == (self.current, self.desired)


@dataclass(frozen=True)
class Bucket:
    start_s: float
    arrivals: int
    p95_ms: float | None
    holding: float  # replicas holding GPUs (starting, standby, serving, draining), mean
    serving: float  # replicas taking traffic, mean


@dataclass(frozen=True)
class RunResult:
    policy: str
    requests: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    # p95 time per output token of the requests finished with more than one token.
    tpot_p95_ms: float | None
    slo_ms: float
    slo_attainment: float
    dropped: int
    replica_minutes: float
    serving_replica_minutes: float
    scale_events: list[ScaleEvent]
    timeline: list[Bucket]
    duration_s: float
    peak_replicas: int = 0  # the most replicas serving or starting at any time
    max_replicas: int = 0  # the cap they ran under
    initial_replicas: int = 0
    # Every finished request's time per output token, sorted (for `tpot_within`).
    tpots: list[float] = field(default_factory=list, repr=False)

    def tpot_within(self, slo_ms: float) -> float:
        """The share of the requests finished with more than one token whose time per output
        token is within `slo_ms` (1.0 when there are none)."""
        return bisect_right(self.tpots, slo_ms) / len(self.tpots) if self.tpots else 1.0

    @property
    def scale_outs(self) -> int:
        return sum(1 for e in self.scale_events if e.direction == "out")

    @property
    def scale_ins(self) -> int:
        return sum(1 for e in self.scale_events if e.direction == "in")

    @property
    def panics(self) -> int:
        return sum(1 for e in self.scale_events if e.panic)

    @property
    def promoted(self) -> int:
        return sum(e.from_warm_pool for e in self.scale_events)

    @property
    def reversals(self) -> int:
        """Changes of direction within `REVERSAL_S` of the decision before."""
        return count_reversals(self.scale_events)

    @property
    def disagreements(self) -> int:
        """Decisions the fleet did not carry out as asked (see `ScaleEvent.agrees`)."""
        return sum(1 for e in self.scale_events if not e.agrees)

    def summary(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "requests": self.requests,
            "p50_ms": round(self.p50_ms, 1),
            "p95_ms": round(self.p95_ms, 1),
            "p99_ms": round(self.p99_ms, 1),
            "tpot_p95_ms": None if self.tpot_p95_ms is None else round(self.tpot_p95_ms, 1),
            "slo": f"TTFT <= {self.slo_ms:g} ms",
            "slo_attainment": round(self.slo_attainment, 5),
            "dropped": self.dropped,
            "replica_minutes": round(self.replica_minutes, 1),
            "serving_replica_minutes": round(self.serving_replica_minutes, 1),
            "scale_events": len(self.scale_events),
            "scale_outs": self.scale_outs,
            "scale_ins": self.scale_ins,
            "panic_scale_outs": self.panics,
            f"reversals_within_{REVERSAL_S:g}_s": self.reversals,
            "promoted_from_warm_pool": self.promoted,
            "decisions_not_carried_out": self.disagreements,
            "initial_replicas": self.initial_replicas,
            "peak_replicas": self.peak_replicas,
            "max_replicas": self.max_replicas,
        }


def count_reversals(events: Sequence[ScaleEvent], within: float = REVERSAL_S) -> int:
    """How many decisions went the other way from the one before, within `within` seconds
    of it (11 -> 10 -> 11 in 8 s is one)."""
    ordered = sorted(events, key=lambda e: e.at)
    return sum(
        1
        for before, after in itertools.pairwise(ordered)
        if after.direction != before.direction and after.at - before.at <= within
    )


class _Replica:
    __slots__ = (
        "active",
        "busy",
        "busy_mark",
        "created",
        "id",
        "kv",
        "last",
        "loaded_at",
        "queued",
        "removed",
        "reported",
        "state",
        "tpots",
    )

    def __init__(self, replica_id: str, state: str, created: float, loaded_at: float) -> None:
        self.id = replica_id
        self.state = state  # starting | standby | serving | draining
        self.created = created
        self.loaded_at = loaded_at
        self.active = 0
        self.kv = 0
        self.reported: list[float] = []  # time to first token of each request started
        self.queued: list[float] = []  # and the part of it spent queued
        self.tpots: list[float] = []  # time per output token of each request finished
        self.busy = 0.0  # slot-seconds
        self.busy_mark = 0.0
        self.last = created
        self.removed: float | None = None


_COMPLETE, _READY, _GRANT, _REPORT, _SYNC = range(5)


class _Simulation:
    def __init__(
        self,
        trace: Sequence[Request],
        config: SimulationConfig,
        mode: str,
        progress: Callable[[float], None] | None,
        baseline: Baseline | None = None,
    ) -> None:
        self.trace = trace
        self.config = config
        self.model = config.fleet
        self.mode = mode
        self.progress = progress
        self.end = math.ceil(trace[-1].at) if trace else 0.0
        self.latency = [DROPPED] * len(trace)
        self.tpot: list[float] = []  # of every request finished with more than one token
        self.replicas: dict[str, _Replica] = {}
        self.every: list[_Replica] = []  # every replica ever, for the replica-minutes
        self.backlog: deque[int] = deque()
        self.heap: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.events: list[ScaleEvent] = []
        self.samples: list[tuple[float, int, int]] = []  # (t, holding, serving)
        self.autoscaler = Autoscaler(config.policy) if baseline is None else None
        self.baseline = baseline
        self.controller = (
            baseline.controller(
                config.initial_replicas, config.policy.min_replicas, config.policy.max_replicas
            )
            if baseline is not None
            else None
        )
        self.namespace = uuid5(NAMESPACE_URL, f"crater-autoscale-sim/{config.seed}/{mode}")
        self.counter = 0
        self.peak = 0

    # -- bookkeeping ----------------------------------------------------------------------

    def push(self, at: float, kind: int, arg: object) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (at, self.seq, kind, arg))

    def when(self, now: float) -> datetime:
        return T0 + timedelta(seconds=now)

    def event_id(self, what: str) -> UUID:
        self.counter += 1
        return uuid5(self.namespace, f"{what}/{self.counter}")

    def serving(self) -> list[_Replica]:
        return [r for r in self.replicas.values() if r.state == "serving"]

    def fleet(self) -> int:
        """Replicas serving or on their way to serve (not standbys, not draining)."""
        size = sum(
            1 for r in self.replicas.values() if r.state in ("starting", "promoting", "serving")
        )
        self.peak = max(self.peak, size)
        return size

    def add_replica(self, replica_id: str, now: float, state: str, loaded_at: float) -> _Replica:
        replica = _Replica(replica_id, state, now, loaded_at)
        self.replicas[replica_id] = replica
        self.every.append(replica)
        if state != "serving":
            self.push(loaded_at, _READY, replica)
        return replica

    def remove(self, replica: _Replica, now: float) -> None:
        if replica.removed is not None:
            return
        replica.removed = now
        replica.state = "removed"
        # Its in-flight requests stay DROPPED (a release before the drain finished).
        del self.replicas[replica.id]
        if self.autoscaler is not None:
            self.autoscaler.allocation_released(replica.id)

    def account(self, replica: _Replica, now: float) -> None:
        replica.busy += replica.active * (now - replica.last)
        replica.last = now

    # -- requests -------------------------------------------------------------------------

    def fits(self, replica: _Replica, index: int) -> bool:
        if replica.active >= self.model.slots:
            return False
        request = self.trace[index]
        tokens = request.input_tokens + request.output_tokens
        return replica.active == 0 or replica.kv + tokens <= self.model.kv_capacity_tokens

    def route(self, index: int, now: float) -> None:
        if self.backlog:  # first come, first served
            self.backlog.append(index)
            return
        room = [r for r in self.replicas.values() if r.state == "serving" and self.fits(r, index)]
        if not room:
            self.backlog.append(index)
            return
        self.start(min(room, key=lambda r: (r.active, r.created, r.id)), index, now)

    def dispatch(self, replica: _Replica, now: float) -> None:
        """A serving replica has room: it takes requests from the head of the queue."""
        while self.backlog and replica.state == "serving" and self.fits(replica, self.backlog[0]):
            self.start(replica, self.backlog.popleft(), now)

    def start(self, replica: _Replica, index: int, now: float) -> None:
        model = self.model
        request = self.trace[index]
        load = replica.active / model.slots
        prefill = (model.prefill_base_ms + request.input_tokens * model.prefill_ms_per_token) * (
            1 + 0.5 * load
        )
        per_token = model.tpot_ms * (1 + model.batch_slowdown * load)
        decode = request.output_tokens * per_token
        queued = (now - request.at) * 1000
        ttft = queued + prefill
        self.latency[index] = ttft
        replica.reported.append(ttft)
        replica.queued.append(queued)
        self.account(replica, now)
        tokens = request.input_tokens + request.output_tokens
        replica.active += 1
        replica.kv += tokens
        tpot = per_token if request.output_tokens > 1 else None
        self.push(now + (prefill + decode) / 1000, _COMPLETE, (replica, tokens, tpot))

    def complete(self, replica: _Replica, tokens: int, tpot: float | None, now: float) -> None:
        if replica.removed is not None:
            return
        if tpot is not None:  # reported when it finishes, as vLLM's per-request histogram
            replica.tpots.append(tpot)
            self.tpot.append(tpot)
        self.account(replica, now)
        replica.active -= 1
        replica.kv -= tokens
        self.dispatch(replica, now)
        if replica.state == "draining" and replica.active == 0:
            self.drained(replica, now)

    def pressure(self, replica: _Replica) -> float:
        model = self.model
        used = min(1.0, replica.kv / model.kv_capacity_tokens)
        return model.weights_pressure + (1 - model.weights_pressure) * used

    def ready(self, replica: _Replica, now: float) -> None:
        if replica.removed is not None or replica.state not in ("starting", "promoting"):
            return  # a standby that finished loading waits for its promotion
        replica.state = "serving"
        replica.last = now
        self.dispatch(replica, now)

    # -- scaling, both ways ---------------------------------------------------------------

    def drain(self, replica: _Replica, now: float) -> None:
        if replica.state not in ("serving", "starting", "promoting"):
            return
        replica.state = "draining"  # one still loading has nothing in flight: released now
        if replica.active == 0:
            self.drained(replica, now)

    def drained(self, replica: _Replica, now: float) -> None:
        if self.autoscaler is None:
            self.remove(replica, now)
            return
        done = ReplicaDrained(
            event_id=self.event_id("drained"),
            occurred_at=self.when(now),
            service=SERVICE,
            replica_id=replica.id,
        )
        self.handle(self.autoscaler.replica_drained(done), now)

    def handle(self, events: Sequence[Event], now: float) -> None:
        """Carry out what the autoscaler published, in order; a decision is recorded with
        the fleet before it and after everything published with it."""
        model = self.model
        decided: ScaleDecided | None = None
        before = self.fleet()
        added = drained = 0
        for event in events:
            if isinstance(event, ScaleDecided):
                decided = event
                if event.direction is ScaleDirection.OUT:
                    for task in event.promoted_replicas:
                        standby = self.replicas.get(task)
                        if standby is not None and standby.state == "standby":
                            standby.state = "promoting"
                            at = max(now, standby.loaded_at) + model.promote_s
                            self.push(at, _READY, standby)
                            added += 1
                else:
                    named = [self.replicas.get(name) for name in event.drain_replicas]
                    chosen = [r for r in named if r is not None]
                    for victim in chosen:
                        if victim.state in ("serving", "starting", "promoting"):
                            drained += 1
                        self.drain(victim, now)
            elif isinstance(event, ReplicasRequested):
                for task in event.task_ids:
                    state = "standby" if event.standby else "starting"
                    placed = self.add_replica(task, now, state, now + model.startup_s)
                    self.push(now + model.place_s, _GRANT, placed)
                    if not event.standby:
                        added += 1
            elif isinstance(event, ReplicaReleaseRequested):
                released = self.replicas.get(event.replica_id)
                if released is not None:
                    self.remove(released, now)
        if decided is not None:
            self.events.append(
                ScaleEvent(
                    now,
                    decided.direction.value,
                    decided.current_replicas,
                    decided.desired_replicas,
                    decided.panic,
                    decided.from_warm_pool,
                    fleet_before=before,
                    fleet_after=self.fleet(),
                    added=added,
                    drained=drained,
                    reason=decided.reason,
                )
            )

    def report(self, now: float) -> None:
        autoscaler = self.autoscaler
        assert autoscaler is not None
        ordered = sorted(self.replicas.values(), key=lambda r: r.id)
        serving = [r.id for r in ordered if r.state == "serving"]
        share, extra = divmod(len(self.backlog), len(serving)) if serving else (0, 0)
        waiting = {name: share + (i < extra) for i, name in enumerate(serving)}
        for replica in ordered:
            if replica.state not in ("serving", "draining") or not replica.reported:
                continue
            sample = LatencySamplesReported(
                event_id=self.event_id("sample"),
                occurred_at=self.when(now),
                service=SERVICE,
                replica_id=replica.id,
                task_id=replica.id,
                latencies_ms=replica.reported[-10_000:],
                queue_ms=replica.queued[-10_000:] if self.config.report_queueing else None,
                requests_waiting=waiting.get(replica.id, 0) if self.config.report_backlog else None,
                tpot_ms=replica.tpots[-10_000:] or None,
                gpu_memory_pressure=round(self.pressure(replica), 4),
            )
            replica.reported, replica.queued, replica.tpots = [], [], []
            self.handle(autoscaler.observe(sample).events, now)
        self.handle(autoscaler.tick(self.when(now).timestamp()), now)

    def sync(self, now: float) -> None:
        """A baseline's sync: measure what it reads, let it decide, carry the decision out
        (a scale-in deletes replicas not yet ready first, as Kubernetes does, then drains
        the newest)."""
        controller = self.controller
        assert controller is not None
        assert self.baseline is not None
        ready = self.serving()
        starting = [r for r in self.replicas.values() if r.state == "starting"]
        current = len(ready) + len(starting)
        if not ready:
            return
        busy = 0.0
        for replica in ready:
            self.account(replica, now)
            busy += replica.busy - replica.busy_mark
            replica.busy_mark = replica.busy
        model = self.model
        seen = Observation(
            now=now,
            current=current,
            ready=len(ready),
            slot_utilisation=busy / (model.slots * self.baseline.sync_s * len(ready)),
            kv_utilisation=sum(min(1.0, r.kv / model.kv_capacity_tokens) for r in ready)
            / len(ready),
            concurrency=float(sum(r.active for r in ready) + len(self.backlog)),
        )
        decision = controller.decide(seen)
        desired = decision.desired
        if desired > current:
            prefix = self.baseline.name.split("-")[0]
            for _ in range(desired - current):
                task = f"{SERVICE}-{prefix}-{self.event_id(prefix).hex[:12]}"
                self.add_replica(task, now, "starting", now + model.startup_s)
            self.events.append(
                ScaleEvent(
                    now,
                    "out",
                    current,
                    desired,
                    panic=decision.panic,
                    fleet_before=current,
                    fleet_after=self.fleet(),
                    added=desired - current,
                    reason=decision.reason,
                )
            )
            return
        if desired >= current:
            return
        remove = current - desired
        for replica in sorted(starting, key=lambda r: (r.created, r.id), reverse=True)[:remove]:
            self.remove(replica, now)  # not ready yet: deleted first, as Kubernetes does
            remove -= 1
        for replica in sorted(ready, key=lambda r: (r.created, r.id), reverse=True)[:remove]:
            self.drain(replica, now)
        self.events.append(
            ScaleEvent(
                now,
                "in",
                current,
                desired,
                fleet_before=current,
                fleet_after=self.fleet(),
                drained=current - desired,
                reason=decision.reason,
            )
        )

    # -- the loop -------------------------------------------------------------------------

    def run(self, label: str | None = None) -> RunResult:
        config = self.config
        initial = [f"{SERVICE}-initial-{i}" for i in range(config.initial_replicas)]
        for i, task in enumerate(initial):
            self.add_replica(task, 0.0, "serving", 0.0)
            if self.autoscaler is not None:
                self.autoscaler.allocation_granted(task, f"node-{i}", [0], T0.timestamp())
        if self.autoscaler is not None:
            self.autoscaler.adopt(SERVICE, initial, T0.timestamp())
        self.fleet()
        if self.autoscaler is not None:
            self.push(config.report_interval_s, _REPORT, None)
        else:
            assert self.baseline is not None
            self.push(self.baseline.sync_s, _SYNC, None)
        self.push(0.0, _REPORT if self.autoscaler is not None else _SYNC, "sample")
        next_progress = 0.0
        arrival = 0
        trace = self.trace
        while arrival < len(trace) or self.heap:
            if arrival < len(trace) and (not self.heap or trace[arrival].at < self.heap[0][0]):
                now = trace[arrival].at
                self.route(arrival, now)
                arrival += 1
                continue
            now, _, kind, arg = heapq.heappop(self.heap)
            if kind == _COMPLETE:
                done, tokens, tpot = cast(tuple[_Replica, int, float | None], arg)
                self.complete(done, tokens, tpot, now)
            elif kind == _READY:
                self.ready(cast(_Replica, arg), now)
            elif kind == _GRANT:
                placed = cast(_Replica, arg)
                if self.autoscaler is not None and placed.removed is None:
                    at = self.when(now).timestamp()
                    self.autoscaler.allocation_granted(placed.id, f"node-{placed.id}", [0], at)
            elif kind in (_REPORT, _SYNC):
                if arg == "sample":  # timeline samples ride on the control loop's clock
                    holding = len(self.replicas)
                    self.samples.append((now, holding, len(self.serving())))
                    if now + config.bucket_s / 6 <= self.end:
                        self.push(now + config.bucket_s / 6, kind, "sample")
                    continue
                if now > self.end:
                    continue  # the trace is over: no more scaling, let the queues empty
                if kind == _REPORT:
                    self.report(now)
                    self.push(now + config.report_interval_s, _REPORT, None)
                else:
                    self.sync(now)
                    assert self.baseline is not None
                    self.push(now + self.baseline.sync_s, _SYNC, None)
                if self.progress is not None and self.end and now >= next_progress:
                    self.progress(min(1.0, now / self.end))
                    next_progress = now + self.end / 100
            if now > self.end + 3_600:
                break  # a fleet that never drains its queue: the rest count as dropped
        return self.result(label or self.mode)

    def result(self, label: str) -> RunResult:
        config = self.config
        end = self.end
        holding = 0.0
        for replica in self.every:
            stop = replica.removed if replica.removed is not None else end
            holding += max(0.0, min(stop, end) - min(replica.created, end))
        serving_minutes = 0.0
        for (t1, _, serving), (t2, _, _) in zip(self.samples, self.samples[1:], strict=False):
            serving_minutes += serving * (t2 - t1)
        latencies = sorted(self.latency)
        finite = [v for v in latencies if v != DROPPED]
        met = sum(1 for v in latencies if v <= config.slo_ms)
        count = len(latencies)
        return RunResult(
            policy=label,
            requests=count,
            p50_ms=nearest_rank(latencies, 0.5) if count else 0.0,
            p95_ms=nearest_rank(latencies, 0.95) if count else 0.0,
            p99_ms=nearest_rank(latencies, 0.99) if count else 0.0,
            tpot_p95_ms=nearest_rank(sorted(self.tpot), 0.95) if self.tpot else None,
            tpots=sorted(self.tpot),
            slo_ms=config.slo_ms,
            slo_attainment=met / count if count else 1.0,
            dropped=count - len(finite),
            replica_minutes=holding / 60,
            serving_replica_minutes=serving_minutes / 60,
            scale_events=self.events,
            timeline=self.timeline(),
            duration_s=end,
            peak_replicas=self.peak,
            max_replicas=config.policy.max_replicas,
            initial_replicas=config.initial_replicas,
        )

    def timeline(self) -> list[Bucket]:
        width = self.config.bucket_s
        count = max(1, math.ceil(self.end / width))
        per_bucket: list[list[float]] = [[] for _ in range(count)]
        for request, latency in zip(self.trace, self.latency, strict=True):
            per_bucket[min(count - 1, int(request.at // width))].append(latency)
        fleet: list[list[tuple[int, int]]] = [[] for _ in range(count)]
        for t, holding, serving in self.samples:
            fleet[min(count - 1, int(t // width))].append((holding, serving))
        buckets = []
        for i in range(count):
            values = sorted(per_bucket[i])
            sizes = fleet[i] or [(0, 0)]
            buckets.append(
                Bucket(
                    start_s=i * width,
                    arrivals=len(values),
                    p95_ms=nearest_rank(values, 0.95) if values else None,
                    holding=sum(h for h, _ in sizes) / len(sizes),
                    serving=sum(s for _, s in sizes) / len(sizes),
                )
            )
        return buckets


def departures(policy: ScalingPolicy) -> dict[str, tuple[object, object]]:
    """The fields of `policy` that are not what the service ships (its settings default to
    `ScalingPolicy()`): name -> (this value, the shipped one). What a run measured is what
    ships only when this is empty; a report says so when it is not."""
    shipped = ScalingPolicy()
    return {
        name: (getattr(policy, name), getattr(shipped, name))
        for name in ScalingPolicy.__dataclass_fields__
        if getattr(policy, name) != getattr(shipped, name)
    }


def describe_departures(policy: ScalingPolicy) -> str | None:
    """`departures` in words, for a report's header; None when the policy is the shipped one."""
    found = departures(policy)
    if not found:
        return None
    parts = ", ".join(f"{name} {mine} (ships {theirs})" for name, (mine, theirs) in found.items())
    return f"NOT THE SHIPPED DEFAULTS: {parts}"


BASELINES = ("hpa-slots", "hpa-kv", "kpa")


def baseline_of(config: SimulationConfig, name: str) -> Baseline:
    """The configured baseline named `name`: 'hpa-slots' (also 'hpa'), 'hpa-kv' or 'kpa'."""
    found: dict[str, Baseline] = {
        "hpa": config.hpa,
        "hpa-slots": config.hpa,
        "hpa-kv": config.hpa_kv,
        "kpa": config.kpa,
    }
    if name not in found:
        raise ValueError(
            f"policy must be 'crater' or one of {', '.join(BASELINES)} (or 'hpa'), not {name!r}"
        )
    return found[name]


def simulate(
    trace: Sequence[Request],
    config: SimulationConfig,
    policy: str | Baseline,
    progress: Callable[[float], None] | None = None,
) -> RunResult:
    """Replay `trace` against the simulated fleet scaled by `policy`: 'crater' (the service's
    own autoscaler), a baseline's name (`BASELINES`; 'hpa' is 'hpa-slots') taken from
    `config`, or a `Baseline` itself."""
    if isinstance(policy, str):
        if policy == "crater":
            return _Simulation(trace, config, "crater", progress).run()
        baseline = baseline_of(config, policy)
        mode = policy
    else:
        baseline, mode = policy, policy.name
    # The slot HPA keeps the name its replicas always had, so its runs stay bit for bit.
    key = "hpa" if mode == "hpa-slots" else mode
    return _Simulation(trace, config, key, progress, baseline).run(mode)
