"""What the probe offers outside its service (the CLI's `probe`, `diagnose`,
`topology-export`, `logs`): this machine's discovery, sampling and measurement, the health
checks, the topology as DOT, the simulated fleets, and the executing agent's task logs."""

from crater.probe.adapters.host import HostSampler
from crater.probe.adapters.measure import Bounds, measure_node
from crater.probe.adapters.nvme import disks_wear
from crater.probe.adapters.nvml import GpuSampler
from crater.probe.adapters.sysfs import discover_local
from crater.probe.domain.dot import topology_to_dot
from crater.probe.domain.health import evaluate
from crater.probe.executor import find_logs, log_finished
from crater.probe.sim.fleet import build_fleet, load_fleet, read_fleet_spec

__all__ = [
    "Bounds",
    "GpuSampler",
    "HostSampler",
    "build_fleet",
    "discover_local",
    "disks_wear",
    "evaluate",
    "find_logs",
    "load_fleet",
    "log_finished",
    "measure_node",
    "read_fleet_spec",
    "topology_to_dot",
]
