"""Crater's placement score: least growth of GPU fragmentation, measured against the workload
the core has actually seen.

FGD (Weng et al., USENIX ATC'23) measures a node's fragmentation against a target workload
given up front. Production has no future trace, so this score learns the workload online:
every task the core accepts counts once, into a table of request shapes (GPU count,
per-card share, GPU model) whose weights decay with a half-life counted in requests, each
with the decayed mean CPU and memory its requests ask for.

A node's fragmentation for one shape is the GPU thousandths a task of that shape could not
use there: all of them when the task cannot run there at all (too few fitting cards, the
wrong model, or too little CPU or memory left: the node's CPU or memory strands its GPUs),
otherwise the free thousandths on cards too small for its share. The node's expected
fragmentation weighs the shapes by popularity; the score rates how little it grows when
the task lands there (the cards it takes as `placement.select` takes them).

What is learned (`workload.WorkloadModel`, held as `ClusterArrays.workload`) is fed by the
core, once per task it accepts; ranking, retries and dry runs only read it.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from crater.scheduler.domain.cluster import WHOLE, BoolArray, ClusterArrays
from crater.scheduler.domain.demand import Demand
from crater.scheduler.domain.gpu_match import model_matches
from crater.scheduler.domain.workload import LearnedShape

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def card_matrix(c: ClusterArrays, idx: IntArray) -> IntArray:
    """Free thousandths of every card of nodes `idx`, one row each, padded with 0 (as many
    columns as the most cards among them): a copy of the cluster's own card matrix."""
    width = max(int(c.gpus_total[idx].max(initial=0)), 1)
    return c.card_milli[idx, :width]


def cards_after(cards: IntArray, d: Demand) -> IntArray:
    """The cards once the task lands as `placement.select` puts it: a share on the fullest
    card that still holds it, whole cards anywhere free (which ones changes nothing here)."""
    after = cards.copy()
    _land(after, d)
    return after


def _land(cards: IntArray, d: Demand) -> None:
    """`cards_after` in place (on a view of the rows to change: no copy)."""
    if not d.gpus:
        return
    if d.gpu_milli < WHOLE:
        room = np.where(cards >= d.gpu_milli, cards, np.iinfo(np.int64).max)
        cards[np.arange(len(cards)), room.argmin(axis=1)] -= d.gpu_milli
        return
    whole = cards >= WHOLE  # more than 1000 on a card time-sliced by over-commit
    cards[whole & (whole.cumsum(axis=1) <= d.gpus)] -= WHOLE


def _host_columns(gpu_shapes: list[LearnedShape]) -> FloatArray:
    """The shapes' CPU, memory and popularity as rows, one column a shape: one array where
    three were (each numpy call on a few rows costs its call, not its rows)."""
    return np.array(
        [
            [s.cpu_cores for s in gpu_shapes],
            [s.memory_mb for s in gpu_shapes],
            [s.popularity for s in gpu_shapes],
        ],
        np.float64,
    )


def expected_fragmentation(
    cards: IntArray,
    cpu_free: IntArray,
    memory_free: IntArray,
    model_ok: BoolArray | None,
    shapes: tuple[LearnedShape, ...],
    profiles: IntArray | None = None,
) -> FloatArray:
    """Per node (row of `cards`): sum over GPU shapes of popularity x the free thousandths a
    task of that shape could not use there. `model_ok[s, n]`: shape s may run on node n
    (None: every shape on every node); `profiles`: each row's capacity profile (what
    `model_ok` depends on), to work rows in the same state out once. Shapes without GPUs are
    left out: every GPU is theirs to strand wherever a task lands, the same amount on every
    node."""
    gpu_shapes = [s for s in shapes if s.gpus]
    if not gpu_shapes:
        return np.zeros(len(cards))
    total = cards.sum(axis=1)
    return _expected(cards, total, cpu_free, memory_free, model_ok, gpu_shapes, profiles)


