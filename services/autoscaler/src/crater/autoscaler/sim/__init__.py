"""Trace replay: a simulated inference fleet driven by Crater's policy or an HPA baseline."""

from crater.autoscaler.sim.fleet import (
    REVERSAL_S,
    FleetModel,
    HpaBaseline,
    RunResult,
    SimulationConfig,
    count_reversals,
    departures,
    describe_departures,
    simulate,
)
from crater.autoscaler.sim.trace import Request, TraceShape, generate_trace, read_trace, write_trace

__all__ = [
    "REVERSAL_S",
    "FleetModel",
    "HpaBaseline",
    "Request",
    "RunResult",
    "SimulationConfig",
    "TraceShape",
    "count_reversals",
    "departures",
    "describe_departures",
    "generate_trace",
    "read_trace",
    "simulate",
    "write_trace",
]
