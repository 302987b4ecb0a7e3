"""The scheduler's throughput end to end over a real nats-server: the harness `crater bench`
runs (its options are the command's; `run` takes them as a `BenchConfig`).

One run: a nats-server from the wheel; the raw JetStream publish-and-consume rate measured
against it (the ceiling); the scheduler service as its own process on SQLite (or a given
PostgreSQL URL); N simulated nodes from the probe's fleet generator, published as
NodeTopologyReported; then tasks at rising rates, each timed from its publish to the
AllocationGranted that places it, and completed at once (TaskStatusReported succeeded) so the
cluster stays busy but never fills. `--path scheduler` publishes what the scheduler consumes
(task.profiled); `--path full` publishes task.submitted and runs the predictor too.

`--path http` runs Crater as `crater up` does (`crater.cli.stack.Stack`: production mode, its
own secrets, the scheduler, predictor, callback and gateway as processes, the reference
webhook receiver recording to webhooks.jsonl), submits each tick's due tasks as one array to
the gateway's POST /api/v1/schedule with the stack's bearer token, and times each task from
its HTTP submit to the receiver's record of its `scheduled` webhook. Every path reports the
CPU per task of each of its processes.

`--deep-queue` adds a stage after the rates: GPU tasks asking twice the fleet's cards, offered
at once, each holding its allocation a while, so most wait in the scheduler's queue and are
placed (retried) as others finish.

Writes benchmarks/results/bench_<path>_<nodes>.json and a PNG beside it.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import os
import platform
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import nats
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import StorageType, StreamConfig
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from crater.cli.stack import Process, Stack, migrate, stop_process, wait_healthy
from crater.contracts import (
    Confidence,
    NodeTopology,
    NodeTopologyReported,
    ResourcePrediction,
    Subjects,
    TaskProfiled,
    TaskRequest,
    TaskStatus,
    TaskStatusReported,
    TaskSubmitted,
)
from crater.probe.domain.health import health_report
from crater.probe.settings import ProbeSettings
from crater.probe.sim.fleet import build_fleet, read_fleet_spec
from crater.runtime.bus import encode, ensure_streams, subject_of
from crater.runtime.nats_server import NatsServer, free_port, start_nats_server

console = Console()
RESULTS = Path("benchmarks/results")
RAW_STREAM, RAW_SUBJECT = "CRATER_BENCH_RAW", "crater.bench.raw"
PUBLISH_WINDOW = 512  # publishes awaiting their JetStream ack at once
PUBLISH_TIMEOUT_SECONDS = 10.0
DECISION_METRIC = "crater_scheduler_decision_seconds"
# The http path: the services `crater up` runs but the probe (the bench reports the fleet),
# and the processes whose CPU is measured (the reference webhook receiver too).
HTTP_SERVICES = ("scheduler", "predictor", "callback", "gateway")
HTTP_PROCESSES = ("gateway", "predictor", "scheduler", "callback", "receiver")
HTTP_BATCH = 500  # tasks in one POST /api/v1/schedule array (the gateway's max_batch_tasks)
HTTP_CONCURRENCY = 8  # array requests in flight at once
# A 500-task array on a loaded machine may take long: a request that times out is counted
# as errors though the gateway may still take its tasks.
HTTP_TIMEOUT_SECONDS = 300.0
HTTP_IDLE_SECONDS = 30.0  # a stage ends when nothing was placed or delivered this long
# --deep-queue: GPU tasks asking this many times each pool's cards, offered at once.
DEEP_QUEUE_FACTOR = 2.0
# `crater run NAME` under cProfile, the profile written on SIGTERM too: uvicorn re-raises the
# signal after its clean shutdown, and `python -m cProfile` would die without writing. Timed
# by the process's CPU clock (not the wall clock, which counts every await as time spent), and
# started by SIGUSR1 when the tasks start: the profile shows the cost of the tasks, not of
# imports or of registering the nodes.
PROFILED = """
import cProfile, signal, sys, time
def stop(*_): raise SystemExit(0)
signal.signal(signal.SIGTERM, stop)
from crater.cli.main import app
profiler = cProfile.Profile(time.process_time)
signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())
try:
    app(["run", sys.argv[1]])
finally:
    profiler.disable()
    profiler.dump_stats(sys.argv[2])
"""
# Task shapes per pool of the demo fleet, each small enough for every node of its pool:
# (gpus, milli of each card, GPU memory MiB per card, cores, host memory MiB).
SHAPES: dict[str, list[tuple[int, int, int, int, int]]] = {
    "training": [(8, 1000, 70000, 64, 500_000), (2, 1000, 40000, 16, 128_000)],
    "inference": [(1, 1000, 12000, 4, 16_000), (1, 500, 6000, 4, 8_000)],
    "default": [(1, 1000, 12000, 8, 32_000), (0, 1000, 0, 8, 16_000)],
}
PREDICTION = ResourcePrediction(
    gpu_memory_per_gpu_mb=0,
    host_memory_mb=0,
    confidence=Confidence.LOW,
    method="benchmark",
    dataloader_num_workers=1,
    dataloader_prefetch_factor=2,
)


# -- workload ---------------------------------------------------------------------------------


def scaled_fleet(nodes: int, seed: int) -> list[NodeTopology]:
    """`nodes` simulated nodes: the probe's demo fleet, every group scaled alike (largest
    remainders), each kept when there are at least as many nodes as groups."""
    spec = read_fleet_spec(None)
    base = sum(group.count for group in spec.nodes)
    shares = [group.count * nodes / base for group in spec.nodes]
    counts = [int(share) for share in shares]
    by_remainder = sorted(range(len(shares)), key=lambda i: counts[i] - shares[i])
    for i in by_remainder[: nodes - sum(counts)]:
        counts[i] += 1
    if nodes >= len(counts):
        while 0 in counts:  # every kind of node, taken from the largest group
            counts[counts.index(max(counts))] -= 1
            counts[counts.index(0)] = 1
    scaled = spec.model_copy(
        update={
            "faults": [],
            "nodes": [
                g.model_copy(update={"count": c})
                for g, c in zip(spec.nodes, counts, strict=True)
                if c
            ],
        }
    )
    return [n.topology for n in build_fleet(scaled, seed).nodes]


def task_request(task_id: str, rng: random.Random, pools: list[str]) -> TaskRequest:
    """A task that fits any node of its pool when that node is free."""
    pool = rng.choice(pools)
    return shaped_request(task_id, pool, rng.choice(SHAPES.get(pool, SHAPES["default"])))


def shaped_request(task_id: str, pool: str, shape: tuple[int, int, int, int, int]) -> TaskRequest:
    gpus, milli, gpu_mb, cores, memory = shape
    return TaskRequest.model_validate(
        {
            "task_id": task_id,
            "task_type": "training" if gpus else "evaluation",
            "model_config": {"name": "bench"},
            "resource_requirements": {
                "gpu": {"count": gpus, "milli": milli, "memory_mb": gpu_mb},
                "cpu": {"cores": cores},
                "memory": {"capacity_mb": memory},
            },
            "pool": pool,
        }
    )


def deep_queue_requests(
    prefix: str, topologies: list[NodeTopology], rng: random.Random, factor: float
) -> list[TaskRequest]:
    """GPU tasks of every pool asking `factor` times the cards the pool has (milli-cards
    counted), shuffled: offered at once, they cannot all fit, so the rest wait in the
    scheduler's queue and are placed (retried) as others finish."""
    cards: dict[str, int] = {}
    for topology in topologies:
        cards[topology.pool] = cards.get(topology.pool, 0) + len(topology.gpus)
    requests: list[TaskRequest] = []
    for pool in sorted(cards):
        shapes = [s for s in SHAPES.get(pool, SHAPES["default"]) if s[0]]
        asked = 0.0
        while cards[pool] and asked < factor * cards[pool]:
            shape = rng.choice(shapes)
            requests.append(shaped_request(f"{prefix}-t{len(requests)}", pool, shape))
            asked += shape[0] * shape[1] / 1000
    rng.shuffle(requests)
    return requests


