"""The gateway's side of NATS: publish an event, ask a service over request-reply."""

from __future__ import annotations

import logging
from typing import TypeVar

from fastapi.responses import JSONResponse
from faststream.nats import NatsBroker
from pydantic import ValidationError

from crater.contracts import Contract, Event
from crater.contracts.queries import QuerySubjects, TasksAnswer, TasksQuery, TaskSummary
from crater.gateway.models import problem
from crater.gateway.settings import GatewaySettings
from crater.runtime.bus import PublishTogether
from crater.runtime.service import BUS_ERRORS
from crater.runtime.together import Together

log = logging.getLogger("crater.gateway")

Answer = TypeVar("Answer", bound=Contract)


class Bus:
    """The broker, and how long the gateway waits for an answer on it."""

    def __init__(self, broker: NatsBroker, settings: GatewaySettings) -> None:
        self.broker = broker
        self.settings = settings
        # Concurrent requests' events go out together; each request still waits for its ack.
        self.together = PublishTogether(broker)
        self.known_together: Together[str, TaskSummary | None] = Together(self._known, 1000)

    async def publish(self, event: Event) -> None:
        await self.together.publish(event)

    async def ask(
        self, subject: str, query: Contract, answer: type[Answer], service: str = "scheduler"
    ) -> Answer | JSONResponse:
        """`service`'s answer on `subject`; a 503 naming it when it does not answer, a 502
        when its answer does not validate."""
        try:
            reply = await self.broker.request(
                query.model_dump_json().encode(),
                subject,
                headers={"content-type": "application/json"},
                timeout=self.settings.query_timeout_seconds,
            )
        except BUS_ERRORS as error:
            log.warning("no answer on %s: %r", subject, error)
            return problem(503, f"{service} not answering")
        if reply is None:  # refused by the bus's own checks (not JSON text): logged there
            return problem(502, f"{service} answered with an invalid {answer.__name__}")
        try:
            return answer.model_validate_json(reply.body)
        except ValidationError as error:
            log.warning("bad answer on %s: %s", subject, error)
            return problem(502, f"{service} answered with an invalid {answer.__name__}")

    async def scheduler_summary(self, task_id: str) -> TaskSummary | None:
        """The scheduler's view of `task_id`; None if it does not know it, or does not answer
        (then the claim alone decides here, and the scheduler refuses on the bus a duplicate
        it knows). Concurrent submissions ask together: one question for many ids."""
        return await self.known_together(task_id)

    async def _known(self, task_ids: list[str]) -> list[TaskSummary | None]:
        """The scheduler's view of each of `task_ids`, in one question."""
        asked = TasksQuery(task_ids=task_ids, limit=len(task_ids), estimates=False)
        query = asked.model_dump_json().encode()
        try:
            # nats-py's own request: with no scheduler subscribed it fails at once (no
            # responders) instead of holding every submission for the whole timeout.
            reply = await self.broker.connection.request(
                QuerySubjects.TASKS, query, timeout=self.settings.query_timeout_seconds
            )
            answer = TasksAnswer.model_validate_json(reply.data)
        except (*BUS_ERRORS, ValidationError) as error:
            log.debug("no scheduler view of %d tasks: %r", len(task_ids), error)
            return [None] * len(task_ids)
        found = {t.task_id: t for t in answer.tasks}
        return [found.get(task_id) for task_id in task_ids]
