"""Device check: what the probe's NVML sampler reads on a real card while work runs on it.

Opens `GpuSampler` (the probe's own adapter: one NVML session, Xid events registered) and
every `--interval` seconds writes one JSON line: each card's metrics (`sample`), its fault
signals (`signals`: Xids, lost, pages pending, remap failure, NVLinks down) and the compute
processes with their memory (`processes`), until killed or `--seconds` pass. Run it beside a
GPU job to see the probe notice the job's memory and processes. Needs a GPU; no test
imports it.

    PYTHONPATH=libs/contracts/src:services/probe/src python3 benchmarks/probe/nvml_watch.py \
        --seconds 60 > samples.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

from crater.probe.adapters.nvml import GpuSampler


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=600.0)
    args = parser.parse_args()
    sampler = GpuSampler()
    if not sampler.open():
        print(json.dumps({"error": "no GPU answers NVML"}), flush=True)
        return 1
    ends = time.monotonic() + args.seconds
    try:
        while time.monotonic() < ends:
            line = {
                "t": round(time.time(), 3),
                "metrics": [_plain(m) for m in sampler.sample()],
                "signals": [_plain(s) for s in sampler.signals()],
                "processes": [_plain(p) for p in sampler.processes() or []],
            }
            print(json.dumps(line), flush=True)
            time.sleep(args.interval)
    finally:
        sampler.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
