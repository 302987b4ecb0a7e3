"""Other traces of the openb format, derived from the default pod list the way the FGD paper
derived its multi-GPU, GPU-sharing, GPU-spec and non-GPU traces: the same pods, in other
proportions. A placement that only wins on the default trace is tuned to it; these check.

Each variant redraws the pod list (as many pods as the original, with replacement, seeded)
so that one kind of pod makes a given share of it, the rest drawn from the other pods;
`gpuspec` instead constrains a share of the GPU pods to GPU models of the cluster.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from crater.scheduler.sim.openb import OpenbNode, OpenbPod


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    share: float  # of the derived pod list (gpuspec: of its GPU pods)


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("sharing", "GPU-sharing pods (one card, < 1000 milli) are 60% of pods", 0.60),
        Variant("multigpu", "multi-GPU pods (2 or more cards) are 8% of pods", 0.08),
        Variant("gpuspec", "a third of the GPU pods may run on one GPU model only", 1 / 3),
        Variant("cpuheavy", "CPU-only pods are 30% of pods", 0.30),
    )
}

_KIND: dict[str, Callable[[OpenbPod], bool]] = {
    "sharing": lambda p: p.num_gpu == 1 and 0 < p.gpu_milli < 1000,
    "multigpu": lambda p: p.num_gpu >= 2,
    "cpuheavy": lambda p: p.num_gpu == 0,
}


def derive(
    pods: list[OpenbPod], nodes: list[OpenbNode], variant: str, seed: int = 0
) -> list[OpenbPod]:
    """The pod list of `variant`, drawn from `pods` under `seed` (names made unique)."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; one of {', '.join(VARIANTS)}")
    share = VARIANTS[variant].share
    rng = np.random.default_rng(seed)
    if variant == "gpuspec":
        return _constrain_models(pods, nodes, share, rng)
    kind = _KIND[variant]
    chosen = [p for p in pods if kind(p)]
    others = [p for p in pods if not kind(p)]
    if not chosen or not others:
        raise ValueError(f"the pod list has no pods to draw the {variant!r} variant from")
    count = round(share * len(pods))
    drawn = [chosen[int(i)] for i in rng.integers(len(chosen), size=count)]
    drawn += [others[int(i)] for i in rng.integers(len(others), size=len(pods) - count)]
    order = rng.permutation(len(drawn))
    return [replace(drawn[int(i)], name=f"{variant}-{k:05d}") for k, i in enumerate(order)]


def _constrain_models(
    pods: list[OpenbPod], nodes: list[OpenbNode], share: float, rng: np.random.Generator
) -> list[OpenbPod]:
    """Each GPU pod, with probability `share`, is pinned to one model, drawn in proportion to
    that model's cards among the nodes that could hold the pod empty (so demand per model
    follows supply, and no pin is impossible by construction)."""
    out: list[OpenbPod] = []
    for k, pod in enumerate(pods):
        spec = pod.gpu_spec
        if pod.num_gpu and not spec and rng.random() < share:
            cards: dict[str, int] = {}
            for node in nodes:
                if (
                    node.model
                    and node.gpus >= pod.num_gpu
                    and node.cpu_milli >= pod.cpu_milli
                    and node.memory_mib >= pod.memory_mib
                ):
                    cards[node.model] = cards.get(node.model, 0) + node.gpus
            if cards:
                models = sorted(cards)
                weights = np.asarray([cards[m] for m in models], np.float64)
                spec = models[int(rng.choice(len(models), p=weights / weights.sum()))]
        out.append(replace(pod, name=f"gpuspec-{k:05d}", gpu_spec=spec))
    return out


def write_pods(pods: list[OpenbPod], path: Path) -> None:
    """The pods as an openb pod list CSV (times empty: the protocol does not use them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            [
                "name",
                "cpu_milli",
                "memory_mib",
                "num_gpu",
                "gpu_milli",
                "gpu_spec",
                "qos",
                "pod_phase",
                "creation_time",
                "deletion_time",
                "scheduled_time",
            ]
        )
        for p in pods:
            writer.writerow(
                [p.name, p.cpu_milli, p.memory_mib, p.num_gpu, p.gpu_milli, p.gpu_spec, *[""] * 5]
            )
