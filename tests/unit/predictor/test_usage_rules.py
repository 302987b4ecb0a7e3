"""domain/usage.py's rules: exact sums whatever the grouping and the slicing into hours,
shares of cards, idle from measured utilisation, prices by GPU model."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from crater.predictor.domain.usage import Prices, UsageRecord, usage

T0 = datetime(2026, 11, 30, 10, tzinfo=UTC)


def record(i: int, start_us: int, end_us: int | None, **kw: object) -> UsageRecord:
    values: dict[str, object] = {
        "allocation_id": f"a{i}",
        "task_id": f"t{i}",
        "tenant": "t-a" if i % 2 else "t-b",
        "pool": "p",
        "gpu_model": "NVIDIA H100 80GB HBM3",
        "gpus": 2,
        "gpu_milli": 1000,
        "gpu_memory_mb": 1024,
        "cpu_cores": 4,
        "memory_mb": 2048,
        "granted_at": T0 + timedelta(microseconds=start_us),
        "released_at": None if end_us is None else T0 + timedelta(microseconds=end_us),
    }
    values.update(kw)
    return UsageRecord(**values)  # type: ignore[arg-type]


def test_hours_add_up_to_the_period_even_with_sub_millisecond_times() -> None:
    records = [
        record(1, 1_234_567, 7_300_000_999),  # across two hour boundaries
        record(2, -5_000_000_500, 100_000_001),  # granted before the period
        record(3, 3_000_000_700, None, gpu_milli=250, gpus=1),  # still held: to `until`
    ]
    until = T0 + timedelta(hours=3)
    whole = usage(records, T0, until)
    hourly = usage(records, T0, until, hourly=True)
    assert sum(x.gpu_seconds for x in hourly.lines) == whole.total.gpu_seconds
    assert sum(x.gpu_seconds for x in whole.lines) == whole.total.gpu_seconds
    assert hourly.total.gpu_seconds == whole.total.gpu_seconds
    assert {x.hour for x in hourly.lines} == {T0 + timedelta(hours=h) for h in range(3)}
    # record 3: a quarter of one card from 3000.000 s (its .0007 ms dropped) to 3 h
    three = usage([records[2]], T0, until, by="task")
    assert three.total.gpu_seconds == Decimal("7800") / 4
    assert three.total.unmeasured_gpu_seconds == three.total.gpu_seconds


def test_idle_and_prices() -> None:
    busy = record(1, 0, 3_600_000_000, sampled_seconds=100.0, busy_seconds=80.0)
    answer = usage(
        [busy],
        T0,
        T0 + timedelta(hours=1),
        prices=Prices(gpu_hour={"H100": Decimal(4), "H": Decimal(1)}, cpu_core_hour=Decimal(1)),
    )
    line = answer.total
    assert line.gpu_seconds == 7200
    assert line.idle_gpu_seconds == Decimal(1440)  # 20% of 2 GPU-hours
    assert line.unmeasured_gpu_seconds == 0
    assert line.cost == Decimal(8 + 4)  # the longest matching key: H100 at 4/h, 4 cores at 1/h
