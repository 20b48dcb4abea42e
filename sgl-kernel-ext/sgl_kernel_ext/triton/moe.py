"""Small-M MoE for 1-16 rows: route, gate/up + SwiGLU, down + weighted combine.

Launches with grids fixed by the plan (CUDA-graph capturable):

1. ``route``: sums the router's split-K fp32 logits, sigmoid, top-k of score + correction
   bias (ties to the lower expert; one bitonic top-k, ``ROUTE_SORT``), weights renormalized
   and scaled; then compacts the experts any row chose into a slot list (slot 0 the shared
   expert with weight 1, then the chosen experts ascending) with a [slot, row] weight table.
   Pad rows choose nothing. In a layer step of 1-2 rows gate/up's routed programs route
   every row themselves from the router's partials (``Routing``, ROUTE_IN_GATE_UP_MAX_ROWS);
   called alone at 1-2 rows it is the tail of the router's GEMV launch; from 3 rows one
   program per row picks its experts and the last to finish builds the slot list
   (``arrival``).
2. ``gate_up``: one program per (slot, BLOCK_N intermediate columns): FP8 block GEMMs of the
   slot's expert for every row (x arrives quantized), SiLU(g) * u rounded to bf16 as SGLang's
   fused MoE does.
3. ``down``: one program per (BLOCK_N hidden columns, slot): FP8 GEMM of the slot's
   activations (re-quantized per 128), term = bf16(weight * y) stored at [row, the expert's
   place in the row's ascending choice]; then each row's k+1 terms are summed in fp32 in that
   order (shared first, experts ascending, as SGLang's combine) and rounded once to bf16.

Each touched expert's weights are read once per step. A dense MLP is the same gate_up/down
pair over the single shared slot. A dense MLP at one row (DENSE_GEMV_MAX_ROWS) multiplies
without the tensor cores (fp8_linear._gemv_step), in narrower tiles of its own.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.runtime.jit import constexpr_function

from . import bf16_linear, fp8_linear, overlap
from .arrival import arrive, arrive_last, wait_bounded
from .bf16_linear import _bf16_linear_prefetch, _bf16_linear_task
from .fp8_linear import (_fp8_group_dot, _gemv_step, _scaled_dot, block_m, grid_shape,
                         group_tiles, group_x, interpreting, step_scales)
from .overlap import launch_dependents, prefetch_rows, stage_begin
from .norm_router import rstd_rows
from .quant import load_fixed, sum_parts, to_e4m3


@constexpr_function
def _pow2_at_least(n):
    return 1 << (int(n) - 1).bit_length()


@triton.jit
def _top_by_sort(choice, offs_e, BLOCK_E: tl.constexpr, TOPK: tl.constexpr,
                 TOPK_POW2: tl.constexpr):
    """int32 [rows, BLOCK_E]: 1 at each row's TOPK largest `choice` (ties to the lower
    expert), as the argmax passes pick them: one bitonic top-k (``tl.topk``) of int64 keys,
    the value's order-preserving bits above the expert's place from the top, then every key
    at or above the row's TOPK-th."""
    bits = choice.to(tl.int32, bitcast=True)  # never -0.0: a sigmoid plus a bias
    ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    key = (ordered.to(tl.int64) << 32) | (BLOCK_E - 1 - offs_e)[None, :].to(tl.int64)
    top = tl.topk(key, TOPK_POW2, dim=1)
    kth = tl.min(tl.where(tl.arange(0, TOPK_POW2)[None, :] < TOPK, top, 0x7FFFFFFFFFFFFFFF),
                 axis=1)
    return (key >= kth[:, None]).to(tl.int32)


_FIXED_ONE: tl.constexpr = tl.constexpr(2.0 ** 56)  # weights < 1: a top-k's sum < 2^59


@triton.jit
def _route_consts(bias_ptr, pos_ptr, E, offs_m, m_ok, BLOCK_E: tl.constexpr):
    """What routing reads besides the router's output: the experts' bias (a weight) and the
    rows' positions (the step's input), so loadable before the wait (ROUTE_CONSTS_EARLY)."""
    offs_e = tl.arange(0, BLOCK_E)
    bias = tl.load(bias_ptr + offs_e, mask=offs_e < E, other=0.0)
    return bias, tl.load(pos_ptr + offs_m, mask=m_ok, other=-1)


@triton.jit
def _route_rows(parts_ptr, SPLIT: tl.constexpr, M, E, bias_ptr, pos_ptr, scale, offs_m, m_ok,
                BLOCK_E: tl.constexpr, TOPK: tl.constexpr, RENORM: tl.constexpr,
                SORT: tl.constexpr = False, ss_ptr=None, SS_SPLIT: tl.constexpr = 0, H=1,
                eps=0.0, FIXED: tl.constexpr = False, consts=None):
    """(chosen int32, weight fp32), [rows, BLOCK_E], of the rows offs_m where m_ok: the router
    partials summed, sigmoid, top-k of score + bias (ties to the lower expert; SORT: as one
    bitonic top-k, ``_top_by_sort``, else TOPK argmax passes), weights renormalized and
    scaled; nothing chosen by a pad row. SS_SPLIT: the partials are of the un-normed row
    (``norm_router``), so the summed logits are first multiplied by each row's rstd from its
    SS_SPLIT sums of squares ss [SS_SPLIT, M] (of H columns, the norm's eps). FIXED: parts
    are int64 [M, E] sums in 2^-32 units (``norm_router.fixed``), read and left at zero.
    consts: (bias, positions) already loaded (``_route_consts``), else loaded here."""
    offs_e = tl.arange(0, BLOCK_E)
    e_ok = offs_e < E
    mask = m_ok[:, None] & e_ok[None, :]
    at = offs_m[:, None] * E + offs_e[None, :]
    if FIXED:
        logits = load_fixed(parts_ptr, at, mask)
        tl.store(parts_ptr + at, tl.zeros(at.shape, dtype=tl.int64), mask=mask)
    else:
        logits = sum_parts(parts_ptr, SPLIT, M * E, at, mask)
    if SS_SPLIT > 0:
        logits = logits * rstd_rows(ss_ptr, SS_SPLIT, M, H, eps, offs_m, m_ok)[:, None]
    score = 1.0 / (1.0 + tl.exp(-logits))
    if consts is None:
        consts = _route_consts(bias_ptr, pos_ptr, E, offs_m, m_ok, BLOCK_E)
    bias = consts[0]
    valid = m_ok & (consts[1] >= 0)
    choice = tl.where(valid[:, None] & e_ok[None, :], score + bias[None, :], float("-inf"))
    if SORT:
        chosen = _top_by_sort(choice, offs_e, BLOCK_E, TOPK, _pow2_at_least(TOPK))
    else:
        chosen = tl.zeros(choice.shape, dtype=tl.int32)
        for _ in tl.static_range(TOPK):
            best = tl.argmax(choice, axis=1)
            hit = offs_e[None, :] == best[:, None]
            chosen = tl.where(hit, 1, chosen)
            choice = tl.where(hit, float("-inf"), choice)
    chosen = tl.where(valid[:, None] & e_ok[None, :], chosen, 0)
    w = tl.where(chosen > 0, score, 0.0)
    if RENORM:
        # the chosen weights' sum in 2^-56 fixed point: integer adds give the same bits
        # whatever a tile's reduction tree (route's one-row tiles, gate/up's [rows, E])
        fixed = (w * _FIXED_ONE).to(tl.int64)
        total = tl.sum(fixed, axis=1).to(tl.float32) * (1.0 / _FIXED_ONE)
        w = w / (total + 1e-20)[:, None]
    return chosen, w * scale


# Tried for the top-k above: counting for every expert the experts ranked above it, 16-64 of
# them at a time ([rows, experts, chunk] tiles), instead of TOPK argmax passes. The same
# choice, but 1.5-5x slower a layer on an H200 (+44 us at 1 row with chunks of 32:
# results/tiling_probe_20261130T170454Z, route_rank_*).


@triton.jit
def _route_slots(chosen, w, offs_m, m_ok, M, slot_expert_ptr, slot_weight_ptr, slot_rank_ptr,
                 num_slots_ptr, E, BLOCK_E: tl.constexpr):
    """The slot list of every row's choice ([rows, BLOCK_E] chosen and weight): slot 0 the
    shared expert (weight 1, rank 0), then the chosen experts ascending, with the [slot, row]
    weight and rank (the expert's place in the row's ascending choice, -1 if not chosen)."""
    offs_e = tl.arange(0, BLOCK_E)
    used = tl.max(chosen, axis=0)  # [BLOCK_E]
    slot = tl.cumsum(used, axis=0)  # slot 0 is the shared expert
    tl.store(slot_expert_ptr + slot, offs_e, mask=used > 0)
    tl.store(slot_weight_ptr + slot[None, :] * M + offs_m[:, None], w,
             mask=(used[None, :] > 0) & m_ok[:, None])
    rank = tl.where(chosen > 0, tl.cumsum(chosen, axis=1), -1)
    tl.store(slot_rank_ptr + slot[None, :] * M + offs_m[:, None], rank,
             mask=(used[None, :] > 0) & m_ok[:, None])
    tl.store(slot_expert_ptr, E)
    tl.store(slot_weight_ptr + offs_m, tl.full(offs_m.shape, 1.0, tl.float32), mask=m_ok)
    tl.store(slot_rank_ptr + offs_m, tl.zeros(offs_m.shape, tl.int32), mask=m_ok)
    tl.store(num_slots_ptr, tl.sum(used, axis=0) + 1)


@triton.jit
def _route_task(parts_ptr, SPLIT: tl.constexpr, M, E, bias_ptr, pos_ptr,
                slot_expert_ptr, slot_weight_ptr, slot_rank_ptr, num_slots_ptr, scale,
                BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, TOPK: tl.constexpr,
                RENORM: tl.constexpr, SORT: tl.constexpr = False, ss_ptr=None,
                SS_SPLIT: tl.constexpr = 0, H=1, eps=0.0, consts=None):
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    chosen, w = _route_rows(parts_ptr, SPLIT, M, E, bias_ptr, pos_ptr, scale, offs_m, m_ok,
                            BLOCK_E, TOPK, RENORM, SORT, ss_ptr, SS_SPLIT, H, eps, False,
                            consts)
    _route_slots(chosen, w, offs_m, m_ok, M, slot_expert_ptr, slot_weight_ptr, slot_rank_ptr,
                 num_slots_ptr, E, BLOCK_E)


@triton.jit
def _routed_slot(parts_ptr, SPLIT: tl.constexpr, M, E, bias_ptr, pos_ptr, scale, slot,
                 R_BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, TOPK: tl.constexpr,
                 RENORM: tl.constexpr, SORT: tl.constexpr, ss_ptr=None,
                 SS_SPLIT: tl.constexpr = 0, H=1, eps=0.0, consts=None):
    """Route every row from the router's partials, in this program (ROUTE_IN_GATE_UP_MAX_ROWS):
    (n slots, the slot's expert, chosen, weight [R_BLOCK_M, BLOCK_E]) as route's slot list
    would hold them (slot 0 the shared expert E, then the chosen experts ascending).
    consts: ``_route_rows``'."""
    offs_m = tl.arange(0, R_BLOCK_M)
    chosen, w = _route_rows(parts_ptr, SPLIT, M, E, bias_ptr, pos_ptr, scale, offs_m,
                            offs_m < M, BLOCK_E, TOPK, RENORM, SORT, ss_ptr, SS_SPLIT, H, eps,
                            False, consts)
    offs_e = tl.arange(0, BLOCK_E)
    used = tl.max(chosen, axis=0)
    place = tl.cumsum(used, axis=0)
    e = tl.sum(tl.where((used > 0) & (place == slot), offs_e, 0), axis=0)
    return tl.sum(used, axis=0) + 1, tl.where(slot == 0, E, e), chosen, w


@triton.jit
def _route_kernel(parts_ptr, SPLIT: tl.constexpr, M, E, bias_ptr, pos_ptr,
                  slot_expert_ptr, slot_weight_ptr, slot_rank_ptr, num_slots_ptr, scale,
                  BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, TOPK: tl.constexpr,
                  RENORM: tl.constexpr, PDL: tl.constexpr, SORT: tl.constexpr, ss_ptr=None,
                  SS_SPLIT: tl.constexpr = 0, H=1, eps=0.0, CONSTS_EARLY: tl.constexpr = False):
    consts = None
    if CONSTS_EARLY:
        offs_m = tl.arange(0, BLOCK_M)
        consts = _route_consts(bias_ptr, pos_ptr, E, offs_m, offs_m < M, BLOCK_E)
    stage_begin(PDL)
    _route_task(parts_ptr, SPLIT, M, E, bias_ptr, pos_ptr, slot_expert_ptr, slot_weight_ptr,
                slot_rank_ptr, num_slots_ptr, scale, BLOCK_M, BLOCK_E, TOPK, RENORM, SORT,
                ss_ptr, SS_SPLIT, H, eps, consts)


