"""The webhook as AllData parses it (the `alldata` format, the default) and as Crater types it
(`crater`): contract tests against AllData's own fixture, the headers that carry what the
alldata body leaves out, and the per-endpoint setting."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from crater.callback.app import CallbackSettings
from crater.callback.domain.endpoints import parse_endpoints
from crater.callback.domain.payload import WebhookFormat, render, webhook_body
from crater.contracts import TaskSequence, TaskUnderutilized, WebhookBody
from tests.support.alldata import fixture, shape
from tests.support.lifecycle import OCCURRED, ended, granted, pending, rejected, status

FIXTURE_TASK = "train-llama3-8b-20240520-001"


def ordered(raw: bytes) -> Any:
    """The document with its objects' key order kept (as lists of pairs)."""
    return json.loads(raw, object_pairs_hook=list)


def fixture_grant() -> Any:
    """The grant that alldata_webhook.json tells of, as the scheduler emits it."""
    return granted(
        FIXTURE_TASK,
        node="gpu-node-03",
        gpu_ids=[0, 1],
        cpu_cores=list(range(24)),
        numa_node=0,
        checkpoint_path="/crater-cache/checkpoint",
        environment={"CRATER_GPU_IDS": "0,1", "CRATER_CPU_CORES": "0-23"},
    )


def test_the_alldata_scheduled_body_has_exactly_the_fixtures_shape() -> None:
    recorded = webhook_body(fixture_grant()).encode().decode()
    sent = render(recorded, WebhookFormat.ALLDATA).body
    expected = fixture("alldata_webhook.json")
    # Same keys, same order, same JSON types, at every level ...
    assert shape(json.loads(sent)) == shape(json.loads(expected))
    # ... and, for the fixture's own grant, the same document.
    assert json.loads(sent) == json.loads(expected)


def test_the_shape_check_sees_a_type_or_an_order_change() -> None:
    """The contract test above can fail: ints for strings, or keys swapped, differ."""
    expected = shape(json.loads(fixture("alldata_webhook.json")))
    typed = webhook_body(fixture_grant()).model_dump(mode="json", include={"task_id", "status"})
    typed["allocated_resources"] = {
        "node": "gpu-node-03",
        "gpu_ids": [0, 1],  # Crater's ints, not AllData's strings
        "cpu_cores": list(range(24)),
        "numa_node": 0,
        "checkpoint_path": "/x",
    }
    assert shape(json.loads(json.dumps(typed).encode())) != expected
    swapped = dict(reversed(list(typed.items())))
    typed["allocated_resources"]["gpu_ids"] = ["0", "1"]
    typed["allocated_resources"]["numa_node"] = "0"
    assert shape(json.loads(json.dumps(typed).encode())) == expected
    assert shape(json.loads(json.dumps(swapped).encode())) != expected


def test_a_grant_without_numa_placement_says_null() -> None:
    recorded = webhook_body(granted(numa_node=None)).encode().decode()
    body = json.loads(render(recorded, "alldata").body)
    assert body["allocated_resources"]["numa_node"] is None
    assert body["allocated_resources"]["gpu_ids"] == ["0", "1"]


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (pending("t"), {"task_id": "t", "status": "pending"}),
        (status("t"), {"task_id": "t", "status": "running"}),
        (ended("t"), {"task_id": "t", "status": "succeeded"}),
        (rejected("t"), {"task_id": "t", "status": "rejected"}),
        (
            rejected("t", duplicate=True),
            {"task_id": "t", "status": "rejected", "duplicate_submission": True},
        ),
    ],
)
def test_other_statuses_are_task_status_and_reason(event: Any, expected: dict[str, Any]) -> None:
    typed = webhook_body(event)
    body = ordered(render(typed.encode().decode(), "alldata").body)
    reason = ("reason", typed.reason)
    assert body == [*list(expected.items())[:2], reason, *list(expected.items())[2:]]


def underutilized(**overrides: Any) -> TaskUnderutilized:
    fields: dict[str, Any] = {
        "task_id": "t",
        "allocation_id": "alloc-t",
        "attempt": 2,
        "measured_gpu_utilization_percent": 12.5,
        "min_gpu_utilization_percent": 60,
        "window_seconds": 300,
        "samples": 10,
        "occurred_at": OCCURRED,
    }
    return TaskUnderutilized(**(fields | overrides))


def test_the_sla_breach_is_a_running_webhook_with_the_two_utilizations() -> None:
    typed = webhook_body(underutilized())
    assert (typed.status.value, typed.attempt, typed.sequence) == ("running", 2, None)
    assert (typed.gpu_utilization_percent, typed.min_gpu_utilization_percent) == (12.5, 60)
    assert typed.reason == (
        "GPU utilization 12.5% over 300 s (10 samples), below the task's "
        "sla.min_gpu_utilization_percent 60%"
    )
    alldata = ordered(render(typed.encode().decode(), "alldata").body)
    assert alldata == [
        ("task_id", "t"),
        ("status", "running"),
        ("reason", typed.reason),
        ("gpu_utilization_percent", 12.5),
        ("min_gpu_utilization_percent", 60.0),
    ]
    crater = json.loads(render(typed.encode().decode(), "crater").body)
    assert (crater["gpu_utilization_percent"], crater["min_gpu_utilization_percent"]) == (
        12.5,
        60.0,
    )


