"""How the suite shares the machine under pytest-xdist (`make test` runs two workers with
`--dist loadgroup`): the tests that run a whole multi-process stack with timing bounds
(chaos, failover, the demo, the README, the browser) go to one worker, one after another,
so two of them never compete for the cores while the rest of the suite fills the other."""

from __future__ import annotations

import pytest

HEAVY_STACK = pytest.mark.xdist_group("heavy-stack")
