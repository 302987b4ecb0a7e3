"""Authentication over a real nats-server and gateway (auth `required`): API keys in the
JetStream bucket and in a keys file, OIDC JWTs against a JWKS file, scopes, tenants, the rate
limit; a stand-in scheduler answers the task queries (as in test_queries)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import jwt
import nats
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from typer.testing import CliRunner

from crater.cli.main import app as cli
from crater.contracts import TaskSubmitted
from crater.contracts.queries import QuerySubjects, TasksAnswer, TasksQuery
from crater.gateway.apikeys import Scope, kv_bucket, kv_put, new_key, write_keys_file
from crater.gateway.app import GatewaySettings, build
from crater.runtime.nats_server import NatsServer
from tests.integration.gateway.test_queries import TASK, responder
from tests.integration.gateway.test_schedule import task
from tests.support.events import EventTap

ISSUER = "https://idp.example"
AUDIENCE = "crater"
A_TASK = TASK.model_copy(update={"task_id": "a-1", "tenant": "a"})
B_TASK = TASK.model_copy(update={"task_id": "b-1", "tenant": "b"})


def tasks_answer(data: bytes) -> bytes:
    query = TasksQuery.model_validate_json(data)
    known = [t for t in (A_TASK, B_TASK) if query.task_id in (None, t.task_id)]
    return TasksAnswer(tasks=known).model_dump_json().encode()


@pytest.fixture(scope="module")
def signing_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture
def jwks_file(tmp_path: Path, signing_key: rsa.RSAPrivateKey) -> Path:
    public = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(signing_key.public_key()))
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps({"keys": [{**public, "kid": "k1", "use": "sig"}]}))
    return path


def signed(key: rsa.RSAPrivateKey, **overrides: Any) -> str:
    now = int(time.time())
    claims = {
        "iss": ISSUER,
        "aud": AUDIENCE,
        "sub": "alice",
        "tenant": "a",
        "scope": "read submit",
        "iat": now,
        "exp": now + 300,
        **overrides,
    }
    return jwt.encode(claims, key, algorithm="RS256", headers={"kid": "k1"})


@asynccontextmanager
async def gateway(nats_url: str, **settings: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = build(
        GatewaySettings(nats_url=nats_url, query_timeout_seconds=0.5, auth="required", **settings)
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http,
    ):
        yield http


async def store_key(
    nats_url: str, tenant: str, *scopes: Scope, revoked: bool = False, user: str | None = None
) -> str:
    """A new key in the bucket; its token."""
    token, key = new_key(tenant, list(scopes), name="test", user=user)
    if revoked:
        key = key.model_copy(update={"revoked": datetime.now(UTC)})
    connection = await nats.connect(nats_url)
    try:
        await kv_put(await kv_bucket(connection.jetstream()), key)
    finally:
        await connection.close()
    return token


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def denials(metrics: str, reason: str) -> float:
    line = f'crater_gateway_auth_denials_total{{reason="{reason}"}} '
    found = [float(x.removeprefix(line)) for x in metrics.splitlines() if x.startswith(line)]
    return found[0] if found else 0.0


async def test_anonymous_and_malformed_are_refused_health_and_metrics_open(
    fresh_nats: NatsServer,
) -> None:
    async with gateway(fresh_nats.url) as http:
        anonymous = await http.get("/api/v1/tasks")
        basic = await http.get("/api/v1/nodes", headers={"Authorization": "Basic eDp5"})
        unknown = await http.get("/api/v1/nodes", headers=bearer("crt_not-a-key"))
        launcher = await http.post("/api/v1/allocations/x/confirm", json={"token": "t"})
        assert (await http.get("/healthz")).status_code == 200
        metrics = await http.get("/metrics")
    assert anonymous.status_code == 401
    assert anonymous.headers["WWW-Authenticate"].startswith("Bearer")
    assert "Authorization: Bearer" in anonymous.json()["detail"]
    assert basic.status_code == 401
    assert "Bearer" in basic.json()["detail"]
    assert unknown.status_code == 401
    assert "not known" in unknown.json()["detail"]
    # The launcher's reservation token is its proof: not refused for want of a bearer token.
    assert launcher.status_code == 503, launcher.text  # no scheduler to check the token
    assert metrics.status_code == 200
    assert denials(metrics.text, "missing") == 1
    assert denials(metrics.text, "malformed") == 1
    assert denials(metrics.text, "unknown_key") == 1


async def test_a_scope_not_held_is_403(fresh_nats: NatsServer) -> None:
    async with gateway(fresh_nats.url) as http:
        reader = await store_key(fresh_nats.url, "a", Scope.READ)
        submit = await http.post("/api/v1/schedule", json=task(), headers=bearer(reader))
        cancel = await http.post("/api/v1/tasks/a-1/cancel", headers=bearer(reader))
        metrics = (await http.get("/metrics")).text
    assert submit.status_code == 403
    assert "`submit` scope" in submit.json()["detail"]
    assert cancel.status_code == 403
    assert "`cancel` scope" in cancel.json()["detail"]
    assert denials(metrics, "scope") == 2


async def test_a_tenant_sees_and_cancels_its_own_tasks_only_admin_all(
    fresh_nats: NatsServer,
) -> None:
    async with gateway(fresh_nats.url) as http:
        a_key = await store_key(fresh_nats.url, "a", Scope.READ, Scope.CANCEL)
        admin = await store_key(fresh_nats.url, "ops", Scope.ADMIN)
        async with responder(fresh_nats.url, QuerySubjects.TASKS, tasks_answer, []):
            listed = await http.get("/api/v1/tasks", headers=bearer(a_key))
            own = await http.get("/api/v1/tasks/a-1", headers=bearer(a_key))
            other = await http.get("/api/v1/tasks/b-1", headers=bearer(a_key))
            cancel_other = await http.post("/api/v1/tasks/b-1/cancel", headers=bearer(a_key))
            delete_other = await http.delete("/api/v1/tasks/b-1", headers=bearer(a_key))
            cancel_own = await http.post("/api/v1/tasks/a-1/cancel", headers=bearer(a_key))
            all_tasks = await http.get("/api/v1/tasks", headers=bearer(admin))
            admin_other = await http.get("/api/v1/tasks/b-1", headers=bearer(admin))
            never = await http.get("/api/v1/tasks/nope", headers=bearer(a_key))
        metrics = (await http.get("/metrics")).text
    assert listed.status_code == 200
    assert [t["task_id"] for t in listed.json()["tasks"]] == ["a-1"]
    assert own.status_code == 200
    assert own.json()["tenant"] == "a"
    # Another tenant's task is answered exactly as one that does not exist.
    assert other.status_code == 404
    assert other.json() == {"detail": "task 'b-1' is not known"}
    assert never.json() == {"detail": "task 'nope' is not known"}
    assert cancel_other.status_code == 404
    assert delete_other.status_code == 404
    assert cancel_own.status_code == 202, cancel_own.text
    assert sorted(t["task_id"] for t in all_tasks.json()["tasks"]) == ["a-1", "b-1"]
    assert admin_other.status_code == 200
    assert denials(metrics, "other_tenant") == 3


async def test_a_submission_takes_the_credentials_tenant(
    fresh_nats: NatsServer, tap: EventTap
) -> None:
    async with gateway(fresh_nats.url) as http:
        a_key = await store_key(fresh_nats.url, "a", Scope.SUBMIT, Scope.CANCEL)
        b_key = await store_key(fresh_nats.url, "b", Scope.CANCEL)
        foreign = await http.post(
            "/api/v1/schedule", json=task(task_id="t-b", tenant="b"), headers=bearer(a_key)
        )
        unnamed = await http.post(
            "/api/v1/schedule", json=task(task_id="t-a"), headers=bearer(a_key)
        )
        [event] = await tap.wait_for(TaskSubmitted, lambda e: e.task_id == "t-a")
        # Accepted, not yet known to the scheduler: still only its tenant's to cancel.
        empty = TasksAnswer(tasks=[]).model_dump_json().encode()
        async with responder(fresh_nats.url, QuerySubjects.TASKS, lambda _: empty, []):
            by_b = await http.post("/api/v1/tasks/t-a/cancel", headers=bearer(b_key))
            by_a = await http.post("/api/v1/tasks/t-a/cancel", headers=bearer(a_key))
    assert foreign.status_code == 403
    assert foreign.json()["detail"][0]["field"] == "tenant"
    assert "'a', not 'b'" in foreign.json()["detail"][0]["reason"]
    assert unnamed.status_code == 202, unnamed.text
    assert event.tenant == "a"
    assert by_b.status_code == 404
    assert by_a.status_code == 202
    assert by_a.json()["previous"] == "submitted"


async def test_a_key_naming_a_user_submits_as_that_user_only(
    fresh_nats: NatsServer, tap: EventTap
) -> None:
    async with gateway(fresh_nats.url) as http:
        alice = await store_key(fresh_nats.url, "a", Scope.SUBMIT, user="alice")
        tenant_key = await store_key(fresh_nats.url, "a", Scope.SUBMIT)
        as_bob = await http.post(
            "/api/v1/schedule", json=task(task_id="t-1", user="bob"), headers=bearer(alice)
        )
        unnamed = await http.post(
            "/api/v1/schedule", json=task(task_id="t-2"), headers=bearer(alice)
        )
        named = await http.post(
            "/api/v1/schedule", json=task(task_id="t-3", user="alice"), headers=bearer(alice)
        )
        # a key naming no user: the request's own, as before
        anyone = await http.post(
            "/api/v1/schedule", json=task(task_id="t-4", user="bob"), headers=bearer(tenant_key)
        )
        submitted = await tap.wait_for(TaskSubmitted, count=3)
        metrics = (await http.get("/metrics")).text
    assert as_bob.status_code == 403
    assert as_bob.json()["detail"] == [
        {
            "field": "user",
            "reason": "this credential submits as user 'alice' of tenant 'a', not 'bob'",
        }
    ]
    assert denials(metrics, "user") == 1
    assert (unnamed.status_code, named.status_code, anyone.status_code) == (202, 202, 202)
    users = {e.task_id: e.user for e in submitted}
    assert users == {"t-2": "alice", "t-3": "alice", "t-4": "bob"}


def test_crater_tokens_create_names_the_keys_user(tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    runner = CliRunner()
    create = ["tokens", "create", "--tenant", "a", "--user", "alice", "--scope", "submit"]
    made = runner.invoke(cli, [*create, "--file", str(keys)])
    assert made.exit_code == 0, made.output
    assert "for tenant a, user alice (submit)" in made.stderr
    listed = runner.invoke(cli, ["tokens", "list", "--json", "--file", str(keys)])
    assert json.loads(listed.stdout.splitlines()[0])["user"] == "alice"


async def test_a_revoked_key_is_401(fresh_nats: NatsServer) -> None:
    async with gateway(fresh_nats.url) as http:
        revoked = await store_key(fresh_nats.url, "a", Scope.READ, revoked=True)
        response = await http.get("/api/v1/nodes", headers=bearer(revoked))
        metrics = (await http.get("/metrics")).text
    assert response.status_code == 401
    assert "revoked" in response.json()["detail"]
    assert denials(metrics, "revoked") == 1


async def test_keys_file(fresh_nats: NatsServer, tmp_path: Path) -> None:
    token, key = new_key("a", [Scope.READ])
    keys = tmp_path / "keys.yaml"
    write_keys_file(keys, [key])
    async with (
        gateway(fresh_nats.url, api_keys_file=keys) as http,
        responder(fresh_nats.url, QuerySubjects.TASKS, tasks_answer, []),
    ):
        before = await http.get("/api/v1/tasks", headers=bearer(token))
        write_keys_file(keys, [key.model_copy(update={"revoked": datetime.now(UTC)})])
        after = await http.get("/api/v1/tasks", headers=bearer(token))
    assert before.status_code == 200, before.text
    assert [t["task_id"] for t in before.json()["tasks"]] == ["a-1"]
    assert after.status_code == 401


async def test_jwts(
    fresh_nats: NatsServer, jwks_file: Path, signing_key: rsa.RSAPrivateKey
) -> None:
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    cases = {
        "good": (signed(signing_key), 200, None),
        "expired": (signed(signing_key, exp=int(time.time()) - 600), 401, "expired"),
        "issuer": (signed(signing_key, iss="https://evil.example"), 401, "issuer"),
        "audience": (signed(signing_key, aud="someone-else"), 401, "audience"),
        "forged": (signed(other_key), 401, "invalid"),
        "no tenant": (signed(signing_key, tenant=None), 403, "tenant"),
        "no scope": (signed(signing_key, scope="", scp=["cancel"]), 403, "`read` scope"),
    }
    async with (
        gateway(
            fresh_nats.url, jwt_issuer=ISSUER, jwt_audience=AUDIENCE, jwks_file=jwks_file
        ) as http,
        responder(fresh_nats.url, QuerySubjects.TASKS, tasks_answer, []),
    ):
        answers = {
            name: await http.get("/api/v1/tasks", headers=bearer(token))
            for name, (token, _, _) in cases.items()
        }
        metrics = (await http.get("/metrics")).text
    for name, (_, status, said) in cases.items():
        assert answers[name].status_code == status, (name, answers[name].text)
        if said:
            assert said in answers[name].json()["detail"], name
    assert [t["task_id"] for t in answers["good"].json()["tasks"]] == ["a-1"]
    for reason in ("expired", "wrong_issuer", "wrong_audience", "invalid_token", "no_tenant"):
        assert denials(metrics, reason) == 1, reason


async def test_the_rate_limit_is_per_credential(fresh_nats: NatsServer) -> None:
    async with gateway(fresh_nats.url, rate_limit_per_second=0.01, rate_limit_burst=3) as http:
        first = await store_key(fresh_nats.url, "a", Scope.READ)
        second = await store_key(fresh_nats.url, "a", Scope.READ)
        async with responder(fresh_nats.url, QuerySubjects.TASKS, tasks_answer, []):
            statuses = [
                (await http.get("/api/v1/tasks", headers=bearer(first))).status_code
                for _ in range(4)
            ]
            limited = await http.get("/api/v1/tasks", headers=bearer(first))
            other = await http.get("/api/v1/tasks", headers=bearer(second))
        metrics = (await http.get("/metrics")).text
    assert statuses == [200, 200, 200, 429]
    assert limited.status_code == 429
    assert 1 <= int(limited.headers["Retry-After"]) <= 100
    assert "rate limit" in limited.json()["detail"]
    assert other.status_code == 200
    assert denials(metrics, "rate_limited") == 2


async def test_auth_off_is_open(fresh_nats: NatsServer) -> None:
    app = build(GatewaySettings(nats_url=fresh_nats.url, query_timeout_seconds=0.5))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http,
        responder(fresh_nats.url, QuerySubjects.TASKS, tasks_answer, []),
    ):
        listed = await http.get("/api/v1/tasks")
    assert sorted(t["task_id"] for t in listed.json()["tasks"]) == ["a-1", "b-1"]


async def test_crater_tokens_on_the_bucket(fresh_nats: NatsServer) -> None:
    """`crater tokens create` writes to the bucket the gateway reads; `revoke` takes effect
    on the next request."""
    runner = CliRunner()
    nats_option = ["--nats-url", fresh_nats.url]
    async with gateway(fresh_nats.url) as http:
        made = await asyncio.to_thread(
            runner.invoke,
            cli,
            ["tokens", "create", "--tenant", "a", "--scope", "read", *nats_option],
        )
        assert made.exit_code == 0, made.output
        token = made.stdout.splitlines()[0]
        async with responder(fresh_nats.url, QuerySubjects.TASKS, tasks_answer, []):
            before = await http.get("/api/v1/tasks", headers=bearer(token))
            listed = await asyncio.to_thread(
                runner.invoke, cli, ["tokens", "list", "--json", *nats_option]
            )
            key_id = json.loads(listed.stdout.splitlines()[0])["id"]
            revoked = await asyncio.to_thread(
                runner.invoke, cli, ["tokens", "revoke", key_id, *nats_option]
            )
            assert revoked.exit_code == 0, revoked.output
            after = await http.get("/api/v1/tasks", headers=bearer(token))
    assert before.status_code == 200, before.text
    assert after.status_code == 401
    assert "revoked" in after.json()["detail"]


@pytest.mark.parametrize(
    ("allocation_id", "token", "field"),
    [
        ("", "0", "allocation_id"),  # the fuzzer's 500
        ("a" * 100, "t", "allocation_id"),  # a usage sample may carry 256, no allocation has
        ("alloc-1", "t" * 300, "crater-reservation-token"),
    ],
)
async def test_a_usage_sample_with_a_token_and_an_impossible_allocation_is_a_422(
    fresh_nats: NatsServer, allocation_id: str, token: str, field: str
) -> None:
    sample = {"task_id": "t0", "attempt": 1, "interval_seconds": 5e-324}
    async with gateway(fresh_nats.url) as http:
        response = await http.post(
            "/api/v1/tasks/t0/usage",
            json={**sample, "allocation_id": allocation_id},
            headers={"Crater-Reservation-Token": token},
        )
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["detail"]] == [field]


async def test_an_array_element_for_another_tenant_is_refused_alone_and_counted(
    fresh_nats: NatsServer,
) -> None:
    async with gateway(fresh_nats.url) as http:
        key = await store_key(fresh_nats.url, "a", Scope.SUBMIT)
        burst = [task(task_id="a-own"), task(task_id="b-theirs", tenant="b")]
        response = await http.post("/api/v1/schedule", json=burst, headers=bearer(key))
        metrics = (await http.get("/metrics")).text
    assert response.status_code == 207, response.text
    own, theirs = response.json()["results"]
    assert own["status"] == 202
    assert theirs["status"] == 403
    assert "not 'b'" in theirs["body"]["detail"][0]["reason"]
    assert denials(metrics, "tenant") == 1
