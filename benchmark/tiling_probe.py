"""Probe launch shapes of the small stage kernels on the GPU: the fused layer (stage kernels)
timed per variant, one process, the same weights, batch and graphs as decode_layer.

A variant sets module attributes of sgl_kernel_ext.triton (warps, tile widths, the absorb's
q_nope step, moe.gate_up_tiling / down_block) before its graph is captured, so every variant
runs the same layers (a knob read when a layer is built gets layers of its own). Each knob's
comment quotes the results file of the probe that set it; a variant is the knob's
alternative, kept so the next change to the kernels can re-measure it.

    PYTHONPATH=python:sgl-kernel-ext:. python3 -m benchmark.tiling_probe --out $OUT

``--table results.json`` (CPU) prints a probe's verdict: each variant's time minus the mean of
the baselines run just before and after it in the same process, per layer kind and rows,
beside how far those baselines spread (the noise a difference must beat).

Since 2026-12-04 (fifth session) the inputs are decode_layer's (``harness.layer_inputs``:
the same hidden rows, so the same routing and experts touched), and each row carries that
step's floor and the fraction of it reached, so a baseline reads against the release table and its bars. Earlier
probes seeded the hidden rows by M alone, so they routed otherwise than the table (their
experts touched were not recorded): at 16 rows their MoE baseline read ~153 us where the
table read ~157; their same-run differences stand.
"""

from __future__ import annotations

import argparse
import contextlib
import sys

import torch

from . import harness as H
from . import numerics_probe
from . import roofline as RL


def _no_split_k(original):
    """gate_up_tiling without the split K at 1-2 rows (so no SwiGLU kernel either)."""
    return lambda m, dense=False: (32, 2, 1) if m <= 2 else original(m, dense)


def _few_rows_tiling(original, tiling):
    """gate_up_tiling with `tiling` (BLOCK_N, GROUPS, SPLIT_K <= the default's) at 1-2 rows."""
    return lambda m, dense=False: tiling if m <= 2 else original(m, dense)


def _wide_tiling(original, tiling):
    """gate_up_tiling with `tiling` (BLOCK_N, GROUPS, SPLIT_K) for a MoE layer from 5 rows."""
    return lambda m, dense=False: tiling if m >= 5 and not dense else original(m, dense)


WIDE_GATE_UP = ((64, 2, 2), (32, 2, 1), (32, 2, 2), (64, 4, 1), (128, 2, 1), (16, 2, 1), (16, 4, 1),
                (64, 2, 1), (32, 4, 1), (32, 1, 1))


def _linear_tiles(block_n, groups):
    """fp8_linear.tiling with `block_n` columns and `groups` groups a step (split K sized as
    its default sizes it)."""
    from sgl_kernel_ext.triton import fp8_linear as f

    return lambda n, k: (block_n, groups, f.choose_split(n, k, block_n, groups, f.TARGET_PROGRAMS,
                                                         f.ONE_WAVE))


def _linear_split(original, n, k, split):
    """fp8_linear.tiling with `split` K chunks for the [n, k] matrices (o_proj's 6144 x 2048,
    which an indexer layer's q_b | wq_b shares; q_b's 2048 x 2048 without the indexer; q_a|kv_a's
    2624 x 6144), at every row count."""
    return lambda nn, kk: (64, 2, split) if (nn, kk) == (n, k) else original(nn, kk)


LINEAR_SPLITS = {"o_proj": ((6144, 2048), (1, 4)), "q_b": ((2048, 2048), (2, 4)),
                 "qkv_a": ((2624, 6144), (3, 4))}

# the width of a server's pool table (int32, POOL_DTYPE) the layers read their slots from in
# place (runtime.step_rows' form, the kernels' slot_rows; upstream's req_to_token is the
# model's context + 4 wide); 0: a table a row of ctx int64 columns
POOL_SLOTS = 0
POOL_DTYPE = torch.int32

# overlap.PREFETCH_KERNELS (that module is imported only to time; a unit test keeps them equal)
PREFETCH_KERNELS = ("fp8_linear", "q_b_normed", "bf16_linear", "router", "absorb", "absorb_v",
                    "gate_up", "down")
