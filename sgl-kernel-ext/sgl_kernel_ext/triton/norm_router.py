"""The MoE router on the un-normed post-attention row: the layer's second add + RMSNorm
folded away by algebra, one launch fewer on the MoE path's critical chain.

RMSNorm's rstd is one scalar a row, so it factors out of everything after the norm that is
linear in its output:

    logits = bf16(s rstd g) W_r^T        ~  rstd * (bf16(s g) W_r^T)
    gate/up = e4m3-quant(bf16(s rstd g)) W^T  ~  rstd * (e4m3-quant(bf16(s g)) W^T)

(s = attn + residual in fp32, g the norm's weight; per-128 e4m3 quantization is scale-free
but for its roundings). So the router's split-K programs read the attention rows and the
residual themselves and multiply bf16(s g) into the router's partials as the bf16 router
does, and a program more a K chunk writes the chunk's sums of squares of s and gate/up's
e4m3 x and scales (first written by the products' first tile, whose quantization kept that
tile on the path: 16-35 us slower a MoE layer at 4-16 rows on an H100,
tiling_probe_20261206T222020Z; in programs of their own, as now: -0.4..-0.6 us at 1 row,
+2.8..+3.8 at 4, -0.7..-2.2 at 8, -0.1..+1.5 at 2, 12 and 16, tiling_probe_20261207T052447Z
and the three after it). Route (or gate/up's routing) multiplies the summed logits
by rstd from those sums before the sigmoid, and gate/up its products before SwiGLU
(``moe``'s ``ss`` arguments); the new residual bf16(s), which nothing reads before the
experts' sum, is written by the sum kernel before its wait (``moe.sum_terms``'s ``residual``).

The roundings differ from the reference's only where bf16(s g) and bf16(s rstd g) (and their
e4m3 steps) round differently: noise of the size the layer's NUMERICS already hold (their
test runs this form too). What it removes: the norm's launch between o_proj and the router,
whose whole-row reduction no split of it can avoid. A MoE layer on a TP shard takes it at
the row counts ``ROWS`` names (1-2 rows by default).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import bf16_linear, overlap
from .bf16_linear import _bf16_linear_prefetch, chunk_cols
from .fp8_linear import block_m, interpreting
from .overlap import stage_begin
from .quant import add_fixed, store_row_groups, to_e4m3


@triton.jit
def rstd_rows(ss_ptr, SPLIT: tl.constexpr, M, H, eps, offs_m, m_ok):
    """fp32 [rows] 1 / sqrt(mean(s^2) + eps) of the rows offs_m from the SPLIT K chunks' sums
    of squares ss [SPLIT, M] (1 where not m_ok)."""
    acc = tl.load(ss_ptr + offs_m, mask=m_ok, other=0.0)
    for s in tl.static_range(1, SPLIT):
        acc += tl.load(ss_ptr + s * M + offs_m, mask=m_ok, other=0.0)
    return tl.where(m_ok, 1.0 / tl.sqrt(acc / H + eps), 1.0)


@triton.jit
def _quant_chunk(a_ptr, res_ptr, g_ptr, ss_ptr, xq_ptr, sx_ptr, M, K, k_lo, k_hi, split,
                 QM: tl.constexpr, GROUPS: tl.constexpr, INTERPRET: tl.constexpr):
    """A K chunk's sums of squares of s = a + res into ss[split, :M] and its per-128 e4m3
    of bf16(s g) into xq / sx, its GROUPS 128-column groups unrolled (loads in flight
    together)."""
    offs_m = tl.arange(0, QM)
    m_ok = offs_m < M
    kblocks = tl.cdiv(K, 128)
    ss = tl.zeros((QM,), dtype=tl.float32)
    for j in tl.static_range(GROUPS):
        k = k_lo + j * 128 + tl.arange(0, 128)
        k_ok = k < k_hi
        mk = m_ok[:, None] & k_ok[None, :]
        at = offs_m[:, None] * K + k[None, :]
        s = tl.load(a_ptr + at, mask=mk, other=0.0).to(tl.float32) \
            + tl.load(res_ptr + at, mask=mk, other=0.0).to(tl.float32)
        gam = tl.load(g_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
        ss += tl.sum(s * s, axis=1)
        y = (s * gam[None, :]).to(tl.bfloat16).to(tl.float32)
        sc = tl.maximum(tl.max(tl.abs(y), axis=1), 1e-10) / 448.0
        q = to_e4m3(tl.clamp(y * (1.0 / sc)[:, None], -448.0, 448.0), INTERPRET)
        tl.store(xq_ptr + at, q, mask=mk)
        tl.store(sx_ptr + offs_m * kblocks + k_lo // 128 + j, sc,
                 mask=m_ok & (k_lo + j * 128 < k_hi))
    tl.store(ss_ptr + split * M + offs_m, ss, mask=m_ok)


@triton.jit
def _norm_router_kernel(a_ptr, res_ptr, g_ptr, w_ptr, parts_ptr, ss_ptr, xq_ptr, sx_ptr,
                        M, K, E, k_chunk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, QM: tl.constexpr, GROUPS: tl.constexpr,
                        GEMV: tl.constexpr, INTERPRET: tl.constexpr, PDL: tl.constexpr,
                        PREFETCH: tl.constexpr, FIXED: tl.constexpr = False,
                        QUANT_IN_TILE0: tl.constexpr = False):
    """Programs (tile of E, K chunk): parts[chunk] = bf16(s g) W^T over the chunk (fp32),
    s = a + res (FIXED: added into the int64 sums parts [M, E] instead, ``quant.add_fixed``);
    the last tile index of each chunk instead writes ss[chunk, m] and the chunk's e4m3 x and
    scales (``_quant_chunk``), beside the products (QUANT_IN_TILE0, the GEMV form only: no
    such tile, tile 0's programs write them from the rows they multiply)."""
    tile = tl.program_id(0)
    split = tl.program_id(1)
    k_lo = split * k_chunk
    k_hi = tl.minimum(k_lo + k_chunk, K)
    quant_tile = tl.num_programs(0) if QUANT_IN_TILE0 else tl.num_programs(0) - 1
    if tile == quant_tile:
        stage_begin(PDL)
        _quant_chunk(a_ptr, res_ptr, g_ptr, ss_ptr, xq_ptr, sx_ptr, M, K, k_lo, k_hi, split,
                     QM, GROUPS, INTERPRET)
    else:
        _bf16_linear_prefetch(tile, split, K, w_ptr, E, k_chunk, BLOCK_N, PDL and PREFETCH)
        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < E
        offs_m = tl.arange(0, BLOCK_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if GEMV:  # the whole chunk at once, a multiply-and-sum a row
            k = k_lo + tl.arange(0, BLOCK_K)
            k_ok = k < k_hi
            gam = tl.load(g_ptr + k, mask=k_ok, other=0.0).to(tl.float32)  # weights: before
            w = tl.load(w_ptr + offs_n[:, None] * K + k[None, :],
                        mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
            stage_begin(PDL)
            ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
            for r in tl.static_range(BLOCK_M):
                ok = k_ok & (r < M)
                s = tl.load(a_ptr + r * K + k, mask=ok, other=0.0).to(tl.float32) \
                    + tl.load(res_ptr + r * K + k, mask=ok, other=0.0).to(tl.float32)
                y = (s * gam).to(tl.bfloat16).to(tl.float32)
                acc += tl.where(offs_m[:, None] == r, tl.sum(w * y[None, :], axis=1)[None, :],
                                0.0)
                if QUANT_IN_TILE0:
                    if (tile == 0) & (r < M):
                        ss = tl.where(offs_m == r, tl.sum(s * s, axis=0), ss)
                        store_row_groups(y, tl.arange(0, BLOCK_K), k_hi - k_lo,
                                         xq_ptr + r * K + k_lo,
                                         sx_ptr + r * tl.cdiv(K, 128) + k_lo // 128, BLOCK_K,
                                         INTERPRET)
            if QUANT_IN_TILE0:
                if tile == 0:
                    tl.store(ss_ptr + split * M + offs_m, ss, mask=offs_m < M)
        else:
            stage_begin(PDL)
            m_ok = offs_m < M
            # (chunks are whole 128-column groups of K: no column masks in the loop)
            for k0 in range(k_lo, k_hi, BLOCK_K):
                k = k0 + tl.arange(0, BLOCK_K)
                w = tl.load(w_ptr + offs_n[:, None] * K + k[None, :], mask=n_ok[:, None],
                            other=0.0)
                gam = tl.load(g_ptr + k).to(tl.float32)
                at = offs_m[:, None] * K + k[None, :]
                s = tl.load(a_ptr + at, mask=m_ok[:, None], other=0.0).to(tl.float32) \
                    + tl.load(res_ptr + at, mask=m_ok[:, None], other=0.0).to(tl.float32)
                y = (s * gam[None, :]).to(tl.bfloat16)
                if INTERPRET:
                    acc += tl.dot(y.to(tl.float32), tl.trans(w.to(tl.float32)))
                else:
                    acc += tl.dot(y, tl.trans(w))
        ok = (offs_m[:, None] < M) & n_ok[None, :]
        if FIXED:
            add_fixed(parts_ptr + offs_m[:, None] * E + offs_n[None, :], acc, ok)
        else:
            tl.store(parts_ptr + split * M * E + offs_m[:, None] * E + offs_n[None, :], acc,
                     mask=ok)


def norm_router(attn: torch.Tensor, residual: torch.Tensor, gamma: torch.Tensor,
                router_w: torch.Tensor, parts: torch.Tensor, ss: torch.Tensor,
                xq: torch.Tensor, sx: torch.Tensor, sums=None) -> None:
    """parts fp32 [SPLIT, M, E] = the K chunks of bf16((attn + residual) gamma) router_w^T
    (SPLIT: ``launch``'s at M rows),
    ss fp32 [SPLIT, M] their sums of squares of attn + residual, xq e4m3 [>= M, H] and sx fp32
    [>= M, H/128] bf16((attn + residual) gamma) quantized per 128 columns (gate/up's x up to
    the factor rstd). attn, residual bf16 [M, H] (neither written); gamma [H]; router_w
    bf16 [E, H]. sums int64 [M, E] at zero (the MMA shape's rows only, ``fixed``): the
    products are added into it in 2^-32 units instead (parts then unused; route reads and
    zeroes it)."""
    m, k = attn.shape
    split, pm, e = parts.shape
    if residual.shape != (m, k) or gamma.shape != (k,) or router_w.shape != (e, k) or pm != m:
        raise ValueError(f"norm_router: attn {tuple(attn.shape)}, residual "
                         f"{tuple(residual.shape)}, gamma {tuple(gamma.shape)}, router "
                         f"{tuple(router_w.shape)}, parts {tuple(parts.shape)} do not agree")
    if k % 128:
        raise ValueError(f"norm_router: the hidden size ({k}) must be whole 128-column groups")
    for name, t in (("attn", attn), ("residual", residual), ("router_w", router_w),
                    ("parts", parts), ("ss", ss), ("xq", xq), ("sx", sx)):
        if not t.is_contiguous():
            raise ValueError(f"norm_router: {name} must be contiguous")
    if parts.dtype != torch.float32 or ss.dtype != torch.float32 or ss.shape != (split, m):
        raise ValueError(f"norm_router: parts and ss must be fp32 [SPLIT, M, E] and [SPLIT, M], "
                         f"got {parts.dtype} {tuple(parts.shape)}, {ss.dtype} {tuple(ss.shape)}")
    if xq.shape[0] < m or xq.shape[1] != k or sx.shape[0] < m or sx.shape[1] != k // 128:
        raise ValueError(f"norm_router: xq {tuple(xq.shape)} / sx {tuple(sx.shape)} do not "
                         f"hold {m} rows of {k}")
    block_n, want = launch(m)
    if split != want:
        raise ValueError(f"norm_router: {m} rows take {want} K chunks (``launch``), got {split}")
    bm, bk, gemv = bf16_linear.launch_shape(m, k, split)
    if not gemv:
        bm, bk = block_m(m), 128
    if sums is not None:
        if gemv or sums.dtype != torch.int64 or sums.shape != (m, e) or not sums.is_contiguous():
            raise ValueError(f"norm_router: sums must be contiguous int64 [{m}, {e}] at rows "
                             f"the MMA shape multiplies, got {sums.dtype} {tuple(sums.shape)} "
                             f"at {m} rows ({'GEMV' if gemv else 'MMA'} shape)")
    k_chunk = chunk_cols(k, split, 128)
    in_tile0 = gemv and m <= QUANT_IN_PRODUCTS_MAX_ROWS
    # a program more a K chunk: its sums of squares and gate/up's x (or tile 0's programs)
    _norm_router_kernel[(triton.cdiv(e, block_n) + (0 if in_tile0 else 1), split)](
        attn, residual, gamma, router_w, parts if sums is None else sums, ss, xq, sx, m, k, e,
        k_chunk, BLOCK_M=bm, BLOCK_N=block_n, BLOCK_K=bk, QM=triton.next_power_of_2(m),
        GROUPS=k_chunk // 128, GEMV=gemv, INTERPRET=interpreting(),
        PDL=overlap.enabled(), PREFETCH=overlap.prefetches("router"), num_warps=4,
        num_stages=4, FIXED=sums is not None, QUANT_IN_TILE0=in_tile0, **overlap.launch_kw())


# (columns a program, K chunks) of the products: as the bf16 router's where a program
# multiplies its chunk without the tensor cores (bf16_linear.GEMV_MAX_ROWS), else wider tiles
# over fewer K chunks: each program also makes its [rows, chunk] x from attn, the residual
# and gamma (~490 sm_90a instructions a warp a 128-column step against the bf16 router's 70),
# which wide tiles make once for more of the products
GEMV_SHAPE = (16, 8)
MMA_SHAPE = (64, 24)
MAX_SPLIT = 64  # the most K chunks a layer's buffers hold


def launch(m: int) -> tuple:
    """(columns a program, K chunks) at m rows."""
    shape = GEMV_SHAPE if m <= bf16_linear.GEMV_MAX_ROWS else MMA_SHAPE
    if not 1 <= shape[1] <= MAX_SPLIT:
        raise ValueError(f"norm_router: {shape[1]} K chunks, at most {MAX_SPLIT}")
    return shape


# rows up to which (the GEMV shape's only) tile 0's programs write the sums of squares and
# gate/up's x from the rows they multiply, as the first form did at every row count, instead
# of a tile of programs of their own that load the rows again. 2: on an H100 with the CuTe DSL
# attention side this form was -1.6 / -1.9 us against the norm's at one row (MoE / MoE+indexer
# layer; the baselines' spread 1.0 / 1.8) and -0.8 / -0.3 at two (spread 0.7 / 0.4), where the
# form with its own quantization tile was -0.0 / +0.1 and -0.3 / -0.1 in the same run
# (tiling_probe_20261207T101324Z). 0: off.
QUANT_IN_PRODUCTS_MAX_ROWS = 2


# rows from which the MMA shape's products add into one int64 [M, E] sum that route reads
# once (``fixed``), where otherwise route sums MMA_SHAPE's 24 fp32 K chunks: at 4 rows on an
# H100 route took 6.0 us after this form against 4.3 after the bf16 router's 8 chunks
# (graph_timeline_20261207T073511Z, T073445Z). 17: off. On an H100 it took back the form's
# 4-row loss (+0.3 / -0.1 us against the norm's, the form without it +2.1 / +1.8) but gained
# nothing over the norm's form at 4-16 rows (tiling_probe_20261207T101324Z).
FIXED_FROM_ROWS = 17


def fixed(m: int) -> bool:
    """Whether m rows' products go into fixed-point sums (FIXED_FROM_ROWS; the MMA shape's
    rows only, where route, not gate/up, reads the logits)."""
    return m >= FIXED_FROM_ROWS and m > bf16_linear.GEMV_MAX_ROWS


ENV = "SGL_KERNEL_EXT_NORM_ROUTER_ROWS"  # "1-2", "1,2,16" or "" (none): ROWS from the environment


def _rows(spec: str) -> frozenset:
    """Row counts from "a-b,c,..." (empty: none)."""
    rows = set()
    for part in filter(None, (p.strip() for p in spec.split(","))):
        lo, _, hi = part.partition("-")
        rows.update(range(int(lo), int(hi or lo) + 1))
    return frozenset(rows)


# rows at which a MoE layer on a TP shard takes this form (the post-attention norm's launch
# dropped; ``applies``): 1-2, with the quantization in tile 0 (QUANT_IN_PRODUCTS_MAX_ROWS).
# On an H100, CuTe DSL attention side, against the form off in the same call: MoE layer 60.5
# against 62.6 us at one row and 80.5 against 81.6 at two, the step -3.4% at one row
# (decode_layer_20261207T101848Z against T102143Z, decode_step_20261207T102050Z against
# T102229Z); the GPU suite passes under it (release_tests_h100_b590c1c.log; the shard test's
# bitwise comparisons with the norm's form hold ROWS empty). Not 4 rows (+1.8..+3.8; its
# timeline: the launch saves 1.1 us, route on its 24 K chunks adds 1.7 and o_proj 0.9,
# graph_timeline_20261207T073511Z against T073445Z) nor 8 (-2.2..+0.8 over five probes). Not
# yet run on an H200. The environment's ENV replaces it.
ROWS: frozenset = _rows(os.environ.get(ENV, "1-2"))


def applies(m: int) -> bool:
    """Whether a MoE layer's step of m rows routes on the un-normed row (ROWS)."""
    return m in ROWS
