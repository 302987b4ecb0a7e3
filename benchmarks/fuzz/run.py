"""The long fuzz run: REST bodies through schemathesis and bus messages through hypothesis,
against a real nats-server and every service in-process; figures printed and written to
benchmarks/results/fuzz.json.

    uv run --frozen python -m benchmarks.fuzz.run --count 100000
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.fuzz.harness import CONSUMED, Figures, fuzz_bus, fuzz_rest, stack
from crater.runtime.nats_server import start_nats_server

RESULTS = Path(__file__).resolve().parents[1] / "results" / "fuzz.json"
REST_OPERATIONS = 12  # the gateway's documented operations, about


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000, help="REST bodies + bus messages")
    parser.add_argument("--rest-share", type=float, default=0.2, help="share of REST bodies")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    figures = Figures()
    started = time.monotonic()

    def progress(f: Figures) -> None:
        print(
            f"\r{f.total('tried'):>7}/{args.count} tried  5xx {f.total('server_errors')}  "
            f"crashes {f.total('crashes')}  hangs {f.total('hangs')}  "
            f"other {f.total('other_failures')}  {time.monotonic() - started:6.0f} s",
            end="",
            file=sys.stderr,
            flush=True,
        )

    rest = int(args.count * args.rest_share)
    bus = args.count - rest

    async def run() -> None:
        with tempfile.TemporaryDirectory() as tmp, start_nats_server(Path(tmp) / "js") as nats:
            async with stack(nats.url, Path(tmp)) as running:
                await asyncio.to_thread(
                    fuzz_rest,
                    running.gateway_url,
                    figures,
                    max(2, rest // REST_OPERATIONS),
                    headers=running.auth_headers,
                    seed=args.seed,
                    progress=progress,
                )
                await fuzz_bus(
                    nats.url,
                    figures,
                    max(1, bus // len(CONSUMED)),
                    seed=args.seed,
                    progress=progress,
                )

    interrupted = False
    try:
        asyncio.run(run())
    except KeyboardInterrupt:  # Ctrl-C: what was tried so far is still written, marked
        interrupted = True
    result: dict[str, Any] = {
        "command": "uv run --frozen python -m benchmarks.fuzz.run " + " ".join(sys.argv[1:]),
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