PREFETCH_OFF = frozenset({"down", "fp8_linear"})  # overlap.PREFETCH_OFF, the default
VARIANTS = {
    "baseline": {},
    "pool_slots": {("probe", "POOL_SLOTS"): (1 << 20) + 4},
    "pool_slots_1m": {("probe", "POOL_SLOTS"): 1 << 20},
    "pool_slots_narrow": {("probe", "POOL_SLOTS"): 1},  # as wide as the context
    "pool_slots_i64": {("probe", "POOL_SLOTS"): (1 << 20) + 4,
                       ("probe", "POOL_DTYPE"): torch.int64},
    # gate/up's shared-expert programs waiting for router+route as the others do, or
    # multiplying before the wait from one row (default: from moe.SHARED_BEFORE_WAIT_FROM_ROWS)
    "shared_after_wait": {("moe", "SHARED_BEFORE_WAIT_FROM_ROWS"): 1 << 30},
    "shared_before_wait_from_1": {("moe", "SHARED_BEFORE_WAIT_FROM_ROWS"): 1},
    # a TP shard's o_proj (tails summing its rows for the all-reduce) and q_b (tails summing
    # absorb's q from 3 rows) with another split K (default: fp8_linear.tiling's, 2 and 8)
    **{f"{name}_split_{s}": {("fp8_linear", "tiling"): f"{name}_split_{s}"}
       for name, (_, splits) in LINEAR_SPLITS.items() for s in splits},
    # gate/up routing every row itself up to N rows (moe.ROUTE_IN_GATE_UP_MAX_ROWS; 0: the
    # router's tail or route's launch at every row count). In results up to f6299a0,
    # route_in_experts_N had down route too (T203713Z) and route_in_gate_up_2 is this form
    **{f"route_in_gate_up_{n}": {("moe", "ROUTE_IN_GATE_UP_MAX_ROWS"): n} for n in (0, 1, 2, 3, 6, 8)},
    # down waiting for its own slot's activations (gate/up's counters) rather than for all of
    # gate/up, from N rows (moe.DOWN_SLOT_WAIT_FROM_ROWS; default 3)
    **{f"down_slot_wait_{n}": {("moe", "DOWN_SLOT_WAIT_FROM_ROWS"): n} for n in (5, 8, 12, 16)},
    "down_slot_wait_off": {("moe", "DOWN_SLOT_WAIT_FROM_ROWS"): 1 << 30},
    # the defaults before the slot waits (2b75064): gate/up routing up to 4 rows, no slot waits
    "before_slot_waits": {("moe", "DOWN_SLOT_WAIT_FROM_ROWS"): 1 << 30,
                          ("moe", "ROUTE_IN_GATE_UP_MAX_ROWS"): 4},
    # ... from fewer rows, gate/up routing only below them (route's launch writes the table)
    **{f"down_slot_wait_{n}_route_{n - 1}": {("moe", "DOWN_SLOT_WAIT_FROM_ROWS"): n,
                                             ("moe", "ROUTE_IN_GATE_UP_MAX_ROWS"): n - 1}
       for n in (2, 3, 4)},
    # q_b's split K from 3 rows as the one-wave default (8) rather than mla.Q_B_SPLIT_WITH_ROWS
    "q_b_rows_default_split": {("mla", "Q_B_SPLIT_WITH_ROWS"): 0},
    # q_b's K chunks added into int64 sums that absorb reads (no tails), in a layer without
    # the indexer from 3 rows, or never (mla.Q_FIXED_FROM_ROWS; default 5)
    "q_fixed_3": {("mla", "Q_FIXED_FROM_ROWS"): 3},
    "q_fixed_off": {("mla", "Q_FIXED_FROM_ROWS"): 0},
    "q_b_rows_split_2": {("mla", "Q_B_SPLIT_WITH_ROWS"): 2},
    # routing tiles of at least 2 rows (a masked-off one at 1 row and in route's programs)
    "route_rows_tile_2": {("moe", "ROUTE_ROW_TILE_MIN"): 2},
    # route_flags_off (T211238Z): the form without route's flags, measured against them (code
    # at 743ff9e; moe.py's tried note)
    # the router's one launch with its route tail (1-2 rows) on 1 warp, top-k by argmax passes
    # (moe.ROUTE_SORT; with one warp no barrier), or argmax passes on its 4: with router_route_1_warp
    # and router_route_2_warps (below), +1.0..+31 us a MoE layer at 1-2 rows (T204221Z)
    "router_route_1_warp_argmax": {("moe", "ROUTER_ROUTE_WARPS"): 1, ("moe", "ROUTE_SORT"): False},
    "router_route_argmax": {("moe", "ROUTE_SORT"): False},
    "gate_up_no_split_k": {("moe", "gate_up_tiling"): "no_split_k"},
    "norm_8_warps": {("norm", "NUM_WARPS"): 8},
    "norm_16_warps": {("norm", "NUM_WARPS"): 16},
    # loads before the wait (timed at 92e7739 as norm_w_early, latent_w_early, route_consts_early,
    # prepare_early, tiling_probe_20261207T132839Z): the norm's weight and its late launch of
    # the next kernel, off by default (norm.W_EARLY_MAX_ROWS, LATE_DEPENDENTS_MAX_ROWS); the
    # latent kernel's norm weights, routing's bias and positions and the indexer prepare's
    # inputs after their wait again, against their defaults (mla.LATENT_W_EARLY_MAX_ROWS,
    # moe.ROUTE_CONSTS_EARLY, indexer.PREPARE_EARLY)
    "norm_w_early": {("norm", "W_EARLY_MAX_ROWS"): 16},
    "norm_late_deps": {("norm", "LATE_DEPENDENTS_MAX_ROWS"): 16},
    "latent_w_late": {("mla", "LATENT_W_EARLY_MAX_ROWS"): 0},
    "route_consts_late": {("moe", "ROUTE_CONSTS_EARLY"): False},
    "prepare_late": {("indexer", "PREPARE_EARLY"): False},
    "loads_late": {("mla", "LATENT_W_EARLY_MAX_ROWS"): 0, ("moe", "ROUTE_CONSTS_EARLY"): False,
                   ("indexer", "PREPARE_EARLY"): False},
    # o_proj's weight scales before the wait in absorb_v + o_proj's one launch (one row)
    "vo_scales_early": {("attn_out", "SCALES_EARLY"): True},
    "latent_4_warps": {("mla", "LATENT_WARPS"): 4},
    # the latent kernel at every row count (the default), or q_b norming c_q itself up to 1,
    # 2 (the default to 3f039dc) or 4 rows
    "latent_kernel": {("mla", "LATENT_IN_Q_B_MAX_ROWS"): 0},
    "latent_in_q_b_to_1": {("mla", "LATENT_IN_Q_B_MAX_ROWS"): 1},
    "latent_in_q_b_to_2": {("mla", "LATENT_IN_Q_B_MAX_ROWS"): 2},
    "latent_in_q_b_to_4": {("mla", "LATENT_IN_Q_B_MAX_ROWS"): 4},
    "latent_8_warps": {("mla", "LATENT_WARPS"): 8},
    "latent_32_warps": {("mla", "LATENT_WARPS"): 32},
    "sum_block_256": {("moe", "SUM_BLOCK"): 256},
    "sum_block_512": {("moe", "SUM_BLOCK"): 512},
    "sum_block_2048": {("moe", "SUM_BLOCK"): 2048},
    "absorb_block_c_32": {("mla", "ABSORB_BLOCK_C"): 32},
    "absorb_block_c_128": {("mla", "ABSORB_BLOCK_C"): 128},
    "absorb_chunk_d_64": {("mla", "ABSORB_CHUNK_FROM_ROWS"): 1},
    "absorb_no_chunk": {("mla", "ABSORB_CHUNK_FROM_ROWS"): 1 << 30},
    "absorb_v_8_warps": {("mla", "ABSORB_V_WARPS"): 8},
    "attn_4_warps": {("mla", "ATTN_WARPS"): 4},
    # 16 warps a program (its [16, 512] fp32 accumulator 16 registers a thread), with 64 or
    # 128 entries a step, or without the double buffer at 4 steps
    "attn_16_warps": {("mla", "ATTN_WARPS"): 16},
    "attn_16_warps_block_128": {("mla", "ATTN_WARPS"): 16, ("mla", "ATTN_BLOCK_T"): 128},
    "attn_16_warps_no_double_buffer": {("mla", "ATTN_WARPS"): 16,
                                       ("mla", "ATTN_DOUBLE_BUFFER_FROM_STEPS"): 1 << 30},
    "attn_3_stages": {("mla", "ATTN_STAGES"): 3},
    "attn_1_stage": {("mla", "ATTN_STAGES"): 1},
    "attn_block_32": {("mla", "ATTN_BLOCK_T"): 32},
    "attn_block_32_3_stages": {("mla", "ATTN_BLOCK_T"): 32, ("mla", "ATTN_STAGES"): 3},
    # the attention loading the next step's slots (1, the default) or also its KV rows (2)
    # first, or neither (0); with 3 or more stages Triton double-buffers the KV rows
    "attn_plain_loop": {("mla", "ATTN_AHEAD"): 0},
    "attn_block_32_4_stages": {("mla", "ATTN_BLOCK_T"): 32, ("mla", "ATTN_STAGES"): 4},
    # 128 entries a step where a chunk has them (8 rows and more): two MMA column tiles a warp
    # in q . K (one serial chain of 36 MMAs a warp at 64), 170 KB of shared memory, 229 registers
    "attn_block_128": {("mla", "ATTN_BLOCK_T"): 128},
    "attn_no_double_buffer": {("mla", "ATTN_DOUBLE_BUFFER_FROM_STEPS"): 1 << 30},
    "attn_ahead_2": {("mla", "ATTN_AHEAD"): 2},
    # the linears' and gate/up's MMA loops loading each group's scales in the iteration that
    # uses them (default: an iteration ahead, fp8_linear.SCALES_AHEAD)
    "scales_in_step": {("fp8_linear", "SCALES_AHEAD"): False},
    # gate/up's 64-column tiles (9-12 rows) loading their scales an iteration ahead too
    "gate_up_64_scales_ahead": {("moe", "GATE_UP_64_SCALES_AHEAD"): True},
    "attn_ahead_2_two_stages": {("mla", "ATTN_AHEAD"): 2,
                                ("mla", "ATTN_DOUBLE_BUFFER_FROM_STEPS"): 1 << 30},
    "attn_ahead_2_block_32": {("mla", "ATTN_AHEAD"): 2, ("mla", "ATTN_BLOCK_T"): 32},
    # two 4-warp programs a multiprocessor (188 registers, 56 KB at 32 entries a step: ptxas,
    # CPU), so twice the programs in one wave
    "attn_4_warps_block_32_256_programs": {("mla", "ATTN_WARPS"): 4, ("mla", "ATTN_BLOCK_T"): 32,
                                           ("mla", "ATTN_PROGRAMS"): 256},
    "attn_4_warps_block_32_3_stages_256_programs": {
        ("mla", "ATTN_WARPS"): 4, ("mla", "ATTN_BLOCK_T"): 32, ("mla", "ATTN_STAGES"): 3,
        ("mla", "ATTN_PROGRAMS"): 256},
    # programmatic dependent launch + L2 prefetch up to 16 rows (default: up to 8), for
    # every kernel or all but the MoE's expert kernels (overlap.WIDE_MAX_ROWS), or those only
    # up to 4 rows
    "overlap_16": {("overlap", "MAX_ROWS"): 16, ("overlap", "WIDE_MAX_ROWS"): 16},
    "overlap_16_narrow": {("overlap", "MAX_ROWS"): 16},
    "overlap_16_narrow_wide_to_4": {("overlap", "MAX_ROWS"): 16, ("overlap", "WIDE_MAX_ROWS"): 4},
    "overlap_to_8": {("overlap", "MAX_ROWS"): 8},  # the default before 2026-12-03
    # one expert kernel overlapped up to 16 rows, the others not (overlap.WIDE_KERNEL_MAX_ROWS)
    **{f"{k}_overlap_16": {("overlap", "WIDE_KERNEL_MAX_ROWS"): {k: 16}}
       for k in ("gate_up", "down", "sum")},
    "gate_up_sum_overlap_16": {("overlap", "WIDE_KERNEL_MAX_ROWS"): {"gate_up": 16, "sum": 16}},
    # down overlapped only up to 2 rows (the bound before 2026-12-03), as before (also with
    # every prefetch on), or up to 16; down_prefetch below
    "down_plain_from_3": {("overlap", "WIDE_KERNEL_MAX_ROWS"): {"gate_up": 16, "sum": 16}},
    "down_as_before": {("overlap", "WIDE_KERNEL_MAX_ROWS"): {"gate_up": 16, "sum": 16},
                       ("overlap", "PREFETCH_OFF"): frozenset()},
    "down_overlap_to_16": {("overlap", "WIDE_KERNEL_MAX_ROWS"):
                           {"gate_up": 16, "sum": 16, "down": 16}},
    # one more stage kernel without its prefetch before the wait, or one of overlap.PREFETCH_OFF
    # with it (gate/up's: its shared-expert or dense programs'), every one without, and the
    # dense MLP's gate/up overlapped up to 16 rows without it
    **{f"{k}_no_prefetch": {("overlap", "PREFETCH_OFF"): PREFETCH_OFF | {k}}
       for k in PREFETCH_KERNELS if k not in PREFETCH_OFF},
    **{f"{k}_prefetch": {("overlap", "PREFETCH_OFF"): PREFETCH_OFF - {k}} for k in PREFETCH_OFF},
    "no_prefetch": {("overlap", "PREFETCH_OFF"): frozenset(PREFETCH_KERNELS)},
    "dense_gate_up_overlap": {("overlap", "WIDE_KERNEL_MAX_ROWS"):
                              {"gate_up": 16, "sum": 16, "down": 12, "dense_gate_up": 16}},
    "dense_gate_up_overlap_no_prefetch": {("overlap", "WIDE_KERNEL_MAX_ROWS"):
                                          {"gate_up": 16, "sum": 16, "down": 12,
                                           "dense_gate_up": 16},
                                          ("overlap", "PREFETCH_OFF"):
                                          frozenset({"gate_up", "down"})},
    # the MoE's expert kernels overlapped up to 8 rows (the others' bound), or up to 2 or 1
    **{f"overlap_wide_to_{r}": {("overlap", "WIDE_MAX_ROWS"): r} for r in (8, 4, 2, 1)},
    # the attention loading its first step's KV rows into registers before its wait in no
    # program, or in programs of any number of steps (default: of up to two)
    "attn_no_preload": {("mla", "ATTN_PRELOAD_MAX_STEPS"): 0},
    "attn_preload_every_chunk": {("mla", "ATTN_PRELOAD_MAX_STEPS"): 1 << 30},
    # absorb summing q_b's split-K partials itself at every row count, or reading the rows
    # q_b's tails sum from one row (default: from mla.ABSORB_Q_ROWS_FROM rows)
    "absorb_q_partials": {("mla", "ABSORB_Q_ROWS_FROM"): 1 << 30},
    "absorb_q_rows_from_1": {("mla", "ABSORB_Q_ROWS_FROM"): 1},
    "absorb_q_rows_no_chunk": {("mla", "ABSORB_CHUNK_FROM_ROWS"): 1 << 30},
    "absorb_q_rows_block_c_128": {("mla", "ABSORB_BLOCK_C"): 128},
    "absorb_q_rows_block_c_32": {("mla", "ABSORB_BLOCK_C"): 32},
    # warps of route's one-program-per-row form (default 4)
    **{f"route_per_row_{w}_warps": {("moe", "ROUTE_PER_ROW_WARPS"): w} for w in (1, 2, 8)},
    # the layer's dense weights prefetched into L2 by its first kernel
    "layer_prefetch": {("overlap", "LAYER_PREFETCH"): True},
    "next_layer_prefetch": {("overlap", "NEXT_LAYER_PREFETCH"): True},
    "both_prefetch": {("overlap", "LAYER_PREFETCH"): True, ("overlap", "NEXT_LAYER_PREFETCH"): True},
    "fp8_linear_8_warps": {("fp8_linear", "NUM_WARPS"): 8},
    "down_block_64": {("moe", "down_block"): "down_64"},
    "down_block_256": {("moe", "down_block"): "down_256"},
    "down_8_warps": {("moe", "DOWN_WARPS"): 8},
    "down_block_64_8_warps": {("moe", "down_block"): "down_64", ("moe", "DOWN_WARPS"): 8},
    # the dense MLP's own tilings from 2 rows (moe.DENSE_GATE_UP_TILING, DENSE_DOWN): gate/up
    # (BLOCK_N, GROUPS, SPLIT_K), down (BLOCK_N, warps); dense_as_moe: the MoE's
    "dense_as_moe": {("moe", "DENSE_GATE_UP_TILING"): None, ("moe", "DENSE_DOWN"): None},
    **{f"dense_gu_{n}_{g}_{k}": {("moe", "DENSE_GATE_UP_TILING"): (n, g, k)}
       for n, g, k in ((32, 2, 4), (16, 2, 4), (64, 2, 4), (32, 2, 8), (16, 4, 4), (32, 2, 2))},
    **{f"dense_down_{n}_{w}": {("moe", "DENSE_DOWN"): (n, w)}
       for n, w in ((64, 8), (64, 4), (32, 4), (32, 8), (16, 4))},
    # the MoE's last-arrival tails (arrival.py) off, one at a time (the down+sum tail tried
    # in tiling_probe_20261130T144611Z is gone)
    "no_route_tail": {("moe", "ROUTE_TAIL_MAX_ROWS"): 0},
    "no_swiglu_tail": {("moe", "SWIGLU_TAIL"): False},
    "route_kernel_1_warp": {("moe", "ROUTE_TAIL_MAX_ROWS"): 0, ("moe", "ROUTE_WARPS"): 1},
    "route_kernel_2_warps": {("moe", "ROUTE_TAIL_MAX_ROWS"): 0, ("moe", "ROUTE_WARPS"): 2},
    "route_kernel_4_warps": {("moe", "ROUTE_TAIL_MAX_ROWS"): 0, ("moe", "ROUTE_WARPS"): 4},
    "route_one_program": {("moe", "ROUTE_PER_ROW_MIN_ROWS"): 1 << 30},
    "router_route_2_warps": {("moe", "ROUTER_ROUTE_WARPS"): 2},
    "router_route_8_warps": {("moe", "ROUTER_ROUTE_WARPS"): 8},
    "router_route_1_warp": {("moe", "ROUTER_ROUTE_WARPS"): 1},
    # route's top-k as one bitonic top-k (moe.ROUTE_SORT), and the router's GEMV routing up to
    # 16 rows as its tail (8 warps from 3 rows) rather than a second, one-program-a-row kernel
    "route_sort": {("moe", "ROUTE_SORT"): True},
    "route_sort_tail_16": {("moe", "ROUTE_SORT"): True, ("moe", "ROUTE_TAIL_MAX_ROWS"): 16},
    "route_sort_tail_16_4_warps": {("moe", "ROUTE_SORT"): True,
                                   ("moe", "ROUTE_TAIL_MAX_ROWS"): 16,
                                   ("moe", "ROUTER_ROUTE_WARPS_ABOVE_2"): 4},
    "route_tail_16": {("moe", "ROUTE_TAIL_MAX_ROWS"): 16},
    # down reading route's slot table, weights and ranks after its wait (moe.DOWN_TABLE_EARLY
    # off); absorb_v loading its w_vc tile after the merge (mla.ABSORB_V_W_EARLY off)
    "down_table_late": {("moe", "DOWN_TABLE_EARLY"): False},
    "absorb_v_w_late": {("mla", "ABSORB_V_W_EARLY"): False},
    # absorb's w_kc tile early in every layer at 1-2 rows or in none (default: with the
    # indexer, mla.ABSORB_W_EARLY_MAX_ROWS)
    "absorb_w_early": {("mla", "ABSORB_W_EARLY_WITHOUT_INDEXER"): True},
    "absorb_w_late": {("mla", "ABSORB_W_EARLY_MAX_ROWS"): 0},
    # the expert kernels' own overlap bounds as before 2026-12-03 (all to WIDE_MAX_ROWS)
    "wide_kernels_to_2": {("overlap", "WIDE_KERNEL_MAX_ROWS"): {}},
    "sum_pos_late": {("moe", "SUM_POS_EARLY"): False},
    # absorb's q_pe roped in each head's first column program at every row count, or in
    # programs of its own at every row count (mla.ABSORB_PE_OWN_FROM_ROWS)
    "absorb_pe_in_first": {("mla", "ABSORB_PE_OWN_FROM_ROWS"): 1 << 30},
    "absorb_pe_own_always": {("mla", "ABSORB_PE_OWN_FROM_ROWS"): 1},
    # the KV-cache row's position and slot read after the wait (mla.KV_SLOT_EARLY off)
    "kv_slot_late": {("mla", "KV_SLOT_EARLY"): False},
    "all_late": {("moe", "DOWN_TABLE_EARLY"): False, ("mla", "ABSORB_V_W_EARLY"): False,
                 ("moe", "SUM_POS_EARLY"): False},
    "route_per_row_1_warp": {("moe", "ROUTE_PER_ROW_WARPS"): 1},
    "route_per_row_2_warps": {("moe", "ROUTE_PER_ROW_WARPS"): 2},
    # the split top-k's threshold (default: rows wider than 2048), at --ctx above 2048
    "split_topk_off": {("topk", "SPLIT_MIN_WIDTH"): 1 << 30},
    "split_topk_above_8192": {("topk", "SPLIT_MIN_WIDTH"): 8192},
    # the split top-k as one launch where its programs fit at once (default: six launches,
    # topk.ONE_LAUNCH), or in six
    "topk_one_launch": {("topk", "ONE_LAUNCH"): True},
    "topk_six_launches": {("topk", "ONE_LAUNCH"): False},
    # the split top-k's first pass folded into the index scores (their first-digit histograms
    # added up by atomics; opt-in, topk.SCORES_HISTOGRAM): five launches instead of six
    "scores_histogram": {("topk", "SCORES_HISTOGRAM"): True},
    # the split top-k's programs loading 32 chunks' histograms / counts at once (default one a
    # loop step: topk.SPLIT_SUM_BLOCK)
    "topk_sum_32": {("topk", "SPLIT_SUM_BLOCK"): 32},
    # the split top-k without its count pass (five launches; default six: topk.SKIP_COUNT_PASS),
    # and with its first pass in the index scores too (four)
    "topk_no_count_pass": {("topk", "SKIP_COUNT_PASS"): True},
    "topk_four_launches": {("topk", "SKIP_COUNT_PASS"): True, ("topk", "SCORES_HISTOGRAM"): True,
                           ("topk", "SPLIT_SUM_BLOCK"): 32},
    # a program a block of the index scores up to 2048 a row however many rows (default at
    # most indexer.score_row_programs), and a split top-k program a chunk however
    # many (default at most topk.SPLIT_MAX_PROGRAMS): wide slot tables (--width)
    "scores_grid_per_row": {("indexer", "SCORE_MAX_PROGRAMS"): 1 << 30},
    "topk_grid_per_chunk": {("topk", "SPLIT_MAX_PROGRAMS"): 1 << 30},
    # n a launch whatever the rows (up to 2048 a row): fewer programs exiting in a wide
    # table, more looping at long contexts (default indexer.score_row_programs)
    **{f"scores_programs_{n}": {("indexer", "SCORE_MAX_PROGRAMS"): n,
                                ("indexer", "SCORE_MIN_ROW_PROGRAMS"): 1}
       for n in (2048, 4096, 8192)},
    "topk_programs_256": {("topk", "SPLIT_MAX_PROGRAMS"): 256},
    "topk_programs_1024": {("topk", "SPLIT_MAX_PROGRAMS"): 1024},
    # the index scores' looping form (wide tables) without its register cap (72 registers:
    # 7 programs a multiprocessor instead of 8; default indexer.SCORE_LOOP_MAXNREG)
    "scores_loop_regs_255": {("indexer", "SCORE_LOOP_MAXNREG"): 255},
    # the index scores as q x keys^T (default keys x q^T on FP8 wgmma: indexer.SCORE_SWAP)
    "scores_q_keys": {("indexer", "SCORE_SWAP"): False},
    "scores_every_row": {("indexer", "SCORE_SKIP_SHORT_ROWS"): False},
    "kw_own_launch": {("mla", "KW_IN_LATENT"): False},
    # context positions (and warps) a scores program of the stage kernels (default 64, 4;
    # ptxas for sm_90a: 62 registers, so 8 programs a multiprocessor; 64 x 2 warps 106, 32 x 2
    # warps 62: 16 programs)
    **{f"score_block_{b}_{w}_warps": {("indexer", "SCORE_BLOCK"): b, ("indexer", "SCORE_WARPS"): w}
       for b, w in ((128, 4), (256, 4), (256, 8), (32, 4), (64, 2), (32, 2))},
    # query heads per indexer prepare program (default 4; 32: one program per row)
    "prepare_heads_2": {("indexer", "PREPARE_HEADS"): 2},
    "prepare_heads_8": {("indexer", "PREPARE_HEADS"): 8},
    "prepare_heads_32": {("indexer", "PREPARE_HEADS"): 32},
    # absorb_v in one latent chunk or 8 (default 4: results/tiling_probe_20261130T210744Z),
    # merging the attention's chunks at no row count or at every one (default: at one row)
    "absorb_v_split_1": {("mla", "ABSORB_V_SPLIT_C"): 1},
    "absorb_v_split_8": {("mla", "ABSORB_V_SPLIT_C"): 8},
    "absorb_v_no_merge": {("mla", "ABSORB_V_MERGE_MAX_ROWS"): 0},
    "absorb_v_merge_16": {("mla", "ABSORB_V_MERGE_MAX_ROWS"): 16},
    # absorb on the tensor cores at every row count (default: without them at 1-2 rows,
    # mla.ABSORB_GEMV_MAX_ROWS); its form without them over latent columns x q_nope chunk x
    # warps, up to 2, 4 or 8 rows
    "absorb_dot": {("mla", "ABSORB_GEMV_MAX_ROWS"): 0},
    **{f"absorb_gemv_{c}_chunk_{d}_warps_{w}_to_{r}": {
        ("mla", "ABSORB_GEMV_MAX_ROWS"): r, ("mla", "ABSORB_GEMV_BLOCK_C"): c,
        ("mla", "ABSORB_GEMV_CHUNK_D"): d, ("mla", "ABSORB_GEMV_WARPS"): w}
       for c in (16, 32) for d in (64, 128) for w in (2, 4, 8) for r in (2, 4, 8)},
    "down_block_128": {("moe", "down_block"): "down_128"},
    # the FP8 linears' split K sized to at least 264 programs (default: at most, one wave)
    "fp8_linear_fill_twice": {("fp8_linear", "ONE_WAVE"): False},
    # up to two waves of attention programs (default one: mla.ATTN_PROGRAMS)
    "attn_two_waves": {("mla", "ATTN_PROGRAMS"): 256},
    # a row's top-k in a power-of-two number of chunks (before mla.attention_splits dealt
    # blocks out unevenly: 8 chunks of 4 steps at 9-12 rows, now 11 of at most 3), or 128
    # programs at most (12 rows then take 8 chunks)
    "attn_pow2_splits": {("mla", "ATTN_POW2_SPLITS"): True, ("mla", "ATTN_PROGRAMS"): 128},
    "attn_programs_128": {("mla", "ATTN_PROGRAMS"): 128},
    # the latent KV rows in one column tile or in 4 (default mla.ATTN_PARTS 8, from
    # ATTN_PARTS_FROM_STEPS loop steps), or in 8 at every step count; the score in two MMA
    # chains (default one); 8 tiles at every step count and two programs a multiprocessor
    # (128 registers; or 4 warps: 146, a step 774 instructions a warp, 3096 a program against
    # 3504 at 8 warps; 92 KB at 2 stages). Measured against one tile at every step count:
    # results/tiling_probe_20261201T212315Z (its attn_parts_N: N tiles, two chains)
    "attn_one_tile": {("mla", "ATTN_PARTS"): 1},
    "attn_parts_4": {("mla", "ATTN_PARTS"): 4},
    "attn_parts_every_step": {("mla", "ATTN_PARTS_FROM_STEPS"): 1},
    # 2-step programs (5-8 rows) in tiles without the first step preloaded: on an H200 -0.3..
    # +3.4 us a layer at 5-8 rows (results/tiling_probe_20261201T213907Z), not taken
    "attn_parts_from_2_no_preload_at_2": {("mla", "ATTN_PARTS_FROM_STEPS"): 2,
                                          ("mla", "ATTN_PRELOAD_MAX_STEPS"): 1},
    "attn_chains_2": {("mla", "ATTN_QK_CHAINS"): 2},
    "attn_parts_8_programs_264": {("mla", "ATTN_PARTS_FROM_STEPS"): 1,
                                  ("mla", "ATTN_PROGRAMS"): 264, ("mla", "ATTN_MAXNREG"): 128},
    "attn_parts_8_4_warps_programs_264": {("mla", "ATTN_PARTS_FROM_STEPS"): 1,
                                          ("mla", "ATTN_PROGRAMS"): 264, ("mla", "ATTN_WARPS"): 4},
    # 3 loop steps (9-12 rows) with 3 stages or the first step preloaded (default 2, none)
    "attn_3_stages_from_3_steps": {("mla", "ATTN_DOUBLE_BUFFER_FROM_STEPS"): 3},
    "attn_preload_to_3_steps": {("mla", "ATTN_PRELOAD_MAX_STEPS"): 3},
    # gate/up at 1-2 rows (default 32 columns, 2 groups a step, K in 4 chunks)
    "gate_up_n16": {("moe", "gate_up_tiling"): "gu_16_2_4"},
    "gate_up_n64": {("moe", "gate_up_tiling"): "gu_64_2_4"},
    "gate_up_groups_1": {("moe", "gate_up_tiling"): "gu_32_1_4"},
    "gate_up_groups_4": {("moe", "gate_up_tiling"): "gu_32_4_4"},
    "gate_up_n16_groups_4_split_2": {("moe", "gate_up_tiling"): "gu_16_4_2"},
    # at 1-2 rows, where gate/up's routed programs each take the top-8 (ROUTE_IN_GATE_UP_MAX_ROWS):
    # half the split K (fewer programs sorting), with 32 or 64 columns a program
    "gate_up_split_2": {("moe", "gate_up_tiling"): "gu_32_2_2"},
    "gate_up_n64_split_2": {("moe", "gate_up_tiling"): "gu_64_2_2"},
    # the dense MLP's gate/up and down on the tensor cores at one row too (default: a MoE
    # layer's experts on them at every row count, the dense MLP without them at one row:
    # moe.GEMV_MAX_ROWS, DENSE_GEMV_MAX_ROWS); a MoE layer's experts without them at one row
    # (the setting before tiling_probe_20261201T212315Z's moe_mma_at_1), or both kinds at 2
    # rows; a MoE layer's gate/up at one row in the deep form (GATE_UP_DEEP_ROWS); their GEMV
    # tilings at one row (default: gate/up 16 columns, 4 groups a step, K in 4 chunks; down 32
    # columns, up to 4 groups a step, 4 warps); the FP8 linears without them
    # (fp8_linear.GEMV_MAX_ROWS)
    "moe_dot": {("moe", "DENSE_GEMV_MAX_ROWS"): 0},
    "moe_gemv_at_1": {("moe", "GEMV_MAX_ROWS"): 1},
    "moe_gemv_to_2": {("moe", "GEMV_MAX_ROWS"): 2, ("moe", "DENSE_GEMV_MAX_ROWS"): 2},
    "moe_deep_at_1": {("moe", "GATE_UP_DEEP_ROWS"): (1, 2, 7, 8)},
    **{f"moe_gemv_gu_{n}_{g}_{s}": {("moe", "GATE_UP_GEMV_TILING"): (n, g, s)}
       for n, g, s in ((16, 2, 8), (32, 2, 8), (32, 4, 4), (16, 8, 2), (16, 2, 12), (16, 4, 6),
                       (16, 2, 4))},
    **{f"moe_gemv_down_{n}": {("moe", "DOWN_GEMV_BLOCK"): n} for n in (16, 64)},
    "moe_gemv_down_groups_2": {("moe", "DOWN_GEMV_GROUPS"): 2},
    "moe_gemv_down_groups_8": {("moe", "DOWN_GEMV_GROUPS"): 8},
    "moe_gemv_warps_2": {("moe", "GEMV_WARPS"): 2},
    "moe_gemv_warps_8": {("moe", "GEMV_WARPS"): 8},
    "linear_gemv": {("fp8_linear", "GEMV_MAX_ROWS"): 1},
    **{f"linear_gemv_{n}_{g}": {("fp8_linear", "GEMV_MAX_ROWS"): 1,
                                ("fp8_linear", "GEMV_BLOCK_N"): n, ("fp8_linear", "GEMV_GROUPS"): g}
       for n, g in ((16, 4), (32, 4), (16, 2), (32, 2), (16, 8))},
    # the bf16 GEMVs (the router's, the indexer's wk|weights_proj) on the tensor cores at one
    # rows too (default: one load a K chunk without them up to bf16_linear.GEMV_MAX_ROWS), or
    # without them only at one row
    "bf16_dot": {("bf16_linear", "GEMV_MAX_ROWS"): 0},
    "bf16_gemv_to_1": {("bf16_linear", "GEMV_MAX_ROWS"): 1},
    # down on the tensor cores (2 rows and more) without the register cap (146 registers at
    # 4 warps: 3 programs a multiprocessor), in 3 or 1 pipeline stages (44 or 4 KB of shared
    # memory; default 2, 24 KB)
    "down_3_stages_no_cap": {("moe", "DOWN_MAXNREG"): None, ("moe", "DOWN_MAXNREG_FEW_ROWS"): None,
                             ("moe", "DOWN_STAGES"): 3},
    "down_no_cap": {("moe", "DOWN_MAXNREG"): None, ("moe", "DOWN_MAXNREG_FEW_ROWS"): None},
    "down_3_stages": {("moe", "DOWN_STAGES"): 3},
    "down_1_stage": {("moe", "DOWN_STAGES"): 1},
    # 96 registers (default from moe.DOWN_MAXNREG_FROM_ROWS) at every row count, or 128 at
    # none (5 or 4 programs a multiprocessor; no spill with the transposed MMAs)
    "down_maxnreg_96": {("moe", "DOWN_MAXNREG_FROM_ROWS"): 1},
    "down_maxnreg_128": {("moe", "DOWN_MAXNREG"): 128},
    "down_maxnreg_96_1_stage": {("moe", "DOWN_MAXNREG_FROM_ROWS"): 1, ("moe", "DOWN_STAGES"): 1},
    "down_block_64_maxnreg_96": {("moe", "down_block"): "down_64",
                                 ("moe", "DOWN_MAXNREG_FROM_ROWS"): 1},
    # half the programs, each twice as wide: 256 columns at 8 warps under the cap (128
    # registers, no spill, 40 KB: 2 programs a multiprocessor, as many weight bytes in flight).
    # With the transposed MMAs, at 02924e4 on an H200: +0.1..+0.7 us a MoE layer at 2-16 rows
    # (alternated twice in one process; not kept)
    "down_block_256_8_warps": {("moe", "down_block"): "down_256", ("moe", "DOWN_WARPS"): 8},
    # the MMAs untransposed (x . W_tile^T: 16 rows force the synchronous MMA, the weight tile
    # through registers) in the linears (q_a|kv_a, q_b, o_proj) or in down (default: the
    # weight tile as the asynchronous MMA's 64-row side, fp8_linear.swap)
    "linear_no_swap": {("fp8_linear", "SWAP"): False},
    "down_no_swap": {("moe", "DOWN_SWAP"): False},
    "gate_up_no_swap": {("moe", "GATE_UP_SWAP"): False},
    # gate and up as two 32-row synchronous MMAs, not one stacked 64-row transposed one
    # (moe.GATE_UP_STACK); or stacked at 64 columns too (128 rows, default two 64-row swaps)
    "gate_up_no_stack": {("moe", "GATE_UP_STACK"): False},
    "gate_up_stack_64": {("moe", "GATE_UP_STACK_COLUMNS"): (32, 64)},
    # a MoE layer's gate/up in 32-column tiles at every row count from 3 (default 64 at
    # moe.GATE_UP_64_COLUMN_ROWS)
    "gate_up_32_always": {("moe", "GATE_UP_64_COLUMN_ROWS"): range(0)},
    # ... with 9-12 rows in the deep form (1 group, 4 stages) or in 2 stages
    "gate_up_32_deep_9_12": {("moe", "GATE_UP_64_COLUMN_ROWS"): range(0),
                             ("moe", "GATE_UP_DEEP_ROWS"): (2, 7, 8, 9, 10, 11, 12)},
    "gate_up_32_2_stages_from_9": {("moe", "GATE_UP_64_COLUMN_ROWS"): range(0),
                                   ("moe", "GATE_UP_2_STAGES_FROM_ROWS"): 9},
    # the linears' split K sized for 3 programs a multiprocessor (60 KB of shared memory each
    # since one _tile serves both matrices and the MMAs run transposed; default 2)
    "linear_programs_396": {("fp8_linear", "TARGET_PROGRAMS"): 396},
    # the linears in tiles of 128 columns (the transposed MMA's two 64-row halves), 2 or 1
    # groups a step (default 64 columns, 2 groups)
    "linear_block_128": {("fp8_linear", "tiling"): "linear_128_2"},
    "linear_block_128_1_group": {("fp8_linear", "tiling"): "linear_128_1"},
    # 64 columns in 1 or 4 groups a step (default 2): more or fewer loop iterations, each
    # cheaper since the scales load an iteration ahead (fp8_linear.SCALES_AHEAD); with 4,
    # ptxas gives a program 120 KB of shared memory (3 stages): one a multiprocessor (CPU)
    "linear_groups_1": {("fp8_linear", "tiling"): "linear_64_1"},
    "linear_groups_4": {("fp8_linear", "tiling"): "linear_64_4"},
    # a MoE layer's gate/up in 2 pipeline stages from 2, 3, 9 or 12 rows, or at no row count
    # (default: from moe.GATE_UP_2_STAGES_FROM_ROWS; the deep rows keep their 4)
    **{f"gate_up_2_stages_from_{r}": {("moe", "GATE_UP_2_STAGES_FROM_ROWS"): r}
       for r in (2, 3, 9, 12)},
    "dense_gate_up_2_stages": {("moe", "DENSE_GATE_UP_STAGES"): 2},
    # gate/up on the tensor cores in `s` stages and `g` groups a step at every row count and
    # layer kind (default: moe.gate_up_stages, gate_up_tiling)
    **{f"gate_up_stages_{s}": {("moe", "GATE_UP_STAGES"): s} for s in (2, 3)},
    **{f"gate_up_groups_1_stages_{s}": {("moe", "GATE_UP_GROUPS"): 1, ("moe", "GATE_UP_STAGES"): s}
       for s in (3, 4)},
    "gate_up_3_stages": {("moe", "GATE_UP_2_STAGES_FROM_ROWS"): 1 << 30},
    # a MoE layer's gate/up from 5 rows in one tiling (BLOCK_N, GROUPS, SPLIT_K; default
    # moe.gate_up_tiling's, 32 or 64 columns, 2 groups a step, no split K): a split K gives
    # twice the programs, each half the K
    **{f"wide_gu_{n}_{g}_{k}": {("moe", "gate_up_tiling"): f"wide_gu_{n}_{g}_{k}"}
       for n, g, k in WIDE_GATE_UP},
    "wide_gu_32_2_1_3_stages": {("moe", "gate_up_tiling"): "wide_gu_32_2_1",
                                ("moe", "GATE_UP_2_STAGES_FROM_ROWS"): 1 << 30},
    # o_proj, q_a|kv_a or both on the CuTe DSL linear (nvidia/sm90/fp8_mma; needs CuTe DSL:
    # sm90_run.sh layer)
    "sm90_o_proj": {("sm90", "O_PROJ"): True},
    "sm90_qkv_a": {("sm90", "QKV_A"): True},
    "sm90_linears": {("sm90", "O_PROJ"): True, ("sm90", "QKV_A"): True},
    # a MoE layer's experts on fp8_moe (nvidia/sm90/fp8_moe; sm90_run.sh layer)
    "sm90_moe": {("sm90", "MOE"): True},
    "sm90_moe_two_launches": {("sm90", "MOE"): True, ("sm90", "MOE_ONE_LAUNCH"): False},
    # the sparse attention on sparse_mla (nvidia/sm90/sparse_mla; sm90_run.sh attn) at every
    # row count, with 3 stages or 2 (results up to 9d37e48 were taken when the opt-in ran at
    # every row count with 3 stages: sm90_attn there is sm90_attn_every_row here). Since
    # sparse_mla is the default wherever it can run (after 9e54f0a), baseline takes it where
    # CuTe DSL is installed, triton_attn is Triton's kernel, and sm90_attn is what
    # sm90_attn_2_stages was in results up to 9e54f0a (every row, 2 stages)
    "sm90_attn": {("sm90", "ATTN"): True},
    "triton_attn": {("sm90", "ATTN"): False},
    "sm90_attn_every_row": {("sm90", "ATTN"): True, ("sm90", "ATTN_FROM_ROWS"): 1,
                            ("sm90", "ATTN_MAX_ROWS"): 16, ("sm90", "ATTN_STAGES"): 3},
    # noinc, l2, pingpong: forms measured and removed (sparse_mla's docstring)
    # two gathering warpgroups at every row count, or one (the default: two from 12 rows)
    "sm90_attn_2_gatherers": {("sm90", "ATTN"): True, ("sm90", "ATTN_GATHERERS_FROM_ROWS"): 1},
    "sm90_attn_1_gatherer": {("sm90", "ATTN"): True, ("sm90", "ATTN_GATHERERS_FROM_ROWS"): 99},
    "sm90_attn_no_pdl": {("sm90", "ATTN"): True, ("sm90", "ATTN_FROM_ROWS"): 1,
                         ("sm90", "ATTN_MAX_ROWS"): 16, ("sm90", "ATTN_PDL"): False},
    # q_a|kv_a + latent + q_b as attn_side's fixed-form launch (sm90.ATTN_SIDE, a layer without
    # the indexer; default up to sm90.ATTN_SIDE_MAX_ROWS rows where CuTe DSL is installed): off
    # (the three stage kernels), or up to 2 rows
    "attn_side_off": {("sm90", "ATTN_SIDE"): False},
    # the indexer's long-row top-k on the Triton split instead of cluster_topk
    "triton_topk": {("sm90", "TOPK"): False},
    # cluster_topk with a short context walking only its share of a thread's keys (SIZED on:
    # 4, 8, 16 or 32; or 4, 8 or 32), or a context past 64K loading each tile in turn
    # (PREFETCH off) or prefetching at any rows
    "topk_sized": {("cluster_topk", "SIZED"): True},
    "topk_sizes_4_8": {("cluster_topk", "SIZED"): True, ("cluster_topk", "HELD_SIZES"): (4, 8)},
    # ... or walking every key group it holds, predicated off past its share (SKIP off)
    "topk_no_skip": {("cluster_topk", "SKIP"): False},
    # ... or skipping in a held context's tally and write too and not in a reloaded one's
    # count (SKIP_WRITE on, SKIP_RELOADED off: the default since 144e264, as measured at
    # 18cba3f; topk_skip_count_only is the form before); 8 CTAs a row of a wide table at any rows
    # (WIDE_CLUSTER 8) or 16 (the default since 1727f5c, its form measured at 07a5bb0); the
    # four passes a loop up to PREFETCH_ROWS rows (ROLL, the default since 144e264).
    # topk_skip2, topk_cluster16 and topk_rolled are now the defaults' own knobs (the arms
    # that measured them)
    "topk_skip2": {("cluster_topk", "SKIP_WRITE"): True,
                   ("cluster_topk", "SKIP_RELOADED"): False},
    "topk_skip_count_only": {("cluster_topk", "SKIP_WRITE"): False,
                             ("cluster_topk", "SKIP_RELOADED"): True},
    "topk_cluster16": {("cluster_topk", "WIDE_CLUSTER"): 16},
    "topk_cluster8": {("cluster_topk", "WIDE_CLUSTER"): 8},
    "topk_rolled": {("cluster_topk", "ROLL"): True},
    # the forms before SKIP_WRITE, SKIP_RELOADED and ROLL became defaults (H100, 18cba3f)
    "topk_unrolled": {("cluster_topk", "ROLL"): False},
    # the passes rolled up to 16 rows, two CTAs an SM where the rows' clusters do not fit at
    # one (16 rows on an H100; measured when that was past 8 rows, H100 at 1d3a44c:
    # not faster at 16 rows)
    "topk_rolled_16": {("cluster_topk", "ROLL_ROWS"): 16},
    # the prefetching rolled form up to 8 rows, unrolled past: the form before it ran up to
    # the clusters of 8 the GPU holds at one CTA an SM (15 on an H100; measured at 0d214db as
    # topk_prefetch_15 against it, and topk_prefetch_15_unrolled, the prefetch unrolled past 8)
    "topk_prefetch_8": {("cluster_topk", "PREFETCH_ROWS"): 8},
    # the passes rolled without the prefetch up to 8 rows, unrolled past: the form before
    # ROLL_ROWS 15 (a table up to 64K wide at 9-15 rows; measured at 46530a5 as topk_rolled_15
    # against it)
    "topk_rolled_8": {("cluster_topk", "ROLL_ROWS"): 8},
    "topk_before_skip2_roll": {("cluster_topk", "SKIP_WRITE"): False,
                               ("cluster_topk", "SKIP_RELOADED"): True,
                               ("cluster_topk", "ROLL"): False},
    "topk_no_prefetch": {("cluster_topk", "PREFETCH"): False},
    # (as many rows as the GPU holds clusters of 8 at one CTA an SM: launch_form)
    "topk_prefetch_all": {("cluster_topk", "PREFETCH_ROWS"): 1 << 30},
    "attn_side_2": {("sm90", "ATTN_SIDE"): True, ("sm90", "ATTN_SIDE_MAX_ROWS"): 2},
    # attn_side launched without programmatic dependence, or letting the next kernel (absorb)
    # launch only as it ends
    "attn_side_no_pdl": {("sm90", "ATTN_SIDE_PDL"): False},
    "attn_side_late_dependents": {("sm90", "ATTN_SIDE_EARLY_DEPENDENTS"): False},
    # the stage kernels with absorb's early w_kc tile; attn_side with absorb prefetching it
    "attn_side_off_w_early": {("sm90", "ATTN_SIDE"): False,
                              ("mla", "ABSORB_W_EARLY_WITHOUT_INDEXER"): True},
    "attn_side_absorb_prefetch": {("sm90", "ATTN_SIDE_ABSORB_W_EARLY"): False},
    # in a layer that reuses the top-k, the attention launched as absorb's programs start
    # (its gather before its wait then runs during q_b; the default from
    # mla.ABSORB_EARLY_DEPENDENTS_FROM_ROWS rows), or only after absorb's wait; with two
    # gathering warpgroups from 4 rows, or three KV tiles in flight
    "absorb_early_dependents": {("mla", "ABSORB_EARLY_DEPENDENTS_FROM_ROWS"): 3},
    "absorb_late_dependents": {("mla", "ABSORB_EARLY_DEPENDENTS_FROM_ROWS"): 0},
    # with the attention beside it, absorb's w_kc tile loaded before its wait at every row
    # count (default: up to mla.ABSORB_W_EARLY_MAX_ROWS, with the indexer), or not prefetched.
    # At 78f0b17 on an H200 neither pays: the first -0.4..+2.4 us on a MoE layer and
    # -0.2..+0.7 dense at 2-16 rows (tiling_probe_20261205T051451Z), the second +0.8 / +1.5 at
    # 4 / 16 rows (T051419Z)
    "absorb_w_early_16": {("mla", "ABSORB_W_EARLY_MAX_ROWS"): 16,
                          ("mla", "ABSORB_W_EARLY_WITHOUT_INDEXER"): True},
    "absorb_no_prefetch": {("overlap", "PREFETCH_OFF"): PREFETCH_OFF | {"absorb"}},
    "absorb_early_dependents_2_gatherers": {("mla", "ABSORB_EARLY_DEPENDENTS_FROM_ROWS"): 3,
                                            ("sm90", "ATTN_GATHERERS_FROM_ROWS"): 4},
    "absorb_early_dependents_3_stages": {("mla", "ABSORB_EARLY_DEPENDENTS_FROM_ROWS"): 3,
                                         ("sm90", "ATTN_STAGES"): 3},
    # absorb_v and o_proj as one launch (attn_out) at every row count (default: 1 row, 512
    # columns a program): programs of 256 output columns (192 of 96 KB, two a
    # multiprocessor), of 512 (96, one), of 128 (384 of 64 KB: one fits beside an attention
    # CTA's 144 KB), or of 256 with the weights prefetched into L2 before the wait and loaded
    # after it. At c01c8f7 on an H200: -1.3..-1.6 us at 1 row, +0.1 at 2, +6.8..+20 from 4
    # (512), and the 256- and 128-column forms refused at 16 rows (not all resident):
    # tiling_probe_20261205T044837Z, T044923Z
    "vo_one_launch": {("attn_out", "MAX_ROWS"): 16, ("attn_out", "BLOCK_N"): 256},
    "vo_one_launch_512": {("attn_out", "MAX_ROWS"): 16, ("attn_out", "BLOCK_N"): 512},
    "vo_one_launch_128": {("attn_out", "MAX_ROWS"): 16, ("attn_out", "BLOCK_N"): 128},
    "vo_one_launch_l2": {("attn_out", "MAX_ROWS"): 16, ("attn_out", "BLOCK_N"): 256,
                         ("attn_out", "W_EARLY"): False},
    # ... with at most 8 programs a head multiplying a latent slice (half the atomics; 4 would
    # take 134-162 registers, one program a multiprocessor: not all 192 resident)
    "vo_one_launch_ls8": {("attn_out", "MAX_ROWS"): 16, ("attn_out", "BLOCK_N"): 256,
                          ("attn_out", "MAX_LATENT_SLICES"): 8},
    # ... after the attention's merge kernel from 2 rows (default: merged inside at every
    # row count), launched as the merge starts or only after its wait
    "vo_one_launch_combine": {("attn_out", "MAX_ROWS"): 16, ("attn_out", "BLOCK_N"): 256,
                              ("attn_out", "MERGE_MAX_ROWS"): 1},
    "vo_one_launch_combine_late": {("attn_out", "MAX_ROWS"): 16, ("attn_out", "BLOCK_N"): 256,
                                   ("attn_out", "MERGE_MAX_ROWS"): 1,
                                   ("attn_out", "EARLY_AFTER_COMBINE"): False},
    # the weight slots an attn_side worker asks for before its wait (default: its first lap)
    **{f"attn_side_early_{n}": {("sm90", "ATTN_SIDE_EARLY_SLOTS"): n} for n in (0, 2, 4)},
    # attn_side taking the layer's input norm (no norm launch before it) at 1-2 rows, or 1
    "attn_side_norm_in": {("sm90", "ATTN_SIDE_NORM_IN_MAX_ROWS"): 2},
    "attn_side_norm_in_1": {("sm90", "ATTN_SIDE_NORM_IN_MAX_ROWS"): 1},
    # a MoE layer's router on the un-normed row, no post-attention norm launch, at every row
    # count, or but at 2 rows (where gate/up's shared programs then wait: norm_router.ROWS)
    "norm_router": {("norm_router", "ROWS"): frozenset(range(1, 17))},
    "norm_router_not_2": {("norm_router", "ROWS"): frozenset(range(1, 17)) - {2}},
    "norm_router_to_2": {("norm_router", "ROWS"): frozenset({1, 2})},
    "norm_router_1": {("norm_router", "ROWS"): frozenset({1})},
    "norm_router_off": {("norm_router", "ROWS"): frozenset()},  # the default at 1-2 rows
    # ... with route reading one fixed-point sum of its products from 3 rows
    # (norm_router.FIXED_FROM_ROWS) instead of MMA_SHAPE's 24 K chunks
    "norm_router_fixed": {("norm_router", "ROWS"): frozenset(range(1, 17)),
                          ("norm_router", "FIXED_FROM_ROWS"): 3},
    # ... and its programs not asking L2 for the router's weights before their wait, which
    # they do while o_proj runs (o_proj 0.9 us slower at 4 rows with the form on an H100,
    # graph_timeline_20261207T073511Z against T073445Z)
    "norm_router_fixed_no_prefetch": {("norm_router", "ROWS"): frozenset(range(1, 17)),
                                      ("norm_router", "FIXED_FROM_ROWS"): 3,
                                      ("overlap", "PREFETCH_OFF"): PREFETCH_OFF | {"router"}},
    # ... at 1-2 rows with the sums of squares and gate/up's x written by the products' tile 0
    # (norm_router.QUANT_IN_PRODUCTS_MAX_ROWS; the default since b590c1c) or by programs of
    # their own (the default before it)
    "norm_router_quant_in_tile": {("norm_router", "ROWS"): frozenset({1, 2}),
                                  ("norm_router", "QUANT_IN_PRODUCTS_MAX_ROWS"): 2},
    "norm_router_own_quant_tile": {("norm_router", "ROWS"): frozenset({1, 2}),
                                   ("norm_router", "QUANT_IN_PRODUCTS_MAX_ROWS"): 0},
    # ... the default, its programs not asking L2 for the router's weights before their wait
    # (at 2 rows o_proj added 8.9 us with the form, 7.7 without: graph_timeline_20261207T103234Z
    # against T103312Z)
    "norm_router_no_prefetch": {("overlap", "PREFETCH_OFF"): PREFETCH_OFF | {"router"}},
    # ... with other tiles of its products from 3 rows (default norm_router.MMA_SHAPE)
    **{f"norm_router_mma_{n}_{k}": {("norm_router", "ROWS"): frozenset(range(1, 17)),
                                    ("norm_router", "MMA_SHAPE"): (n, k)}
       for n, k in ((16, 8), (64, 16), (128, 24))},
}