def _expected(
    cards: IntArray,
    total: IntArray,
    cpu_free: IntArray,
    memory_free: IntArray,
    model_ok: BoolArray | None,
    gpu_shapes: list[LearnedShape],
    profiles: IntArray | None = None,
) -> FloatArray:
    """`expected_fragmentation` of GPU shapes, the cards' sums (`total`) given. With each
    row's capacity profile (`profiles`: what `model_ok` depends on), rows in the same state
    (profile, cards, free CPU and memory) are worked out once: on a large fleet a few hundred
    states stand for thousands of candidate rows."""
    distinct = None if profiles is None else _distinct_rows(cards, cpu_free, memory_free, profiles)
    if distinct is None:
        return _expected_rows(cards, total, cpu_free, memory_free, model_ok, gpu_shapes)
    first, inverse = distinct
    ok = None if model_ok is None else model_ok[:, first]
    value = _expected_rows(
        cards[first], total[first], cpu_free[first], memory_free[first], ok, gpu_shapes
    )
    return np.asarray(value[inverse], np.float64)


# Odd 63-bit multipliers that fold a row of integers into one (wrapping) for `_distinct_rows`.
_MIX: IntArray = np.random.default_rng(26).integers(1, 2**62, size=64, dtype=np.int64) | 1


def _distinct_rows(
    cards: IntArray, cpu_free: IntArray, memory_free: IntArray, profiles: IntArray
) -> tuple[IntArray, IntArray] | None:
    """One row of each distinct state and each row's state (its index among them); None when
    there are too few repeats to gain by it."""
    key = np.concatenate(
        (cards, cpu_free[:, None], memory_free[:, None], profiles[:, None]), axis=1
    )
    if key.shape[1] > len(_MIX) or len(key) < 8:
        return None
    _, first, inverse = np.unique(key @ _MIX[: key.shape[1]], True, True)
    if 4 * len(first) > 3 * len(key) or not (key[first][inverse] == key).all():
        return None  # few repeats, or two states folded alike (then counted apart)
    return first, inverse


def _expected_rows(
    cards: IntArray,
    total: IntArray,
    cpu_free: IntArray,
    memory_free: IntArray,
    model_ok: BoolArray | None,
    gpu_shapes: list[LearnedShape],
) -> FloatArray:
    """`_expected`, row by row."""
    host = _host_columns(gpu_shapes)
    wanted = host[:2, :, None]  # CPU and memory as columns: they broadcast over the nodes
    # Which cards fit, and what they strand, per distinct share (most shapes ask whole
    # cards): the (share, node, card) arrays are the large ones on a large fleet.
    millis = [s.gpu_milli for s in gpu_shapes]
    shares = list(dict.fromkeys(millis))
    fits_card = cards >= np.asarray(shares, np.int64)[:, None, None]  # (share, node, card)
    stranded = np.where(fits_card, 0, cards).sum(axis=2)
    fitting = fits_card.sum(axis=2)
    if 1 < len(shares) < len(millis):  # one row a shape (one share broadcasts as it is)
        which = [shares.index(m) for m in millis]
        stranded, fitting = stranded[which], fitting[which]
    # integers compared as integers (no cast of the large arrays to floats)
    runs = fitting >= np.asarray([s.gpus for s in gpu_shapes], np.int64)[:, None]
    runs &= cpu_free >= wanted[0]
    runs &= memory_free >= wanted[1]
    if model_ok is not None:
        runs &= model_ok
    fragment = np.where(runs, stranded, total).astype(np.float64)
    # Summed shape by shape down each column, not by a matrix product: BLAS groups the terms
    # by how many columns there are, so a node's value would hang on which others are asked.
    fragment *= host[2][:, None]
    return np.asarray(fragment.sum(axis=0), np.float64)


def host_stranded(
    cards: IntArray,
    cpu_free: IntArray,
    memory_free: IntArray,
    cpu_per_milli: float,
    memory_per_milli: float,
) -> FloatArray:
    """Free GPU thousandths the node's free CPU or memory cannot feed, at the CPU and memory
    per GPU thousandth the workload asks: GPUs stranded by the host."""
    return _host_stranded(cards.sum(axis=1), cpu_free, memory_free, cpu_per_milli, memory_per_milli)


