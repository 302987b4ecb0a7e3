"""The chaos plan and the workload: both drawn from one seed, printed before the run starts,
so a run that finds something can be repeated exactly."""

from __future__ import annotations

import copy
import random
from dataclasses import asdict, dataclass, field
from typing import Any

from crater.cli.demo import SHORT_NAMES, WORKLOAD

KILLABLE = ("scheduler", "callback", "predictor", "gateway")
NATS = "nats-server"


@dataclass(frozen=True)
class ChaosConfig:
    tasks: int = 2000
    rate: float = 3.0  # tasks per second, steady
    kills: dict[str, int] = field(
        default_factory=lambda: {"scheduler": 5, "callback": 3, "predictor": 2, "gateway": 2}
    )
    nats_restarts: int = 1
    silent_nodes: int = 2
    silent_seconds: float = 120.0  # past the scheduler's 30 s timeout + 60 s: lost
    seed: int = 12
    drain_seconds: float = 300.0  # after the last submission: wait this long for every end
    settle_seconds: float = 10.0  # after every task ended: catch late duplicates
    database_url: str = "postgresql+asyncpg://postgres@127.0.0.1:5432/postgres"
    task_seconds: tuple[float, float] = (5.0, 25.0)  # simulated run time on the fleet
    down_seconds: float = 1.0  # between a kill and its restart
    # Chaos happens inside this share of the submission window, away from its edges.
    window: tuple[float, float] = (0.1, 0.9)
    service_env: dict[str, str] = field(default_factory=dict)  # extra CRATER_* for services

    @property
    def submit_seconds(self) -> float:
        return self.tasks / self.rate


@dataclass(frozen=True)
class PlannedAction:
    at_seconds: float  # after the first submission (t0)
    kind: str  # kill | nats-restart | silent
    target: str
    for_seconds: float | None = None


def make_plan(config: ChaosConfig, silent_candidates: list[str]) -> list[PlannedAction]:
    """Kills and nats-server restarts, one per slot of the chaos window (slots in a seeded
    order, a seeded time inside each, so no two overlap); silent nodes at seeded times,
    chosen among the nodes that carry the workload."""
    rng = random.Random(f"chaos:{config.seed}")
    targets = [name for name, count in config.kills.items() for _ in range(count)]
    targets += [NATS] * config.nats_restarts
    rng.shuffle(targets)
    start = config.submit_seconds * config.window[0]
    width = config.submit_seconds * (config.window[1] - config.window[0])
    actions: list[PlannedAction] = []
    if targets:
        slot = width / len(targets)
        for i, target in enumerate(targets):
            at = start + slot * (i + rng.uniform(0.2, 0.8))
            kind = "nats-restart" if target == NATS else "kill"
            actions.append(PlannedAction(round(at, 2), kind, target))
    nodes = rng.sample(sorted(silent_candidates), min(config.silent_nodes, len(silent_candidates)))
    for node in nodes:
        at = start + rng.uniform(0.0, width * 0.6)
        actions.append(PlannedAction(round(at, 2), "silent", node, config.silent_seconds))
    return sorted(actions, key=lambda a: a.at_seconds)


def describe_plan(actions: list[PlannedAction]) -> list[str]:
    lines = []
    for action in actions:
        if action.kind == "kill":
            what = f"kill -9 {action.target}, restart"
        elif action.kind == "nats-restart":
            what = "restart nats-server (same store, same port)"
        else:
            what = f"node {action.target} goes silent for {action.for_seconds or 0:g} s"
        lines.append(f"{action.at_seconds:8.1f} s  {what}")
    return lines


def plan_dicts(actions: list[PlannedAction]) -> list[dict[str, Any]]:
    return [asdict(a) for a in actions]


# The demo workload's kinds (crater up), weighted so that most tasks fit and finish within
# tens of seconds on the demo fleet and some wait: whole-node 8-GPU fine-tunes wait for a
# free node, and the 16-GPU task can never fit (rejected, a final state too). The Llama-3
# inference kind drops its anti-affinity group: one group for every task would allow only one
# per RTX 4090 node, and the queue would grow without bound at the chaos rate.
MIX_WEIGHTS = {
    ("training", "meta-llama/Llama-2-7b-hf"): 3,
    ("fine-tuning", "meta-llama/Llama-2-70b-hf"): 1,
    ("fine-tuning", "mistralai/Mistral-7B-v0.1"): 4,
    ("inference", "meta-llama/Llama-3-8b-chat-hf"): 5,
    ("inference", "resnet-50"): 4,
    ("evaluation", "bert-base-uncased"): 4,
    ("training", "meta-llama/Llama-3-70b"): 1,
}


# Some kinds retry (restart policy), so attempts, and their order at AllData, are exercised
# too: the preemptible fine-tunes after a preemption or a lost node, the 7B training runs
# after a failure or a lost node.
RESTART_POLICIES: dict[tuple[str, str], dict[str, Any]] = {
    ("fine-tuning", "mistralai/Mistral-7B-v0.1"): {
        "when": ["preemption", "node-lost"],
        "max_attempts": 3,
        "backoff_seconds": 2.0,
    },
    ("training", "meta-llama/Llama-2-7b-hf"): {
        "when": ["failure", "node-lost"],
        "max_attempts": 2,
        "backoff_seconds": 5.0,
    },
}


def workload(config: ChaosConfig, pools: set[str]) -> list[dict[str, Any]]:
    """Every task's request body, in submission order."""
    rng = random.Random(f"workload:{config.seed}")
    kinds = []
    weights = []
    for _, role, template in WORKLOAD:
        key = (template["task_type"], template["model_config"]["name"])
        kinds.append((role, template))
        weights.append(MIX_WEIGHTS.get(key, 1))
    bodies = []
    for n in range(1, config.tasks + 1):
        role, template = rng.choices(kinds, weights)[0]
        body = copy.deepcopy(template)
        body.pop("anti_affinity", None)
        policy = RESTART_POLICIES.get((template["task_type"], template["model_config"]["name"]))
        if policy is not None:
            body["restart_policy"] = copy.deepcopy(policy)
        body["task_id"] = f"{SHORT_NAMES[template['task_type']]}-{n:05d}"
        body["pool"] = role if role in pools else "default"
        body["tenant"] = rng.choice(["search", "ads", "research"])
        bodies.append(body)
    return bodies