def task_message(request: TaskRequest, path: str) -> tuple[str, bytes, str]:
    """(subject, body, event id) of the event that hands a task to the bench's entry point."""
    event = (
        TaskProfiled(task=request, prediction=PREDICTION)
        if path == "scheduler"
        else TaskSubmitted.from_request(request)
    )
    return subject_of(event), encode(event), str(event.event_id)


# -- statistics -------------------------------------------------------------------------------


def percentile(sorted_values: list[float], q: float) -> float:
    """The nearest-rank percentile (q in 0..100) of ascending values; nan when empty."""
    if not sorted_values:
        return float("nan")
    rank = max(1, -(-len(sorted_values) * q // 100))
    return sorted_values[int(min(rank, len(sorted_values))) - 1]


Buckets = dict[float, float]  # upper bound (s) -> cumulative count


def histogram_quantile(buckets: Buckets, q: float) -> float:
    """The upper bound of the bucket holding quantile q (0..1): a bound, never an under-
    estimate. nan when the histogram is empty."""
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if bounds else 0.0
    if total <= 0:
        return float("nan")
    for bound in bounds:
        if buckets[bound] >= q * total:
            return bound
    return float("inf")


def bucket_delta(after: Buckets, before: Buckets) -> Buckets:
    return {bound: count - before.get(bound, 0.0) for bound, count in after.items()}


# -- the pieces of a run ----------------------------------------------------------------------


class Publisher:
    """Publishes to JetStream with up to `window` acks outstanding: `send` waits only when the
    window is full (back-pressure), `flush` waits for every ack. Raises on a failed publish."""

    def __init__(self, js: Any, window: int = PUBLISH_WINDOW) -> None:
        self.js = js
        self.window = asyncio.Semaphore(window)
        self.in_flight: set[asyncio.Task[None]] = set()
        self.failures: list[BaseException] = []

    async def send(self, subject: str, body: bytes, event_id: str) -> None:
        if self.failures:
            raise RuntimeError(f"JetStream publish failed: {self.failures[0]!r}")
        await self.window.acquire()
        task = asyncio.create_task(self._one(subject, body, event_id))
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)

    async def _one(self, subject: str, body: bytes, event_id: str) -> None:
        try:
            await self.js.publish(
                subject, body, timeout=PUBLISH_TIMEOUT_SECONDS, headers={"Nats-Msg-Id": event_id}
            )
        except Exception as error:  # raised by the next send or flush
            self.failures.append(error)
        finally:
            self.window.release()

    async def flush(self) -> None:
        await asyncio.gather(*self.in_flight)
        if self.failures:
            raise RuntimeError(f"JetStream publish failed: {self.failures[0]!r}")


class Heartbeats:
    """Every node's heartbeat as its probe sends it (`health_report`: checks passed, no
    inventory), every `interval` seconds from when its topology went out, the nodes spread
    evenly over the interval as independent probes are: the load a fleet of this size puts
    on the scheduler besides the tasks, and what keeps its nodes Ready under the shipped
    heartbeat timeout."""

    def __init__(self, publisher: Publisher, topologies: list[NodeTopology], interval: float):
        self.publisher = publisher
        self.interval = interval
        self.reports = [health_report(t) for t in topologies]
        self.due: list[tuple[float, int]] = []
        self.sent = 0

    def start(self, index: int) -> None:
        """Node `index`'s topology went out: its first heartbeat within one interval."""
        offset = self.interval * index / max(1, len(self.reports))
        heapq.heappush(self.due, (time.monotonic() + offset, index))

    async def run(self) -> None:
        while True:
            now = time.monotonic()
            while self.due and self.due[0][0] <= now:
                at, index = heapq.heappop(self.due)
                beat = self.reports[index].model_copy(
                    update={"event_id": uuid.uuid4(), "occurred_at": datetime.now(UTC)}
                )
                await self.publisher.send(subject_of(beat), encode(beat), str(beat.event_id))
                heapq.heappush(self.due, (at + self.interval, index))
                self.sent += 1
            await asyncio.sleep(0.02)


async def raw_jetstream_rate(nc: Client, count: int, payload_bytes: int, batch: int) -> float:
    """Messages per second through one stream: published with acks (same window as the
    bench's own publishing) while a durable pull consumer fetches and acks them."""
    js = nc.jetstream()
    with contextlib.suppress(Exception):
        await js.delete_stream(RAW_STREAM)
    await js.add_stream(
        StreamConfig(name=RAW_STREAM, subjects=[RAW_SUBJECT], storage=StorageType.FILE)
    )
    subscription = await js.pull_subscribe(RAW_SUBJECT, durable="bench-raw", stream=RAW_STREAM)
    payload = b"x" * payload_bytes
    consumed = 0

    async def consume() -> None:
        nonlocal consumed
        while consumed < count:
            with contextlib.suppress(nats.errors.TimeoutError):
                for msg in await subscription.fetch(batch, timeout=1.0):
                    await msg.ack()
                    consumed += 1

    started = time.perf_counter()
    consumer = asyncio.create_task(consume())
    publisher = Publisher(js)
    for _ in range(count):
        await publisher.send(RAW_SUBJECT, payload, uuid.uuid4().hex)
    await publisher.flush()
    await asyncio.wait_for(consumer, timeout=120)
    elapsed = time.perf_counter() - started
    await subscription.unsubscribe()
    await js.delete_stream(RAW_STREAM)
    return count / elapsed


@dataclass
class Service:
    process: Process
    metrics_url: str


def spawn(name: str, data_dir: Path, env: dict[str, str], profile: bool) -> Service:
    """A service as its own process (as `crater up` runs it), optionally under cProfile."""
    port = free_port()
    log_path = data_dir / f"{name}.log"
    args = [sys.executable, "-m", "crater.cli", "run", name]
    if profile:
        args = [sys.executable, "-c", PROFILED, name, str(data_dir / f"{name}.prof")]
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            args,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env, "CRATER_HTTP_PORT": str(port)},
            start_new_session=True,
        )
    process = Process(name, port, popen, log_path, args)
    wait_healthy(process)
    return Service(process, f"{process.url}/metrics")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process so far (Linux); nan elsewhere. Divided by the
    work done it gives a cost per allocation that other load on the machine does not change."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure_idle(processes: dict[str, Process], seconds: float) -> dict[str, float]:
    """Each process's CPU, in cores, over `seconds` with no task offered (the fleet's
    heartbeats, if any, go on); {} when `seconds` is 0."""
    if seconds <= 0:
        return {}
    before = {n: cpu_seconds(p.popen.pid) for n, p in processes.items()}
    started = time.perf_counter()
    await asyncio.sleep(seconds)
    elapsed = time.perf_counter() - started
    return {n: (cpu_seconds(p.popen.pid) - before[n]) / elapsed for n, p in processes.items()}