def _host_stranded(
    total: IntArray,
    cpu_free: IntArray,
    memory_free: IntArray,
    cpu_per_milli: float,
    memory_per_milli: float,
) -> FloatArray:
    """`host_stranded`, the cards' sums (`total`) given."""
    # min(inf, x) is x (NaN too): the first bound stands alone, no array of inf to fold in
    feedable: FloatArray | None = None
    if cpu_per_milli > 0:
        feedable = np.maximum(cpu_free, 0) / cpu_per_milli
    if memory_per_milli > 0:
        by_memory = np.maximum(memory_free, 0) / memory_per_milli
        feedable = by_memory if feedable is None else np.minimum(feedable, by_memory)
    if feedable is None:
        feedable = np.full(len(total), np.inf)
    return np.asarray(np.maximum(total - feedable, 0.0), np.float64)


def models_ok(c: ClusterArrays, idx: IntArray, shapes: tuple[LearnedShape, ...]) -> BoolArray:
    gpu_shapes = [s for s in shapes if s.gpus]
    ok = np.ones((len(gpu_shapes), len(idx)), np.bool_)
    for row, shape in enumerate(gpu_shapes):
        if shape.gpu_model:
            ok[row] = model_matches(c, idx, shape.gpu_model)
    return ok


def fragmentation_growth(c: ClusterArrays, d: Demand, idx: IntArray) -> FloatArray:
    """How much each candidate node's expected fragmentation grows (in GPU thousandths; less
    than 0: shrinks) when `d` lands there, against the workload learned so far. Nodes
    without GPUs: 0."""
    growth = np.zeros(len(idx))
    if d.mig_profile is not None:  # a MIG slice takes no share of the cards counted here
        return growth
    model = c.workload
    gpu_shapes = [s for s in model.shapes() if s.gpus]
    cards_each = c.gpus_total[idx]
    gpu_rows = np.flatnonzero(cards_each)  # a count is never below 0
    if not len(gpu_rows) or not gpu_shapes:
        return growth
    # before and after in one pass: rows [0, n) before, [n, 2n) after, each half gathered
    # and changed in place (the arrays and their order as ever: the sums come out the same)
    n = len(gpu_rows)
    nodes = idx[gpu_rows]
    both = np.concatenate((nodes, nodes))
    cards = c.card_milli[both, : max(int(cards_each.max()), 1)]
    _land(cards[n:], d)
    cpu = c.cpu_free[both]
    cpu[n:] -= d.cpu_cores
    memory = c.memory_free_mb[both]
    memory[n:] -= d.memory_mb
    ok = models_ok(c, both, model.shapes()) if any(s.gpu_model for s in gpu_shapes) else None
    total = cards.sum(axis=1)
    value = _expected(cards, total, cpu, memory, ok, gpu_shapes, c.capacity_profiles()[0][both])
    # GPUs the host cannot feed count like those too small for any task: a stranded card
    # is a stranded card, whichever resource strands it
    value += _host_stranded(total, cpu, memory, *model.host_per_gpu_milli())
    growth[gpu_rows] = value[n:] - value[:n]
    growth[gpu_rows] += reserve_cost(c, d, nodes, gpu_shapes, cards[n:])
    return growth


# How much a GPU thousandth taken from capacity that scarce work needs counts against the
# fragmentation it saves, at a pressure of 1 (that work's demand in proportion to the
# capacity left for it).
RESERVE_WEIGHT = 1.0
# How much leaving a node unable to hold a scarce shape it could hold now counts, per GPU
# thousandth of that shape, at a pressure of 1. Chosen on the generator's traces, seed 42:
# at 1 the last holders of eight-card, many-core shapes are kept through 85% arrived but
# CPU-only work strands more cards elsewhere (cpuheavy30: 0.97 points less at 130% than
# without); at 0.1 they are gone before FGD's are.
HOLDER_WEIGHT = 0.3