# variants whose knobs a layer reads when it is built get layers of their own: these
# attributes, and every sm90 opt-in (the layer reads them all at build; one missed made
# sm90_moe time the baseline, 2026-12-02)
BUILD_VARIANTS = {name for name, sets in VARIANTS.items()
                  if any(mod == "sm90" or attr in (
                      "ONE_WAVE", "TARGET_PROGRAMS", "ATTN_PROGRAMS", "GATE_UP_GEMV_TILING",
                      "DENSE_GATE_UP_TILING", "tiling", "gate_up_tiling")
                         for mod, attr in sets)}


def deltas(rows: list) -> dict:
    """{(kind, M): {variant: [us - mean of the nearest baseline before and after], ...}} from
    a probe's results in run order; "noise": [max - min of the baselines] where there are two
    or more."""
    groups = {}
    for r in rows:
        groups.setdefault((r["kind"], r["M"]), []).append(r)
    out = {}
    for key, seq in groups.items():
        base = [i for i, r in enumerate(seq) if r["variant"] == "baseline"]
        cell = {}
        for i, r in enumerate(seq):
            near = [b for b in base if b < i][-1:] + [b for b in base if b > i][:1]
            if r["variant"] != "baseline" and near:
                mean = sum(seq[b]["us"] for b in near) / len(near)
                cell.setdefault(r["variant"], []).append(r["us"] - mean)
        if len(base) > 1:
            cell["noise"] = [max(seq[b]["us"] for b in base) - min(seq[b]["us"] for b in base)]
        out[key] = cell
    return out


