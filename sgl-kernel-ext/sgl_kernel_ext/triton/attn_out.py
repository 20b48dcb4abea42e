"""absorb_v and o_proj as one launch: o_proj's programs make their own x from the attention.

The attention's output leaves a decode layer through two stage kernels: absorb_v (o = o_lat .
w_vc per head, rounded to bf16 and quantized per 128 columns) and o_proj (FP8 block-128,
x W_o^T). Each is a dependent round trip on a few KB of activations, and o_proj streams its
12.6 MB (one GLM-5.3 TP8 rank) only after absorb_v is done: together ~10 us of a one-row MoE
layer for ~3 us of floor (graph_timeline_20261204T214011Z). Here one launch does both:

- Program (head h, column tile t) of a [heads, N / BLOCK_N] grid owns o_proj's weight tile
  W_o[t's BLOCK_N rows, h's V columns] (V / 128 scale groups) and, for t < LS, the latent
  slice t of h's w_vc (C / LS of its C columns). Both are weights: with W_EARLY the program
  loads them into registers before its programmatic wait, so they stream while the attention
  still runs (otherwise it prefetches them into L2 there).
- After the wait: a program with a latent slice multiplies its o_lat columns (merged from
  the attention's chunks itself, every row's loads at once, up to MERGE_MAX_ROWS rows; from
  the merge kernel's o_lat beyond) by its w_vc slice
  and adds the fp32 product [M, V] into int64 sums in 2^-32 units (``quant.add_fixed``:
  relaxed atomics, any order the same bits), then counts itself in h's counter.
- Every program of h waits for LS counts, reads h's sums [M, V], rounds them to bf16 and
  quantizes them per 128 columns (the reference's absorb_v output and o_proj input), and
  multiplies them by its weight tile: fp32 partial [h, M, BLOCK_N] of y. The last of h's
  programs to read zeroes the sums and both counters for the next launch.
- y's partials over the heads are summed in head order by the norm (one rank holding every
  head) or, on a TP shard, by each column tile's last head to finish into bf16 rows (the
  all-reduce's input; ``arrival.arrive_last``, as ``fp8_linear``'s tails).

The wait inside the launch needs every program resident at once: ``absorb_v_o_proj`` checks
the compiled kernel's registers and shared memory against the GPU's multiprocessors once and
refuses a shape that would not fit; a wait that still outlasts SPIN_LIMIT polls gives up and
sets a failure word (``failed``, the layer's ``health``): wrong output, never a hang. Under
the Triton interpreter, whose programs run one after another, the launch is two: every
product first, then the rest.

Not yet measured on a GPU (written 2026-12-04 while no device was lent): opt-in through
module knobs read at each launch (MAX_ROWS = 0 keeps the two stage kernels).
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from . import overlap
from .arrival import arrive, arrive_last, wait_bounded
from .fp8_linear import _row_tail, _scaled_dot, interpreting
from .mla import _merge_columns, _zero_sums
from .overlap import prefetch_rows, stage_begin
from .quant import _FIXED_ONE, add_fixed, to_e4m3

# steps of at most this many rows run absorb_v and o_proj as this one launch (0: never; the
# layer also keeps the two stage kernels where o_proj runs on sm90's fp8_mma). On an H200 at
# one TP8 rank (tiling_probe_20261205T044923Z, T044837Z at c01c8f7) it takes 1.3-1.6 us off a
# MoE layer at 1 row, nothing at 2, and adds 6.8 / 15.4 / 20.0 / 15.5 us at 4 / 8 / 12 / 16
# (the stage kernels' many programs stream o_proj faster than its few resident ones); the
# 256- and 128-column forms at 16 rows compile to too many registers to be all resident
MAX_ROWS = 1
# o_proj's output columns a program (a power of two, a multiple of 64): with 8 heads a rank and
# N = 6144, 256 gives 192 programs (two a multiprocessor), 512 gives 96 (-1.5 / -1.6 us at one
# row, where 256 gave -1.3: same runs)
BLOCK_N = 512
WARPS = 8
# the most programs of a head that multiply a latent slice: each adds its [M, V] product into
# the sums with M * V 64-bit atomics (M * V * heads * LS a launch: 524K at 16 rows, 16 slices
# and 8 heads, where fewer slices mean larger w_vc slices a program)
MAX_LATENT_SLICES = 16
# whether the weight tiles are loaded before the wait (sm_90a: staged into shared memory for
# the MMAs) rather than prefetched into L2 there and loaded after it
W_EARLY = True
# whether o_proj's weight scales for the head's columns are loaded before the wait too (with
# W_EARLY), rather than after the count wait and the sums' zeroing atomics, where sm_90a SASS
# issues each group's scale load beside its wgmma, the second after the first's. Off: on an
# H100 +0.0..+0.2 us a layer at 1-2 rows, every kind (tiling_probe_20261207T140746Z): those
# loads hide behind the MMAs
SCALES_EARLY = False
# rows up to which the launch merges the attention's chunks itself (its slice programs, every
# row's chunks loaded at once), so no merge kernel runs before it
MERGE_MAX_ROWS = 16
# whether the attention's merge kernel before this launch (past MERGE_MAX_ROWS) lets it
# launch as the merge's programs start (``mla.combine``'s early_dependents), so the weight
# tiles stream during the attention too, not only during the merge
EARLY_AFTER_COMBINE = True
# polls of a head's count before a program gives up waiting (seconds on an H200): it then
# sets the failure word (counts[2 * heads]; ``failed``) and goes on, wrong output, no hang
SPIN_LIMIT = 1 << 24
# the launches under the interpreter, by PHASE (1: the products, 2: the rest; 3, the GPU's one
# launch, would wait forever there): test/srt/unit/sm90_compile.py records (3,) unrun
INTERPRETER_PHASES = (1, 2)


def latent_slices(tiles: int, c: int, most: int = 1 << 30) -> int:
    """Programs of a head that multiply a latent slice (LS): the largest power of two at most
    `tiles` and `most` that leaves slices of C / LS >= 16 columns (tl.dot's K) dividing C."""
    ls = 1
    while ls * 2 <= min(tiles, most) and c % (ls * 2) == 0 and c // (ls * 2) >= 16:
        ls *= 2
    return ls


def applies(m: int) -> bool:
    """Whether a step of m rows runs absorb_v and o_proj as this one launch."""
    return 1 <= m <= MAX_ROWS


def merges(m: int) -> bool:
    """Whether the launch merges the attention's chunks itself at m rows (MERGE_MAX_ROWS): the
    attention then leaves them unmerged."""
    return m <= MERGE_MAX_ROWS


@triton.jit
def _merged_rows(h, part_o_ptr, part_ml_ptr, NH, NSP, M, oc, C: tl.constexpr, CL: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, ROWS: tl.constexpr):
    """bf16 [BLOCK_M, CL]: head h's o_lat at the CL latent columns oc of the first M (<=
    ROWS) rows, each merged over its NSP chunks by the merge kernel's own function
    (``mla.combine``; bitwise its output under the interpreter, while on a GPU the order of a
    sum over chunks follows the register layout), zero past M. The rows are unrolled, so
    every row's loads can be in flight together."""
    om = tl.arange(0, BLOCK_M)
    a = tl.zeros((BLOCK_M, CL), tl.float32)
    for m in tl.static_range(ROWS):
        row = _merge_columns(m, h, part_o_ptr, part_ml_ptr, NH, NSP, oc, C, BLOCK_S, m < M)
        a = tl.where(om[:, None] == m, row.to(tl.bfloat16).to(tl.float32)[None, :], a)
    return a.to(tl.bfloat16)


def failed(counts: torch.Tensor, heads: int) -> bool:
    """Whether a wait of a launch since the word was last cleared gave up (syncs the host)."""
    return bool(counts[2 * heads].item())


@triton.jit
def _x_group(sums, INTERPRET: tl.constexpr):
    """One 128-column group of the head's int64 sums [rows, 128] as o_proj's x: rounded to
    bf16 (absorb_v's output), then e4m3 with one scale a row (max(amax, 1e-10) / 448)."""
    o = (sums.to(tl.float32) * (1.0 / _FIXED_ONE)).to(tl.bfloat16).to(tl.float32)
    sx = tl.maximum(tl.max(tl.abs(o), axis=1), 1e-10) / 448.0
    return to_e4m3(tl.clamp(o * (1.0 / sx)[:, None], -448.0, 448.0), INTERPRET), sx


@triton.jit
def _wo_tiles(wo_ptr, on, n_ok, K, col0, V: tl.constexpr):
    """W_o's rows `on` at the head's two 128-column groups from col0 (the second all zero
    where V is 128)."""
    og = tl.arange(0, 128)
    w_o = tl.load(wo_ptr + on[:, None] * K + col0 + og[None, :], mask=n_ok[:, None], other=0.0)
    w_o2 = tl.load(wo_ptr + on[:, None] * K + col0 + 128 + og[None, :],
                   mask=n_ok[:, None] & (V > 128), other=0.0)
    return w_o, w_o2


@triton.jit
def _wo_scales_at(wos_ptr, on, K, col0):
    """Addresses of o_proj's block scales for rows on and the head's first 128 of its K = NH *
    V columns from col0 (the second group's at + 1)."""
    return wos_ptr + (on // 128) * (K // 128) + col0 // 128


@triton.jit
def _vo_kernel(olat_ptr, part_o_ptr, part_ml_ptr, NSP, kvb_ptr, wo_ptr, wos_ptr, sums_ptr,
               counts_ptr, parts_ptr, arrivals_ptr, rows_ptr, zero_ptr, ZERO_N, M, N,
               NH: tl.constexpr, C: tl.constexpr, NOPE: tl.constexpr, V: tl.constexpr,
               LS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_S: tl.constexpr, MERGE: tl.constexpr, MERGE_ROWS: tl.constexpr,
               TAILS: tl.constexpr, ZERO: tl.constexpr,
               W_EARLY: tl.constexpr, PHASE: tl.constexpr, INTERPRET: tl.constexpr,
               PDL: tl.constexpr, SPIN_LIMIT: tl.constexpr, S_EARLY: tl.constexpr = False):
    """Program (head h, column tile t): the module docstring's steps, PHASE 1 and/or 2.
    S_EARLY (with W_EARLY): o_proj's scales also loaded before the wait (SCALES_EARLY)."""
    h = tl.program_id(0)
    t = tl.program_id(1)
    tiles = tl.num_programs(1)
    K = NH * V
    CL: tl.constexpr = C // LS
    om = tl.arange(0, BLOCK_M)
    m_ok = om < M
    ov = tl.arange(0, V)
    oc = (t % LS) * CL + tl.arange(0, CL)  # programs t >= LS hold no slice (masked off)
    vc_rows = h * (NOPE + V) + NOPE
    on = t * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = on < N
    og = tl.arange(0, 128)
    col0 = h * V
    w_vc_ptrs = kvb_ptr + (vc_rows + ov[:, None]) * C + oc[None, :]
    if W_EARLY:
        w_vc = tl.load(w_vc_ptrs, mask=(t < LS) & (ov[:, None] < V), other=0.0)
        w_o, w_o2 = _wo_tiles(wo_ptr, on, n_ok, K, col0, V)
        if S_EARLY:
            s_at = _wo_scales_at(wos_ptr, on, K, col0)
            sw = tl.load(s_at, mask=n_ok, other=0.0)
            sw2 = tl.load(s_at + 1, mask=n_ok & (V > 128), other=0.0)
    else:
        if t < LS:
            prefetch_rows(kvb_ptr, vc_rows, V, NH * (NOPE + V), C * 2, (t % LS) * CL * 2,
                          CL * 2, PDL, V, 1)
        prefetch_rows(wo_ptr, t * BLOCK_N, BLOCK_N, N, K, col0, V, PDL, BLOCK_N, 1)
    stage_begin(PDL)
    if ZERO and PHASE % 2 == 1:
        _zero_sums(zero_ptr, ZERO_N)
    if PHASE % 2 == 1 and t < LS:
        if MERGE:
            a = _merged_rows(h, part_o_ptr, part_ml_ptr, NH, NSP, M, oc, C, CL, BLOCK_M,
                             BLOCK_S, MERGE_ROWS)
        else:
            a = tl.load(olat_ptr + (om[:, None] * NH + h) * C + oc[None, :], mask=m_ok[:, None],
                        other=0.0)
        if not W_EARLY:
            w_vc = tl.load(w_vc_ptrs)
        if INTERPRET:
            p = tl.dot(a.to(tl.float32), tl.trans(w_vc.to(tl.float32)))
        else:
            p = tl.dot(a, tl.trans(w_vc))
        add_fixed(sums_ptr + om[:, None] * K + col0 + ov[None, :], p, m_ok[:, None])
        arrive(counts_ptr + h)
    if PHASE >= 2:
        wait_bounded(counts_ptr + h, LS, counts_ptr + 2 * NH, SPIN_LIMIT, False, "gpu")
        tl.debug_barrier()
        sums = sums_ptr + om[:, None] * K + col0
        # both groups' loads issued before either is used (one L2 round trip, not two)
        o = tl.load(sums + og[None, :], mask=m_ok[:, None], other=0, cache_modifier=".cg")
        if V > 128:
            o2 = tl.load(sums + 128 + og[None, :], mask=m_ok[:, None], other=0,
                         cache_modifier=".cg")
        xq, sx = _x_group(o, INTERPRET)
        if V > 128:
            xq2, sx2 = _x_group(o2, INTERPRET)
        # every program of the head has its x once this counts the last: that one zeroes
        if arrive_last(counts_ptr + NH + h, tiles):
            tl.store(sums + ov[None, :], tl.zeros((BLOCK_M, V), tl.int64), mask=m_ok[:, None])
            tl.atomic_xchg(counts_ptr + h, 0, sem="relaxed")
        if not W_EARLY:
            w_o, w_o2 = _wo_tiles(wo_ptr, on, n_ok, K, col0, V)
        if not (W_EARLY and S_EARLY):
            s_at = _wo_scales_at(wos_ptr, on, K, col0)
            sw = tl.load(s_at, mask=n_ok, other=0.0)
        acc = _scaled_dot(xq, sx, w_o, sw, INTERPRET, True)
        if V > 128:
            if not (W_EARLY and S_EARLY):
                sw2 = tl.load(s_at + 1, mask=n_ok, other=0.0)
            acc += _scaled_dot(xq2, sx2, w_o2, sw2, INTERPRET, True)
        acc = tl.trans(acc)
        ok = m_ok[:, None] & n_ok[None, :]
        tl.store(parts_ptr + (h * M + om[:, None]) * N + on[None, :], acc, mask=ok)
        if TAILS:
            if arrive_last(arrivals_ptr + t, NH):
                _row_tail(parts_ptr, NH, M, N, t, rows_ptr, rows_ptr, tiles, BLOCK_M, BLOCK_N,
                          False)


@functools.lru_cache(maxsize=None)
def _multiprocessors(index: int) -> tuple:
    p = torch.cuda.get_device_properties(index)
    # (not every torch names the register file: 64K 32-bit registers on every sm_70 and later)
    return (p.multi_processor_count, getattr(p, "regs_per_multiprocessor", 65536),
            p.shared_memory_per_multiprocessor, p.max_threads_per_multi_processor)


_checked: set = set()


def _check_resident(kernel, programs: int, warps: int, device) -> None:
    """Refuse a compiled shape whose programs cannot all be resident at once (its in-launch
    wait would then never end)."""
    if torch.version.hip is not None:
        raise RuntimeError("absorb_v_o_proj: its residency check counts NVIDIA's "
                           "multiprocessors (32-thread warps, 64K registers); on ROCm keep "
                           "attn_out.MAX_ROWS = 0")
    sms, regs, smem, threads = _multiprocessors(device.index or 0)
    kernel._init_handles()  # loads the binary: its register count is known only then
    n_regs, shared = int(kernel.n_regs), int(kernel.metadata.shared)
    warp_regs = -(-n_regs * 32 // 256) * 256  # registers are allocated a warp, 256 at a time
    # (each program also holds 1 KB of shared memory the driver reserves)
    per_sm = min(threads // (32 * warps), regs // max(1, warp_regs * warps),
                 smem // (shared + 1024))
    if per_sm * sms < programs:
        raise RuntimeError(
            f"absorb_v_o_proj: {programs} programs ({n_regs} registers x {32 * warps} threads, "
            f"{shared} B shared memory each) do not fit the {sms} multiprocessors at once "
            f"({per_sm} each); its in-launch wait needs them all resident: set "
            f"attn_out.MAX_ROWS = 0 or a wider attn_out.BLOCK_N")


def absorb_v_o_proj(olat, attn_parts, merge: bool, kv_b, nope: int, v: int, wo, wos,
                    sums, counts, parts, tails=None, zero=None) -> None:
    """y = quant(o_lat . w_vc per head) . W_o^T, as absorb_v then fp8_linear compute it.

    olat bf16 [M, heads, C] (read unless `merge`: then the attention's unmerged chunks
    attn_parts = (part_o [M, S, heads, C], part_ml [M, S, heads, 2]) are merged here); kv_b
    bf16 [heads * (nope + v), C]; wo e4m3 [N, heads * v], wos fp32 its block scales. sums int64
    [>= M * heads * v] and counts int32 [>= 2 * heads + 1], zero before the launch and left
    at zero (counts[2 * heads]: the failure word, set where a wait gave up: ``failed``).
    parts fp32 [heads, M, N]: the heads' partials of y (the norm sums them in head order).
    tails = (arrivals int32 [>= N / BLOCK_N] zeroed, rows bf16 [M, N]): each column tile's
    last head sums the partials into rows. zero: int64 sums to set to zero after the
    wait (q_b's, as absorb_v does)."""
    m, nh, c = olat.shape
    n, k = wo.shape
    if v % 128 or v > 256:
        raise ValueError(f"absorb_v_o_proj takes 128 or 256 value columns a head, got {v}")
    if k != nh * v or parts.shape != (nh, m, n) or not parts.is_contiguous():
        raise ValueError(f"absorb_v_o_proj: W_o [{n}, {k}] and parts {tuple(parts.shape)} do "
                         f"not fit {nh} heads of {v} columns at {m} rows")
    if sums.dtype != torch.int64 or sums.numel() < m * k or counts.numel() < 2 * nh + 1:
        raise ValueError("absorb_v_o_proj: sums must be int64 [>= M * heads * v] and counts "
                         "int32 [>= 2 * heads + 1]")
    block_n = min(BLOCK_N, triton.next_power_of_2(n))
    tiles = triton.cdiv(n, block_n)
    ls = latent_slices(tiles, c, MAX_LATENT_SLICES)
    part_o, part_ml = attn_parts if merge else (parts, parts)
    nsp = part_o.shape[1] if merge else 1
    if tails is not None:
        arrivals, rows = tails
        assert arrivals.dtype == torch.int32 and arrivals.numel() >= tiles
        assert rows.shape == (m, n) and rows.is_contiguous()
    else:
        arrivals = rows = parts
    interpret = interpreting()
    pdl = overlap.enabled()
    args = (olat, part_o, part_ml, nsp, kv_b, wo, wos, sums, counts, parts, arrivals, rows,
            zero if zero is not None else sums, zero.numel() if zero is not None else 0, m, n)
    consts = dict(NH=nh, C=c, NOPE=nope, V=v, LS=ls, BLOCK_M=max(16, triton.next_power_of_2(m)),
                  BLOCK_N=block_n, BLOCK_S=max(2, triton.next_power_of_2(nsp)), MERGE=merge,
                  MERGE_ROWS=triton.next_power_of_2(m) if merge else 1,
                  TAILS=tails is not None, ZERO=zero is not None, W_EARLY=W_EARLY,
                  INTERPRET=interpret, SPIN_LIMIT=SPIN_LIMIT, S_EARLY=W_EARLY and SCALES_EARLY,
                  num_warps=WARPS)
    grid = (nh, tiles)
    if interpret:  # programs run one after another: every product, then the rest
        for phase in INTERPRETER_PHASES:
            _vo_kernel[grid](*args, PHASE=phase, PDL=False, **consts)
        return
    launch = dict(PHASE=3, PDL=pdl, **consts, **overlap.launch_kw())
    key = (tuple(sorted(launch.items())), grid, olat.device.index)
    if key not in _checked:  # before the first launch of each compiled shape
        _check_resident(_vo_kernel.warmup(*args, grid=grid, **launch), nh * tiles, WARPS,
                        olat.device)
        _checked.add(key)
    _vo_kernel[grid](*args, **launch)

