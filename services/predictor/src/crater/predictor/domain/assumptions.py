"""What the predictor assumes about the machines: the service's settings."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Assumptions:
    """What the predictor assumes about the machines; the service's settings."""

    cuda_context_mb: int = 1024  # ~0.5 GB with CUDA lazy loading, ~1.3 GB without
    allocator_overhead: float = 0.05  # caching-allocator fragmentation, share of tensors
    max_sequence_length: int = 1 << 20
    model_flops_utilisation: float = 0.4
    checkpoint_write_mb_per_s: float = 2000.0
    disk_read_mb_per_s: float = 3000.0
    default_train_sequence_length: int = 2048
    timeline_steps: int = 3
