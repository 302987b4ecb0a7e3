from __future__ import annotations

from pathlib import Path

import pytest

from crater.probe.app import ProbeSettings


def test_probe_fields_read_crater_probe_variables_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRATER_PROBE_MODE", "fleet")
    monkeypatch.setenv("CRATER_PROBE_TASK_SECONDS_MIN", "2")
    monkeypatch.setenv("CRATER_PROBE_TASK_SECONDS_MAX", "3.5")
    monkeypatch.setenv("CRATER_PROBE_FLEET_FILE", "/etc/crater/fleet.yaml")
    monkeypatch.setenv("CRATER_SEED", "3")  # another service's
    monkeypatch.setenv("CRATER_NATS_URL", "nats://bus:4222")  # shared
    monkeypatch.setenv("CRATER_PROBE_NATS_URL", "nats://ignored:1")
    settings = ProbeSettings()
    assert settings.mode == "fleet"
    assert (settings.task_seconds_min, settings.task_seconds_max) == (2.0, 3.5)
    assert settings.fleet_file == Path("/etc/crater/fleet.yaml")
    assert settings.seed is None
    assert settings.nats_url == "nats://bus:4222"


def test_defaults_and_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRATER_PROBE_MODE", "fleet")
    assert ProbeSettings(mode="local").mode == "local"  # arguments win
    defaults = ProbeSettings(mode="local")
    assert defaults.metrics_interval_seconds == defaults.health_interval_seconds == 5
    assert defaults.topology_interval_seconds == 300
    assert (defaults.task_seconds_min, defaults.task_seconds_max) == (8, 30)
    assert defaults.fleet_file is None


def test_inverted_task_seconds_are_refused() -> None:
    with pytest.raises(ValueError, match="task_seconds_min exceeds task_seconds_max"):
        ProbeSettings(task_seconds_min=10, task_seconds_max=5)


def test_discovery_and_measurement_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = ProbeSettings()
    assert defaults.discovery_interval_seconds == 60
    assert defaults.full_measurement is False
    monkeypatch.setenv("CRATER_PROBE_FULL_MEASUREMENT", "true")
    monkeypatch.setenv("CRATER_PROBE_DISCOVERY_INTERVAL_SECONDS", "15")
    monkeypatch.setenv("CRATER_PROBE_MEASURE_SECONDS", "3")
    monkeypatch.setenv("CRATER_PROBE_MEASURE_DISK_FILE_MB", "128")
    settings = ProbeSettings()
    assert settings.full_measurement is True
    assert settings.discovery_interval_seconds == 15
    bounds = settings.bounds
    assert (bounds.disk_seconds, bounds.memory_seconds) == (3, 1)
    assert (bounds.disk_file_mb, bounds.memory_buffer_mb) == (128, 64)


def test_pcie_measurement_is_off_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ProbeSettings().measure_pcie_bandwidth is False
    monkeypatch.setenv("CRATER_PROBE_MEASURE_PCIE_BANDWIDTH", "true")
    monkeypatch.setenv("CRATER_PROBE_MEASURE_PCIE_BUFFER_MB", "256")
    settings = ProbeSettings()
    assert settings.measure_pcie_bandwidth is True
    assert settings.copy_bounds.buffer_mb == 256
