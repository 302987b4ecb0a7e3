from __future__ import annotations

import pytest
from pydantic import ValidationError

from crater.autoscaler.app import AutoscalerSettings, build
from crater.autoscaler.domain import ScalingPolicy


def test_defaults_are_the_demand_strategy_over_the_fields_thresholds() -> None:
    assert AutoscalerSettings().policy() == ScalingPolicy()
    policy = ScalingPolicy()
    assert (policy.strategy, policy.target_pressure, policy.drain_seconds) == ("demand", 0.7, 60)
    assert (policy.scale_out_p95_ms, policy.scale_out_pressure) == (200.0, 0.8)
    assert (policy.scale_in_p95_ms, policy.scale_in_pressure) == (100.0, 0.3)
    assert (policy.window_seconds, policy.stabilisation_seconds) == (60.0, 300.0)
    assert (policy.cooldown_seconds, policy.min_replicas, policy.max_replicas) == (15.0, 1, 16)


def test_settings_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRATER_AUTOSCALER_SCALE_OUT_P95_MS", "350")
    monkeypatch.setenv("CRATER_AUTOSCALER_MAX_REPLICAS", "64")
    policy = AutoscalerSettings().policy()
    assert (policy.scale_out_p95_ms, policy.max_replicas) == (350.0, 64)


def test_inconsistent_settings_are_refused_at_start() -> None:
    with pytest.raises(ValidationError, match="scale_in_p95_ms"):
        AutoscalerSettings(scale_in_p95_ms=500)


def test_build_wires_the_service_on_its_port() -> None:
    service, _ = build(AutoscalerSettings())
    assert service.name == "autoscaler"
    assert service.port == 9104


def test_the_new_policy_features_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CRATER_AUTOSCALER_WARM_POOL_SIZE", "2")
    monkeypatch.setenv("CRATER_AUTOSCALER_MAX_SCALE_IN_STEP", "3")
    monkeypatch.setenv("CRATER_AUTOSCALER_SCALE_IN_HEADROOM", "0.9")
    monkeypatch.setenv("CRATER_AUTOSCALER_PANIC_P95_MS", "0")
    policy = AutoscalerSettings().policy()
    assert (policy.warm_pool_size, policy.max_scale_in_step) == (2, 3)
    assert policy.scale_in_headroom == 0.9
    assert policy.panic_p95_ms is None  # 0: panic mode off
    defaults = AutoscalerSettings().model_copy(update={"panic_p95_ms": 400.0}).policy()
    assert defaults.panic_p95_ms == 400.0


def test_the_strategy_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRATER_AUTOSCALER_STRATEGY", "rule")
    monkeypatch.setenv("CRATER_AUTOSCALER_TARGET_PRESSURE", "0.7")
    policy = AutoscalerSettings().policy()
    assert (policy.strategy, policy.target_pressure) == ("rule", 0.7)
    monkeypatch.setenv("CRATER_AUTOSCALER_STRATEGY", "guess")
    with pytest.raises(ValidationError, match="strategy"):
        AutoscalerSettings()
