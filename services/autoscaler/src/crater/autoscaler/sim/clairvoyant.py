"""A clairvoyant reference for the frontier: an autoscaler that knows every request of the
trace ahead, which no real one can. It says how far any policy could get on a trace and a
fleet model, so that a distance to the baselines can be read against what foresight buys.

It computes, per second, the replicas the trace's requests will need (the requests in flight
and their KV tokens as a fluid: each holds its slot and tokens for its prefill and decode at
an assumed batch fill `load`, divided by `slots * utilisation` and `kv_capacity_tokens *
utilisation`, the larger, as a sliding maximum over `smooth_s`), and at each sync asks for
what will be needed when a replica asked now is ready (`startup_s + place_s` ahead), keeping
until then what is needed before it. No stabilisation, no panic: it has no need to guess.
`utilisation` is the knob a sweep turns, as a baseline's target is.

Not a bound in the strict sense (a better clairvoyant may exist), and not a policy: a
reference line on the same simulator, the same trace and the same cap as the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import sliding_window_view

from crater.autoscaler.sim.fleet import Controller, Decision, FleetModel, Observation
from crater.autoscaler.sim.trace import Request

IntArray = npt.NDArray[np.int64]


def replicas_needed(
    trace: Sequence[Request],
    model: FleetModel,
    utilisation: float,
    load: float = 0.5,
    smooth_s: int = 10,
) -> IntArray:
    """Per second of the trace (and a tail of 10 minutes), the replicas its requests need."""
    if utilisation <= 0:
        raise ValueError(f"utilisation {utilisation:g} must be above 0")
    end = (int(trace[-1].at) if trace else 0) + 600
    slots = np.zeros(end + 2)
    tokens = np.zeros(end + 2)
    for request in trace:
        held = (
            (model.prefill_base_ms + request.input_tokens * model.prefill_ms_per_token)
            * (1 + 0.5 * load)
            + request.output_tokens * model.tpot_ms * (1 + model.batch_slowdown * load)
        ) / 1000
        start, stop = int(request.at), min(end + 1, int(request.at + held) + 1)
        kv = request.input_tokens + request.output_tokens
        slots[start] += 1
        slots[stop] -= 1
        tokens[start] += kv
        tokens[stop] -= kv
    need = np.maximum(
        np.cumsum(slots)[: end + 1] / (model.slots * utilisation),
        np.cumsum(tokens)[: end + 1] / (model.kv_capacity_tokens * utilisation),
    )
    width = max(1, smooth_s)
    padded = np.concatenate([need, np.full(width - 1, need[-1])])
    needed: IntArray = np.ceil(sliding_window_view(padded, width).max(axis=1)).astype(np.int64)
    return needed


@dataclass(frozen=True)
class ClairvoyantBaseline:
    """The clairvoyant reference as a `Baseline` the simulator runs (see the module)."""

    trace: Sequence[Request] = field(repr=False)
    model: FleetModel = field(default_factory=FleetModel)
    utilisation: float = 1.0
    load: float = 0.5
    smooth_s: int = 10
    sync_s: float = 2.0

    @property
    def name(self) -> str:
        return "clairvoyant"

    @property
    def target(self) -> float:
        return self.utilisation

    def controller(self, initial: int, min_replicas: int, max_replicas: int) -> Controller:
        need = replicas_needed(self.trace, self.model, self.utilisation, self.load, self.smooth_s)
        lead = self.model.startup_s + self.model.place_s
        return _Clairvoyant(need, lead, self.sync_s, min_replicas, max_replicas)


class _Clairvoyant:
    def __init__(self, need: IntArray, lead: float, sync_s: float, low: int, high: int) -> None:
        self.need = need
        self.lead = lead
        self.sync_s = sync_s
        self.low = low
        self.high = high

    def decide(self, seen: Observation) -> Decision:
        last = len(self.need) - 1
        now = min(int(seen.now), last)
        ready_at = min(int(seen.now + self.lead), last)
        until = min(int(seen.now + self.lead + self.sync_s) + 1, last)
        # Asked now, a replica serves from `ready_at`; one released now is gone at once.
        wanted = int(self.need[ready_at : until + 1].max())
        keep = int(self.need[now : until + 1].max())
        desired = min(self.high, max(self.low, wanted, min(keep, seen.current)))
        return Decision(desired, f"the trace needs {wanted} at +{self.lead:g} s")
