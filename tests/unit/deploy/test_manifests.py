"""The deployment files, checked offline: every kustomize overlay renders and each object is
valid against the Kubernetes schemas (strict: no unknown fields), docker-compose.yml against
the Compose specification's schema, and nothing in them drifts from the code: every CRATER_*
variable is a setting, every service a `crater run` target, every port its default."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError

from crater.autoscaler.app import AutoscalerSettings
from crater.callback.app import CallbackSettings
from crater.cli import main as cli_main
from crater.gateway.settings import GatewaySettings
from crater.predictor.app import PredictorSettings
from crater.probe.settings import ProbeSettings
from crater.runtime.settings import FILE_SUFFIX, ServiceSettings, is_secret
from crater.scheduler.app import SchedulerSettings

ROOT = Path(__file__).resolve().parents[3]
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
OVERLAYS = ("dev", "prod")
COMPOSE = ROOT / "docker-compose.yml"
KUBERNETES_VERSION = "1.32.0"  # the target: kubectl v1.32
# CRDs no schema is vendored for: skipped by name, with the reason.
UNCHECKED_KINDS = {
    "ServiceMonitor": "a Prometheus-operator CRD; kubernetes-validate carries only core schemas",
}
SETTINGS: dict[str, type[ServiceSettings]] = {
    cls.service: cls  # type: ignore[misc]
    for cls in (
        ProbeSettings,
        PredictorSettings,
        SchedulerSettings,
        AutoscalerSettings,
        CallbackSettings,
        GatewaySettings,
    )
}


def kubectl() -> str:
    path = shutil.which("kubectl")
    if path is None:
        pytest.skip("kubectl is not installed: the kustomize overlays cannot be rendered")
    return path


@cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    out = subprocess.run(
        [kubectl(), "kustomize", str(KUSTOMIZE / "overlays" / overlay)],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    return tuple(doc for doc in yaml.safe_load_all(out) if doc)


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


# ---- schemas --------------------------------------------------------------------------


def kubernetes_errors(objects: tuple[dict[str, Any], ...]) -> list[str]:
    errors = []
    for obj in objects:
        if obj["kind"] in UNCHECKED_KINDS:
            continue
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            errors.append(f"{name}: {error.message} at {list(error.path)}")
        except SchemaNotFoundError:
            errors.append(f"{name}: no schema for {obj['apiVersion']} {obj['kind']}")
    return errors


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_every_object_is_valid(overlay: str) -> None:
    objects = render(overlay)
    assert objects
    assert kubernetes_errors(objects) == []
    unchecked = sorted({o["kind"] for o in objects if o["kind"] in UNCHECKED_KINDS})
    for kind in unchecked:
        print(f"{overlay}: {kind} not schema-checked: {UNCHECKED_KINDS[kind]}")


def test_kubernetes_validation_is_strict() -> None:
    """An unknown field or a wrong type is caught, so a pass above means something."""
    deployment = next(o for o in render("prod") if o["kind"] == "Deployment")
    typo = copy.deepcopy(deployment)
    typo["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    wrong = copy.deepcopy(deployment)
    wrong["spec"]["replicas"] = "two"
    assert len(kubernetes_errors((typo, wrong))) == 2


def compose_schema() -> dict[str, Any]:
    text = (
        resources.files("check_jsonschema.builtin_schemas.vendor")
        .joinpath("compose-spec.json")
        .read_text()
    )
    schema: dict[str, Any] = json.loads(text)
    return schema


def compose_errors(document: dict[str, Any]) -> list[str]:
    schema = compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    return [f"{e.json_path}: {e.message}" for e in validator.iter_errors(document)]


def test_compose_file_is_valid_against_the_compose_spec() -> None:
    assert compose_errors(compose()) == []


def test_compose_validation_is_strict() -> None:
    document = compose()
    document["services"]["gateway"]["helthcheck"] = {}
    assert compose_errors(document)


# ---- drift ----------------------------------------------------------------------------


def known_variables() -> set[str]:
    """Every variable Crater reads: each settings class's fields, `*_FILE` for the secrets,
    and the reference receiver's options (`crater receiver`; *_FILE through the entrypoint)."""
    known: set[str] = set()
    for cls in (ServiceSettings, *SETTINGS.values()):
        for name, field in cls.model_fields.items():
            variable = cls.variable(name)
            known.add(variable)
            if is_secret(field):
                known.add(variable + FILE_SUFFIX)
    for variable in receiver_variables():
        known |= {variable, variable + FILE_SUFFIX}
    return known


def receiver_variables() -> set[str]:
    source = Path(cli_main.__file__).read_text()
    block = source[source.index("def receiver(") : source.index('"""A reference webhook')]
    return set(re.findall(r'envvar="(CRATER_[A-Z0-9_]+)"', block))


def compose_variables(document: dict[str, Any]) -> Iterator[tuple[str, str]]:
    for name, service in document["services"].items():
        environment = service.get("environment") or {}
        if isinstance(environment, list):
            environment = dict(item.split("=", 1) for item in environment)
        for variable in environment:
            yield f"compose {name}", variable


def manifest_variables(objects: tuple[dict[str, Any], ...]) -> Iterator[tuple[str, str]]:
    for obj in objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] == "ConfigMap":
            for variable in obj.get("data", {}):
                if variable.startswith("CRATER_"):
                    yield where, variable
        for container in containers(obj):
            for env in container.get("env", []):
                yield where, env["name"]
            for source in container.get("envFrom", []):
                assert source.get("prefix") is None, where


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {})
    pod = spec.get("template", {}).get("spec", {})
    return [*pod.get("containers", []), *pod.get("initContainers", [])]


