"""The delivery log in the database: one row per (source event, endpoint), one per attempt.

The consumers only record deliveries (pending, due now) together with their inbox mark, and
ack after that commit; the delivery loop claims due deliveries, sends them, and commits each
attempt with the delivery's new state (and, once settled, its outcome event in the outbox) in
one transaction. A claim lapses after a while, so a crashed replica's deliveries are sent again
by whoever comes next, with the same webhook-id.

What AllData is told (domain/lifecycle.py): each task has a row (`callback_tasks`) with its
end; recording and claiming lock the rows of their tasks first, and judge each lifecycle
delivery against the end and what was already released to its endpoint (`released_at`). A
delivery ruled out is `superseded`, with its reason, and never sent.
"""

from __future__ import annotations

from crater.callback.adapters.claiming import Claiming
from crater.callback.adapters.operations import Operations
from crater.callback.adapters.recording import Recording
from crater.callback.adapters.records import (
    CONSUMER,
    NO_ENDPOINT,
    Attempt,
    Claimed,
    DeliveryRow,
    Due,
    Enqueued,
    Settlement,
    SupersededHook,
    utc,
)
from crater.callback.adapters.schedule import Schedule

__all__ = [
    "CONSUMER",
    "NO_ENDPOINT",
    "Attempt",
    "Claimed",
    "DeliveryLog",
    "DeliveryRow",
    "Due",
    "Enqueued",
    "Settlement",
    "SupersededHook",
    "utc",
]


class DeliveryLog(Recording, Claiming, Schedule, Operations):
    """The delivery log: recording (recording.py), claiming (claiming.py), the retry schedule
    (schedule.py) and the operators' side (operations.py), over one set of sessions."""
