"""A three-server NATS cluster with JetStream, R3 streams: the server that leads the stream is
SIGKILLed while events flow through Crater's own publish path (`publish_raw`: its retry on
what a leader election answers); a consumer then sees every event exactly once. The longest
gap between publish acks is measured and printed (only the 0 lost is asserted). Once on
loopback, once with each server on a host of its own (a network namespace). And a leader's
consumers bound right after the server that led one of them was lost."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nats.js.api import AckPolicy, ConsumerConfig
from prometheus_client import CollectorRegistry

from crater.contracts import Streams, Subjects, TaskStatus, TaskStatusReported
from crater.runtime.bus import (
    ENSURE_STREAMS_SECONDS,
    durable,
    ensure_streams,
    key_value,
    make_broker,
    publish_raw,
    retry_transient,
)
from crater.runtime.leadership import CONSUMER_WAIT_SECONDS, LeaderGate
from crater.runtime.nats_cluster import NatsCluster, netns_permitted, start_nats_cluster
from crater.runtime.nats_connection import NatsConnection

pytestmark = pytest.mark.integration

STREAM = Streams.TASKS
KILL_AFTER_SECONDS = 1.0
AFTER_KILL_SECONDS = 5.0
RATE_PER_SECOND = 50

NETNS_REFUSED = netns_permitted()


@pytest.fixture(
    params=[
        "loopback",
        pytest.param(
            "netns",
            marks=pytest.mark.skipif(NETNS_REFUSED is not None, reason=str(NETNS_REFUSED)),
        ),
    ]
)
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[NatsCluster]:
    with start_nats_cluster(
        tmp_path / "cluster", 3, netns=request.param == "netns", log_dir=tmp_path / "logs"
    ) as started:
        yield started


async def test_losing_the_stream_leader_loses_nothing(cluster: NatsCluster) -> None:
    seeds = NatsConnection(cluster.url)
    assert await ensure_streams(seeds, [STREAM]) == 3  # auto: R3 on a cluster
    admin = await seeds.connect()
    js = admin.jetstream()
    info = await js.stream_info(STREAM.name)
    assert info.config.num_replicas == 3
    assert info.cluster is not None
    assert info.cluster.leader is not None
    leader = cluster.index_of(info.cluster.leader)

    broker, _ = make_broker(seeds, "cluster-test", CollectorRegistry(), None)
    await broker.connect()
    acked: list[float] = []
    published = 0
    started = time.monotonic()
    killed_at: float | None = None
    try:
        while time.monotonic() - started < KILL_AFTER_SECONDS + AFTER_KILL_SECONDS:
            if killed_at is None and time.monotonic() - started >= KILL_AFTER_SECONDS:
                cluster.kill(leader)
                killed_at = time.monotonic()
            await publish_raw(
                broker,
                subject=f"crater.v1.task.cluster-test.{published}",
                stream=STREAM.name,
                payload=str(published).encode(),
                event_id=f"cluster-test-{published}",
                traceparent=None,
            )
            acked.append(time.monotonic())
            published += 1
            await asyncio.sleep(1 / RATE_PER_SECOND)
    finally:
        await broker.stop()

    seen: list[int] = []
    # The test's own JetStream API call is retried as the services retry theirs: made right
    # after the kill, it may land while the meta leader is still being elected.
    subscription = await retry_transient(
        lambda: js.pull_subscribe(
            "crater.v1.task.cluster-test.>",
            durable="cluster-test",
            stream=STREAM.name,
            config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT),
        ),
        what="the test's consumer",
    )
    deadline = time.monotonic() + 30
    while len(seen) < published and time.monotonic() < deadline:
        try:
            messages = await subscription.fetch(500, timeout=2)
        except TimeoutError:
            continue
        for message in messages:
            seen.append(int(message.data))
            await message.ack()
    await admin.close()

    gaps = [b - a for a, b in itertools.pairwise(acked)]
    longest = max(gaps)
    print(
        f"\n{'netns' if cluster.hosts else 'loopback'}: {published} published, "
        f"{len(seen)} seen, {len(set(seen))} distinct; leader {cluster.names[leader]} killed; "
        f"longest gap between publish acks {longest:.2f} s"
    )
    assert sorted(seen) == list(range(published))  # every one, exactly once: 0 lost


async def test_a_new_leader_binds_its_consumers_once_they_elect_after_a_server_loss(
    tmp_path: Path,
) -> None:
    # A takeover right after a NATS server's loss (the leader scheduler's host lost): the
    # consumer whose raft leader was there answers nothing until the others elect one, and a
    # lookup sent meanwhile waited out nats-py's 5 s timeout and failed the takeover. The gate
    # looks again and again with a short timeout and binds once it answers.
    with start_nats_cluster(tmp_path / "cluster", 3, log_dir=tmp_path / "logs") as cluster:
        seeds = NatsConnection(cluster.url)
        await ensure_streams(seeds, [STREAM])
        broker, _ = make_broker(seeds, "gate-test", CollectorRegistry(), None)
        gate = LeaderGate(broker)
        seen: list[str] = []

        @durable(broker, Subjects.TASK_STATUS, "gate-test", router=gate.router)
        async def on_status(event: TaskStatusReported) -> None:
            seen.append(event.task_id)

        await broker.start()
        try:
            await gate.open()  # the first leader makes the consumer
            await gate.close()
            [(stream, name)] = gate.durables()
            admin = await seeds.connect()
            info = await admin.jetstream().consumer_info(stream, name)
            await admin.close()
            assert info.cluster is not None
            assert info.cluster.leader is not None
            cluster.kill(cluster.index_of(info.cluster.leader))
            started = time.monotonic()
            await gate.open()
            took = time.monotonic() - started
            event = TaskStatusReported(task_id="after-the-loss", status=TaskStatus.RUNNING)
            await publish_raw(
                broker,
                subject=Subjects.TASK_STATUS.subject,
                stream=stream,
                payload=event.model_dump_json().encode(),
                event_id=str(event.event_id),
                traceparent=None,
            )
            for _ in range(100):
                if seen:
                    break
                await asyncio.sleep(0.1)
            print(f"\nconsumer leader {info.cluster.leader} killed: bound after {took:.2f} s")
            assert seen == ["after-the-loss"]
            assert took < CONSUMER_WAIT_SECONDS
        finally:
            await gate.close()
            await broker.stop()


async def test_a_kv_bucket_is_declared_once_the_cluster_has_a_quorum_again(
    tmp_path: Path,
) -> None:
    # A service starting while its cluster has no meta leader (started together, or two of
    # three servers lost) is answered 503 or nothing: declaring its KV bucket waits for the
    # quorum instead of failing the service's start.
    with start_nats_cluster(tmp_path / "cluster", 3, log_dir=tmp_path / "logs") as cluster:
        seeds = NatsConnection(cluster.url)
        await ensure_streams(seeds, [STREAM])
        cluster.kill(1)
        cluster.kill(2)
        broker, _ = make_broker(
            NatsConnection(cluster.urls[0]), "kv-test", CollectorRegistry(), None
        )
        await broker.connect()
        try:
            declaring = asyncio.create_task(key_value(broker, "CRATER_KV_TEST", 0, history=1))
            await asyncio.sleep(3.0)
            assert not declaring.done()  # no quorum: still waiting, not failed
            cluster.restart(1)
            cluster.restart(2)
            bucket = await asyncio.wait_for(declaring, ENSURE_STREAMS_SECONDS)
            await bucket.put("k", b"v")
            assert (await bucket.get("k")).value == b"v"
            admin = await seeds.connect()
            info = await admin.jetstream().stream_info("KV_CRATER_KV_TEST")
            await admin.close()
            assert info.config.num_replicas == 3
        finally:
            await broker.stop()
