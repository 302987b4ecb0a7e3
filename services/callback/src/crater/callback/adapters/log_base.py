"""What the delivery log's parts share: its sessions, its SQLite writer queue, its hook."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker

from crater.callback.adapters.records import CONSUMER, SupersededHook
from crater.callback.domain.lifecycle import Superseded
from crater.runtime.db import one_writer


class LogBase:
    """The sessions, the writer queue and the hook every part of the delivery log uses."""

    def __init__(
        self,
        sessions: async_sessionmaker[Any],
        consumer: str = CONSUMER,
        on_superseded: SupersededHook | None = None,
    ) -> None:
        self.sessions = sessions
        self.consumer = consumer
        self.on_superseded = on_superseded

    def _writing(self) -> contextlib.AbstractAsyncContextManager[Any]:
        # SQLite has one writer at a time and makes the others poll, sleeping up to 100 ms
        # a try: this process's writers (consumers, delivery loop, outbox relay) take turns.
        return one_writer(self.sessions)

    def _tell_superseded(self, superseded: Iterable[tuple[str, Superseded]]) -> None:
        if self.on_superseded is None:
            return
        for endpoint, why in superseded:
            self.on_superseded(endpoint, why)
