"""MLA attention of a GLM-5.3 layer, absorbed form, sparse over the indexer's top-k.

Replicated part (every rank computes the same): [c_q | c_kv | k_pe] = FP8GEMM(x, q_a / kv_a);
RMSNorm of c_q and c_kv; interleaved rope of k_pe; the KV-cache row [c_kv | k_pe] written at the
row's slot. Per rank (its heads): q = FP8GEMM(c_q, q_b); rope of q_pe; q_lat = q_nope . w_kc
(bf16 bmm); softmax(0.0625 * ([q_lat | q_pe] . cache rows)) over the selected positions (fp32);
o_lat = p . c_kv rows; o = o_lat . w_vc (bf16 bmm); the rank's o_proj partial sum (FP8GEMM).
The probabilities stay fp32 (a flash kernel's bf16 P before the PV product depends on its tile
order, so it is left to the kernel tolerance rather than modelled).
"""

from __future__ import annotations

from typing import Tuple

import torch

from .batch import RowBatch
from .cache import gather_kv, write_kv
from .config import Glm5Config
from .ops import rms_norm, rope_interleaved
from .quant import Numerics, fp8_linear
from .weights import AttentionWeights


def latent_qkv(cfg: Glm5Config, a: AttentionWeights, x, batch: RowBatch, kv_cache: torch.Tensor,
               num: Numerics) -> torch.Tensor:
    """The replicated latent part; writes the KV-cache rows and returns the normed c_q."""
    c_q = rms_norm(fp8_linear(x, a.q_a, num), a.q_a_norm, cfg.rms_norm_eps, num.act_dtype)
    kv = fp8_linear(x, a.kv_a, num)
    c_kv = rms_norm(kv[:, : cfg.kv_lora_rank], a.kv_a_norm, cfg.rms_norm_eps, num.act_dtype)
    k_pe = rope_interleaved(kv[:, cfg.kv_lora_rank :], batch.rope_positions, cfg.rope_theta)
    write_kv(kv_cache, batch.out_slots, torch.cat([c_kv, num.round(k_pe)], dim=-1))
    return c_q


def split_kv_b(cfg: Glm5Config, kv_b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """kv_b [heads*(nope+v), kv_lora] -> w_kc [heads, nope, kv_lora], w_vc [heads, kv_lora, v]."""
    w = kv_b.view(-1, cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.kv_lora_rank)
    return w[:, : cfg.qk_nope_head_dim], w[:, cfg.qk_nope_head_dim :].transpose(1, 2)


def sparse_mla(cfg: Glm5Config, q_lat, q_pe, batch: RowBatch, kv_cache, topk: torch.Tensor) -> torch.Tensor:
    """fp32 o_lat [M, heads, kv_lora] of attention over the context positions in topk (-1 = none)."""
    slots = batch.token_slots.gather(1, topk.clamp_min(0))
    slots = torch.where(topk >= 0, slots, torch.full_like(slots, -1))
    rows = gather_kv(kv_cache, slots)  # [M, K, kv_lora + rope], zero where unused
    q = torch.cat([q_lat, q_pe], dim=-1).to(torch.float32)
    z = torch.einsum("mhc,mkc->mhk", q, rows) * cfg.softmax_scale
    z = torch.where((topk >= 0).unsqueeze(1), z, torch.full_like(z, float("-inf")))
    p = torch.softmax(z, dim=-1).nan_to_num(0.0)  # a pad row has no key: zero output
    return torch.einsum("mhk,mkc->mhc", p, rows[..., : cfg.kv_lora_rank])


def mla_heads(cfg: Glm5Config, a: AttentionWeights, c_q, batch: RowBatch, kv_cache, topk,
              num: Numerics) -> torch.Tensor:
    """This rank's heads: returns its o_proj partial sum [M, hidden] (before the all-reduce)."""
    m = batch.num_rows
    q = fp8_linear(c_q, a.q_b, num).view(m, -1, cfg.qk_head_dim)
    q_nope, q_pe = q[..., : cfg.qk_nope_head_dim], q[..., cfg.qk_nope_head_dim :]
    q_pe = num.round(rope_interleaved(q_pe, batch.rope_positions, cfg.rope_theta))
    w_kc, w_vc = split_kv_b(cfg, a.kv_b)
    q_lat = num.round(torch.einsum("mhd,hdc->mhc", q_nope.float(), w_kc.float()))
    o_lat = num.round(sparse_mla(cfg, q_lat, q_pe, batch, kv_cache, topk))
    o = num.round(torch.einsum("mhc,hcv->mhv", o_lat.float(), w_vc.float()))
    return fp8_linear(o.reshape(m, -1), a.o_proj, num)
