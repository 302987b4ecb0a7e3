"""A training script as it runs inside a task Crater placed, CPU only (no torch needed).

It reads its allocation, binds to it, reports its own use while it runs, feeds a small
"model" from a pool of loader workers sized as Crater recommends, and checkpoints to
CRATER_CHECKPOINT_PATH, resuming from the checkpoint if one is there.

By hand (the variables Crater would set; the cores must be ones this machine has):

    CRATER_TASK_ID=demo-1 CRATER_GPU_IDS= CRATER_CPU_CORES=2 CRATER_CPU_CORE_IDS=0,1 \\
    CRATER_MEMORY_MB=2048 CRATER_DATALOADER_NUM_WORKERS=2 CRATER_DATALOADER_PREFETCH_FACTOR=2 \\
    CRATER_CHECKPOINT_PATH=/tmp/demo-ckpt CRATER_GATEWAY_URL=http://127.0.0.1:8080 \\
    python examples/train_with_crater_client.py --seconds 10

Without CRATER_GATEWAY_URL the samples are measured and not sent.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import time
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import crater_client

BATCH = 256
TRUE_W, TRUE_B = 3.0, -1.0


def make_batch(seed: int) -> list[tuple[float, float]]:
    """One batch of a noisy line y = 3x - 1: what a DataLoader worker would load and decode."""
    rng = random.Random(seed)
    xs = [rng.uniform(-1, 1) for _ in range(BATCH)]
    return [(x, TRUE_W * x + TRUE_B + rng.gauss(0, 0.05)) for x in xs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="How long to train.")
    parser.add_argument("--monitor-interval", type=float, default=10.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")

    bound = crater_client.bind()  # before any worker starts: they inherit the affinity
    cfg = crater_client.get_allocation_config()  # after bind: gpu_ids are CUDA's numbers
    monitor = crater_client.start_monitoring(interval=args.monitor_interval)
    print(f"allocation {json.dumps(cfg)}; bound to cores {bound.cpu_cores}", flush=True)

    checkpoint_dir = Path(os.environ.get("CRATER_CHECKPOINT_PATH") or "checkpoints")
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = checkpoint_dir / "model.json"
    state: dict[str, Any] = {"step": 0, "w": 0.0, "b": 0.0}
    if checkpoint.exists():  # a restarted attempt carries on
        state = json.loads(checkpoint.read_text())
        print(f"resumed at step {state['step']}", flush=True)

    workers = max(cfg["optimal_workers"], 1)
    ahead = workers * cfg["prefetch_factor"]  # batches in flight, as DataLoader prefetches
    deadline = time.monotonic() + args.seconds
    with get_context("spawn").Pool(workers) as pool:
        while time.monotonic() < deadline:
            seeds = range(state["step"], state["step"] + ahead)
            for batch in pool.imap(make_batch, seeds):
                # one SGD step on mean squared error
                gw = sum(2 * (state["w"] * x + state["b"] - y) * x for x, y in batch) / BATCH
                gb = sum(2 * (state["w"] * x + state["b"] - y) for x, y in batch) / BATCH
                state["w"] -= 0.1 * gw
                state["b"] -= 0.1 * gb
                state["step"] += 1
            tmp = checkpoint.with_suffix(".tmp")
            tmp.write_text(json.dumps(state))
            tmp.replace(checkpoint)  # atomic: a kill mid-write leaves the last good one
    monitor.stop()
    print(
        f"done: step {state['step']} w={state['w']:.3f} b={state['b']:.3f}; "
        f"usage samples posted {monitor.posted}, failed {monitor.failed}",
        flush=True,
    )


if __name__ == "__main__":
    main()
