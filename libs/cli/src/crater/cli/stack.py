"""Crater as a set of processes on one machine: a nats-server from the wheel, every service as
its own process, and a reference webhook receiver standing in for AllData. Used by `crater up`
and by the end-to-end tests, so both run Crater the same way.

It runs in production mode (CRATER_ENVIRONMENT=production): its data directory has secrets of
its own, random, made on its first start (`stack_secrets`), handed to the services as
CRATER_..._FILE, so nothing development-only is needed."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from sqlalchemy.engine import make_url

from crater.cli.forward import start_forwarder
from crater.runtime import dev_pki
from crater.runtime.db import upgrade_to_head
from crater.runtime.nats_cluster import NatsCluster, start_nats_cluster
from crater.runtime.nats_connection import NatsConnection
from crater.runtime.nats_permissions import node_identity
from crater.runtime.nats_server import NatsServer, free_port, start_nats_server

SERVICES = ("scheduler", "predictor", "callback", "autoscaler", "probe", "gateway")
WEBHOOK_USER = "alldata"
# This machine as a node of its own, beside the simulated fleet: the probe in local mode,
# running the `command` of each task placed on it as a real process (docs/execution.md).
LOCAL_NODE = "local-01"
LOCAL_POOL = "local"


@dataclass
class Process:
    name: str
    port: int
    popen: subprocess.Popen[bytes]
    log_path: Path
    args: list[str]
    env: dict[str, str] = field(default_factory=dict)  # its own, over the stack's
    host: int | None = None  # the NATS cluster host (network namespace) it runs on
    address: str = "127.0.0.1"  # where its HTTP listens

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"


@dataclass
class Stack:
    data_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    nats: NatsServer | None = None
    processes: dict[str, Process] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)  # fixed ports; others are free ones
    # TLS, and each service connecting as its own NATS user with only its catalog subjects
    # (a development CA, certificates and passwords made under data_dir/nats-security).
    secure: bool = False
    security: dev_pki.DevSecurity | None = None
    # 3: a routed cluster of that many nats-servers on loopback (`nats_cluster`) instead of
    # one; the services get every server's URL (docs/operations.md, NATS cluster).
    nats_servers: int = 1
    nats_cluster: NatsCluster | None = None
    # With a cluster: each nats-server on a host of its own (a network namespace on a bridge,
    # `start_nats_cluster(netns=True)`; needs root), and `hosts` places processes on them by
    # name, {"scheduler": 0, "gateway-2": 1}: such a process runs in that namespace, listens
    # on the host's address, is given its own host's nats-server first among the seeds, and
    # reaches a loopback PostgreSQL through a forwarder on the bridge. Others (the receiver,
    # unplaced services) stay in the root namespace. `kill_host(i)` / `restart_host(i)`.
    nats_hosts: bool = False
    hosts: dict[str, int] = field(default_factory=dict)
    forwarder: subprocess.Popen[bytes] | None = None
    hosted_database_url: str | None = None
    # Ports handed out so far: a process binds its port only once it has started, so a port
    # the kernel calls free may already be promised to one still starting.
    _promised: set[int] = field(default_factory=set, repr=False)

    def _free_port(self, host: str = "127.0.0.1") -> int:
        """A free port no process of this stack has been promised yet."""
        while True:
            port = free_port(host)
            if port not in self._promised and port not in self.ports.values():
                self._promised.add(port)
                return port

    @property
    def database_url(self) -> str:
        return self.env.get(
            "CRATER_DATABASE_URL", f"sqlite+aiosqlite:///{self.data_dir / 'crater.db'}"
        )

    @property
    def callback_database_url(self) -> str:
        """The callback's database: its own when the stack has one for it, else the shared."""
        return self.env.get("CRATER_CALLBACK_DATABASE_URL") or self.database_url

    def _database_env(self, extra_env: Mapping[str, str] | None = None) -> dict[str, str]:
        """Each process's databases: the shared one, and the callback's, always named, so
        that one left in the shell (`source var/demo/env.sh`) never reaches the callback."""
        given = {**self.env, **(extra_env or {})}
        shared = given.get("CRATER_DATABASE_URL", self.database_url)
        return {
            "CRATER_DATABASE_URL": shared,
            "CRATER_CALLBACK_DATABASE_URL": self._callback_database(given) or shared,
        }

    def _callback_database(self, given: Mapping[str, str] | None = None) -> str | None:
        """A database of the callback's own, if any, from the settings the stack is given
        (`given`: the stack's env and a start's extra_env): the one named, else, on the
        stack's default SQLite, a file of its own beside the shared one, so that its commits
        (a webhook's record, claim and attempt) never wait for another process's on the
        file's one write lock (measured: a webhook 683 -> 267 ms p50 after its event at 10
        tasks/s, docs/architecture.md, Persistence). A database given for all is used by
        all."""
        given = self.env if given is None else given
        own = given.get("CRATER_CALLBACK_DATABASE_URL")
        if own:
            return own
        if "CRATER_DATABASE_URL" in given:
            return None
        return f"sqlite+aiosqlite:///{self.data_dir / 'callback.db'}"

    @property
    def nats_url(self) -> str:
        """The one server's URL, or the cluster's seeds comma-separated."""
        if self.nats_cluster is not None:
            return self.nats_cluster.url
        assert self.nats is not None
        return self.nats.url

    def nats_connection(self, identity: str = "admin") -> NatsConnection:
        """How a process of the stack's connects: as `identity` when the stack is secure."""
        if self.security is None:
            return NatsConnection(self.nats_url)
        return NatsConnection(
            self.nats_url,
            identity,
            self.security.password(identity),
            str(self.security.ca_cert),
        )

    def _identity_env(self, identity: str) -> dict[str, str]:
        return self.security.env(identity) if self.security is not None else {}

    def url(self, name: str) -> str:
        return self.processes[name].url

    @property
    def api_token(self) -> str:
        """The stack's admin API key (every scope, every tenant), made on its first start."""
        return read_secret(self.data_dir / "secrets" / ADMIN_TOKEN)

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.api_token}"}

    def gateway_client(self, timeout: float = 10.0) -> httpx.AsyncClient:
        """An HTTP client of the gateway, authenticated as the stack's admin."""
        return httpx.AsyncClient(
            base_url=self.url("gateway"), timeout=timeout, headers=self.auth_headers
        )

    def start(
        self,
        services: tuple[str, ...] = SERVICES,
        extra_env: dict[str, str] | None = None,
        *,
        local_node: bool = False,
        replicas: dict[str, int] | None = None,
    ) -> None:
        """nats-server, migrations, the receiver, then each service (and, with `local_node`,
        this machine as node LOCAL_NODE of pool LOCAL_POOL, running what is placed on it);
        waits for every /healthz. `replicas` runs more than one process of a service, named
        by `replica_names` ({"callback": 2}: "callback" and "callback-2"), each its own port,
        all on the same durables, database and NATS identity (docs/operations.md, Replicas)."""
        (self.data_dir / "logs").mkdir(parents=True, exist_ok=True)
        if self.secure:
            self.security = dev_pki.prepare(
                self.data_dir / "nats-security", nodes=(LOCAL_NODE,) if local_node else ()
            )
        if self.nats_servers > 1:
            if self.secure:
                raise ValueError("a secure stack runs one nats-server")
            self.nats_cluster = start_nats_cluster(
                self.data_dir / "nats-cluster",
                self.nats_servers,
                netns=self.nats_hosts,
                log_dir=self.data_dir / "logs",
            )
            self.nats = self.nats_cluster.servers[0]
        elif self.nats_hosts or self.hosts:
            raise ValueError("hosts need a NATS cluster: nats_servers > 1")
        else:
            self.nats = start_nats_server(
                self.data_dir / "jetstream",
                log_file=self.data_dir / "logs" / "nats-server.log",
                config_file=self.security.config if self.security else None,
                tls=self.security is not None,
            )
        secret_files = stack_secrets(self.data_dir)
        self.env = {
            "CRATER_ENVIRONMENT": "production",  # its own secrets pass production's checks
            "CRATER_NATS_URL": self.nats_url,
            **self._database_env(extra_env),
            "CRATER_TRACE_FILE": str(self.data_dir / "traces.jsonl"),
            "CRATER_MIGRATE_ON_START": "false",
            "CRATER_LOG_LEVEL": "INFO",
            "CRATER_PROBE_MODE": "fleet",  # a simulated fleet, and it runs what is placed
            **(extra_env or {}),
        }
        migrate(self.database_url, self.callback_database_url)
        # With hosts, what runs outside them listens on the bridge too: reachable from both.
        outside = self.nats_cluster.bridge_address if self.nats_cluster else None
        outside = outside or "127.0.0.1"
        if self.hosts:
            self.hosted_database_url = self._forward_database(outside)
        receiver_port = self._free_port()
        self._spawn(
            "receiver",
            receiver_port,
            [
                "receiver",
                "--host",
                outside,
                "--port",
                str(receiver_port),
                "--username",
                WEBHOOK_USER,
                "--record-file",
                str(self.data_dir / "webhooks.jsonl"),
            ],
            {  # off its command line
                "CRATER_RECEIVER_PASSWORD": read_secret(secret_files["webhook_password"]),
                "CRATER_RECEIVER_SECRET": read_secret(secret_files["webhook_secret"]),
            },
            outside,
        )
        self.env.update(
            {
                "CRATER_CALLBACK_WEBHOOK_URL": f"http://{outside}:{receiver_port}/webhooks",
                "CRATER_CALLBACK_WEBHOOK_USERNAME": WEBHOOK_USER,
            }
        )
        # The gateway requires a bearer token (production's default): the stack's keys file
        # holds one admin key, whose token is secrets/admin-token (`api_token`).
        if not {**os.environ, **self.env}.get("CRATER_GATEWAY_API_KEYS_FILE"):
            self.env["CRATER_GATEWAY_API_KEYS_FILE"] = str(stack_api_keys(self.data_dir))
        for variable, name in SECRET_VARIABLES.items():
            # Unless the caller gave that secret (its variable or its file) itself.
            given = {**os.environ, **self.env}
            if not given.get(variable) and not given.get(f"{variable}_FILE"):
                self.env[f"{variable}_FILE"] = str(secret_files[name])
        ports = {name: self.ports.get(name) or self._free_port() for name in services}
        if "gateway" in ports:  # where a task's crater_client posts its usage samples
            self.env.setdefault(
                "CRATER_SCHEDULER_GATEWAY_URL",
                f"http://{self._address_of('gateway')}:{ports['gateway']}",
            )
        for name in services:
            self._spawn(name, ports[name], ["run", name], self._identity_env(name))
            for replica in replica_names(name, (replicas or {}).get(name, 1))[1:]:
                port = self.ports.get(replica) or self._free_port()
                self._spawn(replica, port, ["run", name], self._identity_env(name))
        # The services declare the streams; a node's agent may declare none (its permissions
        # allow none) and fails to start when it comes first ("stream not found"), so it is
        # started once they answer.
        for process in self.processes.values():
            wait_healthy(process)
        if local_node:
            self._spawn(
                "agent",
                self._free_port(),
                ["run", "probe"],
                {
                    "CRATER_PROBE_MODE": "local",
                    "CRATER_PROBE_EXECUTE": "true",
                    "CRATER_PROBE_NODE_ID": LOCAL_NODE,
                    "CRATER_PROBE_POOL": LOCAL_POOL,
                    "CRATER_PROBE_STATE_DIR": str(self.data_dir / "agent"),
                    # as this node only: it may report on local-01 and nothing else
                    **self._identity_env(node_identity(LOCAL_NODE)),
                },
            )
            wait_healthy(self.processes["agent"])

    def _spawn(
        self,
        name: str,
        port: int,
        args: list[str],
        own_env: dict[str, str] | None = None,
        address: str | None = None,
    ) -> None:
        log_path = self.data_dir / "logs" / f"{name}.log"
        host = self.hosts.get(name)
        prefix: list[str] = []
        placed: dict[str, str] = {}
        if host is not None:
            prefix, placed = self._on_host(host)
        env = {
            **os.environ,
            **self.env,
            **placed,
            **(own_env or {}),
            "CRATER_HTTP_PORT": str(port),
        }
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                [*prefix, sys.executable, "-m", "crater.cli", *args],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # Ctrl-C reaches us, and we stop them in order
            )
        self.processes[name] = Process(
            name,
            port,
            popen,
            log_path,
            args,
            own_env or {},
            host,
            address or self._address_of(name),
        )

    def _address_of(self, name: str) -> str:
        """Where process `name` listens: its host's address, else loopback."""
        host = self.hosts.get(name)
        if host is None or self.nats_cluster is None or not self.nats_cluster.hosts:
            return "127.0.0.1"
        return self.nats_cluster.hosts[host].address

    def _on_host(self, host: int) -> tuple[list[str], dict[str, str]]:
        """The command prefix and the settings of a process placed on `host`."""
        cluster = self.nats_cluster
        if cluster is None or not cluster.hosts:
            raise ValueError("processes are placed on hosts only with nats_hosts=True")
        address = cluster.hosts[host].address
        seeds = [cluster.urls[host], *(u for i, u in enumerate(cluster.urls) if i != host)]
        env = {
            "CRATER_HTTP_HOST": address,
            "CRATER_GATEWAY_HTTP_HOST": address,
            "CRATER_NATS_URL": ",".join(seeds),  # its own host's server first
        }
        if self.hosted_database_url is not None:
            env["CRATER_DATABASE_URL"] = self.hosted_database_url
            if self.callback_database_url == self.database_url:  # the callback shares it
                env["CRATER_CALLBACK_DATABASE_URL"] = self.hosted_database_url
        return cluster.on_host(host), env

    def _forward_database(self, bridge: str) -> str | None:
        """The database URL for processes on hosts: a PostgreSQL on the root namespace's
        loopback is reached through a forwarder listening on the bridge (SQLite is a file:
        the same path)."""
        url = make_url(self.database_url)
        if not url.drivername.startswith("postgresql") or url.host not in (
            None,
            "localhost",
            "127.0.0.1",
        ):
            return None
        port = self._free_port(bridge)
        self.forwarder = start_forwarder(bridge, port, "127.0.0.1", url.port or 5432)
        return url.set(host=bridge, port=port).render_as_string(hide_password=False)

    def kill(self, name: str) -> None:
        """Kill a service without warning (tests of crash recovery)."""
        process = self.processes[name]
        process.popen.kill()
        process.popen.wait()

    def restart(self, name: str) -> None:
        process = self.processes.pop(name)
        if process.popen.poll() is None:
            stop_process(process)
        self._spawn(name, process.port, process.args, process.env, process.address)
        wait_healthy(self.processes[name])

    def on_host(self, index: int) -> list[str]:
        """The names of the processes placed on host `index`."""
        return [name for name, process in self.processes.items() if process.host == index]

    def kill_host(self, index: int) -> list[str]:
        """Host `index` lost: SIGKILL, all at once, its nats-server, every process placed on
        it and anything else in its namespace. Returns the names of the processes killed."""
        cluster = self.nats_cluster
        if cluster is None or not cluster.hosts:
            raise ValueError("kill_host needs nats_hosts=True")
        names = self.on_host(index)
        pids = {self.processes[name].popen.pid for name in names}
        pids |= {cluster.servers[index].process.pid, *cluster.host_pids(index)}
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for name in names:
            self.processes[name].popen.wait()
        cluster.kill(index)  # reaped
        return names

    def restart_host(self, index: int) -> None:
        """Host `index` back: its nats-server (same name, store and address: it catches up
        from the others), then each process placed on it, waiting for each /healthz."""
        cluster = self.nats_cluster
        if cluster is None or not cluster.hosts:
            raise ValueError("restart_host needs nats_hosts=True")
        cluster.restart(index)
        names = self.on_host(index)
        for name in names:  # all started, then waited for
            process = self.processes.pop(name)
            if process.popen.poll() is None:
                stop_process(process)
            self._spawn(name, process.port, process.args, process.env, process.address)
        for name in names:
            wait_healthy(self.processes[name])

    def stop(self) -> None:
        """SIGTERM every service (they drain and close), then the receiver, then nats-server."""
        for name in reversed([n for n in self.processes if n != "receiver"]):
            stop_process(self.processes[name])
        if "receiver" in self.processes:
            stop_process(self.processes["receiver"])
        if self.nats_cluster is not None:
            self.nats_cluster.stop()
        elif self.nats is not None:
            self.nats.stop()
        if self.forwarder is not None and self.forwarder.poll() is None:
            self.forwarder.kill()
            self.forwarder.wait()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def replica_names(service: str, count: int) -> list[str]:
    """The process names of `count` replicas of `service`: the service's own, then -2, -3..."""
    if count < 1:
        raise ValueError(f"{service}: at least one replica, not {count}")
    return [service, *(f"{service}-{n}" for n in range(2, count + 1))]


