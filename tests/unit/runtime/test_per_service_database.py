"""A service's own prefix may give it a database of its own (CRATER_CALLBACK_DATABASE_URL);
without it, every service reads the shared CRATER_DATABASE_URL."""

from __future__ import annotations

import pytest

from crater.callback.app import CallbackSettings
from crater.runtime.settings import DEFAULT_DATABASE_URL
from crater.scheduler.app import SchedulerSettings

SHARED = "sqlite+aiosqlite:///var/shared.db"
OWN = "sqlite+aiosqlite:///var/callback.db"


def test_the_shared_database_when_a_service_is_given_none_of_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CRATER_DATABASE_URL", SHARED)
    assert CallbackSettings().database_url == SHARED
    assert SchedulerSettings().database_url == SHARED


def test_a_services_own_database_wins_and_is_only_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CRATER_DATABASE_URL", SHARED)
    monkeypatch.setenv("CRATER_CALLBACK_DATABASE_URL", OWN)
    assert CallbackSettings().database_url == OWN
    assert SchedulerSettings().database_url == SHARED  # another service's is not read


def test_its_own_database_alone_and_the_default_without_either(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("CRATER_DATABASE_URL", raising=False)
    monkeypatch.setenv("CRATER_CALLBACK_DATABASE_URL", OWN)
    assert CallbackSettings().database_url == OWN
    assert SchedulerSettings().database_url == DEFAULT_DATABASE_URL