def _could_hold(
    c: ClusterArrays,
    rows: IntArray,
    gpus: list[int],
    cpu_cores: list[float],
    memory_mb: list[float],
    gpu_models: list[str | None],
) -> BoolArray:
    """[request, row]: whether node `rows[row]` could ever hold the request, empty: enough
    cards, CPU and memory in all, and the model it names."""
    ok = c.gpus_total[rows] >= np.asarray(gpus, np.int64)[:, None]
    ok &= c.cpu_capacity[rows] >= np.asarray(cpu_cores, np.float64)[:, None]
    ok &= c.memory_capacity_mb[rows] >= np.asarray(memory_mb, np.float64)[:, None]
    for model in dict.fromkeys(m for m in gpu_models if m):
        named = [k for k, m in enumerate(gpu_models) if m == model]
        ok[named] &= model_matches(c, rows, model)
    return np.asarray(ok, np.bool_)


def _holds(
    c: ClusterArrays,
    rows: IntArray,
    gpus: IntArray,
    cpu_cores: FloatArray,
    memory_mb: FloatArray,
) -> BoolArray:
    """[shape, row]: whether node `rows[row]` could take a task of each shape (whole cards,
    its cores and memory) now."""
    ok = c.gpus_free[rows] >= gpus[:, None]
    ok &= c.cpu_free[rows] >= cpu_cores[:, None]
    ok &= c.memory_free_mb[rows] >= memory_mb[:, None]
    return np.asarray(ok, np.bool_)


def _present_profiles(
    c: ClusterArrays, every: IntArray
) -> tuple[IntArray, IntArray, IntArray, IntArray]:
    """Each row's profile, one row of each profile, the profiles present among rows `every`
    (ascending) and each of `every`'s place among them: `np.unique(..., return_inverse=True)`
    without its sort (profiles are small integers)."""
    profile_of, first = c.capacity_profiles()
    counts = np.bincount(profile_of[every], minlength=len(first))
    present = np.flatnonzero(counts)
    place = np.cumsum(counts > 0) - 1
    return profile_of, first, present, place[profile_of[every]]


def _scarcity(
    c: ClusterArrays, d: Demand, gpu_shapes: list[LearnedShape], every: IntArray
) -> tuple[IntArray, IntArray, IntArray, BoolArray, IntArray]:
    """Which of `gpu_shapes` are scarce for `d`: held by some nodes of `every` but not all
    (room to keep), and `d` could run outside that set (work that could run only within it
    takes nothing from it). Each node's profile, the present profiles, each of `every`'s
    place among them, which present profile could hold each shape, and the scarce shapes'
    rows. What could hold what is a matter of each node's profile (its capacity and cards):
    a fleet has few, so it is worked out per profile, not per node."""
    profile_of, first, present, of_every = _present_profiles(c, every)
    held = _could_hold(
        c,
        first[present],
        [s.gpus for s in gpu_shapes] + [d.gpus],
        [s.cpu_cores for s in gpu_shapes] + [d.cpu_cores],
        [s.memory_mb for s in gpu_shapes] + [d.memory_mb],
        [s.gpu_model for s in gpu_shapes] + [d.gpu_model],
    )
    mine, shape_held = held[-1], held[:-1]
    scarce_rows = np.flatnonzero(
        ~shape_held.all(axis=1) & shape_held.any(axis=1) & (mine & ~shape_held).any(axis=1)
    )
    return profile_of, present, of_every, shape_held, scarce_rows


def _cuts(
    c: ClusterArrays,
    d: Demand,
    nodes: IntArray,
    shapes: list[LearnedShape],
    every: IntArray,
    cards_after: IntArray | None,
) -> tuple[BoolArray, BoolArray]:
    """[shape, node] for `shapes` of whole cards: which of `nodes` hold one now and could
    not once `d` lands there (`cards_after`: their cards then; None: worked out here), and
    which of `every` hold one now."""
    if cards_after is None:
        cards_after = cards_after_landing(c, d, nodes)
    gpus = np.asarray([s.gpus for s in shapes], np.int64)
    cpu = np.asarray([s.cpu_cores for s in shapes], np.float64)
    memory = np.asarray([s.memory_mb for s in shapes], np.float64)
    lost = (cards_after >= WHOLE).sum(axis=1) < gpus[:, None]
    lost |= c.cpu_free[nodes] - d.cpu_cores < cpu[:, None]
    lost |= c.memory_free_mb[nodes] - d.memory_mb < memory[:, None]
    breaking = _holds(c, nodes, gpus, cpu, memory) & lost
    return breaking, _holds(c, every, gpus, cpu, memory)


