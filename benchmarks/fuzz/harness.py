"""Fuzzing Crater over a real nats-server with the real services in-process: hypothesis
bodies for every consumed bus subject (valid ones from the event models' JSON schemas,
malformed ones of every kind) and schemathesis requests against the gateway's OpenAPI.
Shared by tests/integration/fuzz (bounded) and benchmarks/fuzz/run.py (the long run)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import secrets
import threading
import time
import warnings
import zlib
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nats
import nats.errors
import nats.js.errors
import schemathesis
import uvicorn
from faststream import TestApp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from nats.aio.msg import Msg
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from crater.contracts import Channel, MessageDeadLettered, Subjects
from crater.contracts.base import SCHEMA_VERSION
from crater.runtime.bus import node_mismatch, retry_transient
from crater.runtime.jsondepth import TooDeep, check_json_depth, check_json_text
from crater.runtime.nats_server import free_port

MAX_DEPTH = 64  # the services' max_json_depth (default)
# Channels some service consumes (the dead-letter ones only `crater dead-letters` reads).
CONSUMED: tuple[Channel, ...] = tuple(
    c for c in Subjects.ALL if any(not x.startswith("crater ") for x in c.consumers)
)
# A hang: a consumer with messages pending or unacked that makes no progress (nothing newly
# delivered or acked) for this long. One still working through a backlog (a slow handler, a
# loaded machine) is waited for, up to SETTLE_CAP_S, and its lag is reported, not counted.
SETTLE_TIMEOUT_S = 30.0
SETTLE_CAP_S = 600.0
# Quick redelivery, so that a handler failing on every delivery is dead-lettered (and seen)
# within its batch: the one setting the fuzz stacks change from what ships.
QUICK_DELIVERY: dict[str, Any] = {
    "max_deliveries": 2,
    "redelivery_delay_seconds": 0.05,
    "max_outage_deliveries": 4,
}


# ---------------------------------------------------------------- generating bus bodies


def _bus_openapi() -> dict[str, Any]:
    """Each consumed event model as the body of a made-up operation, so schemathesis's
    schema-driven hypothesis strategies generate its bodies (valid and invalid)."""
    components: dict[str, Any] = {}
    paths: dict[str, Any] = {}
    for channel in CONSUMED:
        model = channel.event.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(model.pop("$defs", {}))
        name = f"Event_{channel.event.__name__}"
        components[name] = model
        body = {"$ref": f"#/components/schemas/{name}"}
        paths[f"/{channel.subject}"] = {
            "post": {
                "operationId": channel.subject,
                "requestBody": {
                    "required": True,
                    "content": {"application/json": {"schema": body}},
                },
                "responses": {"200": {"description": "consumed"}},
            }
        }
    return {
        "openapi": "3.1.0",
        "info": {"title": "Crater bus", "version": "1"},
        "paths": paths,
        "components": {"schemas": components},
    }


_BUS_SCHEMA = schemathesis.openapi.from_dict(_bus_openapi())


def _json(value: Any) -> bytes:
    return json.dumps(value).encode()


def _body_strategy(channel: Channel, mode: str) -> st.SearchStrategy[bytes]:
    operation = _BUS_SCHEMA[f"/{channel.subject}"]["POST"]
    from schemathesis.generation.modes import GenerationMode

    generation = GenerationMode.POSITIVE if mode == "schema" else GenerationMode.NEGATIVE
    return operation.as_strategy(generation_mode=generation).map(lambda c: _raw(c.body))


json_leaves = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
json_values = st.recursive(
    json_leaves,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


def _raw(body: Any) -> bytes:
    """A generated body as bytes (negative mode may give bytes, or no body at all)."""
    if isinstance(body, bytes):
        return body
    try:
        return _json(body)
    except (TypeError, ValueError):
        return b""


def _deep(depth: int) -> bytes:
    return b'{"task_id": "deep", "x": ' + b"[" * depth + b"]" * depth + b"}"


def _with(body: bytes, **changes: Any) -> bytes:
    try:
        value = json.loads(body)
    except ValueError:
        return body
    if isinstance(value, dict):
        value.update(changes)
    return _json(value)


def _without_a_field(draw: st.DrawFn, body: bytes) -> bytes:
    value = json.loads(body)
    if isinstance(value, dict) and value:
        value.pop(draw(st.sampled_from(sorted(value))))
    return _json(value)


def _wrong_type(draw: st.DrawFn, body: bytes) -> bytes:
    value = json.loads(body)
    if isinstance(value, dict) and value:
        key = draw(st.sampled_from(sorted(value)))
        value[key] = draw(json_values)
    return _json(value)


@st.composite
def bus_message(draw: st.DrawFn, channel: Channel) -> tuple[str, bytes]:
    """(kind, body) for `channel`: schema-driven ones (valid or not, as the model decides)
    and malformed ones of every kind."""
    kind = draw(
        st.sampled_from(
            [
                "schema",
                "schema",
                "schema",
                "negative",
                "bytes",
                "json",
                "missing-field",
                "wrong-type",
                "schema-version",
                "deep",
                "huge",
                "not-utf8",
            ]
        )
    )
    if kind in ("schema", "negative"):
        return kind, draw(_body_strategy(channel, kind))
    base = draw(_body_strategy(channel, "schema"))
    if kind == "bytes":
        return kind, draw(st.binary(max_size=256))
    if kind == "json":
        return kind, _json(draw(json_values))
    if kind == "missing-field":
        return kind, _without_a_field(draw, base)
    if kind == "wrong-type":
        return kind, _wrong_type(draw, base)
    if kind == "schema-version":
        version = draw(st.integers().filter(lambda v: v != SCHEMA_VERSION) | json_leaves)
        return kind, _with(base, schema_version=version)
    if kind == "deep":
        return kind, _deep(draw(st.integers(MAX_DEPTH + 1, 5000)))
    if kind == "huge":  # big but under the stream's 1 MiB message limit
        size = draw(st.integers(100_000, 900_000))
        return kind, _with(base, padding="x" * size)
    return kind, base[:-1] + b"\xff\xfe}" if base.endswith(b"}") else b"\xff" + base


def draw_messages(channel: Channel, count: int, seed: int | None = None) -> list[tuple[str, bytes]]:
    """`count` hypothesis examples for `channel` (generated, then sent in a batch)."""
    found: list[tuple[str, bytes]] = []

    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=seed is None,
    )
    @given(bus_message(channel))
    def collect(message: tuple[str, bytes]) -> None:
        found.append(message)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if seed is not None:
            from hypothesis import seed as with_seed

            with_seed(seed)(collect)()
        else:
            collect()
    return found[:count]


def valid(channel: Channel, body: bytes, subject: str) -> bool:
    """Whether the services should take `body` on `subject` (the same checks their consumers
    make: the model, and a node-scoped body naming its subject's node)."""
    try:
        check_json_depth(body, MAX_DEPTH)
        check_json_text(body)
        channel.event.model_validate_json(body)
        return node_mismatch(subject, json.loads(body)) is None
    except (TooDeep, ValueError, RecursionError):
        return False


_NODE_NUMBERS = itertools.count()


def subject_for(channel: Channel, body: bytes) -> str:
    if not channel.node_scoped:
        return channel.subject
    # one subject per message: the topology stream keeps one message per subject
    return channel.for_node(f"fuzz-{zlib.crc32(body):08x}-{next(_NODE_NUMBERS)}")


# ---------------------------------------------------------------- figures


@dataclass
class Figures:
    tried: Counter[str] = field(default_factory=Counter)
    valid_consumed: Counter[str] = field(default_factory=Counter)
    rejected_as_expected: Counter[str] = field(default_factory=Counter)
    refused_by_stream: Counter[str] = field(default_factory=Counter)
    crashes: Counter[str] = field(default_factory=Counter)
    server_errors: Counter[str] = field(default_factory=Counter)
    hangs: Counter[str] = field(default_factory=Counter)
    other_failures: Counter[str] = field(default_factory=Counter)
    by_kind: Counter[str] = field(default_factory=Counter)
    settle_seconds: list[float] = field(default_factory=list)  # per batch: until all caught up
    statuses: dict[str, Counter[int]] = field(default_factory=lambda: defaultdict(Counter))
    findings: list[dict[str, Any]] = field(default_factory=list)
    stage: str = ""  # what the run does now, for a progress line

    def finding(self, **what: Any) -> None:
        if len(self.findings) < 50:
            self.findings.append(what)

    def total(self, name: str) -> int:
        counter: Counter[str] = getattr(self, name)
        return sum(counter.values())

    def as_json(self) -> dict[str, Any]:
        names = (
            "tried",
            "valid_consumed",
            "rejected_as_expected",
            "refused_by_stream",
            "crashes",
            "server_errors",
            "hangs",
            "other_failures",
        )
        return {
            "totals": {n: self.total(n) for n in names},
            "per_target": {
                target: {n: getattr(self, n)[target] for n in names}
                | ({"statuses": dict(self.statuses[target])} if target in self.statuses else {})
                for target in sorted(self.tried)
            },
            "bus_kinds": dict(self.by_kind),
            "settle_seconds": _spread(self.settle_seconds),
            "findings": self.findings,
        }


def _spread(values: list[float]) -> dict[str, float]:
    """p50, p99 and max of a batch figure (0 when there was none)."""
    if not values:
        return {"p50": 0.0, "p99": 0.0, "max": 0.0}
    ordered = sorted(values)
    at = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50": round(at(0.5), 2), "p99": round(at(0.99), 2), "max": round(ordered[-1], 2)}


# ---------------------------------------------------------------- the stack


@dataclass
class Stack:
    nats_url: str
    gateway_url: str
    services: dict[str, Any]
    api_token: str  # an admin key: authentication is on, as shipped

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.api_token}"}


