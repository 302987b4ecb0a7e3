"""A node's reports on the tasks granted to it, shared by the executing agent (`executor`) and
the simulated fleet's runner (`sim.runner`): the report's derived id, its retried publish, and
what became of a grant."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import timedelta
from enum import StrEnum
from typing import Literal

from crater.contracts import (
    AllocationGranted,
    Event,
    TaskStatus,
    TaskStatusReported,
    derived_event_id,
)

log = logging.getLogger("crater.probe.runner")  # the name its warnings have always had

Publish = Callable[[Event], Awaitable[None]]
Reported = Literal[TaskStatus.RUNNING, TaskStatus.SUCCEEDED, TaskStatus.FAILED]
RETRY_SECONDS = (0.5, 1.0, 2.0, 5.0)
# A grant whose reservation ran out this long ago is history (a new consumer starts at the
# beginning of the stream), not work. Generous, so that a scheduler working through a
# backlog, whose grants carry the time of their cause, is still served.
STALE_AFTER = timedelta(minutes=10)


class GrantOutcome(StrEnum):
    STARTED = "started"
    NOT_OURS = "not-ours"  # a node another probe reports
    DUPLICATE = "duplicate"  # a redelivery of a grant already running here
    STALE = "stale"  # its reservation expired long before we saw it: history, not work
    WAITING = "waiting"  # executing agent: its task's body (command) has not come yet


def status_report(
    grant: AllocationGranted, status: Reported, message: str, out_of_memory: bool = False
) -> TaskStatusReported:
    """A node's report on a granted allocation. Its id derives from the grant's, so a
    redelivered grant, or a restarted agent reporting again, cannot double it.
    `out_of_memory`: a failure the kernel's OOM killer caused (a failure of kind oom)."""
    return TaskStatusReported(
        event_id=derived_event_id(grant.event_id, status.value),
        task_id=grant.task_id,
        status=status,
        allocation_id=grant.allocation_id,
        message=message[:2048],
        out_of_memory=out_of_memory,
    )


async def publish_retried(publish: Publish, event: TaskStatusReported) -> None:
    """The scheduler waits on a node's reports, so a broker hiccup must not lose one; the
    derived event id makes every retry safe."""
    attempt = 0
    while True:
        try:
            await publish(event)
            return
        except Exception as error:
            delay = RETRY_SECONDS[min(attempt, len(RETRY_SECONDS) - 1)]
            attempt += 1
            log.warning(
                "reporting %s %s failed (%s); retrying in %ss",
                event.task_id,
                event.status.value,
                error,
                delay,
            )
            await asyncio.sleep(delay)
