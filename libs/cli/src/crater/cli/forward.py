"""A TCP forwarder: `python -m crater.cli.forward LISTEN_HOST LISTEN_PORT TARGET_HOST
TARGET_PORT`. The stack's hosts (network namespaces, `Stack(nats_hosts=True)`) reach a
database that listens on the root namespace's loopback through it: it listens on the hosts'
bridge and forwards each connection to the loopback address, so the database sees a local
client (its own access rules unchanged)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import subprocess
import sys
import time

CHUNK = 64 * 1024


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


async def serve(listen_host: str, listen_port: int, target_host: str, target_port: int) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                target_host, target_port
            )
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))

    server = await asyncio.start_server(handle, listen_host, listen_port)
    async with server:
        await server.serve_forever()


def start_forwarder(
    listen_host: str, listen_port: int, target_host: str, target_port: int, timeout: float = 15.0
) -> subprocess.Popen[bytes]:
    """The forwarder as a child process; returns once it listens."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "crater.cli.forward",
            listen_host,
            str(listen_port),
            target_host,
            str(target_port),
        ],
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the forwarder to {target_host}:{target_port} exited")
        with (
            contextlib.suppress(OSError),
            socket.create_connection((listen_host, listen_port), timeout=0.2),
        ):
            return process
        time.sleep(0.05)
    process.kill()
    process.wait()
    raise TimeoutError(f"the forwarder did not listen on {listen_host}:{listen_port}")


if __name__ == "__main__":
    host, port, target, target_port = sys.argv[1:5]
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(host, int(port), target, int(target_port)))
