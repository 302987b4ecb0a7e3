"""The files under examples/ are what people copy: each must still be accepted as is."""

from __future__ import annotations

from pathlib import Path

import pytest

from crater.contracts import TaskRequest
from crater.scheduler.adapters.pools_file import load_pools
from crater.scheduler.adapters.quotas_file import load_quotas
from crater.scheduler.domain.quotas import Queue, Quota, UserLimit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.json")), ids=lambda p: p.name)
def test_example_task_is_a_valid_request(path: Path) -> None:
    request = TaskRequest.model_validate_json(path.read_text())
    assert request.task_id


def test_the_leaf_bound_gang_example_asks_what_its_docs_say() -> None:
    request = TaskRequest.model_validate_json((EXAMPLES / "train-ddp-one-leaf.json").read_text())
    assert request.gang_size == 4
    assert request.network_topology is not None
    assert [level.value if level else None for level in request.network_topology.levels] == [
        "nvlink-domain",
        "leaf",
    ]


def test_example_pools_file_loads() -> None:
    pools = load_pools(EXAMPLES / "pools.yaml")
    assert pools["inference"].overcommit.cpu == 2.0
    assert "training" in pools
    retry = pools["training"].restart
    assert (retry.when, retry.max_attempts) == (["failure", "node-lost"], 3)
    assert [retry.backoff_before(n) for n in (2, 3)] == [30, 60]
    assert pools["inference"].restart.when == []  # never, unless a task asks


def test_example_quotas_file_loads_hard_and_elastic_tenants() -> None:
    tenants = load_quotas(EXAMPLES / "quotas-elastic.yaml")
    assert tenants.limits == {"research": Quota(gpus=8)}
    search = tenants.shares["search"]
    assert (search.guarantee.gpus, search.cap.gpus, search.reserved.gpus) == (16, 24, 4)
    assert tenants.shares["ads"].cap.gpus is None  # no borrowing limit


def test_example_quotas_file_loads_per_user_limits() -> None:
    tenants = load_quotas(EXAMPLES / "quotas-users.yaml")
    acme = tenants.users["acme"]
    assert acme.of("bob") == UserLimit(running_gpus=4, queued_tasks=20, notebooks=2)
    assert acme.of("alice") == UserLimit(running_gpus=8, queued_tasks=20, notebooks=2)
    assert tenants.shares["acme"].cap.gpus == 24
    assert "lab" not in tenants.limits  # per-user limits only
    assert tenants.users["lab"].of("x") == UserLimit(notebooks=1)


def test_example_quotas_file_loads_nested_queues() -> None:
    tenants = load_quotas(EXAMPLES / "quotas-queues.yaml")
    assert tenants.queues["research"] == Queue(Quota(gpus=24), "acme")
    assert tenants.queues["ads"] == Queue(Quota(), "acme")
    assert tenants.queue_of == {"vision": "research", "nlp": "research", "ads-ranking": "ads"}


def test_example_price_file_prices_every_gpu_of_the_demo_fleet() -> None:
    """crater up runs with it (crater cost shows a cost): each of the demo's GPU models has a
    price of its own, none falls back to the default."""
    from decimal import Decimal

    from crater.predictor.domain.usage import load_prices

    prices = load_prices(EXAMPLES / "prices.yaml")
    assert prices is not None
    demo_models = {
        "NVIDIA A100-SXM4-80GB": "2.50",
        "NVIDIA A100-PCIE-40GB": "2.50",
        "NVIDIA H100 80GB HBM3": "4.00",
        "Tesla V100-SXM2-32GB": "1.20",
        "NVIDIA GeForce RTX 4090": "0.70",
        "Tesla T4": "0.35",
    }
    assert {m: prices.per_gpu_hour(m) for m in demo_models} == {
        m: Decimal(p) for m, p in demo_models.items()
    }
    assert prices.budgets == {}  # the demo refuses nothing for money
