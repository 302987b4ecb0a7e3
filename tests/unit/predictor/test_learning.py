from __future__ import annotations

import pytest

from crater.predictor.domain.learning import Rule, Track, learn


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
    rule = Rule(alpha=1.0, minimum=0.5, maximum=2.0)
    assert learn(Track(), 1_000, 1_000, 100_000, rule).factor == 2.0
    assert learn(Track(), 1_000, 1_000, 10, rule).factor == 0.5
    assert learn(Track(), 0, 0, 1_000, rule) == Track()
    assert learn(Track(), 1_000, 1_000, 0, rule) == Track()
    assert Track().mape is None
