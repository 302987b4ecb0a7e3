"""Bounded fuzzing in the suite (issue #16): schemathesis over the gateway's OpenAPI and
hypothesis bodies on every consumed bus subject, against a real nats-server with every
service in-process. No 5xx, no crash, no hang; every malformed message refused by each of
its consumers with a named field; the services still consume afterwards. The long run is
benchmarks/fuzz/run.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from benchmarks.fuzz.harness import CONSUMED, Figures, Stack, fuzz_bus, fuzz_rest, stack
from crater.runtime.nats_server import NatsServer

pytestmark = pytest.mark.integration


@pytest.fixture
async def running(fresh_nats: NatsServer, tmp_path: Path) -> AsyncIterator[Stack]:
    async with stack(fresh_nats.url, tmp_path) as started:
        yield started


def findings(figures: Figures, *kinds: str) -> str:
    return json.dumps([f for f in figures.findings if f["type"] in kinds], indent=1)[:4000]


@pytest.mark.timeout(120)
async def test_the_gateway_answers_every_fuzzed_request_without_a_5xx_or_a_hang(
    running: Stack,
) -> None:
    figures = Figures()
    await asyncio.to_thread(
        fuzz_rest, running.gateway_url, figures, 10, headers=running.auth_headers
    )
    assert figures.total("tried") >= 50
    assert figures.total("server_errors") == 0, findings(figures, "5xx")
    assert figures.total("hangs") == 0, findings(figures, "rest-hang")


@pytest.mark.timeout(120)
async def test_every_consumed_subject_refuses_malformed_messages_and_keeps_consuming(
    running: Stack,
) -> None:
    figures = Figures()
    await fuzz_bus(running.nats_url, figures, per_subject=12, batch_size=120)
    assert figures.total("tried") == 12 * len(CONSUMED)
    assert figures.total("crashes") == 0, findings(figures, "crash")
    assert figures.total("hangs") == 0, findings(figures, "hang")
    assert figures.total("rejected_as_expected") > 0
    assert figures.total("valid_consumed") > 0
    malformed_taken = [f for f in figures.findings if f["type"] == "malformed-taken"]
    assert malformed_taken == [], findings(figures, "malformed-taken")
    # and afterwards every service still consumes: a second round is judged the same way
    after = Figures()
    await fuzz_bus(running.nats_url, after, per_subject=2, batch_size=100, seed=1)
    assert after.total("hangs") == 0, findings(after, "hang")
    assert after.total("crashes") == 0, findings(after, "crash")
