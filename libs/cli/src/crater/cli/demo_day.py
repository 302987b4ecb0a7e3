"""`crater up --scenario shared-day`: a day of inference and training on one cluster, made
short enough to watch. The inference pool lends its idle cards (examples/pools-lending.yaml);
the demo plays the inference service's traffic, which follows a day (quiet at night, a peak
in the afternoon), and reports each replica's latencies and GPU memory pressure as a real
replica would, so the autoscaler scales the fleet in at night and out by day; training work
streams in all day, fills its own pool and borrows what inference lends, and is preempted
(with its grace) when inference takes its cards back in the morning.

The pure parts live here (the day's load, what a replica reports under it, the clock); the
demo (demo.py) wires them to the bus."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

DAY_SECONDS = 480.0  # a day in 8 minutes
START_HOUR = 20.0  # the demo starts in the evening: first the night, then the morning peak
NIGHT_LOAD = 0.5  # replicas' worth of GPU memory in use at 04:00
PEAK_LOAD = 8.8  # ...at 15:00 (the demand strategy sizes for 0.8 of each: 11 replicas,
# more than the cards inference keeps idle: the rest it takes back from training)
PEAK_HOUR = 15.0
QUIET_HOUR = 4.0
BASE_LATENCY_MS = 60.0  # a replica's p50 with room to spare
SAMPLES_PER_LOAD = 40  # requests a second per replica's worth of load


def hour_of_day(elapsed: float, day_seconds: float = DAY_SECONDS) -> float:
    """The demo's clock: 0 <= hour < 24, starting at START_HOUR."""
    return (START_HOUR + 24.0 * elapsed / day_seconds) % 24.0


def clock(hour: float) -> str:
    minutes = int(hour * 60) % (24 * 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def part_of_day(hour: float) -> str:
    if 6 <= hour < 12:
        return "morning"
    if 12 <= hour < 18:
        return "afternoon"
    if 18 <= hour < 22:
        return "evening"
    return "night"


def load_at(hour: float) -> float:
    """The service's load in replicas' worth of GPU memory: a cosine from the quiet hour to
    the peak and back, rising over 11 hours and falling over 13 (traffic ramps up faster in
    the morning than it fades at night)."""
    rise = (PEAK_HOUR - QUIET_HOUR) % 24
    since_quiet = (hour - QUIET_HOUR) % 24
    # 0 at the quiet hour, 1 at the peak, back to 0 at the next quiet hour
    falling = (since_quiet - rise) / (24 - rise)
    phase = since_quiet / rise if since_quiet <= rise else 1 - falling
    level = (1 - math.cos(math.pi * phase)) / 2
    return NIGHT_LOAD + (PEAK_LOAD - NIGHT_LOAD) * level


@dataclass(frozen=True)
class ReplicaReport:
    pressure: float  # the replica's GPU memory in use, 0..1 of its card
    latencies_ms: list[float]


def replica_report(load: float, replicas: int, rng: random.Random) -> ReplicaReport:
    """What one of `replicas` replicas sharing `load` reports for a second: its share of the
    KV cache as memory pressure (full at 1.0), and latencies that grow as it fills (larger
    batches) and climb steeply once requests queue behind a full cache."""
    share = load / max(replicas, 1)
    pressure = min(share, 1.0)
    slowdown = 1 + 1.5 * min(share, 1.0) ** 2 + 8 * max(share - 1.0, 0.0)
    median = BASE_LATENCY_MS * slowdown
    count = max(1, round(SAMPLES_PER_LOAD * min(share, 1.0)))
    latencies = [max(rng.lognormvariate(math.log(median), 0.25), 1.0) for _ in range(count)]
    return ReplicaReport(round(pressure, 3), latencies)