def unknown_variables(named: Iterator[tuple[str, str]], known: set[str]) -> list[str]:
    return sorted(
        f"{where}: {variable}"
        for where, variable in named
        if variable.startswith("CRATER_") and variable not in known
    )


def test_every_crater_variable_in_compose_and_the_manifests_is_a_setting() -> None:
    known = known_variables()
    assert unknown_variables(compose_variables(compose()), known) == []
    for overlay in OVERLAYS:
        assert unknown_variables(manifest_variables(render(overlay)), known) == []


def test_a_renamed_setting_is_caught() -> None:
    """The drift check fails when the code renames a setting the files still use: the
    scheduler's token_secret renamed to signing_secret leaves
    CRATER_SCHEDULER_TOKEN_SECRET_FILE unknown."""
    renamed = {
        v.replace("CRATER_SCHEDULER_TOKEN_SECRET", "CRATER_SCHEDULER_SIGNING_SECRET")
        for v in known_variables()
    }
    found = unknown_variables(compose_variables(compose()), renamed)
    assert "compose scheduler-1: CRATER_SCHEDULER_TOKEN_SECRET_FILE" in found
    found = unknown_variables(manifest_variables(render("prod")), renamed)
    assert "Deployment/crater-scheduler: CRATER_SCHEDULER_TOKEN_SECRET_FILE" in found
    # and a variable misspelt in a file, the other way round
    typo = compose()
    typo["services"]["gateway"]["environment"]["CRATER_GATEWAY_AUTHENTICATION"] = "required"
    assert unknown_variables(compose_variables(typo), known_variables()) == [
        "compose gateway: CRATER_GATEWAY_AUTHENTICATION"
    ]


def run_target(command: list[str] | str | None) -> str | None:
    """The service a command runs: `run <service>` (the image's entry point is `crater`)."""
    if isinstance(command, str):
        command = command.split()
    if command and len(command) >= 2 and command[0] == "run":
        return command[1]
    return None


def default_port(service: str) -> int:
    port = SETTINGS[service].default_port
    assert port is not None
    return port


def test_every_compose_service_runs_a_crater_target_on_its_default_port() -> None:
    runs = {}
    for name, service in compose()["services"].items():
        target = run_target(service.get("command"))
        if target is None:
            continue
        assert target in cli_main.RUNNABLE, f"{name}: `crater run {target}` is no target"
        runs[name] = target
        ports = {int(p) for p in re.findall(r":(\d+)/healthz", json.dumps(service["healthcheck"]))}
        assert ports == {default_port(target)}, f"{name}: healthcheck on {ports}"
        for published in service.get("ports", []):
            assert int(str(published).rsplit(":", 1)[1]) == default_port(target), name
        assert "CRATER_HTTP_PORT" not in (service.get("environment") or {}), name
    assert sorted(set(runs.values())) == sorted(cli_main.RUNNABLE)
    assert sorted(runs.values()).count("scheduler") == 2  # leader and standby


def test_prometheus_scrapes_every_service_on_its_default_port() -> None:
    config = yaml.safe_load((ROOT / "deploy/compose/prometheus.yml").read_text())
    targets = {
        target
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    }
    services = compose()["services"]
    for name, service in services.items():
        target = run_target(service.get("command"))
        if target is not None:
            assert f"{name}:{default_port(target)}" in targets


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_workload_runs_a_crater_target_on_its_default_port(overlay: str) -> None:
    objects = render(overlay)
    seen = set()
    for obj in objects:
        for container in containers(obj):
            if not container["image"].split("/")[-1].startswith("crater"):
                continue
            target = run_target(container.get("args"))
            if target is None:
                assert container["args"] == ["db", "upgrade"], obj["metadata"]["name"]
                continue
            assert target in cli_main.RUNNABLE
            seen.add(target)
            (port,) = container["ports"]
            assert (port["name"], port["containerPort"]) == ("http", default_port(target))
            for probe in ("readinessProbe", "livenessProbe"):
                assert container[probe]["httpGet"] == {"path": "/healthz", "port": "http"}
            assert container["resources"]["requests"]
            assert container["resources"]["limits"]
        service = obj["metadata"]["name"].removeprefix("crater-")
        if obj["kind"] == "Service" and service in SETTINGS:
            (port,) = obj["spec"]["ports"]
            assert port["port"] == default_port(service)
    assert seen == set(cli_main.RUNNABLE)


def test_prod_runs_the_leader_elected_pairs_and_the_nats_cluster() -> None:
    replicas = {
        o["metadata"]["name"]: o["spec"]["replicas"]
        for o in render("prod")
        if o["kind"] in ("Deployment", "StatefulSet")
    }
    assert replicas["crater-scheduler"] == 2
    assert replicas["crater-autoscaler"] == 2
    assert replicas["crater-nats"] == 3
    assert min(replicas[f"crater-{s}"] for s in ("gateway", "predictor", "callback")) >= 2
    kinds = {o["kind"] for o in render("prod")}
    assert {"PodDisruptionBudget", "NetworkPolicy", "ServiceMonitor", "Job"} <= kinds


def test_secrets_are_referenced_never_inlined() -> None:
    for overlay in OVERLAYS:
        assert not [o for o in render(overlay) if o["kind"] == "Secret"]
    for name, service in compose()["services"].items():
        for variable, value in (service.get("environment") or {}).items():
            if re.search(r"PASSWORD|SECRET", variable):
                assert variable.endswith(FILE_SUFFIX), f"{name}: {variable} inlined"
                assert str(value).startswith("/run/secrets/"), name
