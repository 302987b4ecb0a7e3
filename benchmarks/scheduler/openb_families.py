"""Placement on every family of derived openb traces, across each family's levels: Crater
against the paper's FGD and BestFit in the same run (issue #26).

    uv run --frozen python -m benchmarks.scheduler.openb_families --seeds 42-51 --jobs 2

For every family (`crater.scheduler.sim.variants.VARIANTS`: sharing, multigpu, gpuspec,
cpuheavy), each of its levels, each policy and each seed, the FGD paper's protocol runs
through the production core (`crater.scheduler.sim.protocol`), on the variant drawn with
`--variant-seed` (the trace, the same for every policy). Each run is kept under `--cache`
(benchmarks/results/openb_runs, per version of the scheduler's code: its git tree hash) as it
ends, so a run stopped half way goes on where it stopped, in this session or a later one
(the grid of every trace on ten seeds is hours on two cores; the runs are committed as they
come, 3 KB each). The summary:

- `openb_families.json`: per trace and policy, the mean curve (GPU, CPU, memory allocation
  at each % arrived, 80..130) over the seeds;
- `openb_families.md`: per trace, Crater minus FGD and minus BestFit at 100% and 130% and at
  its worst point of 80..130, and whether Crater is at or above FGD at every point;
- `openb_families_<family>.png`: Crater minus FGD (GPU allocation, points) over 80..130%,
  one curve per level.

A change to the scheduler's code that leaves a baseline alone (Crater's score tuned, say) need
not run FGD and BestFit again: `--carry fgd bestfit --carry-from <old version>` reruns a few of
their runs on this build and, when each equals the kept one exactly, copies the rest over
(`carried.json` in the version's folder says from where and how it was checked).

Progress goes to stderr, a line per run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from crater.scheduler.sim.openb import OpenbNode, OpenbPod, load_nodes, load_pods
from crater.scheduler.sim.protocol import (
    CURVE_FROM,
    CURVE_TO,
    RunResult,
    mean_of_curves,
    simulate,
)
from crater.scheduler.sim.variants import VARIANTS, derive, parse_variant, variant_name

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "openb"
POLICIES = ("crater", "fgd", "bestfit")


def _seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        out.extend(range(int(low), int(high or low) + 1))
    return out


def _code_version() -> str:
    """The scheduler package's git tree hash: a cached run of other code is not reused."""
    found = subprocess.run(
        ["git", "rev-parse", "HEAD:services/scheduler"],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parent,
    )
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "services/scheduler"],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[2],
    )
    if found.returncode or dirty.stdout.strip():
        return f"uncommitted-{int(time.time())}"  # never reused
    return found.stdout.strip()[:12]


def _run(nodes: list[OpenbNode], pods: list[OpenbPod], policy: str, seed: int) -> dict[str, Any]:
    result: RunResult = simulate(nodes, pods, policy, seed)
    curve = result.curve()
    return {
        "failed": result.failed[-1],
        "pods": len(result.arrived_gpu),
        "curve": {str(x): list(v) for x, v in curve.items() if CURVE_FROM <= x <= CURVE_TO},
    }


