"""Issue #25, item 1: a TTFT SLO relative to prompt length. A replica that reports each
request's prompt length but not its queueing is judged on its time to first token less the
prompt's allowance (`ttft_ms_per_1k_prompt_tokens`): a long prompt's prefill is no reason to
scale, the same wait on a short one is."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from pydantic import ValidationError

from crater.autoscaler.domain import Autoscaler, ScalingPolicy
from crater.contracts import LatencySamplesReported, ScaleDirection

T0 = datetime(2026, 1, 1, tzinfo=UTC)
# The rule, for its lines: out over p95 200 ms (and pressure 0.8); 50 ms per 1,000 tokens.
RELATIVE = ScalingPolicy(strategy="rule", ttft_ms_per_1k_prompt_tokens=50.0)


def sample(
    ttft_ms: float, prompt: int | None, queue_ms: float | None = None
) -> LatencySamplesReported:
    return LatencySamplesReported(
        occurred_at=T0 + timedelta(seconds=1),
        service="code",
        replica_id="code-1",
        latencies_ms=[ttft_ms] * 20,
        prompt_tokens=None if prompt is None else [prompt] * 20,
        queue_ms=None if queue_ms is None else [queue_ms] * 20,
        gpu_memory_pressure=0.9,
        replicas=4,
    )


def test_a_long_prompts_prefill_is_within_its_allowance() -> None:
    # 350 ms to first token for 4,000 tokens: 200 ms of it allowed, 150 ms judged.
    assert Autoscaler(RELATIVE).observe(sample(350.0, 4_000)).decision is None
    # Without the relative SLO the same requests are over the 200 ms line.
    plain = Autoscaler(ScalingPolicy(strategy="rule")).observe(sample(350.0, 4_000)).decision
    assert plain is not None
    assert plain.direction is ScaleDirection.OUT


def test_the_same_wait_on_a_short_prompt_is_judged_and_named() -> None:
    decided = Autoscaler(RELATIVE).observe(sample(350.0, 200)).decision  # 340 ms judged
    assert decided is not None
    assert decided.direction is ScaleDirection.OUT
    assert decided.p95_latency_ms == pytest.approx(340.0)
    assert "p95 beyond the prompt's allowance 340.0 ms > 200 ms" in decided.reason


def test_queueing_reported_is_judged_first() -> None:
    # The replica says what it waited: 250 ms of queueing is over the line, whatever the prompt.
    decided = Autoscaler(RELATIVE).observe(sample(450.0, 4_000, queue_ms=250.0)).decision
    assert decided is not None
    assert "queueing p95 250.0 ms" in decided.reason


@pytest.mark.parametrize(
    ("prompts", "says"),
    [([100] * 19, "prompt_tokens: 19 values for 20 latencies_ms"), ([-1] * 20, "prompt_tokens")],
)
def test_prompt_lengths_that_do_not_match_the_requests_are_refused(
    prompts: list[int], says: str
) -> None:
    with pytest.raises(ValidationError, match=says):
        LatencySamplesReported.model_validate(
            {"service": "code", "latencies_ms": [1.0] * 20, "prompt_tokens": prompts}
        )