def table(rows: list) -> str:
    """``deltas`` as markdown: a line per (kind, M), the baselines' spread, then each
    variant's mean difference in us (negative: faster than the baseline)."""
    d = deltas(rows)
    variants = sorted({v for cell in d.values() for v in cell if v != "noise"})
    lines = ["| kind | M | noise | " + " | ".join(variants) + " |",
             "|---" * (len(variants) + 3) + "|"]
    for (kind, m), cell in sorted(d.items()):
        noise = f"{cell['noise'][0]:.1f}" if "noise" in cell else "n/a"
        vals = [f"{sum(cell[v]) / len(cell[v]):+.1f}" if v in cell else "" for v in variants]
        lines.append(f"| {kind} | {m} | {noise} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def knob_modules() -> dict:
    """The modules whose attributes VARIANTS set, by the names VARIANTS use."""
    from sgl_kernel_ext.nvidia import sm90
    from sgl_kernel_ext.triton import (attn_out, bf16_linear, fp8_linear, indexer, mla, moe,
                                       norm, norm_router, overlap, topk)

    modules = {"attn_out": attn_out, "bf16_linear": bf16_linear, "fp8_linear": fp8_linear,
               "indexer": indexer, "mla": mla, "moe": moe, "norm": norm,
               "norm_router": norm_router, "overlap": overlap, "topk": topk,
               "probe": sys.modules[__name__], "sm90": sm90}
    try:  # the CuTe DSL kernels' own knobs, where CuTe DSL is installed
        from sgl_kernel_ext.nvidia.sm90 import cluster_topk
    except ImportError:
        return modules
    modules["cluster_topk"] = cluster_topk
    return modules


@contextlib.contextmanager
def applied(name: str, modules: dict, derived: dict):
    """The variant's knob settings (VARIANTS[name]) in effect inside the block, restored after
    (a string value names one of ``derived_values``)."""
    sets = VARIANTS[name]
    saved = {k: getattr(modules[k[0]], k[1]) for k in sets}
    for (mod, attr), value in sets.items():
        setattr(modules[mod], attr, derived.get(value, value) if isinstance(value, str) else value)
    try:
        yield
    finally:
        for (mod, attr), value in saved.items():
            setattr(modules[mod], attr, value)


def derived_values(modules: dict) -> dict:
    """The callables a variant's string value names (each replaces a function of the same
    signature: gate_up_tiling(m, dense), down_block(m, dense), fp8_linear.tiling(n, k))."""
    moe, fp8_linear = modules["moe"], modules["fp8_linear"]
    return {"no_split_k": _no_split_k(moe.gate_up_tiling), "down_64": lambda m, dense=False: 64,
            "down_128": lambda m, dense=False: 128,
            "down_256": lambda m, dense=False: 256,
            **{f"gu_{n}_{g}_{s}": _few_rows_tiling(moe.gate_up_tiling, (n, g, s))
               for n, g, s in ((16, 2, 4), (64, 2, 4), (32, 1, 4), (32, 4, 4), (16, 4, 2),
                               (32, 2, 2), (64, 2, 2))},
            **{f"wide_gu_{n}_{g}_{k}": _wide_tiling(moe.gate_up_tiling, (n, g, k))
               for n, g, k in WIDE_GATE_UP},
            "linear_128_2": _linear_tiles(128, 2), "linear_128_1": _linear_tiles(128, 1),
            "linear_64_1": _linear_tiles(64, 1), "linear_64_4": _linear_tiles(64, 4),
            **{f"{name}_split_{s}": _linear_split(fp8_linear.tiling, *shape, s)
               for name, (shape, splits) in LINEAR_SPLITS.items() for s in splits}}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kinds", default="moe,moe_idx")
    p.add_argument("--ms", default="1,16")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--width", type=int, default=0,
                   help="the slot table's width (default --ctx; a server's spans its longest "
                        "context)")
    p.add_argument("--copies", type=int, default=4)
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--set", action="append", default=[],
                   help="module.ATTR=value before anything compiles (numerics_probe's)")
    p.add_argument("--out", default="")
    p.add_argument("--results", default=str(H.REPO / "benchmark" / "results"))
    p.add_argument("--table", default="", help="print this results file's verdict and exit")
    args = p.parse_args()
    if args.table:
        import json

        with open(args.table) as f:
            print(table(json.load(f)["results"]))
        return

    for setting in args.set:
        numerics_probe.apply(setting)
    from sglang.srt.layers.fused_decode.layer import FusedLayer, chain_prefetch
    from sglang.srt.layers.fused_decode.reference.config import glm53_config

    modules = knob_modules()
    derived = derived_values(modules)
    dev = torch.device("cuda")
    cfg = glm53_config()
    ms = [int(v) for v in args.ms.split(",")]
    geom = RL.Geometry.from_config(cfg)
    bw = H.measure_bandwidth(dev)
    meta = {"benchmark": "tiling_probe", "set": args.set, "ctx": args.ctx,
            "width": args.width or args.ctx, "copies": args.copies,
            "replays": args.replays, "bandwidth_Bps": bw, **H.run_meta(dev)}
    rows = []
    stamp = H.stamp_now()  # one file, rewritten after each row count (a killed run keeps them)
    for kind in args.kinds.split(","):
        ids = H.layer_ids_of_kind(cfg, kind, args.copies)
        base = H.gen_base(cfg, ids[0], 0, 8, dev)
        layers = [H.assemble(cfg, ids[0], base)]
        for lid in ids[1:]:
            layers.append(H.assemble(cfg, lid, H.clone_base(base)))
        del base
        caches = H.make_caches(cfg, ids, -(-(max(ms) * args.ctx) // 64) * 64, dev)

        def build():
            built = [FusedLayer(cfg, lw, caches, max(ms), persistent_launch=False)
                     for lw, _ in layers]
            chain_prefetch(built)
            return built

        fused = build()
        for m in ms:
            batch = H.make_batch(m, args.ctx, dev, args.width)
            hid, res, tprev = H.layer_inputs(cfg, m, args.ctx, dev)  # decode_layer's

            def run():
                h, r, t = hid, res, tprev
                for layer in current:
                    h, r, t = layer(h, r, pool, t)
                return h

            # the floor of this step's bytes (the experts its routing touched: decode_layer's)
            current, pool = fused, batch
            run()
            experts = H.experts_touched(fused, m)
            floor = RL.floor_us(RL.layer_bytes(kind, 8, m, args.ctx, "bf16", geom, experts), bw)

            for name in args.variants.split(","):
                with applied(name, modules, derived):
                    # a knob read when a layer is built (its buffers, its GEMMs' split K) gets
                    # layers of its own
                    current = build() if name in BUILD_VARIANTS else fused
                    pool = H.pool_batch(batch, POOL_SLOTS, POOL_DTYPE) if POOL_SLOTS else batch
                    try:
                        run()
                        us, _ = H.time_graph(run, args.replays)
                    except Exception as e:  # a form this step refuses: say so, time the rest
                        H.log(f"{kind} M={m} {name}: failed: {type(e).__name__}: {e}")
                        torch.cuda.synchronize()
                        continue
                    finally:
                        del current
                rows.append({"kind": kind, "M": m, "variant": name, "us": us / len(fused),
                             "experts_touched": experts, "floor_us": floor,
                             "fraction_of_floor": floor / (us / len(fused))})
                H.log(f"{kind} M={m} {name}: {rows[-1]['us']:.1f} us")
            H.write_json("tiling_probe", {"meta": meta, "results": rows},
                         [args.results, args.out], stamp)
        del layers, caches, fused
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
