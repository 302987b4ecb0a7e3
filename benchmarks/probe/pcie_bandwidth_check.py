"""Device check: the probe's PCIe copy-bandwidth measurement on this machine's real cards.

Runs exactly what the probe runs with CRATER_PROBE_MEASURE_PCIE_BANDWIDTH=true (NVML for
the cards and their tasks, cuda-bindings for the copies) and prints, per card, one JSON
object: index, bus id, model, the measured GB/s (host to card, pinned, one way), the nominal
GB/s of its link (max generation x max width), their ratio, and why a card was not measured.
A healthy link copies at about 0.8-0.9 of nominal; far below says a riser, a link trained
down, or a shared switch. Writes the same JSON to $OUT/pcie_bandwidth.json when OUT is set.
Exits 1 when no card was measured. Needs a GPU; no test imports it.

    uv sync --frozen --extra cuda
    uv run --frozen python benchmarks/probe/pcie_bandwidth_check.py [--buffer-mb 256]

Without the workspace's virtual environment (a bare GPU machine), only the probe's sources
and three wheels are needed:

    pip install --target deps "cuda-bindings>=12.9,<13" nvidia-ml-py "pydantic>=2.11"
    PYTHONPATH=deps:libs/contracts/src:services/probe/src \
        python3 benchmarks/probe/pcie_bandwidth_check.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from crater.contracts.nodes import pcie_nominal_gbps
from crater.probe.adapters.nvml import discover_gpus
from crater.probe.adapters.pci import sysfs_bus_id
from crater.probe.adapters.pcie_bandwidth import CopyBounds, measure_local


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--buffer-mb", type=int, default=CopyBounds.buffer_mb)
    parser.add_argument("--runs", type=int, default=CopyBounds.runs)
    args = parser.parse_args()
    bounds = CopyBounds(buffer_mb=args.buffer_mb, runs=args.runs)

    started = time.perf_counter()
    found = measure_local(bounds=bounds)
    seconds = time.perf_counter() - started
    cards: list[dict[str, Any]] = []
    for gpu in discover_gpus(pcie_bandwidth=found.gbps):
        bus = sysfs_bus_id(gpu.pci_bus_id or "")
        nominal = pcie_nominal_gbps(gpu.pcie_generation_max, gpu.pcie_width_max)
        measured = gpu.pcie_bandwidth_gbps
        outcome, why = found.skipped.get(bus, ("measured", ""))
        cards.append(
            {
                "card": gpu.index,
                "bus_id": bus,
                "model": gpu.model,
                "link": f"gen{gpu.pcie_generation_max} x{gpu.pcie_width_max}",
                "measured_gbps": measured,
                "nominal_gbps": nominal,
                "ratio": round(measured / nominal, 3) if measured and nominal else None,
                "outcome": outcome,
                "why": why,
            }
        )
        print(json.dumps(cards[-1]))
    report = {
        "host": platform.node(),
        "buffer_mb": bounds.buffer_mb,
        "runs": bounds.runs,
        "seconds_all_cards": round(seconds, 3),
        "cards": cards,
    }
    print(json.dumps({k: v for k, v in report.items() if k != "cards"}))
    if os.environ.get("OUT"):
        path = Path(os.environ["OUT"]) / "pcie_bandwidth.json"
        path.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if found.gbps else 1


if __name__ == "__main__":
    sys.exit(main())
