"""What `crater` exits with, and the one way a command says what went wrong.

Exit codes (docs/cli.md):

- 0: done.
- 1: the command ran and the answer is no: the gateway rejected the request, nothing fits,
  no such delivery, docs are stale, a check failed.
- 2: the command line or an input file is wrong (usage, a missing file, invalid JSON),
  checked before anything is sent.
- 3: what the command needs cannot be reached: the gateway, the database, NATS.
- 4: not authorised: the gateway wants a valid CRATER_API_TOKEN.
- 70: a bug in crater: a one-line message; CRATER_DEBUG=1 shows the traceback.
"""

from __future__ import annotations

OK, NO, USAGE, UNREACHABLE, UNAUTHORISED, INTERNAL = 0, 1, 2, 3, 4, 70


class CliError(Exception):
    """What is wrong and what to do, and the exit code: `crater` prints `crater: MESSAGE`
    on stderr, unwrapped (crater.cli.main.LazyGroup.invoke), never a traceback."""

    def __init__(self, message: str, exit_code: int = NO) -> None:
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