def carry(
    source: Path,
    cache: Path,
    policies: list[str],
    check: int,
    nodes: list[OpenbNode],
    pods: dict[str, list[OpenbPod]],
) -> None:
    """Copy `policies`' runs of `pods`' traces from `source` into `cache`, once `check` of
    each policy's (spread over the traces), run again on this build, equal them exactly: a
    change that leaves a baseline's decisions alone need not cost its hours again. Any
    difference stops the carry (nothing copied) with the first run that differs."""
    kept = {
        policy: sorted(
            f.name
            for f in source.glob(f"*_{policy}_*.json")
            if f.name.rsplit("_", 2)[0] in pods and not (cache / f.name).is_file()
        )
        for policy in policies
    }
    for policy, names in kept.items():
        step = max(len(names) // max(check, 1), 1)
        for name in names[::step][:check]:
            trace, _, seed = name.removesuffix(".json").rsplit("_", 2)
            started = time.perf_counter()
            again = json.loads(json.dumps(_run(nodes, pods[trace], policy, int(seed))))
            if again != json.loads((source / name).read_text()):
                raise SystemExit(f"--carry: {name} differs on this build: nothing carried")
            print(
                f"--carry: {name} identical on this build ({time.perf_counter() - started:.0f} s)",
                file=sys.stderr,
            )
    for names in kept.values():
        for name in names:
            (cache / name).write_bytes((source / name).read_bytes())
    record = cache / "carried.json"
    carried = json.loads(record.read_text()) if record.is_file() else []
    carried.append({"from": source.name, "policies": policies, "checked_per_policy": check})
    record.write_text(json.dumps(carried, indent=1) + "\n")
    copied = sum(len(n) for n in kept.values())
    print(f"--carry: {copied} runs carried from {source.name}", file=sys.stderr)


def _mean(runs: list[dict[str, Any]]) -> dict[int, tuple[float, float, float]]:
    return mean_of_curves(
        [{int(x): (v[0], v[1], v[2]) for x, v in run["curve"].items()} for run in runs]
    )


def _compare(
    curves: dict[str, dict[int, tuple[float, float, float]]],
) -> dict[str, Any]:
    crater = curves["crater"]
    out: dict[str, Any] = {}
    for other in ("fgd", "bestfit"):
        if other not in curves:
            continue
        xs = sorted(set(crater) & set(curves[other]))
        diff = {x: crater[x][0] - curves[other][x][0] for x in xs}
        worst = min(xs, key=lambda x: diff[x])
        out[other] = {
            "at_100": round(diff.get(100, float("nan")), 3),
            "at_130": round(diff.get(max(xs), float("nan")), 3),
            "worst": round(diff[worst], 3),
            "worst_at": worst,
            "at_or_above_everywhere": all(d >= 0 for d in diff.values()),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=Path, default=DATA / "openb_node_list_gpu_node.csv")
    parser.add_argument("--pods", type=Path, default=DATA / "openb_pod_list_default.csv")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument(
        "--variants",
        nargs="+",
        default=[variant_name(v, level) for v in VARIANTS.values() for level in v.levels],
        help="e.g. gpuspec20 sharing40 (default: every family at each of its levels)",
    )
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES)
    parser.add_argument("--variant-seed", type=int, default=0)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path("benchmarks/results/openb_runs"),
        help="where each finished run is kept (a run stopped half way goes on from there)",
    )
    parser.add_argument(
        "--carry",
        nargs="+",
        default=[],
        metavar="POLICY",
        help="take these policies' runs from --carry-from instead of running them all again, "
        "once --carry-check of them, run on this build, came out identical",
    )
    parser.add_argument("--carry-from", help="the code version (cache folder) to carry from")
    parser.add_argument("--carry-check", type=int, default=3, help="runs checked per policy")
    args = parser.parse_args()

    nodes, base = load_nodes(args.nodes), load_pods(args.pods)
    seeds = _seeds(args.seeds)
    traces = [variant_name(*parse_variant(v)) for v in args.variants]
    cache: Path = args.cache / _code_version()
    cache.mkdir(parents=True, exist_ok=True)
    pods = {t: derive(base, nodes, t, args.variant_seed) for t in traces}
    if args.carry:
        if not args.carry_from:
            parser.error("--carry needs --carry-from")
        carry(args.cache / args.carry_from, cache, args.carry, args.carry_check, nodes, pods)
    todo = [
        (t, p, s)
        for t in traces
        for p in args.policies
        for s in seeds
        if not (cache / f"{t}_{p}_{s}.json").is_file()
    ]
    total = len(traces) * len(args.policies) * len(seeds)
    print(
        f"{total - len(todo)} of {total} runs kept from before; {len(todo)} to go", file=sys.stderr
    )
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        futures = {pool.submit(_run, nodes, pods[t], p, s): (t, p, s) for t, p, s in todo}
        for done, future in enumerate(as_completed(futures), 1):
            t, p, s = futures[future]
            run = future.result()
            (cache / f"{t}_{p}_{s}.json").write_text(json.dumps(run))
            gpu = run["curve"][str(max(int(x) for x in run["curve"]))][0]
            print(
                f"[{done}/{len(todo)}] {t} {p} seed {s}: GPU {gpu:.2f}% at the end, "
                f"{time.perf_counter() - started:.0f} s",
                file=sys.stderr,
                flush=True,
            )

    summary: dict[str, Any] = {"seeds": seeds, "variant_seed": args.variant_seed, "traces": {}}
    for t in traces:
        curves = {
            p: _mean([json.loads((cache / f"{t}_{p}_{s}.json").read_text()) for s in seeds])
            for p in args.policies
        }
        summary["traces"][t] = {
            "describes": parse_variant(t)[0].describe(parse_variant(t)[1]),
            "curves": {
                p: {str(x): [round(v, 4) for v in c[x]] for x in c} for p, c in curves.items()
            },
            "crater_minus": _compare(curves) if "crater" in curves else {},
        }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "openb_families.json").write_text(json.dumps(summary, indent=1) + "\n")
    (args.out / "openb_families.md").write_text(_table(summary))
    _plots(summary, args.out)
    print(_table(summary))


