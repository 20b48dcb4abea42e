"""The stock arm: one GLM-5.3 decode layer of one TP rank as SGLang's CUDA path launches it.

Same math and rounding points as the reference `layer_forward` (one rank, partial sums, no
all-reduce), but run the way a serving stack runs it: one kernel per operation, weights read as
stored (FP8 stays FP8, no dequantized copy per step), the fused q_a/kv_a projection, merged
gate/up, the indexer's wk dequantized once at build and merged with weights_proj (SGLang does
the same at load), the shared expert run inside the MoE launches as one more expert (SGLang on H200 fuses it the
same way).
About 30 launches per layer, close to SGLang's count.

`Ops` holds the replaceable pieces (activation quant, block-FP8 GEMM, MoE): the stock arm uses
`benchmark.stock_kernels`; arm (b) swaps in upstream SGLang's Triton kernels (`upstream`).
Semantics differ from the reference in one visible way: top-k positions come out in
`torch.topk` order, not sorted (attention does not depend on the order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from . import stock_kernels as K


@dataclass
class Fp8:
    q: torch.Tensor  # e4m3 [..., N, K]
    s: torch.Tensor  # fp32 [..., ceil(N/128), K/128]


@dataclass
class Ops:
    name: str
    quant: Callable  # x bf16 [M, K] -> (q, s)
    gemm: Callable  # (q, s, Fp8) -> bf16 [M, N]
    moe: Callable  # (xq, xs, x, ids, weights, table, StockMoe) -> bf16 [M, H]


def _stock_moe(xq, xs, x, ids, weights, table, mw):
    return K.moe(xq, xs, mw.gate, mw.up, mw.down, mw.sh_gate, mw.sh_up, mw.sh_down, table, weights)


STOCK_OPS = Ops("stock", K.act_quant, lambda q, s, w: K.fp8_gemm(q, s, w.q, w.s), _stock_moe)


@dataclass
class StockMoe:
    router: torch.Tensor  # bf16 [E, H]
    bias: torch.Tensor  # fp32 [E]
    gate: Fp8  # [E, I, H] (contiguous, as generated)
    up: Fp8
    down: Fp8  # [E, H, I]
    sh_gate: Fp8  # shared expert [I, H]
    sh_up: Fp8
    sh_down: Fp8  # [H, I]
    stacked: Optional[tuple] = None  # arm (b): SGLang's [E+1, 2I, H] / [E+1, H, I] copy


@dataclass
class StockLayer:
    layer_id: int
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv_a: Fp8
    q_a_norm: torch.Tensor
    kv_a_norm: torch.Tensor
    q_b: Fp8
    w_kc: torch.Tensor  # bf16 [heads, nope, kv_lora] (view of kv_b)
    w_vc: torch.Tensor  # bf16 [heads, kv_lora, v] (view of kv_b)
    o_proj: Fp8
    idx_wq_b: Optional[Fp8]
    idx_wkw: Optional[torch.Tensor]  # bf16 [128 + index_heads, H]
    idx_norm_w: Optional[torch.Tensor]
    idx_norm_b: Optional[torch.Tensor]
    dense_w13: Optional[Fp8]
    dense_down: Optional[Fp8]
    moe: Optional[StockMoe]


@dataclass
class Rows:
    """A step's rows as device tensors, computed once outside the graph."""

    positions: torch.Tensor  # int64 [M]
    token_slots: torch.Tensor  # int64 [M, L_max]
    out_slots: torch.Tensor  # int64 [M]
    seq_lens: torch.Tensor  # int64 [M]

    @classmethod
    def from_batch(cls, batch) -> "Rows":
        return cls(batch.rope_positions.contiguous(), batch.token_slots.contiguous(),
                   batch.out_slots.contiguous(), batch.seq_lens.contiguous())


def _fp8(w) -> Fp8:
    return Fp8(w.q, w.s)


def _router_logits(x, w):
    if x.is_cuda:
        return torch.mm(x, w.t(), out_dtype=torch.float32)
    return x.float() @ w.float().t()


