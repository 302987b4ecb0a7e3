"""Names of a service's replicas in a Stack."""

from __future__ import annotations

import pytest

from crater.cli.stack import replica_names


def test_replica_names() -> None:
    assert replica_names("callback", 1) == ["callback"]
    assert replica_names("callback", 3) == ["callback", "callback-2", "callback-3"]
    with pytest.raises(ValueError, match="at least one replica"):
        replica_names("gateway", 0)
