"""Exact top-k of the indexer scores, SGLang's semantics, one program per row, no host sync.

A row whose context fits in k takes every position (0 .. seq-1). Otherwise a radix select
finds the k-th largest score: four passes over the row, each building a 256-bin histogram of
the next 8 bits of the order-preserving integer image of the fp32 scores, among the scores
that share the bits found so far. A last pass writes, in ascending position order, every
position above the threshold and the lowest-positioned ties at it (a stable descending sort's
choice). Output: int64 [M, k], ascending positions, -1 padded.

For long rows ``topk_positions_split`` runs the same selection over one program per
2048-score chunk of a row, in six launches: the default for rows wider than SPLIT_MIN_WIDTH
(SGL_KERNEL_EXT_SPLIT_TOPK=0 turns it off). On an H200 at a 32K context it takes the indexer
layer from 237 to 121 us at one row (decode_layer_20261130T143124Z vs ..T143143Z). Opt-in
forms: where the index scores already added up the first pass's histograms, one launch fewer
(SCORES_HISTOGRAM); without the count pass, the write taking each chunk's counts from the
last pass's histograms, one fewer (SKIP_COUNT_PASS); where the launch's programs fit on the
GPU at once (one a multiprocessor, ``one_launch_chunk``), one (ONE_LAUNCH): a row's programs
meet at a counter in global memory between passes (``arrival.arrive`` / ``wait_for``)
instead of at launch boundaries, and keep their keys in registers.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from . import overlap
from .arrival import arrive, arrive_last, wait_for
from .fp8_linear import interpreting
from .overlap import stage_begin


@triton.jit
def _keys(scores):
    """uint32 images of fp32 scores whose unsigned order is the float order (-inf lowest)."""
    bits = scores.to(tl.uint32, bitcast=True)
    flip = tl.where((bits >> 31) == 1, 0xFFFFFFFF, 0x80000000).to(tl.uint32)
    return bits ^ flip


@triton.jit
def _take_whole_context(out_row_ptr, seq, K: tl.constexpr, OUT_BLOCK: tl.constexpr):
    """A row whose context fits in k takes every position 0 .. seq - 1, then -1s."""
    for o in range(0, K, OUT_BLOCK):
        j = o + tl.arange(0, OUT_BLOCK)
        tl.store(out_row_ptr + j, tl.where(j < seq, j, -1).to(tl.int64), mask=j < K)


@triton.jit
def _take_digit(hist, prefix, need):
    """(prefix, need) extended by the next digit of the k-th largest key: the highest bin of
    the digit's histogram (among keys sharing prefix) with at least `need` keys at or above
    it; `need` less those above it."""
    bins = tl.arange(0, 256)
    at_or_above = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist
    digit = tl.max(tl.where(at_or_above >= need, bins, 0), axis=0)
    need -= tl.sum(tl.where(bins > digit, hist, 0), axis=0)
    return (prefix << 8) | digit.to(tl.uint32), need


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
            prefix, need = _take_digit(hist, prefix, need)
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


# ----------------------------------------------------------------------------------------------
# The same selection over many programs per row, for long contexts: a row's scores are cut into
# CHUNK-score chunks, one program each, and the four radix passes and the final write are six
# launches. Pass p (p = 1..3) and the count reduce the previous pass's per-chunk histograms
# (every program of the row does, the same sum in the same order) into the next digit of the
# k-th largest key and the count still needed among its ties; the row's first program also
# stores that state for the next launch. No launch waits on another program of its own.
# ----------------------------------------------------------------------------------------------
SPLIT_CHUNK = 2048  # scores per program of the split top-k
# rows at most this wide use the one-program kernel. On an H200 the split takes an indexer
# layer at 8K from 149 to 115 us at one row (304 to 282 at 16), and is neutral at 4K
# (tiling_probe_20261130T144621Z, ..T144628Z).
SPLIT_MIN_WIDTH = 2048
SPLIT_ENV = "SGL_KERNEL_EXT_SPLIT_TOPK"  # "0": every row uses the one-program kernel
# whether the split top-k runs as one launch where its programs fit at once (one a
# multiprocessor, chunks of up to ONE_LAUNCH_MAX_CHUNK scores), rather than six: opt-in
# (SGL_KERNEL_EXT_TOPK_ONE_LAUNCH=1). On an H200 an indexer layer is 0.5-1.6 us faster at 1-4
# rows at 8K and 32K contexts and 5.4 us at 16 rows at 8K, within run-to-run noise in the
# layer table (tiling_probe_20261201T225155Z, T230428Z, T230454Z: topk_six_launches;
# decode_layer_20261201T233652Z against T224110Z); with 4096-score chunks (16 rows at 32K)
# 5.5-7.3 us slower, a histogram of twice the keys. A wait inside the launch costs about what
# a launch boundary does (store, fence, atomic, poll, load: ~5 us a pass either way;
# graph_timeline_20261201T230532Z), and it assumes every program resident at once, which
# an SM-limited context (MPS, green contexts) would break with a hang: too little gain for
# that risk by default.
ONE_LAUNCH = os.environ.get("SGL_KERNEL_EXT_TOPK_ONE_LAUNCH", "0") == "1"
# Timed alone on an H100 (benchmark/topk_probe.py, results/topk_probe_20261205T193838Z at
# 621712b; every form exact): the split form 19.7 / 23.0 / 24.1 us at 1 / 4 / 16 rows of 8K,
# 27.7 / 27.6 / 34.1 of 32K, the one launch 21.2-26.0; one program a row is no way out of the
# launches: 35.2 us at 8K (8192 a step, 16 warps), 123-153 at 32K (4096-32768 a step, 16-32
# warps), and a row's keys held from one load 28.6 at 8K, 137-299 at 32K (its registers spill).
# tl.histogram is the cost: Triton lowers it to ballots, ~5 + (bins / 32) x (log2(bins) - 5)
# an element (29 at 256 bins, 389 at 2048: 11-bit digits took 176 us at 8K), so a pass over
# 8K keys on one multiprocessor is ~7 us; spread over a row's chunks it is ~1 us and the
# launches' (or the counters') hops are the rest.
# whether the fused layer has the index scores add up the first digit's histograms of each
# 2048-score chunk (atomics into a buffer kept at zero), so the split top-k is five launches,
# its first pass over the scores gone (``indexer.scores``' first_hist): opt-in
# (SGL_KERNEL_EXT_TOPK_SCORES_HISTOGRAM=1) until measured on a GPU (tiling_probe variant
# scores_histogram). With it on, the one-launch form (ONE_LAUNCH) does not run.
SCORES_HISTOGRAM = os.environ.get("SGL_KERNEL_EXT_TOPK_SCORES_HISTOGRAM", "0") == "1"
# chunks whose histograms (passes 1-4) or counts (the write) a split program loads at once. 1:
# a loop of one chunk a step, which sm_90a runs as 4 chunks a round trip to L2 (P = 16 chunks
# at a 32K context: 4 dependent round trips a pass, ~0.35 us each); 32: one round trip up to
# 64K. The same integers either way. 1 until timed on a GPU (tiling_probe topk_sum_32).
SPLIT_SUM_BLOCK = 1
# whether the split top-k runs without its count pass: the passes' first programs keep each
# chunk's keys above the digits found so far (from the histograms every program loads
# anyway), and the write takes the last digit and the chunks' counts from the last pass's
# histograms, as the one-launch form does: five launches (four with SCORES_HISTOGRAM), the
# same output. Opt-in until timed on a GPU (tiling_probe topk_no_count_pass).
SKIP_COUNT_PASS = False
# programs of a split top-k launch at most, over all rows: a server's slot table spans its
# longest context (1M positions for GLM-5.3's config: 512 chunks a row), and programs past a
# row's context exit, but each still costs its launch: on an H200 an 8K context in a 1M-wide
# table made an indexer layer 33 us slower than in an 8K-wide one at 16 rows
# (tiling_probe_20261202T021426Z against T021420Z), 14 us of it a top-k program a chunk
# (8192 a launch, six launches; T022140Z: topk_grid_per_chunk), 15 the scores' grid
# (indexer.score_row_programs). Up to this many, a program a chunk. 256 rather than 1024:
# 4.8 us faster at 16 rows of 32K in a 1M-wide table (T023005Z), 2.1 at 16 of 128K (noise
# 2.0; T022305Z), 1.0 slower at 2 rows of 32K in 1M, within noise elsewhere (T022242Z,
# T022254Z, T023018Z: topk_programs_256).
SPLIT_MAX_PROGRAMS = 256
ONE_LAUNCH_MAX_CHUNK = 2048
ONE_LAUNCH_MAX_ROW_PROGRAMS = 64  # its programs a row: each holds every chunk's histogram


def use_split(width: int) -> bool:
    """Whether a top-k over rows `width` wide runs split."""
    return width > SPLIT_MIN_WIDTH and os.environ.get(SPLIT_ENV, "1") != "0"


@triton.jit
def _next_digit(hist_ptr, state_ptr, m, P, NC, PASS: tl.constexpr, K: tl.constexpr,
                FRESH: tl.constexpr, SUM_BLOCK: tl.constexpr):
    """(prefix, need) after digit PASS - 1: from the previous pass's histograms [m, P, 256]
    of the row's first NC chunks (those its context reaches), loaded SUM_BLOCK chunks at a
    time (FRESH: the state before them is the start's, nothing found and k needed)."""
    bins = tl.arange(0, 256)
    if PASS == 0 or FRESH:
        prefix = tl.zeros((), tl.uint32)
        need = tl.full((), K, tl.int32)
    else:
        prefix = tl.load(state_ptr + m * 2).to(tl.uint32, bitcast=True)
        need = tl.load(state_ptr + m * 2 + 1)
    if PASS > 0:
        hist = tl.zeros((256,), tl.int32)
        if SUM_BLOCK == 1:
            for c in range(0, NC):
                hist += tl.load(hist_ptr + (m * P + c) * 256 + bins)
        else:
            for c0 in range(0, NC, SUM_BLOCK):
                chunks = c0 + tl.arange(0, SUM_BLOCK)
                hist += tl.sum(tl.load(hist_ptr + (m * P + chunks[:, None]) * 256 + bins[None, :],
                                       mask=(chunks < NC)[:, None], other=0), axis=0)
        prefix, need = _take_digit(hist, prefix, need)
    return prefix, need


@triton.jit
def _chunk_above(hist_ptr, above_ptr, m, P, NC, chunks, digit, FIRST: tl.constexpr):
    """Each of the chunks' keys above the k-th one so far: their count before this digit
    (above_ptr [M, P]; none before the FIRST) plus those their histograms (of the digit just
    chosen, hist_ptr [M, P, 256]) put in higher bins; and their keys in the digit's bin
    (chunks past the row's first NC: none)."""
    bins = tl.arange(0, 256)
    ok = chunks < NC
    tile = tl.load(hist_ptr + (m * P + chunks[:, None]) * 256 + bins[None, :],
                   mask=ok[:, None], other=0)
    above = tl.sum(tl.where(bins[None, :] > digit, tile, 0), axis=1)
    if not FIRST:
        above += tl.load(above_ptr + m * P + chunks, mask=ok, other=0)
    return above, tl.sum(tl.where(bins[None, :] == digit, tile, 0), axis=1)


@triton.jit
def _chunk_hist(key, in_row, prefix, PASS: tl.constexpr):
    """256-bin histogram of digit PASS of the chunk's keys that share the digits before it
    (prefix); the keys outside are not counted."""
    shift = 24 - 8 * PASS
    if PASS == 0:
        match = in_row
    else:
        match = in_row & ((key >> (shift + 8)) == prefix)
    dig = ((key >> shift) & 0xFF).to(tl.int32)
    hist = tl.histogram(tl.where(match, dig, 0), 256)
    return hist - tl.where(tl.arange(0, 256) == 0, tl.sum((~match).to(tl.int32), axis=0), 0)


@triton.jit
def _pass_chunk(c, m, seq, scores_ptr, stride_s, hist_out_ptr, count_ptr, P, prefix,
                PASS: tl.constexpr, CHUNK: tl.constexpr):
    """Pass PASS over chunk c of row m: its histogram of digit PASS, or (pass 4) its counts
    of keys above / tied with the k-th."""
    offs = c * CHUNK + tl.arange(0, CHUNK)
    in_row = offs < seq
    key = _keys(tl.load(scores_ptr + m * stride_s + offs, mask=in_row, other=float("-inf")))
    if PASS < 4:
        tl.store(hist_out_ptr + (m * P + c) * 256 + tl.arange(0, 256),
                 _chunk_hist(key, in_row, prefix, PASS))
    else:
        tl.store(count_ptr + (m * P + c) * 2, tl.sum((in_row & (key > prefix)).to(tl.int32), 0))
        tl.store(count_ptr + (m * P + c) * 2 + 1,
                 tl.sum((in_row & (key == prefix)).to(tl.int32), 0))


@triton.jit
def _topk_pass_kernel(scores_ptr, stride_s, pos_ptr, hist_in_ptr, state_in_ptr, hist_out_ptr,
                      state_out_ptr, count_ptr, P, clear_ptr, K: tl.constexpr,
                      PASS: tl.constexpr, CHUNK: tl.constexpr, PDL: tl.constexpr,
                      FRESH: tl.constexpr = False, CLEAR: tl.constexpr = False,
                      SUM_BLOCK: tl.constexpr = 1, ABOVE_BLOCK: tl.constexpr = 0,
                      LOOP: tl.constexpr = False):
    """Program (row, chunk) of pass PASS (0..3: histogram of digit PASS among the keys that
    share the digits found so far; 4: counts of the keys above / tied with the k-th); LOOP:
    fewer programs than chunks, each taking every num_programs-th chunk of the row's context.
    FRESH: pass 1 reads digit 0's histograms made elsewhere (``indexer.scores``'s); CLEAR:
    the program zeroes its chunks' histograms at clear_ptr [m, P, 256] (every program of the
    row read them in the launch before); ABOVE_BLOCK: the row's first program also keeps
    each chunk's keys above the digits found so far at count_ptr [M, P] (ABOVE_BLOCK chunks
    at a time), so the write needs no count pass (SKIP_COUNT_PASS)."""
    stage_begin(PDL)
    m = tl.program_id(0)
    first = tl.program_id(1)
    seq = tl.load(pos_ptr + m) + 1
    nc = tl.cdiv(seq, CHUNK)  # the chunks the row's context reaches: the others are not read
    if CLEAR:
        if LOOP:
            for c in range(first, nc, tl.num_programs(1)):
                tl.store(clear_ptr + (m * P + c) * 256 + tl.arange(0, 256),
                         tl.zeros((256,), tl.int32))
        elif first < nc:
            tl.store(clear_ptr + (m * P + first) * 256 + tl.arange(0, 256),
                     tl.zeros((256,), tl.int32))
    if seq > K and first < nc:
        prefix, need = _next_digit(hist_in_ptr, state_in_ptr, m, P, nc, PASS, K, FRESH,
                                   SUM_BLOCK)
        if first == 0:
            tl.store(state_out_ptr + m * 2, prefix.to(tl.int32, bitcast=True))
            tl.store(state_out_ptr + m * 2 + 1, need)
            if ABOVE_BLOCK and PASS > 0:
                digit = (prefix & 0xFF).to(tl.int32)
                for c0 in range(0, nc, ABOVE_BLOCK):
                    chunks = c0 + tl.arange(0, ABOVE_BLOCK)
                    above, _ = _chunk_above(hist_in_ptr, count_ptr, m, P, nc, chunks, digit,
                                            PASS == 1)
                    tl.store(count_ptr + m * P + chunks, above, mask=chunks < nc)
        if LOOP:
            for c in range(first, nc, tl.num_programs(1)):
                _pass_chunk(c, m, seq, scores_ptr, stride_s, hist_out_ptr, count_ptr, P, prefix,
                            PASS, CHUNK)
        else:
            _pass_chunk(first, m, seq, scores_ptr, stride_s, hist_out_ptr, count_ptr, P, prefix,
                        PASS, CHUNK)


@triton.jit
def _picks(above, ties, before, ties_so_far, need):
    """(picks, ties) of the chunks where `before` holds, given each chunk's keys above the
    k-th and tied with it: a chunk takes its ties while the row still needs some
    (ties_so_far: ties of the chunks ahead of these)."""
    ahead = ties_so_far + tl.cumsum(ties, axis=0) - ties
    take = tl.minimum(tl.maximum(need - ahead, 0), ties)
    return (tl.sum(tl.where(before, above + take, 0), axis=0),
            tl.sum(tl.where(before, ties, 0), axis=0))


@triton.jit
def _picks_before(count_ptr, c, need):
    """(picks, ties) of the row's chunks before chunk c, from their (above, tied) counts."""
    base = 0
    ties = 0
    for b in range(0, c):
        above_b = tl.load(count_ptr + b * 2)
        ties_b = tl.load(count_ptr + b * 2 + 1)
        base += above_b + tl.minimum(tl.maximum(need - ties, 0), ties_b)
        ties += ties_b
    return base, ties


@triton.jit
def _picks_before_blocks(count_ptr, c, need, BLOCK: tl.constexpr):
    """_picks_before with the counts loaded BLOCK chunks at a time."""
    base = 0
    ties = 0
    for b0 in range(0, c, BLOCK):
        chunks = b0 + tl.arange(0, BLOCK)
        before = chunks < c
        above_b = tl.load(count_ptr + chunks * 2, mask=before, other=0)
        ties_b = tl.load(count_ptr + chunks * 2 + 1, mask=before, other=0)
        picks, tied = _picks(above_b, ties_b, before, ties, need)
        base += picks
        ties += tied
    return base, ties


@triton.jit
def _write_chunk(key, offs, in_row, prefix, need, base, ties, out_row_ptr):
    """Store the chunk's positions above the k-th key and its share of the lowest-positioned
    ties at their ranks among the row's ascending picks (base picks and ties before it)."""
    tie = in_row & (key == prefix)
    tie_rank = ties + tl.cumsum(tie.to(tl.int32), axis=0) - 1
    take = in_row & ((key > prefix) | (tie & (tie_rank < need)))
    at = base + tl.cumsum(take.to(tl.int32), axis=0) - 1
    tl.store(out_row_ptr + at, offs.to(tl.int64), mask=take)


@triton.jit
def _write_at(c, m, seq, nc, scores_ptr, stride_s, count_ptr, out_ptr, P, hist_ptr, prefix,
              need, K: tl.constexpr, CHUNK: tl.constexpr, SUM_BLOCK: tl.constexpr,
              ABOVE_BLOCK: tl.constexpr):
    """The write of chunk c of row m (see _topk_write_kernel)."""
    if ABOVE_BLOCK:
        digit = (prefix & 0xFF).to(tl.int32)
        base = 0
        ties = 0
        for b0 in range(0, c, ABOVE_BLOCK):
            chunks = b0 + tl.arange(0, ABOVE_BLOCK)
            above, tied = _chunk_above(hist_ptr, count_ptr, m, P, nc, chunks, digit, False)
            picks, tied = _picks(above, tied, chunks < c, ties, need)
            base += picks
            ties += tied
    elif SUM_BLOCK == 1:
        base, ties = _picks_before(count_ptr + m * P * 2, c, need)
    else:
        base, ties = _picks_before_blocks(count_ptr + m * P * 2, c, need, SUM_BLOCK)
    offs = c * CHUNK + tl.arange(0, CHUNK)
    in_row = offs < seq
    key = _keys(tl.load(scores_ptr + m * stride_s + offs, mask=in_row, other=float("-inf")))
    _write_chunk(key, offs, in_row, prefix, need, base, ties, out_ptr + m * K)


@triton.jit
def _topk_write_kernel(scores_ptr, stride_s, pos_ptr, state_ptr, count_ptr, out_ptr, P,
                       hist_ptr, K: tl.constexpr, CHUNK: tl.constexpr,
                       OUT_BLOCK: tl.constexpr, PDL: tl.constexpr, SUM_BLOCK: tl.constexpr = 1,
                       ABOVE_BLOCK: tl.constexpr = 0, LOOP: tl.constexpr = False):
    """Program (row, chunk): its positions above the k-th key and its share of the lowest-
    positioned ties, at their ranks among the row's ascending picks; LOOP: every
    num_programs-th chunk of the row's context. ABOVE_BLOCK: no count pass ran; the last
    digit comes from the last pass's histograms (hist_ptr, state_ptr before it) and each
    earlier chunk's keys above and tied with the k-th from them and the keys above so far
    (count_ptr [M, P])."""
    stage_begin(PDL)
    m = tl.program_id(0)
    first = tl.program_id(1)
    seq = tl.load(pos_ptr + m) + 1
    nc = tl.cdiv(seq, CHUNK)
    if seq <= K:
        if first == 0:
            _take_whole_context(out_ptr + m * K, seq, K, OUT_BLOCK)
    elif first < nc:
        if ABOVE_BLOCK:
            prefix, need = _next_digit(hist_ptr, state_ptr, m, P, nc, 4, K, False, SUM_BLOCK)
        else:
            prefix = tl.load(state_ptr + m * 2).to(tl.uint32, bitcast=True)
            need = tl.load(state_ptr + m * 2 + 1)
        if LOOP:
            for c in range(first, nc, tl.num_programs(1)):
                _write_at(c, m, seq, nc, scores_ptr, stride_s, count_ptr, out_ptr, P, hist_ptr,
                          prefix, need, K, CHUNK, SUM_BLOCK, ABOVE_BLOCK)
        else:
            _write_at(first, m, seq, nc, scores_ptr, stride_s, count_ptr, out_ptr, P, hist_ptr,
                      prefix, need, K, CHUNK, SUM_BLOCK, ABOVE_BLOCK)


@triton.jit
def _topk_one_launch_kernel(scores_ptr, stride_s, pos_ptr, hist_ptr, hist_stride, bar_ptr,
                            out_ptr, M, K: tl.constexpr, CHUNK: tl.constexpr,
                            P_BLOCK: tl.constexpr, OUT_BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Program (row, chunk): the split top-k's six launches in one. The chunk's keys stay in
    registers; after each histogram pass the row's programs meet at the row's counter
    (bar_ptr[row], zeroed at the end through bar_ptr[M + row]) and each loads every chunk's
    histogram at once, sums them in the same order (so they agree on every digit) and keeps
    per chunk the keys above the digit it picks: after the fourth pass each knows every
    chunk's keys above and tied with the k-th, so the count pass and its wait are not needed.
    Histograms alternate between two buffers: a program writes pass p + 2's only after every
    program of its row has arrived from pass p + 1, so has finished reading pass p's."""
    stage_begin(PDL)
    m = tl.program_id(0)
    c = tl.program_id(1)
    P = tl.num_programs(1)
    seq = tl.load(pos_ptr + m) + 1
    if seq <= K:
        if c == 0:
            _take_whole_context(out_ptr + m * K, seq, K, OUT_BLOCK)
    else:
        bins = tl.arange(0, 256)
        chunks = tl.arange(0, P_BLOCK)
        offs = c * CHUNK + tl.arange(0, CHUNK)
        in_row = offs < seq
        key = _keys(tl.load(scores_ptr + m * stride_s + offs, mask=in_row, other=float("-inf")))
        prefix = tl.zeros((), tl.uint32)
        need = tl.full((), K, tl.int32)
        above = tl.zeros((P_BLOCK,), tl.int32)  # each chunk's keys above the k-th
        ties = tl.zeros((P_BLOCK,), tl.int32)  # and tied with it (after the last pass)
        for PASS in tl.static_range(4):
            row_hist = hist_ptr + (PASS % 2) * hist_stride + m * P * 256
            tl.store(row_hist + c * 256 + bins, _chunk_hist(key, in_row, prefix, PASS))
            arrive(bar_ptr + m)
            wait_for(bar_ptr + m, (PASS + 1) * P)
            hist = tl.load(row_hist + chunks[:, None] * 256 + bins[None, :],
                           mask=(chunks < P)[:, None], other=0, cache_modifier=".cg")
            prefix, need = _take_digit(tl.sum(hist, axis=0), prefix, need)
            digit = (prefix & 0xFF).to(tl.int32)
            above += tl.sum(tl.where(bins[None, :] > digit, hist, 0), axis=1)
            if PASS == 3:
                ties = tl.sum(tl.where(bins[None, :] == digit, hist, 0), axis=1)
        base, ties_before = _picks(above, ties, chunks < c, 0, need)
        _write_chunk(key, offs, in_row, prefix, need, base, ties_before, out_ptr + m * K)
        if arrive_last(bar_ptr + M + m, P):  # every program of the row is past its waits
            tl.atomic_xchg(bar_ptr + m, 0, sem="relaxed", scope="gpu")


def split_chunks(width: int) -> int:
    """Programs per row of the split top-k for scores `width` wide."""
    return triton.cdiv(width, SPLIT_CHUNK)


def capped_grid(units: int, cap: int) -> int:
    """Programs for `units` blocks of a row's work under a cap: a program a unit up to an
    eighth past the cap (a server's slot table is its context length + 16 wide: 32K + 16
    keeps the plain form), else `cap` programs looping over the units."""
    return units if units <= cap + cap // 8 else cap


def split_programs(m: int, width: int) -> int:
    """Programs a row of each split top-k launch over m rows `width` wide: a program a chunk,
    or, past about SPLIT_MAX_PROGRAMS programs a launch, fewer, each looping over chunks."""
    return capped_grid(split_chunks(width), max(1, SPLIT_MAX_PROGRAMS // m))


def one_launch_chunk(m: int, width: int, programs_at_once: int) -> int:
    """Scores per program of the one-launch split top-k for m rows `width` wide (a power-of-two
    multiple of SPLIT_CHUNK up to ONE_LAUNCH_MAX_CHUNK, at most ONE_LAUNCH_MAX_ROW_PROGRAMS
    chunks a row), or 0 where it cannot run: a row's programs wait for each other, so the
    launch's m * chunks programs must all be resident at once, programs_at_once (one a
    multiprocessor) at most."""
    chunk = SPLIT_CHUNK
    while (m * triton.cdiv(width, chunk) > programs_at_once
           or triton.cdiv(width, chunk) > ONE_LAUNCH_MAX_ROW_PROGRAMS):
        chunk *= 2
        if chunk > ONE_LAUNCH_MAX_CHUNK:
            return 0
    return chunk


def topk_positions_split(scores: torch.Tensor, positions: torch.Tensor, k: int,
                         out: torch.Tensor, hist: torch.Tensor, state: torch.Tensor,
                         counts: torch.Tensor, barriers=None, first_hist=None) -> None:
    """topk_positions over split_chunks(width) programs per row (same output). Scratch:
    hist int32 [2, >= M * P * 256], state int32 [2, >= M * 2], counts int32 [>= M * P * 2];
    barriers: int32 [>= 2 * M] counters at zero (left at zero), for the one-launch form
    (ONE_LAUNCH, ``one_launch_chunk``; not under the interpreter, whose programs run one
    after another); first_hist: int32 [>= M * P * 256], the first digit's histograms that
    ``indexer.scores`` added up over these scores (its ``first_hist``): the first pass is
    skipped, and they are zeroed again (SCORES_HISTOGRAM)."""
    m, width = scores.shape
    p = split_chunks(width)
    assert scores.stride(1) == 1 and out.shape == (m, k) and out.is_contiguous()
    assert hist.shape[0] == 2 and hist[0].numel() >= m * p * 256 and state[0].numel() >= m * 2
    assert counts.numel() >= m * p * 2 and hist.dtype == state.dtype == counts.dtype == torch.int32
    out_block = min(1024, triton.next_power_of_2(k))
    if first_hist is None and barriers is not None and ONE_LAUNCH and not interpreting():
        chunk = one_launch_chunk(m, width, overlap.prefetch_programs(scores.device))
        if chunk:
            topk_one_launch(scores, positions, k, out, hist, barriers, chunk)
            return
    if first_hist is not None:
        assert first_hist.dtype == torch.int32 and first_hist.numel() >= m * p * 256
    p2 = triton.next_power_of_2(p)
    above_block = min(32, p2) if SKIP_COUNT_PASS else 0
    programs = split_programs(m, width)
    launch = dict(PDL=overlap.enabled(), SUM_BLOCK=min(SPLIT_SUM_BLOCK, p2),
                  ABOVE_BLOCK=above_block, LOOP=programs < p, num_warps=8,
                  **overlap.launch_kw())
    last = 3 if above_block else 4  # without the count pass the write reads pass 3's output
    for ps in range(0 if first_hist is None else 1, last + 1):
        src, dst = (ps + 1) % 2, ps % 2
        fresh = first_hist is not None and ps == 1
        clear = first_hist is not None and ps == 2
        _topk_pass_kernel[(m, programs)](scores, scores.stride(0), positions,
                                  first_hist if fresh else hist[src], state[src], hist[dst],
                                  state[dst], counts, p, first_hist if clear else counts, K=k,
                                  PASS=ps, CHUNK=SPLIT_CHUNK, FRESH=fresh, CLEAR=clear, **launch)
    _topk_write_kernel[(m, programs)](scores, scores.stride(0), positions, state[last % 2], counts, out,
                               p, hist[last % 2], K=k, CHUNK=SPLIT_CHUNK, OUT_BLOCK=out_block,
                               **launch)


def topk_one_launch(scores: torch.Tensor, positions: torch.Tensor, k: int, out: torch.Tensor,
                    hist: torch.Tensor, barriers: torch.Tensor, chunk: int) -> None:
    """The split top-k as one launch of chunk scores a program (``one_launch_chunk``: the
    caller guarantees every program resident at once). hist and barriers as
    topk_positions_split's."""
    m, width = scores.shape
    p = triton.cdiv(width, chunk)
    assert hist.shape[0] == 2 and hist[0].numel() >= m * p * 256
    assert barriers.dtype == torch.int32 and barriers.numel() >= 2 * m
    assert hist.is_contiguous() and chunk % SPLIT_CHUNK == 0
    _topk_one_launch_kernel[(m, p)](
        scores, scores.stride(0), positions, hist, hist.stride(0), barriers, out, m, K=k,
        CHUNK=chunk, P_BLOCK=triton.next_power_of_2(p),
        OUT_BLOCK=min(1024, triton.next_power_of_2(k)), PDL=overlap.enabled(),
        num_warps=8, **overlap.launch_kw())
