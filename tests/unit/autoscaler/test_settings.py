from __future__ import annotations

import pytest
from pydantic import ValidationError

from crater.autoscaler.app import AutoscalerSettings, build
from crater.autoscaler.domain import ScalingPolicy


def test_defaults_are_the_fields_rule() -> None:
    assert AutoscalerSettings().policy() == ScalingPolicy()
    policy = ScalingPolicy()
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