def scrape(url: str) -> tuple[Buckets, dict[str, float]]:
    """The decision-time histogram's buckets and the scheduler's gauges, from /metrics."""
    buckets: Buckets = {}
    gauges: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        for sample in family.samples:
            if sample.name == f"{DECISION_METRIC}_bucket":
                buckets[float(sample.labels["le"])] = sample.value
            elif family.type == "gauge" and sample.name.startswith("crater_scheduler_"):
                gauges[sample.name] = sample.value
    return buckets, gauges


@dataclass
class StageResult:
    offered_per_second: float  # a deep-queue stage: offered at once (the count over 1 s)
    submitted: int
    granted: int
    seconds: float  # first submit to last grant
    allocations_per_second: float
    kept_up: bool
    latency_p50_ms: float
    latency_p99_ms: float
    latency_p99_9_ms: float
    latency_max_ms: float
    decision_p50_ms: float
    decision_p99_ms: float
    decision_p99_9_ms: float
    decisions: int
    scheduler_cpu_ms_per_allocation: float  # its CPU time (all threads) over allocations
    # When the stage ended: tasks the core holds waiting, and allocations it holds (granted,
    # not yet released): with tasks not placed, they tell a queue in the core from a backlog
    # on the bus or grants not yet published.
    waiting_in_core: int = 0
    held_in_core: int = 0
    kind: str = "rate"  # or "deep-queue"
    # Each service process's CPU time over the tasks done (placed; on the http path, the
    # `scheduled` webhooks delivered): gateway, predictor, scheduler, callback, receiver.
    cpu_ms_per_task: dict[str, float] = field(default_factory=dict)
    # The same, less what each process spends idle (BenchResult.idle_cpu_percent) over the
    # stage's time: what the tasks themselves cost, without heartbeats and housekeeping.
    cpu_ms_per_task_above_idle: dict[str, float] = field(default_factory=dict)
    # The http path: the gateway's answer to each task (202 accepted; refused by status;
    # errors: tasks of a request that failed or was not answered 207), the `scheduled`
    # webhooks the receiver recorded, their rate over the first submit to the last of them,
    # and the latency from the HTTP submit to the receiver's record of it.
    http_accepted: int = 0
    http_refused: dict[str, int] = field(default_factory=dict)
    http_errors: int = 0
    delivered: int = 0
    delivered_seconds: float = 0.0
    delivered_per_second: float = 0.0
    webhook_latency_p50_ms: float = float("nan")
    webhook_latency_p99_ms: float = float("nan")
    webhook_latency_p99_9_ms: float = float("nan")
    webhook_latency_max_ms: float = float("nan")
    webhooks: dict[str, int] = field(default_factory=dict)  # recorded in the stage, by status


@dataclass
class BenchResult:
    path: str
    nodes: int
    database: str
    consumer_batch: int
    raw_jetstream_per_second: float
    # Each node's heartbeat interval (0: none were sent) and the heartbeats sent in all.
    heartbeat_seconds: float = 0.0
    heartbeats: int = 0
    scheduler_cpu_ms_per_allocation: float = float("nan")  # of the fastest stage
    stages: list[StageResult] = field(default_factory=list)
    sustained_allocations_per_second: float = 0.0
    ratio_to_raw: float = 0.0
    latency_p50_ms: float = float("nan")
    latency_p99_ms: float = float("nan")
    latency_p99_9_ms: float = float("nan")
    decision_p50_ms: float = float("nan")
    decision_p99_ms: float = float("nan")
    decision_p99_9_ms: float = float("nan")
    topology_seconds: float = 0.0
    # Each process's CPU time while the fleet's topologies were published and taken in.
    topology_cpu_ms_per_node: dict[str, float] = field(default_factory=dict)
    # Each process's CPU, in % of one core, with the fleet known and no task offered (its
    # heartbeats and housekeeping), over idle_seconds; and the fastest stage's CPU per task
    # above it.
    idle_seconds: float = 0.0
    idle_cpu_percent: dict[str, float] = field(default_factory=dict)
    cpu_ms_per_task_above_idle: dict[str, float] = field(default_factory=dict)
    rejected: int = 0
    ungranted: int = 0
    # The fastest stage's CPU per task of each service; on the http path its rate of
    # `scheduled` webhooks delivered, and their latency over every rate stage.
    cpu_ms_per_task: dict[str, float] = field(default_factory=dict)
    sustained_delivered_per_second: float = 0.0
    webhook_latency_p50_ms: float = float("nan")
    webhook_latency_p99_ms: float = float("nan")
    webhook_latency_p99_9_ms: float = float("nan")
    undelivered: int = 0
    deep_queue: StageResult | None = None  # --deep-queue: its stage, apart from the rates
    load_average: list[float] = field(default_factory=list)  # 1-minute, at start and at end
    machine: str = ""
    finished_at: str = ""


