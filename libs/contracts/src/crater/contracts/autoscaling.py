"""Autoscaling: what inference replicas report and what the autoscaler decides."""

from __future__ import annotations

from collections import Counter
from enum import StrEnum
from typing import Annotated
from uuid import UUID

from pydantic import Field, field_validator, model_validator

from crater.contracts.base import Event
from crater.contracts.tasks import TaskId

# A request slower than a day is a broken clock, not a latency; the bound also keeps sums of a
# full batch finite (10,000 values near the double's maximum overflow to inf, then NaN).
MAX_LATENCY_MS = 86_400_000.0
LatencyMs = Annotated[float, Field(ge=0, le=MAX_LATENCY_MS, allow_inf_nan=False)]
# A prompt longer than this is a counter gone wrong (the longest context windows are ~10M).
MAX_PROMPT_TOKENS = 100_000_000
# More requests than this waiting at one replica is a counter gone wrong, not a queue.
MAX_REQUESTS_WAITING = 1_000_000


class LatencySamplesReported(Event):
    """A batch of request latencies from one inference replica or gateway."""

    service: str = Field(min_length=1, max_length=128)
    replica_id: str | None = Field(default=None, max_length=128)
    latencies_ms: list[LatencyMs] = Field(min_length=1, max_length=10_000)
    queue_ms: list[LatencyMs] | None = Field(
        default=None,
        min_length=1,
        max_length=10_000,
        description="Each request's time queued before it was first scheduled (vLLM's "
        "vllm:request_queue_time_seconds, TGI's tgi_request_queue_duration): the part of its "
        "time to first token that more replicas shorten; its prefill is not. When given, "
        "the autoscaler judges queueing on these rather than on latencies_ms.",
    )
    prompt_tokens: list[Annotated[int, Field(ge=0, le=MAX_PROMPT_TOKENS)]] | None = Field(
        default=None,
        min_length=1,
        max_length=10_000,
        description="Each request's prompt length in tokens, in the order of latencies_ms (as "
        "many): with CRATER_AUTOSCALER_TTFT_MS_PER_1K_PROMPT_TOKENS set, a request's time to "
        "first token is judged against an SLO that grows with its prompt.",
    )
    tpot_ms: list[LatencyMs] | None = Field(
        default=None,
        min_length=1,
        max_length=10_000,
        description="Time per output token after the first, one value per request finished (or "
        "per token, as vLLM's vllm:time_per_output_token_seconds observes it; TGI's "
        "tgi_request_mean_time_per_token_duration): decode slowed by full batches, which more "
        "replicas shorten. Judged against scale_out_tpot_ms when that is set.",
    )
    requests_waiting: int | None = Field(
        default=None,
        ge=0,
        le=MAX_REQUESTS_WAITING,
        description="Requests waiting for admission at the replica when it was sampled: its "
        "admission backlog (vLLM's vllm:num_requests_waiting, TGI's tgi_queue_size, "
        "Triton's nv_inference_pending_request_count). A backlog shows a burst as it comes, "
        "before any request that queued in it reports its queueing; when given, the demand "
        "counts the arrivals as the admissions plus the fleet's backlog growth "
        "(docs/autoscaling.md).",
    )
    gpu_memory_pressure: float | None = Field(
        default=None, ge=0, le=1, description="Used/total GPU memory of the replica's cards."
    )
    kv_cache_usage: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="The KV cache in use (0..1) as the serving engine reports it (vLLM's "
        "vllm:kv_cache_usage_perc). A paged engine takes its share of the cards up front, so "
        "their memory says nothing of its load; when given, this is the replica's pressure, "
        "ahead of its cards' memory and of gpu_memory_pressure.",
    )
    replicas: int | None = Field(default=None, ge=0, description="Replicas serving now.")
    task_id: str | None = Field(
        default=None,
        max_length=128,
        description="The replica's own task (its allocation's task_id): the autoscaler finds the "
        "GPUs the replica holds from allocation.granted and reads their memory pressure from "
        "node.metrics. When absent, replica_id is tried as the task id.",
    )

    @model_validator(mode="after")
    def _one_prompt_per_request(self) -> LatencySamplesReported:
        if self.prompt_tokens is not None and len(self.prompt_tokens) != len(self.latencies_ms):
            raise ValueError(
                f"prompt_tokens: {len(self.prompt_tokens)} values for "
                f"{len(self.latencies_ms)} latencies_ms: one per request, in the same order"
            )
        return self


