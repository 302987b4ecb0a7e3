"""Reloading the pools and quotas files without a restart.

The scheduler looks at the files' modification time and size on its decision cycle (at most
once per `interval` seconds, before deciding on an event). When one changed, both are read and
validated; a valid pair replaces the running configuration from that event on (every waiting
task is tried again), an invalid one is refused with the field and the reason, logged and
counted, and the configuration running stays. A file that disappears counts as invalid: the
configuration is kept rather than dropped to the defaults.

Why a poll and not a command (`crater pools reload` over NATS): the files are what operators
edit (a ConfigMap mounted into the pod is updated in place), so noticing the change needs no
one to remember a second step, adds no message contract nor who-may-call-it, and a standby
that takes over reads the same files.
The API (`SchedulerService.apply_config`, the gateway's `PUT /api/v1/admin/pools|quotas`)
applies a file's content too, without writing it: the next change of a file here wins.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from crater.scheduler.adapters.pools_file import PoolsFileError, load_pools
from crater.scheduler.adapters.quotas_file import QuotasFileError, load_quotas
from crater.scheduler.domain.config import SchedulerConfig
from crater.scheduler.domain.pools import PoolPolicy
from crater.scheduler.domain.quotas import TenantQuotas

log = logging.getLogger(__name__)

Stamp = tuple[int, int] | None  # (mtime ns, size); None: the file is not there


def _stamp(path: Path | None) -> Stamp:
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


@dataclass
class Reload:
    """What one look at the files found: a new configuration, or why it was refused."""

    config: SchedulerConfig | None = None
    refused: str | None = None


class ConfigWatch:
    """Notices a change of the pools or quotas file and reads them again."""

    def __init__(
        self,
        pools_file: Path | None,
        quotas_file: Path | None,
        interval: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.pools_file = pools_file
        self.quotas_file = quotas_file
        self.interval = interval
        self.clock = clock
        self.stamps = (_stamp(pools_file), _stamp(quotas_file))
        self.looked_at: float | None = None

    @property
    def watching(self) -> bool:
        return self.pools_file is not None or self.quotas_file is not None

    def poll(self, running: SchedulerConfig) -> Reload | None:
        """None when nothing changed (or it is too soon to look again); else the files read
        again over `running`: a new configuration, or why they are refused."""
        if not self.watching:
            return None
        now = self.clock()
        if self.looked_at is not None and now - self.looked_at < self.interval:
            return None
        self.looked_at = now
        stamps = (_stamp(self.pools_file), _stamp(self.quotas_file))
        if stamps == self.stamps:
            return None
        self.stamps = stamps  # a refused version is said once, not on every look
        try:
            pools = running.pools if self.pools_file is None else load_pools(self.pools_file)
            tenants = (
                TenantQuotas(
                    running.quotas,
                    running.tenant_shares,
                    running.user_limits,
                    running.queues,
                    running.queue_of,
                )
                if self.quotas_file is None
                else load_quotas(self.quotas_file)
            )
        except (PoolsFileError, QuotasFileError) as error:
            return Reload(refused=str(error))
        except OSError as error:
            return Reload(refused=f"{error.filename}: cannot be read: {error.strerror}")
        return Reload(config=with_files(running, pools, tenants))


def with_files(
    running: SchedulerConfig, pools: dict[str, PoolPolicy], tenants: TenantQuotas
) -> SchedulerConfig:
    """`running` with the pools and quotas files' contents in place of its own."""
    return replace(
        running,
        pools=pools,
        quotas=tenants.limits,
        tenant_shares=tenants.shares,
        user_limits=tenants.users,
        queues=tenants.queues,
        queue_of=tenants.queue_of,
    )