class Tracker:
    """Submit times, grant times, and completion of each granted task (so it frees its node),
    at once or, for a task in `hold`, that many seconds after its grant."""

    def __init__(self, js: Any) -> None:
        self.js = js
        # Task ids unique to the run: a reused database already holds earlier runs' tasks.
        self.run = uuid.uuid4().hex[:8]
        self.submitted: dict[str, float] = {}  # perf_counter when sent
        self.sent_wall: dict[str, float] = {}  # time.time() when sent (to meet the receiver's)
        self.latencies: dict[str, float] = {}
        self.hold: dict[str, float] = {}
        self.last_grant = 0.0
        self.rejected = 0
        self.releases: set[asyncio.Task[None]] = set()
        self.release_window = asyncio.Semaphore(PUBLISH_WINDOW)
        self.release_failures = 0

    def stamp(self, task_id: str) -> None:
        """`task_id` is being sent now."""
        self.submitted[task_id] = time.perf_counter()
        self.sent_wall[task_id] = time.time()

    async def on_granted(self, msg: Msg) -> None:
        now = time.perf_counter()
        event = json.loads(msg.data)
        task_id = event["task_id"]
        submitted = self.submitted.get(task_id)
        if submitted is None or task_id in self.latencies:
            return
        self.latencies[task_id] = now - submitted
        self.last_grant = now
        done = TaskStatusReported(
            task_id=task_id, status=TaskStatus.SUCCEEDED, allocation_id=event["allocation_id"]
        )
        task = asyncio.create_task(self._release(done, self.hold.get(task_id, 0.0)))
        self.releases.add(task)
        task.add_done_callback(self.releases.discard)

    async def _release(self, done: TaskStatusReported, hold: float) -> None:
        if hold > 0:
            await asyncio.sleep(hold)
        async with self.release_window:
            try:
                await self.js.publish(
                    subject_of(done),
                    encode(done),
                    timeout=PUBLISH_TIMEOUT_SECONDS,
                    headers={"Nats-Msg-Id": str(done.event_id)},
                )
            except Exception:  # counted in release_failures
                self.release_failures += 1

    async def on_rejected(self, msg: Msg) -> None:
        self.rejected += 1


class BusEntry:
    """The scheduler and full paths' entry: each task's event published to JetStream."""

    def __init__(self, publisher: Publisher, path: str) -> None:
        self.publisher = publisher
        self.path = path

    def prepare(self, request: TaskRequest) -> Any:
        return task_message(request, self.path)

    async def offer(self, batch: list[tuple[str, Any]], stamp: Callable[[str], None]) -> None:
        for task_id, message in batch:
            stamp(task_id)
            await self.publisher.send(*message)

    async def flush(self) -> None:
        await self.publisher.flush()


class HttpEntry:
    """The http path's entry: the tasks offered at once (a tick's due ones) POSTed as one
    array to the gateway's /api/v1/schedule (split at HTTP_BATCH), up to `concurrency`
    requests in flight: when all are, the next tasks wait for one to end, so the next array
    is longer. Counts each element's answer: 202 accepted, another status refused (by
    status), and the tasks of a request that failed or was not answered 207 (errors)."""

    def __init__(self, client: httpx.AsyncClient, concurrency: int = HTTP_CONCURRENCY) -> None:
        self.client = client
        self.slots = asyncio.Semaphore(concurrency)
        self.in_flight: set[asyncio.Task[None]] = set()
        self.accepted = 0
        self.refused: dict[str, int] = {}
        self.errors = 0
        self.problems: list[str] = []  # the first few, to show

    def prepare(self, request: TaskRequest) -> Any:
        return request.model_dump_json(exclude_unset=True).encode()

    async def offer(self, batch: list[tuple[str, Any]], stamp: Callable[[str], None]) -> None:
        for start in range(0, len(batch), HTTP_BATCH):
            await self.slots.acquire()
            task = asyncio.create_task(self._post(batch[start : start + HTTP_BATCH], stamp))
            self.in_flight.add(task)
            task.add_done_callback(self.in_flight.discard)

    async def _post(self, chunk: list[tuple[str, Any]], stamp: Callable[[str], None]) -> None:
        try:
            body = b"[" + b",".join(payload for _, payload in chunk) + b"]"
            for task_id, _ in chunk:
                stamp(task_id)
            response = await self.client.post(
                "/api/v1/schedule", content=body, headers={"content-type": "application/json"}
            )
            if response.status_code != 207:
                self.errors += len(chunk)
                self._problem(f"{response.status_code}: {response.text[:300]}")
                return
            for element in response.json()["results"]:
                if element["status"] == 202:
                    self.accepted += 1
                else:
                    status = str(element["status"])
                    self.refused[status] = self.refused.get(status, 0) + 1
                    self._problem(f"{status}: {json.dumps(element['body'])[:300]}")
        except (httpx.HTTPError, ValueError, KeyError) as error:
            self.errors += len(chunk)
            self._problem(repr(error))
        finally:
            self.slots.release()

    def _problem(self, text: str) -> None:
        if len(self.problems) < 5:
            self.problems.append(text)
            console.print(f"[yellow]  the gateway refused: {text}[/yellow]")

    async def flush(self) -> None:
        await asyncio.gather(*self.in_flight)

    def counts(self) -> tuple[int, dict[str, int], int]:
        return self.accepted, dict(self.refused), self.errors


Entry = BusEntry | HttpEntry


