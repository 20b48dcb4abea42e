"""One launch per decoder layer: resident programs run every stage's tasks in dependency order.

The stage kernels of a layer (``norm``, ``fp8_linear``, ``mla``, ``indexer``, ``topk``,
``moe``) each finish too fast to reach HBM bandwidth: every launch pays for its pipeline's
fill, its first loads' latency and the previous kernel's tail. Here the same task bodies (the
``*_task`` functions of those modules, so the numerics are theirs) run in one launch of at most
one program per SM:

- The layer is a list of stages; stage s has n_s tasks (a stage kernel's programs). The tasks
  are numbered stage by stage, and program p runs tasks p, p + P, p + 2P, ... in that order.
- Before a task waits for the stage it depends on, it prefetches into L2 the weights it will
  read (as the overlapped stage kernels do), so the next stage's bytes stream while the
  current one computes.
- A task waits until its stage's predecessor has counted all its tasks (an int32 counter per
  stage in global memory: acquire polls), runs, then adds 1 to its own stage's counter
  (release, after a barrier of the program). Stages form a chain, so each depends on every
  earlier one.
- Deadlock-free because every program is resident (launched cooperatively: the launch fails
  instead of hanging if they cannot all be) and the lowest-numbered unfinished task always has
  its dependencies done and its program free: programs take their tasks in increasing order.
- The last program to finish resets the counters, so the next launch (the next step, or the
  replay of a captured graph) starts from zero; the caller zeroes them once, at build.

Stages (tasks each): norm1 (rows); q_a|kv_a, with the indexer's bf16 [wk; weights_proj] beside
it (tiles x split); latent (rows x 2); q_b | wq_b (tiles x split); [indexer: prepare (rows),
scores (rows x 64-token blocks), top-k (rows)]; absorb (heads x 64-column tiles); sparse
attention (rows x chunks); combine (rows x heads); absorb_v (heads x 128 columns); o_proj;
norm2 (rows); [MoE: router (tiles x split); route (1)]; gate/up (tiles x slots x split);
[split-K: SwiGLU (slots)]; down (tiles x slots); sum of terms (rows x 1024 columns).

Under the Triton interpreter the grid is one program, which runs every task in order.

Measured on an H200 (results/decode_layer_20261130T124758Z.json at 489c9a1, and
results/persistent_probe_h200_52f54c7.json): correct (the GPU suite, CUDA-graph replay of the
cooperative launch included) but slower than the overlapped stage kernels, MoE layer 203 us
against 85 at 1 row, 471 against 232 at 16. Every stage body is compiled into the one program,
so each runs at the worst stage's register and shared-memory budget: 255 registers with
178-226 spilled at 8 warps (95 KB shared), and no warps / programs-per-SM choice avoids the
spills (4 warps: 168-255 registers, 414-426 spilled; 16 warps: 64 registers, 452-494). Hence
opt-in. What would make it pay: per-stage bodies written for one register budget (e.g. the
norm rows in chunks, the route's [rows, experts] tile in halves) or a persistent kernel whose
stages are separate warp-specialized roles (CuTe DSL under nvidia/sm90).
Again at 2a278fe (2026-12-04; results/decode_layer_20261204T115841Z, beside the stage kernels
without CuTe DSL): 170.8 / 251.9 / 360.4 / 497.9 us a MoE layer at 1 / 4 / 8 / 16 rows, the
stage kernels 58.9 / 85.3 / 117.3 / 170.5; 255 registers, 128-206 spilled. With the counters
polled by volatile loads (``_wait``'s note: not correct as written there) 159.9 / 230.2 /
338.2 / 451.8 (T115538Z): the polling is not what makes it slow, the one program body is
(benchmark/stream_chain_probe.py times the warp-specialized structure: 49-54 us at one row,
127-140 at 16, before stage arithmetic).
Where the spills come from (2026-12-05, on CPU: ptxas of the GPU machine's Triton 3.6 for
sm_90a, through test/srt/unit/sm90_compile.py ``resources``; a MoE layer without the indexer,
16-row tiles, 8 warps; each stage's branch compiled alone by masking the others out with a
constexpr, code not kept): no stage spills alone. Registers: norm1 80, q_a|kv_a 108, latent
48, q_b 77, absorb 96, attention 172, combine 80, absorb_v 178, o_proj 76, norm2 102, router
48, route 255 (its [16, 256] sorted top-k), gate/up 84, down 96, sum 32. Together: absorb
through o_proj 255 with no spill, norm1 through norm2 255 with 128 B spilled, router
through the sum 255 with 36 B, the whole layer 744 B (624 with gate/up's split K). So the
union spills, not any one body, and route's tile is the first to halve.
"""

