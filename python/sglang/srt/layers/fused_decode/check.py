"""Check mode: run the reference beside each fused layer on the same inputs and caches.

Set ``SGLANG_FUSED_DECODE_CHECK=1`` (eager steps only: a captured graph cannot read values
back). Before a fused layer runs, the context rows the step reads are copied out of upstream's
pool into a compact cache (slots renumbered, positions kept, so top-k positions compare
directly); after it runs, the reference layer runs on the copy, routed to the experts the fused
layer chose, and every value outside ``spec.NUMERICS`` is logged with the layer and step.
The fused layer's own outputs and cache writes are what the step keeps.
"""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from . import spec
from .reference.batch import RowBatch
from .reference.cache import Caches, gather_index, gather_kv, write_index, write_kv
from .reference.config import INDEX_PAGE_SIZE, Glm5Config
from .reference import model as ref_model
from .reference.model import layer_forward, sum_partials
from .reference.quant import FP8
from .reference.weights import LayerWeights
from .testing import _rel, forced_routing

logger = logging.getLogger(__name__)

CHECK_ENV = spec.CHECK_ENV


def enabled() -> bool:
    return os.environ.get(CHECK_ENV, "0") not in ("", "0", "false", "False")


def tolerances() -> Dict[str, float]:
    interp = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    return spec.NUMERICS["fused_layer_interpreter" if interp else "fused_layer"]


@dataclass
class Snapshot:
    """The step's context rows of one layer's caches, compacted, taken before the layer runs."""

    caches: Caches
    batch: RowBatch
    out_slots: torch.Tensor  # the pool slots the step writes (valid rows)
    compact_out: torch.Tensor  # the same rows' compact slots


