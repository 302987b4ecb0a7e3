"""What the scheduler offers outside its service (`crater simulate`): its scoring policies.
The trace replay is `crater.scheduler.sim`."""

from crater.scheduler.domain.plugins import POLICIES

__all__ = ["POLICIES"]
