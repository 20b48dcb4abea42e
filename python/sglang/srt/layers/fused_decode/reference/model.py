"""GLM-5.3 forward over rows: one decoder layer, a whole decode step, and prompt prefill.

A layer takes the TP shards it simulates (`shards[r]` is rank r's `LayerWeights`; replicated
parts are computed once from shard 0, which every rank holds identically) and a `reduce` that
turns the ranks' partial sums into the all-reduced tensor: `sum_partials` (identity at TP1, an
fp32 sum rounded once with several simulated ranks), or, in a real multi-GPU run where each
process holds one shard, a function that all-reduces `parts[0]` across processes.

Residual convention (SGLang's deferred add): a layer returns (y, residual) where y is its
all-reduced MLP output and residual the stream before adding y; the next layer's input norm (or
the final norm) adds them (fp32 sum, stored in the activation dtype, norm of the fp32 sum).
"""

from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple, Union

import torch

from .attention import latent_qkv, mla_heads
from .batch import RowBatch, prefill_batch
from .cache import Caches
from .config import Glm5Config
from .indexer import indexer_topk
from .moe import dense_mlp, moe_partial, router
from .ops import add_rms_norm
from .quant import SGLANG, Numerics, bf16_linear, folded_norm_quant
from .weights import LayerWeights, ModelWeights

Reduce = Callable[[List[torch.Tensor]], torch.Tensor]


def sum_partials(parts: List[torch.Tensor]) -> torch.Tensor:
    """The TP all-reduce of simulated ranks: identity for one, else fp32 sum rounded once."""
    if len(parts) == 1:
        return parts[0]
    return torch.stack([p.to(torch.float32) for p in parts]).sum(0).to(parts[0].dtype)


