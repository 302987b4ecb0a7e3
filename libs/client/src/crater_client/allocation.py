"""What Crater granted a placed task, read from the environment the scheduler hands it.

Every value comes from a `CRATER_*` variable (or, where they are absent, from the file
`CRATER_ALLOCATION_CONFIG` names, which an executing node agent writes). Those that say what
the task may use (GPUs, cores, memory) have no default: a missing one raises
`AllocationError` naming it, because a guessed GPU or core would have the task use what
another task was granted. Only the DataLoader hints have defaults (they tune, they do not grant):

- `CRATER_DATALOADER_NUM_WORKERS` unset: one worker per granted core;
- `CRATER_DATALOADER_PREFETCH_FACTOR` unset: 2 (PyTorch's own default);
- `CRATER_SSD_PATH` unset or empty: `ssd_path` is None (the node has no local SSD).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

DEFAULT_PREFETCH_FACTOR = 2


class AllocationConfig(TypedDict):
    """The shape of AllData's allocation_config.json."""

    gpu_ids: list[int]
    cpu_cores: list[int]
    memory_mb: int
    ssd_path: str | None
    optimal_workers: int
    prefetch_factor: int


class AllocationError(ValueError):
    """A `CRATER_*` variable is missing or malformed: `variable` names it, `reason` says why."""

    def __init__(self, variable: str, reason: str) -> None:
        super().__init__(f"{variable}: {reason}")
        self.variable = variable
        self.reason = reason


@dataclass(frozen=True)
class Placement:
    """Who this task is to Crater: what the monitor needs to report its use."""

    task_id: str
    allocation_id: str | None
    attempt: int
    gateway_url: str | None
    checkpoint_path: str | None
    node: str | None = None


def get_allocation_config(environ: Mapping[str, str] | None = None) -> AllocationConfig:
    """The task's allocation, in allocation_config.json's shape, from `environ`
    (default: this process's environment)."""
    env = _with_config_file(os.environ if environ is None else environ)
    gpu_ids = node_gpu_ids(env)  # empty: a CPU-only task
    cpu_cores = _ids(env, "CRATER_CPU_CORE_IDS", allow_empty=False)
    count = env.get("CRATER_CPU_CORES")
    if count is not None and _int(env, "CRATER_CPU_CORES", 1) != len(cpu_cores):
        raise AllocationError(
            "CRATER_CPU_CORES",
            f"says {count} cores but CRATER_CPU_CORE_IDS lists {len(cpu_cores)}",
        )
    workers = env.get("CRATER_DATALOADER_NUM_WORKERS")
    prefetch = env.get("CRATER_DATALOADER_PREFETCH_FACTOR")
    return AllocationConfig(
        gpu_ids=cuda_numbering(gpu_ids, env.get("CUDA_VISIBLE_DEVICES")),
        cpu_cores=cpu_cores,
        memory_mb=_int(env, "CRATER_MEMORY_MB", 1),
        ssd_path=env.get("CRATER_SSD_PATH") or None,
        optimal_workers=(
            len(cpu_cores) if workers is None else _int(env, "CRATER_DATALOADER_NUM_WORKERS", 0)
        ),
        prefetch_factor=(
            DEFAULT_PREFETCH_FACTOR
            if prefetch is None
            else _int(env, "CRATER_DATALOADER_PREFETCH_FACTOR", 1)
        ),
    )


def node_gpu_ids(environ: Mapping[str, str] | None = None) -> list[int]:
    """The granted cards by their ids on the node (NVML's numbering), whatever CUDA sees."""
    env = _with_config_file(os.environ if environ is None else environ)
    return _ids(env, "CRATER_GPU_IDS", allow_empty=True)


def cuda_numbering(gpu_ids: list[int], visible: str | None) -> list[int]:
    """The granted cards as CUDA numbers them in this process. With CUDA_VISIBLE_DEVICES
    listing them (set by `bind`, a device plugin or a launcher), CUDA counts the visible cards
    from 0, so node card 2 in "2,3" is device 0; without it, the node's ids are CUDA's. So
    `torch.cuda.set_device(cfg["gpu_ids"][0])` is right either way."""
    if not visible or not gpu_ids:
        return gpu_ids
    listed = [v.strip() for v in visible.split(",")]
    if not all(str(g) in listed for g in gpu_ids):
        return gpu_ids  # UUIDs, or other cards: CUDA's numbering cannot be told from ids
    return [listed.index(str(g)) for g in gpu_ids]


