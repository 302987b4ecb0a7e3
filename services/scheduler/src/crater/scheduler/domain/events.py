"""Building the outgoing events: grants (with the task's environment and token), ends,
rejections, and the ids every derived event takes from its cause."""

from __future__ import annotations

from uuid import UUID

from crater.contracts import (
    AllocationGranted,
    Disk,
    Event,
    FieldError,
    MetricsFormat,
    NodeTopology,
    ReleaseReason,
    ScoreDetail,
    ScrapeTarget,
    TaskEnded,
    TaskRejected,
    TaskRequest,
    TaskStatus,
    derived_event_id,
)
from crater.contracts.dataloader import dataloader_for_node
from crater.scheduler.domain.cluster import (
    WHOLE,
    Node,
)
from crater.scheduler.domain.config import SchedulerConfig
from crater.scheduler.domain.placement import SAME_NUMA, SAME_PCI_ROOT, Selection, disk_distance
from crater.scheduler.domain.state import Allocation, PendingTask, SchedulerState
from crater.scheduler.domain.tokens import sign_token


def ended(
    task_id: str,
    status: TaskStatus,
    reason: str,
    cause: Event,
    attempt: int = 1,
    allocation_id: str | None = None,
    release_reason: ReleaseReason | None = None,
) -> TaskEnded:
    """The task's end: the one event AllData hears it from."""
    return TaskEnded(
        event_id=derived_event_id(cause.event_id, f"ended:{task_id}"),
        occurred_at=cause.occurred_at,
        task_id=task_id,
        status=status,
        reason=reason[:2048],
        allocation_id=allocation_id,
        release_reason=None if release_reason is None else release_reason.value,
        attempt=attempt,
    )


def rejected(cause: Event, task_id: str, errors: list[FieldError]) -> TaskRejected:
    return TaskRejected(
        event_id=derived_event_id(cause.event_id, f"rejected:{task_id}"),
        occurred_at=cause.occurred_at,
        task_id=task_id,
        errors=errors,
    )


def numa_words(node: Node, selection: Selection) -> str:
    """Where the selection sits, NUMA-wise: `NUMA 1`, or, when it has no one NUMA node (its
    GPUs or cores span several), `across NUMA 0 and 1`."""
    if selection.numa_node is not None:
        return f"NUMA {selection.numa_node}"
    cores = set(selection.cpu_cores)
    homes = {n.id for n in node.topology.numa_nodes if cores & set(n.cpus)}
    gpus = {g.index: g.numa_node for g in node.topology.gpus}
    homes |= {h for i in selection.gpu_ids if (h := gpus.get(i)) is not None}
    spanned = [str(h) for h in sorted(homes)]
    if len(spanned) > 1:
        return f"across NUMA {', '.join(spanned[:-1])} and {spanned[-1]}"
    return f"NUMA {spanned[0]}" if spanned else "NUMA unknown"


def granted(
    state: SchedulerState,
    task: PendingTask,
    node: Node,
    selection: Selection,
    allocation: Allocation,
    score: float,
    details: list[ScoreDetail],
    cause: Event,
    event_id: UUID | None = None,
) -> AllocationGranted:
    """The grant of `allocation` (one gang member): where, what, the task's environment and
    its reservation token, and why this node. `event_id`: the grant's, when the caller has
    derived it already (the allocation's id comes from it)."""
    request = task.request
    size = task.gang_size
    member = allocation.gang_index
    allocation_id = allocation.allocation_id
    expires = allocation.expires_at
    event_id = event_id or derived_event_id(
        cause.event_id,
        f"granted:{request.task_id}" + (f":{member}" if member else "") + attempt_key(task.attempt),
    )
    ssd = task_ssd(node, selection)
    checkpoint = checkpoint_path(state.config, ssd, selection.disk is not None, request.task_id)
    best = max(details, key=lambda d: d.score).plugin if details else "only fit"
    gang = f"gang member {member + 1}/{size}; " if size > 1 else ""
    loan = ""
    if allocation.borrowed_from is not None:
        loan = (
            f"; borrowed {allocation.usage.brief()} from pool {allocation.borrowed_from}"
            " (reclaimable)"
        )
    borrowing = state.quotas.borrowing(request.tenant)
    if borrowing and member + 1 == size:  # after the last member: what the task takes
        loan += (
            f"; tenant {request.tenant} over its guarantee: borrowing {borrowing.brief()}"
            " (reclaimable)"
        )
    if member + 1 == size and (queued := state.quotas.queue_loan(request.tenant)):
        loan += f"; {queued}"
    token = sign_token(
        state.config.token_secret, allocation_id, request.task_id, node.name, expires
    )
    env = environment(state, task, node, selection, allocation, checkpoint, token, ssd)
    return AllocationGranted(
        event_id=event_id,
        occurred_at=cause.occurred_at,
        allocation_id=allocation_id,
        task_id=request.task_id,
        node=node.name,
        pool=request.pool,
        tenant=request.tenant,
        gpu_ids=list(selection.gpu_ids),
        gpu_memory_mb=task.demand.gpu_memory_mb,
        gpu_model=(node.gpu_model or None) if selection.gpu_ids else None,
        # a replica on a lent card holds none of it (its lender does): its own share
        gpu_milli=allocation.gpu_milli or task.demand.gpu_milli or WHOLE,
        mig_profile=selection.mig_profile,
        cpu_cores=list(selection.cpu_cores),
        numa_node=selection.numa_node,
        memory_mb=task.demand.memory_mb,
        checkpoint_path=checkpoint,
        disk=selection.disk,
        reservation_token=token,
        reservation_expires_at=expires,
        score=round(score, 4),
        scores=details,
        explanation=(
            f"{gang}{node.name}: score {score:.3f} (strongest: {best}); "
            f"GPU memory {task.demand.gpu_memory_mb} MiB per card "
            f"({task.demand.gpu_memory_source}); {numa_words(node, selection)}"
            f"{disk_words(node, selection, allocation)}{fabric_words(node)}{loan}"
            + (f"; {task.model_choice}" if task.model_choice else "")
        ),
        environment=env,
        gang_index=member,
        gang_size=size,
        attempt=task.attempt,
        borrowed_from=allocation.borrowed_from,
        scrape=scrape_target(request, node) if member == 0 else None,
    )


