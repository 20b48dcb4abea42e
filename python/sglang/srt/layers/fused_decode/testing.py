"""Decode-layer cases for kernel tests and benchmarks: one rank's layer, caches holding each
row's earlier context, a step of M rows, and a comparison of the fused layer with the
reference on identical inputs and cache copies.

Caches start poisoned (NaN) and only the context positions are filled, so a kernel that reads
a slot no request owns turns its output into NaN. Rows get different context lengths and
scattered slots; a pad row (position -1) may be added.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from .reference.batch import RowBatch, decode_batch
from .reference.cache import Caches, alloc_caches, write_index, write_kv
from .reference.config import INDEX_PAGE_SIZE, Glm5Config
from .reference.indexer import topk_positions
from .reference import model as ref_model
from .reference.model import layer_forward
from .reference.moe import RENORM_EPS
from .reference.quant import SGLANG, Numerics, bf16_linear, quant_index_vec
from .reference.weights import LayerWeights, gen_layer


@dataclass
class LayerCase:
    cfg: Glm5Config
    lw: LayerWeights
    caches: Caches
    batch: RowBatch
    hidden: torch.Tensor
    residual: torch.Tensor
    topk_prev: Optional[torch.Tensor]


def clone_caches(c: Caches) -> Caches:
    return Caches(kv={k: v.clone() for k, v in c.kv.items()},
                  index={k: v.clone() for k, v in c.index.items()})


def make_case(cfg: Glm5Config, layer_id: int, contexts: List[int], seed: int = 0,
              device="cpu", tp_size: int = 8, lw: Optional[LayerWeights] = None,
              paged: bool = False) -> LayerCase:
    """contexts[m] = the context length of row m after this step (its new token included);
    0 makes row m a pad row. Each row's slots are shuffled over the pool, or with `paged`
    laid out as upstream's allocator does: whole 64-token pages, the pages shuffled."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    lw = lw or gen_layer(cfg, seed, layer_id, tp_size=tp_size, tp_rank=0, device=device)
    page = INDEX_PAGE_SIZE
    per_row = [-(-max(c, 1) // page) * page if paged else max(c, 1) for c in contexts]
    num_slots = -(-(sum(per_row) + page) // page) * page
    caches = alloc_caches(cfg, num_slots, device, layers=[layer_id], poison=True)
    if paged:  # page 0 holds the dummy slot
        pages = torch.randperm(num_slots // page - 1, generator=g) + 1
        perm = (pages[:, None] * page + torch.arange(page)).flatten()
    else:
        perm = torch.randperm(num_slots - 1, generator=g) + 1  # slot 0 stays the dummy slot
    tables, positions, start = [], [], 0
    for c, span in zip(contexts, per_row):
        n = max(c, 1)
        tables.append(perm[start:start + n].to(device))
        start += span
        positions.append(c - 1 if c > 0 else -1)
        if c > 1:  # earlier tokens: latent rows near unit scale, and their index keys
            old = tables[-1][: c - 1]
            rows = torch.randn(c - 1, cfg.kv_cache_dim, generator=g).to(device)
            write_kv(caches.kv[layer_id], old, rows)
            if layer_id in caches.index:
                keys = torch.randn(c - 1, cfg.index_head_dim, generator=g).to(device)
                write_index(caches.index[layer_id], old, *quant_index_vec(keys))
    batch = decode_batch(positions, tables, device)
    m, h = len(contexts), cfg.hidden_size
    hidden = torch.randn(m, h, generator=g).to(device, torch.bfloat16)
    residual = (4 * torch.randn(m, h, generator=g)).to(device, torch.bfloat16)
    topk_prev = None
    if not cfg.runs_indexer(layer_id):
        scores = torch.randn(m, batch.token_slots.shape[1], generator=g).to(device)
        topk_prev = topk_positions(scores, batch.seq_lens, cfg.index_topk)
    return LayerCase(cfg, lw, caches, batch, hidden, residual, topk_prev)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| over max |b| (fp32)."""
    a, b = a.float(), b.float()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


@contextmanager
def forced_routing(experts: torch.Tensor, flips: List[int]):
    """Make the reference route each row to `experts` (its weights still computed from its own
    scores), counting in flips[0] the valid rows whose own choice differs."""
    own_router = ref_model.router

    def router(cfg, w, x):
        ids, _ = own_router(cfg, w, x)
        forced = experts.to(ids.device)
        valid = forced[:, 0] >= 0
        flips[0] += int((ids.sort(dim=1).values != forced).any(dim=1)[valid].sum())
        forced = torch.where(valid[:, None], forced, ids)
        scores = bf16_linear(x, w.router, torch.float32).sigmoid()
        weights = scores.gather(1, forced)
        if cfg.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + RENORM_EPS)
        return forced, weights * cfg.routed_scaling_factor

    ref_model.router = router
    try:
        yield
    finally:
        ref_model.router = own_router


def compare_with_reference(case: LayerCase, fused_layer_cls, num: Numerics = SGLANG
                           ) -> Dict[str, float]:
    """Run a fused layer (built by fused_layer_cls(cfg, lw, caches, rows, context)) and the
    reference (in `num`'s numerics) on the same inputs and cache copies, the reference routed
    to the experts the fused layer chose (DESIGN: discrete choices forced from one side);
    return the errors, the number of rows whose routing differed, and the cache checks."""
    cfg, lid, b = case.cfg, case.lw.layer_id, case.batch
    ref_caches, fused_caches = clone_caches(case.caches), clone_caches(case.caches)
    fused = fused_layer_cls(cfg, case.lw, fused_caches, b.num_rows, b.token_slots.shape[1])
    y, res, topk = fused(case.hidden, case.residual, b, case.topk_prev)
    flips = [0]
    if case.lw.is_moe:
        with forced_routing(fused.routed_experts(b.num_rows), flips):
            y_ref, res_ref, topk_ref = layer_forward(cfg, [case.lw], case.hidden, case.residual,
                                                     b, ref_caches, case.topk_prev, num)
    else:
        y_ref, res_ref, topk_ref = layer_forward(cfg, [case.lw], case.hidden, case.residual, b,
                                                 ref_caches, case.topk_prev, num)
    v = b.valid
    written = b.out_slots[v]
    untouched = torch.ones(case.caches.kv[lid].shape[0], dtype=torch.bool, device=written.device)
    untouched[written] = False
    kv_ref, kv = ref_caches.kv[lid], fused_caches.kv[lid]
    out = {
        "y_rel": _rel(y[v], y_ref[v]),
        "residual_rel": _rel(res[v], res_ref[v]),
        "y_nan": bool(torch.isnan(y[v]).any()),
        "routing_flips": flips[0],
        "topk_equal": bool(torch.equal(topk[v], topk_ref[v])),
        "topk_overlap": float((torch.isin(topk[v], topk_ref[v]) | (topk[v] < 0)).float().mean()),
        "kv_written_rel": _rel(kv[written], kv_ref[written]),
        "kv_untouched_bitwise": bool(torch.equal(kv[untouched].view(torch.int16),
                                                 case.caches.kv[lid][untouched].view(torch.int16))),
    }
    if lid in case.caches.index:
        pages_ref, pages = ref_caches.index[lid], fused_caches.index[lid]
        out["index_bytes_differing"] = int((pages_ref != pages).sum())
        touched = torch.zeros(pages.shape[0], dtype=torch.bool, device=pages.device)
        touched[written // INDEX_PAGE_SIZE] = True
        out["index_untouched_pages_bitwise"] = bool(
            torch.equal(pages[~touched], case.caches.index[lid][~touched]))
    return out


def compare_two_ranks(cfg: Glm5Config, layer_id: int, contexts: List[int], seed: int,
                      fused_layer_cls, device="cpu", tp_size: int = 2,
                      lw: Optional[LayerWeights] = None,
                      weights_seed: Optional[int] = None) -> Dict[str, float]:
    """Rank 0 of a TP layer against the reference over the shards of ranks 0 and 1 (at TP2
    the whole layer; at a wider TP the sum of those two ranks): the fused layer's ``reduce``
    adds rank 1's attention output (the reference's), and its MLP output plus rank 1's is
    compared with the reference's all-reduced y (the reference routed as the fused layer
    chose). A layer that normed its own attention part alone, without the all-reduce, is off
    by rank 1's part in its residual and MLP input. lw: rank 0's weights if made already, by
    gen_layer from weights_seed (default: seed)."""
    from .reference.model import sum_partials

    case = make_case(cfg, layer_id, contexts, seed=seed, device=device, tp_size=tp_size, lw=lw)
    shards = [case.lw, gen_layer(cfg, seed if weights_seed is None else weights_seed,
                                 layer_id, tp_size=tp_size, tp_rank=1, device=device)]
    b = case.batch
    parts: List[List[torch.Tensor]] = []

    def record(p):  # the reference's all-reduce, keeping each rank's part
        parts.append([t.clone() for t in p])
        return sum_partials(p)

    def reference(experts=None):
        parts.clear()
        flips = [0]
        with forced_routing(experts, flips) if experts is not None else nullcontext():
            out = layer_forward(cfg, shards, case.hidden, case.residual, b,
                                clone_caches(case.caches), case.topk_prev, reduce=record)
        return out, flips[0]

    reference()  # rank 1's attention part does not depend on the routing
    attn_1 = parts[0][1]
    fused = fused_layer_cls(cfg, case.lw, clone_caches(case.caches), b.num_rows,
                            b.token_slots.shape[1])
    reduced = []

    def reduce(t):
        reduced.append(tuple(t.shape))
        return sum_partials([t, attn_1])

    y_0, res, _ = fused(case.hidden, case.residual, b, case.topk_prev, reduce=reduce)
    experts = fused.routed_experts(b.num_rows) if case.lw.is_moe else None
    (y_ref, res_ref, _), flips = reference(experts)
    y = sum_partials([y_0, parts[1][1]])
    v = b.valid
    return {"y_rel": _rel(y[v], y_ref[v]), "residual_rel": _rel(res[v], res_ref[v]),
            "y_nan": bool(torch.isnan(y[v]).any()), "routing_flips": flips,
            "reduce_calls": len(reduced),
            "reduced_shape_ok": reduced == [(b.num_rows, cfg.hidden_size)]}


def shard_rows_checks(case: LayerCase, rows: int, **layer_kw) -> Dict[str, bool]:
    """A TP shard's layer with o_proj's tails summing bf16 rows (the all-reduce's input; one
    rank alone here) against the same layer summing o_proj's split-K partials in its norm (the
    one-rank form): every output and KV-cache byte equal, o_proj's counters back at zero.
    Both run the post-attention norm (``norm_router.ROWS`` held empty: its form, a shard's
    only, rounds differently). Every value should be True."""
    from sgl_kernel_ext.triton import norm_router

    from .layer import FusedLayer

    lid, width = case.lw.layer_id, case.batch.token_slots.shape[1]
    out, runs = {}, []
    rows_were = norm_router.ROWS
    norm_router.ROWS = frozenset()
    try:
        for sharded in (True, False):
            caches = clone_caches(case.caches)
            layer = FusedLayer(case.cfg, case.lw, caches, rows, width, **layer_kw)
            out["a_shard_with_split_k"] = layer.sharded and layer.split_o > 1
            layer.sharded = sharded
            outs = [t.clone()
                    for t in layer(case.hidden, case.residual, case.batch, case.topk_prev)]
            out[f"counters_zero_{'tails' if sharded else 'partials'}"] = not bool(
                layer.buf["o_arrivals"].any())
            runs.append((outs, caches.kv[lid].view(torch.int16)))
    finally:
        norm_router.ROWS = rows_were
    (a_out, a_kv), (b_out, b_kv) = runs
    out["outputs_equal"] = all(bool(torch.equal(x, y)) for x, y in zip(a_out, b_out))
    out["kv_equal"] = bool(torch.equal(a_kv, b_kv))
    return out


def in_a_pool(batch: RowBatch, seed: int = 0, extra_width: int = 37, dtype=torch.int32):
    """batch's slot tables as rows of a server's pool table (``runtime.StepRows``): int32 as
    upstream's req_to_token (or `dtype`), wider than the step's width (a view, as
    req_to_token[:, :max_context]), each row's table at a shuffled row among rows of other
    requests' slots (valid slots of the same caches, so reading a wrong row reads or writes a
    wrong slot instead of failing)."""
    from .runtime import StepRows

    g = torch.Generator().manual_seed(seed)
    m, width = batch.token_slots.shape
    table = batch.token_slots.cpu()
    pool = torch.randint(0, int(table.max()) + 1, (2 * m + 1, width + extra_width),
                         generator=g).to(dtype)
    rows = torch.randperm(pool.shape[0], generator=g)[:m]
    pool[rows, :width] = table.to(dtype)
    dev = batch.positions.device
    return StepRows(batch.positions, pool.to(dev)[:, :width], rows.to(dev))


def pool_table_checks(case: LayerCase, rows: int, seed: int = 0, extra_width: int = 37,
                      **layer_kw) -> Dict[str, bool]:
    """The layer on its step's slots read from a pool table (``in_a_pool``: the kernels'
    ``slot_rows`` form, a server's) against the same step on a table a row: every output,
    KV-cache and index-cache byte equal. Every value should be True."""
    from .layer import FusedLayer

    lid, width = case.lw.layer_id, case.batch.token_slots.shape[1]
    pooled = in_a_pool(case.batch, seed, extra_width)
    out, runs = {}, []
    for batch in (case.batch, pooled):
        caches = clone_caches(case.caches)
        layer = FusedLayer(case.cfg, case.lw, caches, rows, width, **layer_kw)
        outs = [t.clone() for t in layer(case.hidden, case.residual, batch, case.topk_prev)]
        runs.append((outs, caches))
    (a_out, a_c), (b_out, b_c) = runs
    out["outputs_equal"] = all(bool(torch.equal(x, y)) for x, y in zip(a_out, b_out))
    out["kv_equal"] = bool(torch.equal(a_c.kv[lid].view(torch.int16),
                                       b_c.kv[lid].view(torch.int16)))
    if lid in a_c.index:
        out["index_equal"] = bool(torch.equal(a_c.index[lid], b_c.index[lid]))
    return out


def stack_with_and_without_workspace(cases: List[LayerCase], steps: int = 2):
    """Run the cases' layers as one stack (layer i's y is layer i+1's input; the cases share
    one batch: built with the same contexts and seed), `steps` times, once with each layer's
    own buffers and once sharing a ``Workspace``: [(y, residual, top-k, caches)] per form."""
    from .layer import FusedLayer
    from .reference.cache import Caches
    from .workspace import Workspace

    first = cases[0]
    device = first.hidden.device
    base = Caches(kv={c.lw.layer_id: c.caches.kv[c.lw.layer_id] for c in cases},
                  index={k: v for c in cases for k, v in c.caches.index.items()})
    rows, width = first.batch.num_rows, first.batch.token_slots.shape[1]
    runs = []
    for shared in (False, True):
        caches = clone_caches(base)
        ws = Workspace(device) if shared else None
        layers = [FusedLayer(c.cfg, c.lw, caches, rows, width, persistent_launch=False,
                             workspace=ws) for c in cases]
        if ws is not None:
            ws.finalize()
            assert layers[0].buf["y"].data_ptr() == layers[-1].buf["y"].data_ptr()
        for _ in range(steps):  # a later step sees whatever the earlier left in the buffers
            hidden, residual, topk = first.hidden, first.residual, first.topk_prev
            for layer in layers:
                hidden, residual, topk = layer(hidden, residual, first.batch, topk)
        runs.append((hidden.clone(), residual.clone(), topk.clone(), caches))
    return runs


def carried_topk_checks(case: LayerCase, layer, capture: bool = False) -> Dict[str, bool]:
    """The MTP draft's iteration on a carried top-k, for an indexer layer built on the case's
    caches (make_case(paged=True): upstream's page layout). The first step runs the indexer;
    upstream's seed is that top-k as physical slots, shuffled, int32; ``carry.TopkCarry``
    converts it on the device into the layer's top-k buffer, and the next step attends it
    with the indexer skipped. With `capture` the conversion and the step run as one CUDA
    graph, replayed after the buffer is scrambled. Every value should be True."""
    from .carry import SLOTS, TopkCarry

    lid, batch = case.lw.layer_id, case.batch
    _, _, first = layer(case.hidden, case.residual, batch, None)
    first = first.clone()
    big = torch.iinfo(torch.int64).max
    want = torch.where(first >= 0, first, big).sort(dim=1).values
    want = torch.where((want == big) | (batch.positions[:, None] < 0), -1, want)
    g = torch.Generator(device="cpu").manual_seed(7)
    slots = torch.where(first >= 0, batch.token_slots.gather(1, first.clamp_min(0)), -1)
    order = torch.argsort(torch.rand(slots.shape, generator=g), dim=1).to(slots.device)
    seed = slots.gather(1, order).to(torch.int32)
    carry = TopkCarry(layer.buf["topk"], batch.token_slots.shape[1])
    index_before = case.caches.index[lid].clone()

    def iteration():
        return layer(case.hidden, None, batch, carry.take(seed, batch, SLOTS), reuse_topk=True)

    eager = [t.clone() for t in iteration()]
    out = {"carry_is_the_indexers_topk": bool(torch.equal(eager[2], want)),
           "index_cache_untouched": bool(torch.equal(case.caches.index[lid], index_before)),
           "y_finite": not bool(torch.isnan(eager[0].float()).any())}
    direct = layer(case.hidden, None, batch, want.clone(), reuse_topk=True)
    out["same_as_attending_the_positions"] = all(
        bool(torch.equal(a, b)) for a, b in zip(direct[:2], eager[:2]))
    if capture:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            iteration()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outs = iteration()
        layer.buf["topk"].fill_(-7)
        graph.replay()
        torch.cuda.synchronize()
        out["graph_equals_eager"] = all(bool(torch.equal(a, b)) for a, b in zip(outs, eager))
    return out


def first_digit_histograms(scores: torch.Tensor, seq: torch.Tensor, chunk: int) -> torch.Tensor:
    """int32 [M, P, 256]: for each row's `chunk`-score chunks, how many of its first seq[m]
    scores have each top byte of the order-preserving uint32 image of the fp32 score (the
    split top-k's first radix digit; P = ceil(width / chunk))."""
    m, width = scores.shape
    p = -(-width // chunk)
    bits = scores.float().view(torch.int32).long() & 0xFFFFFFFF
    keys = torch.where(bits >> 31 == 1, bits ^ 0xFFFFFFFF, bits ^ 0x80000000)
    pos = torch.arange(width, device=scores.device)
    bins = (torch.arange(m, device=scores.device)[:, None] * p + pos // chunk) * 256 + (keys >> 24)
    in_ctx = pos[None, :] < seq.to(scores.device)[:, None]
    return torch.bincount(bins[in_ctx], minlength=m * p * 256).view(m, p, 256).int()


def scores_past_context_as_documented(scores: torch.Tensor, seq: torch.Tensor, block: int,
                                      poison: float) -> bool:
    """Whether index scores past each row's context are -inf up to the end of the row's
    last `block`-position block and left as `poison` after it (``indexer.scores``)."""
    pos = torch.arange(scores.shape[1], device=scores.device)
    seq = seq.to(scores.device)[:, None]
    past = pos[None, :] >= seq
    in_last_block = pos[None, :] < (seq + block - 1) // block * block
    return bool((scores[past & in_last_block] == float("-inf")).all()
                and (scores[past & ~in_last_block] == poison).all())