def stock_layer_from(cfg, lw, qkv_a: Fp8, dense_w13: Optional[Fp8]) -> StockLayer:
    """Stock view of one rank's `LayerWeights` plus the fused tensors the caller built."""
    from sglang.srt.layers.fused_decode.reference.attention import split_kv_b

    a = lw.attn
    w_kc, w_vc = split_kv_b(cfg, a.kv_b)
    idx = a.indexer
    wkw = None
    if idx is not None:
        wkw = torch.cat([idx.wk.dequant(torch.float32).to(torch.bfloat16),
                         idx.weights_proj.to(torch.bfloat16)]).contiguous()
    moe = None
    if lw.is_moe:
        m = lw.mlp
        moe = StockMoe(m.router, m.bias.float().contiguous(), _fp8(m.gate), _fp8(m.up),
                       _fp8(m.down), _fp8(m.shared.gate), _fp8(m.shared.up), _fp8(m.shared.down))
    return StockLayer(
        layer_id=lw.layer_id, input_norm=lw.input_norm, post_norm=lw.post_attention_norm,
        qkv_a=qkv_a, q_a_norm=a.q_a_norm, kv_a_norm=a.kv_a_norm, q_b=_fp8(a.q_b),
        w_kc=w_kc, w_vc=w_vc, o_proj=_fp8(a.o_proj),
        idx_wq_b=_fp8(idx.wq_b) if idx is not None else None, idx_wkw=wkw,
        idx_norm_w=idx.k_norm_weight if idx is not None else None,
        idx_norm_b=idx.k_norm_bias if idx is not None else None,
        dense_w13=dense_w13, dense_down=None if lw.is_moe else _fp8(lw.mlp.down), moe=moe,
    )


def stock_forward(cfg, sl: StockLayer, hidden, residual, rows: Rows, caches, topk_prev,
                  ops: Ops = STOCK_OPS, record: Optional[dict] = None):
    """(y partial [M, H], residual, topk positions [M, index_topk]) of one rank's layer.
    `record` (eager runs only): gets this layer's chosen expert ids."""
    eps, theta = cfg.rms_norm_eps, cfg.rope_theta
    m = hidden.shape[0]
    ql, kvl, rope, nope = cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim, cfg.qk_nope_head_dim
    heads = sl.w_kc.shape[0]
    kv_cache = caches.kv[sl.layer_id]

    x, residual = K.add_rms_norm(hidden, residual, sl.input_norm, eps)
    xq, xs = ops.quant(x)
    qkv = ops.gemm(xq, xs, sl.qkv_a)
    c_q = K.latent_post(qkv, sl.q_a_norm, sl.kv_a_norm, kv_cache, rows.out_slots, rows.positions,
                        eps, theta, ql, kvl, rope)
    cqq, cqs = ops.quant(c_q)
    if sl.idx_wq_b is not None:
        ni, di = cfg.index_n_heads, cfg.index_head_dim
        qi = ops.gemm(cqq, cqs, sl.idx_wq_b)
        q8, qsc = K.index_q(qi, rows.positions, theta, ni, di, rope)
        kw = F.linear(x, sl.idx_wkw)
        hw = K.index_k(kw, sl.idx_norm_w, sl.idx_norm_b, qsc, caches.index[sl.layer_id],
                       rows.out_slots, rows.positions, cfg.index_k_norm_eps, theta, ni, di, rope)
        width = rows.token_slots.shape[1]
        scores = K.index_logits(q8, hw, caches.index[sl.layer_id], rows.token_slots,
                                rows.seq_lens, width)
        k = min(cfg.index_topk, width)
        vals, topk = torch.topk(scores, k, dim=1)
        topk = torch.where(vals > float("-inf"), topk, torch.full_like(topk, -1))
        if k < cfg.index_topk:
            topk = torch.cat([topk, topk.new_full((m, cfg.index_topk - k), -1)], dim=1)
    else:
        topk = topk_prev
    q = ops.gemm(cqq, cqs, sl.q_b)
    q_pe = K.rope_q(q, rows.positions, theta, heads, nope, rope)
    q_nope = q.view(m, heads, nope + rope)[..., :nope].transpose(0, 1)
    q_lat = torch.bmm(q_nope, sl.w_kc).transpose(0, 1).contiguous()
    o_lat = K.sparse_mla(q_lat, q_pe, kv_cache, topk, rows.token_slots, cfg.softmax_scale)
    o = torch.bmm(o_lat.transpose(0, 1), sl.w_vc).transpose(0, 1).reshape(m, -1)
    oq, os_ = ops.quant(o)
    y = ops.gemm(oq, os_, sl.o_proj)
    x2, residual = K.add_rms_norm(y, residual, sl.post_norm, eps)
    x2q, x2s = ops.quant(x2)
    if sl.moe is not None:
        logits = _router_logits(x2, sl.moe.router)
        ids, wts, table = K.route(logits, sl.moe.bias, cfg.num_experts_per_tok,
                                  cfg.routed_scaling_factor, cfg.norm_topk_prob)
        if record is not None:
            record[sl.layer_id] = ids[:, :-1]
        y = ops.moe(x2q, x2s, x2, ids, wts, table, sl.moe)
    else:
        gu = ops.gemm(x2q, x2s, sl.dense_w13)
        aq, as_ = K.silu_mul_quant(gu)
        y = ops.gemm(aq, as_, sl.dense_down)
    return y, residual, topk
