"""Small-M FP8 block-128 linear with a split K: fp32 partials of y = x W^T for 1-16 rows.

W is e4m3 [N, K] with one fp32 scale per 128x128 block; x comes already quantized (e4m3
[M, K] with one fp32 scale per row and 128 columns, SGLang's per-token-group quant) by the
kernel that produced it. Each program owns BLOCK_N output columns (inside one 128-row scale
block) and one K chunk, and takes GROUPS 128-column groups per iteration as independent loads
(bytes in flight), one e4m3 MMA per group with both scales applied in fp32. The SPLIT
partials [SPLIT, M, N] are summed in a fixed order by the consumer, which rounds once to bf16:
deterministic, no atomics, and a short dependency chain per program.

For a few rows a GEMV form (``_gemv_step``, GEMV_MAX_ROWS) multiplies without the tensor
cores: each step's groups are one load, converted to fp32 in registers and multiplied into
each row's scaled x, so no shared memory is staged; gate/up and down use it at one row.

Up to two matrices sharing x (q_a and kv_a; q_b and the indexer's wq_b) run in one launch.
With ``tails`` the last K chunk of each column tile to finish also sums the tile into bf16
rows and their per-tile sums of squares; a consumer launched with XNORM (``mla.q_b_normed``)
then RMS-norms and quantizes its own groups of x from them (``_normed_group_dot``).
Rows past M are zero-padded to the 16-row MMA minimum; nothing is written for them.
With ``overlap`` on, each program can prefetch its weight tile into L2 before waiting for the
previous kernel; by default it does not (``overlap.PREFETCH_OFF``: measured slower).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from . import overlap
from .arrival import arrive_last
from .overlap import prefetch_rows, stage_begin
from .quant import add_fixed, sum_parts, to_e4m3

GROUP = 128
# warps per program (benchmark/tiling_probe.py: fp8_linear_8_warps). On an H200 8 warps are
# 0.3-3.5 us slower per layer (tiling_probe_20261130T143119Z). (A CPU compile once reported
# ~300 B spilled at 4 warps: it did not know K a multiple of 16, as the GPU's JIT does; with
# that known, test/srt/unit/sm90_compile.py resources lists none.)
NUM_WARPS = 4
# A program took 82 KB of shared memory (3 stages), so two fit a multiprocessor: sized to
# at least 264 programs, q_a|kv_a's 287 and o_proj's 288 ran in 1.09 waves (ncu, H200:
# results/ncu_moe_2aeab55.log). ONE_WAVE sizes the split K to at most TARGET_PROGRAMS: on an
# H200 a layer without the indexer is 1.5-2 us faster at 1-4 rows, every kind 0.5-3 us at 16,
# a layer with the indexer 1 us slower at 1-2 rows; the 78-layer step gains (tiling_probe_
# 20261201T030547Z, T030553Z). 2 or 4 stages instead of 3 (with or without fitting 396
# programs) were 0.4-7.6 us slower a layer. Since one ``_tile`` serves both matrices (each
# had its own pipeline buffers) and the MMAs run transposed (``swap``) a program takes 60 KB,
# so three fit; sized for 396 programs a layer was still 0.3-5 us slower at 2-16 rows
# (tiling_probe_20261201T173533Z: linear_programs_396).
ONE_WAVE = True
TARGET_PROGRAMS = 264
# rows up to which the linears multiply without the tensor cores (_gemv_step), with their own
# output columns a program and 128-column groups a step (the split K stays the layer's). Off:
# on an H200 at one row the MoE layer is 2.4-8 us slower for every tile of 16-64 columns x 2-8
# groups; the dense and MoE+indexer layers gain at most 1.7 and 1.3 us (32 columns, 2 groups;
# tiling_probe_20261201T052901Z, linear_gemv_*)
GEMV_MAX_ROWS = 0
GEMV_BLOCK_N = 64
# see swap(). On an H200 the transposed MMAs make every layer kind 1-3.4 us faster at 1-2
# rows and up to 2 at 4-8 (results/tiling_probe_20261201T172804Z: linear_no_swap); ptxas
# gives the linears 64-78 registers instead of 90-94 (CPU compile)
SWAP = True
# K elements the transposed (asynchronous) fp8 MMA accumulates at the tensor cores' reduced
# precision before Triton adds them into fp32 (None: Triton's default, the whole 128-column
# group). Read at compile time: set it before the first launch (benchmark/numerics_probe.py).
SWAP_IMPRECISE_ACC = tl.constexpr(None)
GEMV_GROUPS = 2
# whether the MMA loops load each 128-column group's scales (the weight rows' and x's) one
# iteration ahead. Triton pipelines the weight and x tiles as asynchronous copies (they feed
# the MMA) but issues these small loads in the iteration that uses them, which then waits for
# them after its MMAs: sm_90a SASS of the linears' loop (sm90_compile.py, CPU) has 12 plain
# global loads whose first use follows the first MMA group's wait (the kernels' SCALES
# constexpr; the persistent layer's tasks take their default, on). On an H200 the plain loops
# make a layer 0.4-2.2 us slower at 1-16 rows, every kind (tiling_probe_20261202T051811Z:
# scales_in_step); bitwise the same output. Down's loop (2 groups at TP8) with its activations
# and scales an iteration ahead: 0.4-1.6 us slower a MoE layer at 1-2 rows, within 0.3 at
# 4-16 (T052409Z, code at 3040a43), so it keeps the plain loop.
SCALES_AHEAD = True
# Tried: each program's first loop step of weight tiles and their scales loaded into registers
# before its programmatic wait (weights never change), so the first MMAs after it wait only
# for x. Bitwise the loop (interpreter and GPU tests: 9 passed, pytest_w_early_18ade60.log),
# 84-88 registers against 80-86 at sm_90a, but on an H200 slower from 2 rows: +0.1..+0.5 us
# a layer at 2 rows, +0.2..+2.3 at 4-16 (most with the indexer and dense), -0.7 on a MoE layer
# at one row, +0.1 on the others (tiling_probe_20261203T184036Z: linear_w_early; code at
# 18ade60). The one-row MoE case alone is unconfirmed.
# Tried: launches without the overlap (9-16 rows) still prefetching each program's weight tile
# into L2 at its start, as they do before the wait with it: on an H200 3.6-4.4 us slower a
# layer at 12-16 rows, every kind (results/tiling_probe_20261202T135947Z: linear_l2_ahead;
# code at 8543865).


@triton.jit
def _group_weights(w_ptr, s_ptr, offs_n, N, K, kb):
    """(e4m3 W[offs_n] in the 128-column group kb, the rows' scales of that group)."""
    k = kb * 128 + tl.arange(0, 128)
    n_ok = offs_n < N
    w = tl.load(w_ptr + offs_n[:, None] * K + k[None, :], mask=n_ok[:, None] & (k < K)[None, :],
                other=0.0)
    sw = tl.load(s_ptr + (offs_n // 128) * tl.cdiv(K, 128) + kb, mask=n_ok, other=0.0)
    return w, sw


@triton.jit
def _scaled_dot(xq, sx, w, sw, INTERPRET: tl.constexpr, SWAP: tl.constexpr = False):
    """fp32 xq . w^T with the rows' and the columns' scales on; with SWAP its transpose
    w . xq^T, [columns, rows] (``swap``)."""
    if INTERPRET:  # fp8 / bf16 dots are unreliable in the interpreter
        xq = xq.to(tl.float32)
        w = w.to(tl.float32)
    if SWAP:
        part = tl.dot(w, tl.trans(xq), max_num_imprecise_acc=SWAP_IMPRECISE_ACC) \
            * sw[:, None] * sx[None, :]
    else:
        part = tl.dot(xq, tl.trans(w)) * sx[:, None] * sw[None, :]
    return part


@triton.jit
def group_x(xq_ptr, sx_ptr, M, K, kb, BLOCK_M: tl.constexpr):
    """(e4m3 x [BLOCK_M, 128] in the 128-column group kb, zero past M; its rows' scales)."""
    offs_m = tl.arange(0, BLOCK_M)
    k = kb * 128 + tl.arange(0, 128)
    x = tl.load(xq_ptr + offs_m[:, None] * K + k[None, :],
                mask=(offs_m[:, None] < M) & (k < K)[None, :], other=0.0)
    sx = tl.load(sx_ptr + offs_m * tl.cdiv(K, 128) + kb, mask=offs_m < M, other=0.0)
    return x, sx


@triton.jit
def group_scales(s_ptr, offs_n, N, K, kb, sx_ptr, M, BLOCK_M: tl.constexpr):
    """(the weight rows offs_n's scales of the 128-column group kb, x's rows' scales of it)."""
    kblocks = tl.cdiv(K, 128)
    sw = tl.load(s_ptr + (offs_n // 128) * kblocks + kb, mask=offs_n < N, other=0.0)
    offs_m = tl.arange(0, BLOCK_M)
    sx = tl.load(sx_ptr + offs_m * kblocks + kb, mask=offs_m < M, other=0.0)
    return sw, sx


@triton.jit
def step_scales(s_ptr, offs_n, N, K, kb, kb_end, sx_ptr, M, BLOCK_M: tl.constexpr,
                GROUPS: tl.constexpr):
    """``group_scales`` of the GROUPS groups from kb (clamped to kb_end - 1), a tuple."""
    out = ()
    for g in tl.static_range(GROUPS):
        out = out + (group_scales(s_ptr, offs_n, N, K, tl.minimum(kb + g, kb_end - 1), sx_ptr,
                                  M, BLOCK_M),)
    return out


@triton.jit
def group_tiles(xq_ptr, M, K, w_ptr, offs_n, N, kb, BLOCK_M: tl.constexpr):
    """(e4m3 W[offs_n], e4m3 x [BLOCK_M, 128], zero past M) of the 128-column group kb."""
    k = kb * 128 + tl.arange(0, 128)
    k_ok = k < K
    w = tl.load(w_ptr + offs_n[:, None] * K + k[None, :],
                mask=(offs_n < N)[:, None] & k_ok[None, :], other=0.0)
    offs_m = tl.arange(0, BLOCK_M)
    x = tl.load(xq_ptr + offs_m[:, None] * K + k[None, :],
                mask=(offs_m[:, None] < M) & k_ok[None, :], other=0.0)
    return w, x


@triton.jit
def _fp8_group_dot(xq_ptr, sx_ptr, M, K, w_ptr, s_ptr, offs_n, N, kb,
                   BLOCK_M: tl.constexpr, INTERPRET: tl.constexpr, SWAP: tl.constexpr = False):
    """fp32 [BLOCK_M, BLOCK_N]: the 128-column group kb of xq . W[offs_n]^T, both scales on
    (SWAP: its transpose, [BLOCK_N, BLOCK_M])."""
    w, sw = _group_weights(w_ptr, s_ptr, offs_n, N, K, kb)
    x, sx = group_x(xq_ptr, sx_ptr, M, K, kb, BLOCK_M)
    return _scaled_dot(x, sx, w, sw, INTERPRET, SWAP)


@triton.jit
def _normed_group_dot(x_ptr, rms, nw_ptr, M, K, w_ptr, s_ptr, offs_n, N, kb,
                      BLOCK_M: tl.constexpr, INTERPRET: tl.constexpr, SWAP: tl.constexpr = False):
    """``_fp8_group_dot`` with x made here from bf16 rows: RMS-normed (rms [BLOCK_M]), times
    the norm weight, rounded to bf16 and quantized per group as ``quant.store_row_groups``
    (the latent kernel's c_q, without its round trip through memory)."""
    w, sw = _group_weights(w_ptr, s_ptr, offs_n, N, K, kb)
    offs_m = tl.arange(0, BLOCK_M)
    k = kb * 128 + tl.arange(0, 128)
    k_ok = k < K
    x = tl.load(x_ptr + offs_m[:, None] * K + k[None, :],
                mask=(offs_m[:, None] < M) & k_ok[None, :], other=0.0).to(tl.float32)
    nw = tl.load(nw_ptr + k, mask=k_ok, other=0.0).to(tl.float32)
    c = ((x / rms[:, None]) * nw[None, :]).to(tl.bfloat16).to(tl.float32)
    sx = tl.maximum(tl.max(tl.abs(c), axis=1), 1e-10) / 448.0
    xq = to_e4m3(tl.clamp(c * (1.0 / sx)[:, None], -448.0, 448.0), INTERPRET)
    return _scaled_dot(xq, sx, w, sw, INTERPRET, SWAP)


@triton.jit
def row_rms(ss_ptr, stride, offs_m, m_ok, K, eps, SS_TILES: tl.constexpr):
    """sqrt(mean square + eps) of rows offs_m over their first K columns, from the per-tile
    sums of squares (``_row_tail``'s, [rows, stride]) of the SS_TILES tiles covering them,
    summed in tile order."""
    ss = tl.load(ss_ptr + offs_m * stride, mask=m_ok, other=0.0)
    for t in tl.static_range(1, SS_TILES):
        ss += tl.load(ss_ptr + offs_m * stride + t, mask=m_ok, other=0.0)
    return tl.sqrt(ss / K + eps)


@triton.jit
def _row_tail(part_ptr, SPLIT: tl.constexpr, M, N, tile, rows_ptr, ss_ptr, TILES,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, SUMSQ: tl.constexpr = True):
    """The tile's columns summed over the SPLIT partials in order and rounded to bf16 (as a
    consumer's ``sum_parts`` would), stored as rows [M, N], with (SUMSQ) each row's sum of
    squares of those bf16 values at ss [M, TILES][:, tile]."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    ok = m_ok[:, None] & (offs_n[None, :] < N)
    v = sum_parts(part_ptr, SPLIT, M * N, offs_m[:, None] * N + offs_n[None, :], ok)
    v = v.to(tl.bfloat16)
    tl.store(rows_ptr + offs_m[:, None] * N + offs_n[None, :], v, mask=ok)
    if SUMSQ:
        vf = v.to(tl.float32)
        tl.store(ss_ptr + offs_m * TILES + tile, tl.sum(vf * vf, axis=1), mask=m_ok)


@triton.jit
def _scaled_row(xq_ptr, sx_ptr, M, K, s_ptr, n_block, k, k_ok, r):
    """Row r of xq at columns k as fp32, times its group scales and the weight's (scale row
    n_block): zero where not k_ok or r >= M."""
    kblocks = tl.cdiv(K, 128)
    ok = k_ok & (r < M)
    x = tl.load(xq_ptr + r * K + k, mask=ok, other=0.0).to(tl.float32)
    sx = tl.load(sx_ptr + r * kblocks + k // 128, mask=ok, other=0.0)
    sw = tl.load(s_ptr + n_block * kblocks + k // 128, mask=ok, other=0.0)
    return x * (sx * sw)


@triton.jit
def _gemv_step(acc, w, xq_ptr, sx_ptr, M, K, s_ptr, n_block, k, k_ok, BLOCK_M: tl.constexpr):
    """acc [BLOCK_M, BLOCK_N] plus, for each row, its scaled columns k . w^T, for an e4m3 tile
    w [BLOCK_N, len(k)] inside one 128-row scale block (n_block): the tensor cores' work done
    as fp32 multiply-and-sum in w's own register layout, so nothing is staged in shared memory
    and a program holds few registers."""
    wf = w.to(tl.float32)
    rows = tl.arange(0, BLOCK_M)
    for r in tl.static_range(BLOCK_M):
        xs = _scaled_row(xq_ptr, sx_ptr, M, K, s_ptr, n_block, k, k_ok, r)
        acc += tl.where(rows[:, None] == r, tl.sum(wf * xs[None, :], axis=1)[None, :], 0.0)
    return acc


@triton.jit
def _tile(xq_ptr, sx_ptr, M, K, w_ptr, s_ptr, part_ptr, N, tile, split, k_chunk,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
          INTERPRET: tl.constexpr, GEMV: tl.constexpr, XNORM: tl.constexpr, nw_ptr, eps,
          SS_TILES: tl.constexpr, SWAP: tl.constexpr, SCALES: tl.constexpr = True,
          FIXED: tl.constexpr = False):
    """With XNORM, x is bf16 rows at xq_ptr, RMS-normed here (``_normed_group_dot``) with
    their per-tile sums of squares at sx_ptr [M, SS_TILES] and the norm weight at nw_ptr.
    With SWAP the MMAs run transposed (``swap``) and the tile is transposed once at the end.
    FIXED: the K chunk is added into int64 sums [M, N] at part_ptr in 2^-FIXED_BITS units
    (``add_fixed``) instead of stored as partial `split`."""
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    kb0 = split * k_chunk
    kb_end = tl.minimum(kb0 + k_chunk, tl.cdiv(K, 128))
    if GEMV:  # a step's GROUPS groups as one load, in flight together
        n_ok = offs_n < N
        k_end = tl.minimum(kb_end * 128, K)
        for kb in range(kb0, kb_end, GROUPS):
            k = kb * 128 + tl.arange(0, GROUPS * 128)
            k_ok = k < k_end
            w = tl.load(w_ptr + offs_n[:, None] * K + k[None, :],
                        mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            acc = _gemv_step(acc, w, xq_ptr, sx_ptr, M, K, s_ptr, tile * BLOCK_N // 128, k, k_ok,
                             BLOCK_M)
    elif XNORM:
        offs_m = tl.arange(0, BLOCK_M)
        rms = row_rms(sx_ptr, SS_TILES, offs_m, offs_m < M, K, eps, SS_TILES)
        for kb in range(kb0, kb_end, GROUPS):
            for g in tl.static_range(GROUPS):
                acc += _normed_group_dot(xq_ptr, rms, nw_ptr, M, K, w_ptr, s_ptr, offs_n, N,
                                         tl.minimum(kb + g, kb_end - 1), BLOCK_M, INTERPRET,
                                         SWAP) * (kb + g < kb_end)
    elif SCALES:  # each group's scales loaded an iteration ahead (SCALES_AHEAD)
        sc = step_scales(s_ptr, offs_n, N, K, kb0, kb_end, sx_ptr, M, BLOCK_M, GROUPS)
        for kb in range(kb0, kb_end, GROUPS):
            nxt = step_scales(s_ptr, offs_n, N, K, kb + GROUPS, kb_end, sx_ptr, M, BLOCK_M,
                              GROUPS)
            for g in tl.static_range(GROUPS):
                w, x = group_tiles(xq_ptr, M, K, w_ptr, offs_n, N,
                                   tl.minimum(kb + g, kb_end - 1), BLOCK_M)
                acc += _scaled_dot(x, sc[g][1], w, sc[g][0], INTERPRET, SWAP) * (kb + g < kb_end)
            sc = nxt
    else:
        for kb in range(kb0, kb_end, GROUPS):
            for g in tl.static_range(GROUPS):
                acc += _fp8_group_dot(xq_ptr, sx_ptr, M, K, w_ptr, s_ptr, offs_n, N,
                                      tl.minimum(kb + g, kb_end - 1), BLOCK_M, INTERPRET, SWAP) \
                    * (kb + g < kb_end)
    if SWAP:
        acc = tl.trans(acc)
    offs_m = tl.arange(0, BLOCK_M)
    ok = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if FIXED:
        add_fixed(part_ptr + offs_m[:, None] * N + offs_n[None, :], acc, ok)
    else:
        tl.store(part_ptr + (split * M + offs_m[:, None]) * N + offs_n[None, :], acc, mask=ok)


@triton.jit
def _fp8_linear_prefetch(pid, split, K, k_chunk, wa_ptr, NA, tiles_a, wb_ptr, NB,
                         BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    """Prefetch program (pid, split)'s weight tile into L2 (see overlap)."""
    k0 = split * k_chunk * 128
    cols = tl.minimum(k_chunk * 128, K - k0)
    if pid < tiles_a:
        prefetch_rows(wa_ptr, pid * BLOCK_N, BLOCK_N, NA, K, k0, cols, PDL, BLOCK_N, 2)
    else:
        prefetch_rows(wb_ptr, (pid - tiles_a) * BLOCK_N, BLOCK_N, NB, K, k0, cols, PDL,
                      BLOCK_N, 2)


@triton.jit
def _fp8_linear_task(pid, split, xq_ptr, sx_ptr, M, K, k_chunk,
                     wa_ptr, sa_ptr, pa_ptr, NA, tiles_a, wb_ptr, sb_ptr, pb_ptr, NB,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
                     INTERPRET: tl.constexpr, GEMV: tl.constexpr, XNORM: tl.constexpr = False,
                     nw_ptr=None, eps=0.0, SS_TILES: tl.constexpr = 1, SWAP: tl.constexpr = False,
                     SCALES: tl.constexpr = True, FIXED: tl.constexpr = False):
    """Program (pid, split): one BLOCK_N tile of W_a (pid < tiles_a) or W_b, one K chunk
    (XNORM: x made from normed bf16 rows, ``_tile``). One ``_tile`` for both matrices, so
    the program holds one set of pipeline buffers."""
    on_a = pid < tiles_a
    tile = tl.where(on_a, pid, pid - tiles_a)
    _tile(xq_ptr, sx_ptr, M, K, tl.where(on_a, wa_ptr, wb_ptr), tl.where(on_a, sa_ptr, sb_ptr),
          tl.where(on_a, pa_ptr, pb_ptr), tl.where(on_a, NA, NB), tile, split, k_chunk,
          BLOCK_M, BLOCK_N, GROUPS, INTERPRET, GEMV, XNORM, nw_ptr, eps, SS_TILES, SWAP, SCALES,
          FIXED)


@triton.jit
def _fp8_linear_kernel(xq_ptr, sx_ptr, M, K, k_chunk,
                       wa_ptr, sa_ptr, pa_ptr, NA, tiles_a,
                       wb_ptr, sb_ptr, pb_ptr, NB,
                       arrivals_ptr, rows_a_ptr, ss_a_ptr, rows_b_ptr, ss_b_ptr, tail_tiles,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
                       INTERPRET: tl.constexpr, PDL: tl.constexpr, GEMV: tl.constexpr,
                       TAILS: tl.constexpr, SPLIT: tl.constexpr, SUMSQ: tl.constexpr,
                       SWAP: tl.constexpr, SCALES: tl.constexpr, PREFETCH: tl.constexpr,
                       FIXED: tl.constexpr = False):
    pid = tl.program_id(0)
    split = tl.program_id(1)
    _fp8_linear_prefetch(pid, split, K, k_chunk, wa_ptr, NA, tiles_a, wb_ptr, NB, BLOCK_N,
                         PDL and PREFETCH)
    stage_begin(PDL)
    _fp8_linear_task(pid, split, xq_ptr, sx_ptr, M, K, k_chunk, wa_ptr, sa_ptr, pa_ptr, NA,
                     tiles_a, wb_ptr, sb_ptr, pb_ptr, NB, BLOCK_M, BLOCK_N, GROUPS, INTERPRET,
                     GEMV, SWAP=SWAP, SCALES=SCALES, FIXED=FIXED)
    # the tile's last K chunk to finish sums the tile (``_row_tail``); tiles from tail_tiles
    # on (W_b's, when only W_a has rows) have none
    if TAILS and pid < tail_tiles:
        if arrive_last(arrivals_ptr + pid, SPLIT):
            tiles_b = tl.num_programs(0) - tiles_a
            if pid < tiles_a:
                _row_tail(pa_ptr, SPLIT, M, NA, pid, rows_a_ptr, ss_a_ptr, tiles_a, BLOCK_M,
                          BLOCK_N, SUMSQ)
            else:
                _row_tail(pb_ptr, SPLIT, M, NB, pid - tiles_a, rows_b_ptr, ss_b_ptr, tiles_b,
                          BLOCK_M, BLOCK_N, SUMSQ)


def swap(block_n: int, gemv: bool = False, enabled: Optional[bool] = None) -> bool:
    """Whether a program's MMAs run transposed, W_tile . x^T: the weight tile becomes the MMA's
    M side, which Hopper's asynchronous MMA (wgmma, 64 rows a warp group) reads straight from
    shared memory, and the rows its N side (16); untransposed, 16 rows force the synchronous
    MMA, whose weight operand goes through registers. Needs a tile of 64 columns or more.
    enabled: the caller's switch (default SWAP, the linears')."""
    return (SWAP if enabled is None else enabled) and not gemv and block_n % 64 == 0


def interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


def block_m(m: int, gemv: bool = False) -> int:
    """Rows a program's tiles hold: the MMA's 16 at least, or without the tensor cores
    (gemv) the rows padded to a power of two."""
    if not 1 <= m <= 64:
        raise ValueError(f"small-M kernels take 1..64 rows, got {m}")
    return triton.next_power_of_2(m) if gemv else max(16, triton.next_power_of_2(m))


def choose_split(n: int, k: int, block_n: int = 64, groups: int = 2,
                 target_programs: int = TARGET_PROGRAMS, one_wave: bool = False) -> int:
    """K chunks for an [n, k] matrix: enough programs to fill the GPU twice (with one_wave:
    as many as fit in target_programs), each with at least one full iteration of `groups`
    128-column groups."""
    tiles = triton.cdiv(n, block_n)
    most = max(1, triton.cdiv(k, 128) // groups)
    fit = target_programs // tiles if one_wave else triton.cdiv(target_programs, tiles)
    return max(1, min(most, fit))


def tiling(n: int, k: int) -> tuple:
    """(block_n, groups, split) for an [n, k] matrix in the fused layer: as many K chunks as
    fit one wave (ONE_WAVE).

    On an H200 (results/gemv_probe_h200_f1d7a26.json) o_proj and q_b alone run ~25% faster
    with one group per step over ~528 programs (split 6), but their consumers (the add+RMSNorm
    and the absorb, which sum the split partials) then lose more than that in the layer
    (decode_layer_20261130T112756Z): two groups over ~264 programs (split 3) is kept. With the
    MMAs transposed (``swap``), tiles of 128 columns were 1.3-6.7 us slower a layer at 1-16
    rows with 2 groups a step, and up to 7.9 with 1 (tiling_probe_20261201T174706Z). With the
    scales loaded ahead (SCALES_AHEAD), 1 group a step at this split is mixed: a MoE layer
    2.8 us faster at 8 rows, 1.3 / 0.9 slower at 12 / 16, a dense one 1.5-2.8 slower at 2,
    12 and 16 rows (tiling_probe_20261202T062521Z: linear_groups_1). K chunks of
    q_a|kv_a (2624 x 6144, 6 chunks) in 3 or 4: +0.4..+1.1 us a layer at one row, mixed
    from 4 rows (-1.3..+1.5; tiling_probe_20261203T224026Z: qkv_a_split_*)."""
    return 64, 2, choose_split(n, k, 64, 2, TARGET_PROGRAMS, ONE_WAVE)


def grid_shape(n_a: int, n_b: int, k: int, split: int, block_n: int, groups: int) -> tuple:
    """(tiles of W_a, tiles of W_a and W_b, 128-column groups per K chunk) of a launch."""
    tiles_a = triton.cdiv(n_a, block_n)
    k_chunk = triton.cdiv(triton.cdiv(triton.cdiv(k, 128), split), groups) * groups
    return tiles_a, tiles_a + triton.cdiv(n_b, block_n), k_chunk


def fp8_linear(xq: torch.Tensor, sx: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor,
               parts: torch.Tensor, wq_b: Optional[torch.Tensor] = None,
               ws_b: Optional[torch.Tensor] = None, parts_b: Optional[torch.Tensor] = None,
               block_n: int = 64, groups: int = 2, pdl: bool = True, tails=None,
               sums: Optional[torch.Tensor] = None) -> None:
    """parts[s] = the K chunk s of xq W^T, fp32 [SPLIT, M, N] (and parts_b for W_b in the same
    launch, with the same SPLIT). xq e4m3 [M, K] contiguous, sx fp32 [M, ceil(K/128)],
    wq e4m3 [N, K] contiguous, ws fp32 [ceil(N/128), ceil(K/128)].

    tails = (arrivals, rows_a, ss_a, rows_b, ss_b): the last K chunk of each column tile to
    finish also sums the tile's partials into bf16 rows [M, N] and their per-tile sums of
    squares ss [M, tiles] (for ``mla.q_b_normed``); arrivals int32 [tiles], left at zero.
    ss_a and ss_b None: rows only; rows_b None: W_a's tiles only (mla.ABSORB_Q_ROWS_FROM).

    sums: int64 [M, N], zero before the launch: each K chunk is added into it in
    2^-FIXED_BITS units (``add_fixed``; no W_b, no tails) and parts (its SPLIT) is not
    written; the consumer reads it with ``quant.load_fixed`` and zeroes it for the next
    use."""
    m, k = xq.shape
    split = parts.shape[0]
    assert xq.is_contiguous() and sx.is_contiguous() and wq.is_contiguous() and ws.is_contiguous()
    assert wq.shape[1] == k and parts.shape[1:] == (m, wq.shape[0]) and parts.is_contiguous()
    gemv = m <= GEMV_MAX_ROWS
    if gemv:
        block_n, groups = GEMV_BLOCK_N, GEMV_GROUPS
    assert 128 % block_n == 0
    if wq_b is not None:
        assert wq_b.shape[1] == k and parts_b.shape == (split, m, wq_b.shape[0])
    tiles_a, tiles, k_chunk = grid_shape(wq.shape[0], wq_b.shape[0] if wq_b is not None else 0,
                                         k, split, block_n, groups)
    tail_tiles, sumsq = 0, False
    if tails is not None:
        arrivals, rows_a, ss_a, rows_b, ss_b = tails
        sumsq = ss_a is not None
        tail_tiles = tiles if rows_b is not None else tiles_a
        assert arrivals.dtype == torch.int32 and arrivals.numel() >= tail_tiles
        assert rows_a.shape == (m, wq.shape[0]) and rows_a.is_contiguous()
        if sumsq:
            assert ss_a.shape == (m, tiles_a) and ss_a.is_contiguous()
        if rows_b is not None:
            assert wq_b is not None and rows_b.shape == (m, wq_b.shape[0])
            assert rows_b.is_contiguous() and (ss_b is not None) == sumsq
            if sumsq:
                assert ss_b.shape == (m, tiles - tiles_a) and ss_b.is_contiguous()
        # placeholders for the pointers the kernel then does not touch
        ss_a = ss_a if sumsq else rows_a
        rows_b = rows_a if rows_b is None else rows_b
        ss_b = ss_b if ss_b is not None else ss_a
    else:
        arrivals = rows_a = ss_a = rows_b = ss_b = parts
    if sums is not None:
        assert wq_b is None and tails is None, "sums: one matrix, no tails"
        assert sums.dtype == torch.int64 and sums.shape == (m, wq.shape[0])
        assert sums.is_contiguous()
    out_a = sums if sums is not None else parts
    if wq_b is None:
        wq_b, ws_b, parts_b = wq, ws, out_a
    use_pdl = pdl and overlap.enabled()
    launch = overlap.launch_kw() if use_pdl else {}
    _fp8_linear_kernel[(tiles, split)](
        xq, sx, m, k, k_chunk,
        wq, ws, out_a, wq.shape[0], tiles_a,
        wq_b, ws_b, parts_b, wq_b.shape[0], arrivals, rows_a, ss_a, rows_b, ss_b, tail_tiles,
        BLOCK_M=block_m(m, gemv), BLOCK_N=block_n, GROUPS=groups, INTERPRET=interpreting(),
        PDL=use_pdl, GEMV=gemv, TAILS=tails is not None, SPLIT=split if tails is not None else 1,
        SUMSQ=sumsq, SWAP=swap(block_n, gemv), SCALES=SCALES_AHEAD,
        PREFETCH=overlap.prefetches("fp8_linear"), FIXED=sums is not None, num_warps=NUM_WARPS,
        num_stages=3, **launch,
    )

