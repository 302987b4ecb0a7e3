"""Safe defaults: production (the default) refuses what only development may run with, naming
the setting to set; development starts with a warning each. Secrets from *_FILE."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest
from pydantic import SecretStr, ValidationError
from typer.testing import CliRunner

from crater.callback.app import CallbackSettings
from crater.callback.domain.signing import generate_secret
from crater.cli.main import app as cli
from crater.cli.stack import read_secret, stack_api_keys, stack_secrets
from crater.gateway.apikeys import Scope, new_key, read_keys_file, token_hash, write_keys_file
from crater.gateway.settings import GatewaySettings
from crater.runtime.service import create_service
from crater.runtime.settings import ServiceSettings
from crater.scheduler.app import SchedulerSettings

GOOD_TOKEN = "t" * 32


@pytest.fixture(autouse=True)
def production(monkeypatch: pytest.MonkeyPatch) -> None:
    """The session is development (tests/conftest.py); these tests are production's."""
    monkeypatch.setenv("CRATER_ENVIRONMENT", "production")


def refusal(settings: type[ServiceSettings], **values: object) -> str:
    with pytest.raises(ValidationError) as raised:
        settings(**values)  # type: ignore[arg-type]
    return str(raised.value)


# -- the mode --------------------------------------------------------------------------------


def test_production_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CRATER_ENVIRONMENT")
    assert ServiceSettings().environment == "production"
    monkeypatch.setenv("CRATER_ENVIRONMENT", "development")
    assert ServiceSettings().development
    monkeypatch.setenv("CRATER_ENVIRONMENT", "staging")
    assert "environment" in refusal(ServiceSettings)


# -- the gateway's authentication ------------------------------------------------------------


def test_gateway_requires_authentication_in_production_and_refuses_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert GatewaySettings().auth == "required"
    message = refusal(GatewaySettings, auth="off")
    assert "CRATER_GATEWAY_AUTH=required" in message
    assert "crater tokens create" in message
    monkeypatch.setenv("CRATER_GATEWAY_AUTH", "off")
    assert "CRATER_GATEWAY_AUTH" in refusal(GatewaySettings)


def test_gateway_is_open_by_default_in_development_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRATER_ENVIRONMENT", "development")
    assert GatewaySettings().auth == "off"
    assert GatewaySettings(auth="required").auth == "required"


def test_the_stacks_admin_key_is_made_once_and_kept_with_added_keys(tmp_path: Path) -> None:
    keys = stack_api_keys(tmp_path)
    token = read_secret(tmp_path / "secrets" / "admin-token")
    assert stat.S_IMODE((tmp_path / "secrets" / "admin-token").stat().st_mode) == 0o600
    [admin] = read_keys_file(keys)
    assert admin.hash == token_hash(token)
    assert admin.scopes == [Scope.ADMIN]
    _, other = new_key("search", [Scope.READ])
    write_keys_file(keys, [admin, other])
    assert stack_api_keys(tmp_path) == keys
    assert read_secret(tmp_path / "secrets" / "admin-token") == token
    assert [k.hash for k in read_keys_file(keys)] == [admin.hash, other.hash]


# -- the scheduler's token secret ------------------------------------------------------------


def test_development_token_secret_refused_naming_the_variable() -> None:
    message = refusal(SchedulerSettings)
    assert "CRATER_SCHEDULER_TOKEN_SECRET" in message
    assert "development default" in message
    assert "crater-development-only" not in message.replace("development default", "")


def test_short_token_secret_refused_without_echoing_it() -> None:
    message = refusal(SchedulerSettings, token_secret="too-short-but-secret")
    assert "shorter than 32 bytes" in message
    assert "too-short-but-secret" not in message


def test_long_token_secret_accepted() -> None:
    assert SchedulerSettings(token_secret=GOOD_TOKEN).token_secret.get_secret_value() == GOOD_TOKEN


def test_development_allows_it_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    settings = SchedulerSettings(environment="development")
    with caplog.at_level(logging.WARNING):
        create_service("scheduler", settings)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    warnings = [w for w in warnings if "development mode" in w]
    assert len(warnings) == 1
    assert "CRATER_SCHEDULER_TOKEN_SECRET" in warnings[0]


# -- the callback's endpoints ----------------------------------------------------------------


def test_unsigned_webhooks_refused_naming_the_secret() -> None:
    message = refusal(CallbackSettings, webhook_url="http://alldata/hooks")
    assert "unsigned webhooks" in message
    assert "CRATER_CALLBACK_WEBHOOK_SECRET" in message


def test_basic_auth_with_empty_password_refused_naming_the_password() -> None:
    message = refusal(
        CallbackSettings,
        webhook_url="http://alldata/hooks",
        webhook_username="alldata",
        webhook_secret=generate_secret(),
    )
    assert "empty password" in message
    assert "CRATER_CALLBACK_WEBHOOK_PASSWORD" in message


def test_signed_webhooks_with_a_password_accepted_and_no_endpoint_too() -> None:
    CallbackSettings(
        webhook_url="http://alldata/hooks",
        webhook_username="alldata",
        webhook_password="pw",
        webhook_secret=generate_secret(),
    )
    CallbackSettings()  # no endpoint: deliveries are recorded as skipped, nothing is sent


