"""A task submitted once per task id across every gateway replica: the id claimed in a
JetStream key-value bucket (the verdicts in claims.py), then published, then confirmed."""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from datetime import UTC, datetime, timedelta

import nats.js.errors
from fastapi.responses import JSONResponse
from nats.js.kv import KeyValue

from crater.contracts import TaskSubmitted
from crater.gateway.bus import Bus
from crater.gateway.claims import (
    Claim,
    Verdict,
    claim_key,
    claimed_reason,
    held,
    judge,
    known_reason,
    takeover_id,
)
from crater.gateway.models import ScheduleAccepted, task_known
from crater.gateway.settings import GatewaySettings
from crater.runtime.bus import key_value
from crater.runtime.service import BUS_ERRORS

log = logging.getLogger("crater.gateway")

# The task ids the gateway accepted (a JetStream key-value bucket, shared by every replica):
# each is claimed there once (claims.py), and a task still with the predictor, unknown to the
# scheduler, may yet be cancelled.
ACCEPTED_BUCKET = "crater_gateway_accepted"


SETTLE_SECONDS = 6.0


class Submissions:
    """The accepted ids' bucket (opened once the broker is connected) and the bus."""

    def __init__(self, bus: Bus, settings: GatewaySettings) -> None:
        self.bus = bus
        self.settings = settings
        self.grace = timedelta(seconds=settings.abandoned_claim_seconds)
        # How long a second request for a claimed id waits for the claimer before answering
        # 503 (retry later): most publishes confirm well within it. The grace, not this, must
        # outlast a publish's retries (settings: abandoned_claim_seconds).
        self.settle_seconds = SETTLE_SECONDS
        self._bucket: KeyValue | None = None

    async def open(self) -> None:
        """Open (or create) the bucket; after the broker started."""
        self._bucket = await key_value(
            self.bus.broker,
            ACCEPTED_BUCKET,
            self.settings.stream_replicas,
            ttl=self.settings.remember_accepted_seconds,
            history=1,
        )

    @property
    def accepted(self) -> KeyValue:
        if self._bucket is None:
            raise RuntimeError("the accepted ids' bucket is not open: the gateway has not started")
        return self._bucket

    async def claim_of(self, task_id: str) -> tuple[Claim, int] | None:
        """The id's claim and its revision (for a compare-and-set), if any."""
        try:
            entry = await self.accepted.get(claim_key(task_id))
        except nats.js.errors.KeyNotFoundError:
            return None
        return Claim.decode(entry.value or b""), entry.revision or 0

    async def accepted_claim(self, task_id: str) -> Claim | None:
        """The claim of `task_id` if this gateway (any replica) accepted it lately."""
        found = await self.claim_of(task_id)
        claim = found[0] if found else None
        return claim if held(claim, datetime.now(UTC), self.grace) else None

    async def publish_claimed(self, event: TaskSubmitted, claim: Claim, revision: int) -> None:
        """Publish under the claim, then mark it submitted (a failed mark is only logged: the
        claim then reads as abandoned after the grace, and a second submission is refused
        on the bus)."""
        await self.bus.publish(event)
        done = claim.model_copy(update={"submitted": True}).encode()
        try:
            await self.accepted.update(claim_key(event.task_id), done, last=revision)
        except (nats.js.errors.KeyWrongLastSequenceError, *BUS_ERRORS) as error:
            log.warning("could not confirm the claim of task %s: %r", event.task_id, error)

    async def changed(self, task_id: str, revision: int) -> None:
        """Wait until the id's claim changes (confirmed, freed or taken over), at most
        `settle_seconds` (and never past the claim's grace)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(self.settle_seconds, self.grace.total_seconds())
        while asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
            found = await self.claim_of(task_id)
            if found is None or found[1] != revision:
                return

    async def submit(self, event: TaskSubmitted, body: str) -> ScheduleAccepted | JSONResponse:
        """Claim the task id, then publish: once per id across every replica (claims.py).
        `body` is the request's digest."""
        task_id, key = event.task_id, claim_key(event.task_id)
        waited = False
        for _ in range(3):  # a claim lost, freed or settled meanwhile is judged again
            found = await self.claim_of(task_id)
            claim, revision = found if found else (None, 0)
            now = datetime.now(UTC)
            verdict = judge(claim, event.event_id, now, self.grace)
            if verdict is Verdict.RETRY and claim is not None:
                # The same submission again (Idempotency-Key): published once; a claim not
                # yet confirmed is published again, and JetStream drops the copy.
                if not claim.submitted:
                    await self.publish_claimed(event, claim, revision)
                return ScheduleAccepted(task_id=task_id, event_id=event.event_id)
            known = await self.bus.scheduler_summary(task_id)
            if known is not None:
                return task_known(
                    task_id, known.status.value, known_reason(task_id, known.status.value)
                )
            if verdict is Verdict.KNOWN and claim is not None:
                if claim.submitted:
                    return task_known(task_id, "submitted", claimed_reason(task_id, claim))
                # Claimed, not confirmed: its claimer is publishing, or died. Not a 409 yet:
                # a client told "known" would stop retrying a task never submitted. Waited
                # for once per request; then the client is asked to retry.
                if waited:
                    break
                waited = True
                await self.changed(task_id, revision)
                continue
            if verdict is Verdict.ABANDONED and claim is not None:
                event_id = takeover_id(claim, event.event_id, body)
                event = event.model_copy(update={"event_id": event_id})
            mine = Claim(event_id=event.event_id, claimed_at=now, body=body, tenant=event.tenant)
            try:
                if verdict is Verdict.NEW:
                    revision = await self.accepted.create(key, mine.encode())
                else:  # abandoned: taken over only if nobody changed it meanwhile
                    revision = await self.accepted.update(key, mine.encode(), last=revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                continue
            try:
                await self.publish_claimed(event, mine, revision)
            except BUS_ERRORS:
                # Not submitted: free the id for a retry, unless someone else holds it now.
                with suppress(nats.js.errors.KeyWrongLastSequenceError, *BUS_ERRORS):
                    await self.accepted.delete(key, last=revision)
                raise
            return ScheduleAccepted(task_id=task_id, event_id=event.event_id)
        found = await self.claim_of(task_id)
        if found is not None and found[0].submitted:
            return task_known(task_id, "submitted", claimed_reason(task_id, found[0]))
        return JSONResponse(
            status_code=503,
            headers={"Retry-After": str(int(self.settle_seconds))},
            content={
                "detail": f"task {task_id!r} is being submitted by another request, not yet "
                "confirmed: retry (a claim never confirmed is taken over after "
                f"abandoned_claim_seconds, {self.grace.total_seconds():g} s)"
            },
        )
