"""Request-arrival traces: CSV `timestamp_s,input_tokens,output_tokens`, and a generator of
synthetic diurnal traces with bursts (seeded, so the same seed gives the same trace)."""

from __future__ import annotations

import csv
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

HEADER = ("timestamp_s", "input_tokens", "output_tokens")


@dataclass(frozen=True, slots=True)
class Request:
    at: float
    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class TraceShape:
    """A day compressed into `day_hours` (default: the trace's length): the rate swings from
    `trough_rps` at the start to `peak_rps` half a day later and back. Bursts arrive as a
    Poisson process (`bursts_per_hour`), each multiplying the rate by `burst_factor` (2.5-5x)
    for `burst_seconds` (30-120 s), both drawn uniformly."""

    hours: float = 4.0
    day_hours: float | None = None
    trough_rps: float = 4.0
    peak_rps: float = 40.0
    bursts_per_hour: float = 1.5
    burst_factor: tuple[float, float] = (2.5, 5.0)
    burst_seconds: tuple[float, float] = (30.0, 120.0)
    input_median: float = 300.0
    input_sigma: float = 0.7
    output_median: float = 120.0
    output_sigma: float = 0.7


@dataclass(frozen=True)
class TokenLengths:
    """Lognormal prompt and output lengths: medians in tokens, sigmas of their logs."""

    input_median: float
    input_sigma: float
    output_median: float
    output_sigma: float


# Heavy-tailed lengths after the two services of the Azure LLM inference trace 2023
# (Splitwise, Patel et al., ISCA 2024): coding, prompts of median 1,500 tokens with short
# outputs (median 13); conversation, prompts of median 1,020 with longer outputs (median
# 129). A sigma of 0.8 gives the prompts means of ~2,070 and ~1,400 tokens, the averages
# production traces of both kinds show; "short" is the generator's original mix.
TOKEN_PROFILES: dict[str, TokenLengths] = {
    "short": TokenLengths(300.0, 0.7, 120.0, 0.7),
    "conversation": TokenLengths(1_020.0, 0.8, 129.0, 0.9),
    "coding": TokenLengths(1_500.0, 0.8, 13.0, 1.0),
}


def with_tokens(shape: TraceShape, profile: str) -> TraceShape:
    """`shape` with the prompt and output lengths of a named profile (`TOKEN_PROFILES`)."""
    lengths = TOKEN_PROFILES.get(profile)
    if lengths is None:
        raise ValueError(f"token profile {profile!r} unknown: one of {', '.join(TOKEN_PROFILES)}")
    return replace(
        shape,
        input_median=lengths.input_median,
        input_sigma=lengths.input_sigma,
        output_median=lengths.output_median,
        output_sigma=lengths.output_sigma,
    )


def _bursts(
    shape: TraceShape, rng: random.Random, duration: float
) -> list[tuple[float, float, float]]:
    bursts: list[tuple[float, float, float]] = []
    at = 0.0
    while shape.bursts_per_hour > 0:
        at += rng.expovariate(shape.bursts_per_hour / 3600)
        if at >= duration:
            break
        length = rng.uniform(*shape.burst_seconds)
        bursts.append((at, at + length, rng.uniform(*shape.burst_factor)))
    return bursts


def generate_trace(shape: TraceShape, seed: int) -> list[Request]:
    """Arrivals of a non-homogeneous Poisson process (by thinning), tokens lognormal."""
    rng = random.Random(seed)
    duration = shape.hours * 3600
    day = (shape.day_hours or shape.hours) * 3600
    bursts = _bursts(shape, rng, duration)
    top = shape.peak_rps * max([1.0, *(m for _, _, m in bursts)])

    def rate(t: float) -> float:
        base = (
            shape.trough_rps
            + (shape.peak_rps - shape.trough_rps) * (1 - math.cos(2 * math.pi * t / day)) / 2
        )
        for start, end, factor in bursts:
            if start <= t < end:
                return base * factor
        return base

    requests: list[Request] = []
    t = 0.0
    while True:
        t += rng.expovariate(top)
        if t >= duration:
            return requests
        if rng.random() * top > rate(t):
            continue
        tokens_in = round(rng.lognormvariate(math.log(shape.input_median), shape.input_sigma))
        tokens_out = round(rng.lognormvariate(math.log(shape.output_median), shape.output_sigma))
        requests.append(
            Request(round(t, 4), min(8192, max(8, tokens_in)), min(2048, max(1, tokens_out)))
        )


def write_trace(requests: Iterable[Request], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(HEADER)
        for r in requests:
            writer.writerow((f"{r.at:.4f}", r.input_tokens, r.output_tokens))


def read_trace(path: Path) -> list[Request]:
    """Read a trace; the header row is optional, rows are sorted by time."""
    requests: list[Request] = []
    with path.open(newline="") as f:
        for line, row in enumerate(csv.reader(f), start=1):
            if not row or row[0].strip().startswith("#"):
                continue
            if line == 1 and row[0].strip() == HEADER[0]:
                continue
            try:
                at, tokens_in, tokens_out = float(row[0]), int(row[1]), int(row[2])
            except (ValueError, IndexError) as error:
                raise ValueError(
                    f"{path}:{line}: want timestamp_s,input_tokens,output_tokens: {row}"
                ) from error
            if at < 0 or tokens_in < 0 or tokens_out < 0:
                raise ValueError(f"{path}:{line}: negative value: {row}")
            requests.append(Request(at, tokens_in, tokens_out))
    requests.sort(key=lambda r: r.at)
    return requests
