"""The NATS permissions generated from the catalog: every producer may publish what it
produces, and nobody else may."""

from __future__ import annotations

import json

import pytest

from crater.contracts import Subjects
from crater.contracts.queries import QuerySubjects
from crater.runtime.nats_permissions import (
    ADMIN,
    IDENTITIES,
    QUERY_ANSWERERS,
    SERVICES,
    actors,
    agent_consumer,
    node_identity,
    permissions_for,
    render_server_config,
    streams_of,
)


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` one token, `>` the rest."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


def may_publish(identity: str, subject: str) -> bool:
    return any(matches(p, subject) for p in permissions_for(identity).publish)


def example(channel_subject: str, node_scoped: bool) -> str:
    return f"{channel_subject}.node-1" if node_scoped else channel_subject


@pytest.mark.parametrize("channel", Subjects.ALL, ids=lambda c: c.subject)
def test_every_catalog_producer_may_publish_its_channel(channel: object) -> None:
    from crater.contracts.catalog import Channel

    assert isinstance(channel, Channel)
    assert channel.producers, f"{channel.subject} names no producer"
    subject = example(channel.subject, channel.node_scoped)
    for producer in channel.producers:
        for identity in actors(producer):  # raises for a producer that is no identity
            assert may_publish(identity, subject), (identity, subject)


@pytest.mark.parametrize("channel", Subjects.ALL, ids=lambda c: c.subject)
def test_no_service_publishes_a_channel_it_does_not_produce(channel: object) -> None:
    from crater.contracts.catalog import Channel

    assert isinstance(channel, Channel)
    producers = {who for p in channel.producers for who in actors(p)}
    subject = example(channel.subject, channel.node_scoped)
    for identity in SERVICES:
        assert may_publish(identity, subject) == (identity in producers), (identity, subject)


def test_consumers_may_read_their_channels_and_their_streams() -> None:
    for channel in Subjects.ALL:
        for consumer in channel.consumers:
            for identity in actors(consumer):
                if identity == ADMIN:
                    continue
                allowed = permissions_for(identity)
                assert channel.wildcard in allowed.subscribe
                stream = channel.stream.name
                assert f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*" in allowed.publish
                assert f"$JS.ACK.{stream}.>" in allowed.publish
                assert channel.stream in streams_of(identity)


def test_the_probe_may_not_grant_and_the_gateway_may_not_report_health() -> None:
    assert not may_publish("probe", Subjects.ALLOCATION_GRANTED.subject)
    assert may_publish("probe", Subjects.NODE_HEALTH.for_node("x"))
    assert not may_publish("gateway", Subjects.NODE_HEALTH.for_node("x"))
    assert may_publish("gateway", Subjects.TASK_SUBMITTED.subject)


def test_queries_are_answered_by_their_owner_and_asked_by_the_gateway() -> None:
    every_query = {v for k, v in vars(QuerySubjects).items() if k.isupper()}
    assert set(QUERY_ANSWERERS) == every_query
    for subject, answerer in QUERY_ANSWERERS.items():
        assert subject in permissions_for(answerer).subscribe
        assert permissions_for(answerer).allow_responses
        assert may_publish("gateway", subject)
        assert not may_publish("probe", subject)


def test_the_gateway_keeps_its_bucket() -> None:
    from crater.gateway.submissions import ACCEPTED_BUCKET

    assert may_publish("gateway", f"$KV.{ACCEPTED_BUCKET}.some-key")
    assert not may_publish("scheduler", f"$KV.{ACCEPTED_BUCKET}.some-key")


def test_an_unknown_actor_is_refused() -> None:
    with pytest.raises(ValueError, match="no known NATS identity"):
        actors("billing")


def test_the_server_config_has_one_user_per_identity_and_tls() -> None:
    passwords = {who: f"pw-{who}" for who in IDENTITIES}
    config = json.loads(render_server_config(passwords, tls_cert="s.pem", tls_key="s.key"))
    users = {u["user"]: u for u in config["authorization"]["users"]}
    assert set(users) == set(IDENTITIES)
    assert users["probe"]["password"] == "pw-probe"
    assert "crater.v1.node.health.*" in users["probe"]["permissions"]["publish"]["allow"]
    assert config["tls"] == {"cert_file": "s.pem", "key_file": "s.key", "timeout": 5}


def test_a_node_publishes_its_own_reports_and_task_status_only() -> None:
    me = node_identity("node-a")
    assert me == "node-node-a"
    for channel in (Subjects.NODE_TOPOLOGY, Subjects.NODE_METRICS, Subjects.NODE_HEALTH):
        assert may_publish(me, channel.for_node("node-a"))
        assert not may_publish(me, channel.for_node("node-b"))
    assert may_publish(me, Subjects.TASK_STATUS.subject)
    assert may_publish(me, Subjects.MESSAGE_REJECTED.subject)  # its consumers refuse too
    for channel in Subjects.ALL:
        if channel.producers and not any("probe" in actors(p) for p in channel.producers):
            assert not may_publish(me, example(channel.subject, channel.node_scoped)), channel
    assert permissions_for(me).subscribe == ("_INBOX.>",)
    assert not permissions_for(me).allow_responses


def test_a_node_uses_only_its_own_durables_and_declares_no_stream() -> None:
    me = node_identity("node-a")
    mine = f"probe-{agent_consumer('node-a')}-{Subjects.ALLOCATION_GRANTED.short_name}"
    assert may_publish(me, f"$JS.API.CONSUMER.MSG.NEXT.CRATER_ALLOCATIONS.{mine}")
    assert may_publish(me, f"$JS.ACK.CRATER_ALLOCATIONS.{mine}.1.2.3.4.5")
    theirs = mine.replace("node-a", "node-b")
    assert not may_publish(me, f"$JS.API.CONSUMER.MSG.NEXT.CRATER_ALLOCATIONS.{theirs}")
    assert not may_publish(me, "$JS.API.CONSUMER.MSG.NEXT.CRATER_ALLOCATIONS.scheduler-x")
    assert not any(p.startswith("$JS.API.STREAM.") for p in permissions_for(me).publish)
    assert streams_of(me) == ()


@pytest.mark.parametrize("bad", ["a.b", "*", ">", "", "node a", "-x"])
def test_a_node_id_that_would_widen_its_subjects_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="node id"):
        node_identity(bad)


def test_the_server_config_has_a_user_per_node_given() -> None:
    passwords = {who: f"pw-{who}" for who in (*IDENTITIES, "node-a1", "node-b2")}
    config = json.loads(render_server_config(passwords, nodes=("a1",)))
    users = {u["user"]: u for u in config["authorization"]["users"]}
    assert set(users) == {*IDENTITIES, "node-a1"}  # b2 has a password but was not given
    allowed = users["node-a1"]["permissions"]["publish"]["allow"]
    assert "crater.v1.node.health.a1" in allowed
    assert "crater.v1.node.health.*" not in allowed


def may_subscribe(identity: str, subject: str) -> bool:
    return any(matches(p, subject) for p in permissions_for(identity).subscribe)


def test_the_gateway_watches_what_its_console_shows_and_reads_only_latest_messages() -> None:
    for subject in (
        Subjects.TASK_PENDING.subject,
        Subjects.ALLOCATION_GRANTED.subject,
        Subjects.NODE_HEALTH.for_node("a100-01"),
        Subjects.NODE_METRICS.for_node("a100-01"),
        Subjects.SCALE_DECIDED.subject,
        Subjects.WEBHOOK_DELIVERED.subject,
        Subjects.INFERENCE_LATENCY.subject,
    ):
        assert may_subscribe("gateway", subject), subject
    assert not may_subscribe("gateway", Subjects.TASK_USAGE.subject)
    assert not may_subscribe("probe", Subjects.TASK_PENDING.subject)
    for stream in ("CRATER_NODE_TOPOLOGY", "CRATER_NODE_TELEMETRY"):
        assert may_publish("gateway", f"$JS.API.STREAM.MSG.GET.{stream}")
    assert not may_publish("gateway", "$JS.API.STREAM.MSG.GET.CRATER_TASKS")
    assert not may_publish("gateway", "$JS.API.STREAM.PURGE.CRATER_NODE_TELEMETRY")
