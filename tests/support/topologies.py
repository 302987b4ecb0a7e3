"""Small hand-made node topologies for tests of pure logic."""

from __future__ import annotations

from crater.contracts import Cpu, Disk, FabricPlace, Gpu, NodeTopology, NumaNode


def node(
    name: str,
    *,
    gpus: int = 0,
    gpu_model: str = "NVIDIA A100-SXM4-80GB",
    gpu_memory_mb: int = 81920,
    numa_nodes: int = 2,
    cores: int = 32,
    memory_mb: int = 512_000,
    pool: str = "default",
    nvlink: bool = True,
    flags: tuple[str, ...] = ("avx", "avx2", "avx512f"),
    fabric: FabricPlace | None = None,
) -> NodeTopology:
    per_numa = cores // numa_nodes
    gpus_per_numa = max(gpus // numa_nodes, 1)
    return NodeTopology(
        node_id=name,
        hostname=name,
        pool=pool,
        cpu=Cpu(model="Xeon", sockets=numa_nodes, cores=cores, threads=cores, flags=list(flags)),
        numa_nodes=[
            NumaNode(
                id=n,
                cpus=list(range(n * per_numa, (n + 1) * per_numa)),
                memory_mb=memory_mb // numa_nodes,
            )
            for n in range(numa_nodes)
        ],
        memory_mb=memory_mb,
        gpus=[
            Gpu(
                index=i,
                uuid=f"GPU-{name}-{i}",
                model=gpu_model,
                memory_mb=gpu_memory_mb,
                numa_node=min(i // gpus_per_numa, numa_nodes - 1),
                nvlink_peers=[j for j in range(gpus) if j != i] if nvlink else [],
            )
            for i in range(gpus)
        ],
        disks=[
            Disk(
                name="nvme0n1",
                capacity_gb=3800,
                rotational=False,
                nvme=True,
                numa_node=0,
                mount_path="/mnt/nvme0",
            )
        ],
        fingerprint=f"fp-{name}",
        fabric=fabric,
    )
