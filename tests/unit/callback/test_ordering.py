"""Order per task across subjects and streams: the pure placement rule."""

from __future__ import annotations

from dataclasses import replace

from crater.callback.domain.ordering import Placement, Recorded, arrange, arrival


def record(events: list[Recorded], new: Recorded) -> list[Recorded]:
    """What the delivery log does on each arrival: place it, move the waiting ones."""
    placed = arrival(new, events)
    everything = [*events, placed]
    placements = arrange(everything)
    return [
        replace(e, position=placements[e.event_id].position, waiting=placements[e.event_id].waiting)
        if e.event_id in placements
        else e
        for e in everything
    ]


def order(events: list[Recorded]) -> list[str]:
    return [e.event_id for e in sorted(events, key=lambda e: e.position)]


def test_a_first_event_goes_free_at_its_number() -> None:
    [pending] = record([], Recorded("pending", number=10))
    assert (pending.position, pending.waiting) == (20, False)


def test_an_event_waits_for_its_predecessor_and_then_goes_after_it() -> None:
    events = record([], Recorded("granted", number=12, previous=10))
    assert events[0].waiting  # pending (10) was published first but is still on its way
    events = record(events, Recorded("pending", number=10))
    assert not any(e.waiting for e in events)
    assert order(events) == ["pending", "granted"]


def test_a_whole_chain_must_be_there_not_only_the_last_link() -> None:
    events = record([], Recorded("released", number=30, previous=20))
    events = record(events, Recorded("preempted", number=20, previous=12))
    assert all(e.waiting for e in events)  # granted (12) is missing under both
    events = record(events, Recorded("granted", number=12))
    assert not any(e.waiting for e in events)
    assert order(events) == ["granted", "preempted", "released"]


def test_a_nodes_report_goes_right_after_its_allocations_grant() -> None:
    events = record([], Recorded("running", allocation_id="alloc-1"))
    assert events[0].waiting  # the grant is on the other stream, not here yet
    events = record(events, Recorded("released", number=30, previous=12))
    events = record(events, Recorded("granted", number=12, allocation_id="alloc-1", grants=True))
    assert not any(e.waiting for e in events)
    assert order(events) == ["granted", "running", "released"]


def test_events_of_other_producers_go_after_everything_recorded() -> None:
    events = record([], Recorded("granted", number=12, allocation_id="a", grants=True))
    events = record(events, Recorded("cancelled-by-alldata"))
    assert not events[-1].waiting
    events = record(events, Recorded("released", number=14, previous=12))
    assert order(events) == ["granted", "cancelled-by-alldata", "released"]


def test_settled_events_never_move() -> None:
    events = record([], Recorded("pending", number=10))
    assert arrange(events) == {}
    # still waiting where it already is: nothing to change
    assert arrange([Recorded("x", number=3, previous=1, position=6, waiting=True)]) == {}
    assert arrange([Recorded("x", number=3, position=0, waiting=True)]) == {
        "x": Placement(6, False)
    }


def test_a_report_that_arrives_after_the_release_still_goes_before_it() -> None:
    events = record([], Recorded("released", number=30, previous=12))
    events = record(events, Recorded("succeeded", allocation_id="alloc-1"))
    events = record(events, Recorded("granted", number=12, allocation_id="alloc-1", grants=True))
    assert order(events) == ["granted", "succeeded", "released"]


def test_every_numbered_event_reaches_the_callback() -> None:
    """A numbered event the callback never consumes would hold its task's next one for the
    whole order wait: each must be on a stream the callback reads."""
    from crater.callback.app import LIFECYCLE_CHANNELS, NUMBERED_ELSEWHERE
    from crater.contracts import Subjects, TaskEvent

    numbered = {c.subject for c in Subjects.ALL if issubclass(c.event, TaskEvent)}
    assert numbered <= set(LIFECYCLE_CHANNELS) | set(NUMBERED_ELSEWHERE)
    assert numbered  # granted, released, pending, rejected, preempted