async def _serve(app: Any) -> AsyncIterator[str]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    serving = asyncio.create_task(server.serve())
    for _ in range(500):
        if server.started or serving.done():
            break
        await asyncio.sleep(0.02)
    assert server.started, "gateway did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await serving


@contextlib.asynccontextmanager
async def stack(nats_url: str, workdir: Path) -> AsyncIterator[Stack]:
    """Scheduler, predictor, callback, autoscaler, a fleet-mode probe and a live gateway,
    in-process on `nats_url`; quick redelivery so a failing handler shows at once."""
    from crater.autoscaler.app import AutoscalerSettings
    from crater.autoscaler.app import build as autoscaler
    from crater.callback.app import CallbackSettings
    from crater.callback.app import build as callback
    from crater.gateway.apikeys import Scope, new_key, write_keys_file
    from crater.gateway.app import GatewaySettings
    from crater.gateway.app import build as gateway
    from crater.predictor.app import PredictorSettings
    from crater.predictor.app import build as predictor
    from crater.probe.app import build as probe
    from crater.probe.settings import ProbeSettings
    from crater.scheduler.app import SchedulerSettings
    from crater.scheduler.app import build as scheduler

    quick: dict[str, Any] = {"nats_url": nats_url, **QUICK_DELIVERY}

    def db(name: str) -> str:
        return f"sqlite+aiosqlite:///{workdir / f'{name}.db'}"

    built = {
        # production mode, as shipped: a random token secret, as a deployment has its own
        "scheduler": scheduler(
            SchedulerSettings(
                **quick, database_url=db("scheduler"), token_secret=secrets.token_urlsafe(48)
            )
        ),
        "predictor": predictor(PredictorSettings(**quick, database_url=db("predictor"))),
        "callback": callback(CallbackSettings(**quick, database_url=db("callback"))),
        "autoscaler": autoscaler(AutoscalerSettings(**quick)),
        "probe": probe(ProbeSettings(**quick, mode="fleet", seed=7)),
    }
    # Authentication required, as shipped; the fuzzer holds an admin key so that its bodies
    # reach validation rather than stopping at 401.
    keys = workdir / "api-keys.yaml"
    token, key = new_key("fuzz", [Scope.ADMIN], name="fuzzer")
    write_keys_file(keys, [key])
    app = gateway(
        GatewaySettings(
            nats_url=nats_url, query_timeout_seconds=2.0, auth="required", api_keys_file=keys
        )
    )
    async with contextlib.AsyncExitStack() as running:
        for _, asgi in built.values():
            await running.enter_async_context(TestApp(asgi))
        url = await running.enter_async_context(contextlib.asynccontextmanager(_serve)(app))
        yield Stack(nats_url, url, {name: service for name, (service, _) in built.items()}, token)


