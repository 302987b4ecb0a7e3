"""The failover benchmark's own figures (benchmarks/failover/run.py), on made-up records."""

from __future__ import annotations

from benchmarks.failover.run import _longest_gap, epoch_order, non_default_settings


def test_epochs_one_at_a_time_and_a_lower_one_after_a_higher_is_counted() -> None:
    clean = epoch_order([(1.0, 1), (2.0, 1), (3.0, 41), (4.0, 41), (5.0, 64)])
    assert [r["epoch"] for r in clean["runs"]] == [1, 41, 64]
    assert clean["grants_below_a_seen_epoch"] == 0
    zombie = epoch_order([(1.0, 1), (2.0, 41), (3.0, 1), (4.0, None)])
    assert zombie["grants_below_a_seen_epoch"] == 1
    assert zombie["unstamped_grants"] == 1


def test_longest_gap_counts_the_window_edges() -> None:
    assert _longest_gap([2.0, 3.0, 9.0], 0.0, 10.0) == 6.0
    assert _longest_gap([5.0], 0.0, 6.0) == 5.0
    assert _longest_gap([], 0.0, 10.0) is None


def test_settings_off_the_shipped_defaults_are_named() -> None:
    assert non_default_settings({}) == []
    assert non_default_settings({"CRATER_SCHEDULER_LEASE_SECONDS": "1.5"}) == [
        "CRATER_SCHEDULER_LEASE_SECONDS=1.5 (shipped: 2.0)"
    ]
