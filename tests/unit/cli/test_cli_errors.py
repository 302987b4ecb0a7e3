"""`crater` says what is wrong and what to do, with its documented exit code, and never a
traceback (issue #23, the CLI)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from threading import Thread
from typing import Any
from wsgiref.simple_server import WSGIServer, make_server

import pytest
from typer.testing import CliRunner

from crater.cli import errors
from crater.cli.main import LAZY, app, load_command, source_help

runner = CliRunner()
NOWHERE = "http://127.0.0.1:9"  # nothing listens there


def crater(*args: str, cwd: Path | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    """`crater ARGS` in a subprocess, as a user runs it."""
    return subprocess.run(
        [sys.executable, "-m", "crater.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "CRATER_API_TOKEN": "", **env},
        timeout=120,
        check=False,
    )


def no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in result.stdout + result.stderr, result.stderr


@pytest.fixture
def gateway_answering() -> Iterator[tuple[str, list[Any]]]:
    """A stand-in gateway answering [status, body] (401 until told otherwise)."""
    status: list[Any] = [401, {"detail": "missing bearer token"}]

    def wsgi(environ: dict[str, object], start_response: object) -> list[bytes]:
        body = json.dumps(status[1]).encode()
        start_response(f"{status[0]} X", [("content-type", "application/json")])  # type: ignore[operator]
        return [body]

    server: WSGIServer = make_server("127.0.0.1", 0, wsgi)  # type: ignore[arg-type]
    server.RequestHandlerClass.log_message = lambda *a: None  # type: ignore[attr-defined]
    Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", status
    server.shutdown()


def test_submit_with_the_gateway_down_is_one_message_and_exit_3(tmp_path: Path) -> None:
    request = tmp_path / "task.json"
    request.write_text("{}")
    result = crater("submit", str(request), "--gateway", NOWHERE)
    no_traceback(result)
    assert result.returncode == errors.UNREACHABLE
    assert "no gateway at http://127.0.0.1:9" in result.stderr
    assert "CRATER_GATEWAY_URL" in result.stderr


def test_bad_json_is_checked_before_anything_is_sent(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"task_id": "a",\n')
    result = runner.invoke(app, ["submit", str(broken), "--gateway", NOWHERE])
    assert result.exit_code == errors.USAGE
    assert "invalid JSON at line 2" in result.output
    assert "no gateway" not in result.output  # not sent
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    result = runner.invoke(app, ["submit", str(listed), "--gateway", NOWHERE])
    assert result.exit_code == errors.USAGE
    assert "a task request is a JSON object" in result.output


def test_a_401_says_to_set_the_token_and_exits_4(
    gateway_answering: tuple[str, list[Any]], tmp_path: Path
) -> None:
    url, status = gateway_answering
    for args in (
        ["list-nodes"],
        ["tasks"],
        ["schedule-test", "--resource-request", "{}"],
        ["cordon", "--node", "n1", "--gpu", "0"],
        ["uncordon", "--node", "n1", "--gpu", "0"],
    ):
        result = runner.invoke(app, [*args, "--gateway", url])
        assert result.exit_code == errors.UNAUTHORISED, (args, result.output)
        assert "CRATER_API_TOKEN" in result.output
        assert "missing bearer token" in result.output
    status[0] = 422
    request = tmp_path / "task.json"
    request.write_text("{}")
    result = runner.invoke(app, ["submit", str(request), "--gateway", url])
    assert result.exit_code == errors.NO
    assert "rejected (422): missing bearer token" in result.output


def test_webhooks_without_a_database_creates_none_and_says_what_to_set(tmp_path: Path) -> None:
    result = crater("webhooks", "list", cwd=tmp_path, CRATER_DATABASE_URL="")
    no_traceback(result)
    assert result.returncode == errors.UNREACHABLE
    assert "no database at var/crater.db" in result.stderr
    assert "CRATER_DATABASE_URL" in result.stderr
    assert not (tmp_path / "var").exists()


def test_a_database_without_tables_says_to_migrate(tmp_path: Path) -> None:
    (tmp_path / "empty.db").touch()
    url = f"sqlite+aiosqlite:///{tmp_path / 'empty.db'}"
    result = runner.invoke(app, ["webhooks", "list", "--database-url", url])
    assert result.exit_code == errors.UNREACHABLE
    assert "crater db upgrade" in result.output


def test_an_unexpected_error_is_one_line_and_exit_70(tmp_path: Path) -> None:
    """A bug reads as one line; CRATER_DEBUG=1 shows the traceback."""
    fleet = tmp_path / "fleet.json"
    fleet.write_text("not json")
    result = crater("diagnose", "--node", "n1", "--fleet", str(fleet), "--gateway", NOWHERE)
    no_traceback(result)
    assert result.returncode != 0


def test_every_lazy_command_lists_with_its_own_help() -> None:
    """The listing reads each lazy command's help from its source: the same as the
    command's own once loaded."""
    for name in LAZY:
        real = load_command(name)
        assert source_help(name) == (real.help or "").strip(), name
        assert real.name == name


def test_help_imports_no_service_and_its_time() -> None:
    """`crater --help` loads none of the commands' modules (printed: its wall time)."""
    code = (
        "import sys, time; t = time.perf_counter(); from crater.cli.main import app\n"
        "try:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
        "heavy = [m for m in sys.modules if m.startswith(('alembic', 'numpy', 'sqlalchemy', "
        "'crater.scheduler', 'crater.callback', 'crater.gateway', 'crater.predictor', 'httpx'))]\n"
        "print('HEAVY', heavy, file=sys.stderr)"
    )
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    print(f"crater --help: {time.perf_counter() - started:.2f} s wall (python start included)")
    assert "HEAVY []" in result.stderr
    assert "webhooks" in result.stdout
    assert "simulate" in result.stdout


def test_schedule_test_exits_1_when_nothing_fits_and_submit_prints_json(
    gateway_answering: tuple[str, list[Any]], tmp_path: Path
) -> None:
    url, answer = gateway_answering
    misfit = {
        "node_id": "n1",
        "filter": "GpuCount",
        "code": "InsufficientGpus",
        "reason": "has fewer than 2 free GPUs",
    }
    answer[:] = [200, {"fits": [], "misfits": [misfit], "summary": "0/1 nodes fit"}]
    result = runner.invoke(app, ["schedule-test", "--resource-request", "{}", "--gateway", url])
    assert result.exit_code == errors.NO, result.output
    assert "has fewer than 2 free GPUs" in result.stdout
    as_json = runner.invoke(
        app, ["schedule-test", "--resource-request", "{}", "--json", "--gateway", url]
    )
    assert as_json.exit_code == errors.NO
    assert json.loads(as_json.stdout)["misfits"][0]["node_id"] == "n1"
    answer[:] = [202, {"task_id": "t-1", "event_id": "e-1"}]
    request = tmp_path / "task.json"
    request.write_text("{}")
    submitted = runner.invoke(app, ["submit", str(request), "--json", "--gateway", url])
    assert submitted.exit_code == 0, submitted.output
    assert json.loads(submitted.stdout) == {"task_id": "t-1", "event_id": "e-1"}


def test_a_mistyped_lazy_command_is_suggested() -> None:
    result = runner.invoke(app, ["webhok"])
    assert result.exit_code == errors.USAGE
    assert "Did you mean 'webhooks'?" in result.output