def get_placement(environ: Mapping[str, str] | None = None) -> Placement:
    """The task's identity and where to report to; `CRATER_TASK_ID` is required."""
    env = os.environ if environ is None else environ
    task_id = env.get("CRATER_TASK_ID", "").strip()
    if not task_id:
        raise AllocationError("CRATER_TASK_ID", "not set: this does not run as a placed task")
    attempt = env.get("CRATER_ATTEMPT")
    return Placement(
        task_id=task_id,
        allocation_id=env.get("CRATER_ALLOCATION_ID") or None,
        attempt=1 if attempt is None else _int(env, "CRATER_ATTEMPT", 1),
        gateway_url=env.get("CRATER_GATEWAY_URL") or None,
        checkpoint_path=env.get("CRATER_CHECKPOINT_PATH") or None,
        node=env.get("CRATER_NODE_ID") or None,
    )


@dataclass(frozen=True)
class Bound:
    """What `bind` applied: the cores now in this process's affinity, the
    CUDA_VISIBLE_DEVICES in force (None: no GPUs, nothing set), and the granted cards as
    CUDA now numbers them (what `get_allocation_config()` answers from now on)."""

    cpu_cores: list[int]
    cuda_visible_devices: str | None
    gpu_ids: list[int]


def bind(config: AllocationConfig | None = None, *, restrict_gpus: bool = True) -> Bound:
    """Pin this process (and the workers it starts later) to the granted cores, and, unless
    CUDA_VISIBLE_DEVICES is set already, make only the granted GPUs visible.

    Call it before CUDA is initialised (before the first `torch.cuda` call): the variable is
    read once. With it set, CUDA numbers the visible cards from 0, so the first granted GPU is
    CUDA device 0, whatever its id on the node: address cards by `Bound.gpu_ids` (or a fresh
    `get_allocation_config()`), not by a config read before `bind`. `restrict_gpus=False`
    keeps every card visible and the node's ids.
    """
    cfg = get_allocation_config() if config is None else config
    available = os.sched_getaffinity(0)
    missing = sorted(set(cfg["cpu_cores"]) - available)
    if missing:
        raise AllocationError(
            "CRATER_CPU_CORE_IDS",
            f"cores {missing} are not available to this process (it may use {sorted(available)})",
        )
    os.sched_setaffinity(0, cfg["cpu_cores"])
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None and restrict_gpus and cfg["gpu_ids"]:
        visible = ",".join(str(g) for g in cfg["gpu_ids"])
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
    return Bound(sorted(os.sched_getaffinity(0)), visible, cuda_numbering(cfg["gpu_ids"], visible))


def _with_config_file(env: Mapping[str, str]) -> Mapping[str, str]:
    """The environment, completed from the allocation config file a node agent wrote
    (`CRATER_ALLOCATION_CONFIG`: the grant's CRATER_* variables as JSON) when the variables
    themselves are absent (a process started with a cleared environment). Set variables win."""
    path = env.get("CRATER_ALLOCATION_CONFIG")
    if not path or "CRATER_CPU_CORE_IDS" in env:
        return env
    try:
        written = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise AllocationError("CRATER_ALLOCATION_CONFIG", f"{path}: {error}") from None
    if not isinstance(written, dict):
        raise AllocationError("CRATER_ALLOCATION_CONFIG", f"{path} is not a JSON object")
    return {**{k: str(v) for k, v in written.items()}, **env}


def _int(env: Mapping[str, str], name: str, minimum: int) -> int:
    raw = env.get(name)
    if raw is None or not raw.strip():
        raise AllocationError(name, "not set")
    try:
        value = int(raw.strip())
    except ValueError:
        raise AllocationError(name, f"{raw!r} is not a whole number") from None
    if value < minimum:
        raise AllocationError(name, f"{value} is below {minimum}")
    return value


def _ids(env: Mapping[str, str], name: str, *, allow_empty: bool) -> list[int]:
    """A comma-separated list of distinct non-negative ids ("0,1")."""
    raw = env.get(name)
    if raw is None:
        raise AllocationError(name, "not set")
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    if not parts and not allow_empty:
        raise AllocationError(name, "is empty: at least one id is needed")
    ids: list[int] = []
    for part in parts:
        if not part.isdigit():
            raise AllocationError(name, f"{part!r} is not a non-negative whole number")
        ids.append(int(part))
    if len(set(ids)) != len(ids):
        raise AllocationError(name, f"{raw!r} lists an id twice")
    return ids
