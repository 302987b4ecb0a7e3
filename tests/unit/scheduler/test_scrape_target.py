"""An inference replica's grant names where its load is scraped: the request's
`inference_config.metrics` with the node's hostname (issue #25, item 6: discovery)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from crater.contracts import (
    Affinity,
    AllocationGranted,
    InferenceMetrics,
    MetricsFormat,
    TaskRequest,
)
from tests.support.topologies import node
from tests.unit.scheduler.test_core import cluster, profiled


def replica(metrics: dict[str, Any] | None, group: str | None = "chat-llama3") -> Any:
    event = profiled("chat-1", gpus=1)
    body = event.task.model_dump(by_alias=True)
    body["task_type"] = "inference"
    body["inference_config"] = None if metrics is None else {"metrics": metrics}
    body["anti_affinity"] = {"group": group}
    return event.model_copy(update={"task": TaskRequest.model_validate(body)})


def granted(metrics: dict[str, Any] | None, group: str | None = "chat-llama3") -> AllocationGranted:
    topology = node("a100-01", gpus=8).model_copy(update={"hostname": "a100-01.dc1.example"})
    scheduler, _ = cluster(topology)
    [grant] = scheduler.handle(replica(metrics, group))
    assert isinstance(grant, AllocationGranted)
    return grant


def test_a_port_and_path_become_a_url_on_the_nodes_hostname() -> None:
    grant = granted({"format": "vllm", "port": 8000})
    assert grant.scrape is not None
    assert grant.scrape.url == "http://a100-01.dc1.example:8000/metrics"
    assert (grant.scrape.format, grant.scrape.service) == (MetricsFormat.VLLM, "chat-llama3")


def test_a_url_is_taken_whole_with_the_host_filled_in() -> None:
    grant = granted({"format": "triton", "url": "https://{host}:8443/triton/metrics"}, group=None)
    assert grant.scrape is not None
    assert grant.scrape.url == "https://a100-01.dc1.example:8443/triton/metrics"
    assert grant.scrape.service == "chat-1"  # no fleet named: the task is its own service


def test_nothing_to_scrape_by_default_or_for_format_crater() -> None:
    assert granted(None).scrape is None
    assert granted({"format": "crater"}).scrape is None


def test_a_scraped_format_needs_an_endpoint() -> None:
    with pytest.raises(ValidationError, match="give a port or a url"):
        InferenceMetrics(format=MetricsFormat.TGI)
    with pytest.raises(ValidationError):
        InferenceMetrics(format=MetricsFormat.TGI, port=80, path="metrics")  # not a path


def test_a_replica_spread_over_a_gang_is_read_on_its_first_members_node() -> None:
    scheduler, _ = cluster(node("a100-01", gpus=8), node("a100-02", gpus=8))
    event = replica({"format": "vllm", "port": 8000})
    event = event.model_copy(
        update={"task": event.task.model_copy(update={"gang_size": 2, "affinity": Affinity()})}
    )
    grants = [g for g in scheduler.handle(event) if isinstance(g, AllocationGranted)]
    assert [g.gang_index for g in grants] == [0, 1]
    assert grants[0].scrape is not None
    assert grants[0].scrape.url == f"http://{grants[0].node}:8000/metrics"
    assert grants[1].scrape is None