class WebhookTail:
    """The receiver's record file (`crater receiver --record-file`: one JSON line per
    delivery, first ones only, with its `received_at`), read as it grows: when each task's
    `scheduled` webhook was received, and how many webhooks of each status."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.partial = b""
        self.scheduled: dict[str, float] = {}  # task id -> received (epoch seconds)
        self.statuses: dict[str, int] = {}

    def poll(self) -> None:
        try:
            with self.path.open("rb") as file:
                file.seek(self.offset)
                data = file.read()
        except FileNotFoundError:
            return
        self.offset += len(data)
        lines = (self.partial + data).split(b"\n")
        self.partial = lines.pop()  # a line not yet written whole
        for line in lines:
            if not line.strip():
                continue
            record = json.loads(line)
            body = record.get("body") or {}
            status = str(body.get("status"))
            self.statuses[status] = self.statuses.get(status, 0) + 1
            if status == "scheduled":
                received = datetime.fromisoformat(record["received_at"]).timestamp()
                self.scheduled.setdefault(str(body.get("task_id")), received)

    async def follow(self, interval: float = 0.02) -> None:
        while True:
            self.poll()
            await asyncio.sleep(interval)


@dataclass
class Deployment:
    """What a run drives: the scheduler (its metrics) and every process whose CPU is
    measured, by name."""

    scheduler: Service
    processes: dict[str, Process]
    tail: WebhookTail | None = None  # the http path's receiver records
    # Each process's CPU with no task offered, in cores (measure_idle): the stages' baseline.
    idle_cpu: dict[str, float] = field(default_factory=dict)


# -- the run ----------------------------------------------------------------------------------


@dataclass
class BenchConfig:
    nodes: int = 1000
    rates: list[float] = field(default_factory=lambda: [25, 50, 100, 200, 400, 800, 1600])
    stage_seconds: float = 8.0
    path: str = "scheduler"
    database_url: str | None = None
    consumer_batch: int = 64
    raw_messages: int = 20000
    seed: int = 7
    out_dir: Path = RESULTS
    profile: bool = False
    keep_going: bool = False  # run every rate even after the scheduler fell behind
    # After the rates, a stage of GPU tasks asking DEEP_QUEUE_FACTOR times each pool's
    # cards, offered at once, each holding its allocation deep_queue_hold seconds.
    deep_queue: bool = False
    deep_queue_hold: float = 1.0
    # Each node's heartbeat interval: the probe's shipped one; 0 sends none (and gives the
    # scheduler a day's heartbeat timeout instead of the shipped one, said in the output).
    heartbeat_seconds: float = field(
        default_factory=lambda: ProbeSettings().health_interval_seconds
    )
    # Before the stages: each process's CPU with no task offered, over this long (0: not
    # measured), the baseline the stages' CPU per task above idle subtracts.
    idle_seconds: float = 5.0


async def run_stage(
    entry: Entry,
    tracker: Tracker,
    deployment: Deployment,
    requests: list[TaskRequest],
    rate: float | None,
    config: BenchConfig,
    hold: float = 0.0,
) -> StageResult:
    """Offer `requests` at `rate` tasks a second (None: all at once), each completed `hold`
    seconds after its grant; then wait for the backlog to drain."""
    count = len(requests)
    ids = [r.task_id for r in requests]
    payloads = [entry.prepare(r) for r in requests]
    if hold > 0:
        tracker.hold.update(dict.fromkeys(ids, hold))
    tail = deployment.tail
    done = tail.scheduled if tail is not None else tracker.latencies
    scheduler = deployment.scheduler
    before, _ = await asyncio.to_thread(scrape, scheduler.metrics_url)
    cpu_before = {n: cpu_seconds(p.popen.pid) for n, p in deployment.processes.items()}
    cpu_started = time.perf_counter()
    http_before = entry.counts() if isinstance(entry, HttpEntry) else (0, {}, 0)
    webhooks_before = dict(tail.statuses) if tail is not None else {}
    label = f"{rate:g}/s" if rate is not None else "at once"
    started = last_report = time.perf_counter()
    started_wall = time.time()
    sent = 0
    while sent < count:
        due = count if rate is None else min(count, int((time.perf_counter() - started) * rate) + 1)
        if due > sent:
            batch = list(zip(ids[sent:due], payloads[sent:due], strict=True))
            sent = due
            await entry.offer(batch, tracker.stamp)
        if time.perf_counter() - last_report >= 2.0:
            last_report = time.perf_counter()
            _progress(label, sent, count, tracker, ids, tail)
        await asyncio.sleep(0.002)
    await entry.flush()
    # The backlog drains: wait until every task is done, or nothing moved for a while (on
    # the http path, neither a placement nor a delivery: webhooks may trail the grants).
    idle_limit = max(10.0 if tail is None else HTTP_IDLE_SECONDS, config.stage_seconds)
    moved, last_change = (-1, -1), time.perf_counter()
    while True:
        finished = sum(1 for i in ids if i in done)
        now_moved = (finished, sum(1 for i in ids if i in tracker.latencies))
        now = time.perf_counter()
        if now_moved != moved:
            moved, last_change = now_moved, now
        if finished == count or now - last_change > idle_limit:
            break
        if now - last_report >= 2.0:
            last_report = now
            _progress(label, sent, count, tracker, ids, tail)
        await asyncio.sleep(0.05)
    cpu = {n: cpu_seconds(p.popen.pid) - cpu_before[n] for n, p in deployment.processes.items()}
    cpu_wall = time.perf_counter() - cpu_started
    after, gauges = await asyncio.to_thread(scrape, scheduler.metrics_url)
    granted = [i for i in ids if i in tracker.latencies]
    latencies = sorted(tracker.latencies[i] * 1000 for i in granted)
    last = max((tracker.submitted[i] + tracker.latencies[i] for i in granted), default=started)
    seconds = max(last - started, 1e-9)
    achieved = len(granted) / seconds
    decisions = bucket_delta(after, before)
    finished_ids = [i for i in ids if i in done]
    outcome = StageResult(
        offered_per_second=rate if rate is not None else float(count),
        submitted=count,
        granted=len(granted),
        seconds=round(seconds, 3),
        allocations_per_second=round(achieved, 2),
        kept_up=len(granted) == count and (rate is None or achieved >= 0.9 * rate),
        latency_p50_ms=round(percentile(latencies, 50), 2),
        latency_p99_ms=round(percentile(latencies, 99), 2),
        latency_p99_9_ms=round(percentile(latencies, 99.9), 2),
        latency_max_ms=round(latencies[-1], 2) if latencies else float("nan"),
        decision_p50_ms=histogram_quantile(decisions, 0.5) * 1000,
        decision_p99_ms=histogram_quantile(decisions, 0.99) * 1000,
        decision_p99_9_ms=histogram_quantile(decisions, 0.999) * 1000,
        decisions=int(max(decisions.values(), default=0)),
        scheduler_cpu_ms_per_allocation=round(
            cpu.get("scheduler", 0.0) * 1000 / max(len(granted), 1), 3
        ),
        waiting_in_core=int(gauges.get("crater_scheduler_pending_tasks", 0)),
        held_in_core=int(gauges.get("crater_scheduler_active_allocations", 0)),
        kind="rate" if rate is not None else "deep-queue",
        cpu_ms_per_task={n: round(c * 1000 / max(len(finished_ids), 1), 3) for n, c in cpu.items()},
        cpu_ms_per_task_above_idle={
            n: round(
                (c - deployment.idle_cpu.get(n, 0.0) * cpu_wall) * 1000 / max(len(finished_ids), 1),
                3,
            )
            for n, c in cpu.items()
        },
    )
    if isinstance(entry, HttpEntry) and tail is not None:
        accepted, refused, errors = entry.counts()
        outcome.http_accepted = accepted - http_before[0]
        outcome.http_refused = {
            s: n - http_before[1].get(s, 0)
            for s, n in refused.items()
            if n - http_before[1].get(s, 0)
        }
        outcome.http_errors = errors - http_before[2]
        delays = sorted((tail.scheduled[i] - tracker.sent_wall[i]) * 1000 for i in finished_ids)
        last_delivery = max((tail.scheduled[i] for i in finished_ids), default=started_wall)
        delivered_seconds = max(last_delivery - started_wall, 1e-9)
        outcome.delivered = len(finished_ids)
        outcome.delivered_seconds = round(delivered_seconds, 3)
        outcome.delivered_per_second = round(len(finished_ids) / delivered_seconds, 2)
        outcome.kept_up = len(finished_ids) == count and (
            rate is None or outcome.delivered_per_second >= 0.9 * rate
        )
        outcome.webhook_latency_p50_ms = round(percentile(delays, 50), 2)
        outcome.webhook_latency_p99_ms = round(percentile(delays, 99), 2)
        outcome.webhook_latency_p99_9_ms = round(percentile(delays, 99.9), 2)
        outcome.webhook_latency_max_ms = round(delays[-1], 2) if delays else float("nan")
        outcome.webhooks = {
            s: n - webhooks_before.get(s, 0)
            for s, n in tail.statuses.items()
            if n - webhooks_before.get(s, 0)
        }
    return outcome


def _progress(
    label: str,
    sent: int,
    count: int,
    tracker: Tracker,
    ids: list[str],
    tail: WebhookTail | None,
) -> None:
    placed = sum(1 for i in ids if i in tracker.latencies)
    line = f"  {label:>10} offered: {sent}/{count} submitted, {placed} placed"
    if tail is not None:
        line += f", {sum(1 for i in ids if i in tail.scheduled)} scheduled webhooks delivered"
    console.print(line)


def describe_stage(outcome: StageResult) -> str:
    line = (
        f"  {outcome.allocations_per_second:,.0f} allocations/s, submit-to-allocation p50 "
        f"{outcome.latency_p50_ms} ms p99 {outcome.latency_p99_ms} ms, decision p99 <= "
        f"{outcome.decision_p99_ms:g} ms"
    )
    if outcome.kind == "deep-queue" or outcome.delivered:
        line += (
            f"\n  {outcome.delivered_per_second:,.0f} scheduled webhooks/s delivered "
            f"({outcome.delivered}/{outcome.submitted}), submit-to-webhook p50 "
            f"{outcome.webhook_latency_p50_ms} ms p99 {outcome.webhook_latency_p99_ms} ms; "
            f"gateway: {outcome.http_accepted} accepted, refused {outcome.http_refused or 0}, "
            f"{outcome.http_errors} errors; webhooks {outcome.webhooks}"
        )
    cpu = ", ".join(
        f"{n} {v:g}"
        + (
            f" ({above:g} above idle)"
            if (above := outcome.cpu_ms_per_task_above_idle.get(n))
            else ""
        )
        for n, v in outcome.cpu_ms_per_task.items()
    )
    return f"{line}\n  CPU ms per task: {cpu}"


async def publish_fleet(
    publisher: Publisher,
    topologies: list[NodeTopology],
    scheduler: Service,
    heartbeats: Heartbeats | None,
) -> float:
    """Every node's topology (its heartbeats begin with it), then wait until the scheduler
    knows them all; seconds taken."""
    started = time.perf_counter()
    for index, topology in enumerate(topologies):
        event = NodeTopologyReported(node=topology)
        await publisher.send(subject_of(event), encode(event), str(event.event_id))
        if heartbeats is not None:
            heartbeats.start(index)
    await publisher.flush()
    last_report = started
    while True:
        _, gauges = await asyncio.to_thread(scrape, scheduler.metrics_url)
        known = int(gauges.get("crater_scheduler_nodes", 0))
        if known >= len(topologies):
            return time.perf_counter() - started
        if time.perf_counter() - last_report >= 2.0:
            last_report = time.perf_counter()
            console.print(f"  nodes known to the scheduler: {known}/{len(topologies)}")
        if scheduler.process.popen.poll() is not None:
            raise RuntimeError(f"the scheduler exited; see {scheduler.process.log_path}")
        await asyncio.sleep(0.25)


def service_env(config: BenchConfig) -> dict[str, str]:
    """What every path gives its services."""
    env = {"CRATER_LOG_LEVEL": "WARNING", "CRATER_CONSUMER_BATCH": str(config.consumer_batch)}
    if not config.heartbeat_seconds:
        # Heartbeats off (--heartbeat-seconds 0): without this a run longer than the
        # shipped 30 s timeout would see every node turn NotReady and place nothing.
        env["CRATER_SCHEDULER_HEARTBEAT_TIMEOUT_SECONDS"] = "86400"
    return env


def start_stack(config: BenchConfig, data_dir: Path) -> Stack:
    """The http path: the services as `crater up` runs them (`crater.cli.stack`: production
    mode, its own secrets, the gateway requiring the stack's token, the reference receiver
    recording to webhooks.jsonl); no probe: the bench reports the fleet itself."""
    given = {"CRATER_DATABASE_URL": config.database_url} if config.database_url else {}
    stack = Stack(data_dir / "stack", env=given)
    extra = {**given, **service_env(config), "CRATER_GATEWAY_MAX_BATCH_TASKS": str(HTTP_BATCH)}
    try:
        stack.start(HTTP_SERVICES, extra)
    except BaseException:
        stack.stop()
        raise
    return stack


async def bench_async(config: BenchConfig, data_dir: Path) -> BenchResult:
    topologies = scaled_fleet(config.nodes, config.seed)
    pools = sorted({t.pool for t in topologies})
    rng = random.Random(config.seed)
    load_start = os.getloadavg()[0]
    server: NatsServer | None = None
    stack: Stack | None = None
    services: list[Service] = []
    nc: Client | None = None
    follower: asyncio.Task[None] | None = None
    beating: asyncio.Task[None] | None = None
    client: httpx.AsyncClient | None = None
    try:
        if config.path == "http":
            console.print(f"starting {', '.join(HTTP_SERVICES)} and the webhook receiver")
            stack = await asyncio.to_thread(start_stack, config, data_dir)
            nats_url, database_url = stack.nats_url, stack.database_url
        else:
            server = start_nats_server(
                data_dir / "jetstream", log_file=data_dir / "nats-server.log"
            )
            nats_url = server.url
            database_url = config.database_url or f"sqlite+aiosqlite:///{data_dir / 'crater.db'}"
        await ensure_streams(nats_url)
        nc = await nats.connect(nats_url)
        js = nc.jetstream()
        sample = task_message(task_request("sample", rng, pools), config.path)[1]
        console.print(f"raw JetStream: {config.raw_messages} messages of {len(sample)} bytes")
        raw = await raw_jetstream_rate(nc, config.raw_messages, len(sample), config.consumer_batch)
        console.print(f"  {raw:,.0f} messages/s published and consumed")
        publisher = Publisher(js)
        entry: Entry
        if stack is not None:
            processes = {name: stack.processes[name] for name in HTTP_PROCESSES}
            scheduler = Service(processes["scheduler"], f"{processes['scheduler'].url}/metrics")
            tail = WebhookTail(stack.data_dir / "webhooks.jsonl")
            follower = asyncio.create_task(tail.follow())
            client = stack.gateway_client(timeout=HTTP_TIMEOUT_SECONDS)
            deployment = Deployment(scheduler, processes, tail)
            entry = HttpEntry(client)
        else:
            await asyncio.to_thread(migrate, database_url)
            env = {
                **service_env(config),
                "CRATER_NATS_URL": nats_url,
                "CRATER_DATABASE_URL": database_url,
                "CRATER_MIGRATE_ON_START": "false",
                # Production mode, as shipped: a deployment's own secret, not the development
                # one.
                "CRATER_SCHEDULER_TOKEN_SECRET": secrets.token_urlsafe(48),
            }
            scheduler = await asyncio.to_thread(spawn, "scheduler", data_dir, env, config.profile)
            services.append(scheduler)
            if config.path == "full":
                services.append(await asyncio.to_thread(spawn, "predictor", data_dir, env, False))
            processes = {s.process.name: s.process for s in services}
            deployment = Deployment(scheduler, processes)
            entry = BusEntry(publisher, config.path)
        heartbeats = None
        if config.heartbeat_seconds:
            heartbeats = Heartbeats(Publisher(js), topologies, config.heartbeat_seconds)
            beating = asyncio.create_task(heartbeats.run())
            console.print(
                f"every node heartbeats every {config.heartbeat_seconds:g} s "
                f"({len(topologies) / config.heartbeat_seconds:,.0f}/s), as its probe would"
            )
        else:
            console.print(
                "[yellow]NO HEARTBEATS (--heartbeat-seconds 0): the scheduler runs with a "
                "day's heartbeat timeout, not the shipped one, and without the heartbeat "
                "load a real fleet puts on it[/yellow]"
            )
        console.print(f"publishing {len(topologies)} node topologies")
        cpu_before = {n: cpu_seconds(p.popen.pid) for n, p in processes.items()}
        topology_seconds = await publish_fleet(publisher, topologies, scheduler, heartbeats)
        topology_cpu = {
            n: round((cpu_seconds(p.popen.pid) - cpu_before[n]) * 1000 / len(topologies), 3)
            for n, p in processes.items()
        }
        console.print(
            f"  the scheduler knows them all after {topology_seconds:.1f} s; CPU ms per node: "
            + ", ".join(f"{n} {v:g}" for n, v in topology_cpu.items())
        )
        idle = await measure_idle(processes, config.idle_seconds)
        deployment.idle_cpu = idle
        if idle:
            console.print(
                f"  idle for {config.idle_seconds:g} s (no task offered), % of a core: "
                + ", ".join(f"{n} {v * 100:.1f}" for n, v in idle.items())
            )
        tracker = Tracker(js)
        await nc.subscribe(Subjects.ALLOCATION_GRANTED.subject, cb=tracker.on_granted)
        await nc.subscribe(Subjects.TASK_REJECTED.subject, cb=tracker.on_rejected)
        result = BenchResult(
            path=config.path,
            nodes=len(topologies),
            heartbeat_seconds=config.heartbeat_seconds,
            database=database_url.split(":", 1)[0],
            consumer_batch=config.consumer_batch,
            raw_jetstream_per_second=round(raw, 1),
            topology_seconds=round(topology_seconds, 2),
            topology_cpu_ms_per_node=topology_cpu,
            idle_seconds=config.idle_seconds if idle else 0.0,
            idle_cpu_percent={n: round(v * 100, 1) for n, v in idle.items()},
        )
        overall_before, _ = await asyncio.to_thread(scrape, scheduler.metrics_url)
        if config.profile:
            os.kill(scheduler.process.popen.pid, signal.SIGUSR1)  # the profile starts now
        for stage, rate in enumerate(config.rates):
            console.print(f"stage {stage + 1}/{len(config.rates)}: {rate:g} tasks/s offered")
            count = max(1, int(rate * config.stage_seconds))
            requests = [
                task_request(f"{tracker.run}-s{stage}-t{n}", rng, pools) for n in range(count)
            ]
            outcome = await run_stage(entry, tracker, deployment, requests, rate, config)
            result.stages.append(outcome)
            console.print(describe_stage(outcome))
            if not outcome.kept_up and not config.keep_going:
                break  # saturated: a higher rate only grows the queue
        overall_after, _ = await asyncio.to_thread(scrape, scheduler.metrics_url)
        if config.deep_queue:
            requests = deep_queue_requests(
                f"{tracker.run}-deep", topologies, rng, DEEP_QUEUE_FACTOR
            )
            console.print(
                f"deep queue: {len(requests)} GPU tasks asking {DEEP_QUEUE_FACTOR:g}x the "
                f"fleet's cards, offered at once, each held {config.deep_queue_hold:g} s"
            )
            result.deep_queue = await run_stage(
                entry, tracker, deployment, requests, None, config, config.deep_queue_hold
            )
            console.print(describe_stage(result.deep_queue))
        await asyncio.gather(*tracker.releases)
        if heartbeats is not None and beating is not None:
            if beating.done():  # it stopped: a publish failed (raised here)
                beating.result()
            result.heartbeats = heartbeats.sent
        summarise(result, tracker, bucket_delta(overall_after, overall_before), deployment.tail)
        result.load_average = [round(load_start, 2), round(os.getloadavg()[0], 2)]
        result.machine = (
            f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"
        )
        result.finished_at = datetime.now(UTC).isoformat(timespec="seconds")
        return result
    finally:
        for task in (follower, beating):
            if task is not None:
                task.cancel()
        if client is not None:
            await client.aclose()
        if nc is not None:
            await nc.close()
        for service in reversed(services):
            await asyncio.to_thread(stop_process, service.process)
        if server is not None:
            server.stop()
        if stack is not None:
            await asyncio.to_thread(stack.stop)


def summarise(
    result: BenchResult, tracker: Tracker, decisions: Buckets, tail: WebhookTail | None
) -> None:
    """The run's headline figures: the best stage's rate, latency over all rate stages."""
    rate_ids = {i for i in tracker.submitted if "-deep-" not in i}
    latencies = sorted(v * 1000 for i, v in tracker.latencies.items() if i in rate_ids)
    key = "delivered_per_second" if result.path == "http" else "allocations_per_second"
    best = max(result.stages, key=lambda s: getattr(s, key), default=None)
    result.sustained_allocations_per_second = max(
        (s.allocations_per_second for s in result.stages), default=0.0
    )
    if best is not None:
        result.scheduler_cpu_ms_per_allocation = best.scheduler_cpu_ms_per_allocation
        result.cpu_ms_per_task = best.cpu_ms_per_task
        result.cpu_ms_per_task_above_idle = best.cpu_ms_per_task_above_idle
        result.sustained_delivered_per_second = best.delivered_per_second
    result.ratio_to_raw = round(
        result.sustained_allocations_per_second / result.raw_jetstream_per_second, 3
    )
    result.latency_p50_ms = round(percentile(latencies, 50), 2)
    result.latency_p99_ms = round(percentile(latencies, 99), 2)
    result.latency_p99_9_ms = round(percentile(latencies, 99.9), 2)
    result.decision_p50_ms = histogram_quantile(decisions, 0.5) * 1000
    result.decision_p99_ms = histogram_quantile(decisions, 0.99) * 1000
    result.decision_p99_9_ms = histogram_quantile(decisions, 0.999) * 1000
    result.rejected = tracker.rejected
    result.ungranted = len(tracker.submitted) - len(tracker.latencies)
    if result.path == "http" and tail is not None:
        stages = [*result.stages, *([result.deep_queue] if result.deep_queue else [])]
        result.undelivered = sum(s.submitted - s.delivered for s in stages)
        delays = sorted(
            (tail.scheduled[i] - tracker.sent_wall[i]) * 1000
            for i in rate_ids
            if i in tail.scheduled
        )
        result.webhook_latency_p50_ms = round(percentile(delays, 50), 2)
        result.webhook_latency_p99_ms = round(percentile(delays, 99), 2)
        result.webhook_latency_p99_9_ms = round(percentile(delays, 99.9), 2)


def draw(result: BenchResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (rates, latency) = plt.subplots(1, 2, figsize=(12, 4.8))
    offered = [s.offered_per_second for s in result.stages]
    rates.plot(offered, [s.allocations_per_second for s in result.stages], "o-", label="Crater")
    if result.path == "http":
        rates.plot(
            offered,
            [s.delivered_per_second for s in result.stages],
            "s-",
            label="scheduled webhooks delivered",
        )
    if result.deep_queue is not None:
        deep = result.deep_queue
        rate = deep.delivered_per_second if result.path == "http" else deep.allocations_per_second
        rates.axhline(rate, color="green", linestyle="-.", label=f"deep queue {rate:,.0f}/s")
    rates.plot(offered, offered, ":", color="0.6", label="offered")
    rates.axhline(
        result.raw_jetstream_per_second,
        color="red",
        linestyle="--",
        label=f"raw JetStream {result.raw_jetstream_per_second:,.0f}/s",
    )
    rates.axhline(result.raw_jetstream_per_second / 2, color="red", linestyle=":", linewidth=0.8)
    rates.set_xscale("log")
    rates.set_yscale("log")
    rates.set_xlabel("tasks offered per second")
    rates.set_ylabel("allocations per second")
    headline = (
        f"{result.sustained_delivered_per_second:,.0f} webhooks/s"
        if result.path == "http"
        else f"{result.sustained_allocations_per_second:,.0f}/s = {result.ratio_to_raw:.0%} of raw"
    )
    rates.set_title(f"{result.path} path, {result.nodes:,} nodes, {result.database}: {headline}")
    rates.legend(loc="lower right")
    series = [
        ("submit-to-allocation p50", [s.latency_p50_ms for s in result.stages]),
        ("submit-to-allocation p99", [s.latency_p99_ms for s in result.stages]),
        ("submit-to-allocation p99.9", [s.latency_p99_9_ms for s in result.stages]),
        ("decision p99 (bucket bound)", [s.decision_p99_ms for s in result.stages]),
    ]
    if result.path == "http":
        series += [
            ("HTTP submit-to-webhook p50", [s.webhook_latency_p50_ms for s in result.stages]),
            ("HTTP submit-to-webhook p99", [s.webhook_latency_p99_ms for s in result.stages]),
        ]
    for label, values in series:
        latency.plot(offered, values, "o-", label=label)
    latency.set_xscale("log")
    latency.set_yscale("log")
    latency.set_xlabel("tasks offered per second")
    latency.set_ylabel("ms")
    latency.legend(loc="upper left")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def run(config: BenchConfig) -> None:
    """One run of `config`: the result as JSON and PNG under its out_dir, the summary printed;
    the services' logs copied beside them if a task was not placed (or, on the http path, its
    webhook not delivered), the scheduler's profile if asked."""
    path, out_dir, profile = config.path, config.out_dir, config.profile
    data_dir = Path(tempfile.mkdtemp(prefix="crater-bench-"))
    try:
        result = asyncio.run(bench_async(config, data_dir))
        stem = out_dir / f"bench_{path}_{result.nodes}"
        stem.parent.mkdir(parents=True, exist_ok=True)
        Path(f"{stem}.json").write_text(json.dumps(asdict(result), indent=2) + "\n")
        draw(result, Path(f"{stem}.png"))
        report(result, Path(f"{stem}.json"))
        if result.ungranted or result.rejected or result.undelivered:
            for log in [*data_dir.glob("*.log"), *data_dir.glob("stack/logs/*.log")]:  # why
                shutil.copy(log, Path(f"{stem}.{log.name}"))
            console.print(f"[yellow]some tasks were not placed: logs at {stem}.*.log[/yellow]")
        if profile:
            show_profile(data_dir / "scheduler.prof", Path(f"{stem}.prof.txt"))
            with contextlib.suppress(OSError):  # kept for pstats or snakeviz
                shutil.copy(data_dir / "scheduler.prof", Path(f"{stem}.prof"))
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