def reserve_cost(
    c: ClusterArrays,
    d: Demand,
    nodes: IntArray,
    gpu_shapes: list[LearnedShape],
    cards_after: IntArray | None = None,
) -> FloatArray:
    """What `d` costs on each of `nodes` by taking capacity that scarce work needs: work of
    the learned shapes that only some nodes could ever hold (a GPU model named, or more
    cards, cores or memory than most nodes have). Work that could run only within such a set
    of nodes pays nothing there: the capacity is for it. Two parts:

    - per set, the set's share of the GPU demand over its share of the free GPUs, times what
      `d` takes of the set's capacity: its GPU thousandths or, where more, its cores counted
      in the thousandths they would feed at the cores the set's scarce work asks per
      thousandth (a CPU-only task on a 96-core eight-card node takes room an 88-core
      eight-card task needs as surely as a card does; memory is not counted so: work that
      asks little memory per card would make any task's memory worth all its cards). Where
      that demand follows the free capacity the cost is even; as the set runs short it
      grows, and work that can go elsewhere does;
    - per scarce shape of whole cards, on a node that could hold one now and could not once
      `d` lands (`cards_after`: the nodes' cards then; None: worked out here), the shape's
      share of the GPU demand over the share of the free GPUs on the nodes able to hold it
      now, times its thousandths and `HOLDER_WEIGHT`: each cut costs little in fragmentation
      (a rare shape's popularity), and many cuts leave it nowhere to run."""
    cost = np.zeros(len(nodes))
    asked = d.gpus * (d.gpu_milli or WHOLE)
    if not gpu_shapes or not (asked or d.cpu_cores > 0 or d.memory_mb > 0):
        return cost
    every = np.flatnonzero(c.ready & (c.gpus_total > 0))
    if not len(every):
        return cost
    profile_of, present, of_every, shape_held, scarce_rows = _scarcity(c, d, gpu_shapes, every)
    if not len(scarce_rows):
        return cost
    # per set of nodes: its scarce shapes, and the GPU thousandths and cores they ask
    sets: dict[bytes, tuple[BoolArray, list[int], list[float]]] = {}
    for row in scarce_rows.tolist():
        s, where = gpu_shapes[row], shape_held[row]
        _, scarce, wanted = sets.setdefault(where.tobytes(), (where, [], [0.0, 0.0]))
        scarce.append(row)
        wanted[0] += s.popularity * s.gpus * s.gpu_milli
        wanted[1] += s.popularity * s.cpu_cores
    demand = sum(s.popularity * s.gpus * s.gpu_milli for s in gpu_shapes)
    free = np.bincount(of_every, weights=c.gpu_milli_free[every], minlength=len(present))
    free_total = float(free.sum())
    # each candidate's place among the present profiles (-1: not ready or no cards)
    place = np.full(len(profile_of), -1, np.int64)
    place[every] = of_every
    at = place[nodes]
    known = at >= 0
    at = np.maximum(at, 0)
    # which nodes hold each scarce shape of whole cards now, and which could not once `d`
    # lands, all shapes at once (a row of `whole` per such shape)
    whole = [r for r in scarce_rows.tolist() if gpu_shapes[r].gpu_milli >= WHOLE]
    row_of = {r: k for k, r in enumerate(whole)}
    if whole:
        breaking, holding = _cuts(c, d, nodes, [gpu_shapes[r] for r in whole], every, cards_after)
    for where, scarce, (milli, cores) in sets.values():
        inside = known & where[at]
        taken = float(asked)
        if cores > 0:
            taken = max(taken, d.cpu_cores * milli / cores)
        pressure = (milli / demand) * free_total / max(float(free[where].sum()), WHOLE)
        cost += np.where(inside, RESERVE_WEIGHT * pressure * taken, 0.0)
        in_set = where[of_every]
        for row in scarce:
            if row not in row_of:
                continue  # a share fits some card of most nodes: no node is its last
            s = gpu_shapes[row]
            breaks = inside & breaking[row_of[row]]
            if not breaks.any():
                continue
            size = s.gpus * s.gpu_milli
            holders = float((holding[row_of[row]] & in_set).sum()) * size
            pressure = (s.popularity * size / demand) * free_total / max(holders, WHOLE)
            cost += np.where(breaks, HOLDER_WEIGHT * pressure * size, 0.0)
    return np.asarray(cost, np.float64)


