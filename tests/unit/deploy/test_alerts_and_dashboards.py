"""The alert rules (deploy/prometheus/) and the Grafana dashboards (deploy/grafana/, from
crater.cli.dashboards): every expression parses as PromQL and names only series, and labels,
the services really export (tests/support/metric_catalog.py); every rule has a runbook
section in docs/operations.md; the committed dashboards are what the code generates."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from crater.cli.dashboards import DEFAULT_OUT, files, queries
from tests.support.metric_catalog import catalog

ROOT = Path(__file__).resolve().parents[3]
RULES = sorted((ROOT / "deploy" / "prometheus").glob("*.yml"))
OPERATIONS = ROOT / "docs" / "operations.md"
REQUIRED_ALERTS = {
    "CraterNodeNotReady",
    "CraterGpuHealthFailing",
    "CraterQueueWaitAboveSla",
    "CraterWebhookDeadLetters",
    "CraterWebhookCircuitOpen",
    "CraterSchedulerWithoutLeader",
    "CraterPredictorErrorRising",
    "CraterTenantOverSoftBudget",
}


def selectors(node: Any) -> Iterator[Any]:
    """Every vector selector in a parsed expression."""
    if isinstance(node, promql_parser.VectorSelector):
        yield node
        return
    for attribute in ("lhs", "rhs", "expr", "param", "vector_selector"):
        child = getattr(node, attribute, None)
        if child is not None and not isinstance(child, str | int | float):
            yield from selectors(child)
    for child in getattr(node, "args", None) or ():
        yield from selectors(child)


# Grafana's interval variables, as Grafana substitutes them before Prometheus parses a query.
GRAFANA_INTERVALS = re.compile(r"\$__(rate_interval|interval|range)")


def problems(expr: str) -> list[str]:
    """What is wrong with `expr`: unknown series, or labels the series never carries."""
    expr = GRAFANA_INTERVALS.sub("5m", expr)
    known = catalog()
    found = []
    names = []
    for selector in selectors(promql_parser.parse(expr)):
        name = selector.name
        names.append(name)
        if name not in known:
            found.append(f"{name}: no service exports it")
            continue
        for matcher in selector.matchers.matchers:
            if matcher.name not in known[name]:
                found.append(f"{name}: has no label {matcher.name!r}")
    if not names:
        found.append("names no metric")
    return found


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading."""
    kept = re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower())
    return kept.replace(" ", "-")


def rules() -> list[dict[str, Any]]:
    out = []
    for path in RULES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out.extend(group["rules"])
    return out


def test_the_catalog_is_the_services_own() -> None:
    known = catalog()
    for name in (
        "crater_scheduler_decisions_total",
        "crater_scheduler_decision_seconds_bucket",
        "crater_tenant_gpu_hours",
        "crater_tenant_budget_exceeded",
        "crater_webhook_circuit_open",
        "crater_leader",
        "crater_gateway_requests_total",
    ):
        assert name in known
    assert "le" in known["crater_scheduler_decision_seconds_bucket"]
    assert "tenant" in known["crater_tenant_gpu_hours"]
    # the check bites: a misspelt metric or label is found
    assert problems("crater_tenant_gpu_hour") == ["crater_tenant_gpu_hour: no service exports it"]
    assert problems('crater_tenant_gpu_hours{pool="a"}') == [
        "crater_tenant_gpu_hours: has no label 'pool'"
    ]


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_each_alert_rule_parses_names_real_metrics_and_has_a_runbook(rule: dict[str, Any]) -> None:
    assert problems(rule["expr"]) == []
    assert rule["labels"]["severity"] in {"critical", "warning", "info"}
    assert rule["annotations"]["summary"]
    anchor = rule["annotations"]["runbook"].split("#", 1)[1]
    headings = [slug(h) for h in re.findall(r"^#+ (.*)$", OPERATIONS.read_text(), re.MULTILINE)]
    assert anchor in headings, f"docs/operations.md has no runbook {anchor!r}"


def test_every_alert_the_issue_asks_for_is_there() -> None:
    assert {r["alert"] for r in rules()} >= REQUIRED_ALERTS


@pytest.mark.parametrize("panel", queries(), ids=lambda p: f"{p[0]}:{p[1]}")
def test_each_dashboard_query_parses_and_names_real_metrics(panel: tuple[str, str, str]) -> None:
    _, _, expr = panel
    assert problems(expr) == []


def test_the_committed_dashboards_are_generated_and_valid_json() -> None:
    wanted = files()
    assert {p.name for p in (ROOT / DEFAULT_OUT).glob("*.json")} == set(wanted)
    for name, text in wanted.items():
        assert (ROOT / DEFAULT_OUT / name).read_text() == text, f"{name}: run crater dashboards"
        dashboard = json.loads(text)
        panels = [p for p in dashboard["panels"] if p["type"] != "row"]
        assert panels
        assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
        assert all(t["expr"] for p in panels for t in p["targets"])
