"""Write the openb variant traces as pod list CSVs (the FGD paper's other traces, derived from
the default pod list by changing proportions; see `crater.scheduler.sim.variants`).

    .venv/bin/python benchmarks/scheduler/openb_variants.py --out /tmp/openb-variants

`crater simulate --variant NAME` (e.g. gpuspec20) derives the same trace in memory (same
`--variant-seed`, same pods), so these files are only needed to look at them or to feed
another simulator.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from crater.scheduler.sim.openb import load_nodes, load_pods
from crater.scheduler.sim.variants import VARIANTS, derive, parse_variant, variant_name, write_pods

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "openb"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=Path, default=DATA / "openb_node_list_gpu_node.csv")
    parser.add_argument("--pods", type=Path, default=DATA / "openb_pod_list_default.csv")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seed", type=int, default=0, help="seed of the variants' draws")
    parser.add_argument(
        "--variants",
        nargs="+",
        default=[variant_name(v, level) for v in VARIANTS.values() for level in v.levels],
        help="e.g. gpuspec20 cpuheavy25 (default: every family at each of its levels)",
    )
    args = parser.parse_args()
    nodes, pods = load_nodes(args.nodes), load_pods(args.pods)
    for given in args.variants:
        name = variant_name(*parse_variant(given))
        derived = derive(pods, nodes, name, args.seed)
        path = args.out / f"openb_pod_list_{name}.csv"
        write_pods(derived, path)
        kinds = Counter(
            "cpu-only"
            if not p.num_gpu
            else "multi-GPU"
            if p.num_gpu > 1
            else "shared"
            if p.gpu_milli < 1000
            else "one card"
            for p in derived
        )
        pinned = sum(bool(p.gpu_spec) for p in derived)
        print(f"{path}: {len(derived)} pods, {dict(kinds)}, {pinned} pinned to a model")


if __name__ == "__main__":
    main()
