"""`run_task` reads its allocation from the environment, names what is missing, and maps how
the `with` block ended to the report: succeeded, or failed with the exit code and the
exception (the live stack is in tests/integration/client)."""

from __future__ import annotations

import pytest

from crater_client import AllocationError, run_task
from crater_client.launcher import out_of_memory, outcome

ENV = {
    "CRATER_GATEWAY_URL": "http://gateway:8080/",
    "CRATER_ALLOCATION_ID": "alloc-1",
    "CRATER_RESERVATION_TOKEN": "v1.alloc-1.1.ab",
}


def test_the_allocation_comes_from_the_environment() -> None:
    task = run_task(environ=ENV, heartbeat_seconds=5)
    assert (task.gateway_url, task.allocation_id, task.token) == (
        "http://gateway:8080",
        "alloc-1",
        "v1.alloc-1.1.ab",
    )
    assert task.grace_seconds == 20  # four heartbeats
    assert run_task(environ=ENV, gateway_url="http://other").gateway_url == "http://other"


@pytest.mark.parametrize("missing", sorted(ENV))
def test_a_missing_variable_is_named(missing: str) -> None:
    env = {k: v for k, v in ENV.items() if k != missing}
    with pytest.raises(AllocationError) as refused:
        run_task(environ=env)
    assert refused.value.variable == missing


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (None, ("succeeded", 0, None)),
        (SystemExit(0), ("succeeded", 0, None)),
        (SystemExit(None), ("succeeded", 0, None)),
        (SystemExit(3), ("failed", 3, "SystemExit(3)")),
        (SystemExit("bad config"), ("failed", 1, "SystemExit: bad config")),
        (KeyboardInterrupt(), ("failed", 130, "KeyboardInterrupt: interrupted (SIGINT)")),
        (RuntimeError("CUDA out of memory"), ("failed", 1, "RuntimeError: CUDA out of memory")),
        (ValueError(), ("failed", 1, "ValueError")),
    ],
)
def test_how_the_block_ended_is_what_is_reported(
    error: BaseException | None, expected: tuple[str, int, str | None]
) -> None:
    assert outcome(error) == expected


def test_a_heartbeat_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="heartbeat_seconds"):
        run_task(environ=ENV, heartbeat_seconds=0)


class OutOfMemoryError(RuntimeError):
    """PyTorch's torch.cuda.OutOfMemoryError, by name (the client imports no framework)."""


def test_running_out_of_memory_is_told_apart() -> None:
    assert out_of_memory(MemoryError())
    assert out_of_memory(OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB"))
    assert not out_of_memory(RuntimeError("CUDA error: device-side assert triggered"))
    assert not out_of_memory(ValueError("bad shape"))
    assert not out_of_memory(None)
