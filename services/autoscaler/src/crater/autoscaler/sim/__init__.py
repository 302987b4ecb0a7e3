"""Trace replay: a simulated inference fleet driven by Crater's policy or an HPA baseline."""

from crater.autoscaler.sim.fleet import (
    FleetModel,
    HpaBaseline,
    RunResult,
    SimulationConfig,
    simulate,
)
from crater.autoscaler.sim.trace import Request, TraceShape, generate_trace, read_trace, write_trace

__all__ = [
    "FleetModel",
    "HpaBaseline",
    "Request",
    "RunResult",
    "SimulationConfig",
    "TraceShape",
    "generate_trace",
    "read_trace",
    "simulate",
    "write_trace",
]