@triton.jit
def _route_per_row_kernel(parts_ptr, SPLIT: tl.constexpr, M, E, bias_ptr, pos_ptr,
                          chosen_ptr, weight_ptr, arrival_ptr, slot_expert_ptr, slot_weight_ptr,
                          slot_rank_ptr, num_slots_ptr, scale, BLOCK_M: tl.constexpr,
                          BLOCK_E: tl.constexpr, TOPK: tl.constexpr, RENORM: tl.constexpr,
                          PDL: tl.constexpr, SORT: tl.constexpr, R_ROWS: tl.constexpr = 2,
                          ss_ptr=None, SS_SPLIT: tl.constexpr = 0, H=1, eps=0.0,
                          FIXED: tl.constexpr = False, CONSTS_EARLY: tl.constexpr = False):
    """Program r: row r's top-k into the [M, E] chosen / weight scratch; the last row to
    finish builds the slot list from every row's. R_ROWS: the rows of its tiles, row r then
    masked-off ones (ROUTE_ROW_TILE_MIN). FIXED: as ``_route_rows``'s. CONSTS_EARLY: the bias
    and positions loaded before the wait (ROUTE_CONSTS_EARLY)."""
    r = tl.program_id(0)
    offs_r = r + tl.arange(0, R_ROWS)
    r_ok = offs_r == r
    consts = None
    if CONSTS_EARLY:
        consts = _route_consts(bias_ptr, pos_ptr, E, offs_r, r_ok, BLOCK_E)
    stage_begin(PDL)
    chosen, w = _route_rows(parts_ptr, SPLIT, M, E, bias_ptr, pos_ptr, scale, offs_r, r_ok,
                            BLOCK_E, TOPK, RENORM, SORT, ss_ptr, SS_SPLIT, H, eps, FIXED,
                            consts)
    offs_e = tl.arange(0, BLOCK_E)
    at = offs_r[:, None] * E + offs_e[None, :]
    ok = r_ok[:, None] & (offs_e[None, :] < E)
    tl.store(chosen_ptr + at, chosen, mask=ok)
    tl.store(weight_ptr + at, w, mask=ok)
    if arrive_last(arrival_ptr, M):
        offs_m = tl.arange(0, BLOCK_M)
        m_ok = offs_m < M
        every = offs_m[:, None] * E + offs_e[None, :]
        every_ok = m_ok[:, None] & (offs_e[None, :] < E)
        _route_slots(tl.load(chosen_ptr + every, mask=every_ok, other=0),
                     tl.load(weight_ptr + every, mask=every_ok, other=0.0), offs_m, m_ok, M,
                     slot_expert_ptr, slot_weight_ptr, slot_rank_ptr, num_slots_ptr, E, BLOCK_E)


@triton.jit
def _router_route_kernel(x_ptr, stride_xm, M, K, w_ptr, parts_ptr, E, k_chunk, arrival_ptr,
                         bias_ptr, pos_ptr, slot_expert_ptr, slot_weight_ptr, slot_rank_ptr,
                         num_slots_ptr, scale, SPLIT: tl.constexpr, BLOCK_M: tl.constexpr,
                         ROUTE_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         BLOCK_E: tl.constexpr, TOPK: tl.constexpr, RENORM: tl.constexpr,
                         INTERPRET: tl.constexpr, PDL: tl.constexpr, GEMV: tl.constexpr,
                         SORT: tl.constexpr, PREFETCH: tl.constexpr, TAIL: tl.constexpr):
    """The router's split-K bf16 GEMV (programs (tile, split)); with TAIL the last program to
    finish routes (route's task over the complete partials)."""
    tile = tl.program_id(0)
    split = tl.program_id(1)
    _bf16_linear_prefetch(tile, split, K, w_ptr, E, k_chunk, BLOCK_N, PDL and PREFETCH)
    stage_begin(PDL)
    _bf16_linear_task(tile, split, x_ptr, stride_xm, M, K, w_ptr, parts_ptr, E, k_chunk,
                      BLOCK_M, BLOCK_N, BLOCK_K, INTERPRET, GEMV)
    if TAIL:
        if arrive_last(arrival_ptr, tl.num_programs(0) * tl.num_programs(1)):
            _route_task(parts_ptr, SPLIT, M, E, bias_ptr, pos_ptr, slot_expert_ptr,
                        slot_weight_ptr, slot_rank_ptr, num_slots_ptr, scale, ROUTE_M, BLOCK_E,
                        TOPK, RENORM, SORT)