from __future__ import annotations

import functools
import logging
import os

import torch
import triton
import triton.language as tl

from .bf16_linear import _bf16_linear_prefetch, _bf16_linear_task
from .fp8_linear import _fp8_linear_prefetch, _fp8_linear_task, interpreting
from .indexer import _prepare_row, _scores_task
from .mla import (
    _absorb_prefetch,
    _absorb_task,
    _absorb_v_prefetch,
    _absorb_v_task,
    _combine_task,
    _latent_row,
    _sparse_attn_prefetch,
    _sparse_attn_task,
    slot_row,
)
from .moe import (
    _down_prefetch,
    _down_task,
    _gate_up_prefetch,
    _gate_up_task,
    _route_task,
    _sum_terms_task,
    _swiglu_task,
)
from .norm import _add_rms_norm_row
from .overlap import supported as _prefetch_supported
from .topk import _topk_row

logger = logging.getLogger(__name__)
ENV = "SGL_KERNEL_EXT_PERSISTENT"  # "1": FusedLayer steps run here (default: stage kernels)
NUM_STAGES = 18  # counters per layer; one more counts the programs that have finished
# each stage's counter (the last stage, the sum of terms, needs none)
(S_NORM1, S_QKV_A, S_LATENT, S_Q_B, S_PREPARE, S_SCORES, S_TOPK, S_ABSORB, S_ATTN, S_COMBINE,
 S_ABSORB_V, S_O_PROJ, S_NORM2, S_ROUTER, S_ROUTE, S_GATE_UP, S_SWIGLU, S_DOWN) = (
    tl.constexpr(i) for i in range(NUM_STAGES))
N_COUNTED = tl.constexpr(NUM_STAGES)
COUNTERS = NUM_STAGES + 1
# A/B knobs: warps per program, programs per SM
WARPS = int(os.environ.get("SGL_KERNEL_EXT_PERSISTENT_WARPS", "8"))
PER_SM = int(os.environ.get("SGL_KERNEL_EXT_PERSISTENT_PER_SM", "1"))
_logged = set()


def enabled() -> bool:
    """Opt-in (SGL_KERNEL_EXT_PERSISTENT=1): on an H200 it is 1.5-2.4x slower than the
    overlapped stage kernels (decode_layer_20261130T124758Z, at 489c9a1; see the module
    docstring for why)."""
    return os.environ.get(ENV, "0") == "1"


@triton.jit
def _wait(counters_ptr, stage, target):
    """Block the program until stage's counter reaches target; its writes are then visible.
    Tried at 2a278fe: polls by volatile loads, then one acquire atomic whose value nothing
    read. 6-9% faster a layer (below) but wrong on the H200: 6 of 7 persistent GPU tests
    failed (results/pytest_persistent_load_poll_b270e8e.log: outputs off, residuals inf;
    all 7 pass with these atomic polls, pytest_persistent_4b33276.log), likely because
    Triton issues a scalar atomic from one thread and, its value unused, no barrier holds
    the other threads' loads until it has acquired."""
    c = tl.atomic_add(counters_ptr + stage, 0, sem="acquire", scope="gpu")
    while c < target:
        c = tl.atomic_add(counters_ptr + stage, 0, sem="acquire", scope="gpu")


@triton.jit
def _signal(counters_ptr, stage):
    """Count one finished task of stage (after every thread's stores)."""
    tl.debug_barrier()
    tl.atomic_add(counters_ptr + stage, 1, sem="release", scope="gpu")