def test_endpoints_file_refusal_names_the_endpoint_and_field(tmp_path: Path) -> None:
    endpoints = tmp_path / "endpoints.yaml"
    endpoints.write_text(
        "endpoints:\n"
        f"  - {{name: signed, url: 'http://a/h', secret: '{generate_secret()}'}}\n"
        "  - {name: open, url: 'http://b/h', username: u}\n"
    )
    message = refusal(CallbackSettings, endpoints_file=str(endpoints))
    assert "endpoint open: unsigned webhooks: set secret" in message
    assert "endpoint open: Basic auth user 'u' with an empty password: set password" in message
    assert "endpoint signed" not in message


# -- secrets from files ----------------------------------------------------------------------


def test_token_secret_from_a_file_stripped(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(f"  {GOOD_TOKEN}\n")
    monkeypatch.setenv("CRATER_SCHEDULER_TOKEN_SECRET_FILE", str(path))
    assert SchedulerSettings().token_secret.get_secret_value() == GOOD_TOKEN


def test_webhook_password_and_secret_from_files(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    secret = generate_secret()
    (tmp_path / "password").write_text("pw\n")
    (tmp_path / "secret").write_text(secret + "\n")
    monkeypatch.setenv("CRATER_CALLBACK_WEBHOOK_URL", "http://alldata/hooks")
    monkeypatch.setenv("CRATER_CALLBACK_WEBHOOK_USERNAME", "alldata")
    monkeypatch.setenv("CRATER_CALLBACK_WEBHOOK_PASSWORD_FILE", str(tmp_path / "password"))
    monkeypatch.setenv("CRATER_CALLBACK_WEBHOOK_SECRET_FILE", str(tmp_path / "secret"))
    (endpoint,) = CallbackSettings().endpoints()
    assert endpoint.password.get_secret_value() == "pw"
    assert endpoint.secret is not None
    assert endpoint.secret.get_secret_value() == secret


def test_variable_and_file_both_set_refused_naming_both(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text(GOOD_TOKEN)
    monkeypatch.setenv("CRATER_SCHEDULER_TOKEN_SECRET", GOOD_TOKEN)
    monkeypatch.setenv("CRATER_SCHEDULER_TOKEN_SECRET_FILE", str(tmp_path / "token"))
    message = refusal(SchedulerSettings)
    assert "CRATER_SCHEDULER_TOKEN_SECRET or CRATER_SCHEDULER_TOKEN_SECRET_FILE" in message


def test_unreadable_file_refused_naming_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CRATER_SCHEDULER_TOKEN_SECRET_FILE", str(tmp_path / "absent"))
    message = refusal(SchedulerSettings)
    assert "CRATER_SCHEDULER_TOKEN_SECRET_FILE: cannot read" in message


def test_a_shared_secret_setting_reads_its_file_too(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    class WithSharedSecret(ServiceSettings):  # as a shared NATS password would be
        nats_password: SecretStr | None = None

    (tmp_path / "pw").write_text("nats-pw\n")
    monkeypatch.setenv("CRATER_NATS_PASSWORD_FILE", str(tmp_path / "pw"))
    settings = WithSharedSecret()
    assert settings.nats_password is not None
    assert settings.nats_password.get_secret_value() == "nats-pw"


def test_a_setting_given_directly_wins_over_a_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CRATER_SCHEDULER_TOKEN_SECRET_FILE", str(tmp_path / "absent"))
    assert SchedulerSettings(token_secret=GOOD_TOKEN).token_secret.get_secret_value() == GOOD_TOKEN


# -- start-up --------------------------------------------------------------------------------


def test_crater_run_refuses_with_exit_2_naming_the_setting() -> None:
    result = CliRunner().invoke(cli, ["run", "scheduler"])
    assert result.exit_code == 2
    assert "crater scheduler: refused to start" in result.output
    assert "CRATER_SCHEDULER_TOKEN_SECRET" in result.output


def test_the_stacks_own_secrets_pass_production(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    paths = stack_secrets(tmp_path)
    again = stack_secrets(tmp_path)
    assert {n: read_secret(p) for n, p in paths.items()} == {
        n: read_secret(p) for n, p in again.items()
    }
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in paths.values())
    assert read_secret(stack_secrets(tmp_path / "other")["token_secret"]) != read_secret(
        paths["token_secret"]
    )
    monkeypatch.setenv("CRATER_SCHEDULER_TOKEN_SECRET_FILE", str(paths["token_secret"]))
    monkeypatch.setenv("CRATER_CALLBACK_WEBHOOK_URL", "http://127.0.0.1:1/webhooks")
    monkeypatch.setenv("CRATER_CALLBACK_WEBHOOK_USERNAME", "alldata")
    monkeypatch.setenv("CRATER_CALLBACK_WEBHOOK_PASSWORD_FILE", str(paths["webhook_password"]))
    monkeypatch.setenv("CRATER_CALLBACK_WEBHOOK_SECRET_FILE", str(paths["webhook_secret"]))
    SchedulerSettings()
    CallbackSettings()
