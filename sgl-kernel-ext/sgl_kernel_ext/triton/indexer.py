"""The DSA indexer of a GLM-5.3 'full' layer for 1-16 rows (no Hadamard: interleaved rope).

- ``prepare``: per row, the index key (sum of the split-K [wk; weights_proj] partials, bf16,
  LayerNorm in fp32, rope on the first dims, e4m3 with one scale) written into the FP8 index
  cache at the row's slot (64-token pages: 64 x 128 B keys, then 64 fp32 scales); the query
  heads roped and quantized (one scale per head), and the fp32 head weights
  w_raw * heads^-1/2 * dim^-1/2 * scale_q. Programs (row, block of query heads).
- ``scores``: for every position of each row's context, sum over heads of
  w[h] * ReLU(q8[h] . k8[s]) * scale_k[s] (e4m3 dots, fp32 sums); -inf past the context.
  Optionally also the split top-k's first pass: each 2048-score chunk's histogram of the
  scores' first radix digit, added up by atomics (``topk.SCORES_HISTOGRAM``).

The exact top-k over the scores is left to the caller (``topk_positions``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import overlap
from .fp8_linear import interpreting
from .overlap import stage_begin
from .mla import _rope_pairs, slot_args, slot_row
from .quant import sum_parts, to_e4m3
from .topk import SPLIT_CHUNK, _keys, capped_grid, split_chunks

PAGE = 64
KEY_BYTES = 128
SCORE_BLOCK = 64  # context positions per scores program of the stage kernels
SCORE_WARPS = 4
# whether a scores program multiplies keys x q^T rather than q x keys^T: 64 positions are
# then the MMA's M, which Hopper's FP8 wgmma takes (4 QGMMA instructions a warp, no e4m3 ->
# f16 unpacking: 336 sm_90a instructions a warp instead of 528, 58 registers instead of 62).
# Not bitwise the same scores (the tensor cores' FP8 accumulation; within 1e-3 of the sum of
# magnitudes, test_swapped_index_scores_match_reference). On an H200 at a 32K context an
# indexer layer is 5.7 us faster at 16 rows, within noise at 1 and 4 (+0.6, +0.3 us;
# tiling_probe_20261202T020550Z: scores_swap). The persistent layer kernel's task does not.
SCORE_SWAP = True
# whether the layer skips scoring rows whose context the top-k takes whole (scores'
# skip_within = index_topk); off: every row scored. On an H200 at 2K contexts a layer with
# the indexer is 2.9-3.1 us faster at 16 rows, within -0.6..+0.7 at 1-8
# (tiling_probe_20261202T035506Z: scores_every_row)
SCORE_SKIP_SHORT_ROWS = True
# scores programs a row: a program a block of SCORE_BLOCK positions up to
# score_row_programs(m); wider rows (a server's slot table spans its longest context, 1M
# positions for GLM-5.3's default) take that many, each looping over every so-many-th block
# up to the row's context. Past a row's context a program exits, but each still costs its
# launch. On an H200 (tiling_probe_20261202T022242Z, T022254Z, T022305Z: an indexer layer,
# 8K contexts in a 1M-wide table, 32K and 128K ones in tables as wide): at 4 rows 1024 a row
# instead of 2048 is 4.8 us faster at 8K, the same at 32K and 3.3 us slower at 128K; at 16
# rows 256 instead of 512 is 1.3 us faster at 8K, 2.7 and 5.1 us slower at 32K and 128K.
SCORE_MAX_ROW_PROGRAMS = 2048
SCORE_MIN_ROW_PROGRAMS = 512
SCORE_MAX_PROGRAMS = 4096  # over all rows, between the two bounds a row


def score_row_programs(m: int) -> int:
    """Scores programs a row at most (about: ``topk.capped_grid``), for m rows."""
    return min(SCORE_MAX_ROW_PROGRAMS, max(SCORE_MIN_ROW_PROGRAMS, SCORE_MAX_PROGRAMS // m))


def score_programs(m: int, width: int, block_l: int = 0) -> int:
    """Scores programs a row over m rows `width` wide, block_l positions a block (default
    SCORE_BLOCK): a program a block, or fewer looping over the blocks."""
    return capped_grid(triton.cdiv(width, block_l or SCORE_BLOCK), score_row_programs(m))


# registers of a scores program that also counts the first digits (first_hist): ptxas for
# sm_90a gives it 72 uncapped, so 7 programs a multiprocessor instead of the plain form's 8
# (62 registers); capped at 64 it does not spill (Triton 3.6 and 3.8). The count is one
# global atomic a position, 32 sm_90a instructions a warp (tl.histogram's 256 bins: ~340).
# Its looping form (wide tables) is not capped: it would spill.
SCORE_HIST_MAXNREG = 64
# registers of the plain looping form (wide tables): 72 uncapped (7 programs a
# multiprocessor), 64 without spilling (Triton 3.6 and 3.8); on an H200 the cap makes an
# indexer layer 2.6-3.8 us faster at 8-16 rows of 32K in a 1M-wide table, within noise at
# 1-4 rows and at 8K (tiling_probe_20261202T022855Z, T022833Z: scores_loop_regs_255)
SCORE_LOOP_MAXNREG = 64
# On an H200 at a 32K context an indexer layer is slower with 128 or 256 positions a program
# (+0.5..+6.2 us at 1-16 rows; tiling_probe_20261201T230428Z: score_block_*), and with about
# 132-528 programs looping over their row's blocks, pipelined in 2-3 stages (+7..+74 us at 16
# rows, within noise at one; T231021Z, code at d95aaa9): the launch wants many programs.
# query heads per prepare program (a power of two; the first program of a row also writes
# its key). One program per row for all 32 heads reads every wq_b partial alone: ~10 us at
# any row count on an H200 (results/fused_stages_h200_3bcefaf.json, _prepare_kernel). 4 heads
# a program saves 6-7 us per indexer layer at 1-16 rows; 2 and 8 are within 1 us of it
# (results/tiling_probe_20261130T173431Z).
PREPARE_HEADS = 4
# whether prepare's programs load what is not the previous kernels' output before their wait
# (the row's position and cache slot, the key norm's weight and bias, rope's frequencies),
# rather than after the reductions that first use them (the slot's load, after the key's
# math, a round trip of its own). On an H100 -0.2..-0.8 us a layer with the indexer at 1-16
# rows in two probes (tiling_probe_20261207T132839Z, T133255Z)
PREPARE_EARLY = overlap.weights_early(True)


@triton.jit
def _prepare_row(m, kw_parts_ptr, SPLIT: tl.constexpr, M, NKW, q_ptr, Q_SPLIT: tl.constexpr,
                 ln_w_ptr, ln_b_ptr, ln_eps, pos_ptr, slots_ptr, stride_slots, slot_rows_ptr,
                 inv_freq_ptr, cache_ptr, q8_ptr, head_w_ptr, head_scale, NH: tl.constexpr,
                 D: tl.constexpr, HALF_R: tl.constexpr, INTERPRET: tl.constexpr, hb=0,
                 HB: tl.constexpr = 0, ROWS: tl.constexpr = False, pre=None):
    """Row m's index key (by head block 0) and its query heads [hb * HB, (hb + 1) * HB), or
    every head with HB = 0. Each head's numbers are its own, so any split gives the same
    bits. slots_ptr, stride_slots, slot_rows_ptr, ROWS: ``mla.slot_row``'s. pre: what
    ``_prepare_inputs`` loaded (before the wait), else loaded here."""
    if pre is None:
        pos = tl.load(pos_ptr + m)
    else:
        pos = pre[0]
    rpos = tl.maximum(pos, 0)
    row = m * NKW
    if hb == 0:
        # the key as its even and odd dims, so rope pairs (2i, 2i+1) are elementwise
        i = tl.arange(0, D // 2)
        ke = sum_parts(kw_parts_ptr, SPLIT, M * NKW, row + 2 * i, i < D // 2)
        ko = sum_parts(kw_parts_ptr, SPLIT, M * NKW, row + 2 * i + 1, i < D // 2)
        ke = ke.to(tl.bfloat16).to(tl.float32)
        ko = ko.to(tl.bfloat16).to(tl.float32)
        mean = (tl.sum(ke, axis=0) + tl.sum(ko, axis=0)) / D
        ke -= mean
        ko -= mean
        rstd = 1.0 / tl.sqrt((tl.sum(ke * ke, axis=0) + tl.sum(ko * ko, axis=0)) / D + ln_eps)
        if pre is None:
            ke = ke * rstd * tl.load(ln_w_ptr + 2 * i).to(tl.float32) \
                + tl.load(ln_b_ptr + 2 * i).to(tl.float32)
            ko = ko * rstd * tl.load(ln_w_ptr + 2 * i + 1).to(tl.float32) \
                + tl.load(ln_b_ptr + 2 * i + 1).to(tl.float32)
            re, ro = _rope_pairs(ke, ko, rpos,
                                 tl.load(inv_freq_ptr + i, mask=i < HALF_R, other=0.0))
        else:
            ke = ke * rstd * pre[2] + pre[4]
            ko = ko * rstd * pre[3] + pre[5]
            re, ro = _rope_pairs(ke, ko, rpos, pre[6])
        ke = tl.where(i < HALF_R, re, ke)
        ko = tl.where(i < HALF_R, ro, ko)
        sk = tl.maximum(tl.maximum(tl.max(tl.abs(ke), axis=0), tl.max(tl.abs(ko), axis=0)),
                        1e-4) / 448.0
        ke8 = to_e4m3(tl.clamp(ke * (1.0 / sk), -448.0, 448.0), INTERPRET)
        ko8 = to_e4m3(tl.clamp(ko * (1.0 / sk), -448.0, 448.0), INTERPRET)
        if pos >= 0:
            if pre is None:
                slot = tl.load(slot_row(slots_ptr, stride_slots, slot_rows_ptr, m, ROWS) + pos)
            else:
                slot = pre[1]
            page = cache_ptr + (slot // 64) * (64 * 132)
            key = page + (slot % 64) * 128
            tl.store(key + 2 * i, ke8.to(tl.uint8, bitcast=True))
            tl.store(key + 2 * i + 1, ko8.to(tl.uint8, bitcast=True))
            tl.store((page + 64 * 128).to(tl.pointer_type(tl.float32)) + slot % 64, sk)
    # query heads: rope the first dims of each head, one e4m3 scale per head
    if HB == 0:
        oh = tl.arange(0, NH)
    else:
        oh = hb * HB + tl.arange(0, HB)
    w_raw = sum_parts(kw_parts_ptr, SPLIT, M * NKW, row + D + oh, oh < NH)
    w_raw = w_raw.to(tl.bfloat16).to(tl.float32)
    ih = tl.arange(0, HALF_R)
    qrow = (m * NH + oh[:, None]) * D
    stride_q = M * NH * D
    x1 = sum_parts(q_ptr, Q_SPLIT, stride_q, qrow + 2 * ih[None, :], ih[None, :] < HALF_R)
    x2 = sum_parts(q_ptr, Q_SPLIT, stride_q, qrow + 2 * ih[None, :] + 1, ih[None, :] < HALF_R)
    x1 = x1.to(tl.bfloat16).to(tl.float32)
    x2 = x2.to(tl.bfloat16).to(tl.float32)
    if pre is None:
        r1, r2 = _rope_pairs(x1, x2, rpos, tl.load(inv_freq_ptr + ih)[None, :])
    else:
        r1, r2 = _rope_pairs(x1, x2, rpos, pre[7][None, :])
    rest_d = tl.arange(0, D)
    q_all = sum_parts(q_ptr, Q_SPLIT, stride_q, qrow + rest_d[None, :], rest_d[None, :] < D)
    q_all = q_all.to(tl.bfloat16).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(r1), axis=1), tl.max(tl.abs(r2), axis=1))
    amax = tl.maximum(amax, tl.max(tl.where(rest_d[None, :] >= 2 * HALF_R, tl.abs(q_all), 0.0),
                                   axis=1))
    sq = tl.maximum(amax, 1e-4) / 448.0
    inv = (1.0 / sq)[:, None]
    out = q8_ptr + (m * NH + oh[:, None]) * D
    tl.store(out + 2 * ih[None, :], to_e4m3(tl.clamp(r1 * inv, -448.0, 448.0), INTERPRET))
    tl.store(out + 2 * ih[None, :] + 1, to_e4m3(tl.clamp(r2 * inv, -448.0, 448.0), INTERPRET))
    tl.store(out + rest_d[None, :], to_e4m3(tl.clamp(q_all * inv, -448.0, 448.0), INTERPRET),
             mask=rest_d[None, :] >= 2 * HALF_R)
    tl.store(head_w_ptr + m * NH + oh, w_raw * head_scale * sq)


@triton.jit
def _prepare_inputs(m, pos_ptr, slots_ptr, stride_slots, slot_rows_ptr, ln_w_ptr, ln_b_ptr,
                    inv_freq_ptr, D: tl.constexpr, HALF_R: tl.constexpr, ROWS: tl.constexpr):
    """Row m's (position, cache slot, the key norm's weight and bias at even and odd dims,
    rope's frequencies a key pair and a query pair): none of it is written by the kernels
    before prepare."""
    pos = tl.load(pos_ptr + m)
    at = slot_row(slots_ptr, stride_slots, slot_rows_ptr, m, ROWS) + tl.maximum(pos, 0)
    slot = tl.load(at, mask=pos >= 0, other=0)
    i = tl.arange(0, D // 2)
    ih = tl.arange(0, HALF_R)
    return (pos, slot, tl.load(ln_w_ptr + 2 * i).to(tl.float32),
            tl.load(ln_w_ptr + 2 * i + 1).to(tl.float32), tl.load(ln_b_ptr + 2 * i).to(tl.float32),
            tl.load(ln_b_ptr + 2 * i + 1).to(tl.float32),
            tl.load(inv_freq_ptr + i, mask=i < HALF_R, other=0.0), tl.load(inv_freq_ptr + ih))


@triton.jit
def _prepare_kernel(kw_parts_ptr, SPLIT: tl.constexpr, M, NKW, q_ptr, Q_SPLIT: tl.constexpr,
                    ln_w_ptr, ln_b_ptr, ln_eps,
                    pos_ptr, slots_ptr, stride_slots, slot_rows_ptr, inv_freq_ptr, cache_ptr,
                    q8_ptr, head_w_ptr, head_scale,
                    NH: tl.constexpr, D: tl.constexpr, HALF_R: tl.constexpr,
                    INTERPRET: tl.constexpr, PDL: tl.constexpr, HB: tl.constexpr,
                    ROWS: tl.constexpr, EARLY: tl.constexpr = False):
    """EARLY: ``_prepare_inputs`` before the wait (PREPARE_EARLY)."""
    pre = None
    if EARLY:
        pre = _prepare_inputs(tl.program_id(0), pos_ptr, slots_ptr, stride_slots, slot_rows_ptr,
                              ln_w_ptr, ln_b_ptr, inv_freq_ptr, D, HALF_R, ROWS)
    stage_begin(PDL)
    _prepare_row(tl.program_id(0), kw_parts_ptr, SPLIT, M, NKW, q_ptr, Q_SPLIT, ln_w_ptr,
                 ln_b_ptr, ln_eps, pos_ptr, slots_ptr, stride_slots, slot_rows_ptr, inv_freq_ptr,
                 cache_ptr, q8_ptr, head_w_ptr, head_scale, NH, D, HALF_R, INTERPRET,
                 tl.program_id(1), HB, ROWS, pre)


@triton.jit
def _scores_task(m, lt, q8_ptr, head_w_ptr, cache_ptr, pos_ptr, row_slots,
                 scores_ptr, stride_scores, L, NH: tl.constexpr, D: tl.constexpr,
                 BLOCK_H: tl.constexpr, BLOCK_L: tl.constexpr, INTERPRET: tl.constexpr,
                 hist_ptr=None, P=0, HIST_CHUNK: tl.constexpr = 0, SWAP: tl.constexpr = False,
                 skip_within=0):
    """Scores of row m's positions [lt * BLOCK_L, (lt + 1) * BLOCK_L), if its context reaches
    them and is longer than skip_within; with HIST_CHUNK, their first key digits also counted
    into the histogram of their HIST_CHUNK-score chunk at hist_ptr [M, P, 256] (the split
    top-k's first pass). row_slots: the row's slot table (``mla.slot_row``)."""
    seq = tl.load(pos_ptr + m) + 1
    if (lt * BLOCK_L < seq) & (seq > skip_within):
        _scores_block(m, lt, seq, q8_ptr, head_w_ptr, cache_ptr, row_slots,
                      scores_ptr, stride_scores, L, NH, D, BLOCK_H, BLOCK_L, INTERPRET, hist_ptr,
                      P, HIST_CHUNK, SWAP)


@triton.jit
def _scores_block(m, lt, seq, q8_ptr, head_w_ptr, cache_ptr, row_slots,
                  scores_ptr, stride_scores, L, NH: tl.constexpr, D: tl.constexpr,
                  BLOCK_H: tl.constexpr, BLOCK_L: tl.constexpr, INTERPRET: tl.constexpr,
                  hist_ptr, P, HIST_CHUNK: tl.constexpr, SWAP: tl.constexpr):
    ol = lt * BLOCK_L + tl.arange(0, BLOCK_L)
    od = tl.arange(0, D)
    oh = tl.arange(0, BLOCK_H)  # heads padded to the 16-row MMA minimum
    h_ok = oh < NH
    in_ctx = ol < seq
    slot = tl.load(row_slots + ol, mask=in_ctx, other=0)
    page = cache_ptr + (slot // 64) * (64 * 132)
    keys = tl.load(page[:, None] + (slot % 64)[:, None] * 128 + od[None, :],
                   mask=in_ctx[:, None], other=0).to(tl.float8e4nv, bitcast=True)
    sk = tl.load((page + 64 * 128).to(tl.pointer_type(tl.float32)) + slot % 64,
                 mask=in_ctx, other=0.0)
    q = tl.load(q8_ptr + (m * NH + oh[:, None]) * D + od[None, :], mask=h_ok[:, None], other=0.0)
    if INTERPRET:
        keys = keys.to(tl.float32)
        q = q.to(tl.float32)
    if SWAP:  # [positions, heads]: the keys are the MMA's A operand, so sm_90 takes FP8 wgmma
        dots = tl.dot(keys, tl.trans(q))
    else:
        dots = tl.dot(q, tl.trans(keys))
    hw = tl.load(head_w_ptr + m * NH + oh, mask=h_ok, other=0.0)
    if SWAP:
        s = tl.sum(tl.maximum(dots, 0.0) * hw[None, :], axis=1) * sk
    else:
        s = tl.sum(tl.maximum(dots, 0.0) * hw[:, None], axis=0) * sk
    tl.store(scores_ptr + m * stride_scores + ol, tl.where(in_ctx, s, float("-inf")), mask=ol < L)
    if HIST_CHUNK:
        row_hist = hist_ptr + (m * P + lt * BLOCK_L // HIST_CHUNK) * 256
        tl.atomic_add(row_hist + (_keys(s) >> 24), 1, mask=in_ctx, sem="relaxed")


@triton.jit
def _scores_kernel(q8_ptr, head_w_ptr, cache_ptr, pos_ptr, slots_ptr, stride_slots, slot_rows_ptr,
                   scores_ptr, stride_scores, L, hist_ptr, P, skip_within,
                   NH: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr,
                   BLOCK_L: tl.constexpr, INTERPRET: tl.constexpr, PDL: tl.constexpr,
                   HIST_CHUNK: tl.constexpr, SWAP: tl.constexpr, LOOP: tl.constexpr,
                   ROWS: tl.constexpr):
    stage_begin(PDL)
    m = tl.program_id(0)
    row_slots = slot_row(slots_ptr, stride_slots, slot_rows_ptr, m, ROWS)
    if LOOP:  # fewer programs than blocks: each takes every num_programs-th up to the context
        for lt in range(tl.program_id(1), tl.cdiv(tl.load(pos_ptr + m) + 1, BLOCK_L),
                        tl.num_programs(1)):
            _scores_task(m, lt, q8_ptr, head_w_ptr, cache_ptr, pos_ptr, row_slots,
                         scores_ptr, stride_scores, L, NH, D, BLOCK_H, BLOCK_L, INTERPRET,
                         hist_ptr, P, HIST_CHUNK, SWAP, skip_within)
    else:
        _scores_task(m, tl.program_id(1), q8_ptr, head_w_ptr, cache_ptr, pos_ptr, row_slots,
                     scores_ptr, stride_scores, L, NH, D, BLOCK_H, BLOCK_L,
                     INTERPRET, hist_ptr, P, HIST_CHUNK, SWAP, skip_within)


def prepare(kw_parts, q_parts, ln_w, ln_b, ln_eps, positions, token_slots, inv_freq,
            index_cache, q8, head_w, rope_dim: int, slot_rows=None) -> None:
    """kw_parts fp32 [SPLIT, M, D + heads] ([wk; weights_proj] partials); q_parts fp32
    [Q_SPLIT, M, heads * D] (wq_b partials); writes the index cache rows, q8 e4m3
    [M, heads, D] and head_w fp32 [M, heads]. token_slots, slot_rows: ``mla.slot_args``."""
    split, m, nkw = kw_parts.shape
    _, nh, d = q8.shape
    assert nkw == d + nh and q_parts.is_contiguous() and q8.is_contiguous()
    hb = min(PREPARE_HEADS, nh)
    assert nh % hb == 0 and hb & (hb - 1) == 0
    slots, rows = slot_args(token_slots, slot_rows, positions, index_cache)
    _prepare_kernel[(m, nh // hb)](kw_parts, split, m, nkw, q_parts, q_parts.shape[0], ln_w,
                                   ln_b, float(ln_eps), positions, *slots, inv_freq,
                                   index_cache, q8, head_w, float(nh ** -0.5 * d ** -0.5),
                                   NH=nh, D=d, HALF_R=rope_dim // 2, INTERPRET=interpreting(),
                                   PDL=overlap.enabled(), HB=hb, ROWS=rows, num_warps=4,
                                   EARLY=PREPARE_EARLY, **overlap.launch_kw())


def scores(q8, head_w, index_cache, positions, token_slots, out, block_l: int = 0,
           first_hist=None, skip_within: int = 0, slot_rows=None) -> None:
    """out fp32 [M, L] (L = token_slots width): index scores of each row's context, -inf
    past it to the end of its last block of block_l positions; the blocks past that are not
    written (the top-k reads none), so the work follows the context, not L (a server's slot
    table is as wide as its longest context). block_l: context positions a program (default
    SCORE_BLOCK; about score_row_programs(m) programs a row at most, looping). first_hist: int32
    [>= M * P * 256], P = topk.split_chunks(L): each row's histograms of the first key digit
    of its topk.SPLIT_CHUNK-score chunks (context positions only) are added there, for
    ``topk_positions_split``'s first_hist, which zeroes them again. skip_within: rows whose
    context is that short or shorter are not scored (nothing written, nothing counted): with
    the top-k's k, the rows that take their whole context whatever the scores. token_slots,
    slot_rows: ``mla.slot_args``."""
    m, nh, d = q8.shape
    width = out.shape[1]
    block_l = block_l or SCORE_BLOCK
    p = split_chunks(width)
    if first_hist is not None:
        assert first_hist.dtype == torch.int32 and first_hist.numel() >= m * p * 256
        assert SPLIT_CHUNK % block_l == 0, "a program's positions must lie in one chunk"
    blocks = triton.cdiv(width, block_l)
    programs = score_programs(m, width, block_l)
    slots, rows = slot_args(token_slots, slot_rows, positions, index_cache)
    _scores_kernel[(m, programs)](
        q8, head_w, index_cache, positions, *slots, out, out.stride(0), width,
        out if first_hist is None else first_hist, p, skip_within, NH=nh, D=d,
        BLOCK_H=max(16, nh),
        BLOCK_L=block_l, INTERPRET=interpreting(), PDL=overlap.enabled(),
        HIST_CHUNK=0 if first_hist is None else SPLIT_CHUNK, SWAP=SCORE_SWAP,
        LOOP=programs < blocks, ROWS=rows,
        num_warps=SCORE_WARPS,
        **overlap.launch_kw(),
        **({"maxnreg": SCORE_HIST_MAXNREG} if first_hist is not None and programs == blocks
           else {"maxnreg": SCORE_LOOP_MAXNREG} if first_hist is None and programs < blocks
           else {}))
