"""Residual add + RMSNorm for 1-16 rows (one program per row), as SGLang's fused kernel:
the new residual is the sum rounded to bf16, the norm is taken of the unrounded fp32 sum.

The layer input may arrive as fp32 split-K partials of the previous GEMM (summed here in a
fixed order and rounded once to bf16), and the normed row can also be written quantized for
the next FP8 GEMM (e4m3, one scale per 128 columns). After o_proj it can also run as the
tail of o_proj's launch (``fp8_linear_add_rms_norm``, ``arrival``), saving a launch at few rows.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from . import fp8_linear, overlap
from .arrival import arrive_last
from .fp8_linear import _fp8_linear_prefetch, _fp8_linear_task, block_m, grid_shape, interpreting
from .overlap import prefetch_table, stage_begin
from .quant import store_row_groups, sum_parts

NUM_WARPS = 16  # per row program: 0.5-1.3 us under 8 (results/tiling_probe_20261130T132821Z)


@triton.jit
def _add_rms_norm_row(m, x_ptr, x_split: tl.constexpr, res_ptr, w_ptr, out_ptr, res_out_ptr,
                      xq_ptr, sx_ptr, M, H, eps, HAS_RES: tl.constexpr, HAS_OUT: tl.constexpr,
                      QUANT: tl.constexpr, BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    ok = offs < H
    x = sum_parts(x_ptr, x_split, M * H, m * H + offs, ok)
    s = x.to(tl.bfloat16).to(tl.float32)
    if HAS_RES:
        s += tl.load(res_ptr + m * H + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(res_out_ptr + m * H + offs, s.to(res_out_ptr.dtype.element_ty), mask=ok)
    rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / H + eps)
    w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    y = (s * rstd * w).to(tl.bfloat16)
    if HAS_OUT:
        tl.store(out_ptr + m * H + offs, y, mask=ok)
    if QUANT:
        store_row_groups(y.to(tl.float32), offs, H, xq_ptr + m * H, sx_ptr + m * tl.cdiv(H, 128),
                         BLOCK, INTERPRET)


@triton.jit
def _add_rms_norm_kernel(x_ptr, x_split: tl.constexpr, res_ptr, w_ptr, out_ptr, res_out_ptr, xq_ptr, sx_ptr,
                         M, H, eps, table_ptr, n_regions, HAS_RES: tl.constexpr,
                         HAS_OUT: tl.constexpr, QUANT: tl.constexpr, BLOCK: tl.constexpr,
                         INTERPRET: tl.constexpr, PDL: tl.constexpr, PF_TABLE: tl.constexpr):
    if PF_TABLE:  # weights of later stages (overlap.region_table): read-only, so before the wait
        prefetch_table(table_ptr, n_regions, tl.program_id(0), tl.num_programs(0), PDL,
                       PF_TABLE)
    if tl.program_id(0) < M:  # programs past the rows only prefetch
        stage_begin(PDL)
        _add_rms_norm_row(tl.program_id(0), x_ptr, x_split, res_ptr, w_ptr, out_ptr,
                          res_out_ptr, xq_ptr, sx_ptr, M, H, eps, HAS_RES, HAS_OUT, QUANT, BLOCK,
                          INTERPRET)


def add_rms_norm(x: torch.Tensor, residual: Optional[torch.Tensor], weight: torch.Tensor,
                 eps: float, out: Optional[torch.Tensor], residual_out: torch.Tensor,
                 out_q: Optional[torch.Tensor] = None, out_s: Optional[torch.Tensor] = None,
                 prefetch: Optional[torch.Tensor] = None) -> None:
    """out = RMSNorm(x + residual) * weight (bf16, and/or e4m3 out_q with scales out_s);
    residual_out = x + residual (x alone if None); may alias residual. x is bf16 [M, H] or
    fp32 split-K partials [SPLIT, M, H]. prefetch: an ``overlap.region_table`` whose regions
    the programs prefetch into L2 before waiting (with the overlap on), spread over one
    program per SM (those past the rows only prefetch)."""
    parts = x if x.dim() == 3 else x.unsqueeze(0)
    split, m, h = parts.shape
    assert parts.is_contiguous() and residual_out.is_contiguous()
    pdl = overlap.enabled()
    programs = max(m, overlap.prefetch_programs(x.device)) if pdl and prefetch is not None else m
    _add_rms_norm_kernel[(programs,)](
        parts, split, residual if residual is not None else residual_out, weight,
        out if out is not None else residual_out, residual_out,
        out_q if out_q is not None else residual_out, out_s if out_s is not None else weight,
        m, h, float(eps), prefetch if prefetch is not None else weight,
        0 if prefetch is None else prefetch.shape[0], HAS_RES=residual is not None,
        HAS_OUT=out is not None, QUANT=out_q is not None, BLOCK=triton.next_power_of_2(h),
        INTERPRET=interpreting(), PDL=pdl,
        PF_TABLE=0 if prefetch is None else 32 * NUM_WARPS, num_warps=NUM_WARPS,
        **overlap.launch_kw())


# steps of at most this many rows run the add+RMSNorm after o_proj as the tail of o_proj's
# launch (``fp8_linear_add_rms_norm``): its last program to finish normalizes every row.
# Under A/B: 0 keeps the separate kernel.
TAIL_MAX_ROWS = 0


@triton.jit
def _fp8_linear_norm_kernel(xq_ptr, sx_ptr, M, K, k_chunk, wq_ptr, ws_ptr, parts_ptr, N, tiles,
                            arrival_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, oq_ptr, os_ptr,
                            eps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            GROUPS: tl.constexpr, SPLIT: tl.constexpr, BLOCK: tl.constexpr,
                            INTERPRET: tl.constexpr, PDL: tl.constexpr):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    _fp8_linear_prefetch(pid, split, K, k_chunk, wq_ptr, N, tiles, wq_ptr, N, BLOCK_N, PDL)
    stage_begin(PDL)
    _fp8_linear_task(pid, split, xq_ptr, sx_ptr, M, K, k_chunk, wq_ptr, ws_ptr, parts_ptr, N,
                     tiles, wq_ptr, ws_ptr, parts_ptr, N, BLOCK_M, BLOCK_N, GROUPS, INTERPRET)
    if arrive_last(arrival_ptr, tl.num_programs(0) * tl.num_programs(1)):
        for m in range(0, M):
            _add_rms_norm_row(m, parts_ptr, SPLIT, res_ptr, w_ptr, out_ptr, res_out_ptr, oq_ptr,
                              os_ptr, M, N, eps, True, True, True, BLOCK, INTERPRET)


def fp8_linear_add_rms_norm(xq: torch.Tensor, sx: torch.Tensor, wq: torch.Tensor,
                            ws: torch.Tensor, parts: torch.Tensor, arrival: torch.Tensor,
                            residual: torch.Tensor, weight: torch.Tensor, eps: float,
                            out: torch.Tensor, residual_out: torch.Tensor, out_q: torch.Tensor,
                            out_s: torch.Tensor, block_n: int = 64, groups: int = 2) -> None:
    """``fp8_linear`` (parts [SPLIT, M, N] = xq W^T by K chunks) and then ``add_rms_norm`` of
    its partials with the residual, in one launch: the program that finishes last (``arrival``,
    one int32 counter left at zero) normalizes every row. Within the norm's rounding of the
    two-kernel form (its sum of squares is reduced over fewer threads)."""
    m, k = xq.shape
    split, pm, n = parts.shape
    assert pm == m and wq.shape == (n, k) and residual_out.shape == (m, n)
    assert xq.is_contiguous() and sx.is_contiguous() and wq.is_contiguous()
    assert ws.is_contiguous() and parts.is_contiguous() and residual_out.is_contiguous()
    assert arrival.dtype == torch.int32 and arrival.numel() >= 1
    tiles, _, k_chunk = grid_shape(n, 0, k, split, block_n, groups)
    pdl = overlap.enabled()
    _fp8_linear_norm_kernel[(tiles, split)](
        xq, sx, m, k, k_chunk, wq, ws, parts, n, tiles, arrival, residual, weight, out,
        residual_out, out_q, out_s, float(eps), BLOCK_M=block_m(m), BLOCK_N=block_n,
        GROUPS=groups, SPLIT=split, BLOCK=triton.next_power_of_2(n), INTERPRET=interpreting(),
        PDL=pdl, num_warps=fp8_linear.NUM_WARPS, num_stages=3,
        **(overlap.launch_kw() if pdl else {}))
