from __future__ import annotations

from typing import Any

from crater.gateway.app import GatewaySettings, build, service_of


def refs(node: Any) -> set[str]:
    if isinstance(node, dict):
        found = {node["$ref"]} if isinstance(node.get("$ref"), str) else set()
        return found.union(*(refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(refs(v) for v in node))
    return set()


def test_defaults_follow_the_runtime() -> None:
    settings = GatewaySettings()
    assert settings.max_body_bytes == 256 * 1024
    assert settings.query_timeout_seconds == 2.0
    assert service_of(build(settings)).port == 8080


def test_settings_come_from_the_environment(monkeypatch: Any) -> None:
    monkeypatch.setenv("CRATER_GATEWAY_MAX_BODY_BYTES", "4096")
    monkeypatch.setenv("CRATER_HTTP_PORT", "18080")
    settings = GatewaySettings()
    assert settings.max_body_bytes == 4096
    assert service_of(build(settings)).port == 18080


def test_openapi_documents_the_task_request_and_every_reference_resolves() -> None:
    schema = build(GatewaySettings()).openapi()
    operation = schema["paths"]["/api/v1/schedule"]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    one, burst = body["oneOf"]  # one task, or an array of them
    assert one == {"$ref": "#/components/schemas/TaskRequest"}
    assert burst["items"] == one
    components = schema["components"]["schemas"]
    assert "model_config" in components["TaskRequest"]["properties"]
    assert {"202", "207", "409", "413", "422", "503"} <= set(operation["responses"])
    missing = {r for r in refs(schema) if r.removeprefix("#/components/schemas/") not in components}
    assert missing == set()
    assert {"/api/v1/nodes", "/api/v1/tasks", "/api/v1/tasks/{task_id}", "/healthz"} <= set(
        schema["paths"]
    )
