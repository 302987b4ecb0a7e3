"""A small model trained on CPU that survives preemption: run by an executing node agent
(a task with `"command": ["python", "examples/train_cpu_checkpointed.py"]`), it pins to its
granted cores, checkpoints every `--every` steps and when preempted (SIGTERM, within the grace
period), and, placed again, resumes from its last checkpoint: the step count continues.

A linear regression fitted by gradient descent with numpy; the data are seeded, so every
attempt sees the same problem.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

import crater_client


def save(step: int, weights: np.ndarray) -> Path:
    path = crater_client.checkpoint_file(step, ".npz")
    part = path.with_name(f".{path.name}.part.npz")
    np.savez(part, step=step, weights=weights)
    os.replace(part, path)  # atomic: a kill mid-write leaves no torn checkpoint
    return path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=50, help="checkpoint every N steps")
    parser.add_argument("--step-seconds", type=float, default=0.005, help="simulated step work")
    args = parser.parse_args()

    cfg = crater_client.get_allocation_config()
    bound = crater_client.bind(cfg)
    rng = np.random.default_rng(0)
    features = rng.normal(size=(512, 16))
    truth = rng.normal(size=16)
    targets = features @ truth + 0.01 * rng.normal(size=512)

    state: tuple[int, np.ndarray] = (0, np.zeros(16))
    latest = crater_client.resume_from()
    if latest is not None:
        saved = np.load(latest)
        state = (int(saved["step"]), saved["weights"])
        print(f"resuming from step {state[0]} ({latest.name})", flush=True)
    else:
        print(f"starting fresh on cores {bound.cpu_cores}", flush=True)

    def on_preempt() -> None:
        path = save(*state)  # `state` is rebound whole each step: always consistent
        print(f"preempted: checkpoint saved at step {state[0]} ({path.name})", flush=True)

    crater_client.on_preempt(on_preempt)
    step, weights = state
    while step < args.steps:
        gradient = features.T @ (features @ weights - targets) / len(targets)
        weights = weights - 0.05 * gradient
        step += 1
        state = (step, weights)
        time.sleep(args.step_seconds)
        if step % args.every == 0:
            loss = float(np.mean((features @ weights - targets) ** 2))
            save(step, weights)
            print(f"step {step} loss {loss:.6f}", flush=True)
    print(f"done: {step} steps, loss {float(np.mean((features @ weights - targets) ** 2)):.6f}")


if __name__ == "__main__":
    main()
