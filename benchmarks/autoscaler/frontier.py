"""Crater's autoscaling policy against the baselines a user would configure instead, each
swept over its target, over several seeds and trace shapes: SLO attainment (TTFT <= 200 ms)
against replica-minutes, each baseline family's frontier, and Crater's distance to the best
of them at equal attainment.

    python benchmarks/autoscaler/frontier.py --seeds 1-5 --jobs 1

The baselines (`crater.autoscaler.sim`): `hpa-slots`, the Kubernetes HPA on slot utilisation;
`hpa-kv`, the same HPA (or KEDA) on KV-cache utilisation; `kpa`, a Knative-KPA-like
concurrency autoscaler (in-flight plus queued requests per replica). Each is run at several
targets, since the target is the knob that trades replicas for latency; Crater at its shipped
defaults (and, with --crater-targets, other target pressures, printed loudly as not the
shipped defaults). A family's frontier is the Pareto set of its targets' means over the seeds
(attainment against replica-minutes); Crater's distance is read at its own mean attainment
on each frontier (straight line between the two frontier points around it), and against the
best family there. Each run also reports whether the simulated fleet did what every decision
asked, and its reversals (a change of direction within 120 s). Writes
benchmarks/results/autoscale_frontier.json and a PNG of the frontiers beside it, with the
command and the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

from crater.autoscaler.domain import ScalingPolicy
from crater.autoscaler.sim import (
    BASELINES,
    Baseline,
    HpaBaseline,
    KpaBaseline,
    Request,
    SimulationConfig,
    TraceShape,
    describe_departures,
    generate_trace,
    simulate,
    with_tokens,
)
from crater.autoscaler.sim.clairvoyant import ClairvoyantBaseline
from crater.autoscaler.sim.frontier import Point, minutes_at, pareto, saving

SHAPES = {
    # The CLI's default trace: a day in 4 h, 3 -> 30 requests/s, 1.5 bursts/h of 2.5-5x, 30-120 s.
    "diurnal": TraceShape(hours=4.0, trough_rps=3.0, peak_rps=30.0),
    # Sharper: 4 bursts/h of 3-6x lasting 20-60 s.
    "sharp": TraceShape(
        hours=4.0,
        trough_rps=3.0,
        peak_rps=30.0,
        bursts_per_hour=4.0,
        burst_factor=(3.0, 6.0),
        burst_seconds=(20.0, 60.0),
    ),
    # Heavy-tailed lengths (`TOKEN_PROFILES`): the same day and bursts at the rates that load
    # the fleet as the diurnal trace does (a request of these holds a replica far longer).
    "conversation": with_tokens(
        TraceShape(hours=4.0, trough_rps=0.8, peak_rps=8.0), "conversation"
    ),
    "coding": with_tokens(TraceShape(hours=4.0, trough_rps=1.8, peak_rps=18.0), "coding"),
}
TARGETS = {
    "crater": f"{ScalingPolicy().target_pressure:g}",  # what ships
    "hpa-slots": "0.3,0.4,0.5,0.6,0.7,0.8,0.9",
    "hpa-kv": "0.3,0.4,0.5,0.6,0.7,0.8,0.9",
    "kpa": "3,4,6,8,10,12,16",
    # Not a baseline: a reference that knows the trace ahead (`--clairvoyant`), swept over the
    # utilisation it plans for.
    "clairvoyant": "0.8,0.9,1,1.1,1.2,1.3,1.6,2,2.5",
}
CLAIRVOYANT = "clairvoyant"
RESULTS = Path(__file__).resolve().parents[1] / "results" / "autoscale_frontier.json"


def baseline(family: str, target: float, trace: list[Request] | None = None) -> Baseline:
    if family == CLAIRVOYANT:
        return ClairvoyantBaseline(trace or [], utilisation=target)
    if family == "hpa-slots":
        return HpaBaseline(target_utilisation=target)
    if family == "hpa-kv":
        return HpaBaseline(metric="kv", target_utilisation=target)
    if family == "kpa":
        return KpaBaseline(target_concurrency=target)
    raise ValueError(f"no baseline {family!r}; one of {', '.join(BASELINES)}")


def one(job: tuple[str, int, str, float, float | None]) -> dict[str, object]:
    shape, seed, family, target, hours = job
    form = SHAPES[shape] if hours is None else replace(SHAPES[shape], hours=hours)
    trace = generate_trace(form, seed)
    # As `crater autoscale-sim` runs them: the service's shipped defaults.
    scaling = ScalingPolicy()
    config = SimulationConfig(
        policy=replace(scaling, target_pressure=target) if family == "crater" else scaling,
        seed=seed,
    )
    started = time.perf_counter()
    policy: str | Baseline = "crater" if family == "crater" else baseline(family, target, trace)
    result = simulate(trace, config, policy)
    return {
        "shape": shape,
        "seed": seed,
        "policy": family,
        "target": target,
        "slo_attainment": round(result.slo_attainment, 5),
        "replica_minutes": round(result.replica_minutes, 1),
        "p95_ms": round(result.p95_ms, 1),
        "scale_events": len(result.scale_events),
        "scale_outs": result.scale_outs,
        "scale_ins": result.scale_ins,
        "panic_scale_outs": result.panics,
        "reversals": result.reversals,
        "decisions_not_carried_out": result.disagreements,
        "peak_replicas": result.peak_replicas,
        "max_replicas": result.max_replicas,
        "not_the_shipped_defaults": (
            describe_departures(config.policy) if family == "crater" else None
        ),
        "seconds": round(time.perf_counter() - started, 1),
    }


def seeds(text: str) -> list[int]:
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def mean_of(runs: list[dict[str, object]], key: str) -> float:
    return sum(float(str(r[key])) for r in runs) / len(runs)


def compare(means: list[dict[str, object]], shape: str, families: list[str]) -> dict[str, object]:
    """Each family's frontier on `shape`, and Crater's (shipped target) distance to each and
    to the best at its attainment; with the clairvoyant reference run, its frontier too, and
    how much fewer it holds than the best baseline at Crater's attainment."""
    reference = [m for m in means if (m["shape"], m["policy"]) == (shape, CLAIRVOYANT)]
    shipped = ScalingPolicy().target_pressure
    crater = next(
        (m for m in means if (m["shape"], m["policy"], m["target"]) == (shape, "crater", shipped)),
        None,
    )
    fronts: dict[str, list[Point]] = {}
    for family in families:
        fronts[family] = pareto(
            Point(
                float(str(m["replica_minutes"])),
                float(str(m["slo_attainment"])),
                f"{m['target']:g}",
            )
            for m in means
            if (m["shape"], m["policy"]) == (shape, family)
        )
    body: dict[str, object] = {
        "frontiers": {
            family: [
                {
                    "target": p.label,
                    "slo_attainment": p.attainment,
                    "replica_minutes": p.replica_minutes,
                }
                for p in front
            ]
            for family, front in fronts.items()
        }
    }
    if crater is None:
        return body
    attainment = float(str(crater["slo_attainment"]))
    minutes = float(str(crater["replica_minutes"]))
    against: dict[str, object] = {}
    best: tuple[float, str] | None = None
    for family, front in fronts.items():
        read = minutes_at(front, attainment)
        entry: dict[str, object] = {"replica_minutes": read.replica_minutes, "how": read.how}
        if read.replica_minutes is not None:
            entry["crater_fewer"] = round(saving(minutes, read.replica_minutes), 4)
            if best is None or read.replica_minutes < best[0]:
                best = (read.replica_minutes, family)
        against[family] = entry
    body["crater"] = {"slo_attainment": attainment, "replica_minutes": minutes}
    body["at_crater_attainment"] = against
    if best is not None:
        body["best"] = {
            "family": best[1],
            "replica_minutes": round(best[0], 1),
            "crater_fewer": round(saving(minutes, best[0]), 4),
        }
    if reference:
        front = pareto(
            Point(
                float(str(m["replica_minutes"])),
                float(str(m["slo_attainment"])),
                f"{m['target']:g}",
            )
            for m in reference
        )
        body["frontiers"][CLAIRVOYANT] = [  # type: ignore[index]
            {
                "target": p.label,
                "slo_attainment": p.attainment,
                "replica_minutes": p.replica_minutes,
            }
            for p in front
        ]
        read = minutes_at(front, attainment)
        foresight: dict[str, object] = {"replica_minutes": read.replica_minutes, "how": read.how}
        if read.replica_minutes is not None:
            foresight["crater_fewer"] = round(saving(minutes, read.replica_minutes), 4)
            if best is not None:
                # The most any policy could claim against the best baseline, by this reference.
                foresight["fewer_than_best_baseline"] = round(
                    saving(read.replica_minutes, best[0]), 4
                )
        body[CLAIRVOYANT] = foresight
    return body


