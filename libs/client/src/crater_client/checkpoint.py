"""Preemption and checkpoints, as training frameworks expect them.

A preempted task gets SIGTERM, then its grace period (`task.preempted`'s
`grace_period_seconds`) to save, then SIGKILL. `on_preempt(save)` calls `save` on SIGTERM and
exits cleanly; `preempt_requested()` is there for a loop that would rather stop at a step
boundary. The checkpoint directory (`CRATER_CHECKPOINT_PATH`) is the task's, the same for
every attempt, so a task placed again finds what it saved: `resume_from()` names the latest
checkpoint written with `checkpoint_file(step)` (None on a first start).
"""

from __future__ import annotations

import os
import re
import signal
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType

from crater_client.allocation import AllocationError

_preempted = False
_NAME = re.compile(r"checkpoint-(\d+)(\..*)?")


def checkpoint_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The task's checkpoint directory (created if missing); stable across attempts."""
    env = os.environ if environ is None else environ
    path = env.get("CRATER_CHECKPOINT_PATH", "").strip()
    if not path:
        raise AllocationError("CRATER_CHECKPOINT_PATH", "not set: no checkpoint directory")
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def checkpoint_file(step: int, suffix: str = "", environ: Mapping[str, str] | None = None) -> Path:
    """Where to save the checkpoint of `step`: `DIR/checkpoint-000000042SUFFIX`. Write to a
    temporary name and `os.replace` onto it, so a kill mid-write leaves no torn file."""
    if step < 0:
        raise ValueError(f"step {step} is negative")
    return checkpoint_dir(environ) / f"checkpoint-{step:09d}{suffix}"


def resume_from(environ: Mapping[str, str] | None = None) -> Path | None:
    """The latest checkpoint saved by an earlier attempt (highest step), or None."""
    latest: tuple[int, Path] | None = None
    for path in checkpoint_dir(environ).iterdir():
        match = _NAME.fullmatch(path.name)
        if match and path.is_file() and (latest is None or int(match.group(1)) > latest[0]):
            latest = (int(match.group(1)), path)
    return None if latest is None else latest[1]


def checkpoint_step(path: Path) -> int:
    """The step a checkpoint file was saved at."""
    match = _NAME.fullmatch(path.name)
    if match is None:
        raise ValueError(f"{path.name!r} is not named checkpoint-STEP")
    return int(match.group(1))


def on_preempt(callback: Callable[[], None], *, exit_code: int = 0) -> None:
    """On SIGTERM (preemption, or a cancel), call `callback` (save a checkpoint), then exit
    with `exit_code`. Call it from the main thread; the callback runs between two bytecodes
    of whatever the main thread was doing, so save state that is consistent at every point
    (rebind, do not mutate in place)."""

    def handler(signum: int, frame: FrameType | None) -> None:
        global _preempted
        _preempted = True
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM is not ignored
        callback()
        sys.stdout.flush()
        sys.exit(exit_code)

    signal.signal(signal.SIGTERM, handler)


def preempt_requested() -> bool:
    """Whether SIGTERM has come (after `on_preempt`)."""
    return _preempted
