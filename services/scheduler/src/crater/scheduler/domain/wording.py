"""Reasons as sentences: a filter's message is written for one node (`has fewer than 2 free
GPUs`); a count of nodes makes it agree (`3 nodes have fewer than 2 free GPUs`)."""

from __future__ import annotations

from crater.contracts import FilterReason

# Reasons about the task, not about nodes: their message is the whole sentence.
NODELESS_FILTERS = frozenset(
    {
        "TenantQuota",
        "TenantBudget",
        "Borrow",
        "RestartBackoff",
        "Preemption",
        "Ageing",
        "FabricDomain",
        "GpuPreference",
        "UserLimit",
        "QueueLimit",
    }
)
PLURAL_VERBS = {
    "has": "have",
    "is": "are",
    "does": "do",
    "lacks": "lack",
    "runs": "run",
    "declares": "declare",
}


def sentence(reason: FilterReason) -> str:
    """A reason as a clause: `2 nodes have fewer than 1 free GPU`, `1 node is not ready`;
    a reason about the task itself (quota, borrowing) as its message."""
    if reason.filter in NODELESS_FILTERS:
        return reason.message
    return for_nodes(reason.nodes, reason.message)


def for_nodes(count: int, predicate: str) -> str:
    """`count` nodes and a predicate written for one node (`has ...`), agreeing in number."""
    if count == 1:
        return f"1 node {predicate}"
    return f"{count} nodes {plural(predicate)}"


def plural(predicate: str) -> str:
    """`has fewer than 2 free GPUs` -> `have fewer than 2 free GPUs`; `already runs` -> `already
    run`."""
    first, _, rest = predicate.partition(" ")
    if first == "already":
        return f"already {plural(rest)}"
    verb = PLURAL_VERBS.get(first, first)
    return f"{verb} {rest}" if rest else verb
