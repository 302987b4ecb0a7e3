"""`crater simulate`: the production scheduling core on the openb trace, under the FGD
paper's protocol, for one placement policy over one or more seeds."""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from crater.cli.errors import USAGE, CliError
from crater.cli.output import cli_console, emit_json
from crater.cli.output import table as print_table
from crater.scheduler.api import POLICIES
from crater.scheduler.sim.openb import (
    CPU_UNIT_MILLI,
    OpenbNode,
    OpenbPod,
    load_nodes,
    load_pods,
)
from crater.scheduler.sim.protocol import CURVE_FROM, CURVE_TO, RunResult, mean_curve
from crater.scheduler.sim.protocol import simulate as run_protocol
from crater.scheduler.sim.published import POINTS, PUBLISHED_CURVES
from crater.scheduler.sim.variants import VARIANTS, derive, parse_variant, variant_name

console = cli_console(highlight=True)
# the bar and the lines per seed: stdout is the results
progress = cli_console(stderr=True, highlight=True)
NODES_CSV, PODS_CSV = "openb_node_list_gpu_node.csv", "openb_pod_list_default.csv"
# Where the openb data is looked for, first found: CRATER_OPENB_DIR, then shared/data/openb
# beside or inside the working directory, then beside or inside this checkout.
CHECKOUT = Path(__file__).resolve().parents[5]
SEARCHED = (Path("../shared/data/openb"), Path("shared/data/openb"))
DEFAULT_OUT = Path("var/simulate")
# Random on the default trace, from the paper's table (its artifact's per-trace curves,
# `sim/published.py`, hold BestFit and FGD only): 100%, 130%.
PUBLISHED_RANDOM_DEFAULT = (86.30, 87.47)


def published_curve(trace: str, variant: str | None, policy: str) -> dict[int, float] | None:
    """The paper's own GPU allocation curve for `policy` on the public trace `trace` (x ->
    %), or None: a derived variant, or a trace or policy the paper has no figures for."""
    if variant is not None:
        return None
    if (trace, policy) in PUBLISHED_CURVES:
        return dict(zip(POINTS, PUBLISHED_CURVES[(trace, policy)], strict=True))
    if (trace, policy) == ("default", "random"):
        return dict(zip((100, 130), PUBLISHED_RANDOM_DEFAULT, strict=True))
    return None


def trace_name(pods_file: Path) -> str:
    """The trace a pod list holds, by its file's name: openb_pod_list_<name>.csv (the public
    traces: default, gpuspec10, multigpu20, cpu050, ...) is <name>; any other file, its stem."""
    stem = pods_file.name.removesuffix(".csv")
    return stem.removeprefix("openb_pod_list_") or stem


def result_stem(trace: str, variant: str | None, policy: str) -> str:
    """The results' file stem: openb_[<trace>_][<variant>_]<policy> (the default trace's
    results keep their names, openb_<policy>)."""
    parts = ["openb", *([trace] if trace != "default" else []), *([variant] if variant else [])]
    return "_".join([*parts, policy])