def test_only_the_sla_breach_carries_utilization_keys() -> None:
    body = json.loads(render(webhook_body(status("t")).encode().decode(), "alldata").body)
    assert "gpu_utilization_percent" not in body


def test_the_crater_format_sends_the_recorded_body_with_the_environment() -> None:
    recorded = webhook_body(fixture_grant()).encode().decode()
    sent = render(recorded, WebhookFormat.CRATER).body
    assert sent == recorded.encode()  # the recorded bytes, as a body from before formats
    resources = WebhookBody.model_validate_json(sent).allocated_resources
    assert resources is not None
    assert resources.environment == {"CRATER_GPU_IDS": "0,1", "CRATER_CPU_CORES": "0-23"}
    assert resources.gpu_ids == [0, 1]
    assert b"CRATER_GPU_IDS" not in render(recorded, WebhookFormat.ALLDATA).body


def test_headers_carry_what_the_alldata_body_leaves_out() -> None:
    event = granted("ddp", gang_index=1, gang_size=2, attempt=3).model_copy(
        update={"task_sequence": TaskSequence(number=9, previous=7)}
    )
    recorded = webhook_body(event).encode().decode()
    rendered = render(recorded, "alldata")
    assert rendered.headers == {
        "crater-format": "alldata",
        "crater-occurred-at": "2025-05-01T12:00:00Z",
        "crater-sequence": "9",
        "crater-attempt": "3",
        "crater-gang-index": "1",
        "crater-gang-size": "2",
        # what a launcher confirms the allocation with
        "crater-allocation-id": "alloc-ddp",
        "crater-reservation-token": "tok-1",
        "crater-reservation-expires-at": "2025-05-01T12:00:30Z",
    }
    assert render(recorded, "crater").headers["crater-format"] == "crater"
    typed = WebhookBody.model_validate_json(render(recorded, "crater").body)
    assert (typed.allocation_id, typed.reservation_token) == ("alloc-ddp", "tok-1")
    assert typed.reservation_expires_at == event.reservation_expires_at
    # the alldata body keeps AllData's exact shape: none of them in it
    assert b"tok-1" not in rendered.body
    assert b"alloc-ddp" not in rendered.body
    # A node's report says neither sequence nor (before release) attempt: not sent empty.
    report = render(webhook_body(status("t")).encode().decode(), "alldata")
    assert set(report.headers) == {"crater-format", "crater-occurred-at"}


@pytest.mark.parametrize("format", ["alldata", "crater"])
def test_rendering_is_deterministic(format: str) -> None:
    recorded = webhook_body(fixture_grant()).encode().decode()
    assert render(recorded, format) == render(recorded, format)


def test_an_endpoint_is_alldata_unless_it_asks_for_crater() -> None:
    endpoints = parse_endpoints(
        "endpoints:\n"
        "  - {name: alldata, url: 'http://a/'}\n"
        "  - {name: launcher, url: 'http://b/', format: crater, events: [TaskUnderutilized]}\n"
    )
    assert [(e.name, e.format) for e in endpoints] == [
        ("alldata", WebhookFormat.ALLDATA),
        ("launcher", WebhookFormat.CRATER),
    ]
    assert endpoints[1].wants("TaskUnderutilized", "running")
    assert not endpoints[1].wants("TaskStatusReported", "running")


def test_an_unknown_format_is_refused_naming_the_accepted_ones() -> None:
    with pytest.raises(ValidationError) as refused:
        parse_endpoints("endpoints:\n  - {url: 'http://a/', format: json}\n")
    [error] = refused.value.errors()
    assert error["loc"] == ("endpoints", 0, "format")
    assert "'alldata' or 'crater'" in error["msg"]


def test_the_single_endpoint_setting_reads_its_format_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CRATER_CALLBACK_WEBHOOK_URL", "http://a/")
    assert CallbackSettings().endpoints()[0].format is WebhookFormat.ALLDATA
    monkeypatch.setenv("CRATER_CALLBACK_WEBHOOK_FORMAT", "crater")
    assert CallbackSettings().endpoints()[0].format is WebhookFormat.CRATER
    monkeypatch.setenv("CRATER_CALLBACK_WEBHOOK_FORMAT", "typed")
    with pytest.raises(ValidationError) as refused:
        CallbackSettings()
    [error] = refused.value.errors()
    assert error["loc"] == ("webhook_format",)
    assert "'alldata' or 'crater'" in error["msg"]
