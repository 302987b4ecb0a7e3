"""asyncio's warning about a TLS connection's end of file is not shown: `crater diagnose` and
`crater dead-letters` against `crater up` (NATS over TLS) printed it on every run."""

from __future__ import annotations

import logging

import pytest

import crater.runtime.nats_connection  # noqa: F401  (installs the filter)


def test_the_tls_eof_warning_is_dropped_and_nothing_else(caplog: pytest.LogCaptureFixture) -> None:
    asyncio_log = logging.getLogger("asyncio")
    with caplog.at_level(logging.WARNING, logger="asyncio"):
        asyncio_log.warning("returning true from eof_received() has no effect when using ssl")
        asyncio_log.warning("Task was destroyed but it is pending!")
    assert [r.getMessage() for r in caplog.records] == ["Task was destroyed but it is pending!"]
