"""`crater up`: the whole of Crater on one machine, with a workload a person can watch.

A simulated fleet reports its hardware; AllData (played by this process) submits a stream
of training and inference tasks through the gateway and reports inference latencies; every
decision is printed as it happens, read off the bus like any other consumer would."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shlex
import shutil
import signal
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from faststream.nats import NatsBroker
from nats.aio.msg import Msg

from crater.cli import demo_day
from crater.cli.errors import CliError
from crater.cli.output import cli_console
from crater.cli.stack import LOCAL_POOL, Stack, port_is_free
from crater.contracts import (
    AllocationGranted,
    AllocationReleased,
    Event,
    LatencySamplesReported,
    MessageRejected,
    ScaleDecided,
    Subjects,
    TaskPending,
    TaskPreempted,
    TaskProfiled,
    TaskRejected,
    TaskStatusReported,
    TaskSubmitted,
    TaskUsageReported,
    WebhookDeadLettered,
    WebhookDelivered,
)
from crater.runtime.bus import publish

console = cli_console()

# (weight, role, request) — role picks a pool the fleet has.
WORKLOAD: list[tuple[int, str, dict[str, Any]]] = [
    (
        4,
        "training",
        {
            "task_type": "training",
            "model_config": {"name": "meta-llama/Llama-2-7b-hf", "precision": "bf16"},
            "data_config": {"train_dataset": "s3://alldata/corpus-v3", "io_pattern": "sequential"},
            "training_config": {"sequence_length": 2048, "gradient_checkpointing": True},
            "resource_requirements": {
                "gpu": {"count": 2, "memory_mb": 40960, "type": "A100"},
                "cpu": {"cores": 16, "avx_support": "avx2"},
                "memory": {"capacity_mb": 131072},
                "ssd": {"capacity_gb": 500},
            },
            "sla": {"max_queue_time_seconds": 600},
            "priority": "high",
        },
    ),
    (
        2,
        "training",
        {
            "task_type": "fine-tuning",
            "model_config": {"name": "meta-llama/Llama-2-70b-hf", "precision": "bf16"},
            "training_config": {
                "sequence_length": 4096,
                "gradient_checkpointing": True,
                "lora": {"rank": 16, "target_modules": ["q_proj", "v_proj"]},
            },
            "resource_requirements": {
                "gpu": {"count": 8, "memory_mb": 81920},
                "cpu": {"cores": 64},
                "memory": {"capacity_mb": 1048576},
            },
            "affinity": {"gpu": "same-node", "numa": "best-effort"},
        },
    ),
    (
        4,
        "training",
        {
            "task_type": "fine-tuning",
            "model_config": {"name": "mistralai/Mistral-7B-v0.1", "precision": "bf16"},
            "training_config": {
                "batch_size": 4,
                "gradient_checkpointing": True,
                "lora": {"rank": 16, "target_modules": ["q_proj", "v_proj"]},
            },
            "resource_requirements": {
                "gpu": {"count": 1, "memory_mb": 22528},
                "cpu": {"cores": 8},
                "memory": {"capacity_mb": 65536},
            },
            "preemptible": True,
            "priority": "low",
        },
    ),
    (
        5,
        "inference",
        {
            "task_type": "inference",
            "model_config": {"name": "meta-llama/Llama-3-8b-chat-hf", "precision": "fp16"},
            "resource_requirements": {
                "gpu": {"count": 1, "memory_mb": 20480},
                "cpu": {"cores": 4},
                "memory": {"capacity_mb": 32768},
            },
            "anti_affinity": {"group": "batch-llama3"},
        },
    ),
    (
        3,
        "inference",
        {
            "task_type": "inference",
            "model_config": {"name": "resnet-50", "precision": "int8"},
            "resource_requirements": {
                "gpu": {"count": 1, "memory_mb": 4096},
                "cpu": {"cores": 2},
                "memory": {"capacity_mb": 8192},
            },
        },
    ),
    (
        3,
        "default",
        {
            "task_type": "evaluation",
            "model_config": {"name": "bert-base-uncased", "precision": "fp32"},
            "resource_requirements": {"cpu": {"cores": 8}, "memory": {"capacity_mb": 16384}},
        },
    ),
    (
        1,
        "training",
        {
            "task_type": "training",
            "model_config": {"name": "meta-llama/Llama-3-70b", "precision": "bf16"},
            "resource_requirements": {"gpu": {"count": 16, "memory_mb": 81920}},
            "affinity": {"gpu": "same-node", "numa": "strict"},
        },
    ),
]


SHORT_NAMES = {
    "training": "train",
    "fine-tuning": "tune",
    "inference": "infer",
    "evaluation": "eval",
}
# Simulated tasks run 20-90 s: long enough that the training pool fills and tasks queue.
DEMO_ENV = {
    "CRATER_LOG_LEVEL": "WARNING",
    "CRATER_PROBE_TASK_SECONDS_MIN": "20",
    "CRATER_PROBE_TASK_SECONDS_MAX": "90",
}


# `crater cost` prices the demo's usage with these, unless CRATER_PREDICTOR_PRICE_FILE is set.
EXAMPLES = Path(__file__).resolve().parents[5] / "examples"
DEMO_PRICES = EXAMPLES / "prices.yaml"
LENDING_POOLS = EXAMPLES / "pools-lending.yaml"
MIXED, SHARED_DAY = "mixed", "shared-day"
SCENARIOS = (MIXED, SHARED_DAY)
# shared-day: what differs from the shipped settings, so that a day fits in minutes. Printed
# in the banner: the autoscaler's calm before a scale-in is scaled with the day, and training
# runs 1-3 minutes (an hour or two of the demo's day).
SHARED_DAY_ENV = {
    "CRATER_PROBE_TASK_SECONDS_MIN": "60",
    "CRATER_PROBE_TASK_SECONDS_MAX": "180",
    "CRATER_AUTOSCALER_STABILISATION_SECONDS": "30",
}


def demo_env(scenario: str = MIXED) -> dict[str, str]:
    env = dict(DEMO_ENV)
    if DEMO_PRICES.is_file() and "CRATER_PREDICTOR_PRICE_FILE" not in os.environ:
        env["CRATER_PREDICTOR_PRICE_FILE"] = str(DEMO_PRICES)
    if scenario == SHARED_DAY:
        env.update(SHARED_DAY_ENV)
        if "CRATER_SCHEDULER_POOLS_FILE" not in os.environ:
            env["CRATER_SCHEDULER_POOLS_FILE"] = str(LENDING_POOLS)
    return env


def run_demo(
    data_dir: Path,
    duration: float,
    rate: float,
    seed: int,
    local: bool = True,
    secure: bool = True,
    scenario: str = MIXED,
    day_seconds: float = demo_day.DAY_SECONDS,
) -> None:
    if scenario not in SCENARIOS:
        raise CliError(f"--scenario: {scenario!r} is not one of {', '.join(SCENARIOS)}", 2)
    if data_dir.exists():
        shutil.rmtree(data_dir)  # each demo starts from an empty cluster and database
    gateway_port = 8080 if port_is_free(8080) else 0
    stack = Stack(
        data_dir=data_dir,
        ports={"gateway": gateway_port} if gateway_port else {},
        secure=secure,
    )
    console.rule("[bold]Crater demo")
    console.print(f"starting nats-server, SQLite and six services under {data_dir}/ ...")
    started = time.monotonic()
    failure: BaseException | None = None
    # SIGTERM stops the demo the way Ctrl-C does.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        stack.start(extra_env=demo_env(scenario), local_node=local and EXAMPLE_SCRIPT.is_file())
        _banner(stack, time.monotonic() - started)
        if scenario == SHARED_DAY:
            _shared_day_banner(day_seconds)
        failure = asyncio.run(_watch_and_drive(stack, duration, rate, seed, scenario, day_seconds))
    except KeyboardInterrupt:  # while the stack was starting
        pass
    finally:
        # A second Ctrl-C (make and uv pass it on too) must not cut the shutdown short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        console.print("stopping: services drain and close, then nats-server ...")
        stack.stop()
        console.print("stopped.")
    if failure is not None:
        raise CliError(f"the demo stopped early: {failure}")


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _banner(stack: Stack, seconds: float) -> None:
    """What is where, each line true of this run: every URL answers, every command runs as
    printed, from the directory the demo was started in (tests/e2e/test_readme_commands.py)."""
    gateway = stack.url("gateway")
    env_file = write_env_file(stack)
    console.print(
        f"up in {seconds:.1f} s. nats: {stack.nats_url}  gateway: {gateway}  "
        f"console: {gateway}/console"
    )
    for name, process in stack.processes.items():
        # the receiver (AllData's stand-in) shows what it was sent; the services their metrics
        more = "/deliveries" if name == "receiver" else "/metrics"
        console.print(f"  {name:<10} {process.url}/healthz  {more}   log: {process.log_path}")
    crater = crater_command()
    console.print(
        f"try, in another shell:  source {env_file}; {crater} list-nodes; {crater} tasks",
        soft_wrap=True,
    )
    console.print(
        f"  ({env_file.name} exports CRATER_GATEWAY_URL, CRATER_API_TOKEN: the admin key in "
        f"{stack.data_dir / 'secrets' / 'admin-token'}, CRATER_NATS_*, CRATER_DATABASE_URL and "
        "the callback's own CRATER_CALLBACK_DATABASE_URL; "
        "sign in to the console with that key)"
    )
    console.print("Ctrl-C stops everything.")
    console.rule()


def _shared_day_banner(day_seconds: float) -> None:
    changed = ", ".join(f"{k}={v}" for k, v in SHARED_DAY_ENV.items())
    console.print(
        f"scenario shared-day: a day in {day_seconds:.0f} s, "
        f"from {demo_day.clock(demo_day.START_HOUR)}"
        f"; pools from {LENDING_POOLS.name} (inference lends its idle cards to training). "
        f"Differs from the shipped settings so that a day fits: {changed}.",
        soft_wrap=True,
    )
    console.rule()


def crater_command() -> str:
    """How another shell runs `crater`: `uv run crater` where the demo itself runs under
    `uv run` (make up) or `crater` is not on the PATH, else `crater`."""
    if os.environ.get("UV_RUN_RECURSION_DEPTH") or shutil.which("crater") is None:
        return "uv run crater"
    return "crater"


ENV_FILE = "env.sh"


def _absolute(database: str) -> str:
    """A SQLite URL with an absolute path, so that the file is found from any directory."""
    if database.startswith("sqlite") and ":///" in database:
        scheme, _, path = database.partition(":///")
        return f"{scheme}:///{Path(path).resolve()}"
    return database


def write_env_file(stack: Stack) -> Path:
    """data_dir/env.sh: `source` it and `crater` and curl reach this demo as its admin. It names
    the secrets' files (the admin key is read from its own when sourced), holds none itself."""
    token_file = (stack.data_dir / "secrets" / "admin-token").resolve()
    variables = {
        "CRATER_GATEWAY_URL": shlex.quote(stack.url("gateway")),
        "CRATER_API_TOKEN": f'"$(cat {shlex.quote(str(token_file))})"',
        "CRATER_NATS_URL": shlex.quote(stack.nats_url),
    }
    if stack.security is not None:  # NATS as the admin, over TLS
        variables["CRATER_NATS_USER"] = "admin"
        password = stack.security.password_file("admin").resolve()
        variables["CRATER_NATS_PASSWORD_FILE"] = shlex.quote(str(password))
        variables["CRATER_NATS_TLS_CA"] = shlex.quote(str(stack.security.ca_cert.resolve()))
    variables["CRATER_DATABASE_URL"] = shlex.quote(_absolute(stack.database_url))
    if stack.callback_database_url != stack.database_url:  # `crater webhooks` reads it
        variables["CRATER_CALLBACK_DATABASE_URL"] = shlex.quote(
            _absolute(stack.callback_database_url)
        )
    lines = [
        "# crater up's addresses and credentials, for crater and curl in another shell:",
        f"# source {stack.data_dir / ENV_FILE}",
        *(f"export {name}={value}" for name, value in variables.items()),
    ]
    env_file = stack.data_dir / ENV_FILE
    descriptor = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write("\n".join(lines) + "\n")
    return env_file


