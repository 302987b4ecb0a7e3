"""The Autoscaler: per-service windows fed by events, a strategy that decides, and the guards
every strategy shares (rate limits, panic, warm pool, pressure sources and drains).

Every decision is judged on samples that arrived after the previous decision, so the effect of
one decision is measured before the next is taken, and a burst does not produce a decision per
sample.

- Rate limits: a scale-out at most multiplies the fleet by `max_scale_out_factor`, and over
  any `scale_out_period_seconds` the fleet grows by at most max(+N, xk) of its size at the
  period's start; a scale-in removes at most `max_scale_in_step` replicas per stabilisation
  window (domain/guards.py).
- Panic (after Knative): when p95 over each of `panic_windows` consecutive short
  `panic_window_seconds` windows passes `panic_p95_ms` (queueing that lasts, not one slow
  request), scale out at once, ahead of the cooldown and whatever the pressure (a burst
  queues requests before it fills memory), and take no scale-in until the panic has been
  over for `panic_hold_seconds`.
- No reversal: within `reversal_window_seconds` of a decision, one the other way is taken
  only when the load (summed GPU memory pressure) fell by more than `scale_in_load_drop`
  (after a scale-out) or rose by more than `scale_out_load_rise` (after a scale-in); a panic
  scale-out is not held (domain/guards.py).
- The fleet is what it is, not what reported lately: a replica heard of stays counted while
  its allocation lives (a silent replica is idle, not gone), with those asked for and not
  heard of yet; a scale-in drains from them, the newest first.
- Warm pool: `warm_pool_size` standby replicas are kept placed; a scale-out promotes them
  first (the decision names them) and asks for the rest cold, then refills the pool.
- Pressure from the KV cache a replica's engine reports (`kv_cache_usage`: a scraped vLLM),
  else from the GPUs each replica holds: `allocation_granted` says which GPUs a replica's
  task holds, `node_metrics` their memory; a replica's own reported pressure is the fallback.
- Drain before release: a scale-in names the replica to drain; its allocation is released
  (`ReplicaReleaseRequested`) when it reports drained, or when `drain_timeout_seconds` pass.

Time is always the events' own `occurred_at` (or the `now` handed to `tick`): no clock.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from uuid import UUID

from crater.autoscaler.domain import guards
from crater.autoscaler.domain.decision import Assessment, Evaluation
from crater.autoscaler.domain.demand import SlidingMax, TimeSeries
from crater.autoscaler.domain.guards import QUANTILE
from crater.autoscaler.domain.scaling_policy import ScalingPolicy
from crater.autoscaler.domain.state import Drain, Replica, ServiceState
from crater.autoscaler.domain.strategies import strategy_for
from crater.autoscaler.domain.window import LatencyWindow
from crater.contracts import (
    Event,
    FleetSummary,
    LatencySamplesReported,
    ReplicaDrained,
    ReplicaReleaseRequested,
    ReplicasRequested,
    ScaleDecided,
    ScaleDirection,
    derived_event_id,
)

ANONYMOUS_REPLICA = ""
_NOT_TASK_ID = re.compile(r"[^A-Za-z0-9._:-]+")


class Autoscaler:
    """Per-service windows, the policy's strategy and the shared guards. State changes only
    through `observe`, `allocation_granted`, `allocation_released`, `node_metrics`,
    `replica_drained` and `tick`, each given the time it happened."""

    def __init__(self, policy: ScalingPolicy | None = None, remember_events: int = 10_000) -> None:
        self.policy = policy or ScalingPolicy()
        self.strategy = strategy_for(self.policy)
        self._services: dict[str, ServiceState] = {}
        self._seen: OrderedDict[UUID, Assessment] = OrderedDict()
        self._remember_events = remember_events
        # task id -> (node, GPU indexes) of every live allocation.
        self._allocations: dict[str, tuple[str, tuple[int, ...]]] = {}
        # node -> (when, GPU index -> memory pressure) from the latest node metrics.
        self._gpu_pressure: dict[str, tuple[float, dict[int, float]]] = {}
        self._service_of_task: dict[str, str] = {}

    def replicas(self, service: str) -> int:
        """The replica count believed now: the fleet as known by name (a silent replica is
        idle, not gone), else the latest of a decision and a reported count."""
        state = self._services.get(service)
        if state is None:
            return self.policy.min_replicas
        known = state.fleet_size()
        if known is not None:
            return known
        return self.policy.min_replicas if state.replicas is None else state.replicas

    def warm_pool(self, service: str) -> list[str]:
        """The standbys placed for a service, oldest first."""
        state = self._services.get(service)
        return [] if state is None else sorted(state.standby, key=lambda t: (state.standby[t], t))

    def gpu_pressure_of(self, task_id: str) -> float | None:
        """The highest memory pressure among the GPUs a task holds, by the latest metrics."""
        return self._gpus_pressure(task_id, -math.inf)

    def services(self) -> list[str]:
        """The services heard of, by name."""
        return sorted(self._services)

    def memory_pressure(self, service: str) -> tuple[float | None, float | None]:
        """(highest, mean) GPU memory pressure of the service's replicas as the scaling rule
        would see it now: their cards by the latest node metrics (their own reports as the
        fallback), within the window ending at the service's latest sample. Read only: a
        metrics scrape changes nothing the decisions read."""
        state = self._services.get(service)
        if state is None:
            return None, None
        highest, mean, _ = self._pressure_now(
            state, state.window.latest - self.policy.window_seconds
        )
        return highest, mean

    def draining(self, service: str) -> list[str]:
        state = self._services.get(service)
        return [] if state is None else sorted(state.draining)

    def fleets(self, service: str | None = None, decisions: int = 10) -> list[FleetSummary]:
        """Each service's figures as its latest sample batch left them, and its latest
        `decisions` decisions (latest first): for people (`crater.v1.query.fleets`)."""
        return [
            FleetSummary(
                service=name,
                replicas=self.replicas(name),
                p95_latency_ms=state.p95_ms,
                samples=state.samples,
                gpu_memory_pressure=state.pressure,
                mean_gpu_memory_pressure=state.mean_pressure,
                pressure_source=state.pressure_source,
                panic=state.panic,
                warm_pool=self.warm_pool(name),
                starting=sorted(state.starting),
                draining=self.draining(name),
                last_sample_at=None
                if state.heard_at is None
                else datetime.fromtimestamp(state.heard_at, UTC),
                decisions=list(itertools.islice(state.decisions, decisions)),
            )
            for name, state in sorted(self._services.items())
            if service is None or name == service
        ]

    # -- inputs other than samples -------------------------------------------------------

    def allocation_granted(
        self, task_id: str, node: str, gpu_ids: Sequence[int], at: float
    ) -> None:
        """A task was placed: remember its GPUs; a requested standby joins the warm pool."""
        self._allocations[task_id] = (node, tuple(gpu_ids))
        service = self._service_of_task.get(task_id)
        state = self._services.get(service) if service else None
        if state is None:
            return
        state.template = task_id
        if state.standby_pending.pop(task_id, None) is not None:
            state.standby[task_id] = at

    def adopt(self, service: str, task_ids: Sequence[str], at: float) -> None:
        """Replicas of a service known other than by their samples (the fleet a simulation
        starts with): counted, and drained on a scale-in, as any replica heard of, until
        their allocation is released. (The service itself learns its replicas from their
        samples and from the replicas it asks for.)"""
        state = self._state(service)
        for task in task_ids:
            if task not in state.seen:
                state.seen[task] = Replica(at, at, task)
            self._service_of_task.setdefault(task, service)

    def allocation_released(self, task_id: str) -> None:
        self._allocations.pop(task_id, None)
        service = self._service_of_task.pop(task_id, None)
        state = self._services.get(service) if service else None
        if state is None:
            return
        state.standby.pop(task_id, None)
        state.standby_pending.pop(task_id, None)
        state.starting.pop(task_id, None)
        for replica, info in list(state.seen.items()):
            if info.task_id == task_id or replica == task_id:
                del state.seen[replica]
                state.pressures.pop(replica, None)
                state.kv_cache.pop(replica, None)
                state.waiting.pop(replica, None)
                state.draining.pop(replica, None)

    def node_metrics(self, node: str, at: float, gpu_pressure: dict[int, float]) -> None:
        """The memory pressure (used/total) of each GPU of a node, as the probe measured it."""
        previous = self._gpu_pressure.get(node)
        if previous is None or at >= previous[0]:
            self._gpu_pressure[node] = (at, dict(gpu_pressure))

    def replica_drained(self, event: ReplicaDrained) -> list[Event]:
        """A draining replica finished its requests: ask for its allocation's release."""
        state = self._services.get(event.service)
        if state is None or event.in_flight > 0:
            return []
        drain = state.draining.pop(event.replica_id, None)
        if drain is None:
            return []
        return [self._release(event.service, drain, drained=True, at=event.occurred_at)]

    def tick(self, now: float) -> list[Event]:
        """Time passed (a timer in the service, the clock of a simulation): release the
        replicas whose drain timed out."""
        released: list[Event] = []
        for name in sorted(self._services):
            released += self._expire_drains(name, self._services[name], now)
        return released

    # -- samples --------------------------------------------------------------------------

    def observe(self, sample: LatencySamplesReported) -> Assessment:
        earlier = self._seen.get(sample.event_id)
        if earlier is not None:
            return replace(earlier, duplicate=True)
        assessment = self._observe(sample)
        self._seen[sample.event_id] = assessment
        if len(self._seen) > self._remember_events:
            self._seen.popitem(last=False)
        return assessment

    def _observe(self, sample: LatencySamplesReported) -> Assessment:
        policy = self.policy
        state = self._state(sample.service)

        at = sample.occurred_at.timestamp()
        state.window.add(at, sample.latencies_ms)
        state.queueing = self._fed(state.queueing, at, sample.queue_ms)
        # A TTFT SLO relative to prompt length: each request judged less its allowance.
        ttft = sample.latencies_ms
        per_1k = policy.ttft_ms_per_1k_prompt_tokens
        if per_1k is not None and sample.prompt_tokens is not None and sample.queue_ms is None:
            ttft = [
                max(0.0, v - per_1k * n / 1000)
                for v, n in zip(sample.latencies_ms, sample.prompt_tokens, strict=True)
            ]
            state.beyond_prompt = self._fed(state.beyond_prompt, at, ttft)
        else:
            state.beyond_prompt = self._fed(state.beyond_prompt, at, None)
        judged_tpot = sample.tpot_ms if policy.scale_out_tpot_ms is not None else None
        state.tpot = self._fed(state.tpot, at, judged_tpot)
        # The newest time seen is 'now': a late sample must not move time backwards.
        now = state.window.latest
        cutoff = now - policy.window_seconds
        self._record_replica(state, sample, at, cutoff)
        if sample.replicas is not None and at >= state.replicas_at:
            state.replicas, state.replicas_at = sample.replicas, at
            state.reported_serving, state.reported_at = sample.replicas, at
        if sample.queue_ms is not None:
            # Reported as such: every millisecond queued is waiting.
            state.waits.add(now, sum(sample.queue_ms) / 1000, len(sample.queue_ms))
        else:
            # Queueing shows as time to first token beyond the fast (scale-in) line.
            fast = policy.scale_in_p95_ms
            waited = sum(v - fast for v in ttft if v > fast) / 1000
            state.waits.add(now, waited, len(ttft))
        requests: list[Event] = self._expire_drains(sample.service, state, now)
        self._forget_slow_starters(state, now)

        pressure, mean_pressure, source = self._pressure(state, cutoff)
        current = self.replicas(sample.service)
        whole = state.window.percentile(QUANTILE)
        p95_ms, samples = whole if whole else (None, 0)
        assessment = Assessment(sample.service, p95_ms, samples, pressure, current)

        # Judge on what happened since the last decision, within the window: queueing when
        # the replicas report it, else time to first token.
        judged = state.judged()
        since = state.last_decision_at
        if since is None or since <= cutoff:
            evidence = whole if judged is state.window else judged.percentile(QUANTILE)
        else:
            evidence = judged.percentile(QUANTILE, since=since)
        panic_p95 = guards.panic_p95(policy, state, now)
        panicking = panic_p95 is not None
        if panicking:
            state.panic_until = now + policy.panic_hold_seconds
        elif now >= state.panic_until:
            state.panic_peak = 0
        held = now < state.panic_until  # no scale-in while panicking or just after

        tpot = None
        if state.tpot is not None:
            tpot = state.tpot.percentile(
                QUANTILE, since=None if since is None or since <= cutoff else since
            )
        decision = self.strategy.decide(
            Evaluation(
                state,
                sample,
                now,
                current,
                evidence,
                panic_p95,
                held,
                pressure,
                mean_pressure,
                tpot,
            )
        )
        load = self._load(state, now, current, mean_pressure)
        if (
            decision is not None
            and not decision.panic
            and guards.reversal_held(policy, state, now, decision.direction, load) is not None
        ):
            decision = None  # no undoing the latest decision while its cause lasts

        if decision is not None:
            decision = decision.model_copy(update={"pressure_source": source})
            decision, carried = self._carry_out(state, sample, decision, now)
            requests += carried
            state.last_decision_at = now
            state.calm_since = None
            state.replicas, state.replicas_at = decision.desired_replicas, now
            state.last_direction, state.load_at_decision = decision.direction, load
            if decision.direction is ScaleDirection.OUT:
                state.last_scale_out_at = now
                state.growth.append((now, current))
                if decision.panic:
                    state.panic_peak = max(state.panic_peak, decision.desired_replicas)
            assessment = replace(assessment, replicas=decision.desired_replicas)
        requests += self._fill_warm_pool(state, sample, now)
        state.p95_ms, state.samples, state.heard_at = p95_ms, samples, now
        state.pressure, state.mean_pressure, state.pressure_source = pressure, mean_pressure, source
        state.panic = panicking or held
        if decision is not None:
            state.decisions.appendleft(decision)
        return replace(
            assessment, decision=decision, requests=tuple(requests), panic=panicking or held
        )

    # -- the shared parts -----------------------------------------------------------------

    def _state(self, service: str) -> ServiceState:
        state = self._services.get(service)
        if state is None:
            policy = self.policy
            horizon = max(policy.demand_window_seconds, policy.panic_window_seconds)
            state = ServiceState(
                LatencyWindow(policy.window_seconds, policy.max_window_samples),
                loads=TimeSeries(horizon),
                waits=TimeSeries(horizon),
                recommendations=SlidingMax(policy.stabilisation_seconds),
            )
            self._services[service] = state
        return state

    def _load(
        self, state: ServiceState, now: float, current: int, mean_pressure: float | None
    ) -> float | None:
        """The load, as summed GPU memory pressure: the demand strategy's average over its
        window, else the mean pressure times the replicas counted."""
        averaged = state.loads.mean(now - self.policy.demand_window_seconds)
        if averaged is not None:
            return averaged
        return None if mean_pressure is None else mean_pressure * current

    def _placed(self, task_id: str | None) -> bool:
        """The task holds a live allocation (granted, not released)."""
        return task_id is not None and task_id in self._allocations

    def _fed(
        self, window: LatencyWindow | None, at: float, values: Sequence[float] | None
    ) -> LatencyWindow | None:
        """A window of one more measure (queueing, TTFT beyond the prompt, TPOT): made on the
        first sample that carries it, given `values`, or moved on to `at` by a sample that
        does not (its old values age out as the others' do)."""
        if values is not None:
            if window is None:
                window = LatencyWindow(self.policy.window_seconds, self.policy.max_window_samples)
            window.add(at, values)
        elif window is not None:
            window.advance(at)
        return window

    def _record_replica(
        self, state: ServiceState, sample: LatencySamplesReported, at: float, cutoff: float
    ) -> None:
        replica = sample.replica_id or ANONYMOUS_REPLICA
        if sample.replica_id:
            task = sample.task_id or sample.replica_id
            known = state.seen.get(replica)
            first = known.first_seen if known else at
            last = max(at, known.last_seen) if known else at
            state.seen[replica] = Replica(min(first, at), last, task)
            self._service_of_task.setdefault(task, sample.service)
            state.starting.pop(task, None)
            state.standby.pop(task, None)  # a standby that serves has been promoted
        # A replica silent for the window is idle, not gone, while its allocation lives (its
        # release forgets it); one whose allocation was never seen is forgotten.
        for name in [r for r, info in state.seen.items() if info.last_seen <= cutoff]:
            if name not in state.draining and not self._placed(state.seen[name].task_id):
                del state.seen[name]
        if at <= cutoff:
            return
        for reported, latest in (
            (sample.gpu_memory_pressure, state.pressures),
            (sample.kv_cache_usage, state.kv_cache),
        ):
            if reported is None:
                continue
            previous = latest.get(replica)
            if previous is None or at >= previous[0]:
                latest[replica] = (at, reported)
        if sample.requests_waiting is not None:
            previous_count = state.waiting.get(replica)
            if previous_count is None or at >= previous_count[0]:
                state.waiting[replica] = (at, sample.requests_waiting)
            self._record_backlog(state, at, cutoff)

    def _record_backlog(self, state: ServiceState, now: float, cutoff: float) -> None:
        """The fleet's backlog as of this sample, kept over the demand's horizon."""
        backlog = state.backlog(cutoff)
        if backlog is None:
            return
        state.backlogs.append((max(now, state.backlogs[-1][0]) if state.backlogs else now, backlog))
        horizon = max(self.policy.demand_window_seconds, self.policy.panic_window_seconds)
        while state.backlogs and state.backlogs[0][0] <= now - horizon:
            state.backlogs.popleft()

    def _pressure(
        self, state: ServiceState, cutoff: float
    ) -> tuple[float | None, float | None, str | None]:
        """(highest, mean, source) of the pressure of the service's replicas heard of within
        the window. Scale-out looks at the highest (one replica near its memory limit is
        enough); scale-in at the mean (the load spreads over the replicas that stay), so one
        replica's long request does not hold a whole fleet at its size. A replica's KV cache
        as its engine reports it comes first (a paged engine's cards are full from its start),
        then its GPUs (from its allocation and the node's metrics); its own reported pressure
        is the fallback."""
        for latest in (state.pressures, state.kv_cache):
            for replica in [r for r, (at, _) in latest.items() if at <= cutoff]:
                del latest[replica]
        return self._pressure_now(state, cutoff)

    def _pressure_now(
        self, state: ServiceState, cutoff: float
    ) -> tuple[float | None, float | None, str | None]:
        """`_pressure` without forgetting anything: what is older than `cutoff` is skipped."""
        values: list[float] = []
        sources: set[str] = set()
        measured: set[str] = set()
        for replica, (at, used) in state.kv_cache.items():
            if at > cutoff:
                values.append(used)
                sources.add("kv-cache")
                measured.add(replica)
        for replica, info in state.seen.items():
            if replica in measured:
                continue
            gpus = self._gpus_pressure(info.task_id, cutoff)
            if gpus is not None:
                values.append(gpus)
                sources.add("node-metrics")
                measured.add(replica)
        for replica, (at, reported) in state.pressures.items():
            if replica not in measured and at > cutoff:
                values.append(reported)
                sources.add("samples")
        if not values:
            return None, None, None
        source = sources.pop() if len(sources) == 1 else "mixed"
        return max(values), sum(values) / len(values), source

    def _gpus_pressure(self, task_id: str | None, cutoff: float) -> float | None:
        allocation = self._allocations.get(task_id) if task_id else None
        if allocation is None or not allocation[1]:
            return None
        node, gpu_ids = allocation
        metrics = self._gpu_pressure.get(node)
        if metrics is None or metrics[0] <= cutoff:
            return None
        found = [metrics[1][g] for g in gpu_ids if g in metrics[1]]
        return max(found) if found else None

    def _carry_out(
        self,
        state: ServiceState,
        sample: LatencySamplesReported,
        decision: ScaleDecided,
        now: float,
    ) -> tuple[ScaleDecided, list[Event]]:
        """Name the standbys to promote and ask for the rest cold (scale-out), or name the
        replicas to drain (scale-in). Returns the completed decision and what to publish
        beside it."""
        requests: list[Event] = []
        if decision.direction is ScaleDirection.OUT:
            wanted = decision.desired_replicas - decision.current_replicas
            if self.policy.strategy == "rule":
                # The rule counts the replicas serving: a target repeated while its replicas
                # still start asks for nothing twice. (The demand count includes them.)
                wanted -= len(state.starting)
            promoted = self.warm_pool(sample.service)[: max(0, wanted)]
            for task in promoted:
                del state.standby[task]
                state.starting[task] = now
            cold = max(0, wanted - len(promoted))
            if cold:
                ids = _task_ids(sample.service, decision.event_id, "replica", cold)
                template = self._template(state)
                for task in ids:
                    state.starting[task] = now
                    self._service_of_task[task] = sample.service
                requests.append(
                    ReplicasRequested(
                        event_id=derived_event_id(decision.event_id, "replicas-requested"),
                        occurred_at=decision.occurred_at,
                        service=sample.service,
                        task_ids=ids,
                        template_task_id=template,
                        standby=False,
                        decision_id=decision.event_id,
                        reason=f"scale-out {decision.current_replicas} -> "
                        f"{decision.desired_replicas}: {len(promoted)} from the warm pool, "
                        f"{cold} cold{_copying(template, sample.service)}",
                    )
                )
            if promoted:
                decision = decision.model_copy(
                    update={"from_warm_pool": len(promoted), "promoted_replicas": promoted}
                )
            return decision, requests
        # The newest first: replicas heard of (silent ones too) and those still starting.
        candidates = sorted(state.members(), reverse=True)
        removing = decision.current_replicas - decision.desired_replicas
        chosen = candidates[:removing]
        for _, name, task_id in chosen:
            state.draining[name] = Drain(
                name, task_id, now + self.policy.drain_timeout_seconds, decision.event_id
            )
        drained = [name for _, name, _ in chosen]
        return decision.model_copy(update={"drain_replicas": drained}), requests

    def _fill_warm_pool(
        self, state: ServiceState, sample: LatencySamplesReported, now: float
    ) -> list[Event]:
        missing = self.policy.warm_pool_size - len(state.standby) - len(state.standby_pending)
        if missing <= 0:
            return []
        event_id = derived_event_id(sample.event_id, "warm-pool")
        ids = _task_ids(sample.service, event_id, "standby", missing)
        template = self._template(state)
        for task in ids:
            state.standby_pending[task] = now
            self._service_of_task[task] = sample.service
        return [
            ReplicasRequested(
                event_id=event_id,
                occurred_at=sample.occurred_at,
                service=sample.service,
                task_ids=ids,
                template_task_id=template,
                standby=True,
                reason=f"warm pool {len(state.standby)}/{self.policy.warm_pool_size} placed"
                f"{_copying(template, sample.service)}",
            )
        ]

    def _template(self, state: ServiceState) -> str | None:
        """The task whose request new replicas copy: a live placed replica, else the fleet's
        remembered template (placed once; ended perhaps, its request is still stored), else
        a task a replica reports running (say, after a restart, before any grant was seen).
        None only for a fleet never seen placed nor reporting a task: the scheduler then
        copies the service's latest task, or refuses naming the service."""
        reported = sorted(info.task_id for info in state.seen.values() if info.task_id)
        placed = [task for task in reported if task in self._allocations]
        if placed:
            state.template = placed[0]
            return placed[0]
        return state.template or (reported[0] if reported else None)

    def _forget_slow_starters(self, state: ServiceState, now: float) -> None:
        timeout = self.policy.replica_start_timeout_seconds
        for pending in (state.starting, state.standby_pending):
            for task in [t for t, asked in pending.items() if now - asked >= timeout]:
                asked = pending.pop(task)
                if pending is state.starting and self._placed(task):
                    # Placed and silent this long: it serves, idle (not lost, not starting).
                    state.seen.setdefault(task, Replica(asked, asked, task))

    def _expire_drains(self, service: str, state: ServiceState, now: float) -> list[Event]:
        overdue = sorted(r for r, d in state.draining.items() if d.deadline <= now)
        at = datetime.fromtimestamp(now, UTC)
        return [
            self._release(service, state.draining.pop(r), drained=False, at=at) for r in overdue
        ]

    def _release(
        self, service: str, drain: Drain, *, drained: bool, at: datetime
    ) -> ReplicaReleaseRequested:
        state = self._services[service]
        state.seen.pop(drain.replica_id, None)
        state.starting.pop(drain.replica_id, None)
        state.pressures.pop(drain.replica_id, None)
        state.kv_cache.pop(drain.replica_id, None)
        how = "drained" if drained else f"drain timed out ({self.policy.drain_timeout_seconds:g} s)"
        return ReplicaReleaseRequested(
            event_id=derived_event_id(drain.decision_id, f"release:{drain.replica_id}"),
            occurred_at=at,
            service=service,
            replica_id=drain.replica_id,
            task_id=drain.task_id,
            drained=drained,
            decision_id=drain.decision_id,
            reason=f"scale-in: {drain.replica_id} {how}",
        )


def _copying(template: str | None, service: str) -> str:
    """What the replicas copy, in words (never a bare None)."""
    if template is None:
        return f"; no replica of {service} known here: the scheduler copies its latest task"
    return f"; copying {template}"


def _task_ids(service: str, source: UUID, kind: str, count: int) -> list[str]:
    """Task ids for new replicas, derived from the event that asked for them."""
    stem = _NOT_TASK_ID.sub("-", service).strip("-._:")[:80] or "service"
    return [
        f"{stem}-{kind}-{derived_event_id(source, f'{kind}:{i}').hex[:12]}" for i in range(count)
    ]


def gpu_pressures(gpus: Iterable[tuple[int, int, int]]) -> dict[int, float]:
    """(index, used MiB, total MiB) -> index -> used/total, for `Autoscaler.node_metrics`."""
    return {index: (used / total if total else 0.0) for index, used, total in gpus}
