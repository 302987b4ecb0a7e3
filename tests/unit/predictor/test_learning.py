from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from crater.predictor.domain.learning import (
    Held,
    Observation,
    Outcome,
    Rule,
    Sample,
    Track,
    exclusive,
    judge,
    learn,
    observe,
    overlaps,
)

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_the_factor_moves_toward_the_observed_ratio() -> None:
    rule = Rule(alpha=0.5)
    track = learn(Track(), raw_mb=10_000, predicted_mb=10_000, observed_mb=12_000, rule=rule)
    assert track.factor == pytest.approx(1.1)  # halfway from 1.0 to 1.2
    assert track.samples == 1
    assert track.mape == pytest.approx(2_000 / 12_000)
    for _ in range(20):
        track = learn(track, 10_000, round(10_000 * track.factor), 12_000, rule)
    assert track.factor == pytest.approx(1.2, rel=1e-4)


def test_the_factor_is_clamped_and_nonsense_is_ignored() -> None:
    rule = Rule(alpha=1.0, minimum=0.5, maximum=2.0, max_step=10.0)
    assert learn(Track(), 1_000, 1_000, 100_000, rule).factor == 2.0
    assert learn(Track(), 1_000, 1_000, 10, rule).factor == 0.5
    assert learn(Track(), 0, 0, 1_000, rule) == Track()
    assert learn(Track(), 1_000, 1_000, 0, rule) == Track()
    assert Track().mape is None


def test_one_observation_moves_the_factor_one_bounded_step() -> None:
    rule = Rule(alpha=1.0, max_step=0.1)
    up = learn(Track(), 1_000, 1_000, 100_000, rule)
    assert up.factor == pytest.approx(1.1)  # not 2.0: one outlier moves it 10% at most
    down = learn(Track(), 1_000, 1_000, 10, rule)
    assert down.factor == pytest.approx(1 / 1.1)
    # a run of outliers walks it to the bound and no further
    track = Track()
    for _ in range(50):
        track = learn(track, 1_000, 1_000, 100_000, rule)
    assert track.factor == rule.maximum == 2.0


def test_the_default_range_is_half_to_double() -> None:
    rule = Rule()
    assert (rule.minimum, rule.maximum) == (0.5, 2.0)
    assert rule.bounded(4.0) == 2.0  # a factor stored under a wider range is brought in
    assert rule.bounded(0.25) == 0.5
    assert not rule.applies(Track(1.2, rule.min_observations - 1))
    assert rule.applies(Track(1.2, rule.min_observations))


def test_use_below_the_prediction_never_raises_it() -> None:
    rule = Rule()
    track = Track(1.3, 5, 0.0)
    for observed in (13_000, 12_000, 9_000, 5_000):  # raw 10,000 x 1.3 predicted
        after = learn(track, 10_000, 13_000, observed, rule)
        assert after.factor <= track.factor
        track = after


def test_an_observation_is_the_peak_of_readings_while_it_ran_and_held_its_cards_alone() -> None:
    rule = Rule()
    readings = [
        Sample(at(0), 70_000, 81_920),  # before running: the last tenant's memory, maybe
        Sample(at(10), 30_000, 81_920),
        Sample(at(20), 31_000, 81_920),
        Sample(at(30), 60_000, 81_920),  # someone else held one of the cards then
        Sample(at(40), 30_500, 81_920),
        Sample(at(50), 75_000, 81_920),  # after the release: the next tenant
    ]
    others = [Held(at(25), at(35))]
    observation = observe(readings, running_at=at(5), released_at=at(45), others=others, rule=rule)
    assert observation == Observation(31_000, 3)
    assert judge(observation, raw_mb=30_000, rule=rule) is Outcome.LEARNED
    # a neighbour still holding its card covers every later reading
    assert observe(readings, at(5), at(45), [Held(at(0), None)], rule) == Observation(0, 0)


def test_too_few_readings_a_full_card_or_nothing_modelled_teach_nothing() -> None:
    rule = Rule(min_samples=3)
    few = Observation(30_000, 2)
    assert judge(few, 30_000, rule) is Outcome.TOO_FEW_SAMPLES
    full = observe(
        [Sample(at(s), mb, 24_564) for s, mb in ((1, 20_000), (2, 24_500), (3, 24_564))],
        at(0),
        at(10),
        [],
        rule,
    )
    assert full.saturated  # clipped by the card: "at least", not a peak
    assert judge(full, 20_000, rule) is Outcome.SATURATED
    assert judge(Observation(30_000, 5), 0, rule) is Outcome.NO_PREDICTION


def test_only_whole_cards_are_attributable() -> None:
    assert exclusive(1000, None)
    assert not exclusive(500, None)  # a shared card's use is not one task's
    assert not exclusive(1000, "1g.10gb")
    assert overlaps([0, 1], [1, 2])
    assert not overlaps([0, 1], [2, 3])