async def _watch_and_drive(
    stack: Stack,
    duration: float,
    rate: float,
    seed: int,
    scenario: str = MIXED,
    day_seconds: float = demo_day.DAY_SECONDS,
) -> BaseException | None:
    """Show the decisions and drive the workload until `duration` passes (0: for ever) or
    Ctrl-C / SIGTERM; then close what it opened. The loop takes the signals itself, so the
    closing runs on a live loop (a KeyboardInterrupt raised into it cancelled nats-py's own
    tasks, and the drain that followed timed out into a traceback). Returns what stopped the
    workload early, if anything did (the fleet never showing up)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    watcher = Watcher()
    # The demo plays AllData and the inference replicas: the operator's identity.
    nats_as = stack.nats_connection("admin")
    connection = await nats_as.connect()
    broker = NatsBroker(nats_as.servers, security=nats_as.security(), log_level=10)
    driving: asyncio.Task[None] | None = None
    try:
        await connection.subscribe("crater.v1.>", cb=watcher.on_message)
        await broker.start()
        drive = (
            _drive_shared_day(stack, broker, rate, seed, watcher, day_seconds)
            if scenario == SHARED_DAY
            else _drive(stack, broker, rate, seed, watcher)
        )
        driving = asyncio.create_task(drive)
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait(
            {driving, stopping}, timeout=duration or None, return_when=asyncio.FIRST_COMPLETED
        )
        stopping.cancel()
        if driving.done() and not driving.cancelled():
            return driving.exception()
        return None
    finally:
        if driving is not None:
            driving.cancel()
            await asyncio.gather(driving, return_exceptions=True)
        for closing in (broker.stop(), connection.drain()):
            try:
                await asyncio.wait_for(closing, 10)
            except Exception as error:  # the demo stops all the same
                console.print(f"[dim]closing the demo's NATS connection: {error!r}[/dim]")
        watcher.summary()


async def _drive(
    stack: Stack, broker: NatsBroker, rate: float, seed: int, watcher: Watcher
) -> None:
    """The workload: wait for the fleet, start the inference service, then submit tasks and
    report latencies (and run the local node's script) until cancelled."""
    pools = await _fleet_pools(stack, watcher)
    await _start_inference_service(stack, pools)
    work = [
        _submit_tasks(stack, pools, rate, seed, watcher),
        _report_latencies(broker, seed),
    ]
    if "agent" in stack.processes:
        work.append(_submit_local_tasks(stack, watcher))
    await asyncio.gather(*work)


# shared-day's training: one-card fine-tunes of a 3B model that fit an inference card too (so
# they borrow the cards inference lends at night), and two-card A100 runs that stay home.
SMALL_TUNE: dict[str, Any] = {
    "task_type": "fine-tuning",
    "model_config": {"name": "Qwen/Qwen2.5-3B", "precision": "bf16"},
    "training_config": {
        "batch_size": 2,
        "sequence_length": 1024,
        "gradient_checkpointing": True,
        "lora": {"rank": 16, "target_modules": ["q_proj", "v_proj"]},
    },
    "resource_requirements": {
        "gpu": {"count": 1, "memory_mb": 14336},
        "cpu": {"cores": 8},
        "memory": {"capacity_mb": 32768},
    },
    "preemptible": True,
    "priority": "low",
}
DAY_TRAINING: list[tuple[int, dict[str, Any]]] = [(3, SMALL_TUNE), (1, WORKLOAD[0][2])]
# No more training is submitted while this many tasks wait: enough to fill what is lent.
DAY_WAITING_CAP = 24


async def _drive_shared_day(
    stack: Stack,
    broker: NatsBroker,
    rate: float,
    seed: int,
    watcher: Watcher,
    day_seconds: float,
) -> None:
    """shared-day's workload: the inference service's day of traffic, and training all day."""
    pools = await _fleet_pools(stack, watcher)
    missing = {"inference", "training"} - pools
    if missing:
        raise CliError(f"shared-day needs the pools inference and training; missing {missing}")
    await _start_inference_service(stack, pools)
    started = time.monotonic()
    await asyncio.gather(
        _submit_day_training(stack, rate, seed, watcher),
        _serve_the_day(broker, seed, watcher, started, day_seconds),
        _tell_the_time(watcher, started, day_seconds),
    )


async def _submit_day_training(stack: Stack, rate: float, seed: int, watcher: Watcher) -> None:
    rng = random.Random(seed)
    weights = [w for w, _ in DAY_TRAINING]
    async with stack.gateway_client(timeout=10) as client:
        for n in range(1, 1_000_000):
            await asyncio.sleep(rng.expovariate(rate))
            if len(watcher.waiting) >= DAY_WAITING_CAP:
                continue
            template = rng.choices([t for _, t in DAY_TRAINING], weights)[0]
            body = json.loads(json.dumps(template))
            body["task_id"] = f"{SHORT_NAMES[template['task_type']]}-{n:04d}"
            body["pool"] = "training"
            body["tenant"] = rng.choice(["search", "ads", "research"])
            response = await client.post("/api/v1/schedule", json=body)
            if response.status_code != 202:
                watcher.line("red", "✘", f"gateway refused {body['task_id']}: {response.text}")


async def _serve_the_day(
    broker: NatsBroker, seed: int, watcher: Watcher, started: float, day_seconds: float
) -> None:
    """Every second, each serving replica reports its latencies and memory pressure under its
    share of the hour's load, as the replicas of a real service would."""
    rng = random.Random(seed + 1)
    while True:
        hour = demo_day.hour_of_day(time.monotonic() - started, day_seconds)
        load = demo_day.load_at(hour)
        replicas = sorted(watcher.serving)
        for replica in replicas:
            report = demo_day.replica_report(load, len(replicas), rng)
            await publish(
                broker,
                LatencySamplesReported(
                    service=SERVICE,
                    replica_id=replica,
                    task_id=replica,
                    latencies_ms=report.latencies_ms,
                    gpu_memory_pressure=report.pressure,
                    replicas=len(replicas),
                ),
            )
        await asyncio.sleep(1.0)


async def _tell_the_time(watcher: Watcher, started: float, day_seconds: float) -> None:
    """Each hour of the demo's day: the hour, the load, the fleet, and what training borrows."""
    while True:
        hour = demo_day.hour_of_day(time.monotonic() - started, day_seconds)
        own, borrowed = watcher.training_gpus()
        watcher.line(
            "bold",
            "◷",
            f"{demo_day.clock(hour)} {demo_day.part_of_day(hour)}: inference load "
            f"{demo_day.load_at(hour):.1f} replicas' worth, {len(watcher.serving)} serving; "
            f"training on {own} GPUs of its own + {borrowed} borrowed from inference",
        )
        await asyncio.sleep(day_seconds / 24)


async def _fleet_pools(stack: Stack, watcher: Watcher, timeout: float = 30.0) -> set[str]:
    """Wait until the scheduler knows the simulated fleet; show it; return its pools."""
    deadline = time.monotonic() + timeout
    async with stack.gateway_client(timeout=5) as client:
        while time.monotonic() < deadline:
            response = await client.get("/api/v1/nodes")
            if response.status_code == 200 and (nodes := response.json()["nodes"]):
                await asyncio.sleep(1.0)  # let the rest of the fleet arrive
                nodes = (await client.get("/api/v1/nodes")).json()["nodes"]
                kinds = Counter(
                    f"{n['gpus_total']}x {n['gpu_model']}" if n["gpu_model"] else "CPU only"
                    for n in nodes
                )
                described = ", ".join(f"{count} [{kind}]" for kind, count in sorted(kinds.items()))
                watcher.line("bold", "▣", f"the scheduler knows {len(nodes)} nodes: {described}")
                return {n["pool"] for n in nodes}
            await asyncio.sleep(0.5)
    raise TimeoutError("the scheduler saw no nodes: is the probe running?")


async def _submit_tasks(
    stack: Stack, pools: set[str], rate: float, seed: int, watcher: Watcher
) -> None:
    rng = random.Random(seed)
    weights = [w for w, _, _ in WORKLOAD]
    async with stack.gateway_client(timeout=10) as client:
        for n in range(1, 1_000_000):
            _, role, template = rng.choices(WORKLOAD, weights)[0]
            body = json.loads(json.dumps(template))
            body["task_id"] = f"{SHORT_NAMES[template['task_type']]}-{n:04d}"
            body["pool"] = role if role in pools else "default"
            body["tenant"] = rng.choice(["search", "ads", "research"])
            response = await client.post("/api/v1/schedule", json=body)
            if response.status_code != 202:
                watcher.line("red", "✘", f"gateway refused {body['task_id']}: {response.text}")
            await asyncio.sleep(rng.expovariate(rate))


# Run for real on this machine (node local-01): AllData's kind of training script, reading its
# allocation, binding to it and reporting its own use through crater_client.
EXAMPLE_SCRIPT = Path(__file__).resolve().parents[5] / "examples" / "train_with_crater_client.py"
LOCAL_EVERY_SECONDS = 60.0


def local_task(n: int) -> dict[str, Any]:
    return {
        "task_id": f"client-{n:04d}",
        "task_type": "training",
        "model_config": {"name": "examples/linear-regression", "precision": "fp32"},
        "resource_requirements": {"cpu": {"cores": 1}, "memory": {"capacity_mb": 512}},
        "pool": LOCAL_POOL,
        "command": [
            sys.executable,
            str(EXAMPLE_SCRIPT),
            "--seconds",
            "25",
            "--monitor-interval",
            "5",
        ],
    }


async def _submit_local_tasks(stack: Stack, watcher: Watcher) -> None:
    async with stack.gateway_client(timeout=10) as client:
        for n in range(1, 1_000_000):
            await asyncio.sleep(5.0 if n == 1 else LOCAL_EVERY_SECONDS)
            body = local_task(n)
            response = await client.post("/api/v1/schedule", json=body)
            if response.status_code != 202:
                watcher.line("red", "✘", f"gateway refused {body['task_id']}: {response.text}")


SERVICE = "chat-llama3"
FIRST_REPLICA = f"{SERVICE}-replica-00"


async def _start_inference_service(stack: Stack, pools: set[str]) -> None:
    """The inference service whose latencies drive the autoscaler: its first replica is a
    task like any other, and the autoscaler's new replicas are copies of it."""
    body = {
        "task_id": FIRST_REPLICA,
        "task_type": "inference",
        "model_config": {"name": "meta-llama/Llama-3-8b-chat-hf", "precision": "fp16"},
        "resource_requirements": {
            "gpu": {"count": 1, "memory_mb": 20480},
            "cpu": {"cores": 4},
            "memory": {"capacity_mb": 32768},
        },
        "pool": "inference" if "inference" in pools else "default",
        "anti_affinity": {"group": SERVICE},
    }
    async with stack.gateway_client(timeout=10) as client:
        await client.post("/api/v1/schedule", json=body)


async def _report_latencies(broker: NatsBroker, seed: int) -> None:
    """An inference service's replicas report request latencies; a burst comes at 20-40 s."""
    rng = random.Random(seed + 1)
    started = time.monotonic()
    while True:
        elapsed = time.monotonic() - started
        burst = 20 <= elapsed % 120 <= 40
        base, pressure = (320.0, 0.88) if burst else (60.0, 0.2)
        samples = [max(rng.gauss(base, base * 0.25), 1.0) for _ in range(50)]
        await publish(
            broker,
            LatencySamplesReported(
                service=SERVICE,
                replica_id=FIRST_REPLICA,
                task_id=FIRST_REPLICA,
                latencies_ms=samples,
                gpu_memory_pressure=pressure,
            ),
        )
        await asyncio.sleep(1.0)


def core_ranges(cores: list[int]) -> str:
    """`0-15, 64-79` for those 32 cores; `none` for none."""
    spans: list[list[int]] = []
    for core in sorted(cores):
        if spans and core == spans[-1][1] + 1:
            spans[-1][1] = core
        else:
            spans.append([core, core])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans) or "none"