def fabric_words(node: Node) -> str:
    """Where the node sits in the network fabric, spine down (`; fabric s1/leaf-3/nvl-7`);
    nothing where it declares no place, so such grants read as before."""
    fabric = node.topology.fabric
    if fabric is None:
        return ""
    names = [fabric.spine, fabric.leaf, fabric.nvlink_domain]
    return "; fabric " + "/".join(name or "-" for name in names)


def scrape_target(request: TaskRequest, node: Node) -> ScrapeTarget | None:
    """Where the autoscaler reads an inference replica's load: the request's
    `inference_config.metrics` with the node's hostname (None: nothing to scrape). A replica
    spread over a gang is read on its first member's node (the engine's head serves them)."""
    config = request.inference_config
    metrics = config.metrics if config is not None else None
    if metrics is None or metrics.format is MetricsFormat.CRATER:
        return None
    host = node.topology.hostname
    if metrics.url is not None:
        url = metrics.url.replace("{host}", host)
    else:
        bracketed = f"[{host}]" if ":" in host else host  # an IPv6 address
        url = f"http://{bracketed}:{metrics.port}{metrics.path}"
    service = request.anti_affinity.group or request.task_id
    return ScrapeTarget(service=service, format=metrics.format, url=url)


def disk_words(node: Node, selection: Selection, allocation: Allocation) -> str:
    """The SSD chosen and why: `; SSD nvme1n1 on NUMA 1 with GPUs 4,5, 100 GB held, 1400 GB
    left`; empty when none was chosen."""
    if selection.disk is None:
        return ""
    disk = next(d for d in node.topology.disks if d.name == selection.disk)
    gpus = node.topology.gpus
    roots = {r for i in selection.gpu_ids if (r := gpus[i].pci_root) is not None}
    homes = {h for i in selection.gpu_ids if (h := gpus[i].numa_node) is not None}
    owner = f"GPUs {','.join(map(str, selection.gpu_ids))}" if selection.gpu_ids else "cores"
    if not selection.gpu_ids and selection.numa_node is not None:
        homes = {selection.numa_node}
    distance = disk_distance(disk, roots, homes)
    if distance == SAME_PCI_ROOT:
        where = f"on the PCIe root of {owner} ({disk.pci_root})"
    elif distance == SAME_NUMA:
        where = f"on NUMA {disk.numa_node} with {owner}"
    else:
        numa = "NUMA unknown" if disk.numa_node is None else f"NUMA {disk.numa_node}"
        where = f"on {numa}, away from {owner} (none nearer serves)"
    left = node.disk_free_gb.get(disk.name, 0)
    return f"; SSD {disk.name} {where}, {allocation.disk_gb} GB held, {left} GB left"


def task_ssd(node: Node, selection: Selection) -> Disk | None:
    """The SSD a task reads its data from and checkpoints to: the one chosen with its GPUs,
    else the node's first mounted one."""
    if selection.disk is not None:
        return next(d for d in node.topology.disks if d.name == selection.disk)
    return local_ssd(node.topology)


