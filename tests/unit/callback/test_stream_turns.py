"""A pull batch is handled concurrently; its handlers hand their events in by delivery order."""

from __future__ import annotations

import asyncio
import time

from crater.callback.app import StreamTurns


async def test_handlers_that_arrive_out_of_order_take_their_turns_in_order() -> None:
    turns = StreamTurns(patience=5.0)
    turns.done("CRATER_TASKS", 10)
    handed: list[int] = []

    async def handler(sequence: int, late: float) -> None:
        await asyncio.sleep(late)
        await turns.wait("CRATER_TASKS", sequence)
        handed.append(sequence)
        turns.done("CRATER_TASKS", sequence)

    await asyncio.gather(handler(11, 0.05), handler(12, 0.0), handler(13, 0.01))
    assert handed == [11, 12, 13]


async def test_a_delivery_that_went_elsewhere_costs_only_the_patience() -> None:
    turns = StreamTurns(patience=0.1)
    turns.done("CRATER_ALLOCATIONS", 3)
    started = time.monotonic()
    await turns.wait("CRATER_ALLOCATIONS", 5)  # 4 went to another replica
    assert 0.09 <= time.monotonic() - started < 1.0
    await turns.wait("CRATER_TASKS", 1)  # the first ever: no wait
    assert turns._waiting == {}  # nothing left behind for the one that never came
