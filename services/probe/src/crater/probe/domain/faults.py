"""Card faults: what NVML says is wrong with each card, and what the scheduler should do.

Xid codes map to an action after the "Resolution Bucket (Immediate Action)" column of
NVIDIA's Xid catalog, https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html
(Ampere and newer; read 2026-12). The buckets map so:

- RESTART_APP, IGNORE: the application's fault, the card is fine -> `none` (not reported;
  counted only);
- RESET_GPU -> `reset-card`: the card is cordoned until the probe reports it healthy;
- RESTART_BM (reboot the machine) -> `reboot-node`: the node is cordoned until healthy;
- CONTACT_SUPPORT -> `operator`: the card is cordoned until an operator lifts the cordon.

Three codes carry a WORKFLOW_* bucket instead; they are mapped by the catalog's own
trigger-condition text, quoted beside them. A code not confirmed in the catalog is left out:
it is an unknown Xid, reported, counted, and handled as `unknown_action` says.

An Xid is an event, not a state: the probe keeps a card's Xid fault (with the time first
seen) until the probe restarts, which after a GPU reset (`nvidia-smi -r`) or a reboot is
how the card comes back healthy. The other faults are read every round and last while NVML
reports them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from crater.contracts import (
    GpuFault,
    GpuFaultAction,
    GpuFaultKind,
    NodeMetricsReported,
    NodeTopology,
)

NONE = GpuFaultAction.NONE
RESET = GpuFaultAction.RESET_CARD
REBOOT = GpuFaultAction.REBOOT_NODE
OPERATOR = GpuFaultAction.OPERATOR

# code -> action, each confirmed in the catalog (bucket in the comment).
DEFAULT_XID_ACTIONS: dict[int, GpuFaultAction] = {
    13: NONE,  # Graphics Engine Exception: RESTART_APP
    31: NONE,  # GPU memory page fault: RESTART_APP
    43: NONE,  # GPU stopped processing (a user application's fault): IGNORE
    # WORKFLOW_XID_45; "logged when the user application aborts ... not indicative of a bug
    # but rather a user or system action" (a DBE behind it comes with its own Xid 48)
    45: NONE,
    46: RESET,  # GPU stopped processing: RESET_GPU
    # WORKFLOW_XID_48, Double Bit ECC Error: "A GPU reset or node reboot is needed to clear
    # this error"
    48: RESET,
    61: OPERATOR,  # PMU_BREAKPOINT (unused on A100 and newer): CONTACT_SUPPORT
    62: RESET,  # internal micro-controller halt: RESET_GPU
    63: NONE,  # GPU memory remapping event: IGNORE
    64: RESET,  # GPU memory remapping failure: RESET_GPU
    # WORKFLOW_NVLINK_ERR, NVLink error: "A GPU reset or node reboot is needed to clear this
    # error"
    74: RESET,
    79: REBOOT,  # GPU has fallen off the bus: RESTART_BM
    92: NONE,  # high single-bit ECC error rate: IGNORE
    94: NONE,  # contained memory error (one application's): RESTART_APP
    95: RESET,  # uncontained memory error: RESET_GPU
    109: RESET,  # context switch timeout: RESET_GPU
    119: RESET,  # GSP RPC timeout: RESET_GPU
    120: RESET,  # GSP error: RESET_GPU
    140: RESET,  # ECC unrecovered error: RESET_GPU
    143: RESET,  # GPU initialization error: RESET_GPU
    # XID_154, informational: it restates the recovery action of another Xid, which is
    # acted on itself
    154: NONE,
}
# A code missing from the table is most likely a newer driver's: the card is held out
# until it is reset and reported healthy, safe without a support ticket (docs/health.md).
DEFAULT_UNKNOWN_ACTION = RESET

# Faults read every round, and what each asks.
READ_ACTIONS: dict[GpuFaultKind, GpuFaultAction] = {
    # as Xid 48 (the DBE that comes with it): cleared by a reset
    GpuFaultKind.ECC_UNCORRECTED: RESET,
    # dynamic page retirement takes effect at the next reset
    GpuFaultKind.PAGES_PENDING_RETIREMENT: RESET,
    # the memory error management guide's RMA condition: a person must look
    GpuFaultKind.ROW_REMAP_FAILURE: OPERATOR,
    GpuFaultKind.LOST: REBOOT,  # as Xid 79
}


@dataclass(frozen=True)
class CardSignals:
    """What NVML said about one card in one round."""

    gpu: int
    lost: bool = False
    xids: tuple[int, ...] = ()  # Xid events delivered since the last round
    pages_pending: bool = False
    remap_failure: bool = False
    nvlinks_down: int = 0  # NVLinks active at discovery that are down now


@dataclass(frozen=True)
class XidSeen:
    gpu: int
    code: int
    action: GpuFaultAction
    known: bool  # in the table (the default or the operator's)


@dataclass
class FaultTracker:
    """Turns each round's signals and metrics into the heartbeat's faults, keeping when each
    was first seen and the cards' Xid faults until the probe restarts."""

    xid_actions: Mapping[int, GpuFaultAction] = field(
        default_factory=lambda: dict(DEFAULT_XID_ACTIONS)
    )
    unknown_action: GpuFaultAction = DEFAULT_UNKNOWN_ACTION
    hot_c: float = 85.0  # the health check's warning temperature
    pcie_busy_utilization: float = 50.0
    first_seen: dict[tuple[int, GpuFaultKind, int | None], datetime] = field(default_factory=dict)
    latched: dict[tuple[int, int], GpuFaultAction] = field(default_factory=dict)
    counted: Counter[tuple[int, str, bool]] = field(default_factory=Counter)

    def action_for(self, code: int) -> tuple[GpuFaultAction, bool]:
        action = self.xid_actions.get(code)
        return (self.unknown_action, False) if action is None else (action, True)

    def update(
        self,
        signals: Sequence[CardSignals],
        metrics: NodeMetricsReported | None,
        topology: NodeTopology,
        now: datetime,
    ) -> tuple[list[GpuFault], list[XidSeen]]:
        """This round's faults (sorted by card, kind, code) and the Xids it delivered."""
        seen: list[XidSeen] = []
        found: list[tuple[int, GpuFaultKind, int | None, GpuFaultAction, str]] = []
        for card in signals:
            for xid in card.xids:
                action, known = self.action_for(xid)
                seen.append(XidSeen(card.gpu, xid, action, known))
                self.counted[(xid, action.value, known)] += 1
                if action is not NONE:
                    self.latched.setdefault((card.gpu, xid), action)
            if card.lost:
                found.append(
                    (
                        card.gpu,
                        GpuFaultKind.LOST,
                        None,
                        READ_ACTIONS[GpuFaultKind.LOST],
                        "NVML: GPU is lost (fallen off the bus)",
                    )
                )
            if card.pages_pending:
                kind = GpuFaultKind.PAGES_PENDING_RETIREMENT
                found.append(
                    (
                        card.gpu,
                        kind,
                        None,
                        READ_ACTIONS[kind],
                        "retired pages pending: retired at the next reset",
                    )
                )
            if card.remap_failure:
                kind = GpuFaultKind.ROW_REMAP_FAILURE
                found.append(
                    (
                        card.gpu,
                        kind,
                        None,
                        READ_ACTIONS[kind],
                        "row remapping failed: the card needs service",
                    )
                )
            if card.nvlinks_down:
                found.append(
                    (
                        card.gpu,
                        GpuFaultKind.NVLINK_DEGRADED,
                        None,
                        NONE,
                        f"{card.nvlinks_down} NVLink(s) down",
                    )
                )
        for (gpu, xid), action in self.latched.items():
            known = xid in self.xid_actions
            found.append(
                (
                    gpu,
                    GpuFaultKind.XID,
                    xid,
                    action,
                    f"Xid {xid}{'' if known else ' (not in the Xid table)'}",
                )
            )
        found += self._from_metrics(metrics, topology)
        faults: list[GpuFault] = []
        live: set[tuple[int, GpuFaultKind, int | None]] = set()
        for gpu, kind, code, action, detail in sorted(found, key=lambda f: (f[0], f[1], f[2] or 0)):
            key = (gpu, kind, code)
            if key in live:
                continue
            live.add(key)
            since = self.first_seen.setdefault(key, now)
            faults.append(
                GpuFault(gpu=gpu, kind=kind, action=action, xid=code, since=since, detail=detail)
            )
        # A fault gone (a reading back to normal) is new when it comes again.
        for key in [k for k in self.first_seen if k not in live]:
            del self.first_seen[key]
        return faults, seen

    def _from_metrics(
        self, metrics: NodeMetricsReported | None, topology: NodeTopology
    ) -> list[tuple[int, GpuFaultKind, int | None, GpuFaultAction, str]]:
        found: list[tuple[int, GpuFaultKind, int | None, GpuFaultAction, str]] = []
        if metrics is None:
            return found
        maxima = {g.index: g for g in topology.gpus}
        for reading in metrics.gpus:
            gpu = reading.index
            if reading.ecc_errors_uncorrected:
                kind = GpuFaultKind.ECC_UNCORRECTED
                found.append(
                    (
                        gpu,
                        kind,
                        None,
                        READ_ACTIONS[kind],
                        f"{reading.ecc_errors_uncorrected} uncorrected ECC errors",
                    )
                )
            if reading.temperature_c is not None and reading.temperature_c >= self.hot_c:
                found.append(
                    (
                        gpu,
                        GpuFaultKind.HOT,
                        None,
                        NONE,
                        f"{reading.temperature_c:.0f} C >= {self.hot_c:.0f} C",
                    )
                )
            card = maxima.get(gpu)
            if card is None:
                continue
            narrow = bool(
                card.pcie_width_max
                and reading.pcie_width
                and reading.pcie_width < card.pcie_width_max
            )
            slow = bool(
                card.pcie_generation_max
                and reading.pcie_generation
                and reading.pcie_generation < card.pcie_generation_max
                and reading.utilization_percent >= self.pcie_busy_utilization
            )
            if narrow or slow:
                found.append(
                    (
                        gpu,
                        GpuFaultKind.PCIE_DEGRADED,
                        None,
                        NONE,
                        f"PCIe Gen{reading.pcie_generation} x{reading.pcie_width} of "
                        f"Gen{card.pcie_generation_max} x{card.pcie_width_max}",
                    )
                )
        return found


def parse_action(text: str) -> GpuFaultAction:
    """An action by name, or the catalog's bucket name (RESET_GPU, ...)."""
    buckets = {
        "RESTART_APP": NONE,
        "IGNORE": NONE,
        "RESET_GPU": RESET,
        "RESTART_BM": REBOOT,
        "CONTACT_SUPPORT": OPERATOR,
    }
    upper = text.strip().upper()
    if upper in buckets:
        return buckets[upper]
    return GpuFaultAction(text.strip().lower())