@contextlib.asynccontextmanager
async def process_stack(workdir: Path) -> AsyncIterator[tuple[Stack, Callable[[], list[str]]]]:
    """Crater as `crater up` runs it (crater.cli.stack: its own nats-server, every service its
    own process, SQLite with the callback on a file of its own, production mode with its own
    secrets, authentication required), with QUICK_DELIVERY. Yields the stack and a check that
    names each service process that has exited (a crash the bus alone would only show as a
    hang)."""
    from crater.cli.stack import Stack as Processes

    processes = Processes(workdir / "stack")
    quick = {f"CRATER_{name.upper()}": str(value) for name, value in QUICK_DELIVERY.items()}
    await asyncio.to_thread(processes.start, extra_env={**quick, "CRATER_PROBE_SEED": "7"})

    stopping = False

    def exited() -> list[str]:
        if stopping:  # stopped by us (the run's end, Ctrl-C), not a crash
            return []
        return [
            f"{name} exited with {process.popen.returncode}: "
            + process.log_path.read_text(errors="replace")[-1500:]
            for name, process in processes.processes.items()
            if process.popen.poll() is not None
        ]

    try:
        yield Stack(processes.nats_url, processes.url("gateway"), {}, processes.api_token), exited
    finally:
        stopping = True
        await asyncio.to_thread(processes.stop)


