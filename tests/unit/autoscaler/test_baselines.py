"""The baselines' decision rules (the HPA on slot or KV-cache utilisation, the KPA-like
concurrency autoscaler), observation by observation, and the frontier's Pareto set and
interpolation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crater.autoscaler.sim import (
    HpaBaseline,
    KpaBaseline,
    Observation,
    SimulationConfig,
    TraceShape,
    generate_trace,
    simulate,
)
from crater.autoscaler.sim.frontier import Point, minutes_at, pareto, saving


def _slots(now: float, current: int, utilisation: float, ready: int | None = None) -> Observation:
    return Observation(now, current, current if ready is None else ready, utilisation, 0.0, 0.0)


# -- HPA ----------------------------------------------------------------------------------


def test_the_hpa_holds_within_its_tolerance() -> None:
    hpa = HpaBaseline(target_utilisation=0.5).controller(4, 1, 16)
    assert hpa.decide(_slots(15, 4, 0.54)).desired == 4  # ratio 1.08: within 10%
    assert hpa.decide(_slots(30, 4, 0.56)).desired == 5  # ratio 1.12: ceil(4 * 1.12)


def test_the_hpa_scales_out_by_at_most_four_pods_or_double() -> None:
    hpa = HpaBaseline(target_utilisation=0.1).controller(2, 1, 40)
    assert hpa.decide(_slots(15, 2, 1.0)).desired == 6  # wants 20: 2 + 4 pods
    assert hpa.decide(_slots(30, 10, 1.0)).desired == 20  # wants 100: double 10
    assert hpa.decide(_slots(45, 30, 1.0)).desired == 40  # the cap


def test_the_hpa_scales_in_to_the_highest_recommendation_of_five_minutes() -> None:
    hpa = HpaBaseline(target_utilisation=0.5).controller(8, 1, 16)
    assert hpa.decide(_slots(15, 8, 0.5)).desired == 8
    # Load falls to a quarter: the recommendation is 2, but 8 was recommended within 300 s.
    for now in (30, 150, 299):
        assert hpa.decide(_slots(now, 8, 0.125)).desired == 8
    # 300 s after the start's and the first sync's 8s, they leave the window.
    assert hpa.decide(_slots(315, 8, 0.125)).desired == 2
    decided = hpa.decide(_slots(330, 2, 0.5))
    assert decided.desired == 2


def test_the_kv_hpa_reads_the_kv_cache_not_the_slots() -> None:
    hpa = HpaBaseline(metric="kv", target_utilisation=0.5).controller(4, 1, 16)
    seen = Observation(15, 4, 4, slot_utilisation=0.1, kv_utilisation=1.0, concurrency=0)
    decided = hpa.decide(seen)
    assert decided.desired == 8
    assert "KV-cache utilisation 1.00" in decided.reason
    assert HpaBaseline(metric="kv").name == "hpa-kv"
    assert HpaBaseline().name == "hpa-slots"


def test_the_hpa_stays_within_min_and_max() -> None:
    hpa = HpaBaseline(target_utilisation=0.5).controller(3, 3, 5)
    assert hpa.decide(_slots(15, 3, 0.0)).desired == 3
    assert hpa.decide(_slots(30, 5, 5.0)).desired == 5


# -- KPA ----------------------------------------------------------------------------------


def _load(now: float, current: int, concurrency: float) -> Observation:
    return Observation(now, current, current, concurrency=concurrency)


def test_the_kpa_sizes_for_its_target_over_the_stable_window() -> None:
    kpa = KpaBaseline(target_concurrency=10).controller(3, 1, 16)  # 7 per replica (70%)
    decided = kpa.decide(_load(2, 3, 20.0))
    assert decided.desired == 3  # ceil(20 / 7)
    assert not decided.panic
    # The stable window averages: 20 for 60 s, then 34 for one tick barely moves it.
    for now in range(4, 62, 2):
        kpa.decide(_load(now, 3, 20.0))
    assert kpa.decide(_load(62, 3, 34.0)).desired == 3


def test_the_kpa_panics_at_twice_its_replicas_and_does_not_scale_in_while_panicking() -> None:
    kpa = KpaBaseline(target_concurrency=10).controller(2, 1, 16)
    for now in range(2, 62, 2):
        assert kpa.decide(_load(now, 2, 7.0)).desired == 1  # least: ready / 2
    # A burst: over the 6 s panic window the mean reaches 28 -> 4 replicas = 200% of 2.
    kpa.decide(_load(62, 2, 28.0))
    kpa.decide(_load(64, 2, 28.0))
    burst = kpa.decide(_load(66, 2, 28.0))
    assert burst.panic
    assert burst.desired == 4
    assert burst.reason.startswith("panic")
    # The burst ends: no scale-in while panicking, for a stable window after the last tick
    # over the threshold.
    for now in range(68, 126, 2):
        decided = kpa.decide(_load(now, 4, 2.0))
        assert decided.panic
        assert decided.desired == 4
    calm = kpa.decide(_load(130, 4, 2.0))
    assert not calm.panic
    assert calm.desired < 4


def test_the_kpa_does_not_panic_under_twice_its_replicas() -> None:
    kpa = KpaBaseline(target_concurrency=10).controller(4, 1, 16)
    for now in range(2, 62, 2):
        kpa.decide(_load(now, 4, 21.0))  # stable: 3
    decided = kpa.decide(_load(62, 4, 49.0))  # panic window: ceil((21 + 21 + 49) / 3 / 7) = 5
    assert not decided.panic
    assert decided.desired == 4  # the stable window's: ceil(mean 21.9 / 7)


def test_the_kpa_halves_at_most_per_tick() -> None:
    kpa = KpaBaseline(target_concurrency=10).controller(8, 1, 16)
    assert kpa.decide(_load(2, 8, 0.0)).desired == 4


def test_a_kpa_scale_down_delay_keeps_the_highest_desire_over_it() -> None:
    kpa = KpaBaseline(target_concurrency=10, scale_down_delay_s=30).controller(4, 1, 16)
    assert kpa.decide(_load(2, 4, 28.0)).desired == 4
    kpa.samples.clear()  # what the windows hold is not what this checks
    assert kpa.decide(_load(20, 4, 0.0)).desired == 4  # 2 was asked; 4 within 30 s
    kpa.samples.clear()
    assert kpa.decide(_load(40, 4, 0.0)).desired == 2


@pytest.mark.parametrize(
    "baseline",
    [HpaBaseline(metric="kv", target_utilisation=0.5), KpaBaseline(target_concurrency=6)],
)
def test_the_new_baselines_run_deterministically_and_do_what_they_decide(
    baseline: HpaBaseline | KpaBaseline,
) -> None:
    trace = generate_trace(
        TraceShape(hours=0.25, trough_rps=2.0, peak_rps=12.0, bursts_per_hour=4.0), seed=1
    )
    config = SimulationConfig(seed=1)
    first = simulate(trace, config, baseline)
    assert first == simulate(trace, config, baseline)
    assert first.policy == baseline.name
    assert first.scale_events
    assert first.disagreements == 0
    assert first.peak_replicas <= first.max_replicas
    assert simulate(trace, config, baseline.name).policy == baseline.name


def test_an_unknown_baseline_is_refused() -> None:
    with pytest.raises(ValueError, match="hpa-slots, hpa-kv, kpa"):
        simulate([], SimulationConfig(), "vpa")


# -- the frontier -------------------------------------------------------------------------


def test_the_frontier_keeps_the_points_nothing_beats() -> None:
    points = [
        Point(100, 0.70, "a"),
        Point(120, 0.69, "dominated by a"),
        Point(150, 0.80, "b"),
        Point(150, 0.75, "dominated by b"),
        Point(200, 0.90, "c"),
        Point(250, 0.90, "dominated by c"),
    ]
    assert [p.label for p in pareto(points)] == ["a", "b", "c"]
    assert pareto([]) == []


def test_the_frontier_is_read_at_an_attainment() -> None:
    front = pareto([Point(100, 0.70), Point(150, 0.80), Point(200, 0.90)])
    between = minutes_at(front, 0.85)
    assert between.how == "interpolated"
    assert between.replica_minutes == pytest.approx(175)
    assert minutes_at(front, 0.80).replica_minutes == pytest.approx(150)
    assert minutes_at(front, 0.90).replica_minutes == pytest.approx(200)
    below = minutes_at(front, 0.5)
    assert (below.replica_minutes, below.how) == (100, "at most")
    above = minutes_at(front, 0.95)
    assert (above.replica_minutes, above.how) == (None, "unreachable")
    assert saving(150, 200) == pytest.approx(0.25)
    assert saving(220, 200) == pytest.approx(-0.10)


def test_the_frontier_benchmark_runs_small(tmp_path: Path) -> None:
    from benchmarks.autoscaler.frontier import main

    out = tmp_path / "frontier.json"
    main(
        [
            "--shapes", "diurnal", "--seeds", "1", "--hours", "0.05",
            "--hpa-slots-targets", "0.5,0.7", "--hpa-kv-targets", "0.6",
            "--kpa-targets", "6", "--output", str(out),
        ]
    )  # fmt: skip
    body = json.loads(out.read_text())
    assert {r["policy"] for r in body["runs"]} == {"crater", "hpa-slots", "hpa-kv", "kpa"}
    assert all("reversals" in r for r in body["runs"])
    diurnal = body["frontier"]["diurnal"]
    assert set(diurnal["frontiers"]) == {"hpa-slots", "hpa-kv", "kpa"}
    assert set(diurnal["at_crater_attainment"]) == {"hpa-slots", "hpa-kv", "kpa"}
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_clairvoyant_reference_is_reported_apart_from_the_baselines(tmp_path: Path) -> None:
    from benchmarks.autoscaler.frontier import main

    out = tmp_path / "frontier.json"
    main(
        [
            "--shapes", "diurnal", "--seeds", "1", "--hours", "0.05",
            "--hpa-slots-targets", "0.5", "--hpa-kv-targets", "0.6", "--kpa-targets", "6",
            "--clairvoyant", "--clairvoyant-targets", "0.9,1.2",
            "--output", str(out), "--no-plot",
        ]
    )  # fmt: skip
    body = json.loads(out.read_text())
    assert {r["target"] for r in body["runs"] if r["policy"] == "clairvoyant"} == {0.9, 1.2}
    diurnal = body["frontier"]["diurnal"]
    assert "clairvoyant" in diurnal["frontiers"]
    # Never the best baseline, and never read as one.
    assert set(diurnal["at_crater_attainment"]) == {"hpa-slots", "hpa-kv", "kpa"}
    assert diurnal["best"]["family"] != "clairvoyant"
    assert diurnal["clairvoyant"]["how"] in {"interpolated", "exact", "at most", "unreachable"}
    assert body["clairvoyant"]["swept"] == "0.9,1.2"
