"""Crater's autoscaling policy against the HPA baseline over several seeds and trace shapes:
SLO attainment (TTFT <= 200 ms) against replica-minutes, per run and averaged per policy.

    python benchmarks/autoscaler/frontier.py --seeds 1-5 --jobs 2 --crater-targets 0.8,0.7

Each run is `crater autoscale-sim` on a generated trace (the same simulator, policies and
defaults: the service's shipped `ScalingPolicy()`, max_replicas and scale-in step included);
the HPA baseline is run at several utilisation targets, since its target is the knob that
trades replicas for latency, and Crater at several target pressures, for the same reason. A
Crater target other than the shipped one is printed, loudly, as not the shipped defaults.
Each run also reports whether the simulated fleet did what every decision asked. Writes
benchmarks/results/autoscale_seeds.json, with the command and the machine's load average.
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
    HpaBaseline,
    SimulationConfig,
    TraceShape,
    describe_departures,
    generate_trace,
    simulate,
)

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
}
RESULTS = Path(__file__).resolve().parents[1] / "results" / "autoscale_seeds.json"


def one(job: tuple[str, int, str, float]) -> dict[str, object]:
    shape, seed, policy, target = job
    trace = generate_trace(SHAPES[shape], seed)
    # As `crater autoscale-sim` runs them: the service's shipped defaults.
    scaling = ScalingPolicy()
    config = SimulationConfig(
        policy=replace(scaling, target_pressure=target) if policy == "crater" else scaling,
        hpa=HpaBaseline(target_utilisation=target if policy == "hpa" else 0.7),
        seed=seed,
    )
    started = time.perf_counter()
    result = simulate(trace, config, policy)
    return {
        "shape": shape,
        "seed": seed,
        "policy": policy,
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
        "not_the_shipped_defaults": describe_departures(config.policy),
        "seconds": round(time.perf_counter() - started, 1),
    }


def seeds(text: str) -> list[int]:
    if "-" in text:
        low, high = text.split("-")
        return list(range(int(low), int(high) + 1))
    return [int(s) for s in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=seeds, default=seeds("1-5"))
    parser.add_argument("--shapes", default="diurnal,sharp")
    parser.add_argument("--crater-targets", default="0.8")
    parser.add_argument("--hpa-targets", default="0.35,0.4,0.45,0.5,0.6,0.7")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()
    notes = sorted(
        {
            note
            for target in args.crater_targets.split(",")
            if (note := describe_departures(ScalingPolicy(target_pressure=float(target))))
        }
    )
    for note in notes:
        print(f"!!! {note}", file=sys.stderr)
    load_before = os.getloadavg()
    jobs = [
        (shape, seed, policy, float(target))
        for shape in args.shapes.split(",")
        for seed in args.seeds
        for policy, targets in (("crater", args.crater_targets), ("hpa", args.hpa_targets))
        for target in targets.split(",")
    ]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        runs = list(pool.map(one, jobs))
    means: list[dict[str, object]] = []
    for shape in args.shapes.split(","):
        for policy, targets in (("crater", args.crater_targets), ("hpa", args.hpa_targets)):
            for target in (float(t) for t in targets.split(",")):
                mine = [
                    r
                    for r in runs
                    if (r["shape"], r["policy"], r["target"]) == (shape, policy, target)
                ]
                slo = sum(float(str(r["slo_attainment"])) for r in mine) / len(mine)
                minutes = sum(float(str(r["replica_minutes"])) for r in mine) / len(mine)
                reversals = sum(int(str(r["reversals"])) for r in mine) / len(mine)
                means.append(
                    {
                        "shape": shape,
                        "policy": policy,
                        "target": target,
                        "seeds": len(mine),
                        "slo_attainment": round(slo, 4),
                        "replica_minutes": round(minutes, 1),
                        "reversals": round(reversals, 1),
                    }
                )
                print(
                    f"{shape:8s} {policy:6s} target {target:<4g} SLO {slo:7.2%}  "
                    f"replica-minutes {minutes:7,.0f}  reversals within 120 s {reversals:5.1f}"
                    f"  (mean of {len(mine)} seeds)"
                )
    load_after = os.getloadavg()
    print(
        "load average (1, 5, 15 min): before "
        + " ".join(f"{v:.2f}" for v in load_before)
        + ", after "
        + " ".join(f"{v:.2f}" for v in load_after)
    )
    carried = sum(int(str(r["decisions_not_carried_out"])) for r in runs)
    over = [r for r in runs if int(str(r["peak_replicas"])) > int(str(r["max_replicas"]))]
    print(f"decisions not carried out as asked: {carried}; runs over their cap: {len(over)}")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "command": "python benchmarks/autoscaler/frontier.py " + " ".join(sys.argv[1:]),
        "load_average": {"before": load_before, "after": load_after},
        "policy": vars(ScalingPolicy()),
        "not_the_shipped_defaults": notes,
        "seeds": args.seeds,
        "shapes": {name: vars(SHAPES[name]) for name in args.shapes.split(",")},
        "slo": "TTFT <= 200 ms",
        "means": means,
        "runs": runs,
    }
    args.output.write_text(json.dumps(body, indent=2, default=list) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