# Each secret the stack makes, and the variable whose _FILE hands it to its service.
SECRET_VARIABLES = {
    "CRATER_SCHEDULER_TOKEN_SECRET": "token_secret",
    "CRATER_CALLBACK_WEBHOOK_PASSWORD": "webhook_password",
    "CRATER_CALLBACK_WEBHOOK_SECRET": "webhook_secret",
}


def stack_secrets(data_dir: Path) -> dict[str, Path]:
    """The data directory's secrets (secrets/<name>, mode 0600), made random on its first
    start and kept after: the scheduler's token secret, the webhook password and signing
    secret the callback and the receiver share."""
    from crater.callback.domain.signing import generate_secret

    makers: dict[str, Callable[[], str]] = {
        "token_secret": lambda: secrets.token_urlsafe(48),
        "webhook_password": lambda: secrets.token_urlsafe(24),
        "webhook_secret": generate_secret,
    }
    folder = data_dir / "secrets"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    paths = {}
    for name, make in makers.items():
        paths[name] = path = folder / name
        if not path.exists():
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w", encoding="utf-8") as file:
                file.write(make() + "\n")
    return paths


ADMIN_TOKEN = "admin-token"


def stack_api_keys(data_dir: Path) -> Path:
    """The gateway's keys file (secrets/api-keys.yaml), made on the first start with one admin
    key whose token is kept in secrets/admin-token (mode 0600); `crater tokens create --file`
    adds more."""
    from crater.gateway.apikeys import Scope, new_key, read_keys_file, write_keys_file

    folder = data_dir / "secrets"
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    keys, token_path = folder / "api-keys.yaml", folder / ADMIN_TOKEN
    if not token_path.exists():  # keys added to the file since are kept
        token, key = new_key("admin", [Scope.ADMIN], name="crater up admin")
        write_keys_file(keys, [*read_keys_file(keys), key])
        descriptor = os.open(token_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(token + "\n")
    return keys


def read_secret(path: Path) -> str:
    return path.read_text(encoding="utf-8").strip()


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def migrate(database_url: str, callback_database_url: str | None = None) -> None:
    """Every service's Alembic history, in one database, or the callback's in its own."""
    from crater.callback.app import MIGRATIONS_DIR as CALLBACK_MIGRATIONS
    from crater.predictor.app import MIGRATIONS_DIR as PREDICTOR_MIGRATIONS
    from crater.scheduler.app import MIGRATIONS_DIR as SCHEDULER_MIGRATIONS

    upgrade_to_head(database_url, SCHEDULER_MIGRATIONS)
    upgrade_to_head(callback_database_url or database_url, CALLBACK_MIGRATIONS)
    upgrade_to_head(database_url, PREDICTOR_MIGRATIONS)


def stop_process(process: Process, timeout: float = 15.0) -> None:
    if process.popen.poll() is not None:
        return
    process.popen.send_signal(signal.SIGTERM)
    try:
        process.popen.wait(timeout)
    except subprocess.TimeoutExpired:
        process.popen.kill()
        process.popen.wait()


def wait_healthy(process: Process, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.popen.poll() is not None:
            tail = process.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{process.name} exited with {process.popen.returncode}:\n{tail}")
        try:
            if httpx.get(f"{process.url}/healthz", timeout=1.0).is_success:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{process.name} not healthy on {process.url} after {timeout} s")
