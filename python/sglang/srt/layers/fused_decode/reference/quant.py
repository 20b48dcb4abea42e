"""FP8 e4m3 block-128 numerics as SGLang's CUDA path does them, in plain torch.

- Weights: e4m3 with one fp32 scale per 128x128 block (the checkpoint's `weight_scale_inv`);
  the last block of a dimension may be partial.
- Activations before an FP8 GEMM: quantized per row and per 128 consecutive columns with
  scale = max(amax, 1e-10) / 448 (SGLang's per-token-group quant); the GEMM is the exact fp32
  product of the dequantized operands, rounded once to the output dtype.
- Indexer vectors: one scale per 128-vector, max(amax, 1e-4) / 448.

`Numerics` switches between SGLang's mixed precision (bf16 activations, FP8 activations into
FP8 GEMMs) and an all-fp32 mode (no activation quantization, no bf16 rounding points) used to
separate algorithmic from rounding differences. `FOLDED_INPUT_NORM` is SGLang's numerics but
for the rounding of a layer's input norm into q_a|kv_a's FP8 operand, taken as the fused path's
attn_side launch takes it (its norm_in form): rstd factored out of the per-128 quantization.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
ACT_EPS = 1e-10
INDEX_EPS = 1e-4


@dataclass(frozen=True)
class Numerics:
    act_dtype: torch.dtype = torch.bfloat16  # residual stream and every activation rounding point
    act_fp8: bool = True  # quantize activations per 128-group before FP8 GEMMs
    # q_a|kv_a's operand on a layer without the indexer quantized before the input norm's rstd
    # (`folded_norm_quant`), as attn_side's norm_in form makes it; the residual and the norm's
    # bf16 output stay SGLang's
    fold_input_norm: bool = False

    def round(self, x: torch.Tensor) -> torch.Tensor:
        """Round to the activation dtype (the result keeps that dtype)."""
        return x.to(self.act_dtype)


SGLANG = Numerics()
FP32 = Numerics(act_dtype=torch.float32, act_fp8=False)
FOLDED_INPUT_NORM = Numerics(fold_input_norm=True)


@dataclass
class Fp8Weight:
    """An FP8 block-quantized matrix (or a stack of them): q [..., N, K] e4m3, s [..., ceil(N/128),
    ceil(K/128)] fp32, value = q * s of its block."""

    q: torch.Tensor
    s: torch.Tensor
    block: int = 128

    @property
    def shape(self):
        return self.q.shape

    def dequant(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return dequant_block(self.q, self.s, self.block).to(dtype)

    def select(self, idx) -> "Fp8Weight":
        """Index the leading (expert) dimension."""
        return Fp8Weight(self.q[idx], self.s[idx], self.block)


def _expand_blocks(s: torch.Tensor, n: int, k: int, block: int) -> torch.Tensor:
    s = s.repeat_interleave(block, dim=-2).repeat_interleave(block, dim=-1)
    return s[..., :n, :k]


def dequant_block(q: torch.Tensor, s: torch.Tensor, block: int = 128) -> torch.Tensor:
    n, k = q.shape[-2], q.shape[-1]
    return q.to(torch.float32) * _expand_blocks(s.to(torch.float32), n, k, block)


def quant_block(w: torch.Tensor, block: int = 128) -> Fp8Weight:
    """Quantize a matrix to e4m3 with one scale per block: scale = amax/448 (1 for a zero block)."""
    w = w.to(torch.float32)
    n, k = w.shape[-2], w.shape[-1]
    nb, kb = -(-n // block), -(-k // block)
    pad = torch.zeros(*w.shape[:-2], nb * block, kb * block, dtype=torch.float32, device=w.device)
    pad[..., :n, :k] = w
    tiles = pad.unflatten(-1, (kb, block)).unflatten(-3, (nb, block))  # [..., nb, b, kb, b]
    amax = tiles.abs().amax(dim=(-3, -1))
    s = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (w / _expand_blocks(s, n, k, block)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return Fp8Weight(q, s, block)


def quant_act(x: torch.Tensor, group: int = 128):
    """Per-row, per-`group`-columns e4m3 quantization: (q [.., K] e4m3, s [.., K/group] fp32)."""
    xf = x.to(torch.float32)
    g = xf.unflatten(-1, (-1, group))
    s = g.abs().amax(dim=-1).clamp_min(ACT_EPS) / FP8_MAX
    q = (g * (1.0 / s).unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q.flatten(-2), s


def folded_norm_quant(hidden: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                      eps: float) -> torch.Tensor:
    """The input norm's FP8 operand with rstd factored out of its quantization (attn_side's
    norm_in: a unit quantizes its own columns of the row before the row's sum of squares is
    complete): y = bf16((hidden + residual) w), quantized per 128 columns as `quant_act`, its
    scales times the row's rstd of the fp32 sum. Returns the dequantized fp32 [M, K].

    SGLang's operand is e4m3(bf16(s rstd w) / s'): the two differ by one e4m3 step where the
    bf16 roundings of s w and s rstd w fall on two sides of an e4m3 rounding boundary (a few
    percent of the elements), each as close to the exact s rstd w as the other
    (test_reference_quant measures both)."""
    s = hidden.to(torch.float32) + residual.to(torch.float32)
    rstd = torch.rsqrt(s.pow(2).mean(dim=-1, keepdim=True) + eps)
    q, sc = quant_act((s * weight.to(torch.float32)).to(torch.bfloat16))
    return dequant_act(q, sc * rstd)


def dequant_act(q: torch.Tensor, s: torch.Tensor, group: int = 128) -> torch.Tensor:
    return (q.to(torch.float32).unflatten(-1, (-1, group)) * s.unsqueeze(-1)).flatten(-2)


def act_for_fp8_gemm(x: torch.Tensor, num: Numerics) -> torch.Tensor:
    """The fp32 activation an FP8 GEMM multiplies: quantized-dequantized, or exact in fp32 mode."""
    if not num.act_fp8:
        return x.to(torch.float32)
    return dequant_act(*quant_act(x))


def fp8_linear(x: torch.Tensor, w: Fp8Weight, num: Numerics, out_dtype=None) -> torch.Tensor:
    """y = x W^T with W block-FP8: fp32 accumulation of the dequantized operands, one rounding."""
    y = act_for_fp8_gemm(x, num) @ w.dequant().transpose(-1, -2)
    return y.to(out_dtype or num.act_dtype)


def bf16_linear(x: torch.Tensor, w: torch.Tensor, out_dtype) -> torch.Tensor:
    """y = x W^T with bf16 operands (x taken as it is), fp32 accumulation, one rounding."""
    return (x.to(torch.float32) @ w.to(torch.float32).transpose(-1, -2)).to(out_dtype)


def quant_index_vec(x: torch.Tensor):
    """One e4m3 scale per last-dim vector: (q e4m3, s fp32 [...]), s = max(amax, 1e-4)/448."""
    xf = x.to(torch.float32)
    s = xf.abs().amax(dim=-1).clamp_min(INDEX_EPS) / FP8_MAX
    q = (xf * (1.0 / s).unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q, s
