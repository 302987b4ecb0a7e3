"""Which nodes carry the GPU product a request names: shared by the GpuModel filter, the
fragmentation score and the FGD baseline (each asks it of some candidate rows)."""

from __future__ import annotations

import re

import numpy as np
import numpy.typing as npt

from crater.contracts.gpus import parse_gpu_product
from crater.scheduler.domain.cluster import BoolArray, ClusterArrays, model_key

# How Alibaba's cluster traces (openb) name a card model: V100M16, G2, ...
TRACE_MODEL = re.compile(r"[A-Za-z]+\d+[A-Za-z]*M\d+|[Gg]\d")


def model_matches(c: ClusterArrays, idx: npt.NDArray[np.int64], wanted: str) -> BoolArray:
    """Which of the nodes `idx` carry cards of a product in `wanted` (`A|B`: A or B): the
    model the same (an A10 is no A100), the memory per card at least the product's, the form
    factor the same where the probe's model name says it (a100-pcie-40gb: an A100, 40 GB or
    more per card, not an SXM one). A name that is not a product (validation lets none
    through) is matched as before, as a part of the node's model name. Worked out over every
    node once per topology (`ClusterArrays.topology_rows`): a score asks it per placement."""
    return c.topology_rows("gpu-model", wanted, lambda: _matches(c, wanted))[idx]


def _matches(c: ClusterArrays, wanted: str) -> BoolArray:
    """`model_matches` over every node."""
    names = [w for w in wanted.split("|") if w.strip()]
    hit = np.zeros(len(c), np.bool_)
    if not names:
        return ~hit
    for name in names:
        if TRACE_MODEL.fullmatch(name.strip()):
            # A cluster trace's model (openb's V100M16): that model exactly, as the trace's
            # protocol places it; not "16 GB or more" (a V100M32 node is another model there).
            hit |= np.char.find(c.gpu_model, model_key(name)) >= 0
            continue
        try:
            product = parse_gpu_product(name)
        except ValueError:
            hit |= np.char.find(c.gpu_model, model_key(name)) >= 0
            continue
        match = c.gpu_family == product.model
        if product.form_factor is not None:
            forms = c.gpu_form
            match &= (forms == "") | (forms == product.form_factor)
        if product.memory_gb is not None:
            match &= c.gpu_memory_mb >= product.min_memory_mb
        hit |= match
    return np.asarray(hit)