def layer_forward(
    cfg: Glm5Config,
    shards: Sequence[LayerWeights],
    hidden: torch.Tensor,
    residual: Optional[torch.Tensor],
    batch: RowBatch,
    caches: Caches,
    topk_prev: Optional[torch.Tensor] = None,
    num: Numerics = SGLANG,
    reduce: Reduce = sum_partials,
    dense: bool = False,
    reuse_topk: bool = False,
    mlp_reduce: Optional[Reduce] = None,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One decoder layer for M rows: returns (y, residual, topk positions [M, index_topk]).

    Writes the layer's KV-cache row (and index-cache row on a 'full' layer) at each valid row's
    slot; a 'shared' layer reuses `topk_prev`, the previous layer's top-k. `dense` attends to
    the whole context instead (SGLang's prefill for short contexts); the indexer still writes
    its keys, and the returned top-k is still the indexer's. `reuse_topk` makes a 'full' layer
    attend `topk_prev` too, its indexer skipped whole (no index-cache row written): the MTP
    draft's top-k carried across its iterations (``mtp.draft_iterations``). `mlp_reduce`, if
    given, replaces `reduce` on the MLP output (check mode: one rank's MLP part, its
    attention all-reduced)."""
    lw = shards[0]
    lid, eps = lw.layer_id, cfg.rms_norm_eps
    x_qkv = None  # q_a|kv_a's operand where it is not the norm's bf16 x
    if num.fold_input_norm and residual is not None and not cfg.runs_indexer(lid):
        x_qkv = folded_norm_quant(hidden, residual, lw.input_norm, eps)
    x, residual = add_rms_norm(hidden, residual, lw.input_norm, eps, num.act_dtype)
    kv_cache = caches.kv[lid]
    c_q = latent_qkv(cfg, lw.attn, x if x_qkv is None else x_qkv, batch, kv_cache, num)
    if cfg.runs_indexer(lid) and not reuse_topk:
        topk = indexer_topk(cfg, lw.attn.indexer, x, c_q, batch, caches.index[lid], num)
    else:
        if topk_prev is None:
            raise ValueError(f"layer {lid} reuses the previous top-k but none was given")
        topk = topk_prev
    attend = all_positions(batch) if dense else topk
    y = reduce([mla_heads(cfg, s.attn, c_q, batch, kv_cache, attend, num) for s in shards])
    x2, residual = add_rms_norm(y, residual, lw.post_attention_norm, eps, num.act_dtype)
    if lw.is_moe:
        ids, weights = router(cfg, lw.mlp, x2)
        parts = [moe_partial(cfg, s.mlp, x2, ids, weights, num) for s in shards]
    else:
        parts = [dense_mlp(s.mlp, x2, num) for s in shards]
    y = (mlp_reduce or reduce)(parts)
    return y, residual, topk


def all_positions(batch: RowBatch) -> torch.Tensor:
    """Every context position of each row, ascending, -1 padded: [M, L_max]."""
    pos = torch.arange(batch.token_slots.shape[1], device=batch.token_slots.device)
    pos = pos.expand(batch.num_rows, -1)
    return torch.where(pos < batch.seq_lens.unsqueeze(1), pos, torch.full_like(pos, -1))


def as_ranks(weights: Union[ModelWeights, Sequence[ModelWeights]]) -> List[ModelWeights]:
    ranks = [weights] if isinstance(weights, ModelWeights) else list(weights)
    assert [r.tp_rank for r in ranks] == list(range(len(ranks))), "pass every rank, in order"
    return ranks


def final_logits(cfg: Glm5Config, ranks: Sequence[ModelWeights], hidden, residual, num: Numerics):
    """Final add + RMSNorm, LM head (bf16 weight, fp32 logits), vocab shards gathered."""
    x, _ = add_rms_norm(hidden, residual, ranks[0].final_norm, cfg.rms_norm_eps, num.act_dtype)
    return torch.cat([bf16_linear(x, r.lm_head, torch.float32) for r in ranks], dim=-1)


def forward_rows(
    cfg: Glm5Config,
    weights: Union[ModelWeights, Sequence[ModelWeights]],
    input_ids: torch.Tensor,
    batch: RowBatch,
    caches: Caches,
    num: Numerics = SGLANG,
    reduce: Reduce = sum_partials,
    dense: bool = False,
) -> torch.Tensor:
    """Embedding, every decoder layer the weights hold (in order), final norm and LM head.

    Returns fp32 logits [M, vocab] (all TP vocab shards). Used for decode (one row per request)
    and prefill (one row per prompt token)."""
    ranks = as_ranks(weights)
    w0 = ranks[0]
    hidden = w0.embed[input_ids.clamp_min(0)].to(num.act_dtype)
    residual, topk = None, None
    for lid in sorted(w0.layers):
        hidden, residual, topk = layer_forward(
            cfg, [r.layers[lid] for r in ranks], hidden, residual, batch, caches, topk, num, reduce,
            dense,
        )
    return final_logits(cfg, ranks, hidden, residual, num)


def decode_step(cfg, weights, input_ids, batch: RowBatch, caches: Caches, num: Numerics = SGLANG,
                reduce: Reduce = sum_partials) -> torch.Tensor:
    """One decode step of M rows (one new token per request): fp32 logits [M, vocab]."""
    return forward_rows(cfg, weights, input_ids, batch, caches, num, reduce)


def prefill(cfg, weights, prompts: Sequence[Sequence[int]], tables: Sequence[torch.Tensor],
            caches: Caches, num: Numerics = SGLANG, reduce: Reduce = sum_partials,
            device="cpu", dense: bool = False) -> List[torch.Tensor]:
    """Prefill prompts (prompt i's token t written at tables[i][t]); logits [len_i, vocab] each.

    Attention is the same top-k sparse attention decode runs, per prompt token over its causal
    prefix. `dense=True` attends to the whole prefix instead, as SGLang's prefill does for
    contexts up to 2048 tokens (equal to sparse while contexts fit in index_topk)."""
    lengths = [len(p) for p in prompts]
    batch = prefill_batch(tables, lengths, device)
    ids = torch.tensor([t for p in prompts for t in p], dtype=torch.int64, device=device)
    logits = forward_rows(cfg, weights, ids, batch, caches, num, reduce, dense)
    return list(logits.split(lengths))
