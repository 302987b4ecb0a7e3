"""A simulated inference fleet replaying a request trace, scaled by Crater's own policy (the
`Autoscaler` the service runs, fed the events the service would get) or by an HPA-style
baseline, so the two can be compared on the same trace.

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
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import cast
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
class HpaBaseline:
    """Kubernetes HPA defaults: 15 s sync, 10% tolerance, scale-up by max(4 pods, 100%) per
    sync, scale-down to the highest recommendation of the last 300 s. The metric is slot
    utilisation (busy sequences / slots, like GPU utilisation) averaged over ready replicas."""

    sync_s: float = 15.0
    target_utilisation: float = 0.7
    tolerance: float = 0.1
    scale_in_window_s: float = 300.0
    scale_out_pods: int = 4
    scale_out_percent: float = 100.0


@dataclass(frozen=True)
class SimulationConfig:
    fleet: FleetModel = field(default_factory=FleetModel)
    policy: ScalingPolicy = field(default_factory=ScalingPolicy)
    hpa: HpaBaseline = field(default_factory=HpaBaseline)
    initial_replicas: int = 2
    report_interval_s: float = 2.0
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
        "removed",
        "reported",
        "state",
    )

    def __init__(self, replica_id: str, state: str, created: float, loaded_at: float) -> None:
        self.id = replica_id
        self.state = state  # starting | standby | serving | draining
        self.created = created
        self.loaded_at = loaded_at
        self.active = 0
        self.kv = 0
        self.reported: list[float] = []
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
    ) -> None:
        self.trace = trace
        self.config = config
        self.model = config.fleet
        self.mode = mode
        self.progress = progress
        self.end = math.ceil(trace[-1].at) if trace else 0.0
        self.latency = [DROPPED] * len(trace)
        self.replicas: dict[str, _Replica] = {}
        self.every: list[_Replica] = []  # every replica ever, for the replica-minutes
        self.backlog: deque[int] = deque()
        self.heap: list[tuple[float, int, int, object]] = []
        self.seq = 0
        self.events: list[ScaleEvent] = []
        self.samples: list[tuple[float, int, int]] = []  # (t, holding, serving)
        self.autoscaler = Autoscaler(config.policy) if mode == "crater" else None
        # HPA's recommendations of the last scale-in window; the start counts as one.
        self.hpa_history: deque[tuple[float, int]] = deque([(0.0, config.initial_replicas)])
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
        decode = request.output_tokens * model.tpot_ms * (1 + model.batch_slowdown * load)
        ttft = (now - request.at) * 1000 + prefill
        self.latency[index] = ttft
        replica.reported.append(ttft)
        self.account(replica, now)
        tokens = request.input_tokens + request.output_tokens
        replica.active += 1
        replica.kv += tokens
        self.push(now + (prefill + decode) / 1000, _COMPLETE, (replica, tokens))

    def complete(self, replica: _Replica, tokens: int, now: float) -> None:
        if replica.removed is not None:
            return
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
        for replica in sorted(self.replicas.values(), key=lambda r: r.id):
            if replica.state not in ("serving", "draining") or not replica.reported:
                continue
            sample = LatencySamplesReported(
                event_id=self.event_id("sample"),
                occurred_at=self.when(now),
                service=SERVICE,
                replica_id=replica.id,
                task_id=replica.id,
                latencies_ms=replica.reported[-10_000:],
                gpu_memory_pressure=round(self.pressure(replica), 4),
            )
            replica.reported = []
            self.handle(autoscaler.observe(sample).events, now)
        self.handle(autoscaler.tick(self.when(now).timestamp()), now)

    def sync(self, now: float) -> None:
        hpa = self.config.hpa
        policy = self.config.policy
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
        utilisation = busy / (self.model.slots * hpa.sync_s * len(ready))
        ratio = utilisation / hpa.target_utilisation
        recommended = current if abs(ratio - 1) <= hpa.tolerance else math.ceil(len(ready) * ratio)
        recommended = min(policy.max_replicas, max(policy.min_replicas, recommended))
        self.hpa_history.append((now, recommended))
        while self.hpa_history[0][0] <= now - hpa.scale_in_window_s:
            self.hpa_history.popleft()
        if recommended > current:
            limit = max(
                current + hpa.scale_out_pods,
                math.floor(current * (1 + hpa.scale_out_percent / 100)),
            )
            desired = min(recommended, limit, policy.max_replicas)
            for _ in range(desired - current):
                task = f"{SERVICE}-hpa-{self.event_id('hpa').hex[:12]}"
                self.add_replica(task, now, "starting", now + self.model.startup_s)
            self.events.append(
                ScaleEvent(
                    now,
                    "out",
                    current,
                    desired,
                    fleet_before=current,
                    fleet_after=self.fleet(),
                    added=desired - current,
                    reason=f"slot utilisation {utilisation:.2f} / target "
                    f"{hpa.target_utilisation:g}: {current} -> {desired}",
                )
            )
            return
        stabilised = max(r for _, r in self.hpa_history)
        if stabilised >= current:
            return
        remove = current - stabilised
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
                stabilised,
                fleet_before=current,
                fleet_after=self.fleet(),
                drained=current - stabilised,
                reason=f"highest recommendation over {hpa.scale_in_window_s:g} s: "
                f"{current} -> {stabilised}",
            )
        )

    # -- the loop -------------------------------------------------------------------------

    def run(self) -> RunResult:
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
            self.push(config.hpa.sync_s, _SYNC, None)
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
                done, tokens = cast(tuple[_Replica, int], arg)
                self.complete(done, tokens, now)
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
                    self.push(now + config.hpa.sync_s, _SYNC, None)
                if self.progress is not None and self.end and now >= next_progress:
                    self.progress(min(1.0, now / self.end))
                    next_progress = now + self.end / 100
            if now > self.end + 3_600:
                break  # a fleet that never drains its queue: the rest count as dropped
        return self.result()

    def result(self) -> RunResult:
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
            policy=self.mode,
            requests=count,
            p50_ms=nearest_rank(latencies, 0.5) if count else 0.0,
            p95_ms=nearest_rank(latencies, 0.95) if count else 0.0,
            p99_ms=nearest_rank(latencies, 0.99) if count else 0.0,
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


def simulate(
    trace: Sequence[Request],
    config: SimulationConfig,
    policy: str,
    progress: Callable[[float], None] | None = None,
) -> RunResult:
    """Replay `trace` against the simulated fleet scaled by `policy` ('crater' or 'hpa')."""
    if policy not in ("crater", "hpa"):
        raise ValueError(f"policy must be 'crater' or 'hpa', not {policy!r}")
    return _Simulation(trace, config, policy, progress).run()
