"""Each identity's NATS permissions, generated from the catalog so they cannot drift from it.

A service may publish the subjects the catalog names it a producer of, and subscribe to those
it consumes and the queries it answers; the JetStream API it is given is scoped to the streams
it touches (it declares them: each service ensures its own streams on start), the consumers on
them, and their acks. `render_server_config` writes the nats-server `authorization` block.

Identities are the six services, `admin` (the operator: `crater dead-letters`, the demo's
stand-in for AllData; everything), `inference` (inference replicas reporting latencies), and
one `node-<node_id>` per node whose agent (the probe in local mode) connects as that node: it
may report only on its own node's subjects, so a node's credential cannot speak for another.
The fleet-wide `probe` identity is the fleet simulator's (it reports for every node).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from crater.contracts.catalog import Channel, Streams, StreamSpec, Subjects
from crater.contracts.nodes import NODE_ID_PATTERN
from crater.contracts.queries import QuerySubjects

SERVICES = ("scheduler", "predictor", "callback", "autoscaler", "probe", "gateway")
ADMIN = "admin"
INFERENCE = "inference"
IDENTITIES = (*SERVICES, ADMIN, INFERENCE)
# A node's own identity: `node-<node_id>`, run by the probe (the node agent) of that node.
NODE_PREFIX = "node-"
AGENT = "probe"

# Who answers each request/reply query, and who asks (core NATS, not JetStream).
QUERY_ANSWERERS: Mapping[str, str] = {
    QuerySubjects.NODES: "scheduler",
    QuerySubjects.TASKS: "scheduler",
    QuerySubjects.PLACEMENT: "scheduler",
    QuerySubjects.TASK_PLACEMENT: "scheduler",
    QuerySubjects.ALLOCATION: "scheduler",
    QuerySubjects.AUDIT_EXPLAIN: "scheduler",
    QuerySubjects.POOLS: "scheduler",
    QuerySubjects.CONFIG_APPLY: "scheduler",
    QuerySubjects.PREDICTION: "predictor",
    QuerySubjects.RESOLVE: "predictor",
    QuerySubjects.USAGE: "predictor",
    QuerySubjects.FLEETS: "autoscaler",
    QuerySubjects.WEBHOOKS: "callback",
}
QUERY_ASKERS = ("gateway",)
# JetStream key-value buckets a service keeps (the gateway's accepted submission ids:
# crater.gateway.submissions.ACCEPTED_BUCKET).
KV_BUCKETS: Mapping[str, tuple[str, ...]] = {
    "gateway": ("crater_gateway_accepted",),
    # leader election (crater.runtime.leadership.LEASES_BUCKET)
    "scheduler": ("crater_leases",),
    "autoscaler": ("crater_leases",),
}
# What an identity watches live on core NATS (a plain subscription: no consumer, no ack, no
# history), and the streams whose latest message on a subject it reads: the gateway's web
# console (crater.gateway.console) refreshes its pages on these events (throttled) and reads
# each node's latest topology, health and metrics.
WATCHES: Mapping[str, tuple[str, ...]] = {
    "gateway": (
        *Streams.TASKS.subjects,
        *Streams.ALLOCATIONS.subjects,
        *Streams.NODE_TOPOLOGY.subjects,
        *Streams.NODE_TELEMETRY.subjects,
        Subjects.SCALE_DECIDED.wildcard,
        Subjects.INFERENCE_LATENCY.wildcard,
        *Streams.WEBHOOKS.subjects,
    ),
}
READS_LATEST: Mapping[str, tuple[str, ...]] = {
    "gateway": (Streams.NODE_TOPOLOGY.name, Streams.NODE_TELEMETRY.name),
}
INBOX = "_INBOX.>"


def actors(text: str) -> tuple[str, ...]:
    """The identities a catalog producer or consumer entry stands for: "scheduler (its own
    grants read back)" is the scheduler, "every consumer" each service that consumes. An entry
    that names no identity raises, so a new producer cannot go without a permission."""
    if text == "every consumer":
        return consuming_services()
    if text == "inference replicas":
        return (INFERENCE,)
    if text.startswith("crater dead-letters"):
        return (ADMIN,)
    name = text.split(" ", 1)[0]
    if name not in SERVICES:
        raise ValueError(f"catalog actor {text!r} is no known NATS identity")
    return (name,)


def consuming_services() -> tuple[str, ...]:
    named = {
        name
        for channel in Subjects.ALL
        for entry in channel.consumers
        if (name := entry.split(" ", 1)[0]) in SERVICES
    }
    return tuple(s for s in SERVICES if s in named)


def produced_by(identity: str) -> list[Channel]:
    return [c for c in Subjects.ALL if any(identity in actors(p) for p in c.producers)]


def consumed_by(identity: str) -> list[Channel]:
    return [c for c in Subjects.ALL if any(identity in actors(e) for e in c.consumers)]


def streams_of(identity: str) -> tuple[StreamSpec, ...]:
    """The catalog streams `identity` publishes to or consumes from: the ones it ensures. A
    node declares none (its permissions allow none): the services declare them."""
    if is_node_identity(identity):
        return ()
    used = {c.stream.name for c in (*produced_by(identity), *consumed_by(identity))}
    return tuple(s for s in Streams.ALL if s.name in used)


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    allow_responses: bool = False  # may reply to requests it received (query answerers)

    def as_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "publish": {"allow": list(self.publish)},
            "subscribe": {"allow": list(self.subscribe)},
        }
        if self.allow_responses:
            config["allow_responses"] = True
        return config


def _unique(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


def _stream_api(stream: str) -> list[str]:
    return [f"$JS.API.STREAM.{verb}.{stream}" for verb in ("CREATE", "UPDATE", "INFO")]


def _consumer_api(stream: str) -> list[str]:
    return [
        f"$JS.API.CONSUMER.INFO.{stream}.*",
        f"$JS.API.CONSUMER.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.*",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*",
        f"$JS.ACK.{stream}.>",
    ]


def _latest_api(stream: str) -> list[str]:
    """Read one stored message of `stream` (the latest on a subject), nothing else."""
    return [f"$JS.API.STREAM.MSG.GET.{stream}", f"$JS.API.DIRECT.GET.{stream}.>"]


def _kv(bucket: str) -> list[str]:
    stream = f"KV_{bucket}"
    return [
        f"$KV.{bucket}.>",
        *_stream_api(stream),
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
    ]


def node_identity(node_id: str) -> str:
    """`node-<node_id>`; a node id with a dot or a wildcard would widen its subjects: refused."""
    if not re.fullmatch(NODE_ID_PATTERN, node_id):
        raise ValueError(f"node id {node_id!r} does not match {NODE_ID_PATTERN}")
    return f"{NODE_PREFIX}{node_id}"


def is_node_identity(identity: str) -> bool:
    return identity.startswith(NODE_PREFIX)


def agent_consumer(node_id: str) -> str:
    """The prefix of a node agent's durable consumers: its own, named for its node."""
    return f"agent-{node_id}"


