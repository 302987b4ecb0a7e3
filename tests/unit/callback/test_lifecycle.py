"""What AllData is told of one task: the guard's rule (domain/lifecycle.py), and, over every
arrival order and lag, the webhooks one endpoint receives when the delivery log places,
holds, judges and releases them as the real one does (an in-memory model of its queue)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from crater.callback.domain.lifecycle import (
    Candidate,
    End,
    Superseded,
    Told,
    attempt_before,
    end_after,
    ends_task,
    in_lifecycle,
    repeats,
    verdict,
)
from crater.callback.domain.ordering import Recorded, place
from crater.callback.domain.payload import webhook_body, with_attempt
from crater.contracts import TaskStatus
from tests.support.lifecycle import ended, pending, rejected, status

END = End("end", 40)


def test_the_first_terminal_recorded_is_the_end_and_stays_it() -> None:
    first = end_after(None, Candidate("ended", 40, ends=True))
    assert first == End("ended", 40)
    assert end_after(first, Candidate("rejected", 41, ends=True)) == first
    assert end_after(None, Candidate("pending", 20)) is None


def test_the_end_always_goes_and_a_second_one_never() -> None:
    assert verdict(Told(END, released=60), Candidate("end", 40, ends=True), True) is None
    second = Candidate("other-end", 44, ends=True)
    assert verdict(Told(END), second, False) is Superseded.SECOND_END
    assert verdict(Told(END), second, True) is Superseded.SECOND_END


def test_nothing_follows_the_end_but_what_comes_before_it_still_goes() -> None:
    assert verdict(Told(END), Candidate("late-running", 41), False) is Superseded.AFTER_END
    assert verdict(Told(END), Candidate("late-pending", 20), True) is None


def test_an_event_below_one_already_released_is_out_of_order() -> None:
    assert verdict(Told(released=30), Candidate("pending", 20), True) is Superseded.OUT_OF_ORDER
    assert verdict(Told(released=30), Candidate("report", 31), True) is None
    assert verdict(Told(released=30), Candidate("level", 30), True) is None


def test_a_report_without_its_grant_is_judged_when_its_wait_runs_out() -> None:
    waiting = Candidate("running", 41, placed=False)
    assert verdict(Told(END), waiting, releasing=False) is None  # its place is not known yet
    assert verdict(Told(), waiting, releasing=True) is Superseded.NO_GRANT


def test_a_second_report_about_the_same_allocation_tells_nothing_new() -> None:
    task: list[Recorded] = []
    place(task, Recorded("granted", number=6, allocation_id="a", grants=True))
    first = Recorded("running", allocation_id="a")
    assert not repeats(task, first)
    place(task, first)
    assert repeats(task, Recorded("running-again", allocation_id="a"))
    assert not repeats(task, Recorded("other-allocation", allocation_id="b"))
    assert not repeats(task, Recorded("no-allocation"))
    again = Candidate("running-again", 13, repeat=True)
    assert verdict(Told(), again, releasing=False) is Superseded.REPEAT


def test_an_sla_breach_is_told_while_the_task_runs_and_dropped_once_it_ended() -> None:
    breach = Candidate("underutilized", 21, while_running=True)
    assert verdict(Told(released=21), breach, releasing=True) is None
    # Placed before the end (right after its grant), it still is not told once the end is.
    assert verdict(Told(END), breach, releasing=False) is Superseded.ENDED
    assert verdict(Told(END, released=21), breach, releasing=True) is Superseded.ENDED
    # An ordinary notice placed there goes before the end.
    assert verdict(Told(END), Candidate("running", 21), releasing=True) is None


def test_an_sla_breach_is_no_repeat_of_the_running_report_about_its_allocation() -> None:
    running = Recorded("running", allocation_id="a-1", event_type="TaskStatusReported")
    breach = Recorded("breach", allocation_id="a-1", event_type="TaskUnderutilized")
    assert not repeats([running], breach)
    assert repeats([running, breach], replace(breach, event_id="breach-again"))


def test_a_webhook_that_does_not_say_its_attempt_is_told_the_one_before_it() -> None:
    said = [(20, 1), (24, 1), (36, 2), (40, 2)]  # pending 1, grant 1, pending 2, grant 2
    assert attempt_before(said, 25) == 1  # the first grant's running
    assert attempt_before(said, 41) == 2  # the second's
    assert attempt_before(said, 20) is None  # nothing before it says
    body = webhook_body(status("t", TaskStatus.RUNNING))
    told = webhook_body(status("t", TaskStatus.RUNNING)).model_validate_json(
        with_attempt(body.encode().decode(), 2)
    )
    assert told.attempt == 2
    assert told.model_copy(update={"attempt": None}) == body


def test_terminal_bodies_end_the_task_and_a_duplicate_submission_is_outside_it() -> None:
    assert ends_task(webhook_body(ended("t")))
    assert ends_task(webhook_body(rejected("t")))
    duplicate = webhook_body(rejected("t", duplicate=True))
    assert not ends_task(duplicate)
    assert not in_lifecycle(duplicate)
    assert not ends_task(webhook_body(pending("t")))
    assert not ends_task(webhook_body(status("t", TaskStatus.RUNNING)))


def test_an_end_that_arrives_unnumbered_goes_strictly_after_everything_recorded() -> None:
    task: list[Recorded] = []
    place(task, Recorded("running", allocation_id="gone"))  # an odd top: position 1
    later, _ = place(task, Recorded("another"))
    end, _ = place(task, Recorded("rejected", ends=True))
    assert later.position == 1  # level with the earlier arrival: after it by arrival
    assert end.position == 3


# The delivery log as a model: one endpoint, an always-answering receiver ----------------


@dataclass(frozen=True)
class Arrival:
    """One message the callback consumes: its place in the chain and what it tells."""

    order: Recorded
    status: str  # the webhook's status; "" for a link with no webhook (allocation.released)
    ends: bool = False
    lifecycle: bool = True
    attempt: int | None = None  # the attempt the event says, if it says


@dataclass
class Delivery:
    id: int
    event_id: str
    status: str
    position: int
    ends: bool
    lifecycle: bool
    held_until: float | None
    state: str = "pending"
    released: bool = False
    attempt: int | None = None  # as told


@dataclass
class Queue:
    """What `DeliveryLog.enqueue_many` and `claim_due` do for one task and one endpoint."""

    wait: float
    events: list[Recorded] = field(default_factory=list)
    deliveries: list[Delivery] = field(default_factory=list)
    end: End | None = None
    seen: set[str] = field(default_factory=set)
    sent: list[Delivery] = field(default_factory=list)
    superseded: list[tuple[str, Superseded]] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=dict)  # what each event says

    def record(self, arrival: Arrival, now: float) -> None:
        event_id = arrival.order.event_id
        if event_id in self.seen:  # a redelivery: the inbox has it
            return
        self.seen.add(event_id)
        if arrival.attempt is not None:
            self.attempts[event_id] = arrival.attempt
        order = replace(arrival.order, ends=arrival.ends)
        repeat = repeats(self.events, order)
        placed, moved = place(self.events, order)
        for delivery in self.deliveries:
            if delivery.event_id in moved and delivery.state == "pending":
                delivery.position = moved[delivery.event_id].position
                if not moved[delivery.event_id].waiting:
                    delivery.held_until = None
        if not arrival.status:
            return
        candidate = Candidate(
            event_id,
            placed.position,
            arrival.ends,
            placed=not (placed.reports and placed.waiting),
            repeat=repeat,
        )
        if arrival.lifecycle:
            self.end = end_after(self.end, candidate)
        waits = placed.waiting and arrival.lifecycle
        delivery = Delivery(
            len(self.deliveries),
            event_id,
            arrival.status,
            placed.position,
            arrival.ends,
            arrival.lifecycle,
            now + self.wait if waits else None,
            attempt=arrival.attempt,
        )
        if arrival.lifecycle:
            why = verdict(Told(self.end, self._released()), candidate, releasing=False)
            if why is not None:
                delivery.state = "superseded"
                self.superseded.append((event_id, why))
        self.deliveries.append(delivery)

    def _released(self) -> int | None:
        return max(
            (d.position for d in self.deliveries if d.released and d.lifecycle), default=None
        )

    def _due(self, now: float) -> list[Delivery]:
        pending = [d for d in self.deliveries if d.state == "pending"]
        return [
            d
            for d in pending
            if (d.held_until is None or d.held_until <= now)
            and not any(
                e.lifecycle == d.lifecycle and (e.position, e.id) < (d.position, d.id)
                for e in pending
            )
        ]

    def dispatch(self, now: float) -> None:
        """The delivery loop at `now`: release every due head until none is left."""
        while due := self._due(now):
            for delivery in due:
                self._release(delivery)

    def _release(self, delivery: Delivery) -> None:
        if delivery.lifecycle:
            event = next(e for e in self.events if e.event_id == delivery.event_id)
            candidate = Candidate(
                delivery.event_id,
                delivery.position,
                delivery.ends,
                placed=not (event.reports and event.waiting),
            )
            why = verdict(Told(self.end, self._released()), candidate, releasing=True)
            if why is not None:
                delivery.state = "superseded"
                self.superseded.append((delivery.event_id, why))
                return
        delivery.released = True
        delivery.state = "delivered"
        if delivery.attempt is None and delivery.lifecycle:
            said = [
                (e.position, self.attempts[e.event_id])
                for e in self.events
                if e.event_id in self.attempts
            ]
            delivery.attempt = attempt_before(said, delivery.position)
        self.sent.append(delivery)


@st.composite
def lifecycles(draw: st.DrawFn) -> list[Arrival]:
    """One task's events as the scheduler numbers them (gaps: other tasks' numbers; now and
    then a restart that forgets the previous), the nodes' running reports, and extras: a
    refused duplicate submission, a second terminal from a confused producer."""
    numbers = itertools.count(draw(st.integers(1, 50)))
    last: list[int | None] = [None]
    made: list[Arrival] = []

    def numbered(name: str, status: str, attempt: int | None = None, **fields: object) -> None:
        for _ in range(draw(st.integers(0, 2))):
            next(numbers)  # other tasks' events in between
        number = next(numbers)
        previous = None if draw(st.integers(0, 9)) == 0 else last[0]  # a scheduler restart
        last[0] = number
        order = Recorded(name, number=number, previous=previous, **fields)  # type: ignore[arg-type]
        ends = status in ("succeeded", "failed", "cancelled", "rejected")
        made.append(Arrival(order, status, ends=ends, attempt=attempt))

    numbered("pending-1", "pending", attempt=1)
    if draw(st.booleans()):
        numbered("escalated-1", "pending")
    if draw(st.integers(0, 4)) == 0:
        numbered("rejected", "rejected")
    else:
        attempts = draw(st.integers(1, 3))
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                numbered(f"pending-{attempt}", "pending", attempt=attempt)
            alloc = f"a{attempt}"
            numbered(f"granted-{attempt}", "scheduled", attempt, allocation_id=alloc, grants=True)
            for again in range(draw(st.integers(0, 2))):  # a node may say it twice
                name = f"running-{attempt}-{again}"
                made.append(Arrival(Recorded(name, allocation_id=alloc), "running"))
            if attempt < attempts:
                numbered(f"preempted-{attempt}", "preempted")
            numbered(f"released-{attempt}", "")  # a link, no webhook
        final = draw(st.sampled_from(["succeeded", "failed", "cancelled"]))
        numbered("ended", final, attempt=attempts)
    if draw(st.booleans()):  # a resubmission of the id, refused: outside the lifecycle
        order = Recorded("duplicate", number=next(numbers), previous=None)
        made.append(Arrival(order, "rejected", lifecycle=False))
    if draw(st.integers(0, 3)) == 0:  # a second terminal under another id
        made.append(Arrival(Recorded("second-end"), "failed", ends=True))
    return made


@st.composite
def schedules(draw: st.DrawFn) -> tuple[list[Arrival], list[tuple[float, bool]]]:
    """The arrivals in any order, some redelivered, each at a time after the last (lags up to
    three order waits), with or without a pass of the delivery loop just before it."""
    events = draw(lifecycles())
    redelivered = draw(st.lists(st.sampled_from(events), max_size=3))
    arrivals = draw(st.permutations([*events, *redelivered]))
    gaps = draw(st.lists(st.floats(0, 3.0), min_size=len(arrivals), max_size=len(arrivals)))
    loops = draw(st.lists(st.booleans(), min_size=len(arrivals), max_size=len(arrivals)))
    times = list(itertools.accumulate(gaps))
    return arrivals, list(zip(times, loops, strict=True))


WAIT = 1.0


@settings(max_examples=400, deadline=None)
@given(schedules())
def test_whatever_the_order_and_lag_alldata_hears_one_end_and_nothing_out_of_order(
    schedule: tuple[list[Arrival], list[tuple[float, bool]]],
) -> None:
    arrivals, moments = schedule
    queue = Queue(WAIT)
    for arrival, (now, loop) in zip(arrivals, moments, strict=True):
        if loop:
            queue.dispatch(now)
        queue.record(arrival, now)
    queue.dispatch(float("inf"))  # every wait runs out in the end

    told = [d for d in queue.sent if d.lifecycle]
    positions = [d.position for d in told]
    assert positions == sorted(positions), [(d.event_id, d.position) for d in told]
    ends = [d for d in told if d.ends]
    assert len(ends) == (1 if any(a.ends and a.lifecycle for a in arrivals) else 0)
    assert not ends or told[-1] is ends[0]  # nothing after the end
    sent_ids = [d.event_id for d in queue.sent]
    assert len(sent_ids) == len(set(sent_ids))  # each event once
    statuses = [d.status for d in told]
    assert len(statuses) == len(set(zip(statuses, positions, strict=True)))  # no repeat
    # Each told the attempt it belongs to: never going back, a node's running its grant's.
    attempts = [d.attempt for d in told if d.attempt is not None]
    assert attempts == sorted(attempts)
    for d in told:
        if d.status == "running":
            assert d.attempt == int(d.event_id.split("-")[1]), (d.event_id, d.attempt)
    # A refused duplicate submission is always delivered, whatever happened to the task.
    assert ("duplicate" in sent_ids) == any(not a.lifecycle for a in arrivals)
    # Nothing is dropped silently: every webhook is sent or superseded with a reason.
    webhooks = {a.order.event_id for a in arrivals if a.status}
    assert webhooks == set(sent_ids) | {event_id for event_id, _ in queue.superseded}


def test_in_publish_order_with_no_lag_every_notice_is_told() -> None:
    """The common case loses nothing: each stream in order, the loop running in between."""
    queue = Queue(WAIT)
    arrivals = [
        Arrival(Recorded("pending", number=10), "pending"),
        Arrival(
            Recorded("granted", number=12, previous=10, allocation_id="a", grants=True), "scheduled"
        ),
        Arrival(Recorded("running", allocation_id="a"), "running"),
        Arrival(Recorded("released", number=14, previous=12), ""),
        Arrival(Recorded("ended", number=16, previous=14), "succeeded", ends=True),
    ]
    for n, arrival in enumerate(arrivals):
        queue.dispatch(float(n))
        queue.record(arrival, float(n))
    queue.dispatch(float("inf"))
    assert [d.status for d in queue.sent] == ["pending", "scheduled", "running", "succeeded"]
    assert queue.superseded == []


def test_a_pending_that_lags_past_the_wait_is_superseded_not_sent_late() -> None:
    queue = Queue(WAIT)
    queue.record(Arrival(Recorded("granted", number=12, previous=10), "scheduled"), 0.0)
    queue.dispatch(2.0)  # the wait ran out: scheduled goes without its pending
    queue.record(Arrival(Recorded("pending", number=10), "pending"), 3.0)
    queue.dispatch(3.0)
    assert [d.status for d in queue.sent] == ["scheduled"]
    assert queue.superseded == [("pending", Superseded.OUT_OF_ORDER)]


def test_a_running_whose_grant_lags_past_the_wait_is_superseded() -> None:
    queue = Queue(WAIT)
    queue.record(Arrival(Recorded("pending", number=10), "pending"), 0.0)
    queue.record(Arrival(Recorded("running", allocation_id="a"), "running"), 0.0)
    queue.dispatch(2.0)
    queue.record(
        Arrival(
            Recorded("granted", number=12, previous=10, allocation_id="a", grants=True), "scheduled"
        ),
        3.0,
    )
    queue.dispatch(3.0)
    assert [d.status for d in queue.sent] == ["pending", "scheduled"]
    assert queue.superseded == [("running", Superseded.NO_GRANT)]
