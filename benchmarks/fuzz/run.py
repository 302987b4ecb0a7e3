"""The long fuzz run: REST bodies through schemathesis and bus messages through hypothesis,
against Crater as `crater up` runs it (its own nats-server, every service its own process,
SQLite, authentication on); figures printed and written to benchmarks/results/fuzz.json.
The one setting changed from what ships: quick redelivery (harness.QUICK_DELIVERY), so a
handler that fails on every delivery is dead-lettered within its batch.

    uv run --frozen python -m benchmarks.fuzz.run --count 100000

`--in-process` runs the services in this process instead (as tests/integration/fuzz does):
quicker to start, but the fuzzer's own CPU then slows the services it judges.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.fuzz.harness import (
    CONSUMED,
    QUICK_DELIVERY,
    Figures,
    Stack,
    fuzz_bus,
    fuzz_rest,
    process_stack,
    stack,
)
from crater.runtime.nats_server import start_nats_server

RESULTS = Path(__file__).resolve().parents[1] / "results" / "fuzz.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000, help="REST bodies + bus messages")
    parser.add_argument("--rest-share", type=float, default=0.2, help="share of REST bodies")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--in-process", action="store_true", help="services in this process")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    figures = Figures()
    started = time.monotonic()

    def progress(f: Figures) -> None:
        print(
            f"\r{f.total('tried'):>7}/{args.count} tried  5xx {f.total('server_errors')}  "
            f"crashes {f.total('crashes')}  hangs {f.total('hangs')}  "
            f"other {f.total('other_failures')}  {time.monotonic() - started:6.0f} s  "
            f"{f.stage:<32}",
            end="",
            file=sys.stderr,
            flush=True,
        )

    rest = int(args.count * args.rest_share)
    bus = args.count - rest

    stop = threading.Event()

    async def fuzz(nats_url: str, running: Stack, exited: Callable[[], list[str]] | None) -> None:
        try:
            await asyncio.to_thread(
                fuzz_rest,
                running.gateway_url,
                figures,
                2,
                total=rest,
                headers=running.auth_headers,
                seed=args.seed,
                progress=progress,
                exited=exited,
                stop=stop,
            )
        except asyncio.CancelledError:  # Ctrl-C: the REST thread ends at its next request
            stop.set()
            raise
        if exited is not None and exited():
            return  # recorded as a crash already
        await fuzz_bus(
            nats_url,
            figures,
            max(1, bus // len(CONSUMED)),
            seed=args.seed,
            progress=progress,
            exited=exited,
        )

    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            if args.in_process:
                with start_nats_server(Path(tmp) / "js") as nats:
                    async with stack(nats.url, Path(tmp)) as running:
                        await fuzz(nats.url, running, None)
                return
            async with process_stack(Path(tmp)) as (running, exited):
                print(f"stack up: {running.gateway_url}, NATS {running.nats_url}", file=sys.stderr)
                await fuzz(running.nats_url, running, exited)

    interrupted = False
    try:
        asyncio.run(run())
    except KeyboardInterrupt:  # Ctrl-C: what was tried so far is still written, marked
        interrupted = True
    result: dict[str, Any] = {
        "command": "uv run --frozen python -m benchmarks.fuzz.run " + " ".join(sys.argv[1:]),
        "stack": "in-process" if args.in_process else "processes (crater.cli.stack)",
        "changed_from_shipped": QUICK_DELIVERY,
        "requested": args.count,
        "interrupted": interrupted,
        "seconds": round(time.monotonic() - started, 1),
        **figures.as_json(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(file=sys.stderr)
    print(json.dumps(result["totals"], indent=2))
    print(f"written to {args.out}")
    bad = ("crashes", "server_errors", "hangs")
    return 1 if interrupted or any(result["totals"][name] for name in bad) else 0


if __name__ == "__main__":
    sys.exit(main())
