"""A node's place in the network fabric, as a probe declares it: read off the node's labels
(CRATER_PROBE_LABELS in local mode, a fleet file's labels in fleet mode); a bad value stops
the probe at start, naming the label."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from crater.contracts import FabricPlace
from crater.probe.app import ProbeSettings
from crater.probe.sim.fleet import FleetError, load_fleet

FLEET = """
name: topo
seed: 7
nodes:
  - {profile: a100-pcie-4, count: 2, prefix: la, labels: {crater.ai/spine-switch: s1,
     crater.ai/leaf-switch: leaf-a, crater.ai/nvlink-domain: nvl-1}}
  - {profile: cpu-only, count: 1, prefix: plain}
"""


def test_a_fleet_files_labels_declare_each_nodes_place(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    places = {t.node_id: t.fabric for t in load_fleet(path)}
    assert places == {
        "la-01": FabricPlace(spine="s1", leaf="leaf-a", nvlink_domain="nvl-1"),
        "la-02": FabricPlace(spine="s1", leaf="leaf-a", nvlink_domain="nvl-1"),
        "plain-01": None,
    }


def test_a_bad_place_in_a_fleet_file_is_refused_naming_the_label(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET.replace("leaf-a", "'leaf a'"))
    with pytest.raises(FleetError, match=r"labels.*crater\.ai/leaf-switch='leaf a'"):
        load_fleet(path)


def test_a_bad_place_in_the_probes_labels_stops_it_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CRATER_PROBE_LABELS", '{"crater.ai/spine-switch": "-s1"}')
    with pytest.raises(ValidationError, match=r"crater\.ai/spine-switch='-s1'"):
        ProbeSettings()
    monkeypatch.setenv("CRATER_PROBE_LABELS", '{"crater.ai/spine-switch": "s1"}')
    assert FabricPlace.from_labels(ProbeSettings().labels) == FabricPlace(spine="s1")