# ---------------------------------------------------------------- the bus


def _matches(pattern: str, subject: str) -> bool:
    want, got = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(got) > i
        if i >= len(got) or (token != "*" and token != got[i]):
            return False
    return len(want) == len(got)


class BusFuzzer:
    """Publishes generated bodies to JetStream and judges what the consumers did with each."""

    def __init__(self, connection: nats.NATS, figures: Figures) -> None:
        self.connection = connection
        self.js = connection.jetstream()
        self.figures = figures
        self.letters: dict[tuple[str, int], list[MessageDeadLettered]] = defaultdict(list)

    @classmethod
    async def start(cls, nats_url: str, figures: Figures) -> BusFuzzer:
        fuzzer = cls(await nats.connect(nats_url), figures)
        await fuzzer.connection.subscribe(
            Subjects.MESSAGE_DEAD_LETTERED.subject, cb=fuzzer._on_letter
        )
        await fuzzer.connection.flush()
        return fuzzer

    async def _on_letter(self, msg: Msg) -> None:
        with contextlib.suppress(ValueError):
            letter = MessageDeadLettered.model_validate_json(msg.data)
            self.letters[(letter.stream, letter.stream_sequence)].append(letter)

    async def consumers_info(self, stream: str) -> list[Any]:
        """The stream's consumers; a JetStream API timeout (a loaded machine) is retried, as
        the services retry theirs, rather than ending the run."""
        return await retry_transient(
            lambda: self.js.consumers_info(stream), what=f"consumers of {stream}"
        )

    async def consumers(self, stream: str) -> dict[str, list[str]]:
        found = {}
        for info in await self.consumers_info(stream):
            config = info.config
            filters = list(config.filter_subjects or []) or [config.filter_subject or ">"]
            found[info.name] = filters
        return found

    async def settled(
        self, quiet: float = SETTLE_TIMEOUT_S, cap: float = SETTLE_CAP_S
    ) -> list[str]:
        """Waits for every durable consumer to have nothing pending or unacked; the ones
        that stopped making progress for `quiet` seconds, or had not caught up after `cap`
        (a hang). Records how long the batch took to settle."""
        started = time.monotonic()
        last_seen: dict[str, tuple[int, int]] = {}  # consumer: (delivered, acked) sequences
        last_progress: dict[str, float] = {}
        while True:
            now = time.monotonic()
            behind: list[str] = []
            stuck: list[str] = []
            # every stream a fuzzed subject lands on, from the catalog (a list written here
            # missed the tenants' stream when it came, and judged before its consumer read)
            for stream in sorted({channel.stream.name for channel in CONSUMED}):
                for info in await self.consumers_info(stream):
                    if not (info.num_pending or info.num_ack_pending):
                        continue
                    name = f"{stream}/{info.name}"
                    seen = (info.delivered.stream_seq or 0, info.ack_floor.stream_seq or 0)
                    if last_seen.get(name) != seen:
                        last_seen[name], last_progress[name] = seen, now
                    state = f"{name}: {info.num_pending} pending, {info.num_ack_pending} unacked"
                    behind.append(state)
                    if now - last_progress[name] > quiet:
                        stuck.append(f"{state}, no progress for {now - last_progress[name]:.0f} s")
            if not behind:
                self.figures.settle_seconds.append(now - started)
                return []
            if stuck or now - started > cap:
                self.figures.settle_seconds.append(now - started)
                return stuck or [f"{b}, still behind after {cap:.0f} s" for b in behind]
            await asyncio.sleep(0.1)

    async def run_batch(self, batch: list[tuple[Channel, str, bytes]]) -> None:
        """Publish a batch, wait for the consumers to catch up, judge every message."""
        sent: list[tuple[Channel, str, bytes, str, str, int, list[str]]] = []
        consumers_of: dict[str, dict[str, list[str]]] = {}
        for channel, kind, body in batch:
            target = channel.subject
            self.figures.tried[target] += 1
            self.figures.by_kind[kind] += 1
            subject = subject_for(channel, body)
            stream = channel.stream.name
            if stream not in consumers_of:
                consumers_of[stream] = await self.consumers(stream)
            # the catalog's consumers of the channel (a stream-wide consumer, the callback's,
            # skips the subjects it does not read without decoding them)
            services = {c.split(" ")[0] for c in channel.consumers}
            readers = [
                name
                for name, filters in consumers_of[stream].items()
                if any(_matches(f, subject) for f in filters) and name.split("-")[0] in services
            ]
            try:
                ack = await self.js.publish(
                    subject, body, headers={"content-type": "application/json"}, timeout=10
                )
            except nats.js.errors.APIError as error:  # over the stream's limits
                self.figures.refused_by_stream[target] += 1
                self.figures.by_kind[f"{kind}:refused-by-stream"] += 1
                del error
                continue
            sent.append((channel, kind, body, subject, ack.stream, ack.seq, readers))
        stuck = await self.settled()
        if stuck:
            for channel, *_ in sent:
                self.figures.hangs[channel.subject] += 1
            self.figures.finding(type="hang", consumers=stuck[:10])
            return
        await asyncio.sleep(0.2)  # the last dead letters on their way
        for channel, kind, body, subject, stream, seq, readers in sent:
            self.judge(channel, kind, body, subject, stream, seq, readers)

    def judge(
        self,
        channel: Channel,
        kind: str,
        body: bytes,
        subject: str,
        stream: str,
        seq: int,
        readers: list[str],
    ) -> None:
        target = channel.subject
        letters = self.letters.pop((stream, seq), [])
        applied = [x for x in letters if x.kind == "apply"]
        excerpt = body[:300].decode("utf-8", "replace")
        if applied:  # a handler raised on every delivery: a crash
            self.figures.crashes[target] += 1
            self.figures.finding(
                type="crash",
                subject=target,
                kind=kind,
                body=excerpt,
                consumers=[x.consumer for x in applied],
                errors=[e.reason for x in applied for e in x.errors][:3],
            )
            return
        if valid(channel, body, subject):
            if letters:
                self.figures.other_failures[target] += 1
                self.figures.finding(
                    type="valid-refused",
                    subject=target,
                    kind=kind,
                    body=excerpt,
                    errors=[f"{e.field}: {e.reason}" for x in letters for e in x.errors][:3],
                )
            else:
                self.figures.valid_consumed[target] += 1
            return
        refused_by = {x.consumer for x in letters}
        named = all(x.errors and all(e.field and e.reason for e in x.errors) for x in letters)
        if set(readers) <= refused_by and named:
            self.figures.rejected_as_expected[target] += 1
        else:
            self.figures.other_failures[target] += 1
            self.figures.finding(
                type="malformed-taken",
                subject=target,
                kind=kind,
                body=excerpt,
                taken_by=sorted(set(readers) - refused_by),
            )

    async def close(self) -> None:
        await self.connection.drain()


