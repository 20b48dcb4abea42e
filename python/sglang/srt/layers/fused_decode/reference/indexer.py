"""The DSA lightning indexer of a 'full' GLM-5.3 layer: index-key write and exact top-k.

As SGLang's fused CUDA path runs it (no Hadamard: GLM-5.3's indexer rope is interleaved):
q_I = FP8GEMM(c_q, wq_b) -> [M, heads, 128], rope on dims 0..63, one e4m3 scale per (row, head);
[k | w_raw] = bf16GEMM(x, [wk dequantized to bf16 ; weights_proj]); k -> LayerNorm (fp32,
eps 1e-6) -> rope on dims 0..63 -> e4m3 with one scale, written at the row's slot;
score[m, s] = sum_h w[m,h] * ReLU(q8[m,h] . k8[s]) * scale_k[s] with
w = w_raw * heads^-1/2 * 128^-1/2 * scale_q, over positions 0..L-1 of the row's context.

Top-k follows SGLang: every position when L <= index_topk, else the index_topk best scores (ties
to the lower position); padded with -1 to index_topk. Returned as context positions, ascending
(the attention maps them to slots through the row's table).
"""

from __future__ import annotations

import torch

from .batch import RowBatch
from .cache import gather_index, write_index
from .config import Glm5Config
from .ops import layer_norm, rope_interleaved
from .quant import Numerics, bf16_linear, fp8_linear, quant_index_vec
from .weights import IndexerWeights


def index_scores(cfg: Glm5Config, w: IndexerWeights, x, c_q, batch: RowBatch, index_cache: torch.Tensor,
                 num: Numerics) -> torch.Tensor:
    """Write this step's index keys, then return fp32 scores [M, L_max] (-inf past each context)."""
    m, nh, d = batch.num_rows, cfg.index_n_heads, cfg.index_head_dim
    pos = batch.rope_positions
    q = fp8_linear(c_q, w.wq_b, num).view(m, nh, d)
    q = rope_interleaved(q, pos, cfg.rope_theta, cfg.qk_rope_head_dim)
    q8, q_scale = quant_index_vec(q)
    wk_proj = torch.cat([num.round(w.wk.dequant()), w.weights_proj.to(num.act_dtype)])
    kw = bf16_linear(x, wk_proj, num.act_dtype)
    key, w_raw = kw[:, :d], kw[:, d:]
    key = layer_norm(key, w.k_norm_weight, w.k_norm_bias, cfg.index_k_norm_eps)
    key = rope_interleaved(key, pos, cfg.rope_theta, cfg.qk_rope_head_dim)
    k8, k_scale = quant_index_vec(key)
    write_index(index_cache, batch.out_slots, k8, k_scale)

    head_w = w_raw.to(torch.float32) * (nh**-0.5 * d**-0.5) * q_scale  # [M, heads]
    keys, scales = gather_index(index_cache, batch.token_slots)  # [M, L, 128], [M, L]
    dots = torch.einsum("mhd,mld->mhl", q8.to(torch.float32), keys).relu()
    scores = torch.einsum("mh,mhl->ml", head_w, dots) * scales
    in_ctx = torch.arange(scores.shape[1], device=scores.device) < batch.seq_lens.unsqueeze(1)
    return torch.where(in_ctx, scores, torch.full_like(scores, float("-inf")))


def topk_positions(scores: torch.Tensor, seq_lens: torch.Tensor, k: int) -> torch.Tensor:
    """SGLang's top-k semantics over fp32 scores [M, L]: int64 [M, k] ascending positions, -1 padded."""
    m, width = scores.shape
    in_ctx = torch.arange(width, device=scores.device) < seq_lens.unsqueeze(1)
    scores = torch.where(in_ctx, scores, torch.full_like(scores, float("-inf")))
    if width < k:
        scores = torch.cat([scores, scores.new_full((m, k - width), float("-inf"))], dim=1)
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices[:, :k]
    keep = torch.arange(k, device=scores.device) < seq_lens.clamp(0, k).unsqueeze(1)
    big = torch.iinfo(torch.int64).max
    picked = torch.where(keep, order, torch.full_like(order, big)).sort(dim=1).values
    return torch.where(picked == big, torch.full_like(picked, -1), picked)


def indexer_topk(cfg: Glm5Config, w: IndexerWeights, x, c_q, batch: RowBatch, index_cache, num: Numerics):
    scores = index_scores(cfg, w, x, c_q, batch, index_cache, num)
    return topk_positions(scores, batch.seq_lens, cfg.index_topk)
