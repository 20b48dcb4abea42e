"""Exact top-k of the indexer scores, SGLang's semantics, one program per row, no host sync.

A row whose context fits in k takes every position (0 .. seq-1). Otherwise a radix select
finds the k-th largest score: four passes over the row, each building a 256-bin histogram of
the next 8 bits of the order-preserving integer image of the fp32 scores, among the scores
that share the bits found so far. A last pass writes, in ascending position order, every
position above the threshold and the lowest-positioned ties at it (a stable descending sort's
choice). Output: int64 [M, k], ascending positions, -1 padded.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import overlap
from .overlap import stage_begin


@triton.jit
def _keys(scores):
    """uint32 images of fp32 scores whose unsigned order is the float order (-inf lowest)."""
    bits = scores.to(tl.uint32, bitcast=True)
    flip = tl.where((bits >> 31) == 1, 0xFFFFFFFF, 0x80000000).to(tl.uint32)
    return bits ^ flip


@triton.jit
def _topk_row(m, scores_ptr, stride_s, width, pos_ptr, out_ptr, K: tl.constexpr,
              BLOCK: tl.constexpr, OUT_BLOCK: tl.constexpr):
    seq = tl.load(pos_ptr + m) + 1  # 0 for a pad row
    row = scores_ptr + m * stride_s
    ok_out = tl.arange(0, OUT_BLOCK)
    if seq <= K:
        for o in range(0, K, OUT_BLOCK):
            j = o + ok_out
            tl.store(out_ptr + m * K + j, tl.where(j < seq, j, -1).to(tl.int64), mask=j < K)
    else:
        bins = tl.arange(0, 256)
        prefix = 0
        need = K
        for p in tl.static_range(4):
            shift = 24 - 8 * p
            hist = tl.zeros((256,), tl.int32)
            for b in range(0, seq, BLOCK):
                offs = b + tl.arange(0, BLOCK)
                in_row = offs < seq
                key = _keys(tl.load(row + offs, mask=in_row, other=float("-inf")))
                if p == 0:
                    match = in_row
                else:
                    match = in_row & ((key >> (shift + 8)) == prefix)
                dig = ((key >> shift) & 0xFF).to(tl.int32)
                hist += tl.histogram(tl.where(match, dig, 0), 256)
                hist -= tl.where(bins == 0, tl.sum((~match).to(tl.int32), axis=0), 0)
            # count of matching keys whose digit is >= each bin
            at_or_above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
            digit = tl.max(tl.where(at_or_above >= need, bins, 0), axis=0)
            need -= tl.sum(tl.where(bins > digit, hist, 0), axis=0)
            prefix = (prefix << 8) | digit.to(tl.uint32)
        # prefix is the k-th largest key; `need` of its ties are taken, lowest positions first
        base = 0
        ties = 0
        for b in range(0, seq, BLOCK):
            offs = b + tl.arange(0, BLOCK)
            in_row = offs < seq
            key = _keys(tl.load(row + offs, mask=in_row, other=float("-inf")))
            tie = in_row & (key == prefix)
            tie_rank = ties + tl.cumsum(tie.to(tl.int32), axis=0) - 1
            take = in_row & ((key > prefix) | (tie & (tie_rank < need)))
            at = base + tl.cumsum(take.to(tl.int32), axis=0) - 1
            tl.store(out_ptr + m * K + at, offs.to(tl.int64), mask=take)
            base += tl.sum(take.to(tl.int32), axis=0)
            ties += tl.sum(tie.to(tl.int32), axis=0)


@triton.jit
def _topk_kernel(scores_ptr, stride_s, width, pos_ptr, out_ptr, K: tl.constexpr,
                 BLOCK: tl.constexpr, OUT_BLOCK: tl.constexpr, PDL: tl.constexpr):
    stage_begin(PDL)
    _topk_row(tl.program_id(0), scores_ptr, stride_s, width, pos_ptr, out_ptr, K, BLOCK,
              OUT_BLOCK)


def topk_positions(scores: torch.Tensor, positions: torch.Tensor, k: int, out: torch.Tensor,
                   block: int = 0) -> None:
    """out int64 [M, k] = ascending positions of row m's k best scores among its first
    positions[m] + 1 (all of them when that is <= k), -1 padded. scores fp32 [M, >= ctx].
    block: scores per loop step (default: up to 8192, so a 32K context takes 4 steps a pass)."""
    m, width = scores.shape
    assert scores.stride(1) == 1 and out.shape == (m, k) and out.is_contiguous()
    block = block or min(8192, max(1024, triton.next_power_of_2(width)))
    _topk_kernel[(m,)](scores, scores.stride(0), width, positions, out, K=k, BLOCK=block,
                       OUT_BLOCK=min(1024, triton.next_power_of_2(k)),
                       PDL=overlap.enabled(), num_warps=16 if block >= 4096 else 8,
                       **overlap.launch_kw())
