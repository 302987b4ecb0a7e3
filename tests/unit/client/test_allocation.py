"""The allocation a placed task reads from the environment Crater hands it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from crater_client import AllocationError, bind, get_allocation_config, get_placement
from tests.support.alldata import fixture

# What the scheduler sets for AllData's allocation_config.json example.
ENV = {
    "CRATER_GPU_IDS": "0,1",
    "CRATER_CPU_CORES": "4",
    "CRATER_CPU_CORE_IDS": "2,3,4,5",
    "CRATER_MEMORY_MB": "16384",
    "CRATER_SSD_PATH": "/mnt/ssd0",
    "CRATER_DATALOADER_NUM_WORKERS": "8",
    "CRATER_DATALOADER_PREFETCH_FACTOR": "3",
    "CRATER_TASK_ID": "train-1",
    "CRATER_ALLOCATION_ID": "alloc-1",
    "CRATER_ATTEMPT": "2",
    "CRATER_GATEWAY_URL": "http://gateway:8080",
}


def test_the_config_is_alldata_s_allocation_config_json() -> None:
    expected = json.loads(fixture("allocation_config.json"))
    config = get_allocation_config(ENV)
    assert config == expected
    assert list(config) == list(expected)  # the same keys, in the same order


def test_dataloader_hints_and_ssd_take_documented_defaults() -> None:
    env = {
        k: v
        for k, v in ENV.items()
        if k
        not in {
            "CRATER_DATALOADER_NUM_WORKERS",
            "CRATER_DATALOADER_PREFETCH_FACTOR",
            "CRATER_SSD_PATH",
            "CRATER_CPU_CORES",
        }
    }
    config = get_allocation_config(env)
    assert (config["optimal_workers"], config["prefetch_factor"]) == (4, 2)
    assert config["ssd_path"] is None
    assert get_allocation_config({**env, "CRATER_GPU_IDS": ""})["gpu_ids"] == []  # CPU task


@pytest.mark.parametrize(
    ("change", "variable", "reason"),
    [
        ({"CRATER_GPU_IDS": None}, "CRATER_GPU_IDS", "not set"),
        ({"CRATER_CPU_CORE_IDS": None}, "CRATER_CPU_CORE_IDS", "not set"),
        ({"CRATER_MEMORY_MB": None}, "CRATER_MEMORY_MB", "not set"),
        ({"CRATER_GPU_IDS": "0,x"}, "CRATER_GPU_IDS", "'x' is not a non-negative"),
        ({"CRATER_GPU_IDS": "1,1"}, "CRATER_GPU_IDS", "lists an id twice"),
        ({"CRATER_CPU_CORE_IDS": ""}, "CRATER_CPU_CORE_IDS", "is empty"),
        ({"CRATER_CPU_CORES": "8"}, "CRATER_CPU_CORES", "says 8 cores but"),
        ({"CRATER_MEMORY_MB": "lots"}, "CRATER_MEMORY_MB", "'lots' is not a whole number"),
        ({"CRATER_DATALOADER_NUM_WORKERS": "-1"}, "CRATER_DATALOADER_NUM_WORKERS", "below 0"),
    ],
)
def test_a_missing_or_bad_variable_is_named_with_the_reason(
    change: dict[str, str | None], variable: str, reason: str
) -> None:
    env = {k: v for k, v in {**ENV, **change}.items() if v is not None}
    with pytest.raises(AllocationError) as raised:
        get_allocation_config(env)
    assert raised.value.variable == variable
    assert reason in raised.value.reason


def test_the_placement_names_the_task_and_where_to_report() -> None:
    placement = get_placement(ENV)
    assert (placement.task_id, placement.allocation_id, placement.attempt) == (
        "train-1",
        "alloc-1",
        2,
    )
    assert placement.gateway_url == "http://gateway:8080"
    assert placement.node is None
    assert get_placement({**ENV, "CRATER_NODE_ID": "a100-01"}).node == "a100-01"
    with pytest.raises(AllocationError, match="CRATER_TASK_ID"):
        get_placement({})


def _bind_in_child(env: dict[str, str]) -> dict[str, object]:
    """bind() changes the process it runs in: run it in a child, report what it saw."""
    code = (
        "import json, os; from crater_client import bind; b = bind(); "
        "print(json.dumps({'cores': sorted(os.sched_getaffinity(0)), 'bound': b.cpu_cores, "
        "'cuda': os.environ.get('CUDA_VISIBLE_DEVICES')}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_bind_pins_the_process_to_granted_cores_and_makes_granted_gpus_visible() -> None:
    mine = sorted(os.sched_getaffinity(0))
    granted = mine[-1:]  # a core this process really has
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    env |= {**ENV, "CRATER_CPU_CORES": "1", "CRATER_CPU_CORE_IDS": str(granted[0])}
    seen = _bind_in_child(env)
    assert seen == {"cores": granted, "bound": granted, "cuda": "0,1"}
    # one already chosen (by the runtime, or by hand) is left alone
    assert _bind_in_child({**env, "CUDA_VISIBLE_DEVICES": "1"})["cuda"] == "1"


def test_bind_refuses_cores_this_process_cannot_use() -> None:
    config = get_allocation_config({**ENV, "CRATER_CPU_CORES": "1", "CRATER_CPU_CORE_IDS": "4095"})
    before = os.sched_getaffinity(0)
    with pytest.raises(AllocationError, match="CRATER_CPU_CORE_IDS") as raised:
        bind(config)
    assert "4095" in raised.value.reason
    assert os.sched_getaffinity(0) == before


@pytest.mark.parametrize(
    ("granted", "visible", "cuda"),
    [
        ("2,3", None, [2, 3]),  # every card visible: the node's ids are CUDA's
        ("2,3", "2,3", [0, 1]),  # only the granted ones (bind, a device plugin): from 0
        ("2,3", "0,1,2,3", [2, 3]),
        ("3,2", "2,3", [1, 0]),
        ("2,3", "GPU-8f1c,GPU-77aa", [2, 3]),  # UUIDs: not ours to renumber
    ],
)
def test_gpu_ids_are_cuda_s_numbers_in_this_process(
    granted: str, visible: str | None, cuda: list[int]
) -> None:
    env = {**ENV, "CRATER_GPU_IDS": granted}
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    assert get_allocation_config(env)["gpu_ids"] == cuda


def test_after_bind_the_first_granted_card_is_cuda_device_0() -> None:
    """AllData's script: set_device(cfg["gpu_ids"][0]) addresses the granted card after bind."""
    cores = sorted(os.sched_getaffinity(0))[:1]
    env = {**ENV, "CRATER_GPU_IDS": "2,3", "CRATER_CPU_CORES": "1"}
    env["CRATER_CPU_CORE_IDS"] = ",".join(map(str, cores))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    script = (
        "import json, crater_client\n"
        "bound = crater_client.bind()\n"
        "print(json.dumps([bound.cuda_visible_devices, bound.gpu_ids,"
        " crater_client.get_allocation_config()['gpu_ids']]))\n"
    )
    clean = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    done = subprocess.run(
        [sys.executable, "-c", script], env={**clean, **env}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["2,3", [0, 1], [0, 1]]