def snapshot(cfg: Glm5Config, layer_id: int, caches: Caches, batch: RowBatch) -> Snapshot:
    pos, table = batch.positions, batch.token_slots
    width = table.shape[1]
    cols = torch.arange(width, device=table.device)
    used = (cols[None, :] <= pos[:, None]) & (table >= 0)
    slots = torch.unique(table[used])
    pages = -(-(slots.numel() + 1) // INDEX_PAGE_SIZE) * INDEX_PAGE_SIZE
    remap = torch.full((int(table.max()) + 2,), -1, dtype=torch.int64, device=table.device)
    remap[slots] = torch.arange(1, slots.numel() + 1, device=table.device)  # 0 stays unused
    compact_table = torch.where(used, remap[table.clamp_min(0)], torch.full_like(table, -1))
    kv = caches.kv[layer_id]
    c = Caches()
    c.kv[layer_id] = torch.zeros(pages, kv.shape[1], dtype=kv.dtype, device=kv.device)
    write_kv(c.kv[layer_id], remap[slots], gather_kv(kv, slots))
    if layer_id in caches.index:
        ix = caches.index[layer_id]
        c.index[layer_id] = torch.zeros(pages // INDEX_PAGE_SIZE, ix.shape[1], dtype=ix.dtype,
                                        device=ix.device)
        keys, scales = gather_index(ix, slots)
        write_index(c.index[layer_id], remap[slots], keys.to(FP8), scales)
    rows = RowBatch(pos.clone(), compact_table)
    valid = pos >= 0
    out = table.gather(1, pos.clamp_min(0)[:, None])[:, 0][valid]
    return Snapshot(c, rows, out, remap[out])


@contextmanager
def forced_topk(topks: List[torch.Tensor], valid: torch.Tensor, seen: List[torch.Tensor]):
    """Make the reference's indexer layers (in order) select the given top-k positions for the
    valid rows; each layer's own top-k (its keys still written) is appended to `seen`."""
    own = ref_model.indexer_topk
    queue = list(topks)

    def indexer_topk(*args, **kwargs):
        real = own(*args, **kwargs)
        seen.append(real)
        forced = queue.pop(0).to(real.device)
        return torch.where(valid.to(real.device)[:, None], forced, real)

    ref_model.indexer_topk = indexer_topk
    try:
        yield
    finally:
        ref_model.indexer_topk = own


@contextmanager
def forced_experts(experts: List[torch.Tensor], flips: List[int]):
    """Route the reference's MoE layers (in order) to the given experts (testing.forced_routing
    for a whole step)."""
    own = ref_model.router
    queue = list(experts)

    def router(cfg, w, x):
        ref_model.router = own
        try:
            with forced_routing(queue.pop(0), flips):
                return ref_model.router(cfg, w, x)
        finally:
            ref_model.router = router

    ref_model.router = router
    try:
        yield
    finally:
        ref_model.router = own


def compare(cfg: Glm5Config, lw: LayerWeights, snap: Snapshot, hidden, residual, topk_prev,
            fused, fused_out, pool: Caches, reuse_topk: bool = False,
            reduce=None) -> Dict[str, float]:
    """Run the reference on the snapshot, with the fused layer's discrete choices (its top-k
    and experts) forced, and compare the outputs; topk_overlap compares the choices. With
    `reuse_topk` both attend the given top-k, their indexers skipped. `reduce` (the TP
    group's all-reduce, as the fused layer got it) sums the reference's attention output
    across the ranks, every rank's reference running in step; both MLP outputs are compared
    before theirs."""
    y, res, topk = fused_out
    b = snap.batch
    v = b.valid
    flips, seen = [0], []
    indexer = cfg.runs_indexer(lw.layer_id) and not reuse_topk
    experts = [fused.routed_experts(b.num_rows)] if lw.is_moe else []
    with forced_topk([topk] if indexer else [], v, seen), forced_experts(experts, flips):
        y_ref, res_ref, _ = layer_forward(
            cfg, [lw], hidden, residual, b, snap.caches, topk_prev, reuse_topk=reuse_topk,
            reduce=(lambda parts: reduce(parts[0])) if reduce is not None else sum_partials,
            mlp_reduce=sum_partials)
    own = seen[0] if seen else topk
    lid = lw.layer_id
    return {
        "y_rel": _rel(y[v], y_ref[v]),
        "residual_rel": _rel(res[v], res_ref[v]),
        "kv_written_rel": _rel(pool.kv[lid][snap.out_slots], snap.caches.kv[lid][snap.compact_out]),
        "topk_overlap": float((torch.isin(topk[v], own[v]) | (topk[v] < 0)).float().mean()),
        "routing_flips": flips[0],
    }


def outside(errors: Dict[str, float], tol: Dict[str, float]) -> List[str]:
    """Every value outside the tolerances, as 'name=value (bound)'."""
    bad = []
    for name in ("y_rel", "residual_rel", "kv_written_rel"):
        if not errors[name] <= tol[name]:
            bad.append(f"{name}={errors[name]:.4g} (> {tol[name]})")
    if not errors["topk_overlap"] >= tol["topk_overlap"]:
        bad.append(f"topk_overlap={errors['topk_overlap']:.4g} (< {tol['topk_overlap']})")
    if errors["routing_flips"] > tol["max_routing_flips"]:
        bad.append(f"routing_flips={errors['routing_flips']} (> {tol['max_routing_flips']})")
    return bad


class Checker:
    """The runtime's per-layer hook in check mode; keeps every layer's errors of the step."""

    def __init__(self, cfg: Glm5Config, weights: List[LayerWeights], pool: Caches,
                 step: Optional[str] = None):
        self.cfg, self.weights, self.pool, self.step = cfg, weights, pool, step
        self.tol = tolerances()
        self.errors: List[Dict[str, float]] = []
        self.problems: List[str] = []
        self.topks: List[torch.Tensor] = []  # each indexer layer's fused top-k, in order
        self.experts: List[torch.Tensor] = []  # each MoE layer's fused experts, in order

    def __call__(self, i, layer, hidden, residual, batch, topk_prev, reuse_topk=False,
                 reduce=None):
        lw = self.weights[i]
        hidden_in = hidden.clone()
        residual_in = None if residual is None else residual.clone()
        snap = snapshot(self.cfg, lw.layer_id, self.pool, batch)
        kw = {"reuse_topk": True} if reuse_topk else {}
        out = layer(hidden, residual, batch, topk_prev, reduce=reduce, **kw)
        errors = compare(self.cfg, lw, snap, hidden_in, residual_in, topk_prev, layer, out,
                         self.pool, reuse_topk, reduce)
        self.errors.append(errors)
        if self.cfg.runs_indexer(lw.layer_id) and not reuse_topk:
            self.topks.append(out[2].clone())
        if lw.is_moe:
            self.experts.append(layer.routed_experts(batch.num_rows))
        health = getattr(layer, "health", None)  # the kernels' own error words, if any
        for problem in outside(errors, self.tol) + (health() if health else []):
            line = f"fused decode check: layer {lw.layer_id} ({self.step or 'step'}): {problem}"
            self.problems.append(line)
            logger.warning(line)
        return out


def check_write_slots(batch: RowBatch, out_cache_loc: torch.Tensor, step: str) -> List[str]:
    """The slot each valid row writes (token_slots at its position) must be upstream's
    out_cache_loc for that row; log and return every row where it is not."""
    valid = batch.positions >= 0
    mine = batch.token_slots.gather(1, batch.positions.clamp_min(0)[:, None])[:, 0]
    theirs = out_cache_loc[: mine.shape[0]].to(mine.dtype)
    bad = (valid & (mine != theirs)).nonzero().flatten().tolist()
    lines = [f"fused decode check: row {m} ({step}) writes slot {int(mine[m])}, upstream's "
             f"out_cache_loc is {int(theirs[m])}" for m in bad]
    for line in lines:
        logger.warning(line)
    return lines