def report(result: BenchResult, json_path: Path) -> None:
    if result.path == "http":
        console.print(
            f"[bold]{result.sustained_delivered_per_second:,.0f} scheduled webhooks/s "
            f"delivered[/bold] (HTTP submit to the receiver's record) beside raw JetStream "
            f"{result.raw_jetstream_per_second:,.0f} msgs/s; submit-to-webhook p50 "
            f"{result.webhook_latency_p50_ms} ms, p99 {result.webhook_latency_p99_ms} ms; "
            f"{result.undelivered} not delivered"
        )
    console.print(
        f"[bold]{result.sustained_allocations_per_second:,.0f} allocations/s sustained[/bold] "
        f"= {result.ratio_to_raw:.1%} of raw JetStream ({result.raw_jetstream_per_second:,.0f}"
        f" msgs/s); submit-to-allocation p50 {result.latency_p50_ms} ms, p99 "
        f"{result.latency_p99_ms} ms, p99.9 {result.latency_p99_9_ms} ms; decision time p50 <= "
        f"{result.decision_p50_ms:g} ms, p99 <= {result.decision_p99_ms:g} ms, p99.9 <= "
        f"{result.decision_p99_9_ms:g} ms; scheduler CPU "
        f"{result.scheduler_cpu_ms_per_allocation:g} ms per allocation; "
        f"{result.rejected} rejected, {result.ungranted} not placed"
    )
    cpu = ", ".join(f"{n} {v:g}" for n, v in result.cpu_ms_per_task.items())
    console.print(f"CPU ms per task (fastest stage): {cpu}; load average {result.load_average}")
    if result.idle_cpu_percent:
        above = ", ".join(f"{n} {v:g}" for n, v in result.cpu_ms_per_task_above_idle.items())
        idle = ", ".join(f"{n} {v:g}%" for n, v in result.idle_cpu_percent.items())
        console.print(f"  above idle: {above} (idle, of a core: {idle})")
    if result.heartbeat_seconds:
        console.print(
            f"with every node heartbeating every {result.heartbeat_seconds:g} s "
            f"({result.heartbeats:,} heartbeats in all; their CPU counts in the figures "
            "and in the idle baseline)"
        )
    else:
        console.print("[yellow]measured without heartbeats (--heartbeat-seconds 0)[/yellow]")
    console.print(f"written: {json_path} and {json_path.with_suffix('.png')}")


def show_profile(profile_path: Path, out: Path, top: int = 40) -> None:
    import io
    import pstats

    if not profile_path.exists():
        console.print(f"[yellow]no profile written at {profile_path}[/yellow]")
        return
    text = io.StringIO()
    pstats.Stats(str(profile_path), stream=text).sort_stats("cumulative").print_stats(top)
    text.write("\n")
    pstats.Stats(str(profile_path), stream=text).sort_stats("tottime").print_stats(top)
    out.write_text(text.getvalue())
    console.print(f"profile of the scheduler: {out}")
