#!/usr/bin/env bash
# The device checks, one run on a GPU machine (the workplace's `device` tool, or any GPU host),
# from the repository root; results under $OUT (default /tmp/crater-device-check):
#   - #27: the probe's PCIe copy-bandwidth measurement on the real cards (pcie_bandwidth.json,
#     pcie.log), the node's whole topology as the probe reports it, with that measurement
#     (topology.json, and as Graphviz DOT), and nvidia-smi's own view (nvidia-smi.txt);
#   - #24: peak memory of real training steps for SGD, Megatron-selective and every-k
#     checkpointing (predictor_measured.json, measure.log), while the probe's NVML sampler
#     watches the card (nvml_samples.jsonl: the job's memory and process as the probe sees it).
# The probe as a service (a process over a real nats-server) is checked apart, by
# benchmarks/probe/probe_on_gpu.py, with the probe's whole dependency set.
# The probe's code runs on its pinned dependencies, installed from wheels in .whl when there
# (a host with no registry: see /work/.library/device/README.md), else from the environment;
# the training steps run on the host's own PyTorch and transformers.
set -u
OUT=${OUT:-/tmp/crater-device-check}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
site=""
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/crater-site .whl/*.whl || exit 1
    site=/tmp/crater-site:
fi
probe_path="${site}libs/contracts/src:services/probe/src"
status=0

nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1
nvidia-smi topo -m >> "$OUT/nvidia-smi.txt" 2>&1
nvidia-smi -q -d PCIE,ECC,PAGE_RETIREMENT >> "$OUT/nvidia-smi.txt" 2>&1

echo "== PCIe copy bandwidth (the probe's measurement)"
PYTHONPATH=$probe_path python3 benchmarks/probe/pcie_bandwidth_check.py 2>&1 | tee "$OUT/pcie.log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1

echo "== the node's topology as the probe reports it"
OUT=$OUT PYTHONPATH=$probe_path python3 - <<'PY' || status=1
import os
from pathlib import Path

from crater.probe.adapters.pcie_bandwidth import measure_local
from crater.probe.adapters.sysfs import discover_local
from crater.probe.domain.dot import topology_to_dot

node = discover_local(pcie_bandwidth=measure_local().gbps)
Path(os.environ["OUT"], "topology.json").write_text(node.model_dump_json(indent=2) + "\n")
Path(os.environ["OUT"], "topology.dot").write_text(topology_to_dot(node))
PY
head -c 3000 "$OUT/topology.json"; echo

echo "== training steps, measured (the probe's NVML sampler watching)"
PYTHONPATH=$probe_path python3 benchmarks/probe/nvml_watch.py --interval 0.5 \
    > "$OUT/nvml_samples.jsonl" 2>&1 &
watcher=$!
python3 benchmarks/predictor/measure_on_gpu.py "$@" 2>&1 | tee "$OUT/measure.log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
kill "$watcher" 2>/dev/null
wait "$watcher" 2>/dev/null
echo "== done, status $status"
exit $status