async def fuzz_bus(
    nats_url: str,
    figures: Figures,
    per_subject: int,
    *,
    batch_size: int = 200,
    seed: int | None = None,
    progress: Callable[[Figures], None] | None = None,
    exited: Callable[[], list[str]] | None = None,
) -> None:
    """`per_subject` bodies for each consumed subject, interleaved, in batches each judged
    once the consumers settle. `exited` (a process stack's) ends the run at the first service
    process that died, recorded as a crash."""
    fuzzer = await BusFuzzer.start(nats_url, figures)
    try:
        pending: list[tuple[Channel, str, bytes]] = []
        for index, channel in enumerate(CONSUMED):
            # off the event loop, a subject at a time: a long run draws for minutes, and
            # Ctrl-C (a cancellation) is taken at the next subject
            figures.stage = f"drawing bus bodies {index + 1}/{len(CONSUMED)}"
            if progress:
                progress(figures)
            drawn = await asyncio.to_thread(
                draw_messages, channel, per_subject, None if seed is None else seed + index
            )
            pending += [(channel, kind, body) for kind, body in drawn]
        figures.stage = "bus"
        # interleaved, so every consumer sees a mix; crc32, unlike hash(), is the same in every
        # process, so a seed gives the same order twice
        pending.sort(key=lambda m: (zlib.crc32(m[2] + m[1].encode()), m[2], m[1]))
        for start in range(0, len(pending), batch_size):
            await fuzzer.run_batch(pending[start : start + batch_size])
            if progress:
                progress(figures)
            if exited is not None and died(figures, exited()):
                return
    finally:
        await fuzzer.close()


