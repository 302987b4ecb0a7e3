"""nats-py's client parses message headers with `NatsHeaderParser` (crater.runtime.
nats_connection), not the email package: for the header blocks NATS carries it gives what
the email parser gave, as nats-py reads it, and anything unusual still goes to the email
parser."""

from __future__ import annotations

from email.message import Message
from email.parser import BytesParser

import pytest
from nats.aio.client import Client

from crater.runtime.nats_connection import NatsHeaderParser

BLOCKS = [
    b"Nats-Msg-Id: 0b7d2c5e-61f4-4f4e-8f0e-4a3c9d1e7b25\r\n"
    b"traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n"
    b"content-type: application/json\r\nCrater-Epoch: scheduler:12\r\n\r\n",
    b"Nats-Expected-Stream: CRATER_TASKS\r\n\r\n",
    b"a:b\r\nA:  spaced value  \r\nempty:\r\n\r\n",
    b"same: 1\r\nother: x\r\nsame: 2\r\n\r\n",  # a repeated name: the last value, first place
    b"Nats-Stream: S\r\nNats-Sequence: 7\r\n\r\nbody after the block\r\n",
    # unusual: a folded line, a name with a blank, a non-ASCII byte, a line with no colon
    b"x: first\r\n  folded\r\ny: 2\r\n\r\n",
    b"bad name: 1\r\nok: 2\r\n\r\n",
    b"no colon here\r\nok: 2\r\n\r\n",
]


@pytest.mark.parametrize("raw", BLOCKS)
def test_it_reads_a_header_block_as_nats_py_read_it_with_the_email_parser(raw: bytes) -> None:
    def as_nats_py_reads(parsed: object) -> list[tuple[str, str]]:
        items = parsed.items()  # type: ignore[attr-defined]
        return list({k.strip(): v.strip() for k, v in items}.items())

    ours = as_nats_py_reads(NatsHeaderParser().parsebytes(raw))
    assert ours == as_nats_py_reads(BytesParser().parsebytes(raw))


def test_a_non_ascii_block_goes_to_the_email_parser() -> None:
    assert isinstance(NatsHeaderParser().parsebytes(b"u: caf\xc3\xa9\r\n\r\n"), Message)


def test_nats_py_clients_use_it() -> None:
    assert isinstance(Client()._hdr_parser, NatsHeaderParser)
