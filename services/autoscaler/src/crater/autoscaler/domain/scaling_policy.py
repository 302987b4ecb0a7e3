"""The autoscaling policy: each number's one definition (default, bounds, description).

`ScalingPolicy` is what the domain runs; the service's settings (`AutoscalerSettings`) derive
from it, so each field is read from `CRATER_AUTOSCALER_<FIELD>` with this default, these
bounds and this description (docs/configuration.md is generated from them). The simulator
(`crater autoscale-sim`) and the benchmarks start from the same defaults.

Optional features are off when their field is None. An environment variable cannot say None,
so there 0 says it: `CRATER_AUTOSCALER_PANIC_P95_MS=0` turns panic mode off. The policy reads
0 as None for those fields (and only those), so code never sees the 0.
"""

from dataclasses import dataclass as _dataclass
from typing import Annotated, Any, Literal, get_args, get_type_hints

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

Strategy = Literal["demand", "rule"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)


@_dataclass(frozen=True)
class Bounds:
    """A number's bounds, refused as '... must be ...' (the JSON schema shows them as usual).
    None passes: an optional feature left off."""

    gt: float | None = None
    ge: float | None = None
    le: float | None = None

    def check(self, value: Any) -> Any:
        if value is None:
            return value
        if self.gt is not None and not value > self.gt:
            raise ValueError(f"must be greater than {self.gt:g}")
        if self.ge is not None and not value >= self.ge:
            raise ValueError(f"must be at least {self.ge:g}")
        if self.le is not None and not value <= self.le:
            raise ValueError(f"must be at most {self.le:g}")
        return value

    def __get_pydantic_core_schema__(
        self, source: Any, handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        return core_schema.no_info_after_validator_function(self.check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        shown = handler(schema)
        target = next((s for s in shown.get("anyOf", []) if s.get("type") != "null"), shown)
        for key, bound in (
            ("exclusiveMinimum", self.gt),
            ("minimum", self.ge),
            ("maximum", self.le),
        ):
            if bound is not None:
                target[key] = bound
        return shown


def _zero_is_off(value: Any) -> Any:
    """0 (what an environment variable can say, as text) is None: the feature is off."""
    try:
        zero = float(value) == 0 if isinstance(value, str) else value == 0
    except ValueError:
        return value  # not a number: refused by the type, as any other field's would be
    return None if zero else value


# An optional feature: None (or 0, as an environment variable says it) turns it off.
Off = BeforeValidator(_zero_is_off)


@dataclass(frozen=True, config=ConfigDict(extra="forbid"))
class ScalingPolicy:
    """The numbers of the autoscaling policy (domain/policy.py tells the whole story)."""

    scale_out_p95_ms: Annotated[
        float, Bounds(gt=0), Field(description="Scale out above this p95.")
    ] = 200.0
    scale_out_pressure: Annotated[
        float, Bounds(ge=0, le=1), Field(description="...and above this GPU memory pressure.")
    ] = 0.8
    scale_out_tpot_ms: Annotated[
        float | None,
        Off,
        Bounds(gt=0),
        Field(
            description="A second SLO, on time per output token: its p95 over this (batches so "
            "full that decoding slows) scales out, in proportion, and holds scale-in; unset "
            "(0 in the environment): not judged."
        ),
    ] = None
    ttft_ms_per_1k_prompt_tokens: Annotated[
        float | None,
        Off,
        Bounds(gt=0),
        Field(
            description="A TTFT SLO relative to prompt length: a request's time to first token "
            "is judged less this many ms per 1,000 prompt tokens (its prefill's allowance), "
            "for replicas that report prompt_tokens and not their queueing; unset (0 in the "
            "environment): TTFT as it is."
        ),
    ] = None
    scale_in_p95_ms: Annotated[
        float, Bounds(gt=0), Field(description="Scale in below this p95.")
    ] = 100.0
    scale_in_pressure: Annotated[
        float, Bounds(ge=0, le=1), Field(description="...and below this GPU memory pressure.")
    ] = 0.3
    window_seconds: Annotated[
        float, Bounds(gt=0), Field(description="Latency window for the p95.")
    ] = 60.0
    stabilisation_seconds: Annotated[
        float, Bounds(ge=0), Field(description="How long calm must hold before a scale-in.")
    ] = 300.0
    cooldown_seconds: Annotated[
        float,
        Bounds(ge=0),
        Field(description="Least time between two scale-outs of one service."),
    ] = 15.0
    min_replicas: Annotated[
        int, Bounds(ge=0), Field(description="Fewest replicas a service is scaled to.")
    ] = 1
    max_replicas: Annotated[
        int, Bounds(ge=1), Field(description="Most replicas a service is scaled to.")
    ] = 16
    # One slow request is not a trend: scale-out needs this many samples as evidence.
    # Scale-in needs no minimum, since few requests is itself a sign of low load.
    min_samples: Annotated[
        int,
        Bounds(ge=1),
        Field(description="Samples needed since the last decision to scale out."),
    ] = 10
    # A batch holds at most 10,000 samples (by contract), so a window keeps at least one.
    max_window_samples: Annotated[
        int, Bounds(ge=10_000), Field(description="Per-service memory bound of the window.")
    ] = 50_000
    # A scale-out adds at least one replica and at most multiplies the fleet by this.
    max_scale_out_factor: Annotated[
        float,
        Bounds(ge=1),
        Field(description="A scale-out at most multiplies the replicas by this."),
    ] = 2.0
    # Over any period, the fleet grows by at most max(+N, xk) of its size at the period's
    # start (HPA's scale-up policies, 'select max').
    scale_out_period_seconds: Annotated[
        float, Bounds(ge=0), Field(description="The period of the scale-out rate limit.")
    ] = 60.0
    scale_out_period_replicas: Annotated[
        int, Bounds(ge=1), Field(description="Per period the fleet grows by at most +this...")
    ] = 8
    scale_out_period_factor: Annotated[
        float, Bounds(ge=1), Field(description="...or xthis, whichever allows more.")
    ] = 4.0
    max_scale_in_step: Annotated[
        int,
        Bounds(ge=1),
        Field(
            description="Replicas removed per scale-in (rule: one scale-in per stabilisation "
            "window; demand: scale-ins a cooldown apart)."
        ),
    ] = 1
    # A fleet grown for a burst should not stay oversized through a busy day where pressure
    # never drops under the scale-in line.
    scale_in_headroom: Annotated[
        float | None,
        Off,
        Bounds(ge=0, le=1),
        Field(
            description="Also scale in when fewer replicas keep p95 and mean pressure within "
            "this share of the scale-out lines; unset (0 in the environment): the field's "
            "rule alone."
        ),
    ] = None
    panic_p95_ms: Annotated[
        float | None,
        Off,
        Bounds(ge=0),
        Field(
            description="Panic: p95 over the panic window above this scales out at once, ahead "
            "of the cooldown, and holds off scale-in; unset (0 in the environment) turns panic "
            "mode off."
        ),
    ] = 400.0
    panic_window_seconds: Annotated[float, Bounds(gt=0), Field(description="The panic window.")] = (
        6.0
    )
    panic_windows: Annotated[
        int,
        Bounds(ge=1),
        Field(
            description="Panic only when p95 is over panic_p95_ms in each of this many "
            "consecutive panic windows since the last decision: sustained queueing, not one "
            "slow request."
        ),
    ] = 3
    panic_hold_seconds: Annotated[
        float,
        Bounds(ge=0),
        Field(description="No scale-in until the panic has been over this long."),
    ] = 60.0
    reversal_window_seconds: Annotated[
        float,
        Bounds(ge=0),
        Field(
            description="No decision the other way within this of a scale-out or scale-in, "
            "unless the load (summed GPU memory pressure) moved by more than the margins "
            "below since; a panic scale-out is not held."
        ),
    ] = 120.0
    scale_in_load_drop: Annotated[
        float,
        Bounds(ge=0, le=1),
        Field(
            description="Within that window of a scale-out, a scale-in needs the load down "
            "by more than this share."
        ),
    ] = 0.5
    scale_out_load_rise: Annotated[
        float,
        Bounds(ge=0),
        Field(
            description="Within that window of a scale-in, a scale-out needs the load up "
            "by more than this share."
        ),
    ] = 0.25
    scale_in_margin: Annotated[
        float,
        Bounds(ge=0, le=1),
        Field(
            description="demand: scale in only to a count that holds the highest the arrivals "
            "asked for over the stabilisation window with this share to spare: a band against "
            "shedding a replica on a dip of the load that its return wants back."
        ),
    ] = 0.2  # measured: reversals halved on four traces, docs/autoscaling.md
    warm_pool_size: Annotated[
        int,
        Bounds(ge=0),
        Field(description="Standby replicas kept placed per service, promoted first."),
    ] = 0
    drain_timeout_seconds: Annotated[
        float,
        Bounds(ge=0),
        Field(description="Release a draining replica after this even if busy."),
    ] = 60.0
    replica_start_timeout_seconds: Annotated[
        float,
        Bounds(gt=0),
        Field(
            description="A requested replica silent this long is no longer counted as "
            "starting: forgotten if never placed, counted as serving (idle) if placed."
        ),
    ] = 600.0
    strategy: Annotated[
        Strategy,
        Field(
            description="demand: size the fleet by Little's law to hold the mean GPU memory "
            "pressure at target_pressure, plus the queue; scale in to the most it asked for "
            "over the stabilisation window. rule: the field's rule alone (the thresholds "
            "above)."
        ),
    ] = "demand"
    target_pressure: Annotated[
        float,
        Bounds(gt=0, le=1),
        Field(description="demand: the mean GPU memory pressure the fleet is sized for."),
    ] = 0.7  # 0.8 left no KV room for long prompts (docs/autoscaling.md, heavy-tailed traces)
    drain_seconds: Annotated[
        float,
        Bounds(gt=0),
        Field(description="demand: serve the queued requests as well as the arrivals within this."),
    ] = 60.0
    demand_window_seconds: Annotated[
        float,
        Bounds(gt=0),
        Field(description="demand: pressure and queue wait averaged over this."),
    ] = 30.0

    @model_validator(mode="after")
    def _ordered(self) -> "ScalingPolicy":
        """What no single field's bounds say: thresholds and windows in order."""
        if not self.scale_in_p95_ms <= self.scale_out_p95_ms:
            raise ValueError("need 0 < scale_in_p95_ms <= scale_out_p95_ms")
        if not self.scale_in_pressure <= self.scale_out_pressure:
            raise ValueError("need 0 <= scale_in_pressure <= scale_out_pressure <= 1")
        if not self.min_replicas <= self.max_replicas:
            raise ValueError("need 0 <= min_replicas <= max_replicas")
        if self.panic_p95_ms is not None and self.panic_p95_ms < self.scale_out_p95_ms:
            raise ValueError("need panic_p95_ms >= scale_out_p95_ms")
        if not self.panic_window_seconds * self.panic_windows <= self.window_seconds:
            raise ValueError("need 0 < panic_window_seconds x panic_windows <= window_seconds")
        return self


def policy_annotations() -> dict[str, Any]:
    """Each field's annotation (type, bounds, description), for a model that derives its
    fields from the policy: pydantic keeps only the types of a dataclass base's fields."""
    return get_type_hints(ScalingPolicy, include_extras=True)