def _node_consumer_api(stream: str, durable: str) -> list[str]:
    # nats-py creates a durable as CONSUMER.CREATE.<stream>.<name>[.<filter>]; older servers
    # and clients use DURABLE.CREATE.
    return [
        f"$JS.API.CONSUMER.INFO.{stream}.{durable}",
        f"$JS.API.CONSUMER.CREATE.{stream}.{durable}",
        f"$JS.API.CONSUMER.CREATE.{stream}.{durable}.>",
        f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.{durable}",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{durable}",
        f"$JS.ACK.{stream}.{durable}.>",
    ]


def node_permissions(node_id: str) -> Permissions:
    """What node `node_id`'s agent may do: publish what the probe produces, node-scoped
    subjects only for its own node (task.status, rejections and dead letters as they are);
    use its own durable consumers (the executing agent's, `probe-agent-<node_id>-...`) and
    their acks; no stream API: it declares nothing."""
    node_identity(node_id)
    publish = [c.for_node(node_id) if c.node_scoped else c.subject for c in produced_by(AGENT)]
    for channel in consumed_by(AGENT):
        durable = f"{AGENT}-{agent_consumer(node_id)}-{channel.short_name}"
        publish += _node_consumer_api(channel.stream.name, durable)
    return Permissions(_unique(publish), (INBOX,))


def permissions_for(identity: str) -> Permissions:
    """What `identity` may publish and subscribe to."""
    if is_node_identity(identity):
        return node_permissions(identity.removeprefix(NODE_PREFIX))
    if identity == ADMIN:
        return Permissions(publish=(">",), subscribe=(">",))
    if identity not in IDENTITIES:
        raise ValueError(f"unknown NATS identity {identity!r}")
    produced, consumed = produced_by(identity), consumed_by(identity)
    streams = [s.name for s in streams_of(identity)]
    consumed_streams = _unique(c.stream.name for c in consumed)
    answers = [q for q, who in QUERY_ANSWERERS.items() if who == identity]
    asks = list(QUERY_ANSWERERS) if identity in QUERY_ASKERS else []
    buckets = KV_BUCKETS.get(identity, ())
    publish = [
        *(c.wildcard for c in produced),
        *asks,
        *(api for s in streams for api in _stream_api(s)),
        *(api for s in consumed_streams for api in _consumer_api(s)),
        *(api for b in buckets for api in _kv(b)),
        *(api for s in READS_LATEST.get(identity, ()) for api in _latest_api(s)),
    ]
    subscribe = [
        *(c.wildcard for c in consumed),
        *answers,
        *(f"$KV.{b}.>" for b in buckets),
        *WATCHES.get(identity, ()),
        INBOX,
    ]
    return Permissions(_unique(publish), _unique(subscribe), allow_responses=bool(answers))


def all_permissions(nodes: Iterable[str] = ()) -> dict[str, Permissions]:
    """Every service identity's permissions, and those of each node in `nodes`."""
    identities = (*IDENTITIES, *(node_identity(n) for n in nodes))
    return {identity: permissions_for(identity) for identity in identities}


def authorization_block(passwords: Mapping[str, str], nodes: Iterable[str] = ()) -> dict[str, Any]:
    """The nats-server `authorization` block: one user per identity (and per node in `nodes`)
    that has a password, each with its own permissions."""
    return {
        "users": [
            {"user": who, "password": passwords[who], **{"permissions": p.as_config()}}
            for who, p in all_permissions(nodes).items()
            if who in passwords
        ]
    }


def render_server_config(
    passwords: Mapping[str, str],
    *,
    nodes: Iterable[str] = (),
    tls_cert: str | None = None,
    tls_key: str | None = None,
    tls_ca: str | None = None,
) -> str:
    """A nats-server configuration (its syntax accepts JSON) with the users (a `node-<id>` user
    for each of `nodes`) and, given a certificate and key, TLS required of every client. Host,
    port and JetStream come from the command line. Adding a node: render again with it, and
    reload the server (`nats-server --signal reload`)."""
    config: dict[str, Any] = {"authorization": authorization_block(passwords, nodes)}
    if tls_cert and tls_key:
        tls: dict[str, Any] = {"cert_file": tls_cert, "key_file": tls_key, "timeout": 5}
        if tls_ca:
            tls["ca_file"] = tls_ca
        config["tls"] = tls
    return json.dumps(config, indent=2) + "\n"
