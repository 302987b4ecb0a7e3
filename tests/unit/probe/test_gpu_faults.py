"""Card faults read through NVML (the fake driver) and what each asks of the scheduler: Xid
events by NVIDIA's catalog, uncorrected ECC, retired pages pending, a failed row remap, a
card off the bus, and the readings that only lower a card's rank."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from crater.contracts import (
    GpuFault,
    GpuFaultAction,
    GpuFaultKind,
    NodeCondition,
    NodeHealthReported,
)
from crater.probe.adapters.nvml import GpuSampler
from crater.probe.domain.faults import DEFAULT_XID_ACTIONS, FaultTracker, parse_action
from crater.probe.domain.health import CHECK_GPU_FAULTS, evaluate
from crater.probe.service_layer.nodes import FleetNodes
from crater.probe.settings import ProbeSettings
from crater.probe.sim.fleet import FleetError, open_fleet
from crater.probe.sim.simulation import FleetSimulator
from tests.support.topologies import node
from tests.unit.probe.fake_nvml import Card, FakeNvml, nvlink_pair, pcie_only

T0 = datetime(2026, 12, 3, 9, 0, tzinfo=UTC)


def sampler(cards: list[Card]) -> GpuSampler:
    gpus = GpuSampler(FakeNvml(cards))
    assert gpus.open()
    return gpus


def read(gpus: GpuSampler, tracker: FaultTracker, at: datetime = T0) -> list[GpuFault]:
    gpus.sample()  # finds lost cards, as each metrics round does
    faults, _ = tracker.update(gpus.signals(), None, node("n1", gpus=4), at)
    return faults


def test_the_default_table_follows_the_catalog_buckets() -> None:
    actions = DEFAULT_XID_ACTIONS
    assert {c for c, a in actions.items() if a is GpuFaultAction.NONE} == {
        13,
        31,
        43,
        45,
        63,
        92,
        94,
        154,
    }
    assert actions[79] is GpuFaultAction.REBOOT_NODE  # fallen off the bus: RESTART_BM
    assert actions[61] is GpuFaultAction.OPERATOR  # CONTACT_SUPPORT
    for code in (46, 48, 62, 64, 74, 95, 109, 119, 120, 140, 143):
        assert actions[code] is GpuFaultAction.RESET_CARD, code


def test_xid_events_are_read_per_card_and_an_application_fault_cordons_nothing() -> None:
    cards = pcie_only(4)
    cards[2].xids = [13, 48]
    gpus = sampler(cards)
    tracker = FaultTracker()
    faults = read(gpus, tracker)
    assert [(f.gpu, f.kind, f.xid, f.action) for f in faults] == [
        (2, GpuFaultKind.XID, 48, GpuFaultAction.RESET_CARD)
    ]
    assert tracker.counted == {(13, "none", True): 1, (48, "reset-card", True): 1}
    # An Xid is an event: the fault is kept, with its first time, until the probe restarts.
    again = read(gpus, tracker, T0 + timedelta(seconds=5))
    assert again == faults
    assert again[0].since == T0


def test_an_unknown_xid_is_counted_reported_and_handled_by_the_unknown_action() -> None:
    cards = pcie_only(2)
    cards[1].xids = [250]
    gpus = sampler(cards)
    tracker = FaultTracker()
    faults, seen = tracker.update(gpus.signals(), None, node("n1", gpus=2), T0)
    assert [(s.code, s.known, s.action) for s in seen] == [(250, False, GpuFaultAction.RESET_CARD)]
    assert faults[0].xid == 250
    assert "not in the Xid table" in faults[0].detail
    assert tracker.counted[(250, "reset-card", False)] == 1
    quiet = FaultTracker(unknown_action=GpuFaultAction.NONE)
    cards[1].xids = [250]
    faults, seen = quiet.update(gpus.signals(), None, node("n1", gpus=2), T0)
    assert faults == []
    assert [s.known for s in seen] == [False]


def test_the_operator_table_overrides_the_default_and_a_bad_entry_is_refused() -> None:
    settings = ProbeSettings(
        xid_actions={13: "RESET_GPU", 79: "reset-card"}, xid_unknown_action="operator"
    )
    table, unknown = settings.xid_table()
    assert table[13] is GpuFaultAction.RESET_CARD
    assert table[79] is GpuFaultAction.RESET_CARD
    assert table[48] is GpuFaultAction.RESET_CARD  # the rest of the default stays
    assert unknown is GpuFaultAction.OPERATOR
    with pytest.raises(ValidationError, match=r"xid_actions\.13: 'reboot' is none of"):
        ProbeSettings(xid_actions={13: "reboot"})
    with pytest.raises(ValidationError, match="xid_unknown_action"):
        ProbeSettings(xid_unknown_action="panic")
    assert parse_action("CONTACT_SUPPORT") is GpuFaultAction.OPERATOR


def test_a_card_off_the_bus_is_lost_and_takes_the_node_out() -> None:
    cards = pcie_only(3)
    cards[1].lost = True
    gpus = sampler(cards)
    faults = read(gpus, FaultTracker())
    assert [(f.gpu, f.kind, f.action) for f in faults] == [
        (1, GpuFaultKind.LOST, GpuFaultAction.REBOOT_NODE)
    ]
    assessment = evaluate(node("n1", gpus=3), None, faults=faults)
    assert assessment.condition is NodeCondition.NOT_READY
    check = next(r for r in assessment.results if r.name == CHECK_GPU_FAULTS)
    assert not check.passed
    assert "GPU 1" in check.detail
    assert "reboot-node" in check.detail
    # The card answers again (the node was rebooted): no fault, a new one is new.
    cards[1].lost = False
    assert read(gpus, FaultTracker()) == []


def test_memory_faults_pending_pages_and_a_failed_remap() -> None:
    cards = pcie_only(3)
    cards[0].pages_pending = True
    cards[2].remap = (0, 3, 0, 1)
    gpus = sampler(cards)
    faults = read(gpus, FaultTracker())
    assert [(f.gpu, f.kind, f.action) for f in faults] == [
        (0, GpuFaultKind.PAGES_PENDING_RETIREMENT, GpuFaultAction.RESET_CARD),
        (2, GpuFaultKind.ROW_REMAP_FAILURE, GpuFaultAction.OPERATOR),
    ]
    # A card-level fault degrades the node; the card is cordoned by the scheduler.
    assessment = evaluate(node("n1", gpus=3), None, faults=faults)
    assert assessment.condition is NodeCondition.DEGRADED
    cards[0].pages_pending = None  # NotSupported (row remapping cards): no fault
    cards[2].remap = None
    assert read(gpus, FaultTracker()) == []


def test_a_link_down_is_a_reading_that_cordons_nothing() -> None:
    cards = nvlink_pair()
    gpus = sampler(cards)
    assert read(gpus, FaultTracker()) == []
    cards[0].links_down = 2
    faults = read(gpus, FaultTracker())
    assert [(f.gpu, f.kind, f.action) for f in faults] == [
        (0, GpuFaultKind.NVLINK_DEGRADED, GpuFaultAction.NONE)
    ]
    check = evaluate(node("n1", gpus=2), None, faults=faults).results[-1]
    assert check.name == CHECK_GPU_FAULTS
    assert check.passed


def test_a_malformed_fault_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="xid is given with kind xid"):
        GpuFault(gpu=0, kind="xid", action="reset-card", since=T0)
    with pytest.raises(ValidationError, match="a hot reading has action none"):
        GpuFault(gpu=0, kind="hot", action="reset-card", since=T0)
    with pytest.raises(ValidationError, match="gpu"):
        GpuFault(gpu=-1, kind="lost", action="reboot-node", since=T0)


def test_a_heartbeat_without_faults_reads_byte_for_byte_as_before() -> None:
    event = NodeHealthReported(node_id="n1", condition="Ready", score=100)
    assert "gpu_faults" not in event.model_dump_json()
    fault = GpuFault(gpu=1, kind="lost", action="reboot-node", since=T0)
    carried = event.model_copy(update={"gpu_faults": [fault]})
    text = carried.model_dump_json()
    assert NodeHealthReported.model_validate_json(text).gpu_faults == [fault]


async def test_a_simulated_xid_is_delivered_once_and_kept_in_the_heartbeat(tmp_path: Path) -> None:
    fleet = tmp_path / "xid.yaml"
    fleet.write_text(
        "seed: 3\nnodes:\n  - {profile: dgx-a100-8, count: 1}\n"
        "faults:\n  - {node: a100-01, kind: xid, at_seconds: 10, gpu: 3, xid: 79}\n"
    )
    spec = open_fleet(fleet)
    simulator = FleetSimulator(spec.nodes, spec.seed, spec.faults)
    clock = [0.0]
    nodes = FleetNodes(simulator, clock=lambda: clock[0])
    await nodes.open()
    [[calm]] = list(nodes.health(10))
    assert calm.gpu_faults is None  # a calm simulated node reads as it always has
    clock[0] = 11.0
    [[faulty]] = list(nodes.health(10))
    assert [(f.gpu, f.xid, f.action) for f in faulty.gpu_faults or []] == [
        (3, 79, GpuFaultAction.REBOOT_NODE)
    ]
    assert faulty.condition is NodeCondition.NOT_READY
    assert simulator.xid_events("a100-01") == {}  # delivered once
    clock[0] = 12.0
    [[still]] = list(nodes.health(10))
    assert still.gpu_faults == faulty.gpu_faults  # kept, with its first time
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "seed: 3\nnodes:\n  - {profile: dgx-a100-8, count: 1}\n"
        "faults:\n  - {node: a100-01, kind: ecc, gpu: 3, xid: 79}\n"
    )
    with pytest.raises(FleetError, match="xid is given with kind xid"):
        open_fleet(bad)
