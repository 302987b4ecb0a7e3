"""Other traces of the openb format, derived from the default pod list the way the FGD paper
derived its GPU-sharing, multi-GPU, GPU-spec and non-GPU traces: the same pods, in other
proportions. A placement that only wins on the default trace is tuned to it; these check.

A variant is a family and a level, named as the public traces are (`sharing60`, `multigpu30`,
`gpuspec20`, `cpuheavy25`). Each redraws the pod list (as many pods as the original, with
replacement, seeded) so that one kind of pod makes the level's share of it, the rest drawn
from the other pods; `gpuspec` instead pins a share of the GPU pods to one GPU model,
drawn evenly among the models (not by their number of cards).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from crater.scheduler.sim.openb import OpenbNode, OpenbPod


@dataclass(frozen=True)
class Variant:
    """A family of derived traces: what its level measures, the levels the evaluation
    sweeps, and the level a bare name means."""

    name: str
    measures: str  # "<kind> are P% of <what>"
    levels: tuple[int, ...]  # percent
    default: int

    def describe(self, level: int) -> str:
        return self.measures.replace("P%", f"{level}%")


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant(
            "sharing",
            "GPU-sharing pods (one card, < 1000 milli) are P% of the GPU pods",
            (20, 40, 60, 80, 100),
            60,
        ),
        Variant(
            "multigpu",
            "multi-GPU pods (2 or more cards) ask P% of the GPU request",
            (20, 30, 40, 50),
            30,
        ),
        Variant(
            "gpuspec",
            "P% of the GPU pods may run on one GPU model only",
            (5, 10, 20, 25, 33),
            33,
        ),
        Variant("cpuheavy", "CPU-only pods are P% of the pods", (5, 10, 20, 25, 30), 30),
    )
}


def parse_variant(text: str) -> tuple[Variant, int]:
    """ "gpuspec20", "gpuspec:20" or a bare "gpuspec" (its default level) -> the family and
    the level in percent."""
    name = text.rstrip("0123456789").rstrip(":")
    digits = text[len(name) :].lstrip(":")
    if name not in VARIANTS:
        raise ValueError(f"unknown variant {text!r}; one of {', '.join(VARIANTS)} (e.g. gpuspec20)")
    variant = VARIANTS[name]
    level = int(digits) if digits else variant.default
    if not 0 < level <= 100:
        raise ValueError(f"variant {text!r}: the level is a percent, 1 to 100")
    return variant, level


def variant_name(variant: Variant, level: int) -> str:
    """The derived trace's name: gpuspec20, as the public traces of each family are named."""
    return f"{variant.name}{level}"


def _is_share(p: OpenbPod) -> bool:
    return p.num_gpu == 1 and 0 < p.gpu_milli < 1000


def derive(
    pods: list[OpenbPod], nodes: list[OpenbNode], variant: str, seed: int = 0
) -> list[OpenbPod]:
    """The pod list of `variant` ("gpuspec20"; a bare family name: its default level),
    drawn from `pods` under `seed` (as many pods, with replacement; names made unique)."""
    family, level = parse_variant(variant)
    share = level / 100
    rng = np.random.default_rng(seed)
    name = variant_name(family, level)
    if family.name == "gpuspec":
        return _constrain_models(pods, nodes, share, rng, name)
    cpu_only = [p for p in pods if not p.num_gpu]
    gpu = [p for p in pods if p.num_gpu]
    if family.name == "cpuheavy":
        mix = [(cpu_only, share), (gpu, 1 - share)]
    elif family.name == "sharing":
        # the CPU-only pods keep their part; among GPU pods, P% share a card
        gpu_part = len(gpu) / len(pods)
        mix = [
            (cpu_only, 1 - gpu_part),
            ([p for p in gpu if _is_share(p)], gpu_part * share),
            ([p for p in gpu if not _is_share(p)], gpu_part * (1 - share)),
        ]
    else:  # multigpu: the draws' share of pods that makes their GPU request P% of it
        multi = [p for p in pods if p.num_gpu >= 2]
        others = [p for p in pods if p.num_gpu < 2]
        mean_multi = float(np.mean([p.gpu_request for p in multi])) if multi else 0.0
        mean_other = float(np.mean([p.gpu_request for p in others])) if others else 0.0
        part = share * mean_other / (share * mean_other + (1 - share) * mean_multi or 1.0)
        mix = [(multi, part), (others, 1 - part)]
    if any(part > 0 and not chosen for chosen, part in mix):
        raise ValueError(f"the pod list has no pods to draw the {name!r} variant from")
    counts = [round(part * len(pods)) for _, part in mix]
    counts[-1] = len(pods) - sum(counts[:-1])
    drawn: list[OpenbPod] = []
    for (chosen, _), count in zip(mix, counts, strict=True):
        drawn += [chosen[int(i)] for i in rng.integers(len(chosen), size=count)] if count else []
    order = rng.permutation(len(drawn))
    return [replace(drawn[int(i)], name=f"{name}-{k:05d}") for k, i in enumerate(order)]


# A model with fewer than this share of the cards that could hold a pod is not drawn as its
# one allowed model: a pin to a handful of cards (openb's two A10s) could never be served.
MIN_MODEL_SHARE = 0.01


def _constrain_models(
    pods: list[OpenbPod],
    nodes: list[OpenbNode],
    share: float,
    rng: np.random.Generator,
    name: str,
) -> list[OpenbPod]:
    """Each GPU pod, with probability `share`, is pinned to one model, drawn evenly among the
    models whose nodes could hold the pod empty (each with at least MIN_MODEL_SHARE of those
    nodes' cards). Evenly, not in proportion to each model's cards: as in production, where
    pinned work asks for particular models whatever their number, the small models' pinned
    demand outgrows their capacity (the public gpuspec traces pin mostly T4, V100 and P100
    work, while most cards are G2), and that scarcity is what a placement must handle."""
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
            total = sum(cards.values())
            models = sorted(m for m, n in cards.items() if n >= MIN_MODEL_SHARE * total)
            if models:
                spec = models[int(rng.integers(len(models)))]
        out.append(replace(pod, name=f"{name}-{k:05d}", gpu_spec=spec))
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