def draw(report: dict[str, dict[str, object]], means: list[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = list(report)
    figure, axes = plt.subplots(1, len(shapes), figsize=(7 * len(shapes), 5.5), squeeze=False)
    for axis, shape in zip(axes[0], shapes, strict=True):
        for family in report[shape]["frontiers"]:  # type: ignore[union-attr]
            mine = [m for m in means if (m["shape"], m["policy"]) == (shape, family)]
            xs = [float(str(m["replica_minutes"])) for m in mine]
            ys = [100 * float(str(m["slo_attainment"])) for m in mine]
            dots = axis.scatter(xs, ys, s=18, alpha=0.5)
            front = report[shape]["frontiers"][family]  # type: ignore[index]
            axis.plot(
                [p["replica_minutes"] for p in front],
                [100 * p["slo_attainment"] for p in front],
                color=dots.get_facecolor()[0],
                label=f"{family} (targets {', '.join(p['target'] for p in front)})",
            )
            for m, x, y in zip(mine, xs, ys, strict=True):
                axis.annotate(
                    f"{m['target']:g}",
                    (x, y),
                    fontsize=7,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
        crater = report[shape].get("crater")
        if isinstance(crater, dict):
            axis.scatter(
                [crater["replica_minutes"]],
                [100 * crater["slo_attainment"]],
                marker="*",
                s=220,
                color="black",
                label="Crater, shipped defaults",
                zorder=5,
            )
            # Zoomed on Crater's neighbourhood: the collapsed targets (SLO near 0) are in the
            # JSON and would flatten the rest.
            floor = max(0.0, 100 * crater["slo_attainment"] - 15)
            mine = [m for m in means if m["shape"] == shape]
            shown = [
                float(str(m["replica_minutes"]))
                for m in mine
                if 100 * float(str(m["slo_attainment"])) >= floor
            ]
            top = 100 * max(float(str(m["slo_attainment"])) for m in mine) + 1
            axis.set_ylim(floor, top)
            axis.set_xlim(min(shown) * 0.95, max(shown) * 1.03)
        axis.set_title(
            f"{shape}: mean of the seeds per target (up and left is better; zoomed)", fontsize=10
        )
        axis.set_xlabel("replica-minutes (holding GPUs)")
        axis.set_ylabel("SLO attainment, % of requests with TTFT <= 200 ms")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8, loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=seeds, default=seeds("1-5"))
    parser.add_argument(
        "--shapes",
        default="diurnal,sharp",
        help=f"Trace shapes (comma-separated) of: {', '.join(SHAPES)}.",
    )
    parser.add_argument("--crater-targets", default=TARGETS["crater"])
    parser.add_argument("--hpa-slots-targets", default=TARGETS["hpa-slots"])
    parser.add_argument("--hpa-kv-targets", default=TARGETS["hpa-kv"])
    parser.add_argument("--kpa-targets", default=TARGETS["kpa"])
    parser.add_argument(
        "--baselines", default=",".join(BASELINES), help="Which baselines to run (comma-separated)."
    )
    parser.add_argument(
        "--clairvoyant",
        action="store_true",
        help="Also run the clairvoyant reference (knows the trace ahead; not a baseline).",
    )
    parser.add_argument("--clairvoyant-targets", default=TARGETS[CLAIRVOYANT])
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--output", type=Path, default=RESULTS)
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument(
        "--hours", type=float, default=None, help="Shorten the traces (a smoke run); default 4."
    )
    args = parser.parse_args(argv)
    families = [f for f in args.baselines.split(",") if f]
    for family in families:
        baseline(family, 1.0)  # refuses an unknown name before any run
    targets = {
        "crater": args.crater_targets,
        "hpa-slots": args.hpa_slots_targets,
        "hpa-kv": args.hpa_kv_targets,
        "kpa": args.kpa_targets,
        CLAIRVOYANT: args.clairvoyant_targets,
    }
    policies = ["crater", *families, *([CLAIRVOYANT] if args.clairvoyant else [])]
    notes = sorted(
        {
            note
            for target in args.crater_targets.split(",")
            if (note := describe_departures(ScalingPolicy(target_pressure=float(target))))
        }
    )
    for note in notes:
        print(f"!!! {note}", file=sys.stderr)
    shapes = args.shapes.split(",")
    load_before = os.getloadavg()
    jobs = [
        (shape, seed, policy, float(target), args.hours)
        for shape in shapes
        for seed in args.seeds
        for policy in policies
        for target in targets[policy].split(",")
    ]
    started = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            runs = list(pool.map(one, jobs))
    else:
        runs = [one(job) for job in jobs]
    means: list[dict[str, object]] = []
    for shape in shapes:
        for policy in policies:
            for target in (float(t) for t in targets[policy].split(",")):
                mine = [
                    r
                    for r in runs
                    if (r["shape"], r["policy"], r["target"]) == (shape, policy, target)
                ]
                slo = mean_of(mine, "slo_attainment")
                minutes = mean_of(mine, "replica_minutes")
                reversals = mean_of(mine, "reversals")
                means.append(
                    {
                        "shape": shape,
                        "policy": policy,
                        "target": target,
                        "seeds": len(mine),
                        "slo_attainment": round(slo, 4),
                        "replica_minutes": round(minutes, 1),
                        "reversals": round(reversals, 1),
                        "runs_with_a_reversal": sum(1 for r in mine if int(str(r["reversals"]))),
                        "panic_scale_outs": round(mean_of(mine, "panic_scale_outs"), 1),
                    }
                )
                print(
                    f"{shape:8s} {policy:9s} target {target:<4g} SLO {slo:7.2%}  "
                    f"replica-minutes {minutes:7,.0f}  reversals within 120 s {reversals:5.1f}"
                    f"  (mean of {len(mine)} seeds)"
                )
    report = {shape: compare(means, shape, families) for shape in shapes}
    for shape, body in report.items():
        crater = body.get("crater")
        if not isinstance(crater, dict):
            continue
        print(
            f"{shape}: Crater {crater['slo_attainment']:.2%} at {crater['replica_minutes']:,.0f}"
            " replica-minutes; at that attainment:"
        )
        for family, entry in body["at_crater_attainment"].items():  # type: ignore[union-attr]
            if entry["replica_minutes"] is None:
                print(f"  {family:9s} never reaches it")
            else:
                print(
                    f"  {family:9s} {entry['replica_minutes']:7,.0f} ({entry['how']}); "
                    f"Crater {entry['crater_fewer']:+.1%} fewer"
                )
        if "best" in body:
            best = body["best"]
            print(f"  best: {best['family']}; Crater {best['crater_fewer']:+.1%} fewer")  # type: ignore[index]
        foresight = body.get(CLAIRVOYANT)
        if isinstance(foresight, dict) and foresight["replica_minutes"] is not None:
            print(
                f"  clairvoyant reference {foresight['replica_minutes']:7,.0f} "
                f"({foresight['how']}); Crater {foresight['crater_fewer']:+.1%} fewer"
                + (
                    f"; it holds {foresight['fewer_than_best_baseline']:+.1%} fewer than the "
                    "best baseline"
                    if "fewer_than_best_baseline" in foresight
                    else ""
                )
            )
    load_after = os.getloadavg()
    elapsed = time.perf_counter() - started
    print(
        f"{len(runs)} runs in {elapsed / 60:.1f} min; load average (1, 5, 15 min): before "
        + " ".join(f"{v:.2f}" for v in load_before)
        + ", after "
        + " ".join(f"{v:.2f}" for v in load_after)
    )
    carried = sum(int(str(r["decisions_not_carried_out"])) for r in runs)
    over = [r for r in runs if int(str(r["peak_replicas"])) > int(str(r["max_replicas"]))]
    print(f"decisions not carried out as asked: {carried}; runs over their cap: {len(over)}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "command": "python benchmarks/autoscaler/frontier.py "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "load_average": {"before": load_before, "after": load_after},
        "minutes": round(elapsed / 60, 1),
        "policy": vars(ScalingPolicy()),
        "baselines": {
            family: vars(baseline(family, float(targets[family].split(",")[0])))
            | {"swept": targets[family]}
            for family in families
        },
        **(
            {
                CLAIRVOYANT: {
                    "what": "a reference that knows the trace ahead, not a baseline",
                    **{
                        k: v
                        for k, v in vars(ClairvoyantBaseline([])).items()
                        if k not in ("trace", "model", "utilisation")
                    },
                    "swept": targets[CLAIRVOYANT],
                }
            }
            if args.clairvoyant
            else {}
        ),
        "not_the_shipped_defaults": notes,
        "seeds": args.seeds,
        "shapes": {
            name: vars(
                SHAPES[name] if args.hours is None else replace(SHAPES[name], hours=args.hours)
            )
            for name in shapes
        },
        "slo": "TTFT <= 200 ms",
        "frontier": report,
        "means": means,
        "runs": runs,
    }
    args.output.write_text(json.dumps(body, indent=2, default=list) + "\n")
    print(f"wrote {args.output}")
    if not args.no_plot:
        picture = args.output.with_suffix(".png")
        draw(report, means, picture)
        print(f"wrote {picture}")


if __name__ == "__main__":
    main()