def _table(summary: dict[str, Any]) -> str:
    lines = [
        f"Crater minus FGD and minus BestFit, GPU allocation points, mean of seeds "
        f"{summary['seeds'][0]}-{summary['seeds'][-1]} ({len(summary['seeds'])}), "
        f"`python -m benchmarks.scheduler.openb_families`",
        "",
        "| trace | what | Crater GPU % at 100 / 130 | vs FGD at 100 / 130 | worst vs FGD (at %) "
        "| at or above FGD 80..130 | vs BestFit at 100 / 130 "
        "| CPU / memory % at 130: Crater (FGD) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t, row in summary["traces"].items():
        crater = row["curves"].get("crater", {})
        top = str(max(int(x) for x in crater)) if crater else None
        fgd = row["crater_minus"].get("fgd", {})
        best = row["crater_minus"].get("bestfit", {})
        lines.append(
            f"| {t} | {row['describes']} | "
            + (f"{crater['100'][0]:.2f} / {crater[top][0]:.2f} | " if top else "- | ")
            + (f"{fgd['at_100']:+.2f} / {fgd['at_130']:+.2f} | " if fgd else "- | ")
            + (f"{fgd['worst']:+.2f} ({fgd['worst_at']}) | " if fgd else "- | ")
            + (("yes" if fgd["at_or_above_everywhere"] else "**no**") + " | " if fgd else "- | ")
            + (f"{best['at_100']:+.2f} / {best['at_130']:+.2f} | " if best else "- | ")
            + (_host_at(crater, row["curves"].get("fgd", {}), top) if top else "- |")
        )
    return "\n".join(lines) + "\n"


def _host_at(crater: dict[str, list[float]], fgd: dict[str, list[float]], x: str) -> str:
    """Crater's CPU and memory allocation at `x`% arrived, FGD's beside it where run."""
    cpu, memory = crater[x][1], crater[x][2]
    if x not in fgd:
        return f"{cpu:.1f} / {memory:.1f} |"
    return f"{cpu:.1f} / {memory:.1f} ({fgd[x][1]:.1f} / {fgd[x][2]:.1f}) |"


def _plots(summary: dict[str, Any], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for family in VARIANTS:
        rows = {t: r for t, r in summary["traces"].items() if parse_variant(t)[0].name == family}
        rows = {t: r for t, r in rows.items() if {"crater", "fgd"} <= set(r["curves"])}
        if not rows:
            continue
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for t, r in rows.items():
            crater, fgd = r["curves"]["crater"], r["curves"]["fgd"]
            xs = sorted(int(x) for x in set(crater) & set(fgd))
            ax.plot(xs, [crater[str(x)][0] - fgd[str(x)][0] for x in xs], label=t)
        ax.axhline(0, color="k", linewidth=0.8)
        ax.set_xlabel("GPU request arrived, % of cluster GPUs")
        ax.set_ylabel("Crater minus FGD, GPU allocation points")
        ax.set_title(f"{family}: {VARIANTS[family].measures}")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"openb_families_{family}.png", dpi=110)
        plt.close(fig)


if __name__ == "__main__":
    main()