def parse_seeds(text: str) -> list[int]:
    """ "42-51" or "42,43,50" (or a mix) -> the seeds."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if "-" in part:
            low, high = (int(p) for p in part.split("-", 1))
            seeds.extend(range(low, high + 1))
        elif part:
            seeds.append(int(part))
    return seeds


def _one(
    nodes: list[OpenbNode], pods: list[OpenbPod], policy: str, seed: int, cpu_unit: int
) -> RunResult:
    return run_protocol(nodes, pods, policy, seed, cpu_unit_milli=cpu_unit)


def openb_dir() -> Path | None:
    """The folder holding the openb trace, or None."""
    found = os.environ.get("CRATER_OPENB_DIR")
    candidates = [Path(found)] if found else [*SEARCHED, *(CHECKOUT / p for p in SEARCHED)]
    return next((c for c in candidates if (c / NODES_CSV).is_file()), None)


def _trace_file(given: Path | None, name: str, option: str) -> Path:
    if given is not None:
        if not given.is_file():
            raise CliError(f"{option} {given}: no such file", USAGE)
        return given
    folder = openb_dir()
    if folder is None or not (folder / name).is_file():
        raise CliError(
            f"the openb trace ({name}) is not in CRATER_OPENB_DIR nor in shared/data/openb "
            f"beside this checkout ({CHECKOUT.parent}): set CRATER_OPENB_DIR to the folder "
            "holding it (github.com/alibaba/clusterdata, cluster-trace-gpu-v2023/csv), or pass "
            f"{option}",
            USAGE,
        )
    return folder / name


def simulate(
    nodes: Annotated[
        Path | None,
        typer.Option(help=f"openb node list CSV; default: {NODES_CSV} of the openb folder."),
    ] = None,
    pods: Annotated[
        Path | None,
        typer.Option(help=f"openb pod list CSV; default: {PODS_CSV} of the openb folder."),
    ] = None,
    policy: Annotated[str, typer.Option(help=f"One of: {', '.join(POLICIES)}.")] = "crater",
    seed: Annotated[int, typer.Option(help="Seed of the shuffle and the draws.")] = 42,
    seeds: Annotated[
        str | None, typer.Option(help="Several seeds, e.g. 42-51 (overrides --seed).")
    ] = None,
    out: Annotated[
        Path,
        typer.Option(
            help="Where openb_[<trace>_][<variant>_]<policy>.{csv,png,json} go (the trace named "
            "by the pods file, openb_pod_list_<trace>.csv; benchmarks/results: the committed "
            "figures, only when asked)."
        ),
    ] = DEFAULT_OUT,
    as_json: Annotated[
        bool, typer.Option("--json", help="Print the summary (as written to JSON) on stdout.")
    ] = False,
    jobs: Annotated[int, typer.Option(help="Seeds run in parallel processes.")] = 1,
    variant: Annotated[
        str | None,
        typer.Option(
            help="Replay a trace derived from --pods instead, a family and a level in percent "
            "(e.g. gpuspec20; a bare family: its default level): "
            + "; ".join(
                f"{v.name}: {v.measures} (levels swept: {', '.join(map(str, v.levels))})"
                for v in VARIANTS.values()
            )
            + ". Results go to openb_<variant>_<policy>.*"
        ),
    ] = None,
    variant_seed: Annotated[
        int, typer.Option(help="Seed of the variant's draws (the trace, not the runs).")
    ] = 0,
    cpu_unit_milli: Annotated[
        int,
        typer.Option(
            help="What one of the core's CPUs stands for, in milli-CPU: 100 holds openb's "
            "fractional requests to a tenth of a core; 1000 rounds each up to whole cores."
        ),
    ] = CPU_UNIT_MILLI,
) -> None:
    """Replay the openb trace through the scheduling core: GPU allocation at 80..130% of the
    cluster's cards arrived, mean over the seeds; the curve goes to CSV and PNG under --out.
    The trace: CRATER_OPENB_DIR, or shared/data/openb beside the checkout."""
    if policy not in POLICIES:
        raise typer.BadParameter(f"unknown policy {policy!r}; one of {', '.join(POLICIES)}")
    if variant is not None:
        try:
            variant = variant_name(*parse_variant(variant))
        except ValueError as e:
            raise typer.BadParameter(str(e), param_hint="--variant") from e
    nodes_file = _trace_file(nodes, NODES_CSV, "--nodes")
    pods_file = _trace_file(pods, PODS_CSV, "--pods")
    with progress.status(f"reading {nodes_file} and {pods_file}"):
        node_list, pod_list = load_nodes(nodes_file), load_pods(pods_file)
    trace = trace_name(pods_file)
    if variant is not None:
        pod_list = derive(pod_list, node_list, variant, variant_seed)
    run_seeds = parse_seeds(seeds) if seeds else [seed]
    started = time.perf_counter()
    results: list[RunResult] = []
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=progress, transient=True) as bar:
        if jobs <= 1:
            for s in run_seeds:
                task = bar.add_task(f"{policy} seed {s}: pods", total=None)

                def tick(done: int, total: int, task: Any = task, s: int = s) -> None:
                    if done % 100 == 0 or done == total:
                        bar.update(task, completed=done, total=total)
                    # no bar where stderr is not a terminal: a line per tenth of the pods
                    tenth = max(1, total // 10)
                    if not progress.is_terminal and (done % tenth == 0 or done == total):
                        progress.print(f"{policy} seed {s}: {done}/{total} pods")

                results.append(
                    run_protocol(
                        node_list, pod_list, policy, s, progress=tick, cpu_unit_milli=cpu_unit_milli
                    )
                )
                _done(results[-1], len(results), len(run_seeds))
        else:
            task = bar.add_task(f"{policy}: seeds", total=len(run_seeds))
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                futures = [
                    pool.submit(_one, node_list, pod_list, policy, s, cpu_unit_milli)
                    for s in run_seeds
                ]
                for future in as_completed(futures):
                    results.append(future.result())
                    bar.advance(task)
                    _done(results[-1], len(results), len(run_seeds))
    results.sort(key=lambda r: r.seed)
    wall = time.perf_counter() - started
    summary = write_results(results, out, policy, wall, cpu_unit_milli, variant, trace)
    if as_json:
        emit_json(summary)
        return
    _print(summary, mean_curve(results))
    console.print(f"wrote {out}/{result_stem(trace, variant, policy)}.{{csv,json,png}}")


def _done(result: RunResult, done: int, total: int) -> None:
    """A line per seed where the bar is not shown (stderr not a terminal)."""
    if not progress.is_terminal:
        progress.print(f"seed {result.seed} done ({done}/{total})")


def write_results(
    results: list[RunResult],
    out: Path,
    policy: str,
    wall: float,
    cpu_unit_milli: int,
    variant: str | None = None,
    trace: str = "default",
) -> dict[str, Any]:
    curve = mean_curve(results)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / result_stem(trace, variant, policy)
    published = published_curve(trace, variant, policy)
    lines = ["arrived_pct,gpu_alloc_pct,cpu_alloc_pct,memory_alloc_pct"]
    lines += [f"{x},{g:.4f},{c:.4f},{m:.4f}" for x, (g, c, m) in curve.items()]
    stem.with_suffix(".csv").write_text("\n".join(lines) + "\n")
    gpus = results[0].gpu_capacity_milli / 1000

    def at(x: int) -> dict[str, float] | None:
        if x not in curve:
            return None
        g, c, m = curve[x]
        return {"gpu": round(g, 3), "cpu": round(c, 3), "memory": round(m, 3)}

    top = max(curve)
    summary: dict[str, Any] = {
        "policy": policy,
        "trace": trace,
        "variant": variant,
        "seeds": [r.seed for r in results],
        "gpus": gpus,
        "at_100": at(100),
        "at_130": at(CURVE_TO),
        "unallocated_gpus_at_130": round(gpus * (1 - curve[top][0] / 100), 1),
        "failed_pods_mean": sum(r.failed[-1] for r in results) / len(results),
        "pods_arrived_mean": sum(len(r.arrived_gpu) for r in results) / len(results),
        "wall_seconds": round(wall, 1),
        # the paper's figures are the default trace's: shown for that trace only
        # the paper's figures for this public trace (none for a derived variant)
        "published": {
            "at_100": published[100],
            "at_130": published[130],
            "unallocated": round(gpus * (1 - published[130] / 100)),
            "curve": {str(x): v for x, v in published.items()},
        }
        if published is not None
        else None,
        "cpu_unit_milli": cpu_unit_milli,
        "notes": (
            f"each of the core's CPUs stands for {cpu_unit_milli} milli-CPU; a pod's request "
            "is rounded up to that; CPU allocation % is of the pods' own cpu_milli over the "
            "cluster's."
        ),
        "curve": {str(x): [round(v, 4) for v in curve[x]] for x in curve},
    }
    stem.with_suffix(".json").write_text(json.dumps(summary, indent=2) + "\n")
    _plot(curve, stem.with_suffix(".png"), policy, len(results), variant, trace)
    return summary


def _plot(
    curve: dict[int, tuple[float, float, float]],
    path: Path,
    policy: str,
    n: int,
    variant: str | None = None,
    trace: str = "default",
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [x for x in curve if CURVE_FROM <= x <= CURVE_TO]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for k, label in enumerate(("GPU", "CPU", "memory")):
        ax.plot(xs, [curve[x][k] for x in xs], label=f"{label} allocated")
    published = published_curve(trace, variant, policy)
    if published is not None:
        ax.scatter(
            list(published),
            list(published.values()),
            marker="x",
            color="k",
            label=f"published (GPU, {trace})",
        )
    ax.set_xlabel("GPU request arrived, % of cluster GPUs")
    ax.set_ylabel("allocated, % of cluster capacity")
    name = f"openb {trace}" + (f", {variant} variant" if variant else "")
    ax.set_title(f"{name}, policy {policy}, mean of {n} seed(s)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _print(summary: dict[str, Any], curve: dict[int, tuple[float, float, float]]) -> None:
    table = Table(
        title=f"openb ({summary['trace']}"
        + (f", {summary['variant']} variant" if summary["variant"] else "")
        + f"): {summary['policy']}, seeds {summary['seeds']}"
    )
    for name in ("arrived %", "GPU alloc %", "CPU alloc %", "memory alloc %"):
        table.add_column(name, justify="right")
    for x in range(CURVE_FROM, CURVE_TO + 1, 5):
        if x in curve:
            g, c, m = curve[x]
            table.add_row(str(x), f"{g:.2f}", f"{c:.2f}", f"{m:.2f}")
    print_table(table)
    console.print(
        f"unallocated GPUs at 130%: {summary['unallocated_gpus_at_130']}; "
        f"failed pods (mean): {summary['failed_pods_mean']:.1f}; wall {summary['wall_seconds']} s"
    )
    if published := summary["published"]:
        console.print(
            f"published for {summary['policy']} on {summary['trace']}: GPU allocation "
            f"{published['at_100']:.2f}% at 100% arrived, {published['at_130']:.2f}% at 130%; "
            "unallocated GPUs at 130%: "
            f"{published['unallocated']}"
        )
