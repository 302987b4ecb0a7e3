"""Lifecycle events numbered as the scheduler stamps them (`task_sequence`), and a node's
report tied to its allocation as the probe sends it."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TypeVar

from crater.contracts import Event, TaskEvent, TaskSequence, TaskStatus, TaskStatusReported
from tests.support.lifecycle import status

E = TypeVar("E", bound=Event)


class Numbering:
    """The scheduler's numbering: one growing number over all tasks, and per task the last."""

    def __init__(self, start: int = 100) -> None:
        self.numbers: Iterator[int] = itertools.count(start)
        self.last: dict[str, int] = {}

    def __call__(self, event: E) -> E:
        if not isinstance(event, TaskEvent):
            return event
        number = next(self.numbers)
        task_id = str(getattr(event, "task_id"))  # noqa: B009
        sequence = TaskSequence(number=number, previous=self.last.get(task_id))
        self.last[task_id] = number
        return event.model_copy(update={"task_sequence": sequence})


def report(task_id: str, value: TaskStatus = TaskStatus.RUNNING) -> TaskStatusReported:
    """A node's report about the allocation `tests.support.lifecycle.granted` makes."""
    return status(task_id, value).model_copy(update={"allocation_id": f"alloc-{task_id}"})