def checkpoint_path(config: SchedulerConfig, ssd: Disk | None, chosen: bool, task_id: str) -> str:
    """On the task's SSD when it is mounted and was chosen for it (its space is held there)
    or is an NVMe drive, else under the configured root."""
    if ssd is not None and (ssd.nvme or chosen) and ssd.mount_path:
        return f"{ssd.mount_path.rstrip('/')}/crater/checkpoints/{task_id}"
    return f"{config.checkpoint_root}/{task_id}"


def environment(
    state: SchedulerState,
    task: PendingTask,
    node: Node,
    selection: Selection,
    allocation: Allocation,
    checkpoint: str,
    token: str,
    ssd: Disk | None,
) -> dict[str, str]:
    """What the task is handed (TASK_ENVIRONMENT names and explains each variable), the
    DataLoader figures fitted to this node: the task's SSD, the cores and memory granted."""
    request = task.request
    predicted = task.prediction
    wanted = (
        None
        if predicted is None
        else (predicted.dataloader_num_workers, predicted.dataloader_prefetch_factor)
    )
    workers, prefetch = dataloader_for_node(
        wanted,
        len(selection.cpu_cores),
        len(selection.gpu_ids),
        allocation.memory_mb,
        ssd,
    )
    env = {
        "CRATER_TASK_ID": request.task_id,
        "CRATER_ALLOCATION_ID": allocation.allocation_id,
        "CRATER_ATTEMPT": str(allocation.attempt),
        "CRATER_NODE_ID": node.name,
        "CRATER_POOL": request.pool,
        "CRATER_RESERVATION_TOKEN": token,
        "CRATER_GPU_IDS": ",".join(map(str, selection.gpu_ids)),
        # a count: AllData's scripts read int(os.getenv("CRATER_CPU_CORES"))
        "CRATER_CPU_CORES": str(len(selection.cpu_cores)),
        "CRATER_CPU_CORE_IDS": ",".join(map(str, selection.cpu_cores)),
        "CRATER_NUMA_NODE": "" if selection.numa_node is None else str(selection.numa_node),
        "CRATER_MEMORY_MB": str(allocation.memory_mb),
        "CRATER_CHECKPOINT_PATH": checkpoint,
        "CRATER_PRECISION": request.model_spec.precision.value,
        "CRATER_DATALOADER_NUM_WORKERS": str(workers),
        "CRATER_DATALOADER_PREFETCH_FACTOR": str(prefetch),
    }
    if ssd is not None and ssd.mount_path:
        env["CRATER_SSD_PATH"] = ssd.mount_path
    if selection.disk is not None:
        env["CRATER_SSD_DEVICE"] = selection.disk
    if selection.mig_profile is not None:
        env["CRATER_MIG_PROFILE"] = selection.mig_profile
    if task.gang_size > 1:
        # rank 0 is granted first: its allocation is the task's own by now
        leader = state.allocations[request.task_id].node
        env["CRATER_GANG_RANK"] = str(allocation.gang_index)
        env["CRATER_GANG_SIZE"] = str(task.gang_size)
        env["CRATER_GANG_LEADER_NODE"] = leader
        leader_node = state.cluster.get(leader)
        if leader_node is not None:
            env["CRATER_MASTER_ADDR"] = leader_node.topology.hostname
    if state.config.gateway_url is not None:
        env["CRATER_GATEWAY_URL"] = state.config.gateway_url
    return env


def local_ssd(topology: NodeTopology) -> Disk | None:
    """The node's mounted local SSD a task reads its data from and checkpoints to: the
    first NVMe drive, else the first other SSD; None: it has none."""
    mounted = [d for d in topology.disks if d.mount_path and not d.rotational]
    nvme = [d for d in mounted if d.nvme]
    first = nvme or mounted
    return first[0] if first else None


def as_reported(reason: ReleaseReason, cause: Event) -> str:
    """An end as a report told it: by the launcher (with the token) or the node, with the
    exit code and the message it gave."""
    launcher = getattr(cause, "reservation_token", None) is not None
    why = f"{reason.value} as its {'launcher' if launcher else 'node'} reported"
    if getattr(cause, "out_of_memory", False):
        why += " out of memory"
    code = getattr(cause, "exit_code", None)
    if code is not None:
        why += f" (exit code {code})"
    reported = getattr(cause, "message", None)
    if reported:
        why += f": {reported}"
    return why


def attempt_key(attempt: int) -> str:
    """An attempt's mark in derived event ids; the first attempt's ids are as they were."""
    return f":a{attempt}" if attempt > 1 else ""


def member_key(allocation: Allocation) -> str:
    """A gang member's name in derived event ids; the first member keeps the task's own."""
    index = allocation.gang_index
    key = f"{allocation.task_id}:{index}" if index else allocation.task_id
    return key + attempt_key(allocation.attempt)
