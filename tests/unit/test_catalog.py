"""The catalog tells the truth: each channel's consumers are the services that really
subscribe to it (the durable consumers each service's `build()` registers), and each producer
it names really makes its event."""

from __future__ import annotations

import ast
import importlib
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from crater.callback.app import LIFECYCLE_CHANNELS, NUMBERED_ELSEWHERE
from crater.contracts import Channel, StreamSpec, Subjects
from crater.runtime import batches, bus

SERVICES = ("probe", "predictor", "scheduler", "autoscaler", "callback", "gateway")
# Named in the catalog, but not services: the CLI, inference replicas, every consumer.
OUTSIDERS = ("crater dead-letters", "inference replicas", "every consumer")
# Services with one consumer for a whole stream, and the subjects of it they handle.
STREAM_WIDE = {"callback": set(LIFECYCLE_CHANNELS) | set(NUMBERED_ELSEWHERE)}
ROOT = Path(__file__).resolve().parents[2]


def _settings(service: str, tmp_path: Path) -> list[dict[str, Any]]:
    common = {"database_url": f"sqlite+aiosqlite:///{tmp_path / service}.db"}
    if service == "probe":  # each mode subscribes for its own runner
        return [
            {**common, "mode": "local"},
            {**common, "mode": "fleet"},
            {**common, "execute": True, "node_id": "n1", "state_dir": tmp_path / "agent"},
        ]
    return [common]


@pytest.fixture(scope="module")
def subscriptions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """Each service's durable consumers' subjects, as its `build()` registers them."""
    tmp_path = tmp_path_factory.mktemp("catalog")
    found: dict[str, set[str]] = defaultdict(set)
    registering = bus._pull_consumer
    current: list[str] = []

    def recorded(broker: Any, subject: str, *args: Any, **kwargs: Any) -> Any:
        found[current[0]].add(subject)
        return registering(broker, subject, *args, **kwargs)

    consuming = batches.BatchConsumer  # the batch consumers (batch_durable) make these

    def recorded_batch(
        broker: Any, channel: Channel | StreamSpec, *args: Any, **kwargs: Any
    ) -> Any:
        # A channel's subjects, or a whole stream's (batch_durable_stream)
        found[current[0]].add(
            channel.wildcard if isinstance(channel, Channel) else channel.subjects[0]
        )
        return consuming(broker, channel, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bus, "_pull_consumer", recorded)
        patch.setattr(batches, "BatchConsumer", recorded_batch)
        for service in SERVICES:
            app = importlib.import_module(f"crater.{service}.app")
            (settings_class,) = (
                value
                for name, value in vars(app).items()
                if name.endswith("Settings") and getattr(value, "service", None) == service
            )
            current[:] = [service]
            for settings in _settings(service, tmp_path):
                app.build(settings_class(**settings))
    return found


def _named(entries: tuple[str, ...]) -> set[str]:
    """The services an entry names ("probe (simulated fleet: ...)" names the probe)."""
    for entry in entries:
        assert entry.split(" (")[0] in SERVICES or entry.startswith(OUTSIDERS), entry
    return {entry.split(" (")[0] for entry in entries} & set(SERVICES)


def _consumers(channel: Channel, subscriptions: dict[str, set[str]]) -> set[str]:
    real = set()
    for service, subjects in subscriptions.items():
        if channel.wildcard in subjects:
            real.add(service)
        stream_wide = {s for s in subjects & set(channel.stream.subjects) if s.endswith(".>")}
        if stream_wide:
            assert service in STREAM_WIDE, f"{service} consumes {stream_wide}: say what of it"
            if channel.subject in STREAM_WIDE[service]:
                real.add(service)
    return real


def test_every_consumer_the_catalog_names_subscribes_and_no_other(
    subscriptions: dict[str, set[str]],
) -> None:
    wrong = {
        channel.subject: {"catalog": _named(channel.consumers), "real": real}
        for channel in Subjects.ALL
        if _named(channel.consumers) != (real := _consumers(channel, subscriptions))
    }
    assert wrong == {}


def test_every_subscription_is_to_a_catalog_channel(subscriptions: dict[str, set[str]]) -> None:
    known = {c.wildcard for c in Subjects.ALL}
    known |= {s for c in Subjects.ALL for s in c.stream.subjects}
    assert {s for subjects in subscriptions.values() for s in subjects} <= known


def _used(service: str) -> set[str]:
    """The names a service's source uses (not only imports): the event classes it makes,
    parses or hands on among them."""
    used = set()
    for path in (ROOT / "services" / service / "src").rglob("*.py"):
        used |= {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
    return used


def test_every_producer_the_catalog_names_makes_the_event() -> None:
    """One way only: a service also uses events it does not publish (those it consumes, its
    simulator's), which a look at its source cannot tell apart."""
    made = {service: _used(service) for service in SERVICES}
    wrong = {
        channel.subject: sorted(missing)
        for channel in Subjects.ALL
        if (
            missing := {
                s for s in _named(channel.producers) if channel.event.__name__ not in made[s]
            }
        )
    }
    assert wrong == {}