class ScaleDirection(StrEnum):
    OUT = "out"
    IN = "in"


class ScaleDecided(Event):
    service: str
    direction: ScaleDirection
    current_replicas: int = Field(ge=0)
    desired_replicas: int = Field(ge=0)
    p95_latency_ms: float = Field(
        description="The p95 the decision judged: of the queueing delay when the replicas report "
        "it (queue_ms), else of the time to first token."
    )
    gpu_memory_pressure: float | None
    samples: int = Field(ge=0, description="Samples in the window that decided.")
    reason: str
    panic: bool = Field(
        default=False,
        description="Taken in panic mode: p95 over the short panic window passed the panic "
        "threshold, so the scale-out went ahead of the cooldown; no scale-in while panicking.",
    )
    proportional_replicas: int | None = Field(
        default=None,
        ge=0,
        description="The HPA-style count before limits: ceil(current * observed / target).",
    )
    limited_by: str | None = Field(
        default=None,
        description="The limit that capped the step (max_replicas, a per-decision or "
        "per-period rate limit), if any.",
    )
    from_warm_pool: int = Field(
        default=0,
        ge=0,
        description="Scale-out: how many of the added replicas are warm-pool standbys "
        "promoted to serve (the rest are requested cold).",
    )
    promoted_replicas: list[str] = Field(
        default_factory=list,
        description="Scale-out: the task ids of the standbys promoted; each starts serving.",
    )
    drain_replicas: list[str] = Field(
        default_factory=list,
        description="Scale-in: the replicas (replica ids) to drain, i.e. take out of routing "
        "and finish their in-flight requests, before their allocations are released.",
    )
    pressure_source: str | None = Field(
        default=None,
        description="Where the pressure came from: 'kv-cache' (the KV cache the replicas' "
        "engines report), 'node-metrics' (the GPUs the replicas hold), 'samples' (the "
        "replicas' own reports) or 'mixed'.",
    )


class ReplicasRequested(Event):
    """The autoscaler asks the scheduler to place new replicas of an inference service.

    The scheduler places one task per id in `task_ids`, each a copy of the template replica's
    request (model, GPU model and memory, CPU, `anti_affinity.group`), and answers with
    allocation.granted per task as usual. A redelivery carries the same ids: nothing is placed
    twice.
    """

    service: str = Field(min_length=1, max_length=128)
    task_ids: list[TaskId] = Field(min_length=1, max_length=1024)
    template_task_id: str | None = Field(
        default=None,
        description="A placed replica of the service whose request the new ones copy; None "
        "when the autoscaler knows no replica's task (the scheduler then uses the service's "
        "registered replica request, anti-affinity group = service).",
    )
    standby: bool = Field(
        default=False,
        description="Warm-pool standbys: placed and loaded, not routed to until promoted by "
        "a scale.decided naming them in promoted_replicas.",
    )
    decision_id: UUID | None = Field(
        default=None, description="The scale.decided that asked for them; None: pool refill."
    )
    reason: str

    @field_validator("task_ids")
    @classmethod
    def _one_replica_per_id(cls, task_ids: list[str]) -> list[str]:
        repeated = sorted(i for i, n in Counter(task_ids).items() if n > 1)
        if repeated:
            raise ValueError(f"repeats {', '.join(repeated[:10])}: one replica per task id")
        return task_ids


class ReplicaDrained(Event):
    """A replica (or the router in front of it) reports that it takes no new requests and
    has finished the ones in flight: its resources may go."""

    service: str = Field(min_length=1, max_length=128)
    replica_id: str = Field(min_length=1, max_length=128)
    in_flight: int = Field(default=0, ge=0, description="Requests still running (0: drained).")


class ReplicaReleaseRequested(Event):
    """After a scale-in drain (or its timeout) the autoscaler asks the scheduler to release
    the replica's allocation, so the GPUs go back to the pool."""

    service: str = Field(min_length=1, max_length=128)
    replica_id: str
    task_id: str | None = Field(description="The replica's task; None when unknown.")
    drained: bool = Field(description="False: the drain timed out and requests may be cut.")
    decision_id: UUID = Field(description="The scale-in that drained it.")
    reason: str
