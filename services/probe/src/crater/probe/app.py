"""Probe wiring: publish the topology, metrics and health of this machine (local mode) or of
a simulated fleet (fleet mode), and in fleet mode run the tasks placed on simulated nodes.

The settings are in settings.py; what is reported on (this machine, or a simulated fleet) in
service_layer/nodes.py, the rounds and their loops in service_layer/reporting.py, the task
runner's subscriptions in service_layer/tasks.py. Here: which of them a mode takes, and the
startup and shutdown hooks that open, start and stop them.
"""

from __future__ import annotations

import logging

from faststream.asgi import AsgiFastStream

from crater.probe.adapters.sysfs import hostname
from crater.probe.domain.topology import node_id_from_hostname
from crater.probe.executor import TaskExecutor
from crater.probe.service_layer.metrics import ProbeMetrics
from crater.probe.service_layer.nodes import FleetNodes, LocalNode, Nodes
from crater.probe.service_layer.reporting import Publisher, Reporting
from crater.probe.service_layer.tasks import subscribe_runner, subscribe_served
from crater.probe.settings import ProbeSettings
from crater.probe.sim.fleet import open_fleet
from crater.probe.sim.runner import TaskRunner
from crater.probe.sim.simulation import FleetSimulator
from crater.runtime.bus import publish
from crater.runtime.nats_permissions import agent_consumer
from crater.runtime.service import Service, create_service, serve

__all__ = ["ProbeSettings", "build", "create_app", "main"]

log = logging.getLogger("crater.probe")


def build(settings: ProbeSettings | None = None) -> tuple[Service, AsgiFastStream]:
    settings = settings or ProbeSettings()
    service = create_service("probe", settings)
    metrics = ProbeMetrics(service.registry, settings.metrics_max_nodes)
    publisher = Publisher(service.broker, metrics)

    nodes: Nodes
    runner: TaskRunner | None = None
    if settings.mode == "fleet":
        # Loaded now, not on start: the runner's durable consumers are named after the fleet.
        fleet = open_fleet(settings.fleet_file, settings.seed)
        faults = fleet.faults if settings.faults else ()
        if faults:
            log.info(
                "injecting %d faults: %s",
                len(faults),
                ", ".join(f"{f.kind} on {f.node} at {f.at_seconds:g} s" for f in faults),
            )
        simulator = FleetSimulator(fleet.nodes, fleet.seed, faults)
        nodes = FleetNodes(simulator, inventory=settings.report_inventory)
        runner = TaskRunner(
            simulator,
            lambda event: publish(service.broker, event),
            seed=fleet.seed,
            seconds_min=settings.task_seconds_min,
            seconds_max=settings.task_seconds_max,
            start_max_seconds=settings.task_start_seconds,
            failure_rate=settings.task_failure_rate,
        )
        subscribe_runner(service, runner, metrics, f"fleet-{fleet.name}")
        subscribe_served(service, runner, f"fleet-{fleet.name}")
        service.state = runner
    else:
        nodes = LocalNode(
            settings,
            on_xid=lambda xid: metrics.xids.labels(
                xid=str(xid.code),
                action=xid.action.value,
                catalog="known" if xid.known else "unknown",
            ).inc(),
            on_pcie=lambda outcome: metrics.pcie_measurements.labels(outcome=outcome).inc(),
        )
    executor: TaskExecutor | None = None
    if settings.execute:
        node_id = settings.node_id or node_id_from_hostname(hostname(settings.host_root))
        executor = TaskExecutor(
            node_id,
            lambda event: publish(service.broker, event),
            state_dir=settings.state_dir,
            kill_grace_seconds=settings.kill_grace_seconds,
            poll_seconds=settings.execute_poll_seconds,
            cgroup_root=settings.cgroup_root,
        )
        subscribe_runner(service, executor, metrics, agent_consumer(node_id))
        service.state = executor
        if isinstance(nodes, LocalNode) and settings.report_inventory:
            nodes.inventory = executor.inventory

    reporting = Reporting(settings, nodes, metrics, publisher, runner)

    async def open_nodes() -> None:
        await nodes.open()
        if executor is not None:
            await executor.start()

    async def stop_reporting() -> None:
        await reporting.stop()
        if runner is not None:
            await runner.close()
        if executor is not None:
            await executor.close()  # its tasks go on, for the next agent to re-attach
        await nodes.close()

    service.on_startup.append(open_nodes)
    service.after_startup.append(reporting.start)
    service.on_shutdown.append(stop_reporting)
    return service, service.asgi()


def create_app() -> AsgiFastStream:
    """For `faststream run --factory crater.probe.app:create_app`."""
    return build()[1]


def main() -> None:
    service, app = build()
    serve(app, service)


if __name__ == "__main__":
    main()
