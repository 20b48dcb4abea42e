"""Residual add + RMSNorm for 1-16 rows (one program per row), as SGLang's fused kernel:
the new residual is the sum rounded to bf16, the norm is taken of the unrounded fp32 sum.

The layer input may arrive as fp32 split-K partials of the previous GEMM (summed here in a
fixed order and rounded once to bf16), and the normed row can also be written quantized for
the next FP8 GEMM (e4m3, one scale per 128 columns).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from . import overlap
from .fp8_linear import interpreting
from .overlap import launch_dependents_after, prefetch_table, stage_begin, stage_wait
from .quant import store_row_groups, sum_parts

# warps per row program: 16 were 0.5-1.3 us faster than 8 (results/tiling_probe_20261130T132821Z),
# 32 were 0.8-1.0 us faster a MoE layer than 16 at one row, 0.4-1.0 at two, the same for the
# dense one (tiling_probe_20261201T053337Z)
NUM_WARPS = 32
# Steps of at most this many rows: the program loads the norm's weight before its wait (a
# weight: nothing in flight writes it), rather than after the row's reduction (in the default's
# sm_90a SASS the weight's load follows the sum of squares' BAR.SYNC). Off: not faster on an
# H100 (+0.1..+0.6 us a layer, every kind, tiling_probe_20261207T132839Z, T133255Z): the
# layer's first norm at 1-2 rows is slow for another reason (LATE_DEPENDENTS_MAX_ROWS).
W_EARLY_MAX_ROWS = 16 if overlap.weights_early(False) else 0
# Steps of at most this many rows: the next kernel launches only once the program's row loads
# have landed and its rstd is known (``launch_dependents_after``), not right after the wait.
# At 1-2 rows of a MoE layer the first norm adds ~4.1-4.4 us where it adds ~2.2-2.6 in every
# other place of the timelines, because the kernel after it there is attn_side, whose CTAs
# stream q_a|kv_a's 16 MB before their wait: with this form the norm adds 2.2 and attn_side
# 2.2 more (12.9 against 10.75 us; attn_side asking for none of its slots early, the same
# shift: graph_timeline_20261207T133217Z, T133229Z, T133242Z on an H100), and a layer is
# 0.4-1.0 us slower (tiling_probe_20261207T132839Z). So off: that overlap is worth its cost.
LATE_DEPENDENTS_MAX_ROWS = 0


@triton.jit
def _add_rms_norm_row(m, x_ptr, x_split: tl.constexpr, res_ptr, w_ptr, out_ptr, res_out_ptr,
                      xq_ptr, sx_ptr, M, H, eps, HAS_RES: tl.constexpr, HAS_OUT: tl.constexpr,
                      QUANT: tl.constexpr, BLOCK: tl.constexpr, INTERPRET: tl.constexpr,
                      w_pre=None, LATE_PDL: tl.constexpr = False):
    offs = tl.arange(0, BLOCK)
    ok = offs < H
    x = sum_parts(x_ptr, x_split, M * H, m * H + offs, ok)
    _add_rms_norm_values(m, x, offs, ok, res_ptr, w_ptr, out_ptr, res_out_ptr, xq_ptr, sx_ptr,
                         H, eps, HAS_RES, HAS_OUT, QUANT, BLOCK, INTERPRET, w_pre, LATE_PDL)


@triton.jit
def _add_rms_norm_values(m, x, offs, ok, res_ptr, w_ptr, out_ptr, res_out_ptr, xq_ptr, sx_ptr,
                         H, eps, HAS_RES: tl.constexpr, HAS_OUT: tl.constexpr,
                         QUANT: tl.constexpr, BLOCK: tl.constexpr, INTERPRET: tl.constexpr,
                         w_pre=None, LATE_PDL: tl.constexpr = False):
    """``_add_rms_norm_row`` of row m's input already summed (fp32 x [BLOCK], offs its
    columns, ok those < H). w_pre: the norm's weight at offs, already loaded (else loaded
    here). LATE_PDL: let the next kernel launch once rstd is known (the wait came before)."""
    s = x.to(tl.bfloat16).to(tl.float32)
    if HAS_RES:
        s += tl.load(res_ptr + m * H + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(res_out_ptr + m * H + offs, s.to(res_out_ptr.dtype.element_ty), mask=ok)
    rstd = 1.0 / tl.sqrt(tl.sum(s * s, axis=0) / H + eps)
    if LATE_PDL:
        launch_dependents_after(rstd, True)
    if w_pre is None:
        w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    else:
        w = w_pre
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
                         INTERPRET: tl.constexpr, PDL: tl.constexpr, PF_TABLE: tl.constexpr,
                         W_EARLY: tl.constexpr = False, LATE: tl.constexpr = False):
    """W_EARLY: the weight loaded before the wait (W_EARLY_MAX_ROWS). LATE (only with PDL): the
    next kernel launches once the row's rstd is known (LATE_DEPENDENTS_MAX_ROWS)."""
    if PF_TABLE:  # weights of later stages (overlap.region_table): read-only, so before the wait
        prefetch_table(table_ptr, n_regions, tl.program_id(0), tl.num_programs(0), PDL,
                       PF_TABLE)
    if tl.program_id(0) < M:  # programs past the rows only prefetch
        w_pre = None
        if W_EARLY:
            offs = tl.arange(0, BLOCK)
            w_pre = tl.load(w_ptr + offs, mask=offs < H, other=0.0).to(tl.float32)
        if LATE:
            stage_wait(PDL)
        else:
            stage_begin(PDL)
        _add_rms_norm_row(tl.program_id(0), x_ptr, x_split, res_ptr, w_ptr, out_ptr,
                          res_out_ptr, xq_ptr, sx_ptr, M, H, eps, HAS_RES, HAS_OUT, QUANT, BLOCK,
                          INTERPRET, w_pre, LATE)


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
        W_EARLY=m <= W_EARLY_MAX_ROWS, LATE=pdl and m <= LATE_DEPENDENTS_MAX_ROWS,
        **overlap.launch_kw())


# Tried: a layer's first add+RMSNorm inside its q_a|kv_a launch at 1-2 rows (no indexer), every
# program norming the whole rows itself before its K chunk, one launch fewer: on an H200 a
# MoE layer 7.0 us slower at 1 row and 8.8 at 2 (tiling_probe_20261203T164338Z; correct
# against the reference on the GPU; code at 02ae205).
# Tried: the add+RMSNorm after o_proj as the tail of o_proj's launch (its last program to
# finish normalizing every row, ``arrival``). One 4-warp program per step instead of a 16-warp
# program per row made the layer slower on an H200: +3.5 us at 1 row, +8.5 at 2, +71 at 16
# (tiling_probe_20261201T024512Z, T024527Z, T024535Z: norm_tail_*; code at d72a16b).
