"""Calls from many concurrent callers sent together, each caller answered with its own
outcome: group commit for a service's request handlers.

A caller's item joins those waiting while a batch is under way; the first caller in sends
the next batch (at most `max_batch` items) and hands every caller of it its own result or
error. No timer and no background task: alone, a call is sent at once; under load, one
round trip serves many callers. The send is shielded from its caller: one that goes away
(its HTTP client hung up) takes no one else's call with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")

# Sends a batch; one outcome per item, in order: its result, or the error it alone met.
SendBatch = Callable[[list[T]], Awaitable[Sequence[R | BaseException]]]


class Together(Generic[T, R]):
    def __init__(self, send: SendBatch[T, R], max_batch: int = 256) -> None:
        self.send = send
        self.max_batch = max_batch
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._lock = asyncio.Lock()

    async def __call__(self, item: T) -> R:
        """`item` sent in the next batch; its own result, or its own error raised."""
        done: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, done))
        async with self._lock:  # the first caller in sends; the others' batch may be done
            if not done.done():
                batch = self._waiting[: self.max_batch]
                del self._waiting[: self.max_batch]
                await asyncio.shield(asyncio.ensure_future(self._send(batch)))
        return await done

    async def _send(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            outcomes = await self.send([item for item, _ in batch])
        except Exception as error:  # the batch as a whole failed: every caller of it told
            for _, done in batch:
                if not done.done():
                    done.set_exception(error)
            return
        for (_, done), outcome in zip(batch, outcomes, strict=True):
            if done.done():
                continue
            if isinstance(outcome, BaseException):
                done.set_exception(outcome)
            else:
                done.set_result(outcome)


__all__ = ["SendBatch", "Together"]