@triton.jit
def _fp8_tile_dot(a_ptr, stride_am, M, K, w_ptr, s_ptr, offs_n, N,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr,
                  GEMV: tl.constexpr, GROUPS: tl.constexpr, SWAP: tl.constexpr = False):
    """fp32 [BLOCK_M, BLOCK_N] = quant(a[M, K]) . W[offs_n, K]^T with both block scales, on
    the tensor cores (SWAP: transposed, fp8_linear.swap) or (GEMV, a few rows) as fp32
    multiply-and-sum in registers, GROUPS 128-column groups a step."""
    offs_m = tl.arange(0, BLOCK_M)
    n_ok = offs_n < N
    kblocks = tl.cdiv(K, 128)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if GEMV:
        rows = tl.arange(0, BLOCK_M)
        n_block = offs_n // 128  # one scale row: BLOCK_N divides 128
        for kb in range(0, kblocks, GROUPS):
            k = kb * 128 + tl.arange(0, GROUPS * 128)
            k_ok = k < K
            w = tl.load(w_ptr + offs_n[:, None] * K + k[None, :],
                        mask=n_ok[:, None] & k_ok[None, :], other=0.0).to(tl.float32)
            gi = kb + tl.arange(0, GROUPS)
            sw = tl.load(s_ptr + tl.min(n_block, axis=0) * kblocks + gi, mask=gi < kblocks,
                         other=0.0)
            for r in tl.static_range(BLOCK_M):
                a = tl.load(a_ptr + r * stride_am + k, mask=k_ok & (r < M), other=0.0)
                a = tl.reshape(a.to(tl.float32), (GROUPS, 128))
                sa = tl.maximum(tl.max(tl.abs(a), axis=1), 1e-10) / 448.0
                aq = to_e4m3(tl.clamp(a * (1.0 / sa)[:, None], -448.0, 448.0), INTERPRET)
                xs = tl.reshape(aq.to(tl.float32) * (sa * sw)[:, None], (GROUPS * 128,))
                acc += tl.where(rows[:, None] == r, tl.sum(w * xs[None, :], axis=1)[None, :],
                                0.0)
    else:
        offs_k = tl.arange(0, 128)
        if SWAP:  # the transposed MMA (fp8_linear.swap), its tile transposed once at the end
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for kb in range(0, kblocks):
            k = kb * 128 + offs_k
            k_ok = k < K
            w = tl.load(w_ptr + offs_n[:, None] * K + k[None, :],
                        mask=n_ok[:, None] & k_ok[None, :], other=0.0)
            a = tl.load(a_ptr + offs_m[:, None] * stride_am + k[None, :],
                        mask=(offs_m[:, None] < M) & k_ok[None, :], other=0.0).to(tl.float32)
            sa = tl.maximum(tl.max(tl.abs(a), axis=1), 1e-10) / 448.0
            aq = to_e4m3(tl.clamp(a * (1.0 / sa)[:, None], -448.0, 448.0), INTERPRET)
            sw = tl.load(s_ptr + (offs_n // 128) * kblocks + kb, mask=n_ok, other=0.0)
            acc += _scaled_dot(aq, sa, w, sw, INTERPRET, SWAP)
        if SWAP:
            acc = tl.trans(acc)
    return acc


@triton.jit
def _slot_entry(slot_expert_ptr, num_slots_ptr, slot):
    """(num_slots, the slot's expert id), both loads in flight together: the table holds an
    entry (stale past num_slots) for every program's slot, so a program does not wait for the
    count before it asks for its expert."""
    return tl.load(num_slots_ptr), tl.load(slot_expert_ptr + slot)


@triton.jit
def _expert_weights(e, E, q_ptr, s_ptr, q_stride_e, s_stride_e, shared_q_ptr, shared_s_ptr):
    """(e4m3 rows, scales) of expert e: the shared expert's (E) or routed e's."""
    shared = e == E
    routed = tl.where(shared, 0, e).to(tl.int64)
    return (tl.where(shared, shared_q_ptr, q_ptr + routed * q_stride_e),
            tl.where(shared, shared_s_ptr, s_ptr + routed * s_stride_e))


@triton.jit
def _gate_up_prefetch(tile, slot, split, K, I, sgq_ptr, suq_ptr, k_chunk,
                      BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    """The shared expert's slice (the routed experts are known only after route)."""
    if slot == 0:
        k0 = split * k_chunk * 128
        cols = tl.minimum(k_chunk * 128, K - k0)
        prefetch_rows(sgq_ptr, tile * BLOCK_N, BLOCK_N, I, K, k0, cols, PDL, BLOCK_N, 4)
        prefetch_rows(suq_ptr, tile * BLOCK_N, BLOCK_N, I, K, k0, cols, PDL, BLOCK_N, 4)


@triton.jit
def _gate_up_task(tile, slot, split, xq_ptr, sx_ptr, M, K, I, E, slot_expert_ptr, num_slots_ptr,
                  gq_ptr, gs_ptr, uq_ptr, us_ptr, q_stride_e, s_stride_e,
                  sgq_ptr, sgs_ptr, suq_ptr, sus_ptr, gu_dq, gu_ds, sgu_dq, sgu_ds, act_ptr,
                  gu_part_ptr, SLOTS, k_chunk,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
                  SPLIT_K: tl.constexpr, INTERPRET: tl.constexpr, GEMV: tl.constexpr,
                  SWAP: tl.constexpr = False, STACK: tl.constexpr = False,
                  SCALES: tl.constexpr = True, ss_ptr=None, SS_SPLIT: tl.constexpr = 0, eps=0.0):
    """gu_dq, gu_ds (sgu_*: the shared expert's): elements from a routed expert's gate rows
    (scales) to its up rows (``up_offsets``), for the STACK form. SS_SPLIT: x is the
    un-normed row's (``norm_router``), so the products are multiplied by each row's rstd."""
    n, e = _slot_entry(slot_expert_ptr, num_slots_ptr, slot)
    _gate_up_at(tile, slot, split, n, e, xq_ptr, sx_ptr, M, K, I, E, gq_ptr, gs_ptr, uq_ptr,
                us_ptr, q_stride_e, s_stride_e, sgq_ptr, sgs_ptr, suq_ptr, sus_ptr, gu_dq, gu_ds,
                sgu_dq, sgu_ds, act_ptr, gu_part_ptr, SLOTS, k_chunk, BLOCK_M, BLOCK_N, GROUPS,
                SPLIT_K, INTERPRET, GEMV, SWAP, STACK, SCALES, ss_ptr, SS_SPLIT, eps)


@triton.jit
def _gate_up_at(tile, slot, split, n, e, xq_ptr, sx_ptr, M, K, I, E, gq_ptr, gs_ptr, uq_ptr,
                us_ptr, q_stride_e, s_stride_e, sgq_ptr, sgs_ptr, suq_ptr, sus_ptr, gu_dq, gu_ds,
                sgu_dq, sgu_ds, act_ptr, gu_part_ptr, SLOTS, k_chunk, BLOCK_M: tl.constexpr,
                BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, SPLIT_K: tl.constexpr,
                INTERPRET: tl.constexpr, GEMV: tl.constexpr, SWAP: tl.constexpr,
                STACK: tl.constexpr, SCALES: tl.constexpr, ss_ptr=None,
                SS_SPLIT: tl.constexpr = 0, eps=0.0):
    """``_gate_up_task`` given the slot's entry (n slots, expert e)."""
    if slot < n:
        g_q, g_s = _expert_weights(e, E, gq_ptr, gs_ptr, q_stride_e, s_stride_e, sgq_ptr, sgs_ptr)
        u_q, u_s = _expert_weights(e, E, uq_ptr, us_ptr, q_stride_e, s_stride_e, suq_ptr, sus_ptr)
        _gate_up_tile(tile, slot, split, xq_ptr, sx_ptr, M, K, I, g_q, g_s, u_q, u_s,
                      tl.where(e == E, sgu_dq, gu_dq), tl.where(e == E, sgu_ds, gu_ds), act_ptr,
                      gu_part_ptr, SLOTS, k_chunk, BLOCK_M, BLOCK_N, GROUPS, SPLIT_K, INTERPRET,
                      GEMV, SWAP, STACK, SCALES, ss_ptr, SS_SPLIT, eps)


@triton.jit
def _stacked_scales(g_s, row_s, n_ok, sx_ptr, M, K, kb, kb_end, BLOCK_M: tl.constexpr,
                    GROUPS: tl.constexpr):
    """(stacked rows' scales, x's rows' scales) of the GROUPS groups from kb (clamped to
    kb_end - 1), a tuple."""
    offs_m = tl.arange(0, BLOCK_M)
    kblocks = tl.cdiv(K, 128)
    out = ()
    for j in tl.static_range(GROUPS):
        kk = tl.minimum(kb + j, kb_end - 1)
        out = out + ((tl.load(g_s + row_s + kk, mask=n_ok, other=0.0),
                      tl.load(sx_ptr + offs_m * kblocks + kk, mask=offs_m < M, other=0.0)),)
    return out


@triton.jit
def _stacked_dots(xq_ptr, sx_ptr, M, K, I, g_q, g_s, up_dq, up_ds, tile, kb0, kb_end,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUPS: tl.constexpr,
                  INTERPRET: tl.constexpr, SCALES: tl.constexpr = True):
    """(g, u), fp32 [BLOCK_M, BLOCK_N] each, of the K groups kb0..kb_end from one weight
    tile of 2 * BLOCK_N rows a group, gate and up interleaved (row 2c: column c's gate row,
    2c + 1 its up row), multiplied transposed (fp8_linear.swap): a 32-column tile becomes
    a 64-row MMA, wgmma's size, where gate and up apart would be two 32-row synchronous ones.
    Every row is one base pointer plus an offset (the up rows' is up_dq further), so the loads
    stay asynchronous copies."""
    r = tl.arange(0, 2 * BLOCK_N)
    col = tile * BLOCK_N + r // 2
    n_ok = col < I
    up = r % 2
    row_q = col * K + up * up_dq
    kblocks = tl.cdiv(K, 128)
    row_s = (col // 128) * kblocks + up * up_ds
    acc = tl.zeros((2 * BLOCK_N, BLOCK_M), dtype=tl.float32)
    if SCALES:  # each group's scales loaded an iteration ahead (fp8_linear.SCALES_AHEAD)
        sc = _stacked_scales(g_s, row_s, n_ok, sx_ptr, M, K, kb0, kb_end, BLOCK_M, GROUPS)
    for kb in range(kb0, kb_end, GROUPS):
        if SCALES:
            nxt = _stacked_scales(g_s, row_s, n_ok, sx_ptr, M, K, kb + GROUPS, kb_end, BLOCK_M,
                                  GROUPS)
        for j in tl.static_range(GROUPS):
            kk = tl.minimum(kb + j, kb_end - 1)
            k = kk * 128 + tl.arange(0, 128)
            k_ok = k < K
            w = tl.load(g_q + row_q[:, None] + k[None, :], mask=n_ok[:, None] & k_ok[None, :],
                        other=0.0)
            if SCALES:
                offs_m = tl.arange(0, BLOCK_M)
                x = tl.load(xq_ptr + offs_m[:, None] * K + k[None, :],
                            mask=(offs_m[:, None] < M) & k_ok[None, :], other=0.0)
                sw, sx = sc[j]
            else:
                sw = tl.load(g_s + row_s + kk, mask=n_ok, other=0.0)
                x, sx = group_x(xq_ptr, sx_ptr, M, K, kk, BLOCK_M)
            acc += _scaled_dot(x, sx, w, sw, INTERPRET, True) * (kb + j < kb_end).to(tl.float32)
        if SCALES:
            sc = nxt
    g, u = tl.split(tl.reshape(tl.trans(acc), (BLOCK_M, BLOCK_N, 2)))
    return g, u


@triton.jit
def _gate_up_tile(tile, slot, split, xq_ptr, sx_ptr, M, K, I, g_q, g_s, u_q, u_s, up_dq, up_ds,
                  act_ptr, gu_part_ptr, SLOTS, k_chunk, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, SPLIT_K: tl.constexpr,
                  INTERPRET: tl.constexpr, GEMV: tl.constexpr, SWAP: tl.constexpr,
                  STACK: tl.constexpr, SCALES: tl.constexpr = True, ss_ptr=None,
                  SS_SPLIT: tl.constexpr = 0, eps=0.0):
    """Program (tile, slot, split) of gate/up given its expert's weights (SWAP: the MMAs
    transposed, fp8_linear.swap; STACK: gate and up as one transposed MMA, ``_stacked_dots``,
    the up rows up_dq elements and their scales up_ds past the gate's; SS_SPLIT: each row's
    products times its rstd, ``_gate_up_task``)."""
    offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    kb0 = split * k_chunk
    kb_end = tl.minimum(kb0 + k_chunk, tl.cdiv(K, 128))
    if GEMV:  # a step's GROUPS groups of both matrices as two loads, in flight together
        n_ok = offs_n < I
        k_end = tl.minimum(kb_end * 128, K)
        n_block = tile * BLOCK_N // 128
        for kb in range(kb0, kb_end, GROUPS):
            k = kb * 128 + tl.arange(0, GROUPS * 128)
            k_ok = k < k_end
            at = offs_n[:, None] * K + k[None, :]
            w_ok = n_ok[:, None] & k_ok[None, :]
            wg = tl.load(g_q + at, mask=w_ok, other=0.0)
            wu = tl.load(u_q + at, mask=w_ok, other=0.0)
            g = _gemv_step(g, wg, xq_ptr, sx_ptr, M, K, g_s, n_block, k, k_ok, BLOCK_M)
            u = _gemv_step(u, wu, xq_ptr, sx_ptr, M, K, u_s, n_block, k, k_ok, BLOCK_M)
    elif STACK:
        g, u = _stacked_dots(xq_ptr, sx_ptr, M, K, I, g_q, g_s, up_dq, up_ds, tile, kb0, kb_end,
                             BLOCK_M, BLOCK_N, GROUPS, INTERPRET, SCALES)
    else:
        if SWAP:
            g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            u = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        if SCALES:  # each group's scales loaded an iteration ahead (fp8_linear.SCALES_AHEAD)
            sg = step_scales(g_s, offs_n, I, K, kb0, kb_end, sx_ptr, M, BLOCK_M, GROUPS)
            su = step_scales(u_s, offs_n, I, K, kb0, kb_end, sx_ptr, M, BLOCK_M, GROUPS)
        for kb in range(kb0, kb_end, GROUPS):
            if SCALES:
                ng = step_scales(g_s, offs_n, I, K, kb + GROUPS, kb_end, sx_ptr, M, BLOCK_M,
                                 GROUPS)
                nu = step_scales(u_s, offs_n, I, K, kb + GROUPS, kb_end, sx_ptr, M, BLOCK_M,
                                 GROUPS)
            for j in tl.static_range(GROUPS):
                kk = tl.minimum(kb + j, kb_end - 1)
                on = (kb + j < kb_end).to(tl.float32)
                if SCALES:
                    wg, x = group_tiles(xq_ptr, M, K, g_q, offs_n, I, kk, BLOCK_M)
                    wu, xu = group_tiles(xq_ptr, M, K, u_q, offs_n, I, kk, BLOCK_M)
                    g += _scaled_dot(x, sg[j][1], wg, sg[j][0], INTERPRET, SWAP) * on
                    u += _scaled_dot(xu, su[j][1], wu, su[j][0], INTERPRET, SWAP) * on
                else:
                    g += _fp8_group_dot(xq_ptr, sx_ptr, M, K, g_q, g_s, offs_n, I, kk, BLOCK_M,
                                        INTERPRET, SWAP) * on
                    u += _fp8_group_dot(xq_ptr, sx_ptr, M, K, u_q, u_s, offs_n, I, kk, BLOCK_M,
                                        INTERPRET, SWAP) * on
            if SCALES:
                sg = ng
                su = nu
        if SWAP:
            g = tl.trans(g)
            u = tl.trans(u)
    if SS_SPLIT > 0:
        rs = rstd_rows(ss_ptr, SS_SPLIT, M, K, eps, offs_m, offs_m < M)[:, None]
        g = g * rs
        u = u * rs
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < I)
    if SPLIT_K == 1:
        tl.store(act_ptr + (slot * M + offs_m[:, None]) * I + offs_n[None, :],
                 _swiglu(g, u), mask=mask)
    else:  # [SPLIT_K, SLOTS, M, 2, I] fp32 partials, finished by _swiglu_kernel
        part = gu_part_ptr + (((split * SLOTS + slot) * M + offs_m[:, None]) * 2) * I
        tl.store(part + offs_n[None, :], g, mask=mask)
        tl.store(part + I + offs_n[None, :], u, mask=mask)


@triton.jit
def _gate_up_kernel(xq_ptr, sx_ptr, M, K, I, E, slot_expert_ptr, num_slots_ptr,
                    gq_ptr, gs_ptr, uq_ptr, us_ptr, q_stride_e, s_stride_e,
                    sgq_ptr, sgs_ptr, suq_ptr, sus_ptr, gu_dq, gu_ds, sgu_dq, sgu_ds, act_ptr,
                    gu_part_ptr, SLOTS, k_chunk, arrivals_ptr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, SPLIT_K: tl.constexpr,
                    INTERPRET: tl.constexpr, PDL: tl.constexpr, TAIL: tl.constexpr,
                    GEMV: tl.constexpr, SHARED_EARLY: tl.constexpr, SWAP: tl.constexpr,
                    STACK: tl.constexpr, SCALES: tl.constexpr, PREFETCH: tl.constexpr,
                    r_parts_ptr, r_bias_ptr, r_pos_ptr, r_scale, slot_weight_ptr, slot_rank_ptr,
                    ROUTE: tl.constexpr = False, R_SPLIT: tl.constexpr = 1,
                    R_BLOCK_M: tl.constexpr = 2, BLOCK_E: tl.constexpr = 2,
                    TOPK: tl.constexpr = 1, RENORM: tl.constexpr = False,
                    SORT: tl.constexpr = False, ready_ptr=None, READY: tl.constexpr = False,
                    ss_ptr=None, SS_SPLIT: tl.constexpr = 0, eps=0.0,
                    CONSTS_EARLY: tl.constexpr = False):
    """PREFETCH: the shared expert's programs prefetch their tile into L2 before their wait
    (overlap.PREFETCH_OFF). ROUTE: the routed programs route every row themselves from the
    router's partials (r_*, ``_routed_slot``) instead of reading route's slot table, and
    program (0, 1, 0) writes that table (for down's table form and the host's reads);
    CONSTS_EARLY: with the bias and positions loaded before the wait (ROUTE_CONSTS_EARLY).
    READY (not with ROUTE): each (tile, slot) of the slot list counts on ready[slot] once its
    activations are stored (the program itself, or its last K chunk's tail), for down's slot
    waits (DOWN_SLOT_WAIT_FROM_ROWS)."""
    tile = tl.program_id(0)
    slot = tl.program_id(1)
    split = tl.program_id(2)
    if SHARED_EARLY and slot == 0:
        # slot 0 is always the shared expert (no slot table needed) and x comes from the norm
        # two kernels back, so its programs multiply before the wait (overlap's rule 1;
        # nothing running reads or writes their outputs)
        _gate_up_tile(tile, 0, split, xq_ptr, sx_ptr, M, K, I, sgq_ptr, sgs_ptr, suq_ptr,
                      sus_ptr, sgu_dq, sgu_ds, act_ptr, gu_part_ptr, SLOTS, k_chunk, BLOCK_M,
                      BLOCK_N, GROUPS, SPLIT_K, INTERPRET, GEMV, SWAP, STACK, SCALES, ss_ptr,
                      SS_SPLIT, eps)
        stage_begin(PDL)
        n = slot + 1  # (ROUTE's tail) the shared slot is always in the list
    else:
        _gate_up_prefetch(tile, slot, split, K, I, sgq_ptr, suq_ptr, k_chunk, BLOCK_N,
                          PDL and PREFETCH)
        consts = None
        if ROUTE and CONSTS_EARLY:
            offs_c = tl.arange(0, R_BLOCK_M)
            consts = _route_consts(r_bias_ptr, r_pos_ptr, E, offs_c, offs_c < M, BLOCK_E)
        stage_begin(PDL)
        if ROUTE:
            n, e, chosen, w = _routed_slot(r_parts_ptr, R_SPLIT, M, E, r_bias_ptr, r_pos_ptr,
                                           r_scale, slot, R_BLOCK_M, BLOCK_E, TOPK, RENORM,
                                           SORT, ss_ptr, SS_SPLIT, K, eps, consts)
            if (tile == 0) & (slot == 1) & (split == 0):
                offs_r = tl.arange(0, R_BLOCK_M)
                _route_slots(chosen, w, offs_r, offs_r < M, M, slot_expert_ptr, slot_weight_ptr,
                             slot_rank_ptr, num_slots_ptr, E, BLOCK_E)
            _gate_up_at(tile, slot, split, n, e, xq_ptr, sx_ptr, M, K, I, E, gq_ptr, gs_ptr,
                        uq_ptr, us_ptr, q_stride_e, s_stride_e, sgq_ptr, sgs_ptr, suq_ptr,
                        sus_ptr, gu_dq, gu_ds, sgu_dq, sgu_ds, act_ptr, gu_part_ptr, SLOTS,
                        k_chunk, BLOCK_M, BLOCK_N, GROUPS, SPLIT_K, INTERPRET, GEMV, SWAP, STACK,
                        SCALES, ss_ptr, SS_SPLIT, eps)
        else:
            n, e = _slot_entry(slot_expert_ptr, num_slots_ptr, slot)
            _gate_up_at(tile, slot, split, n, e, xq_ptr, sx_ptr, M, K, I, E, gq_ptr, gs_ptr,
                        uq_ptr, us_ptr, q_stride_e, s_stride_e, sgq_ptr, sgs_ptr, suq_ptr,
                        sus_ptr, gu_dq, gu_ds, sgu_dq, sgu_ds, act_ptr, gu_part_ptr, SLOTS,
                        k_chunk, BLOCK_M, BLOCK_N, GROUPS, SPLIT_K, INTERPRET, GEMV, SWAP, STACK,
                        SCALES, ss_ptr, SS_SPLIT, eps)
    if TAIL:  # the last K chunk of (tile, slot) to finish sums the chunks and applies SwiGLU
        if ROUTE:
            # every program of a (tile, slot) routed alike: a slot past the list counts none
            if slot < n:
                if arrive_last(arrivals_ptr + slot * tl.num_programs(0) + tile, SPLIT_K):
                    _swiglu_at(slot, tile, n, gu_part_ptr, act_ptr, M, I, SLOTS, SPLIT_K,
                               BLOCK_M, BLOCK_N)
        else:
            if arrive_last(arrivals_ptr + slot * tl.num_programs(0) + tile, SPLIT_K):
                _swiglu_task(slot, tile, gu_part_ptr, num_slots_ptr, act_ptr, M, I, SLOTS,
                             SPLIT_K, BLOCK_M, BLOCK_N)
                if READY:
                    _count_ready(ready_ptr, slot, n)
    elif READY:  # one K chunk: this program stored its activations
        _count_ready(ready_ptr, slot, n)


@triton.jit
def _count_ready(ready_ptr, slot, n):
    """Count a (tile, slot)'s stored activations for down's slot waits, only for a slot in
    the list: down waits for every such count before it ends, so none lands after the terms'
    sum has zeroed the counters. (down skips the programmatic wait, so its end does not imply
    gate/up's: a slot past the list, counted by a late program, would start the next step's
    count at one.)"""
    if slot < n:
        arrive(ready_ptr + slot)


@triton.jit
def _swiglu(g, u):
    """SiLU(g) * u with g and u first rounded to bf16 (the GEMMs' outputs), bf16 out."""
    g = g.to(tl.bfloat16).to(tl.float32)
    u = u.to(tl.bfloat16).to(tl.float32)
    return (g / (1.0 + tl.exp(-g)) * u).to(tl.bfloat16)


@triton.jit
def _swiglu_task(slot, it, gu_part_ptr, num_slots_ptr, act_ptr, M, I, SLOTS,
                 SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr):
    """Program (slot, BLOCK_I columns): the split-K partials summed in order, then SwiGLU."""
    _swiglu_at(slot, it, tl.load(num_slots_ptr), gu_part_ptr, act_ptr, M, I, SLOTS, SPLIT_K,
               BLOCK_M, BLOCK_I)


@triton.jit
def _swiglu_at(slot, it, n, gu_part_ptr, act_ptr, M, I, SLOTS, SPLIT_K: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr):
    """``_swiglu_task`` given the slot count n."""
    if slot < n:
        offs_m = tl.arange(0, BLOCK_M)
        offs_i = it * BLOCK_I + tl.arange(0, BLOCK_I)
        mask = (offs_m[:, None] < M) & (offs_i[None, :] < I)
        row = ((slot * M + offs_m[:, None]) * 2) * I + offs_i[None, :]
        stride = SLOTS * M * 2 * I
        g = sum_parts(gu_part_ptr, SPLIT_K, stride, row, mask)
        u = sum_parts(gu_part_ptr, SPLIT_K, stride, row + I, mask)
        tl.store(act_ptr + (slot * M + offs_m[:, None]) * I + offs_i[None, :], _swiglu(g, u),
                 mask=mask)


@triton.jit
def _swiglu_kernel(gu_part_ptr, num_slots_ptr, act_ptr, M, I, SLOTS, SPLIT_K: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr, PDL: tl.constexpr):
    stage_begin(PDL)
    _swiglu_task(tl.program_id(0), tl.program_id(1), gu_part_ptr, num_slots_ptr, act_ptr, M, I,
                 SLOTS, SPLIT_K, BLOCK_M, BLOCK_I)


@triton.jit
def _down_prefetch(tile, slot, H, I, E, slot_expert_ptr, num_slots_ptr, dq_ptr, q_stride_e,
                   sdq_ptr, BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    """The slot's expert rows of the tile (the slot table must be complete already)."""
    if PDL:
        n, e = _slot_entry(slot_expert_ptr, num_slots_ptr, slot)
        _down_prefetch_at(tile, slot, n, e, H, I, E, dq_ptr, q_stride_e, sdq_ptr, BLOCK_N, PDL)


@triton.jit
def _down_prefetch_at(tile, slot, n, e, H, I, E, dq_ptr, q_stride_e, sdq_ptr,
                      BLOCK_N: tl.constexpr, PDL: tl.constexpr):
    """``_down_prefetch`` given the slot's entry (n slots, expert e)."""
    if PDL:
        if slot < n:
            pe = tl.minimum(tl.maximum(e, 0), E)
            pq = tl.where(pe == E, sdq_ptr, dq_ptr + tl.where(pe == E, 0, pe).to(tl.int64) * q_stride_e)
            prefetch_rows(pq, tile * BLOCK_N, BLOCK_N, H, I, 0, I, PDL, BLOCK_N, 2)


@triton.jit
def _down_rows(slot, M, slot_weight_ptr, slot_rank_ptr, BLOCK_M: tl.constexpr):
    """(weight, rank) of each row for the slot's expert (weight 1 for the shared one, rank -1
    where the row did not choose it)."""
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    return (tl.load(slot_weight_ptr + slot * M + offs_m, mask=m_ok, other=0.0),
            tl.load(slot_rank_ptr + slot * M + offs_m, mask=m_ok, other=-1))


@triton.jit
def _down_task(tile, slot, act_ptr, M, I, H, E, slot_expert_ptr, slot_weight_ptr, slot_rank_ptr,
               num_slots_ptr, dq_ptr, ds_ptr, q_stride_e, s_stride_e, sdq_ptr, sds_ptr,
               terms_ptr, TERMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
               INTERPRET: tl.constexpr, GEMV: tl.constexpr, GROUPS: tl.constexpr,
               SWAP: tl.constexpr = False):
    """Program (tile, slot): term = bf16(weight * act_slot D_e^T) for the rows that chose the
    slot's expert, stored at terms[row, rank of the expert in the row]."""
    n, e = _slot_entry(slot_expert_ptr, num_slots_ptr, slot)
    w, rank = _down_rows(slot, M, slot_weight_ptr, slot_rank_ptr, BLOCK_M)
    _down_slot(tile, slot, n, e, w, rank, act_ptr, M, I, H, E, dq_ptr, ds_ptr, q_stride_e,
               s_stride_e, sdq_ptr, sds_ptr, terms_ptr, TERMS, BLOCK_M, BLOCK_N, INTERPRET,
               GEMV, GROUPS, SWAP)


@triton.jit
def _down_slot(tile, slot, n, e, w, rank, act_ptr, M, I, H, E, dq_ptr, ds_ptr, q_stride_e,
               s_stride_e, sdq_ptr, sds_ptr, terms_ptr, TERMS: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INTERPRET: tl.constexpr,
               GEMV: tl.constexpr, GROUPS: tl.constexpr, SWAP: tl.constexpr):
    """``_down_task`` given the slot's entry (n slots, expert e) and its rows' (w, rank)."""
    if slot < n:
        d_q, d_s = _expert_weights(e, E, dq_ptr, ds_ptr, q_stride_e, s_stride_e, sdq_ptr, sds_ptr)
        offs_m = tl.arange(0, BLOCK_M)
        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        m_ok = offs_m < M
        y = _fp8_tile_dot(act_ptr + slot * M * I, I, M, I, d_q, d_s, offs_n, H, BLOCK_M, BLOCK_N,
                          INTERPRET, GEMV, GROUPS, SWAP)
        keep = m_ok & (rank >= 0)
        dst = terms_ptr + ((offs_m * TERMS + tl.maximum(rank, 0)) * H)[:, None] + offs_n[None, :]
        tl.store(dst, (w[:, None] * y).to(tl.bfloat16), mask=keep[:, None] & (offs_n[None, :] < H))


@triton.jit
def _down_kernel(act_ptr, M, I, H, E, slot_expert_ptr, slot_weight_ptr, slot_rank_ptr,
                 num_slots_ptr, dq_ptr, ds_ptr, q_stride_e, s_stride_e, sdq_ptr, sds_ptr,
                 terms_ptr, TERMS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 INTERPRET: tl.constexpr, PDL: tl.constexpr, GEMV: tl.constexpr,
                 GROUPS: tl.constexpr, SWAP: tl.constexpr, TABLE_EARLY: tl.constexpr,
                 PREFETCH: tl.constexpr, ready_ptr=None, failed_ptr=None, ready_target=0,
                 SLOT_WAIT: tl.constexpr = False, DEPENDENTS: tl.constexpr = False,
                 WAIT_POLLS: tl.constexpr = 1):
    """PREFETCH: the program prefetches its weight tile into L2 before its wait
    (overlap.PREFETCH_OFF). SLOT_WAIT: instead of the programmatic wait (for all of gate/up),
    wait until ready[slot] holds ready_target (gate/up's tiles of the slot, each counted once
    its activations are stored), giving up after WAIT_POLLS polls with the failure word set;
    then let the next kernel launch (DEPENDENTS)."""
    tile = tl.program_id(0)
    slot = tl.program_id(1)
    if SLOT_WAIT:
        # the table was written by route, two kernels back (complete: gate/up passed its wait
        # before it let this launch start)
        n, e = _slot_entry(slot_expert_ptr, num_slots_ptr, slot)
        w, rank = _down_rows(slot, M, slot_weight_ptr, slot_rank_ptr, BLOCK_M)
        if slot < n:
            wait_bounded(ready_ptr + slot, ready_target, failed_ptr, WAIT_POLLS, False, "gpu")
        tl.debug_barrier()
        launch_dependents(DEPENDENTS)
        _down_slot(tile, slot, n, e, w, rank, act_ptr, M, I, H, E, dq_ptr, ds_ptr, q_stride_e,
                   s_stride_e, sdq_ptr, sds_ptr, terms_ptr, TERMS, BLOCK_M, BLOCK_N, INTERPRET,
                   GEMV, GROUPS, SWAP)
    elif TABLE_EARLY:
        # the slot table, weights and ranks were written by route, two kernels back: read
        # before the wait (overlap's rule 1), so the multiply starts at the activations
        n, e = _slot_entry(slot_expert_ptr, num_slots_ptr, slot)
        w, rank = _down_rows(slot, M, slot_weight_ptr, slot_rank_ptr, BLOCK_M)
        _down_prefetch_at(tile, slot, n, e, H, I, E, dq_ptr, q_stride_e, sdq_ptr, BLOCK_N,
                          PDL and PREFETCH)
        stage_begin(PDL)
        _down_slot(tile, slot, n, e, w, rank, act_ptr, M, I, H, E, dq_ptr, ds_ptr, q_stride_e,
                   s_stride_e, sdq_ptr, sds_ptr, terms_ptr, TERMS, BLOCK_M, BLOCK_N, INTERPRET,
                   GEMV, GROUPS, SWAP)
    else:
        _down_prefetch(tile, slot, H, I, E, slot_expert_ptr, num_slots_ptr, dq_ptr, q_stride_e,
                       sdq_ptr, BLOCK_N, PDL and PREFETCH)
        stage_begin(PDL)
        _down_task(tile, slot, act_ptr, M, I, H, E, slot_expert_ptr, slot_weight_ptr,
                   slot_rank_ptr, num_slots_ptr, dq_ptr, ds_ptr, q_stride_e, s_stride_e,
                   sdq_ptr, sds_ptr, terms_ptr, TERMS, BLOCK_M, BLOCK_N, INTERPRET, GEMV,
                   GROUPS, SWAP)


@triton.jit
def _sum_terms_task(m, ht, terms_ptr, pos_ptr, out_ptr, H, TERMS: tl.constexpr,
                    BLOCK: tl.constexpr):
    """out[row] = bf16 of the fp32 sum of the row's terms in order (shared, then experts
    ascending); a pad row has only its shared term."""
    _sum_terms_at(m, ht, tl.load(pos_ptr + m), terms_ptr, out_ptr, H, TERMS, BLOCK)


@triton.jit
def _sum_terms_at(m, ht, pos, terms_ptr, out_ptr, H, TERMS: tl.constexpr, BLOCK: tl.constexpr):
    """``_sum_terms_task`` given the row's position (pos < 0: a pad row)."""
    offs = ht * BLOCK + tl.arange(0, BLOCK)
    ok = offs < H
    n_terms = tl.where(pos >= 0, TERMS, 1)
    acc = tl.zeros((BLOCK,), tl.float32)
    for j in tl.static_range(TERMS):
        acc += tl.load(terms_ptr + (m * TERMS + j) * H + offs, mask=ok & (j < n_terms),
                       other=0.0).to(tl.float32)
    tl.store(out_ptr + m * H + offs, acc.to(tl.bfloat16), mask=ok)


@triton.jit
def _sum_terms_kernel(terms_ptr, pos_ptr, out_ptr, H, TERMS: tl.constexpr, BLOCK: tl.constexpr,
                      PDL: tl.constexpr, POS_EARLY: tl.constexpr, clear_ptr=None, n_clear=0,
                      CLEAR_BLOCK: tl.constexpr = 0, attn_ptr=None, res_ptr=None,
                      RES: tl.constexpr = False):
    """CLEAR_BLOCK: program (0, 0) zeroes clear[:n_clear] after its wait (down, the kernel
    before, has then finished with them: its slot counters). RES: the programs first write
    the layer's post-attention residual, res = bf16(attn + res) over their columns, which
    ``norm_router`` read without writing: before the wait, as both were written kernels
    back and nothing in flight reads them."""
    if RES:  # (names of its own: a Triton if may not retype a name the other defines)
        r_cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        r_at = tl.program_id(0) * H + r_cols
        r_ok = r_cols < H
        r_sum = tl.load(attn_ptr + r_at, mask=r_ok, other=0.0).to(tl.float32) \
            + tl.load(res_ptr + r_at, mask=r_ok, other=0.0).to(tl.float32)
        tl.store(res_ptr + r_at, r_sum.to(tl.bfloat16), mask=r_ok)
    if POS_EARLY:  # SUM_POS_EARLY
        pos = tl.load(pos_ptr + tl.program_id(0))
        stage_begin(PDL)
        _sum_terms_at(tl.program_id(0), tl.program_id(1), pos, terms_ptr, out_ptr, H, TERMS,
                      BLOCK)
    else:
        stage_begin(PDL)
        _sum_terms_task(tl.program_id(0), tl.program_id(1), terms_ptr, pos_ptr, out_ptr, H,
                        TERMS, BLOCK)
    if CLEAR_BLOCK > 0:
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            offs = tl.arange(0, CLEAR_BLOCK)
            tl.store(clear_ptr + offs, tl.zeros((CLEAR_BLOCK,), tl.int32), mask=offs < n_clear)


# rows up to which the router's GEMV and route are one launch (on an H200 the tail saves
# 0.5-1.5 us of a MoE layer at 1-2 rows and costs 16 us at 4: tiling_probe_20261130T144611Z).
# Tried above them: the router's launch routing too, its last M programs a row each once every
# program had arrived (a spin on the arrival counter), the last row building the slot list
# (code at 302b36c). Bitwise route's launch, but on an H200 0.6-1.3 us slower a layer at 3-8
# rows and the same at 12-16 (tiling_probe_20261203T071854Z): route's own launch,
# programmatically dependent, costs less than the spin (chain_probe: flags against pdl).
ROUTE_TAIL_MAX_ROWS = 2
# whether route's top-k is one bitonic top-k of (value, expert) keys (``_top_by_sort``: the
# same choice) rather than TOPK argmax passes, each a reduction across the program's warps
# (37 barriers instead of 58 in the one-launch router + route at one row, sm_90a). On an
# H200 a MoE layer is 1.0-1.1 us faster at 1-2 and 8-16 rows, 2.2 at 4; with it the router's
# tail routing up to 16 rows (one launch fewer from 3 rows) is 3.7-9.2 us slower at 8-16
# rows, the same at 1-4 (tiling_probe_20261202T033306Z: route_sort*, route_tail_16)
ROUTE_SORT = True
# whether routing (route's launches, and gate/up's routed programs where they route) loads
# the experts' bias and the rows' positions before its wait, beside the router's partials
# after it (a weight and the step's input, the bias from HBM). On an H100 -0.1..-0.5 us a MoE
# layer at 1-16 rows in two probes (tiling_probe_20261207T132839Z, T133255Z)
ROUTE_CONSTS_EARLY = overlap.weights_early(True)
# warps of the route kernel (0: 4 up to 4 rows, 16 above). On an H200 fewer warps are within
# noise at 1-2 rows and much slower with more rows (4 warps at 16 rows: +22 us of a MoE layer;
# tiling_probe_20261130T145619Z): its top-k is eight argmax reductions over [rows, experts].
ROUTE_WARPS = 0
# Tried: the post-attention add+RMSNorm applied by the router's programs at 1-2 rows of a MoE
# layer, each norming its own K slice of every row after reading the row whole for its rms
# (one launch fewer; code at b6b2174). Slower on an H200: +1.5..2.0 us a layer at one row,
# +0.4..0.9 at two (results/tiling_probe_20261201T134329Z: baseline there is the fold,
# norm_kernel the separate kernel).
ROUTER_ROUTE_WARPS = 4  # warps of the one-launch router + route (1-2 within noise, same run)
# (since gate/up routes at 1-4 rows that launch is the GEMV alone there: 2 warps +0.1..+1.4 us
# a MoE layer at 1-2 rows, 8 warps -0.3..+0.3, noise 0.1-1.0; tiling_probe_20261203T222937Z)
# its warps from 3 rows (with ROUTE_TAIL_MAX_ROWS above 2): ptxas holds the sort's [16, 256]
# int64 keys in 153 registers at 8 warps, 255 and 32 B spilled at 4 (CPU compile, Triton 3.6)
ROUTER_ROUTE_WARPS_ABOVE_2 = 8
# Tried: at 1-2 rows of a MoE layer, down summing gate/up's split-K partials and applying
# SwiGLU as it loads its activations, gate/up writing no act (bitwise the same, GPU test
# passed at 43377e4, code there). On an H200 3.3-4.9 us slower a layer at 1-2 rows
# (tiling_probe_20261203T095905Z: swiglu_tail is the tail): ~860 down programs each summed 8
# partial rows where ~70 tails did, with loads that no longer overlap the weights'.
# whether gate/up's SwiGLU runs as a last-arrival tail when given counters (the second kernel
# otherwise; 1-2 us of a MoE layer at 1-2 rows, the same run). Down's sum as a tail saved
# nothing at 1-2 rows and cost 12 us at 16 (the same run): it stays a kernel.
# Tried again as a tail a column tile (code at 0231cb9): each tile's last slot program to
# arrive summed that tile of every row in the sum kernel's order, the last of those tails
# zeroing the slot counters, so down was the MoE's last launch. Bitwise the sum kernel on an
# H100 at 1/3/16 rows, graph replay too (results/pytest_sum_tail_0231cb9.log), but slower on
# every kind at every row count: a MoE layer +3.0 / +1.4 / +1.6 / +1.3 / +1.4 / +2.3 us at
# 1 / 2 / 4 / 8 / 12 / 16 rows, with the indexer +1.1..+1.8, dense +0.2..+0.9 (noise 0.0-0.8;
# tiling_probe_20261205T175200Z): every one of down's programs then ends on an acq_rel
# arrival (a fence behind its stores), where the sum kernel, launched before down ends, costs
# only its own short wait and loads.
SWIGLU_TAIL = True
# rows from which route runs one program per row (then the last to finish builds the slot
# list) when given the scratch, rather than one program for every row: on an H200 5 us faster
# per MoE layer at 16 rows, 0.5 at 4 (tiling_probe_20261130T150549Z); with ROUTE_SORT the
# one program is still 3.9 / 7.3 us slower at 8 / 16 rows (tiling_probe_20261202T034507Z)
ROUTE_PER_ROW_MIN_ROWS = 3
# warps of that one-program-per-row form (its last program also builds the slot list); with
# ROUTE_SORT 1 or 2 are 0.3-13 us slower a MoE layer at 4-16 rows (the same run)
ROUTE_PER_ROW_WARPS = 4  # 8: -1.2..+0.8 us at 4-16 rows, mixed (T223138Z)
# the fewest rows of a routing tile ([rows, experts]: route's one program a row, gate/up's
# routing): 1 sorts one row's 256 keys where 2 sorted a masked-off row's too. On an H200 a
# MoE layer is 0.6-1.2 us faster at one row, 0.1-0.5 at 8-16 (results/tiling_probe_
# 20261203T225101Z, T230013Z: route_rows_tile_2). Needs _route_rows' fixed-point sum: with
# a float sum the one-row tiles' reduction tree changed the weights' last bit against gate/up's
# [rows, E] routing at 4 and 16 rows (results/pytest_tile_b529cda.log).
ROUTE_ROW_TILE_MIN = 1


# rows up to which a MoE layer's gate/up routes every row itself from the router's partials
# (``Routing``: each routed program sums the partials and takes the top-k as route does, then
# finds its slot's expert), so the router's launch ends with its GEMV (no last-arrival tail);
# gate/up's program (0, 1, 0) writes the slot table, which down (the next kernel) reads after
# its wait. On an H200: -1.5 / -0.6 us a MoE layer at 1 / 2 rows, -1.0 / -0.8 with the
# indexer (results/tiling_probe_20261203T204221Z, two arms each: route_in_gate_up_2); up to 4
# rows another -0.5..-0.8 / -0.4..-0.5 us at 3 rows, -0.1..-0.3 / -0.2..-0.3 at 4
# (T222937Z: route_in_gate_up_3 and _4 against 2, noise 0.2-0.8; T204933Z: -0.4 / -0.2),
# where gate/up's 264 programs are one wave (32 columns, no split K); to 6 or 8 rows +6.6..+10.1
# us at 6-8 rows (T224116Z: several waves of programs sorting [rows, 256]). Since down waits
# per slot (DOWN_SLOT_WAIT_FROM_ROWS, which needs route's table) only up to 2: at 3-4 rows
# route's launch and the slot waits are 0.2-0.9 us faster (H100, tiling_probe_20261205T145632Z).
# Tried:
# down routing too, before its wait (the partials are two kernels back): +2.4..+3.5 us at
# 1-2 rows, its ~860 programs sorting in several waves; from 4 rows +16 / +98 / +700 us at
# 4 / 8 / 16 (T203713Z: the baseline there routed in both up to 2 rows; code at f6299a0).
# 0: the router's tail or route's launch at every row count.
ROUTE_IN_GATE_UP_MAX_ROWS = 2
# Tried there (code at aa0cb49): the routed programs asking L2 for their whole K chunk of gate
# and up rows as soon as they know their expert (two bulk requests a row, where the pipeline
# asks two steps ahead), and/or every program asking for an equal share of its expert's down
# rows so that down, the next kernel, finds them in L2. Bitwise the plain form on an H200
# (results/pytest_prefetch_aa0cb49.log), but slower a MoE layer at 1 / 2 / 4 rows: the chunk
# +2.3 / +3.6 / +7.1 us, down's rows +4.6 / +6.4 / +12.0, both +5.4 / +10.8 / +18.5 (noise
# 0.2-1.0; tiling_probe_20261205T130958Z). Even bytes the critical path loads next, asked of
# L2 ahead, cost more than they save here, as the region tables did (overlap.LAYER_PREFETCH).
# Tried from 3 rows: route's one program a row without its slot list (no last-arrival tail),
# each row's program writing its weights and ranks by expert ([M, E]) and flagging the experts
# it chose, gate/up and down finding their slot's expert from the 256 flags by a prefix count,
# the terms' sum clearing the flags. Bitwise the slot table on an H200 at 3/4/12/16 rows
# (results/pytest_route_flags_743ff9e.log; code at 743ff9e), but slower: +0.2..+0.8 us a MoE
# layer at 3-12 rows, +3.0 at 16 (tiling_probe_20261203T211238Z, route_flags_off is the form
# here): the prefix count is a cross-warp scan in each of gate/up's and down's thousands of
# programs, where the tail counts once.
# Tried again with the experts as bits: each row's program ORing its choice into ceil(E / 32)
# int32 words, gate/up's and down's programs finding their slot's expert by scalar bit counts
# (SWAR popcounts and a binary search: no scan, no barrier). Bitwise the slot table on an H200
# at 5/8/12/16 rows (results/pytest_route_bits_83c9500.log; code at 83c9500), but no faster:
# from 5 rows -0.1..+0.8 us a layer at 5-8 rows and +2.4..+7.5 at 12-16; from 3 rows
# with gate/up routing only up to 2, -0.3..-0.4 at 3-4 rows (tiling_probe_20261204T032805Z:
# route_bits_5, route_bits_3_gate_up_2). Each of down's ~4,800 programs at 16 rows still
# runs a few hundred integer instructions a thread before its loads, against two loads of
# the table: route's one-program tail is the cheaper place to count.


def route(router_parts: torch.Tensor, bias: torch.Tensor, positions: torch.Tensor, topk: int,
          scale: float, renorm: bool, slot_expert: torch.Tensor, slot_weight: torch.Tensor,
          slot_rank: torch.Tensor, num_slots: torch.Tensor, scratch=None, ss=None,
          hidden: int = 1, eps: float = 0.0) -> None:
    """router_parts fp32 [SPLIT, M, E] (or int64 [M, E] sums in 2^-32 units, which route
    reads and leaves at zero: ``norm_router.fixed``, the per-row form only); writes
    slot_expert int32 [>= M*topk+1], slot_weight fp32 and slot_rank int32 [>= M*topk+1, M]
    (the expert's place in the row's ascending choice; -1 where the row did not choose it)
    and num_slots int32 [1]. scratch: (chosen int32 [>= M*E], weight fp32 [>= M*E], an int32
    arrival counter at zero) for the one-program-per-row form from ROUTE_PER_ROW_MIN_ROWS
    rows. ss fp32 [S, M]: the partials
    are ``norm_router``'s, of the un-normed rows (`hidden` columns, the norm's eps)."""
    fixed = router_parts.dtype == torch.int64
    if fixed and (router_parts.dim() != 2 or scratch is None or
                  router_parts.shape[0] < ROUTE_PER_ROW_MIN_ROWS):
        raise ValueError(f"route: int64 sums {tuple(router_parts.shape)} are read by the "
                         f"per-row form only (scratch given, >= {ROUTE_PER_ROW_MIN_ROWS} rows)")
    split, m, e = (1, *router_parts.shape) if fixed else router_parts.shape
    assert router_parts.is_contiguous() and slot_weight.shape[1] == m
    assert slot_expert.numel() >= m * topk + 1 and slot_weight.is_contiguous()
    assert slot_rank.shape == slot_weight.shape and slot_rank.is_contiguous()
    if ss is not None and (ss.dtype != torch.float32 or ss.dim() != 2 or ss.shape[1] != m):
        raise ValueError(f"route: ss must be fp32 [SPLIT, {m}], got {ss.dtype} "
                         f"{tuple(ss.shape)}")
    common = dict(BLOCK_E=triton.next_power_of_2(e), TOPK=topk, RENORM=renorm,
                  PDL=overlap.enabled(), SORT=ROUTE_SORT,
                  ss_ptr=router_parts if ss is None else ss,
                  SS_SPLIT=0 if ss is None else ss.shape[0], H=int(hidden), eps=float(eps),
                  CONSTS_EARLY=ROUTE_CONSTS_EARLY, **overlap.launch_kw())
    if scratch is not None and m >= ROUTE_PER_ROW_MIN_ROWS:
        chosen, weight, arrival = scratch
        assert chosen.numel() >= m * e and weight.numel() >= m * e
        assert chosen.dtype == arrival.dtype == torch.int32 and weight.dtype == torch.float32
        _route_per_row_kernel[(m,)](router_parts, split, m, e, bias, positions, chosen, weight,
                                    arrival, slot_expert, slot_weight, slot_rank, num_slots,
                                    float(scale), BLOCK_M=max(2, triton.next_power_of_2(m)),
                                    num_warps=ROUTE_PER_ROW_WARPS, R_ROWS=ROUTE_ROW_TILE_MIN,
                                    FIXED=fixed, **common)
        return
    _route_kernel[(1,)](router_parts, split, m, e, bias, positions, slot_expert, slot_weight,
                        slot_rank, num_slots, float(scale), BLOCK_M=max(2, triton.next_power_of_2(m)),
                        num_warps=ROUTE_WARPS or (16 if m > 4 else 4),
                        **common)  # [rows, experts] tiles: no spills


def router_route(x: torch.Tensor, router_w: torch.Tensor, router_parts: torch.Tensor,
                 bias: torch.Tensor, positions: torch.Tensor, topk: int, scale: float,
                 renorm: bool, slot_expert: torch.Tensor, slot_weight: torch.Tensor,
                 slot_rank: torch.Tensor, num_slots: torch.Tensor,
                 arrival: torch.Tensor, scratch=None, routes: bool = True) -> None:
    """The router's logits (bf16 x [M, K] . router_w [E, K]^T as fp32 split-K partials
    router_parts [SPLIT, M, E]) then ``route``: one launch up to ROUTE_TAIL_MAX_ROWS rows
    (the last GEMV program routes; `arrival` an int32 counter left at zero), two above (route
    given `scratch`, see ``route``). routes=False: the logits only (the expert kernels route,
    ``Routing``)."""
    m, k = x.shape
    split, pm, e = router_parts.shape
    if m > ROUTE_TAIL_MAX_ROWS:
        bf16_linear.bf16_linear_splitk(x, router_w, router_parts)
        if routes:
            route(router_parts, bias, positions, topk, scale, renorm, slot_expert, slot_weight,
                  slot_rank, num_slots, scratch)
        return
    assert x.stride(1) == 1 and router_w.is_contiguous() and router_w.shape == (e, k) and pm == m
    assert router_parts.is_contiguous() and router_parts.dtype == torch.float32
    assert slot_expert.numel() >= m * topk + 1 and slot_weight.is_contiguous()
    assert slot_rank.shape == slot_weight.shape and slot_rank.is_contiguous()
    assert slot_weight.shape[1] == m and arrival.dtype == torch.int32
    block_n = bf16_linear.BLOCK_N
    bm, block_k, gemv = bf16_linear.launch_shape(m, k, split)
    _router_route_kernel[(triton.cdiv(e, block_n), split)](
        x, x.stride(0), m, k, router_w, router_parts, e,
        bf16_linear.chunk_cols(k, split, 128), arrival, bias, positions, slot_expert,
        slot_weight, slot_rank, num_slots, float(scale), SPLIT=split, BLOCK_M=bm,
        ROUTE_M=max(2, triton.next_power_of_2(m)), BLOCK_N=block_n, BLOCK_K=block_k,
        BLOCK_E=triton.next_power_of_2(e), TOPK=topk, RENORM=renorm, INTERPRET=interpreting(),
        PDL=overlap.enabled(), GEMV=gemv, SORT=ROUTE_SORT,
        PREFETCH=overlap.prefetches("router"), TAIL=routes,
        num_warps=ROUTER_ROUTE_WARPS if m <= 2 else ROUTER_ROUTE_WARPS_ABOVE_2, num_stages=4,
        **overlap.launch_kw())


def _check_expert_stack(*tensors) -> None:
    """Each expert's [rows, cols] block must be row-major contiguous (the stack stride free)."""
    for t in tensors:
        if t.dim() == 3:
            assert t.stride(2) == 1 and t.stride(1) == t.shape[2], "expert rows must be contiguous"
        else:
            assert t.is_contiguous()


# From this many rows, with the overlap on (so only up to overlap.WIDE_MAX_ROWS), gate/up's
# shared-expert programs of a MoE layer multiply before waiting for router+route (whose slot
# table they do not need), beside it: on an H200 1.3-1.6 us faster a MoE layer at 2 rows,
# 0.3-0.5 slower at one (results/tiling_probe_20261201T134836Z, shared_after_wait there
# the plain wait, baseline from one row)
SHARED_BEFORE_WAIT_FROM_ROWS = 2  # from 1 row, with gate/up routing: +0.4 / +0.6 us (T222937Z)
SWIGLU_BLOCK = 256  # intermediate columns per SwiGLU program
# Tried in the layer on an H200 (tiling_probe_20261201T023604Z, T023616Z; code at 0e61916):
# gate/up's K in 6 or 8 chunks at 1-2 rows (-1.3..+3.3 us), 2 or 4 pipeline stages for
# gate/up or down instead of 3 (-1..+6 us), down without its L2 prefetch (within +-1.3 us),
# 128 hidden columns a down program at 1 row (+1.4..+2.9 us); at 1-2 rows gate/up tiles of
# 16 or 64 columns, 1 or 4 groups a step (-1.6..+11.8 us: tiling_probe_20261201T025936Z):
# none kept. Alone and cold (ncu: results/ncu_moe_2aeab55.log) gate/up at 1 row streams
# 2.1 TB/s, its warps mostly waiting on loads: too few bytes in flight, not too few programs.
# gate/up's programs, once they know their slot's expert, prefetching an equal share of its
# down weights into L2 (4 bulk requests a program, before or after its own multiply; code at
# 5e971e4): slower a MoE layer at every row count on an H100 (+0.4..+3.5 us at 1-2 rows,
# +4 / +20 us at 4 / 16 rows; results/tiling_probe_20261206T124635Z), so removed.
# hidden columns per program of the terms' sum: 256, 512 and 2048 were within +-1.3 us of it a
# layer at 1, 2 and 16 rows on an H200 (tiling_probe_20261201T102833Z: sum_block_*)
SUM_BLOCK = 1024
# whether the terms' sum reads the row's position (a layer input) before its wait: the terms'
# loads are masked by it, so read after the wait it was one L2 round trip before them. On an
# H200 0.1-0.2 us a layer at one row, within noise elsewhere (the same run: sum_pos_late)
SUM_POS_EARLY = True


def gate_up_chunk(k: int, split_k: int, groups: int) -> int:
    """128-column groups of x per gate/up K chunk (as fp8_linear.grid_shape's)."""
    return grid_shape(0, 0, k, split_k, 128, groups)[2]


# rows up to which gate/up and down multiply without the tensor cores (fp8_linear's
# _gemv_step), with their own tiling: gate/up (BLOCK_N, GROUPS, SPLIT_K), down's columns and
# groups a step (at most I's: one TP8 rank's expert has 2, its dense MLP 12). On an H200 at
# one row the MoE layer is 2.7 us faster than the MMA form and the dense one 3-4 us; at two
# rows 11-20 us slower (the multiply-and-sum's instructions per weight byte double); the
# FP8 linears (q_a|kv_a, q_b, o_proj) in this form at their MMA tiling were 4-5 us slower
# (tiling_probe_20261201T045137Z, T045144Z: moe_gemv_*, linear_gemv). Around the defaults
# (T045706Z, T045711Z): gate/up tiles of 16-32 columns x 2-8 groups x K in 2-12 chunks, down
# of 16-64 columns and 2-8 groups, 2 or 8 warps: none faster at both layer kinds by more than
# 0.6 us. Tried there too: the shared expert's gate/up programs running before the router
# finishes (its x is two kernels back): +1.3 us a MoE layer at one row, so they wait. And
# the next step's weight tiles loaded before this step's multiply-and-sum (by hand: Triton
# does not pipeline this loop): +13..15 us at one row, up to +140 with wide tiles (spills;
# tiling_probe_20261201T051045Z, T051051Z; code at a1c394f).
# Since gate/up's 32-column tiles run as one stacked wgmma (GATE_UP_STACK) a MoE layer is
# 1.0-1.3 us faster at one row on the tensor cores, with or without the indexer, in two runs;
# a dense layer 9.6 us slower (tiling_probe_20261201T212315Z, T212922Z: moe_mma_at_1; the
# deep form +0.4..+1.0): so the MoE layer's experts take the MMAs at every row count and the
# dense MLP keeps this form at one row (DENSE_GEMV_MAX_ROWS). Re-timed with the scales loaded
# ahead: +1.9 us a MoE layer at one row (tiling_probe_20261202T062521Z: moe_gemv_at_1).
GEMV_MAX_ROWS = 0
DENSE_GEMV_MAX_ROWS = 1
GATE_UP_GEMV_TILING = (16, 4, 4)
DOWN_GEMV_BLOCK = 32
DOWN_GEMV_GROUPS = 4
GEMV_WARPS = 4


# The dense MLP (one slot, I = 1536 at TP8) from 2 rows: the MoE's tilings leave it 24-48
# programs (gate/up at 16 rows 24 us for 19 MB; graph_timeline_20261201T052551Z), so it takes
# its own: gate/up (BLOCK_N, GROUPS, SPLIT_K), down (BLOCK_N, warps); None: the MoE's. On an
# H200 the dense layer is 5.2, 14.9 and 15.6 us faster at 4, 8 and 16 rows than with the
# MoE's, the same at 2; of 6 gate/up and 5 down alternatives none is faster at every row count
# by more than 1.7 us (tiling_probe_20261201T105116Z: dense_*)
DENSE_GATE_UP_TILING = (32, 2, 4)
DENSE_DOWN = (64, 8)


# rows at which a MoE layer's gate/up takes 64 columns a program (8 warps) rather than 32 (4
# warps) from 3 rows. On an H200, 32 against 64 columns a MoE layer (with or without the
# indexer) is 4-5.5 us faster at 5-6 rows, 1-4.5 at 7-8, 9-10 at 13-15, 6 at 16, the same at
# 9-10 and 5 us slower at 11-12 (results/tiling_probe_20261201T152820Z, T152836Z:
# wide_gu_32_2_1). The steps follow the benchmark's routing (how many programs find an
# expert), so this table is tuned to it. 16 columns (128 registers at 4 warps) were 34-73 us
# slower a layer at 5-16 rows (T155229Z: wide_gu_16_2_1). With the stacked MMAs
# (GATE_UP_STACK), 32 columns at 9-12 rows in 3 stages were 6.5 us slower at 12
# (T182326Z: gate_up_32_always); in the deep form or 2 stages within -1.6..+0.4 us a MoE
# layer, -0.9..-3.8 with the indexer at 10 and 12, so no change (T185111Z).
GATE_UP_64_COLUMN_ROWS = range(9, 13)
# whether those 64-column tiles (gate and up apart) also load each group's scales an iteration
# ahead, as the linears and the 32-column stacked tiles do (fp8_linear.SCALES_AHEAD). Bitwise
# the plain loop (interpreter; GPU test test_scales_loaded_ahead_... at 12 rows, dea2028), but
# on an H200 within noise: -0.4 us a MoE layer at 12 rows (noise 0.3), +0.2 dense
# (tiling_probe_20261202T062521Z: gate_up_64_scales_ahead). Off.
GATE_UP_64_SCALES_AHEAD = False

# rows from which a MoE layer's gate/up runs in 2 pipeline stages rather than 3 (on the
# tensor cores): on an H200 with 64 columns a program a MoE layer was 7.6-10.7 us faster at
# 16 rows, but 5-18 slower at 9-14 rows, 8 at 8 and 9.5 at 4; 4 stages within -1..+3
# (tiling_probe_20261201T152501Z: gate_up_*_stages; T152634Z: gate_up_2_stages_from_9); with
# 32 columns 1.7-2.6 us faster at 16 (T152820Z: wide_gu_32_2_1_3_stages). With 3 stages and
# 64 columns 16 rows took 7 us more than 14 or 15; why is open: M = 16 compiled as a multiple
# of 16 changes two lines of the PTX (CPU compile), so more likely the benchmark's routing at
# 16 rows (how many programs find an expert, against how many fit at once). The dense MLP's
# keeps 3 (2 are 2-7 us slower at 2-16 rows, T152501Z). With the stacked MMAs (GATE_UP_STACK)
# 2 stages are also 4.5-5.8 us faster at 13-15 rows (MoE with and without the indexer), the
# same at 16 (results/tiling_probe_20261201T183149Z: gate_up_stages_2), hence from 13.
GATE_UP_2_STAGES_FROM_ROWS = 13
DENSE_GATE_UP_STAGES = 3
GATE_UP_STAGES = None  # stages at every row count and layer kind when set (probes)
GATE_UP_GROUPS = None  # groups a step on the tensor cores, every row count and kind (probes)

GATE_UP_SWAP = True  # tiles of 64 columns and more: fp8_linear.swap
# tile widths at which gate and up are stacked into one transposed MMA of twice the rows
# (_stacked_dots): 32 columns, alone too narrow for wgmma's 64 (fp8_linear.swap). ptxas: 64
# registers where the two 32-row synchronous MMAs took 80-88 (CPU compile), but 60 KB of
# shared memory at 3 stages where they took 40 (the asynchronous MMA reads its buffer while
# the next loads land, so Triton gives it one buffer more): 3 programs a multiprocessor, not 5.
# On an H200 (results/tiling_probe_20261201T182927Z, gate_up_no_stack) a MoE layer with the
# stack is 1.7-1.9 us faster at 3 rows, within 0.6 at 4-6, 1.5 faster at 16 (2 stages),
# but 3.7 slower at 2 rows, 1.7 at 7 and 8.2 at 8: there the benchmark's routing touches
# more experts than 3 programs a multiprocessor hold at once (about 540 programs at 2 rows,
# 420 at 7, 475 at 8, against 396), hence GATE_UP_DEEP_ROWS.
GATE_UP_STACK = True
GATE_UP_STACK_COLUMNS = (32,)
# rows at which gate/up on the tensor cores takes 1 group a step in 4 stages (3 loads of 8 KB
# in flight, 40 KB of shared memory stacked: 5 programs a multiprocessor) rather than 2 groups
# in 3 stages. On an H200 (T182927Z, gate_up_groups_1_stages_4) a MoE layer is 3.1 us faster
# at 2 rows, 1.7 at 7, 9.8 at 8, but 0.7-4.0 slower at 3-6 and 10-16; a dense layer 2.9
# faster at 2 rows, within 0.2 elsewhere. 2 groups in 2 stages (the same 40 KB) were 0.3-1.5
# us behind at 2 and 8 rows (gate_up_stages_2). Like GATE_UP_64_COLUMN_ROWS, tuned to the
# benchmark's routing (how many experts its rows touch). Since the scales load ahead
# (fp8_linear.SCALES_AHEAD) the deep form at one row too is +1.7 us a MoE layer
# (tiling_probe_20261202T062521Z: moe_deep_at_1).
GATE_UP_DEEP_ROWS = (2, 7, 8)
DENSE_GATE_UP_DEEP_ROWS = (2,)


def _deep(m: int, dense: bool) -> bool:
    """Whether gate/up at m rows takes the deep form (GATE_UP_DEEP_ROWS)."""
    return m in (DENSE_GATE_UP_DEEP_ROWS if dense else GATE_UP_DEEP_ROWS)


def gate_up_stack(block_n: int, gemv: bool) -> bool:
    """Whether gate/up multiplies gate and up as one stacked transposed MMA (``_stacked_dots``)."""
    return GATE_UP_STACK and not gemv and block_n in GATE_UP_STACK_COLUMNS


def up_offsets(gate_q: torch.Tensor, gate_s: torch.Tensor, up_q: torch.Tensor,
               up_s: torch.Tensor) -> tuple:
    """(elements from gate_q to up_q, from gate_s to up_s): where an expert's up rows lie
    relative to its gate rows, one offset for every expert of a stack (same strides)."""
    out = []
    for g, u in ((gate_q, up_q), (gate_s, up_s)):
        assert g.dtype == u.dtype and g.shape == u.shape and g.stride() == u.stride(), \
            "gate and up must be alike"
        delta = u.data_ptr() - g.data_ptr()
        assert delta % g.element_size() == 0, "up must lie a whole number of elements from gate"
        out.append(delta // g.element_size())
    return tuple(out)


def gate_up_stages(m: int, dense: bool) -> int:
    """Pipeline stages of gate/up on the tensor cores at m rows."""
    if GATE_UP_STAGES is not None:
        return GATE_UP_STAGES
    if _deep(m, dense):
        return 4
    if dense:
        return DENSE_GATE_UP_STAGES
    return 2 if m >= GATE_UP_2_STAGES_FROM_ROWS else 3


def gate_up_tiling(m: int, dense: bool = False) -> tuple:
    """(BLOCK_N, GROUPS, SPLIT_K) for m rows: with few rows few experts are touched, so a split
    K keeps the GPU busy; from 3 rows no split, 32 or 64 columns a program
    (GATE_UP_64_COLUMN_ROWS; dense: the one-slot MLP's, DENSE_GATE_UP_TILING, from 2 rows).
    In the whole layer the split K at 1-2 rows, SwiGLU kernel included, is 3-8 us faster than
    none (results/tiling_probe_20261130T133200Z.json)."""
    if m <= gemv_rows(dense):
        return GATE_UP_GEMV_TILING
    n, groups, split = _mma_gate_up_tiling(m, dense)
    return n, GATE_UP_GROUPS or (1 if _deep(m, dense) else groups), split


def _mma_gate_up_tiling(m: int, dense: bool) -> tuple:
    """gate_up_tiling's on the tensor cores. At 1-2 rows, where each routed program also takes
    the top-8 (ROUTE_IN_GATE_UP_MAX_ROWS), half the split K (fewer programs sorting) is still
    slower on an H200: +3.2..+3.4 us a MoE layer at 1 row, up to +3.0 at 2 (64 columns:
    +5.2..+8.4; tiling_probe_20261203T222937Z, gate_up_split_2, gate_up_n64_split_2)."""
    if dense and DENSE_GATE_UP_TILING is not None:
        return DENSE_GATE_UP_TILING
    if m <= 2:
        return 32, 2, 4
    return (64, 2, 1) if m in GATE_UP_64_COLUMN_ROWS else (32, 2, 1)


# warps of a down program on the tensor cores (2 rows and more): at 128 columns ptxas gives 146
# registers at 4 warps (3 programs, 12 warps a multiprocessor; ncu at 16 rows, cold: 49.7 us,
# 2.55 TB/s, results/ncu_attn_down_16_144e7ca.log) and 110 at 8 (2 programs, 16 warps)
DOWN_WARPS = 4
# the same form's pipeline stages and register cap (None: ptxas' choice) in a MoE layer,
# measured with the untransposed MMAs (before DOWN_SWAP): 2 stages and 128 registers (24 KB of shared memory, no spill: 4 programs a multiprocessor
# where 3 and 146 registers gave 3) make a MoE layer 1.5, 3.3, 4.3 and 5.5 us faster at 2, 4,
# 8 and 16 rows on an H200; the cap alone 0.8-2.9, 2 stages alone 1-2, 1 stage with the cap
# as 2 at 4-8 rows but +1 at 16 (results/tiling_probe_20261201T152205Z, T152501Z). The dense
# MLP's down (DENSE_DOWN: 8 warps, 60-78 registers) keeps 3 stages: 2 are 5.8 us slower a
# dense layer at 4-16 rows (T152501Z: down_3_stages)
DOWN_STAGES = 2
DOWN_MAXNREG_FEW_ROWS = 128
# With the MMAs transposed (DOWN_SWAP: the weight tile as wgmma's 64-row side, read from
# shared memory; the untransposed synchronous MMA staged it through registers) ptxas gives
# down 105 registers at 128 columns (146 before), 96 under a 96 cap, no spill (CPU compile):
# 5 programs a multiprocessor (38 KB each). On an H200 the transposed MMAs make a MoE layer
# 1-4 us faster at 2-16 rows (results/tiling_probe_20261201T172804Z: down_no_swap), and the
# 96 cap another 1.7-3.2 at 8-16 rows, -0.2..-0.4 at 4, but +0.7..+1.6 at 2
# (T173533Z: down_maxnreg_96 against 128), hence from DOWN_MAXNREG_FROM_ROWS.
DOWN_SWAP = True
# whether down reads the slot table, the rows' weights and ranks (route's, two kernels back)
# before its wait rather than after it, where they were one more L2 round trip before the
# first weight load could be addressed. On an H200 a layer is 0.3-0.5 us faster at one row,
# within noise from 2 rows (tiling_probe_20261203T073514Z: down_table_late); with
# SUM_POS_EARLY and mla.ABSORB_V_W_EARLY, 1.5-1.8 us at one row, 0.2-0.9 at 2-8, 0 at 16
# (all_late)
DOWN_TABLE_EARLY = True
# rows from which a MoE layer's down waits for its own slot's activations rather than for all
# of gate/up (``SlotWait``): each gate/up (tile, slot) counts on ready[slot] once its
# activations are stored; down, launched programmatically dependent at every row count, skips
# the programmatic wait and polls its slot's counter, so its programs multiply the first slots
# while gate/up's last wave still runs (from 5 rows gate/up is more than one wave of programs,
# and down, after the programmatic wait, starts only as gate/up ends: graph_timeline at 16
# rows). Sound because the dependent launch starts only once every gate/up program has
# started (each lets it launch after its own wait): all the programs a wait needs are
# resident. The wait is bounded (DOWN_WAIT_POLLS, then a failure word and wrong terms, never
# a hang); the terms' sum zeroes the counters. Only where route wrote the slot table (above
# ROUTE_IN_GATE_UP_MAX_ROWS: there gate/up writes it). On an H100 (bitwise the whole wait:
# results/pytest_slot_wait_752e871.log, 5298701) from 5 rows a MoE layer is 1.6 / 1.6 / 5.8 /
# 4.2 us faster at 5 / 8 / 12 / 16 rows, with the indexer 2.0 / 3.6 / 5.9 / 5.9 (noise 0.1-1.3;
# tiling_probe_20261205T144129Z); from 3 rows, gate/up routing only up to 2, another 0.2-0.7
# at 3 rows and 0.5-0.9 at 4 in two runs (T145538Z, T145632Z: down_slot_wait_3_route_2; from
# 2 rows, routing at one, +0.8..+1.0 at 2). Release tables in one call against the defaults
# before (decode_layer_20261205T150033Z against T145940Z, before_slot_waits): a MoE layer
# 202.1 -> 197.1 us at 16 rows, 167.4 -> 161.8 at 12, 138.7 -> 136.4 at 8, the same at 1-4.
# Down now starts ~18 us before gate/up ends at 16 rows, where it started as it ended
# (graph_timeline_20261205T145902Z against 20261205T045302Z, an H200's).
DOWN_SLOT_WAIT_FROM_ROWS = 3
DOWN_WAIT_POLLS = 1 << 22
# Tried with them (code at 271d145): each down program loading its weight tile and scales into
# registers before its slot's wait, so they stream while gate/up runs, and the slot waits from
# one row (route's launch writing the table, where gate/up routes at 1-2 rows). Bitwise the
# defaults on an H100 at 1 / 3 / 16 rows (results/pytest_w_early_271d145.log) but slower a MoE
# layer: the early tiles +0.9 / +3.9 us at 4 / 16 rows, with the slot waits from one row
# +1.2 / 0.0 / +1.2 / +4.7 at 1 / 2 / 4 / 16, the slot waits from one row alone +1.2 / +0.9
# at 1 / 2 (tiling_probe_20261205T152416Z, Triton's attention: no CuTe DSL that call). As with
# the L2 requests (GATE_UP_ROUTED_PREFETCH above), down's bytes loaded ahead by its own
# programs delay more than they hide.
# Tried: where gate/up routes every row (1-4 rows), its routing program setting a flag once the
# slot table was whole, and down's programs (launched while gate/up ran) waiting for that flag
# and reading their entry before their own wait (a bounded wait: NaN terms, never a hang; the
# terms' sum reset the flag). Bitwise the same (pytest_pending_d921474.log), but on an H200 a
# MoE layer -0.3 us at one row (noise 0.1) and +0.5 at 4 (tiling_probe_20261204T030728Z:
# down_table_flag; code at d921474): too little for a spin-wait and a flag to keep.
DOWN_MAXNREG = 96
DOWN_MAXNREG_FROM_ROWS = 4
# Tried: down from 3 rows as 2, 4 or 8 programs a column tile (128 or 64 columns), each looping
# over every lanes-th slot with K unrolled, so Triton's pipeline could load the next slots'
# weight tiles during one's MMAs (168-180 registers at 128 columns: ptxas, CPU). Bitwise the
# one-program-per-(tile, slot) form, but on an H200 a MoE layer is 6-43 us slower at 8 rows and
# 12-66 at 16 in every shape (tiling_probe_20261201T124112Z, at 85aeb85, since reverted).
# Again without the unrolling, with 64 or 96 programs a column tile under the register cap
# (the loop holds 168-222 registers, 124 B spilled under it): 0.6-2.7 us slower at 8 and 16
# rows, the same at 4 (tiling_probe_20261201T152205Z, code at fe63de8).


def gemv_rows(dense: bool) -> int:
    """Rows up to which gate/up and down multiply without the tensor cores: a MoE layer's
    experts (GEMV_MAX_ROWS) or the dense MLP (DENSE_GEMV_MAX_ROWS)."""
    return DENSE_GEMV_MAX_ROWS if dense else GEMV_MAX_ROWS


def down_block(m: int, dense: bool = False) -> int:
    """Hidden columns per down program (benchmark.moe_probe, H200)."""
    if m <= gemv_rows(dense):
        return DOWN_GEMV_BLOCK
    return 64 if m == 1 else 128


def down_maxnreg(m: int):
    """Register cap of down on the tensor cores in a MoE layer at m rows (None: ptxas')."""
    return DOWN_MAXNREG if m >= DOWN_MAXNREG_FROM_ROWS else DOWN_MAXNREG_FEW_ROWS


def down_swap(block_n: int, gemv: bool) -> bool:
    """Whether down's MMAs run transposed (weight tile . activations^T, fp8_linear.swap)."""
    return fp8_linear.swap(block_n, gemv, DOWN_SWAP)


def down_shape(m: int, dense: bool = False) -> tuple:
    """(BLOCK_N, warps) of down for m rows (dense: the one-slot MLP's, DENSE_DOWN)."""
    gemv = m <= gemv_rows(dense)
    if dense and not gemv and DENSE_DOWN is not None:
        return DENSE_DOWN
    return down_block(m, dense), GEMV_WARPS if gemv else DOWN_WARPS


class SlotWait(NamedTuple):
    """down's per-slot waits (DOWN_SLOT_WAIT_FROM_ROWS): int32 counters [>= slots] at zero,
    counted by gate/up and zeroed again by the terms' sum; the failure word [1] a wait that
    gave up sets (left for the host: ``slot_wait_failed``); gate/up's tiles a slot."""
    ready: torch.Tensor
    failed: torch.Tensor
    tiles: int


def slot_wait_failed(failed: torch.Tensor) -> bool:
    """Whether a wait of down's since the word was last cleared gave up (syncs the host)."""
    return bool(failed.item())


class Routing(NamedTuple):
    """What gate/up routes every row from itself (ROUTE_IN_GATE_UP_MAX_ROWS): the router's
    fp32 split-K partials [SPLIT, M, E], route's arguments, and the [slot, row] tables it
    writes as route would."""
    parts: torch.Tensor
    bias: torch.Tensor
    positions: torch.Tensor
    topk: int
    scale: float
    renorm: bool
    slot_weight: torch.Tensor
    slot_rank: torch.Tensor


def _routing_args(route, m: int, num_experts: int, slots: int, dummy: torch.Tensor) -> dict:
    """gate/up's routing arguments: route's (a ``Routing``) or placeholders."""
    if route is None:
        return dict(r_parts_ptr=dummy, r_bias_ptr=dummy, r_pos_ptr=dummy, r_scale=1.0,
                    slot_weight_ptr=dummy, slot_rank_ptr=dummy)
    split, pm, e = route.parts.shape
    if not num_experts or e != num_experts or pm != m:
        raise ValueError(f"gate_up: routing needs a MoE's router partials [split, {m}, "
                         f"{num_experts}], got {tuple(route.parts.shape)}")
    assert route.parts.is_contiguous() and route.parts.dtype == torch.float32
    assert slots >= 2 and route.slot_weight.shape == (slots, m) == route.slot_rank.shape
    return dict(r_parts_ptr=route.parts, r_bias_ptr=route.bias, r_pos_ptr=route.positions,
                r_scale=float(route.scale), slot_weight_ptr=route.slot_weight,
                slot_rank_ptr=route.slot_rank, ROUTE=True, R_SPLIT=split,
                R_BLOCK_M=max(ROUTE_ROW_TILE_MIN, triton.next_power_of_2(m)),
                BLOCK_E=triton.next_power_of_2(e),
                TOPK=route.topk, RENORM=route.renorm, SORT=ROUTE_SORT,
                CONSTS_EARLY=ROUTE_CONSTS_EARLY)


@overlap.wide_launcher(lambda xq, sx, num_experts, *_, **__:
                       "gate_up" if num_experts else "dense_gate_up")
def gate_up(xq, sx, num_experts, slot_expert, num_slots, gate_q, gate_s, up_q, up_s,
            shared_gate_q, shared_gate_s, shared_up_q, shared_up_s, act, gu_parts=None,
            tiling=None, num_warps=None, arrivals=None, route=None, ready=None, ss=None,
            eps=0.0):
    """act bf16 [SLOTS, M, I] = SiLU(x G_e^T) * (x U_e^T) for each slot's expert e; x given
    quantized (xq e4m3 [M, K], sx [M, K/128]). The routed stacks [E, I, K] may be views of
    one [E, 2I, K] gate|up tensor: each expert's rows contiguous, any expert stride. With a
    split K (few rows) the fp32 partials go through gu_parts [SPLIT_K, SLOTS, M, 2, I], summed
    and SwiGLU'd by the last K chunk of each (tile, slot) when `arrivals` (int32 counters, at
    least tiles x SLOTS, left at zero) is given, else by a second kernel. route (a
    ``Routing``, a MoE only): route every row in the kernel from the router's partials rather
    than read the slot table, which the kernel writes (ROUTE_IN_GATE_UP_MAX_ROWS). ready (a
    ``SlotWait``): count each (tile, slot) on ready[slot] once its activations are stored.
    ss fp32 [SPLIT, M] (with the norm's eps): x is ``norm_router``'s, of the un-normed row,
    so the products (and the routing's logits) are multiplied by each row's rstd."""
    m, k = xq.shape
    dense = not num_experts
    block_n, groups, split_k = tiling or gate_up_tiling(m, dense)
    slots, am, inter = act.shape
    assert am == m and act.is_contiguous() and shared_gate_q.shape == (inter, k)
    assert xq.is_contiguous() and sx.is_contiguous()
    assert slot_expert.numel() >= slots, "every program's slot needs a table entry"
    _check_expert_stack(gate_q, gate_s, up_q, up_s)
    if split_k > 1:
        assert gu_parts is not None and gu_parts.shape == (split_k, slots, m, 2, inter)
        assert gu_parts.is_contiguous()
    else:
        gu_parts = act
    k_chunk = gate_up_chunk(k, split_k, groups)
    tiles = triton.cdiv(inter, block_n)
    tail = split_k > 1 and arrivals is not None and SWIGLU_TAIL
    gemv = m <= gemv_rows(dense)
    assert not gemv or 128 % block_n == 0, "a GEMV gate/up tile must lie in one scale block"
    if tail:
        assert arrivals.dtype == torch.int32 and arrivals.numel() >= tiles * slots
    if ready is not None:
        if route is not None:
            raise ValueError("gate_up: slot counters are counted against route's slot list; "
                             "a gate/up that routes (``Routing``) writes its own")
        if split_k > 1 and not tail:
            raise ValueError("gate_up: slot counters need the activations stored in this "
                             "launch (one K chunk, or the SwiGLU tail's arrivals)")
        if ready.tiles != tiles or ready.ready.numel() < slots:
            raise ValueError(f"gate_up: slot counters for {ready.tiles} tiles of "
                             f"{ready.ready.numel()} slots; this launch has {tiles} of {slots}")
    # a MoE layer's slot 0 (a dense layer's only slot reads x from the kernel just before)
    shared_early = bool(num_experts) and m >= SHARED_BEFORE_WAIT_FROM_ROWS and overlap.enabled()
    if ss is not None:
        if not num_experts or ss.dtype != torch.float32 or ss.dim() != 2 or ss.shape[1] != m:
            raise ValueError(f"gate_up: ss must be a MoE router's fp32 [SPLIT, {m}] sums of "
                             f"squares, got {ss.dtype} {tuple(ss.shape)}")
        # routing here, x and ss come from the kernel just before: the shared programs wait
        shared_early = shared_early and route is None
    scales_ahead = fp8_linear.SCALES_AHEAD and (gate_up_stack(block_n, gemv)
                                                or GATE_UP_64_SCALES_AHEAD)
    _gate_up_kernel[(tiles, slots, split_k)](
        xq, sx, m, k, inter, num_experts, slot_expert, num_slots,
        gate_q, gate_s, up_q, up_s, gate_q.stride(0) if gate_q.dim() == 3 else 0,
        gate_s.stride(0) if gate_s.dim() == 3 else 0,
        shared_gate_q, shared_gate_s, shared_up_q, shared_up_s,
        *up_offsets(gate_q, gate_s, up_q, up_s),
        *up_offsets(shared_gate_q, shared_gate_s, shared_up_q, shared_up_s),
        act, gu_parts, slots, k_chunk, arrivals if tail else num_slots,
        BLOCK_M=block_m(m, gemv), BLOCK_N=block_n, GROUPS=groups, SPLIT_K=split_k,
        INTERPRET=interpreting(), PDL=overlap.enabled(), TAIL=tail, GEMV=gemv,
        SHARED_EARLY=shared_early, SWAP=fp8_linear.swap(block_n, gemv, GATE_UP_SWAP),
        STACK=gate_up_stack(block_n, gemv), SCALES=scales_ahead,
        PREFETCH=overlap.prefetches("gate_up"),
        num_warps=num_warps or (GEMV_WARPS if gemv else 8 if block_n == 64 else 4),
        num_stages=gate_up_stages(m, not num_experts),
        **_routing_args(route, m, num_experts, slots, num_slots),
        ready_ptr=num_slots if ready is None else ready.ready, READY=ready is not None,
        ss_ptr=num_slots if ss is None else ss, SS_SPLIT=0 if ss is None else ss.shape[0],
        eps=float(eps), **overlap.launch_kw(),
    )
    if split_k > 1 and not tail:
        _swiglu_kernel[(slots, triton.cdiv(inter, SWIGLU_BLOCK))](
            gu_parts, num_slots, act, m, inter, slots, SPLIT_K=split_k,
            BLOCK_M=max(2, triton.next_power_of_2(m)), BLOCK_I=SWIGLU_BLOCK,
            PDL=overlap.enabled(), num_warps=4, **overlap.launch_kw())


@overlap.wide_launcher("down")
def down(act, num_experts, slot_expert, slot_weight, slot_rank, num_slots, down_q, down_s,
         shared_down_q, shared_down_s, positions, terms, out, block_n=None, num_warps=None,
         table_early=True, ready=None, residual=None):
    """out bf16 [M, H] = sum over the row's experts of bf16(weight * act_slot D_e^T), shared
    first then experts ascending (fp32 sum, one rounding), through terms bf16 [M, k+1, H].
    table_early=False: the slot table is read after the wait (gate/up, the kernel before,
    wrote it: ``Routing``), never before (DOWN_TABLE_EARLY). ready (a ``SlotWait`` gate/up,
    the kernel before, counted on): each program waits for its slot's activations only, not
    for the whole of gate/up (DOWN_SLOT_WAIT_FROM_ROWS); the terms' sum zeroes the counters.
    residual: ``sum_terms``'s (the post-attention residual ``norm_router`` left unwritten)."""
    slots, m, inter = act.shape
    _, n_terms, h = terms.shape
    assert shared_down_q.shape == (h, inter) and out.is_contiguous() and terms.is_contiguous()
    dense = not num_experts
    block_n = block_n or down_block(m, dense)
    num_warps = num_warps or down_shape(m, dense)[1]
    gemv = m <= gemv_rows(dense)
    assert not gemv or 128 % block_n == 0, "a GEMV down tile must lie in one scale block"
    _check_expert_stack(down_q, down_s)
    assert slot_expert.numel() >= slots, "every program's slot needs a table entry"
    moe_mma = bool(num_experts) and not gemv  # DOWN_STAGES, DOWN_MAXNREG
    launch = overlap.launch_kw()
    # (placeholders: a launch's arguments are tensors whether used or not)
    waits = dict(ready_ptr=num_slots, failed_ptr=num_slots)
    if ready is not None:
        if not table_early:
            raise ValueError("down: slot waits read the slot table before gate/up ends, so "
                             "route must have written it (not gate/up: ``Routing``)")
        assert ready.ready.numel() >= slots and ready.failed.numel() == 1
        pdl = overlap.pdl_possible()
        launch = {"launch_pdl": True} if pdl else {}
        waits = dict(ready_ptr=ready.ready, failed_ptr=ready.failed, ready_target=ready.tiles,
                     SLOT_WAIT=True, DEPENDENTS=pdl, WAIT_POLLS=DOWN_WAIT_POLLS)
    _down_kernel[(triton.cdiv(h, block_n), slots)](
        act, m, inter, h, num_experts, slot_expert, slot_weight, slot_rank, num_slots,
        down_q, down_s, down_q.stride(0) if down_q.dim() == 3 else 0,
        down_s.stride(0) if down_s.dim() == 3 else 0, shared_down_q, shared_down_s, terms,
        TERMS=n_terms, BLOCK_M=block_m(m, gemv), BLOCK_N=block_n, INTERPRET=interpreting(),
        PDL=overlap.enabled(), GEMV=gemv,
        GROUPS=min(DOWN_GEMV_GROUPS, triton.cdiv(inter, 128)) if gemv else 1,
        SWAP=down_swap(block_n, gemv), TABLE_EARLY=DOWN_TABLE_EARLY and table_early,
        # the prefetch reads the slot table before the wait: only where it is complete then
        PREFETCH=overlap.prefetches("down") and table_early, num_warps=num_warps,
        num_stages=DOWN_STAGES if moe_mma else 3, **launch, **waits,
        **({"maxnreg": cap} if moe_mma and (cap := down_maxnreg(m)) else {}),
    )
    sum_terms(terms, positions, out, clear=None if ready is None else ready.ready[:slots],
              residual=residual)


@overlap.wide_launcher("sum")
def sum_terms(terms, positions, out, clear=None, residual=None) -> None:
    """out bf16 [M, H] = each row's terms bf16 [M, k+1, H] summed in fp32 in order, one
    rounding (a pad row, position < 0: its shared term only). clear: int32 words zeroed once
    the kernel before (down) has finished (its slot counters). residual = (attn, res), bf16
    [M, H] each: also res = bf16(attn + res), the post-attention residual that
    ``norm_router`` left unwritten."""
    m, n_terms, h = terms.shape
    assert out.shape == (m, h) and out.is_contiguous() and terms.is_contiguous()
    # (placeholders: a launch's arguments are tensors whether used or not)
    extra = dict(clear_ptr=positions, attn_ptr=positions, res_ptr=positions)
    if residual is not None:
        attn, res = residual
        if (attn.shape != (m, h) or res.shape != (m, h) or not attn.is_contiguous()
                or not res.is_contiguous()):
            raise ValueError(f"sum_terms: the residual's attn {tuple(attn.shape)} and res "
                             f"{tuple(res.shape)} must be contiguous [{m}, {h}]")
        extra.update(attn_ptr=attn, res_ptr=res, RES=True)
    if clear is not None:
        assert clear.dtype == torch.int32 and clear.is_contiguous()
        extra.update(clear_ptr=clear, n_clear=clear.numel(),
                     CLEAR_BLOCK=triton.next_power_of_2(clear.numel()))
    _sum_terms_kernel[(m, triton.cdiv(h, SUM_BLOCK))](
        terms, positions, out, h, TERMS=n_terms, BLOCK=SUM_BLOCK, PDL=overlap.enabled(),
        POS_EARLY=SUM_POS_EARLY, num_warps=4, **extra, **overlap.launch_kw())
