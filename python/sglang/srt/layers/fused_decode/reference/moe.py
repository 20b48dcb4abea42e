"""The MLP half of a GLM-5.3 layer: dense SwiGLU MLP, router, and shared + routed experts.

Router: logits = bf16GEMM(x, W_gate) in fp32; s = sigmoid(logits); experts chosen by the top-k of
s + e_score_correction_bias (fp32; ties to the lower expert id; n_group = topk_group = 1);
weights = s of the chosen / (their sum + 1e-20), times routed_scaling_factor (2.5).
Experts as SGLang's fused MoE on H200 (shared expert fused in with weight 1): per expert,
[g | u] = FP8GEMM(x) (bf16), a = SiLU(g) * u (bf16), y = FP8GEMM(a) (fp32), term = bf16(w * y);
the rank's partial = bf16(fp32 sum of its terms). Each rank holds a slice of every expert's
intermediate dimension, so the partials sum to the TP1 result in the all-reduce.
"""

from __future__ import annotations

from typing import Tuple

import torch

from .config import Glm5Config
from .ops import silu_and_mul
from .quant import Fp8Weight, Numerics, act_for_fp8_gemm, bf16_linear, fp8_linear
from .weights import DenseMlpWeights, MoeWeights

RENORM_EPS = 1e-20


def dense_mlp(w: DenseMlpWeights, x, num: Numerics) -> torch.Tensor:
    a = silu_and_mul(fp8_linear(x, w.gate, num), fp8_linear(x, w.up, num), num.act_dtype)
    return fp8_linear(a, w.down, num)


def route(cfg: Glm5Config, logits: torch.Tensor, bias: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(expert ids int64 [M, k], fp32 weights [M, k] including routed_scaling_factor)."""
    scores = logits.to(torch.float32).sigmoid()
    choice = scores + bias.to(torch.float32)
    ids = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, : cfg.num_experts_per_tok]
    w = scores.gather(1, ids)
    if cfg.norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True) + RENORM_EPS)
    return ids, w * cfg.routed_scaling_factor


def router(cfg: Glm5Config, w: MoeWeights, x) -> Tuple[torch.Tensor, torch.Tensor]:
    return route(cfg, bf16_linear(x, w.router, torch.float32), w.bias)


def _expert(gate: Fp8Weight, up: Fp8Weight, down: Fp8Weight, xq: torch.Tensor, num: Numerics):
    """fp32 y of one expert for the (already activation-quantized) rows xq."""
    g = (xq @ gate.dequant().T).to(num.act_dtype)
    u = (xq @ up.dequant().T).to(num.act_dtype)
    return act_for_fp8_gemm(silu_and_mul(g, u, num.act_dtype), num) @ down.dequant().T


def moe_partial(cfg: Glm5Config, w: MoeWeights, x, ids, weights, num: Numerics) -> torch.Tensor:
    """This rank's share of shared + routed experts for rows x [M, hidden] routed by (ids, weights)."""
    xq = act_for_fp8_gemm(x, num)
    acc = _expert(w.shared.gate, w.shared.up, w.shared.down, xq, num).to(num.act_dtype).float()
    for e in torch.unique(ids).tolist():
        rows, slot = (ids == e).nonzero(as_tuple=True)
        y = _expert(w.gate.select(e), w.up.select(e), w.down.select(e), xq[rows], num)
        acc.index_add_(0, rows, (weights[rows, slot].unsqueeze(1) * y).to(num.act_dtype).float())
    return acc.to(num.act_dtype)