class Watcher:
    """Prints decisions as they happen, read off the bus."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.counts: Counter[str] = Counter()
        self.requests: dict[str, TaskSubmitted] = {}
        self.waiting: set[str] = set()  # submitted, neither placed nor refused yet
        # task -> (its pool, the pool it borrows from, its GPUs) while it holds them
        self.held: dict[str, tuple[str, str | None, int]] = {}
        self.serving: set[str] = set()  # the inference service's placed replicas, not draining

    def training_gpus(self) -> tuple[int, int]:
        """GPUs training holds in its own pool, and borrowed from another."""
        own = sum(n for pool, lender, n in self.held.values() if pool == "training" and not lender)
        borrowed = sum(n for pool, lender, n in self.held.values() if pool == "training" and lender)
        return own, borrowed

    def track(self, event: Event) -> None:
        """What the shared-day scenario counts: waiting tasks, held GPUs, serving replicas."""
        if isinstance(event, TaskSubmitted):
            self.waiting.add(event.task_id)
        elif isinstance(event, TaskRejected):
            self.waiting.discard(event.task_id)
        elif isinstance(event, AllocationGranted):
            self.waiting.discard(event.task_id)
            self.held[event.task_id] = (event.pool, event.borrowed_from, len(event.gpu_ids))
            if event.task_id.startswith(SERVICE):
                self.serving.add(event.task_id)
        elif isinstance(event, AllocationReleased):
            self.held.pop(event.task_id, None)
            self.serving.discard(event.task_id)
        elif isinstance(event, ScaleDecided):
            self.serving.difference_update(event.drain_replicas)

    def line(self, style: str, icon: str, text: str) -> None:
        elapsed = time.monotonic() - self.started
        console.print(f"[dim]{elapsed:7.1f}s[/dim] [{style}]{icon}[/{style}] {text}")

    async def on_message(self, msg: Msg) -> None:
        channel = next(
            (
                c
                for c in Subjects.ALL
                if msg.subject == c.subject or msg.subject.startswith(c.subject + ".")
            ),
            None,
        )
        quiet = (Subjects.NODE_METRICS, Subjects.NODE_HEALTH, Subjects.NODE_TOPOLOGY)
        if channel is None or channel in quiet:
            return
        try:
            event = channel.event.model_validate_json(msg.data)
        except ValueError:
            return
        self.counts[type(event).__name__] += 1
        self.track(event)
        self.show(event)

    def show(self, event: Event) -> None:
        if isinstance(event, TaskSubmitted):
            self.requests[event.task_id] = event
            gpu = event.resource_requirements.gpu
            need = f"{gpu.count}x GPU {gpu.memory_mb // 1024} GiB" if gpu.count else "CPU only"
            self.line(
                "cyan",
                "→",
                f"{event.task_id} submitted: {event.task_type} {event.model_spec.name} "
                f"({need}, {event.resource_requirements.cpu.cores} cores, pool {event.pool})",
            )
        elif isinstance(event, TaskProfiled):
            p = event.prediction
            self.line(
                "dim",
                "≈",
                f"{event.task.task_id} predicted {p.gpu_memory_per_gpu_mb / 1024:.1f} GiB per GPU "
                f"({p.confidence} confidence; DataLoader workers {p.dataloader_num_workers})",
            )
        elif isinstance(event, AllocationGranted):
            gpus = f" GPUs {event.gpu_ids}" if event.gpu_ids else ", no GPU"
            self.line(
                "green",
                "✔",
                f"{event.task_id} placed on [bold]{event.node}[/bold]{gpus}, "
                f"cores {core_ranges(event.cpu_cores)}: {event.explanation}",
            )
        elif isinstance(event, TaskPending):
            self.line("yellow", "…", f"{event.task_id} waits: {event.summary}")
        elif isinstance(event, TaskRejected):
            why = "; ".join(f"{e.field}: {e.reason}" for e in event.errors)
            self.line("red", "✘", f"{event.task_id} rejected: {why}")
        elif isinstance(event, TaskStatusReported):
            self.line("blue", "●", f"{event.task_id} {event.status}")
        elif isinstance(event, AllocationReleased):
            self.line("dim", "↺", f"{event.task_id} released {event.node} GPUs {event.gpu_ids}")
        elif isinstance(event, TaskPreempted):
            self.line(
                "yellow",
                "✂",
                f"{event.task_id} preempted, {event.cause()}: "
                f"{event.grace_period_seconds} s to checkpoint",
            )
        elif isinstance(event, WebhookDelivered):
            self.line(
                "magenta",
                "↪",
                f"{event.task_id} webhook '{event.task_status}' delivered to AllData: "
                f"HTTP {event.status_code} in {event.latency_ms:.0f} ms",
            )
        elif isinstance(event, WebhookDeadLettered):
            self.line("red", "↯", f"{event.task_id} webhook dead-lettered: {event.last_error}")
        elif isinstance(event, ScaleDecided):
            self.line(
                "bold magenta",
                "⇅",
                f"scale {event.direction} {event.service} {event.current_replicas}→"
                f"{event.desired_replicas}: {event.reason}",
            )
        elif isinstance(event, TaskUsageReported):
            read = (event.io_read_bytes_per_second or 0) / 1e6
            written = (event.io_write_bytes_per_second or 0) / 1e6
            self.line(
                "dim",
                "≋",
                f"{event.task_id} measured itself: CPU {event.cpu_utilization_percent or 0:.0f}% "
                f"of its cores, {event.host_memory_used_mb or 0} MiB resident, IO "
                f"{read:.1f}/{written:.1f} MB/s read/written, {len(event.gpus)} GPUs "
                "(to the predictor)",
            )
        elif isinstance(event, MessageRejected):
            why = "; ".join(f"{e.field}: {e.reason}" for e in event.errors)
            self.line("red", "!", f"{event.consumer} refused a message on {event.subject}: {why}")

    def summary(self) -> None:
        console.rule("summary")
        for name in (
            "TaskSubmitted",
            "AllocationGranted",
            "TaskPending",
            "TaskRejected",
            "AllocationReleased",
            "TaskPreempted",
            "WebhookDelivered",
            "ScaleDecided",
        ):
            console.print(f"  {name:<20} {self.counts.get(name, 0)}")
