"""Which database each process of a stack gets: on the stack's default SQLite the callback has a
file of its own (its commits never queue behind the scheduler's for the file's one write
lock); a database given for all is used by all; the callback's own, when given, is its."""

from __future__ import annotations

from pathlib import Path

import pytest

from crater.cli.demo import write_env_file
from crater.cli.stack import Stack

GIVEN = "postgresql+asyncpg://crater@db/crater"


def test_the_default_sqlite_gives_the_callback_a_file_of_its_own(tmp_path: Path) -> None:
    stack = Stack(data_dir=tmp_path)
    assert stack.database_url == f"sqlite+aiosqlite:///{tmp_path / 'crater.db'}"
    assert stack._callback_database() == f"sqlite+aiosqlite:///{tmp_path / 'callback.db'}"


def test_a_database_given_for_all_is_the_callbacks_too(tmp_path: Path) -> None:
    stack = Stack(data_dir=tmp_path, env={"CRATER_DATABASE_URL": GIVEN})
    assert stack._callback_database() is None
    assert stack.callback_database_url == GIVEN


def test_the_callbacks_own_when_given(tmp_path: Path) -> None:
    own = f"sqlite+aiosqlite:///{tmp_path / 'mine.db'}"
    stack = Stack(
        data_dir=tmp_path, env={"CRATER_DATABASE_URL": GIVEN, "CRATER_CALLBACK_DATABASE_URL": own}
    )
    assert stack._callback_database() == own
    assert stack.callback_database_url == own


def test_the_demos_env_file_names_the_callbacks_database(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Stack, "url", lambda self, name: "http://127.0.0.1:8080")
    monkeypatch.setattr(Stack, "nats_url", property(lambda self: "nats://127.0.0.1:4222"))
    stack = Stack(data_dir=tmp_path)
    callback = stack._callback_database()
    assert callback is not None
    stack.env = {
        "CRATER_DATABASE_URL": stack.database_url,
        "CRATER_CALLBACK_DATABASE_URL": callback,
    }
    text = write_env_file(stack).read_text()
    own = f"sqlite+aiosqlite:///{tmp_path / 'callback.db'}"
    assert f"export CRATER_CALLBACK_DATABASE_URL={own}" in text
    shared = Stack(data_dir=tmp_path, env={"CRATER_DATABASE_URL": GIVEN})
    assert "CRATER_CALLBACK_DATABASE_URL" not in write_env_file(shared).read_text()


def test_every_process_is_told_both_so_a_shells_leftover_never_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CRATER_CALLBACK_DATABASE_URL", "sqlite+aiosqlite:///stale/callback.db")
    shared = Stack(data_dir=tmp_path, env={"CRATER_DATABASE_URL": GIVEN})
    assert shared._database_env() == {
        "CRATER_DATABASE_URL": GIVEN,
        "CRATER_CALLBACK_DATABASE_URL": GIVEN,
    }
    own = Stack(data_dir=tmp_path)._database_env()
    assert own["CRATER_CALLBACK_DATABASE_URL"].endswith("/callback.db")
    assert own["CRATER_CALLBACK_DATABASE_URL"] != own["CRATER_DATABASE_URL"]
    # a database given at start is decided on with the rest
    late = Stack(data_dir=tmp_path)._database_env({"CRATER_DATABASE_URL": GIVEN})
    assert late["CRATER_CALLBACK_DATABASE_URL"] == GIVEN
