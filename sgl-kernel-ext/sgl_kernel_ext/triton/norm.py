"""Residual add + RMSNorm for 1-16 rows (one program per row), as SGLang's fused kernel:
the new residual is the sum rounded to bf16, the norm is taken of the unrounded fp32 sum."""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl


@triton.jit
def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, H, eps,
                         HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
    m = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    ok = offs < H
    s = tl.load(x_ptr + m * H + offs, mask=ok, other=0.0).to(tl.float32)
    if HAS_RES:
        s += tl.load(res_ptr + m * H + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(res_out_ptr + m * H + offs, s.to(res_out_ptr.dtype.element_ty), mask=ok)
    rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / H + eps)
    w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * H + offs, (s * rstd * w).to(out_ptr.dtype.element_ty), mask=ok)


def add_rms_norm(x: torch.Tensor, residual: Optional[torch.Tensor], weight: torch.Tensor,
                 eps: float, out: torch.Tensor, residual_out: torch.Tensor) -> None:
    """out = RMSNorm(x + residual) * weight; residual_out = x + residual (x alone if None).
    residual_out may alias residual."""
    m, h = x.shape
    assert x.is_contiguous() and out.is_contiguous() and residual_out.is_contiguous()
    _add_rms_norm_kernel[(m,)](x, residual if residual is not None else x, weight, out,
                               residual_out, h, float(eps), HAS_RES=residual is not None,
                               BLOCK=triton.next_power_of_2(h), num_warps=8)
