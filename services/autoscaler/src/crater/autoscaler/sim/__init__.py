"""Trace replay: a simulated inference fleet driven by Crater's policy or a baseline (HPA on
slots or KV cache, KPA-like concurrency)."""

from crater.autoscaler.sim.fleet import (
    BASELINES,
    REVERSAL_S,
    Baseline,
    Controller,
    Decision,
    FleetModel,
    HpaBaseline,
    KpaBaseline,
    Observation,
    RunResult,
    SimulationConfig,
    baseline_of,
    count_reversals,
    departures,
    describe_departures,
    simulate,
)
from crater.autoscaler.sim.trace import Request, TraceShape, generate_trace, read_trace, write_trace

__all__ = [
    "BASELINES",
    "REVERSAL_S",
    "Baseline",
    "Controller",
    "Decision",
    "FleetModel",
    "HpaBaseline",
    "KpaBaseline",
    "Observation",
    "Request",
    "RunResult",
    "SimulationConfig",
    "TraceShape",
    "baseline_of",
    "count_reversals",
    "departures",
    "describe_departures",
    "generate_trace",
    "read_trace",
    "simulate",
    "write_trace",
]
