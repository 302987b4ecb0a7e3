"""The pieces of authentication that need no NATS: the rate limiter, scopes from JWT claims,
a submission's tenant, the keys file, TLS options and the settings' consistency."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from pydantic import ValidationError

from crater.contracts import TaskRequest
from crater.gateway.apikeys import (
    KeysFile,
    Scope,
    find_key,
    new_key,
    read_keys_file,
    token_hash,
    write_keys_file,
)
from crater.gateway.app import tls_options
from crater.gateway.auth import OPEN, Denied, Principal, RateLimiter, scopes_of, submitted_as
from crater.gateway.settings import GatewaySettings
from tests.integration.gateway.test_schedule import task


def test_the_rate_limiter_refills_at_its_rate() -> None:
    limiter = RateLimiter(rate=2.0, burst=2)
    assert [limiter.take("k", now=0.0) for _ in range(2)] == [0.0, 0.0]
    assert limiter.take("k", now=0.0) == pytest.approx(0.5)
    assert limiter.take("other", now=0.0) == 0.0
    assert limiter.take("k", now=0.5) == 0.0
    assert limiter.take("k", now=0.5) > 0
    assert RateLimiter(rate=0, burst=1).take("k") == 0.0


def test_scopes_come_from_scope_or_scp_unknown_ones_ignored() -> None:
    assert scopes_of({"scope": "read submit openid"}) == {Scope.READ, Scope.SUBMIT}
    assert scopes_of({"scp": ["cancel", "email"]}) == {Scope.CANCEL}
    assert scopes_of({"scp": "admin"}) == {Scope.ADMIN}
    assert scopes_of({}) == frozenset()


def test_a_submission_gets_or_must_match_the_credentials_tenant() -> None:
    a = Principal("api-key", "key:1", "a", frozenset({Scope.SUBMIT}))
    admin = Principal("api-key", "key:2", "ops", frozenset({Scope.ADMIN}))
    unnamed = TaskRequest.model_validate(task())
    named_b = TaskRequest.model_validate(task(tenant="b"))
    assert submitted_as(a, unnamed).tenant == "a"
    assert submitted_as(a, TaskRequest.model_validate(task(tenant="a"))).tenant == "a"
    with pytest.raises(Denied) as refused:
        submitted_as(a, named_b)
    assert (refused.value.status, refused.value.field) == (403, "tenant")
    assert submitted_as(admin, named_b).tenant == "b"
    assert submitted_as(admin, unnamed).tenant == "ops"
    assert submitted_as(OPEN, unnamed).tenant == "default"


def test_the_keys_file_holds_hashes_and_is_reread(tmp_path: Path) -> None:
    token, key = new_key("a", [Scope.READ, Scope.SUBMIT, Scope.READ], name="ci")
    assert token.startswith("crt_")
    assert len(token) == 47
    assert key.hash == token_hash(token)
    assert key.scopes == [Scope.READ, Scope.SUBMIT]
    path = tmp_path / "keys.yaml"
    write_keys_file(path, [key])
    assert token not in path.read_text()
    assert path.stat().st_mode & 0o777 == 0o600
    assert read_keys_file(path) == [key]
    keys = KeysFile(path)
    assert keys.lookup(key.hash) == key
    _, second = new_key("b", [Scope.ADMIN])
    write_keys_file(path, [key, second, second.model_copy(update={"hash": "0" * 64})])
    assert keys.lookup(second.hash) == second
    assert find_key(read_keys_file(path), second.key_id) == second
    with pytest.raises(LookupError):
        find_key(read_keys_file(path), second.key_id[:4])
    assert read_keys_file(tmp_path / "absent.yaml") == []


def test_tls_options(tmp_path: Path) -> None:
    assert tls_options(GatewaySettings()) == {}
    mtls = GatewaySettings(
        tls_certfile=tmp_path / "c.pem",
        tls_keyfile=tmp_path / "k.pem",
        tls_ca_certs=tmp_path / "ca.pem",
        tls_client_cert_required=True,
    )
    assert tls_options(mtls)["ssl_cert_reqs"] == ssl.CERT_REQUIRED
    assert tls_options(mtls)["ssl_ca_certs"] == str(tmp_path / "ca.pem")
    https = GatewaySettings(tls_certfile=tmp_path / "c.pem", tls_keyfile=tmp_path / "k.pem")
    assert tls_options(https)["ssl_cert_reqs"] == ssl.CERT_NONE


@pytest.mark.parametrize(
    "settings",
    [
        {"jwt_issuer": "https://idp"},
        {"jwks_file": "/jwks.json", "jwt_issuer": "https://idp"},
        {"tls_client_cert_required": True},
        {"tls_certfile": "/c.pem"},
    ],
)
def test_inconsistent_auth_settings_are_refused(settings: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        GatewaySettings.model_validate(settings)


def test_auth_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert GatewaySettings().auth == "off"
    monkeypatch.setenv("CRATER_GATEWAY_AUTH", "required")
    assert GatewaySettings().auth == "required"
