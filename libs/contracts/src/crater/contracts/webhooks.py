"""Webhooks: the outcome of telling AllData about a task."""

from __future__ import annotations

from uuid import UUID

from pydantic import Field

from crater.contracts.base import Event


class WebhookDelivered(Event):
    webhook_id: str = Field(description="Stable per source event; the receiver de-duplicates.")
    source_event_id: UUID
    task_id: str
    task_status: str
    endpoint: str
    status_code: int
    attempts: int = Field(ge=1)
    latency_ms: float = Field(ge=0)


class WebhookDeadLettered(Event):
    webhook_id: str
    source_event_id: UUID
    task_id: str
    task_status: str
    endpoint: str
    attempts: int = Field(ge=1)
    last_error: str
