"""What a placed task is handed: the environment AllData injects into its pod, the
DataLoader figures fitted to the node chosen, and how long the placement is held."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from crater.contracts import (
    TASK_ENVIRONMENT,
    AllocationGranted,
    AllocationReleased,
    Disk,
    NodeTopology,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
)
from crater.contracts.dataloader import dataloader_for_node, disk_class
from crater.scheduler.adapters.pools_file import PoolsFileError, parse_pools
from crater.scheduler.app import SchedulerSettings
from crater.scheduler.domain.core import Scheduler, SchedulerConfig
from crater.scheduler.domain.inputs import ReservationArmed
from tests.support.topologies import node
from tests.unit.scheduler.test_core import at, cluster, profiled

NVME = Disk(name="nvme0n1", capacity_gb=3800, rotational=False, nvme=True, mount_path="/mnt/nvme0")
SATA = Disk(name="sda", capacity_gb=960, rotational=False, nvme=False, mount_path="/mnt/ssd0")
HDD = Disk(name="sdb", capacity_gb=8000, rotational=True, nvme=False, mount_path="/data")


def with_disks(topology: NodeTopology, *disks: Disk) -> NodeTopology:
    return topology.model_copy(update={"disks": list(disks)})


# -- the DataLoader figures, for the node chosen ----------------------------------------------


def test_alldata_examples_a100_with_fast_nvme_and_v100_with_sata() -> None:
    # AllData's allocation_config: 2 GPUs, 16 GiB; the predictor's figure from 32 cores is 8/2
    assert dataloader_for_node((8, 2), cpu_cores=32, gpus=2, memory_mb=16384, disk=NVME) == (8, 3)
    assert dataloader_for_node((8, 2), cpu_cores=32, gpus=2, memory_mb=16384, disk=SATA) == (4, 1)
    # without a prediction: the figure the cores allow, fitted the same way
    assert dataloader_for_node(None, cpu_cores=32, gpus=2, memory_mb=16384, disk=NVME) == (8, 3)
    assert dataloader_for_node(None, cpu_cores=16, gpus=1, memory_mb=16384, disk=SATA) == (4, 1)


def test_the_node_lowers_what_the_pipeline_wants_never_raises_it() -> None:
    assert dataloader_for_node((3, 2), cpu_cores=32, gpus=2, memory_mb=16384, disk=NVME) == (3, 3)
    # 4 cores for 2 GPU processes: one worker each beside its loop
    assert dataloader_for_node((8, 2), cpu_cores=4, gpus=2, memory_mb=65536, disk=NVME) == (1, 3)
    # 6 GiB for 2 processes: 3 GiB each, 2 GiB of it the process itself, room for 2 workers
    assert dataloader_for_node((8, 2), cpu_cores=32, gpus=2, memory_mb=6144, disk=NVME) == (2, 3)
    # no cores to spare: no workers, and so no prefetch
    assert dataloader_for_node((8, 2), cpu_cores=2, gpus=2, memory_mb=65536, disk=NVME) == (0, 1)


def test_without_a_local_ssd_the_prediction_stands() -> None:
    assert dataloader_for_node((6, 4), cpu_cores=32, gpus=2, memory_mb=65536, disk=None) == (6, 4)
    assert dataloader_for_node((6, 4), cpu_cores=32, gpus=2, memory_mb=65536, disk=HDD) == (6, 4)


def test_an_nvme_drive_measured_slow_reads_like_sata() -> None:
    fast_class = disk_class(NVME)
    assert fast_class is not None
    assert fast_class.name == "nvme"
    slow = NVME.model_copy(update={"read_latency_us_p50": 450.0})
    few = NVME.model_copy(update={"random_read_iops": 2_000.0})
    fast = NVME.model_copy(update={"read_latency_us_p50": 80.0, "random_read_iops": 12_000.0})
    assert dataloader_for_node((8, 2), 32, 2, 16384, slow) == (4, 1)
    assert dataloader_for_node((8, 2), 32, 2, 16384, few) == (4, 1)
    assert dataloader_for_node((8, 2), 32, 2, 16384, fast) == (8, 3)


# -- the environment of a grant ---------------------------------------------------------------


def grant(scheduler: Scheduler, task_id: str, **needs: Any) -> AllocationGranted:
    [granted] = scheduler.handle(profiled(task_id, **needs))
    assert isinstance(granted, AllocationGranted)
    return granted


def test_the_environment_names_every_variable_with_alldata_meanings() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=8))
    granted = grant(scheduler, "t1", gpus=2, cores=8, mem=16384)
    env = granted.environment
    assert env["CRATER_GPU_IDS"] == "0,1"
    assert env["CRATER_CPU_CORES"] == "8"  # a count: int(os.getenv("CRATER_CPU_CORES"))
    assert env["CRATER_CPU_CORE_IDS"] == ",".join(map(str, granted.cpu_cores))
    assert len(granted.cpu_cores) == 8
    assert env["CRATER_NUMA_NODE"] == "0"
    assert env["CRATER_MEMORY_MB"] == str(granted.memory_mb)
    assert env["CRATER_SSD_PATH"] == "/mnt/nvme0"
    assert env["CRATER_CHECKPOINT_PATH"] == "/mnt/nvme0/crater/checkpoints/t1"
    assert env["CRATER_PRECISION"] == "fp16"  # the model_config default
    assert (env["CRATER_TASK_ID"], env["CRATER_ATTEMPT"]) == ("t1", "1")
    assert env["CRATER_ALLOCATION_ID"] == granted.allocation_id
    assert (env["CRATER_NODE_ID"], env["CRATER_POOL"]) == ("a100-01", granted.pool)
    # the prediction wanted 3 workers, prefetch 2; the node's NVMe sets prefetch 3
    assert (env["CRATER_DATALOADER_NUM_WORKERS"], env["CRATER_DATALOADER_PREFETCH_FACTOR"]) == (
        "3",
        "3",
    )
    for absent in ("CRATER_GATEWAY_URL", "CRATER_MIG_PROFILE", "CRATER_GANG_RANK"):
        assert absent not in env
    assert set(env) <= set(TASK_ENVIRONMENT)


def test_the_dataloader_figures_follow_the_node_actually_chosen() -> None:
    sata_only = with_disks(
        node("v100-01", gpus=4, gpu_model="Tesla V100", gpu_memory_mb=32768), SATA
    )
    scheduler, _ = cluster(sata_only)
    env = grant(scheduler, "t", gpus=2, cores=16, gpu_mb=20000).environment
    assert env["CRATER_SSD_PATH"] == "/mnt/ssd0"
    # a SATA SSD: checkpoints stay under the configured root
    assert env["CRATER_CHECKPOINT_PATH"] == "/var/lib/crater/checkpoints/t"
    assert (env["CRATER_DATALOADER_NUM_WORKERS"], env["CRATER_DATALOADER_PREFETCH_FACTOR"]) == (
        "3",
        "1",
    )
    bare = with_disks(node("bare-01", gpus=4))
    scheduler, _ = cluster(bare)
    env = grant(scheduler, "t", gpus=2, cores=16).environment
    assert "CRATER_SSD_PATH" not in env
    assert env["CRATER_DATALOADER_PREFETCH_FACTOR"] == "2"  # the prediction's, no disk to fit


def test_gang_members_are_told_their_rank_and_rank_zeros_host() -> None:
    scheduler, _ = cluster(node("a", gpus=2), node("b", gpus=2))
    grants = scheduler.handle(profiled("g", gpus=2, gang_size=2))
    assert all(isinstance(g, AllocationGranted) for g in grants)
    first, second = (g.environment for g in grants if isinstance(g, AllocationGranted))
    leader = grants[0].node  # type: ignore[union-attr]
    assert (first["CRATER_GANG_RANK"], second["CRATER_GANG_RANK"]) == ("0", "1")
    assert first["CRATER_GANG_SIZE"] == second["CRATER_GANG_SIZE"] == "2"
    assert first["CRATER_MASTER_ADDR"] == second["CRATER_MASTER_ADDR"] == leader
    assert second["CRATER_GANG_LEADER_NODE"] == leader
    assert first["CRATER_ALLOCATION_ID"] != second["CRATER_ALLOCATION_ID"]


def test_the_gateway_url_is_handed_when_configured() -> None:
    scheduler = Scheduler(SchedulerConfig(gateway_url="https://crater.example:8080"))
    for event in cluster(node("a100-01", gpus=1))[1]:
        scheduler.handle(event)
    env = grant(scheduler, "t").environment
    assert env["CRATER_GATEWAY_URL"] == "https://crater.example:8080"


def test_a_gateway_url_that_is_not_http_is_refused_naming_the_setting() -> None:
    with pytest.raises(ValidationError, match="gateway_url"):
        SchedulerSettings(gateway_url="crater.example:8080")


# -- the reservation timeout: task > pool > default -------------------------------------------


def expires_after(config: SchedulerConfig, **needs: Any) -> timedelta:
    """How long after its arming an unconfirmed grant lives: it is kept at the expiry and
    released right after."""
    scheduler = Scheduler(config)
    for event in cluster(node("a100-01", gpus=1, pool="p"), node("b", gpus=1))[1]:
        scheduler.handle(event)
    granted = grant(scheduler, "t", when=1, **needs)
    scheduler.handle(ReservationArmed.of(granted, at(2)))
    lifetime = granted.reservation_expires_at - at(1)
    expiry = (at(2) + lifetime - at(0)).total_seconds()
    just_before = TaskStatusReported(occurred_at=at(expiry - 0.5), task_id="x", status="running")
    assert scheduler.handle(just_before) == []
    after = TaskStatusReported(occurred_at=at(expiry + 0.5), task_id="x", status="running")
    released, *_ = scheduler.handle(after)
    assert isinstance(released, AllocationReleased)
    assert released.reason == "expired"
    return lifetime


def test_the_default_reservation_is_30_seconds_and_configurable_in_ms() -> None:
    assert expires_after(SchedulerConfig()) == timedelta(seconds=30)
    assert expires_after(SchedulerConfig(reservation_timeout_ms=45_000)) == timedelta(seconds=45)


def test_a_pools_reservation_timeout_beats_the_default() -> None:
    pools = parse_pools("pools: {p: {reservation_timeout_ms: 15000}}")
    config = SchedulerConfig(reservation_timeout_ms=45_000, pools=pools)
    assert expires_after(config, pool="p") == timedelta(seconds=15)
    assert expires_after(config) == timedelta(seconds=45)  # the default pool: no override


def test_a_tasks_own_reservation_timeout_beats_its_pools() -> None:
    pools = parse_pools("pools: {p: {reservation_timeout_ms: 15000}}")
    config = SchedulerConfig(pools=pools)
    own = expires_after(config, pool="p", reservation_timeout_ms=2_500)
    assert own == timedelta(milliseconds=2_500)


@pytest.mark.parametrize("value", [999, 3_600_001, "soon"])
def test_a_reservation_timeout_out_of_bounds_is_refused_naming_the_field(value: object) -> None:
    body = {"task_id": "t", "task_type": "training", "model_config": {"name": "m"}}
    with pytest.raises(ValidationError) as refused:
        TaskRequest.model_validate({**body, "reservation_timeout_ms": value})
    [error] = refused.value.errors()
    assert error["loc"] == ("reservation_timeout_ms",)
    with pytest.raises(PoolsFileError, match=r"pools\.p\.reservation_timeout_ms"):
        parse_pools(f"pools: {{p: {{reservation_timeout_ms: {value}}}}}")
    with pytest.raises(ValidationError, match="reservation_timeout_ms"):
        SchedulerSettings(reservation_timeout_ms=value)


def test_the_old_seconds_setting_still_works_alone() -> None:
    assert SchedulerSettings(reservation_seconds=45).reservation_timeout_ms == 45_000
    assert SchedulerSettings().reservation_timeout_ms == 30_000
    with pytest.raises(ValidationError, match="reservation_seconds"):
        SchedulerSettings(reservation_seconds=45, reservation_timeout_ms=15_000)


def test_a_confirmed_reservation_outlives_its_timeout() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=1))
    granted = grant(scheduler, "t", reservation_timeout_ms=1_000)
    scheduler.handle(ReservationArmed.of(granted, at(1)))
    running = TaskStatusReported(occurred_at=at(1.5), task_id="t", status=TaskStatus.RUNNING)
    assert scheduler.handle(running) == []
    later = TaskStatusReported(occurred_at=at(60), task_id="x", status=TaskStatus.RUNNING)
    assert scheduler.handle(later) == []