@triton.jit
def _finish(counters_ptr, NSTAGES: tl.constexpr):
    """The last program to get here zeroes every counter for the next launch."""
    tl.debug_barrier()
    done = tl.atomic_add(counters_ptr + NSTAGES, 1, sem="acq_rel", scope="gpu")
    if done == tl.num_programs(0) - 1:
        for s in tl.static_range(NSTAGES + 1):
            tl.atomic_xchg(counters_ptr + s, 0, sem="relaxed", scope="gpu")


@triton.jit
def _layer_kernel(
    counters_ptr, M, pos_ptr, slots_ptr, stride_slots, slot_rows_ptr, inv_freq_ptr, eps,
    # stage tasks
    n_norm1, n_qkv_a, n_kw, n_latent, n_q_b, n_prepare, n_scores, n_topk, n_absorb, n_attn,
    n_combine, n_absorb_v, n_o_proj, n_norm2, n_router, n_route, n_gate_up, n_swiglu, n_down,
    n_sum,
    # norm1: hidden (+ residual) -> residual, x (indexer), xq / xs
    hidden_ptr, res_in_ptr, in_norm_ptr, res_ptr, x_ptr, xq_ptr, xs_ptr, H,
    # q_a | kv_a
    qa_w_ptr, qa_s_ptr, qa_ptr, NQA, qkv_tiles_a, kva_w_ptr, kva_s_ptr, kva_ptr, NKVA, qkv_tiles,
    qkv_chunk,
    # the indexer's [wk; weights_proj] (bf16)
    kw_w_ptr, kw_ptr, NKW, kw_tiles, kw_chunk,
    # latent
    qn_ptr, kvn_ptr, cq_q_ptr, cq_s_ptr, kv_cache_ptr, Q,
    # q_b | wq_b
    qb_w_ptr, qb_s_ptr, q_ptr, NQB, qb_tiles_a, wqb_w_ptr, wqb_s_ptr, qi_ptr, NWQB, qb_tiles,
    qb_chunk,
    # indexer: prepare, scores, top-k
    ln_w_ptr, ln_b_ptr, ln_eps, index_cache_ptr, q8_ptr, head_w_ptr, head_scale, scores_ptr,
    stride_scores, width, topk_ptr, stride_topk,
    # absorb, attention, combine, absorb_v
    kvb_ptr, qcat_ptr, NH, sm_scale, part_o_ptr, part_ml_ptr, nsp, nblk, olat_ptr, oq_ptr,
    os_ptr,
    # o_proj, norm2
    o_w_ptr, o_s_ptr, y_attn_ptr, o_tiles, o_chunk, post_norm_ptr, x2_ptr, x2q_ptr, x2s_ptr,
    # router, route
    router_w_ptr, router_parts_ptr, E, router_tiles, router_chunk, bias_ptr, route_scale,
    slot_expert_ptr, slot_weight_ptr, slot_rank_ptr, num_slots_ptr,
    # gate/up, SwiGLU, down, sum
    I, gq_ptr, gs_ptr, uq_ptr, us_ptr, gu_q_stride, gu_s_stride, sgq_ptr, sgs_ptr, suq_ptr,
    sus_ptr, gu_dq, gu_ds, sgu_dq, sgu_ds, act_ptr, gu_parts_ptr, slots, gu_tiles, gu_chunk,
    dq_ptr, ds_ptr, d_q_stride, d_s_stride, sdq_ptr, sds_ptr, terms_ptr, down_tiles, y_ptr,
    # compile-time shape
    BLOCK_M: tl.constexpr, BLOCK_HID: tl.constexpr, HAS_RES: tl.constexpr,
    INDEXER: tl.constexpr, MOE: tl.constexpr, PF: tl.constexpr, INTERPRET: tl.constexpr,
    BN: tl.constexpr, GROUPS: tl.constexpr, SPLIT_QKV: tl.constexpr, SPLIT_QB: tl.constexpr,
    SPLIT_O: tl.constexpr, KW_SPLIT: tl.constexpr, KW_BN: tl.constexpr,
    C: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr, HALF_R: tl.constexpr,
    NI: tl.constexpr, DI: tl.constexpr, BLOCK_HI: tl.constexpr, SCORE_BL: tl.constexpr,
    TOPK: tl.constexpr, TOPK_BLOCK: tl.constexpr, TOPK_OUT: tl.constexpr,
    NOPE: tl.constexpr, ROPE: tl.constexpr, V: tl.constexpr, BLOCK_D: tl.constexpr,
    ABSORB_BC: tl.constexpr, BLOCK_HEADS: tl.constexpr, BLOCK_T: tl.constexpr,
    ATTN_AHEAD: tl.constexpr, ATTN_PARTS: tl.constexpr, ATTN_QK_CHAINS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    ROUTER_SPLIT: tl.constexpr, ROUTER_BN: tl.constexpr, BLOCK_E: tl.constexpr,
    TOPK_E: tl.constexpr, RENORM: tl.constexpr,
    GU_BN: tl.constexpr, GU_GROUPS: tl.constexpr, GU_SPLIT: tl.constexpr, BLOCK_I: tl.constexpr,
    DOWN_BN: tl.constexpr, TERMS: tl.constexpr, SUM_BLOCK: tl.constexpr,
    SWAP: tl.constexpr = False, DOWN_SWAP: tl.constexpr = False, GU_SWAP: tl.constexpr = False,
    GU_STACK: tl.constexpr = False, ROWS: tl.constexpr = False,
):
    # stage ends in the task numbering
    e_norm1 = n_norm1
    e_qkv_a = e_norm1 + n_qkv_a + n_kw
    e_latent = e_qkv_a + n_latent
    e_q_b = e_latent + n_q_b
    e_prepare = e_q_b + n_prepare
    e_scores = e_prepare + n_scores
    e_topk = e_scores + n_topk
    e_absorb = e_topk + n_absorb
    e_attn = e_absorb + n_attn
    e_combine = e_attn + n_combine
    e_absorb_v = e_combine + n_absorb_v
    e_o_proj = e_absorb_v + n_o_proj
    e_norm2 = e_o_proj + n_norm2
    e_router = e_norm2 + n_router
    e_route = e_router + n_route
    e_gate_up = e_route + n_gate_up
    e_swiglu = e_gate_up + n_swiglu
    e_down = e_swiglu + n_down
    total = e_down + n_sum
    for t in range(tl.program_id(0), total, tl.num_programs(0)):
        if t < e_norm1:
            _add_rms_norm_row(t, hidden_ptr, 1, res_in_ptr, in_norm_ptr, x_ptr, res_ptr, xq_ptr,
                              xs_ptr, M, H, eps, HAS_RES, INDEXER, True, BLOCK_HID, INTERPRET)
            _signal(counters_ptr, S_NORM1)
        elif t < e_qkv_a:
            i = t - e_norm1
            if i < n_qkv_a:
                tile = i % qkv_tiles
                split = i // qkv_tiles
                _fp8_linear_prefetch(tile, split, H, qkv_chunk, qa_w_ptr, NQA, qkv_tiles_a,
                                     kva_w_ptr, NKVA, BN, PF)
                _wait(counters_ptr, S_NORM1, n_norm1)
                _fp8_linear_task(tile, split, xq_ptr, xs_ptr, M, H, qkv_chunk, qa_w_ptr, qa_s_ptr,
                                 qa_ptr, NQA, qkv_tiles_a, kva_w_ptr, kva_s_ptr, kva_ptr, NKVA,
                                 BLOCK_M, BN, GROUPS, INTERPRET, False, SWAP=SWAP)
            else:
                i -= n_qkv_a
                tile = i % kw_tiles
                split = i // kw_tiles
                _bf16_linear_prefetch(tile, split, H, kw_w_ptr, NKW, kw_chunk, KW_BN, PF)
                _wait(counters_ptr, S_NORM1, n_norm1)
                _bf16_linear_task(tile, split, x_ptr, H, M, H, kw_w_ptr, kw_ptr, NKW, kw_chunk,
                                  BLOCK_M, KW_BN, 128, INTERPRET, False)
            _signal(counters_ptr, S_QKV_A)
        elif t < e_latent:
            _wait(counters_ptr, S_QKV_A, n_qkv_a + n_kw)
            i = t - e_qkv_a
            _latent_row(i % M, i // M, qa_ptr, kva_ptr, SPLIT_QKV, M, qn_ptr, kvn_ptr, cq_q_ptr,
                        cq_s_ptr, kv_cache_ptr, pos_ptr, slots_ptr, stride_slots, slot_rows_ptr,
                        inv_freq_ptr, eps, Q, C, ROPE, BLOCK_Q, BLOCK_C, HALF_R, INTERPRET, ROWS)
            _signal(counters_ptr, S_LATENT)
        elif t < e_q_b:
            i = t - e_latent
            tile = i % qb_tiles
            split = i // qb_tiles
            _fp8_linear_prefetch(tile, split, Q, qb_chunk, qb_w_ptr, NQB, qb_tiles_a, wqb_w_ptr,
                                 NWQB, BN, PF)
            _wait(counters_ptr, S_LATENT, n_latent)
            _fp8_linear_task(tile, split, cq_q_ptr, cq_s_ptr, M, Q, qb_chunk, qb_w_ptr, qb_s_ptr,
                             q_ptr, NQB, qb_tiles_a, wqb_w_ptr, wqb_s_ptr, qi_ptr, NWQB, BLOCK_M,
                             BN, GROUPS, INTERPRET, False, SWAP=SWAP)
            _signal(counters_ptr, S_Q_B)
        elif t < e_prepare:
            if INDEXER:
                _wait(counters_ptr, S_Q_B, n_q_b)
                _prepare_row(t - e_q_b, kw_ptr, KW_SPLIT, M, NKW, qi_ptr, SPLIT_QB, ln_w_ptr,
                             ln_b_ptr, ln_eps, pos_ptr, slots_ptr, stride_slots, slot_rows_ptr,
                             inv_freq_ptr, index_cache_ptr, q8_ptr, head_w_ptr, head_scale, NI,
                             DI, HALF_R, INTERPRET, ROWS=ROWS)
                _signal(counters_ptr, S_PREPARE)
        elif t < e_scores:
            if INDEXER:
                i = t - e_prepare
                _wait(counters_ptr, S_PREPARE, n_prepare)
                _scores_task(i % M, i // M, q8_ptr, head_w_ptr, index_cache_ptr, pos_ptr,
                             slot_row(slots_ptr, stride_slots, slot_rows_ptr, i % M, ROWS),
                             scores_ptr, stride_scores, width, NI, DI, BLOCK_HI, SCORE_BL,
                             INTERPRET)
                _signal(counters_ptr, S_SCORES)
        elif t < e_topk:
            if INDEXER:
                _wait(counters_ptr, S_SCORES, n_scores)
                _topk_row(t - e_scores, scores_ptr, stride_scores, width, pos_ptr, topk_ptr,
                          TOPK, TOPK_BLOCK, TOPK_OUT)
                _signal(counters_ptr, S_TOPK)
        elif t < e_absorb:
            i = t - e_topk
            h = i % NH
            ct = i // NH
            _absorb_prefetch(h, ct, kvb_ptr, NH, C, NOPE, V, BLOCK_D, ABSORB_BC, PF)
            if INDEXER:
                _wait(counters_ptr, S_TOPK, n_topk)
            else:
                _wait(counters_ptr, S_Q_B, n_q_b)
            _absorb_task(h, ct, q_ptr, SPLIT_QB, kvb_ptr, qcat_ptr, pos_ptr, inv_freq_ptr, M, NH,
                         C, NOPE, ROPE, V, BLOCK_M, BLOCK_D, ABSORB_BC, INTERPRET, 64)
            _signal(counters_ptr, S_ABSORB)
        elif t < e_attn:
            i = t - e_absorb
            m = i % M
            sp = i // M
            if not INDEXER:  # the top-k came from an earlier layer
                _sparse_attn_prefetch(m, sp, nsp, nblk, kv_cache_ptr, topk_ptr, stride_topk,
                                      slots_ptr, stride_slots, slot_rows_ptr, C, ROPE, BLOCK_T, PF,
                                      ROWS)
            _wait(counters_ptr, S_ABSORB, n_absorb)
            _sparse_attn_task(m, sp, nsp, qcat_ptr, kv_cache_ptr, topk_ptr, stride_topk,
                              slots_ptr, stride_slots, slot_rows_ptr, part_o_ptr, part_ml_ptr, NH,
                              sm_scale, nblk, C, ROPE, BLOCK_HEADS, BLOCK_T, ATTN_PARTS,
                              INTERPRET, ATTN_AHEAD, ATTN_QK_CHAINS, ROWS)
            _signal(counters_ptr, S_ATTN)
        elif t < e_combine:
            i = t - e_attn
            _wait(counters_ptr, S_ATTN, n_attn)
            _combine_task(i % M, i // M, part_o_ptr, part_ml_ptr, olat_ptr, NH, nsp, C, BLOCK_S)
            _signal(counters_ptr, S_COMBINE)
        elif t < e_absorb_v:
            i = t - e_combine
            h = i % NH
            vt = i // NH
            _absorb_v_prefetch(h, vt, kvb_ptr, NH, C, NOPE, V, PF)
            _wait(counters_ptr, S_COMBINE, n_combine)
            _absorb_v_task(h, vt, olat_ptr, kvb_ptr, oq_ptr, os_ptr, M, NH, C, NOPE, V, BLOCK_M,
                           INTERPRET)
            _signal(counters_ptr, S_ABSORB_V)
        elif t < e_o_proj:
            i = t - e_absorb_v
            tile = i % o_tiles
            split = i // o_tiles
            _fp8_linear_prefetch(tile, split, NH * V, o_chunk, o_w_ptr, H, o_tiles, o_w_ptr, H,
                                 BN, PF)
            _wait(counters_ptr, S_ABSORB_V, n_absorb_v)
            _fp8_linear_task(tile, split, oq_ptr, os_ptr, M, NH * V, o_chunk, o_w_ptr, o_s_ptr,
                             y_attn_ptr, H, o_tiles, o_w_ptr, o_s_ptr, y_attn_ptr, H, BLOCK_M, BN,
                             GROUPS, INTERPRET, False, SWAP=SWAP)
            _signal(counters_ptr, S_O_PROJ)
        elif t < e_norm2:
            _wait(counters_ptr, S_O_PROJ, n_o_proj)
            _add_rms_norm_row(t - e_o_proj, y_attn_ptr, SPLIT_O, res_ptr, post_norm_ptr, x2_ptr,
                              res_ptr, x2q_ptr, x2s_ptr, M, H, eps, True, True, True, BLOCK_HID,
                              INTERPRET)
            _signal(counters_ptr, S_NORM2)
        elif t < e_router:
            if MOE:
                i = t - e_norm2
                tile = i % router_tiles
                split = i // router_tiles
                _bf16_linear_prefetch(tile, split, H, router_w_ptr, E, router_chunk, ROUTER_BN,
                                      PF)
                _wait(counters_ptr, S_NORM2, n_norm2)
                _bf16_linear_task(tile, split, x2_ptr, H, M, H, router_w_ptr, router_parts_ptr, E,
                                  router_chunk, BLOCK_M, ROUTER_BN, 128, INTERPRET, False)
                _signal(counters_ptr, S_ROUTER)
        elif t < e_route:
            if MOE:
                _wait(counters_ptr, S_ROUTER, n_router)
                _route_task(router_parts_ptr, ROUTER_SPLIT, M, E, bias_ptr, pos_ptr,
                            slot_expert_ptr, slot_weight_ptr, slot_rank_ptr, num_slots_ptr,
                            route_scale, BLOCK_M, BLOCK_E, TOPK_E, RENORM)
                _signal(counters_ptr, S_ROUTE)
        elif t < e_gate_up:
            i = t - e_route
            tile = i % gu_tiles
            slot = (i // gu_tiles) % slots
            split = i // (gu_tiles * slots)
            _gate_up_prefetch(tile, slot, split, H, I, sgq_ptr, suq_ptr, gu_chunk, GU_BN, PF)
            if MOE:
                _wait(counters_ptr, S_ROUTE, n_route)
            else:
                _wait(counters_ptr, S_NORM2, n_norm2)
            _gate_up_task(tile, slot, split, x2q_ptr, x2s_ptr, M, H, I, E, slot_expert_ptr,
                          num_slots_ptr, gq_ptr, gs_ptr, uq_ptr, us_ptr, gu_q_stride,
                          gu_s_stride, sgq_ptr, sgs_ptr, suq_ptr, sus_ptr, gu_dq, gu_ds,
                          sgu_dq, sgu_ds, act_ptr, gu_parts_ptr, slots, gu_chunk, BLOCK_M, GU_BN,
                          GU_GROUPS, GU_SPLIT, INTERPRET, False, GU_SWAP, GU_STACK,
                          GU_STACK)  # scales ahead as the stage kernel's (moe.gate_up)
            _signal(counters_ptr, S_GATE_UP)
        elif t < e_swiglu:
            if GU_SPLIT > 1:
                i = t - e_gate_up
                _wait(counters_ptr, S_GATE_UP, n_gate_up)
                _swiglu_task(i % slots, i // slots, gu_parts_ptr, num_slots_ptr, act_ptr, M, I,
                             slots, GU_SPLIT, BLOCK_M, BLOCK_I)
                _signal(counters_ptr, S_SWIGLU)
        elif t < e_down:
            i = t - e_swiglu
            tile = i % down_tiles
            slot = i // down_tiles
            if MOE:  # the slot table
                _wait(counters_ptr, S_ROUTE, n_route)
            _down_prefetch(tile, slot, H, I, E, slot_expert_ptr, num_slots_ptr, dq_ptr,
                           d_q_stride, sdq_ptr, DOWN_BN, PF)
            if GU_SPLIT > 1:
                _wait(counters_ptr, S_SWIGLU, n_swiglu)
            else:
                _wait(counters_ptr, S_GATE_UP, n_gate_up)
            _down_task(tile, slot, act_ptr, M, I, H, E, slot_expert_ptr, slot_weight_ptr,
                       slot_rank_ptr, num_slots_ptr, dq_ptr, ds_ptr, d_q_stride, d_s_stride,
                       sdq_ptr, sds_ptr, terms_ptr, TERMS, BLOCK_M, DOWN_BN, INTERPRET, False,
                       1, DOWN_SWAP)
            _signal(counters_ptr, S_DOWN)
        else:
            i = t - e_down
            _wait(counters_ptr, S_DOWN, n_down)
            _sum_terms_task(i % M, i // M, terms_ptr, pos_ptr, y_ptr, H, TERMS, SUM_BLOCK)
    _finish(counters_ptr, N_COUNTED)


@functools.lru_cache(maxsize=None)
def _programs(device_index: int) -> int:
    if interpreting():
        return 1
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def launch(args: dict, const: dict, device: torch.device) -> None:
    """Launch the layer: args are _layer_kernel's runtime arguments by name, const its
    compile-time ones (less INTERPRET and PF, decided here). The caller owns the counters
    (int32 [COUNTERS], zeroed once)."""
    total = sum(v for k, v in args.items() if k.startswith("n_"))
    interp = interpreting()
    programs = min(total, _programs(device.index or 0) * (1 if interp else PER_SM))
    # cooperative: every program resident at once, or the launch fails (never a hang)
    extra = {} if interp else {"launch_cooperative_grid": True}
    k = _layer_kernel[(programs,)](**args, **const, INTERPRET=interp, PF=_prefetch_supported(),
                                   num_warps=WARPS, num_stages=3, **extra)
    if not interp and k is not None:
        key = tuple(sorted(const.items()))
        if key not in _logged:
            _logged.add(key)
            logger.info("persistent layer kernel: %d programs x %d warps, %s registers, %s "
                        "spilled, %s B shared; %s", programs, WARPS, getattr(k, "n_regs", "?"),
                        getattr(k, "n_spills", "?"), k.metadata.shared,
                        {n: const[n] for n in ("INDEXER", "MOE", "GU_SPLIT", "DOWN_BN")})
