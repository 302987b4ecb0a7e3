"""Every metric the services export, from their real registries: each service built as
`crater run` builds it (development settings, nothing started), plus the leadership gauges
a scheduler or autoscaler registers once elected. A custom collector (the probe's per node
and card series, rendered at scrape time) says its families, with their labels, in
`describe()`. Series names as Prometheus scrapes them:
a counter's `_total`, a histogram's `_bucket` (with `le`), `_sum` and `_count`."""

from __future__ import annotations

import importlib
import os
from functools import cache
from typing import Any

from prometheus_client import CollectorRegistry

from crater.runtime.leadership import leadership_gauges

SERVICES = ("scheduler", "predictor", "callback", "autoscaler", "probe", "gateway")
# Labels Prometheus adds to every scraped series (deploy/compose/prometheus.yml's jobs).
TARGET_LABELS = frozenset({"job", "instance"})


def _registry(service: str) -> CollectorRegistry:
    built: Any = importlib.import_module(f"crater.{service}.app").build()
    if isinstance(built, tuple):
        return built[0].registry  # type: ignore[no-any-return]
    return built.state.service.registry  # type: ignore[no-any-return]


def _series(registry: CollectorRegistry, into: dict[str, set[str]]) -> None:
    collectors = registry._collector_to_names  # names a collector exposes
    for collector, names in collectors.items():
        if not hasattr(collector, "_labelnames"):
            _described(collector, into)  # a custom collector: several families, each its own
            continue
        labels = set(collector._labelnames)
        kind = getattr(collector, "_type", "")
        for name in names:
            extra = {"le"} if kind == "histogram" and name.endswith("_bucket") else set()
            into.setdefault(name, set()).update(labels | extra | TARGET_LABELS)


# The series a metric family of each type exposes, by suffix.
SUFFIXES = {
    "counter": ("_total",),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count"),
    "summary": ("", "_sum", "_count"),
    "info": ("_info",),
}


def _described(collector: Any, into: dict[str, set[str]]) -> None:
    """A custom collector's families (`describe()`: name, type and label names each)."""
    for family in collector.describe():
        labels = set(getattr(family, "_labelnames", ()))
        for suffix in SUFFIXES.get(family.type, ("",)):
            extra = {"le"} if suffix == "_bucket" else set()
            into.setdefault(family.name + suffix, set()).update(labels | extra | TARGET_LABELS)


@cache
def catalog() -> dict[str, frozenset[str]]:
    """Series name -> the label names it can carry."""
    os.environ.setdefault("CRATER_ENVIRONMENT", "development")
    found: dict[str, set[str]] = {}
    for service in SERVICES:
        _series(_registry(service), found)
    elected = CollectorRegistry()
    leadership_gauges(elected)
    _series(elected, found)
    found["up"] = set(TARGET_LABELS)  # Prometheus' own, per target
    return {name: frozenset(labels) for name, labels in found.items()}