def died(figures: Figures, exits: list[str]) -> bool:
    """Records each service process that exited as a crash; whether there was one."""
    for exit_ in exits:
        figures.crashes["service process"] += 1
        figures.finding(type="crash", process=exit_)
    return bool(exits)


# ---------------------------------------------------------------- REST (schemathesis)

REST_CHECKS = (
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
)
REQUEST_TIMEOUT_S = 10.0


def fuzz_rest(
    gateway_url: str,
    figures: Figures,
    per_operation: int,
    *,
    total: int | None = None,
    headers: dict[str, str] | None = None,
    seed: int | None = None,
    progress: Callable[[Figures], None] | None = None,
    exited: Callable[[], list[str]] | None = None,
    stop: threading.Event | None = None,
) -> None:
    """schemathesis over the gateway's own OpenAPI document, each operation in positive and
    negative modes, `per_operation` requests each (or `total` shared among them); synchronous
    (run it off the event loop serving the gateway). Setting `stop` (Ctrl-C) ends it at the
    next request; `exited` as in `fuzz_bus`."""
    stop = stop or threading.Event()
    document = httpx.get(f"{gateway_url}/openapi.json", timeout=10).json()
    schema = schemathesis.openapi.from_dict(document)
    operations = [result.ok() for result in schema.get_all_operations()]
    if total is not None:
        per_operation = max(2, total // len(operations))
    for operation in operations:
        if stop.is_set():
            return
        figures.stage = f"REST {operation.method.upper()} {operation.path}"
        _fuzz_operation(operation, gateway_url, figures, per_operation, seed, headers or {}, stop)
        if progress:
            progress(figures)
        if stop.is_set() or (exited is not None and died(figures, exited())):
            return


def _fuzz_operation(
    operation: Any,
    gateway_url: str,
    figures: Figures,
    per_operation: int,
    seed: int | None,
    headers: dict[str, str],
    stop: threading.Event,
) -> None:
    from schemathesis.generation.modes import GenerationMode

    target = f"{operation.method.upper()} {operation.path}"
    if True:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(
                max_examples=max(1, per_operation // 2),
                database=None,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                derandomize=seed is None,
            )
            @given(operation.as_strategy(generation_mode=mode))
            def call(case: Any) -> None:
                if stop.is_set():  # the rest of hypothesis's examples pass as no-ops
                    return
                figures.tried[target] += 1
                try:
                    response = case.call(
                        base_url=gateway_url, headers=headers, timeout=REQUEST_TIMEOUT_S
                    )
                except Exception as error:  # a timeout or a dropped connection
                    figures.hangs[target] += 1
                    figures.finding(type="rest-hang", route=target, error=repr(error)[:300])
                    return
                figures.statuses[target][response.status_code] += 1
                if response.status_code >= 500:
                    figures.server_errors[target] += 1
                    figures.finding(
                        type="5xx",
                        route=target,
                        status=response.status_code,
                        request=_describe(case),
                        response=response.text[:300],
                    )
                    return
                try:
                    case.validate_response(response, checks=REST_CHECKS[1:])
                except (Exception, BaseExceptionGroup) as error:
                    figures.other_failures[target] += 1
                    figures.finding(
                        type="nonconforming",
                        route=target,
                        status=response.status_code,
                        request=_describe(case),
                        error=str(error)[:500],
                    )

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if seed is not None:
                    from hypothesis import seed as with_seed

                    with contextlib.suppress(Unsatisfiable):
                        with_seed(seed)(call)()
                else:
                    with contextlib.suppress(Unsatisfiable):  # no invalid input possible
                        call()


def _describe(case: Any) -> dict[str, Any]:
    body = getattr(case, "body", None)
    try:
        text = json.dumps(body)[:500]
    except (TypeError, ValueError):
        text = repr(body)[:500]
    return {
        "path": case.formatted_path,
        "query": case.query,
        "headers": {k: v for k, v in (case.headers or {}).items()},
        "body": text,
    }