def held_for_scarce(c: ClusterArrays, d: Demand, nodes: IntArray, keep: int) -> BoolArray:
    """Which of `nodes` a task asking no GPU is kept off: where it would leave fewer than
    `keep` nodes able to hold a scarce shape of whole cards (`_scarcity`: one that only some
    nodes could ever hold, learned from the workload seen), by taking one of them. A cost
    cannot do this: once every node with the cores it asks is such a holder (the rest of the
    fleet busy), it goes to one of them whatever it costs, and the scarce work that comes
    next has nowhere to run (openb's CPU-heavy traces: 120-core eight-card pods failing at
    62% arrived, the 39 nodes able to hold them all opened by 32-core CPU-only pods). Work
    with GPUs is not held: it takes cards the scarce work would, and scores for that."""
    held = np.zeros(len(nodes), np.bool_)
    if keep <= 0 or d.gpus or not len(nodes) or not (d.cpu_cores > 0 or d.memory_mb > 0):
        return held
    gpu_shapes = [s for s in c.workload.shapes() if s.gpus and s.gpu_milli >= WHOLE]
    every = np.flatnonzero(c.ready & (c.gpus_total > 0))
    if not gpu_shapes or not len(every):
        return held
    scarce_rows = _scarcity(c, d, gpu_shapes, every)[-1]
    if not len(scarce_rows):
        return held
    scarce = [gpu_shapes[r] for r in scarce_rows.tolist()]
    breaking, holding = _cuts(c, d, nodes, scarce, every, None)
    last = holding.sum(axis=1) <= keep
    return np.asarray((breaking & last[:, None]).any(axis=0), np.bool_)


def cards_after_landing(c: ClusterArrays, d: Demand, nodes: IntArray) -> IntArray:
    """The cards of `nodes` once `d` lands on each (as `placement.select` puts it)."""
    return cards_after(card_matrix(c, nodes), d)


def rate_fragmentation(c: ClusterArrays, d: Demand, idx: IntArray) -> FloatArray:
    """Score in [0, 1]: 0.5 where fragmentation does not change, higher where it shrinks,
    lower where it grows. A node's fragmentation (cards and host together) is at most twice
    its free cards: the largest node's cards, twice over, span the range."""
    growth = fragmentation_growth(c, d, idx)
    span = float(max(int(c.gpus_total.max(initial=0)), 1) * WHOLE)
    return np.asarray(0.5 - growth / (4 * span), np.float64)


def stranded_free(c: ClusterArrays, idx: IntArray) -> FloatArray | None:
    """Per node of `idx` (nodes with GPUs): the free GPU thousandths the GPU requests seen so
    far could not use there, weighed by how often each shape is asked for, with those the
    node's free CPU or memory cannot feed; at most the node's free thousandths. None: no GPU
    request seen yet. What a person reads as a pool's fragmentation (the console's pools)."""
    model = c.workload
    shapes = model.shapes()
    weight = sum(s.popularity for s in shapes if s.gpus)
    if not weight or not len(idx):
        return None
    cards = card_matrix(c, idx)
    cpu, memory = c.cpu_free[idx], c.memory_free_mb[idx]
    stranded = expected_fragmentation(cards, cpu, memory, models_ok(c, idx, shapes), shapes)
    stranded = stranded / weight + host_stranded(cards, cpu, memory, *model.host_per_gpu_milli())
    return np.asarray(np.minimum(stranded, cards.sum(axis=1)), np.float64)
