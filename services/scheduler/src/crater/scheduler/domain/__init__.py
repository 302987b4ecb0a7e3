"""The scheduling core: pure and deterministic. No clock, no I/O, no unseeded randomness:
`Scheduler.handle(event) -> decisions`, so replaying the event log reproduces every decision."""
