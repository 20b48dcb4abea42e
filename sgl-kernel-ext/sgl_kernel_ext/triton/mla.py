"""MLA decode pieces for 1-16 rows, absorbed form, sparse over the indexer's top-k.

- ``latent``: RMSNorm of c_q and c_kv, interleaved rope of k_pe, and the KV-cache row
  [c_kv | k_pe] written at the row's slot (nothing for a pad row).
- ``absorb``: q_lat = q_nope . w_kc per head (bf16 out) and the roped q_pe, as one
  [rows, heads, kv_lora + rope] query; at 1-2 rows without the tensor cores (fp32
  multiply-and-sum over w_kc slices, ``ABSORB_GEMV_MAX_ROWS``), from 3 rows as MMAs.
- ``sparse_attention``: flash-decoding over the selected positions: each program takes one
  row and one chunk of its top-k for all of the rank's heads (the latent KV row is read once
  for every head), fp32 online softmax; ``combine`` merges the chunks (bf16 o_lat).
- ``absorb_v``: o = o_lat . w_vc per head (bf16), the o_proj input, in latent chunks with a
  last-arrival sum; at one row those programs also merge the attention's chunks, so no
  ``combine`` runs (``ABSORB_V_SPLIT_C``, ``ABSORB_V_MERGE_MAX_ROWS``).

w_kc and w_vc are read in place from kv_b [heads * (nope + v), kv_lora] (no derived copy).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import bf16_linear, fp8_linear, overlap
from .bf16_linear import _bf16_linear_task
from .fp8_linear import _fp8_linear_prefetch, _fp8_linear_task, interpreting, row_rms
from .arrival import arrive_last
from .overlap import launch_dependents, prefetch_l2, prefetch_rows, stage_begin
from .quant import load_fixed, store_row_groups, sum_parts, to_e4m3

# steps of at most this many rows run no latent kernel in a layer without the indexer:
# q_a|kv_a's last K chunk of each column tile sums the tile (fp8_linear.fp8_linear tails), and
# q_b's programs norm and quantize c_q themselves, one more program of its launch writing the
# KV-cache rows (q_b_normed). On an H200 the MoE layer is 0.6-0.9 us faster at 1-2 rows, the
# same at 4; layers with the indexer (q_b's launch carries wq_b: 264 programs of 6 groups, each
# norming its groups) 3.0-3.6 us slower at 1-2 rows, 4 at 4: they keep the latent kernel
# (tiling_probe_20261201T111007Z: latent_kernel, latent_in_q_b_to_*). Since then (every stage
# kernel overlapped, CuTe DSL's attention) the latent kernel is the faster at one row: a MoE
# layer 1.9 and 1.4 us at 70e5e04 and 3f039dc, the same at 2 rows and on the other kinds
# (tiling_probe_20261204T160734Z, T161646Z: latent_kernel; T162154Z at b749cc7: its
# latent_in_q_b_to_2 +1.9 us at one row), so no step takes this form now
# (tiling_probe's latent_in_q_b_to_2 is the former default).
LATENT_IN_Q_B_MAX_ROWS = 0
# launch shapes of the latent and absorb stages (benchmark/tiling_probe.py). Warps of a latent
# program (a row's c_q or its KV-cache row): on an H200 16 are 0.5-1.0 us faster a layer than 4
# at 1, 2 and 16 rows on the MoE and dense kinds, 8 about as fast, 32 0.1-0.5
# (tiling_probe_20261201T102833Z: latent_*_warps)
LATENT_WARPS = 16
# whether the programs writing a row's KV-cache row (latent's, q_b_normed's) read its position
# and cache slot (layer inputs) before their wait, so after it only kv_a's output is loaded
# (one L2 round trip, not three: position, then slot and row, then the rope's pairs). On an
# H200 within noise (-0.1..+0.6 us a layer at 1-16 rows, tiling_probe_20261203T080322Z:
# kv_slot_late): those programs are not the launches' last to finish
KV_SLOT_EARLY = True
# steps of at most this many rows: the latent kernel's programs also load their norm's weight
# (c_q's or c_kv's) before the wait, with the slot (KV_SLOT_EARLY), rather than after the
# row's reduction (a second round trip on c_q's path to q_b). On an H100 -0.3..-0.7 us a
# layer with the indexer at 1-2 rows and 16, level elsewhere (the MoE layer runs attn_side
# there; tiling_probe_20261207T132839Z, T133255Z)
LATENT_W_EARLY_MAX_ROWS = 16 if overlap.weights_early(True) else 0
# Tried: a layer attending a top-k it did not compute prefetching the attention's KV-cache
# rows into L2 after its latent launch's wait (8 or 16 more programs a row from 3 rows; at 1-2
# rows q_b_normed's idle K-chunk siblings), so HBM would stream them during latent, q_b and
# absorb. Bitwise the same (GPU tests: pytest_pending_d921474.log), but on an H200 a MoE layer
# is +0.7 / +1.4 / +4.2 / +7.5 us at 4 / 8 / 12 / 16 rows (16 programs a row: +1.5 / +3.7 /
# +8.3 / +15.1), +0.5 at one row; dense (its own top-k: untouched) within noise
# (tiling_probe_20261204T030728Z: kv_prefetch_1, kv_prefetch_3_16_programs; code at d921474).
# As with overlap.LAYER_PREFETCH, the prefetches delay the critical path's own loads.
# whether a layer with the indexer runs its bf16 [wk; weights_proj] GEMM as programs of the
# latent launch, before their wait (``latent``'s kw), rather than as a launch of its own after
# q_b's, in steps of up to overlap.MAX_ROWS rows (the layer's choice). On an H200 a layer
# with the indexer is 2.5-3.6 us faster at 1-8 rows (dense and MoE, 2K and 8K contexts), but
# 1.4-2.1 slower at 16, where no wait overlapped them then (tiling_probe_20261202T035506Z,
# T035532Z: kw_own_launch). With the overlap up to 16 rows, 0.9-5.2 us faster at 8-16 rows
# (tiling_probe_20261203T105205Z: kw_own_launch)
KW_IN_LATENT = True
ABSORB_BLOCK_C = 64
# q_nope columns per step of absorb, from ABSORB_CHUNK_FROM_ROWS rows (fewer: all at once).
# Compiled for sm_90a with real shapes (ptxas -v, CPU, Triton 3.8), all at once spills 10.6 KB
# per program when q_b comes as 8 split-K partials and nothing in 64-column steps; on an H200
# (Triton 3.6) the steps save ~2 us of a MoE layer at 4 and 16 rows and cost ~1 us at one
# (tiling_probe_20261130T143119Z: absorb_chunk_d_64 against baseline).
ABSORB_CHUNK_D = 64
ABSORB_CHUNK_FROM_ROWS = 4
# steps of at most this many rows run absorb without the tensor cores
# (``_absorb_gemv_task``), over BLOCK_C latent columns per program, CHUNK_D q_nope columns
# per step. On an H200 the MoE layer is 4-5 us faster at 1-2 rows than on the dot form, the
# dense one 0-1 us; at 4 rows the dense layer loses 2 us and at 8 both lose 5 (the best of
# 16/32 columns x 64/128 chunk x 2/4/8 warps: tiling_probe_20261201T024512Z and T024527Z)
ABSORB_GEMV_MAX_ROWS = 2
# rows from which absorb reads q as bf16 rows that q_b's last-arriving K chunk of each column
# tile sums (fp8_linear tails) rather than summing q_b's split-K partials itself: each of its
# heads x latent-column-tiles programs would otherwise re-read every partial of its head's
# q_nope (8 at one TP8 rank of a layer without the indexer). Not where q_b norms c_q itself
# (LATENT_IN_Q_B_MAX_ROWS).
ABSORB_Q_ROWS_FROM = 3
# K chunks of q_b in a layer without the indexer when its tails sum those rows (the one-wave
# default: 8 at a TP8 rank); 0 keeps the default. On an H200 4 chunks make a MoE layer 0.5,
# 1.6, 1.0 and 1.0 us faster at 4, 8, 12 and 16 rows (results/tiling_probe_20261203T223138Z,
# noise 0.0-0.4), 0.4 / 0.8 / 1.5 at 4 / 8 / 16 in another run (T182651Z; there it also
# split q_b_normed at 1-2 rows, +1.4 / +1.8, which this knob leaves alone): fewer partials
# for each column tile's last chunk to sum; confirmed the other way round (T224106Z: 8 chunks
# +0.5..+1.6 us at 4-16 rows; 2 chunks +0.3..+0.5). On 2026-12-01 the same was within noise
# (T133650Z, T135322Z: -2.0 and +0.3 us at 16 rows), before the overlap reached 9-16 rows.
Q_B_SPLIT_WITH_ROWS = 4
# rows from which, in a layer without the indexer, q_b adds its K chunks into int64 sums in
# 2^-32 units (fp8_linear's sums: relaxed atomics, so any order gives the same bits) that
# absorb reads, instead of its last-arriving chunk of each column tile summing bf16 rows
# (ABSORB_Q_ROWS_FROM): no tail, no reload of the partials; absorb_v zeroes the sums for the
# next layer. 0: never. (The one-launch attention side's fixed form measured the same
# trade at q_a|kv_a: nvidia/sm90/attn_side.py.) On an H200 a MoE layer is 0.3-1.0 us faster
# from 5 rows, every pair of arms (-0.6 / -1.0 / -0.3 / -0.6 at 5 / 8 / 12 / 16 rows, three
# pairs each; tiling_probe_20261204T184312Z), mixed at 4 (+0.4, -1.0) and 0.6-1.0 slower at
# 3 (T184140Z; q_fixed_3 is from 3 rows): the tail it removes is worth more than the int64
# loads absorb's programs make only with more rows. In the layer's timeline at 16 rows
# (graph_timeline_20261204T184723Z at cc5e795, against T163131Z) q_b adds 4.2 us where it
# added 4.9, absorb 3.5 where 2.9 (its q now 8 bytes an element): the tail's cost moved
# rather than vanished there; decode_layer_20261204T184615Z: 111.4 / 156.0 us at 8 / 16 rows
# against 113.3 / 155.9 at 24fd66e.
Q_FIXED_FROM_ROWS = 5
ABSORB_GEMV_BLOCK_C = 16
# rows from which absorb ropes each head's q_pe in a program of its own (one more
# latent-column index) rather than in the head's first column program after its w_kc
# product, a second L2 round trip at that program's tail. On an H200 the own programs make a
# layer 1.1-3.0 us faster at 4-16 rows (the dot form) on every kind, and 0.1-0.7 slower at
# 1-2 (the GEMV form; tiling_probe_20261203T074448Z: absorb_pe_in_first)
ABSORB_PE_OWN_FROM_ROWS = 3
ABSORB_GEMV_CHUNK_D = 128
ABSORB_GEMV_WARPS = 4
# rows up to which each absorb program of a layer that computes its top-k loads its whole
# w_kc tile (a weight: overlap's rule 1) before the wait and multiplies q_nope in one piece,
# instead of prefetching the tile into L2 and loading it in CHUNK_D slices after the wait (as
# absorb_v's ABSORB_V_W_EARLY); ABSORB_W_EARLY_WITHOUT_INDEXER: also in a layer that reuses
# the previous top-k. On an H200 the early tile makes a layer with the indexer 1.5-2.0 us
# faster at 1-2 rows (dense, MoE), +0.5 at 4, the same at 16; a MoE layer without it
# +0.3-0.5 at 1-4 rows, where absorb follows q_b's wide launch rather than the top-k's few
# programs (tiling_probe_20261203T125540Z: absorb_w_early, every kind at every row count)
ABSORB_W_EARLY_MAX_ROWS = 2
ABSORB_W_EARLY_WITHOUT_INDEXER = False
# rows from which, in a layer that reuses the previous top-k, absorb's programs let the
# attention launch as they start rather than after their wait, so its gather (before its own
# wait) starts one kernel earlier, during q_b (0: never; absorb_early_dependents says where
# it is safe). On an H200 a MoE layer is 1.5-1.7 us faster at 3-8 rows, 1.2-1.3 at 12 and 0.6
# at 16 (two pairs each, baselines within 0.2 us; results/tiling_probe_20261204T212352Z at
# 0ba3f83: absorb_early_dependents); the outputs bitwise the late launch's
# (pytest_absorb_early_0ba3f83.log). With it, two gathering warpgroups from 4 rows were
# +0.8..+0.9 us at 4-8 rows; three KV tiles in flight +0.6..+2.6 at 3-8, -0.9 at 12.
ABSORB_EARLY_DEPENDENTS_FROM_ROWS = 3
# warps of absorb_v: its [128, 512] bf16 w_vc tile spills 60 B per program at 4 (ptxas -v,
# CPU) and none at 8; on an H200 8 warps is within noise (tiling_probe_20261130T143119Z)
ABSORB_V_WARPS = 4
# latent-column chunks of absorb_v: with S > 1 (and counters) each (head, 128 outputs) is S
# programs over kv_lora / S columns writing fp32 partials, and the last of them to finish sums
# the partials in order and quantizes (arrival.py). One chunk leaves 16 programs at one TP8
# rank's 8 heads, each reading a 128 KB w_vc tile. On an H200, 4 chunks are 1-2 us faster per
# layer than one at 1-16 rows on every kind, 2 the same, 8 ~1 us slower
# (results/tiling_probe_20261130T210744Z).
ABSORB_V_SPLIT_C = 4
# with ABSORB_V_SPLIT_C > 1, steps of at most this many rows have those programs also merge
# the attention's chunks (each its latent columns), so the merge kernel does not run: on an
# H200 -2 us per layer at 1 row on every kind, neutral at 2, +6..17 us at 4 and 16 (each
# program then reads every chunk's [rows, 128-column] partials; same results file).
# Tried again (40ee8f7, since reverted): from 2 rows every row's chunks loaded at once
# (independent loads, one round trip, not one a row; 8 warps, no spill at 16 rows on CPU):
# still slower than the merge kernel on an H200, every kind, +20-21 us a layer at 4 rows
# (32 chunks a row), +5-6 at 8, +2-3 at 16; 4 warps worse (tiling_probe_20261203T123511Z).
ABSORB_V_MERGE_MAX_ROWS = 1
# Tried: absorb_v leaving its chunks' partials for o_proj to sum and quantize as it loads x
# (no arrival, no reload of the partials after absorb_v's wait; bitwise the same, GPU test
# passed at 43377e4, code there). On an H200 a layer was 1.1-4.8 us slower at 1-2 rows, every
# kind, and 11 / 71 us at 4 / 16 (tiling_probe_20261203T095905Z, T095928Z: absorb_v_tail is
# the tail): each of o_proj's ~190 programs re-summed and re-quantized its K chunk (a
# cross-warp amax a row and group, and loads no longer pipelined with the weights), where
# the 16 tails did it once.
# whether absorb_v's latent-chunk programs load their w_vc tile before the wait (a weight:
# overlap's rule 1) instead of prefetching it into L2 and loading it after the merge's loads,
# one L2 round trip later. On an H200 a layer is 1.0-1.6 us faster at one row (where absorb_v
# merges), 0.4-0.7 at 2-8 rows, the same at 16 (tiling_probe_20261203T073514Z:
# absorb_v_w_late)
ABSORB_V_W_EARLY = True
# launch shape of the sparse attention (tiling_probe knobs). On an H200 4 warps are 3-5 us
# slower per layer at 4 and 16 rows (tiling_probe_20261130T150549Z); 3 stages, 1 stage and 32
# entries per step move a layer by -4..+3 us at 1 and 16 rows, no variant better at both
# (tiling_probe_17e17a9_partial.log, tiling_probe_20261130T152855Z)
# 16 warps: +1.3..1.9 us a MoE layer at 1-4 rows, +2.7 at 16
# (results/tiling_probe_attn_16_warps_1a52461.log). With the 8 column tiles (ATTN_PARTS) at
# 12 and 16 rows: 4 warps +2.1..+3.8 us a layer, 16 warps +4.0..+5.9, 2 stages instead of 3
# +1.2..+1.6 (tiling_probe_20261201T214225Z)
ATTN_WARPS = 8
ATTN_STAGES = 2
ATTN_BLOCK_T = 64  # top-k entries per loop step (at most a chunk's)
# loop steps a program takes from which it runs 3 stages (Triton then double-buffers the KV rows
# in shared memory, 168 KB): on an H200 at 16 rows (4 steps) -1.2..-2.0 us a layer, at 8 (2
# steps) within +-0.4, at 1-2 (one) +0.6..+1.4 (tiling_probe_20261201T102833Z, T103529Z:
# attn_3_stages). 128 entries a step instead: -2.6..+2.3 us at 8-16 rows (attn_block_128).
# At 3 steps (9-12 rows since attention_splits deals blocks out unevenly) 3 stages are 0.1-0.6
# us faster a layer (tiling_probe_20261201T184405Z: attn_3_stages_from_3_steps)
ATTN_DOUBLE_BUFFER_FROM_STEPS = 3
# what a loop step of the attention loads for the next one before its own math
# (_sparse_attn_task): 0 nothing, 1 the top-k entries and their cache slots, 2 also the KV rows.
# On an H200, against 0: 1 is 0.5-1.0 us faster a layer at 1 and 4 rows, 1.6 (dense) and 5.0
# (MoE) at 16; 2 holds 228 registers and is 0.7-1.2 us faster at one row, 10-14 slower at 16
# (tiling_probe_20261201T102329Z: attn_ahead_*). With 1 and 3 stages Triton double-buffers the
# KV rows in shared memory (168 KB): -3.1 us dense, -4.7 MoE at 16 rows, less than 1 at 1-4.
ATTN_AHEAD = 1
# Tried: the top-k entries loaded two steps ahead and their slots one, from positions loaded
# a step earlier, so no load of a step waits on another (ncu at 16 rows put a quarter of the
# stall samples on the slot load's wait for its top-k entry, or on the slot before the KV
# address: results/ncu_attn_16_a787b2c.txt). Bitwise the same, but on an H200 within
# -0.5..+0.0 us a layer at 12-16 rows and 0.5-1.6 slower at 4-8 (tiling_probe_20261202T050311Z:
# attn_ahead_3; code at b72a2ed): the stall only moves to the KV rows' wait.
# a program of at most this many loop steps (one at 1-4 rows at 2048 top-k entries, two at
# 5-8) loads its first step's top-k slots and KV rows into registers before waiting for the
# previous kernel (they come from two or more kernels back: overlap's rule), rather than only
# prefetching its rows into L2. On an H200 a layer is 1.7-4.9 us faster at 1-4 rows on every
# kind (tiling_probe_20261201T121440Z: attn_no_preload), 2.6-3.2 at 8; at 16 rows (four
# steps, 3 stages, no overlap) 2.5-3.3 slower (T122445Z: attn_preload_every_chunk).
ATTN_PRELOAD_MAX_STEPS = 2
# column tiles the latent KV rows load and multiply as (_attn_step_rows): a thread's rows are
# the same in every tile, so their addresses are computed once. A loop step at 16 rows (3
# stages), sm_90a SASS of the GPU's Triton 3.6 (sm90_compile.py loops, CPU), instructions a
# warp: 900 as one [64, 512] tile (482 integer, 37 global loads; 162 registers), with
# independent score chains 645 as 2 tiles, 554 as 4, 446 as 8 (77 integer, 5 global loads,
# 19 barriers of which 9 commit the copies; 128 registers; 435 in one chain), 610 as 16. On
# an H200, against one tile (results/tiling_probe_20261201T212315Z, attn_parts_*): 8 tiles
# make a MoE or dense
# layer 1.4-2.4 us faster at 12 and 16 rows (3-4 loop steps, no preload), 4 tiles 1.3-2.2;
# but programs that preload their first step (1-2 steps, 1-8 rows) 2.5-4.8 us slower with 8
# tiles, 0.5-0.8 with 4 (at 8 rows 4 tiles -0.3..-0.6). Hence tiles only for programs of
# ATTN_PARTS_FROM_STEPS loop steps or more: then one tile is 1.7-2.4 us slower a layer at 9-16
# rows, 8 rows unchanged (T212843Z: attn_one_tile); 2-step programs in tiles without the
# preload -0.3..+3.4 at 5-8 rows (T213907Z).
ATTN_PARTS = 8
ATTN_PARTS_FROM_STEPS = 3
# 1: the score as one MMA chain (each warp's 16 x 8 tile 36 dependent MMAs), in tiles the
# same MMAs in the same order, so bitwise the one-tile kernel (GPU test
# test_attention_in_column_tiles_matches_reference); 2: each latent tile's product and
# k_pe's apart (_attn_step_math). On an H200 two chains were within -0.1..+0.8 us of one with
# one tile, and 8 tiles in one chain 0-0.4 us faster than in two at 12-16 rows (T212315Z:
# attn_chains_2, attn_parts_8_one_chain)
ATTN_QK_CHAINS = 1
# Tried: the MMAs transposed, as the index scores' (indexer.SCORE_SWAP): scores [entries,
# heads] = K . q^T and acc [latent columns, heads] += V^T . P^T, the KV rows the A operand so
# sm_90 takes wgmma (945 sm_90a instructions a loop step a warp at 8 warps, 895 at 4, against
# 435). Within NUMERICS in the layer at 12-16 rows (GPU test), but on an H200 2.8-4.0 us
# slower a layer at 12-16 rows with 4 warps (2 stages: 3 ask 236 KB of shared memory), 5-7
# with 8, every kind (results/tiling_probe_20261202T143246Z: attn_swap*; code at 9f6bcc0).
# Programs that preload their first step gave wrong output in that form (one tile, 1 row)
# and the layer an illegal address; not found why.

# the most attention programs a step (attention_splits): one wave of one program a
# multiprocessor (201 registers x 256 threads). At 16 rows 16 chunks a row were 256 programs,
# two waves (ncu, H200: results/ncu_moe_2aeab55.log); 8 chunks, one wave, made each layer
# kind 4-6 us faster (tiling_probe_20261201T030547Z, T030553Z: attn_min_splits_8), and one
# wave against up to two is 3-6.5 us faster at 5, 6, 12 and 16 rows
# (tiling_probe_20261201T031633Z: attn_two_waves). 132: an H100 / H200 SXM's multiprocessors.
ATTN_PROGRAMS = 132
# a register cap on the attention (None: ptxas' choice); 128 lets two programs of 8 warps
# share a multiprocessor, as ATTN_PROGRAMS 264 assumes: on an H200 with 8 tiles at every step
# count 3.7-5.0 us slower a layer at 12-16 rows, as at 4 warps (T212315Z: attn_parts_8_*)
ATTN_MAXNREG = None
# chunks a row as the largest power of two within ATTN_PROGRAMS (before chunks that need not
# divide the row: 8 at 9-16 rows, 4 loop steps; probes). On an H200 the uneven chunks (11 a
# row, at most 3 steps) make a layer 1.4-2.0 us faster at 9-12 rows, MoE and dense, the same
# elsewhere (tiling_probe_20261201T184405Z: attn_pow2_splits); 12 rows need the 132 programs
# (attn_programs_128: +0.9..+1.9 there)
ATTN_POW2_SPLITS = False
# Tried: a program's whole chunk of KV rows asked of L2 first (its top-k entries and slots
# as one load each, then a bulk prefetch a row), for programs of 3+ loop steps (9-16 rows,
# where nothing else prefetches them) or 2+. Bitwise the same, but on an H200 1.3-2.2 us
# slower a layer at 12-16 rows, every kind, and no faster at 4-8 (results/
# tiling_probe_20261202T135947Z: attn_l2_ahead*; code at 8543865): the loop is bound by its
# instructions' latency (435 sm_90a instructions a warp a step at 16 rows, see ATTN_PARTS;
# about 14 cycles between a warp's instructions in results/ncu_attn_16_a787b2c.txt), not by
# HBM.
# Tried: two programs a multiprocessor from 5 or 9 rows (twice the programs, registers capped
# at 128: 84-104 B spilled, no first-step preload, whose rows take 128 KB of shared memory):
# on an H200 a MoE layer 5 us slower at 16 rows and 8 at 8 (tiling_probe_20261201T152205Z:
# attn_paired_from_*, code at fe63de8)
# Tried: more, smaller top-k chunks at 1-2 rows (chunks of 32 or 16 entries: up to 64 or 128
# programs a row where 32 leave most SMs idle): within noise at 1 row, +1-3 us at 2 on an H200
# (results/tiling_probe_20261130T233434Z, attn_chunk_32 / attn_chunk_16).


@triton.jit
def _rope_pairs(x1, x2, pos, inv_freq):
    f = pos.to(tl.float32) * inv_freq
    c = tl.cos(f)
    s = tl.sin(f)
    return x1 * c - x2 * s, x2 * c + x1 * s


@triton.jit
def slot_row(slots_ptr, stride_slots, slot_rows_ptr, m, ROWS: tl.constexpr):
    """Row m's slot table (the cache slot of each context position): with ROWS, row
    slot_rows_ptr[m] of a pool's table (upstream's req_to_token, read in place), else row m."""
    if ROWS:
        return slots_ptr + tl.load(slot_rows_ptr + m).to(tl.int64) * stride_slots
    else:
        return slots_ptr + m * stride_slots


def slot_args(token_slots, slot_rows, by_row, *caches):
    """((table, row stride, rows), ROWS) for kernels taking ``slot_row``'s arguments:
    token_slots [M, W] (a table a row: slot_rows None) or a pool's table [R, W] whose row
    slot_rows[m] is row m's (int64 [M]). by_row: a tensor [M, ...] of the launch, which stands
    in for the rows when there are none (the kernel does not read it). The kernels compute
    offsets in the table's integer type (an int32 slot widened to int64 in the attention's
    loop costs its software pipelining: +2.7 us a 16-row layer on an H200,
    results/graph_timeline_20261202T065355Z), so with an int32 table (upstream's
    req_to_token) every cache the slots address must hold fewer than 2**31 elements."""
    assert token_slots.stride(1) == 1, "slot tables must be row-major"
    if token_slots.dtype == torch.int32:
        for cache in caches:
            if cache.numel() >= 2**31:
                raise ValueError(f"a cache of {cache.numel()} elements addressed through int32 "
                                 "slots: its offsets overflow int32; pass an int64 slot table")
    elif token_slots.dtype != torch.int64:
        raise ValueError(f"slot tables are int32 or int64, not {token_slots.dtype}")
    if slot_rows is None:
        return (token_slots, token_slots.stride(0), by_row), False
    assert slot_rows.dtype == torch.int64 and slot_rows.shape == by_row.shape[:1]
    return (token_slots, token_slots.stride(0), slot_rows), True


@triton.jit
def _kv_slot(m, pos_ptr, slots_ptr, stride_slots, slot_rows_ptr, ROWS: tl.constexpr):
    """(position, cache slot) of row m: layer inputs, so a kernel may read them before its
    wait. A pad row (position -1) reads its table's first slot, unused."""
    pos = tl.load(pos_ptr + m)
    return pos, tl.load(slot_row(slots_ptr, stride_slots, slot_rows_ptr, m, ROWS)
                        + tl.maximum(pos, 0))


@triton.jit
def _store_kv_row(row, c, wc, x1, x2, pos, inv_freq, oc, i, C):
    """A KV-cache row at `row`: c_kv (c, its columns oc, normed) times its weight wc, then
    k_pe's pairs (x1, x2; pair indices i) roped at pos."""
    tl.store(row + oc, (c * wc).to(tl.bfloat16), mask=oc < C)
    r1, r2 = _rope_pairs(x1, x2, pos, inv_freq)
    tl.store(row + C + 2 * i, r1.to(tl.bfloat16))
    tl.store(row + C + 2 * i + 1, r2.to(tl.bfloat16))


@triton.jit
def _latent_row(m, part, qa_ptr, kva_ptr, SPLIT: tl.constexpr, M, qn_w_ptr, kvn_w_ptr,
                cq_q_ptr, cq_s_ptr, kv_cache_ptr, pos_ptr, slots_ptr, stride_slots, slot_rows_ptr,
                inv_freq_ptr, eps, Q, C, R, BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr,
                HALF_R: tl.constexpr, INTERPRET: tl.constexpr, ROWS: tl.constexpr):
    """Row m's part 0 (c_q normed and quantized) or part 1 (the KV-cache row): independent,
    so two programs run them side by side."""
    pos, slot = _kv_slot(m, pos_ptr, slots_ptr, stride_slots, slot_rows_ptr, ROWS)
    _latent_row_at(m, part, pos, slot, qa_ptr, kva_ptr, SPLIT, M, qn_w_ptr, kvn_w_ptr, cq_q_ptr,
                   cq_s_ptr, kv_cache_ptr, inv_freq_ptr, eps, Q, C, R, BLOCK_Q, BLOCK_C, HALF_R,
                   INTERPRET)


@triton.jit
def _latent_row_at(m, part, pos, slot, qa_ptr, kva_ptr, SPLIT: tl.constexpr, M, qn_w_ptr,
                   kvn_w_ptr, cq_q_ptr, cq_s_ptr, kv_cache_ptr, inv_freq_ptr, eps, Q, C, R,
                   BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr, HALF_R: tl.constexpr,
                   INTERPRET: tl.constexpr, w_pre=None):
    """``_latent_row`` given the row's (position, slot), ``_kv_slot``'s. w_pre: the two
    norms' weights (fp32 [BLOCK_Q], [BLOCK_C]; the part's own, the other's masked off),
    already loaded (``_latent_weights``), else loaded here."""
    if part == 0:
        oq = tl.arange(0, BLOCK_Q)
        q = sum_parts(qa_ptr, SPLIT, M * Q, m * Q + oq, oq < Q).to(tl.bfloat16).to(tl.float32)
        q = q / tl.sqrt(tl.sum(q * q, axis=0) / Q + eps)
        if w_pre is None:
            wq = tl.load(qn_w_ptr + oq, mask=oq < Q, other=0.0).to(tl.float32)
        else:
            wq = w_pre[0]
        cq = (q * wq).to(tl.bfloat16).to(tl.float32)
        store_row_groups(cq, oq, Q, cq_q_ptr + m * Q, cq_s_ptr + m * tl.cdiv(Q, 128), BLOCK_Q,
                         INTERPRET)
    if (part == 1) & (pos >= 0):
        kv_w = C + R
        oc = tl.arange(0, BLOCK_C)
        i = tl.arange(0, HALF_R)
        base = m * kv_w + C + 2 * i
        # every load first: the stores below could alias them for all the compiler knows
        c = sum_parts(kva_ptr, SPLIT, M * kv_w, m * kv_w + oc, oc < C)
        x1 = sum_parts(kva_ptr, SPLIT, M * kv_w, base, i < HALF_R).to(tl.bfloat16).to(tl.float32)
        x2 = sum_parts(kva_ptr, SPLIT, M * kv_w, base + 1, i < HALF_R).to(tl.bfloat16).to(tl.float32)
        if w_pre is None:
            wc = tl.load(kvn_w_ptr + oc, mask=oc < C, other=0.0).to(tl.float32)
        else:
            wc = w_pre[1]
        inv_freq = tl.load(inv_freq_ptr + i)
        c = c.to(tl.bfloat16).to(tl.float32)
        c = c / tl.sqrt(tl.sum(c * c, axis=0) / C + eps)
        _store_kv_row(kv_cache_ptr + slot * kv_w, c, wc, x1, x2, pos, inv_freq, oc, i, C)


@triton.jit
def _latent_weights(part, qn_w_ptr, kvn_w_ptr, Q, C, BLOCK_Q: tl.constexpr,
                    BLOCK_C: tl.constexpr):
    """Part 0's c_q norm weight or part 1's c_kv norm weight (the other masked off: nothing
    loaded), as ``_latent_row_at``'s w_pre: weights, so before the wait (LATENT_W_EARLY)."""
    oq = tl.arange(0, BLOCK_Q)
    oc = tl.arange(0, BLOCK_C)
    wq = tl.load(qn_w_ptr + oq, mask=(oq < Q) & (part == 0), other=0.0).to(tl.float32)
    wc = tl.load(kvn_w_ptr + oc, mask=(oc < C) & (part == 1), other=0.0).to(tl.float32)
    return wq, wc


@triton.jit
def _latent_kernel(qa_ptr, kva_ptr, SPLIT: tl.constexpr, M, qn_w_ptr, kvn_w_ptr, cq_q_ptr, cq_s_ptr,
                   kv_cache_ptr, pos_ptr, slots_ptr, stride_slots, slot_rows_ptr, inv_freq_ptr,
                   eps, Q, C, R, kw_x_ptr, kw_stride_x, KW_K, kw_w_ptr, kw_parts_ptr, KW_N,
                   kw_chunk, kw_tiles,
                   BLOCK_Q: tl.constexpr, BLOCK_C: tl.constexpr, HALF_R: tl.constexpr,
                   INTERPRET: tl.constexpr, PDL: tl.constexpr, KW: tl.constexpr,
                   KW_BLOCK_M: tl.constexpr, KW_BLOCK_N: tl.constexpr,
                   KW_BLOCK_K: tl.constexpr, KW_GEMV: tl.constexpr, ROWS: tl.constexpr,
                   SLOT_EARLY: tl.constexpr = False, W_EARLY: tl.constexpr = False):
    """Programs (row, 0 | 1): ``_latent_row``. With KW, programs (tile, 2 + split): the
    indexer's bf16 [wk; weights_proj] split-K GEMM (bf16_linear's task), run before the
    wait: its x is the layer's normed row, two kernels back (overlap's rule). SLOT_EARLY: the
    row's position and cache slot are read before the wait (KV_SLOT_EARLY). W_EARLY: so is
    the part's norm weight (LATENT_W_EARLY_MAX_ROWS)."""
    i = tl.program_id(0)
    j = tl.program_id(1)
    if KW and j >= 2:
        if i < kw_tiles:
            _bf16_linear_task(i, j - 2, kw_x_ptr, kw_stride_x, M, KW_K, kw_w_ptr, kw_parts_ptr,
                              KW_N, kw_chunk, KW_BLOCK_M, KW_BLOCK_N, KW_BLOCK_K, INTERPRET,
                              KW_GEMV)
        stage_begin(PDL)
    elif SLOT_EARLY:
        if i < M:
            pos, slot = _kv_slot(i, pos_ptr, slots_ptr, stride_slots, slot_rows_ptr, ROWS)
            w_pre = None
            if W_EARLY:
                w_pre = _latent_weights(j, qn_w_ptr, kvn_w_ptr, Q, C, BLOCK_Q, BLOCK_C)
            stage_begin(PDL)
            _latent_row_at(i, j, pos, slot, qa_ptr, kva_ptr, SPLIT, M, qn_w_ptr, kvn_w_ptr,
                           cq_q_ptr, cq_s_ptr, kv_cache_ptr, inv_freq_ptr, eps, Q, C, R, BLOCK_Q,
                           BLOCK_C, HALF_R, INTERPRET, w_pre)
        else:
            stage_begin(PDL)
    else:
        stage_begin(PDL)
        if i < M:
            _latent_row(i, j, qa_ptr, kva_ptr, SPLIT, M, qn_w_ptr, kvn_w_ptr, cq_q_ptr, cq_s_ptr,
                        kv_cache_ptr, pos_ptr, slots_ptr, stride_slots, slot_rows_ptr, inv_freq_ptr,
                        eps, Q, C, R, BLOCK_Q, BLOCK_C, HALF_R, INTERPRET, ROWS)


@triton.jit
def _kv_row_task(m, pos, slot, rows_ptr, ss_ptr, ss_stride, C_TILES: tl.constexpr, kvn_w_ptr,
                 kv_cache_ptr, inv_freq_ptr, eps, C, R, BLOCK_C: tl.constexpr,
                 HALF_R: tl.constexpr):
    """``_latent_row``'s part 1 from kv_a's summed bf16 rows [M, C + R] and their per-tile sums
    of squares (``fp8_linear._row_tail``), given row m's (position, slot) (``_kv_slot``): its
    KV-cache row, nothing for a pad row."""
    if pos >= 0:
        kv_w = C + R
        oc = tl.arange(0, BLOCK_C)
        i = tl.arange(0, HALF_R)
        # every load first: the stores below could alias them for all the compiler knows
        c = tl.load(rows_ptr + m * kv_w + oc, mask=oc < C, other=0.0).to(tl.float32)
        x1 = tl.load(rows_ptr + m * kv_w + C + 2 * i).to(tl.float32)
        x2 = tl.load(rows_ptr + m * kv_w + C + 2 * i + 1).to(tl.float32)
        wc = tl.load(kvn_w_ptr + oc, mask=oc < C, other=0.0).to(tl.float32)
        inv_freq = tl.load(inv_freq_ptr + i)
        c = c / row_rms(ss_ptr, ss_stride, m, True, C, eps, C_TILES)
        _store_kv_row(kv_cache_ptr + slot * kv_w, c, wc, x1, x2, pos, inv_freq, oc, i, C)


@triton.jit
def _q_b_normed_kernel(rows_q_ptr, ss_q_ptr, qn_w_ptr, M, Q, k_chunk, eps,
                       wa_ptr, sa_ptr, pa_ptr, NA, tiles_a, wb_ptr, sb_ptr, pb_ptr, NB, tiles,
                       rows_kv_ptr, ss_kv_ptr, ss_kv_stride, kvn_w_ptr, kv_cache_ptr, pos_ptr,
                       slots_ptr, stride_slots, slot_rows_ptr, inv_freq_ptr, C, R,
                       Q_TILES: tl.constexpr, C_TILES: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, GROUPS: tl.constexpr, BLOCK_C: tl.constexpr,
                       HALF_R: tl.constexpr, INTERPRET: tl.constexpr, PDL: tl.constexpr,
                       SWAP: tl.constexpr, ROWS: tl.constexpr, SLOT_EARLY: tl.constexpr,
                       PREFETCH: tl.constexpr):
    """Programs (tile, split): q_b on c_q normed from q_a's rows; programs (tiles + m, 0): row
    m's KV-cache row (``latent``'s second half; SLOT_EARLY: its position and slot read
    before the wait, KV_SLOT_EARLY)."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    if pid < tiles:
        _fp8_linear_prefetch(pid, split, Q, k_chunk, wa_ptr, NA, tiles_a, wb_ptr, NB, BLOCK_N,
                             PDL and PREFETCH)
        stage_begin(PDL)
        _fp8_linear_task(pid, split, rows_q_ptr, ss_q_ptr, M, Q, k_chunk, wa_ptr, sa_ptr,
                         pa_ptr, NA, tiles_a, wb_ptr, sb_ptr, pb_ptr, NB, BLOCK_M, BLOCK_N,
                         GROUPS, INTERPRET, False, True, qn_w_ptr, eps, Q_TILES, SWAP)
    else:
        m = pid - tiles
        if SLOT_EARLY:
            pos, slot = _kv_slot(m, pos_ptr, slots_ptr, stride_slots, slot_rows_ptr, ROWS)
            stage_begin(PDL)
        else:
            stage_begin(PDL)
            pos, slot = _kv_slot(m, pos_ptr, slots_ptr, stride_slots, slot_rows_ptr, ROWS)
        if split == 0:
            _kv_row_task(m, pos, slot, rows_kv_ptr, ss_kv_ptr, ss_kv_stride, C_TILES, kvn_w_ptr,
                         kv_cache_ptr, inv_freq_ptr, eps, C, R, BLOCK_C, HALF_R)


@triton.jit
def _q_load(q_ptr, SPLIT: tl.constexpr, stride_split, offs, mask, FIXED: tl.constexpr):
    """q_b's output at offs as fp32: its SPLIT partials summed in order, or (FIXED) its int64
    sums (``fp8_linear``'s sums, Q_FIXED_FROM_ROWS)."""
    if FIXED:
        return load_fixed(q_ptr, offs, mask)
    else:
        return sum_parts(q_ptr, SPLIT, stride_split, offs, mask)


@triton.jit
def _absorb_prefetch(h, ct, kvb_ptr, NH, C, NOPE: tl.constexpr, V: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr, PDL: tl.constexpr):
    prefetch_rows(kvb_ptr, h * (NOPE + V), NOPE, NH * (NOPE + V), C * 2, ct * BLOCK_C * 2,
                  BLOCK_C * 2, PDL, BLOCK_D, 1)


@triton.jit
def _absorb_w_tile(h, ct, kvb_ptr, C, NOPE: tl.constexpr, V: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr):
    """Program (head, latent-column tile)'s whole w_kc tile, bf16 [BLOCK_D, BLOCK_C] (rows
    from NOPE zero)."""
    od = tl.arange(0, BLOCK_D)
    oc = ct * BLOCK_C + tl.arange(0, BLOCK_C)
    return tl.load(kvb_ptr + (h * (NOPE + V) + od[:, None]) * C + oc[None, :],
                   mask=(od[:, None] < NOPE) & (oc[None, :] < C), other=0.0)


@triton.jit
def _absorb_with_w(w, h, ct, q_ptr, SPLIT: tl.constexpr, qcat_ptr, pos_ptr, inv_freq_ptr, M,
                   NH, C, NOPE: tl.constexpr, ROPE: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr, INTERPRET: tl.constexpr,
                   GEMV: tl.constexpr, PE: tl.constexpr, FIXED_Q: tl.constexpr = False):
    """``_absorb_task`` (GEMV: ``_absorb_gemv_task``) given the program's whole w_kc tile
    (``_absorb_w_tile``, loaded before the wait): q_nope in one piece, one product."""
    om = tl.arange(0, BLOCK_M)
    oc = ct * BLOCK_C + tl.arange(0, BLOCK_C)
    od = tl.arange(0, BLOCK_D)
    m_ok = om < M
    qk = NOPE + ROPE
    q = _q_load(q_ptr, SPLIT, M * NH * qk, (om[:, None] * NH + h) * qk + od[None, :],
                m_ok[:, None] & (od[None, :] < NOPE), FIXED_Q).to(tl.bfloat16)
    if GEMV:
        lat = tl.sum(q.to(tl.float32)[:, :, None] * w.to(tl.float32)[None, :, :], axis=1)
    elif INTERPRET:
        lat = tl.dot(q.to(tl.float32), w.to(tl.float32))
    else:
        lat = tl.dot(q, w)
    out = qcat_ptr + (om[:, None] * NH + h) * (C + ROPE)
    tl.store(out + oc[None, :], lat.to(tl.bfloat16), mask=m_ok[:, None] & (oc[None, :] < C))
    if PE and ct == 0:
        _absorb_q_pe(h, q_ptr, SPLIT, qcat_ptr, pos_ptr, inv_freq_ptr, M, NH, C, NOPE, ROPE,
                     BLOCK_M, FIXED_Q)


@triton.jit
def _absorb_task(h, ct, q_ptr, SPLIT: tl.constexpr, kvb_ptr, qcat_ptr, pos_ptr, inv_freq_ptr, M,
                 NH, C, NOPE: tl.constexpr, ROPE: tl.constexpr, V: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr,
                 INTERPRET: tl.constexpr, CHUNK_D: tl.constexpr = 0, PE: tl.constexpr = True,
                 FIXED_Q: tl.constexpr = False):
    """Program (head, BLOCK_C latent columns). CHUNK_D > 0 takes q_nope and w_kc in CHUNK_D
    slices (fewer live registers when q comes as many split-K partials). PE: the head's
    first program also ropes its q_pe (else programs of their own do: ``_absorb_kernel``'s
    PE_OWN)."""
    om = tl.arange(0, BLOCK_M)
    oc = ct * BLOCK_C + tl.arange(0, BLOCK_C)
    m_ok = om < M
    qk = NOPE + ROPE
    if CHUNK_D == 0:
        od = tl.arange(0, BLOCK_D)
        q = _q_load(q_ptr, SPLIT, M * NH * qk, (om[:, None] * NH + h) * qk + od[None, :],
                    m_ok[:, None] & (od[None, :] < NOPE), FIXED_Q).to(tl.bfloat16)
        w = tl.load(kvb_ptr + (h * (NOPE + V) + od[:, None]) * C + oc[None, :],
                    mask=(od[:, None] < NOPE) & (oc[None, :] < C), other=0.0)
        if INTERPRET:
            lat = tl.dot(q.to(tl.float32), w.to(tl.float32))
        else:
            lat = tl.dot(q, w)
    else:
        lat = tl.zeros((BLOCK_M, BLOCK_C), tl.float32)
        for d0 in range(0, NOPE, CHUNK_D):
            od = d0 + tl.arange(0, CHUNK_D)
            q = _q_load(q_ptr, SPLIT, M * NH * qk, (om[:, None] * NH + h) * qk + od[None, :],
                        m_ok[:, None] & (od[None, :] < NOPE), FIXED_Q).to(tl.bfloat16)
            w = tl.load(kvb_ptr + (h * (NOPE + V) + od[:, None]) * C + oc[None, :],
                        mask=(od[:, None] < NOPE) & (oc[None, :] < C), other=0.0)
            if INTERPRET:
                lat += tl.dot(q.to(tl.float32), w.to(tl.float32))
            else:
                lat += tl.dot(q, w)
    out = qcat_ptr + (om[:, None] * NH + h) * (C + ROPE)
    tl.store(out + oc[None, :], lat.to(tl.bfloat16), mask=m_ok[:, None] & (oc[None, :] < C))
    if PE and ct == 0:
        _absorb_q_pe(h, q_ptr, SPLIT, qcat_ptr, pos_ptr, inv_freq_ptr, M, NH, C, NOPE, ROPE,
                     BLOCK_M, FIXED_Q)


@triton.jit
def _absorb_q_pe(h, q_ptr, SPLIT: tl.constexpr, qcat_ptr, pos_ptr, inv_freq_ptr, M, NH, C,
                 NOPE: tl.constexpr, ROPE: tl.constexpr, BLOCK_M: tl.constexpr,
                 FIXED_Q: tl.constexpr = False):
    """Head h's q_pe of every row, summed over q_b's partials and roped, into qcat."""
    om = tl.arange(0, BLOCK_M)
    m_ok = om < M
    qk = NOPE + ROPE
    out = qcat_ptr + (om[:, None] * NH + h) * (C + ROPE)
    i = tl.arange(0, ROPE // 2)
    base = (om[:, None] * NH + h) * qk + NOPE + 2 * i[None, :]
    x1 = _q_load(q_ptr, SPLIT, M * NH * qk, base, m_ok[:, None], FIXED_Q)
    x2 = _q_load(q_ptr, SPLIT, M * NH * qk, base + 1, m_ok[:, None], FIXED_Q)
    x1 = x1.to(tl.bfloat16).to(tl.float32)
    x2 = x2.to(tl.bfloat16).to(tl.float32)
    pos = tl.maximum(tl.load(pos_ptr + om, mask=m_ok, other=0), 0)
    r1, r2 = _rope_pairs(x1, x2, pos[:, None], tl.load(inv_freq_ptr + i)[None, :])
    tl.store(out + C + 2 * i[None, :], r1.to(tl.bfloat16), mask=m_ok[:, None])
    tl.store(out + C + 2 * i[None, :] + 1, r2.to(tl.bfloat16), mask=m_ok[:, None])


@triton.jit
def _absorb_gemv_task(h, ct, q_ptr, SPLIT: tl.constexpr, kvb_ptr, qcat_ptr, pos_ptr,
                      inv_freq_ptr, M, NH, C, NOPE: tl.constexpr, ROPE: tl.constexpr,
                      V: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr,
                      CHUNK_D: tl.constexpr, PE: tl.constexpr = True,
                      FIXED_Q: tl.constexpr = False):
    """``_absorb_task`` for a few rows without the tensor cores: w_kc in [CHUNK_D, BLOCK_C]
    slices, each multiplied into the rows' q_nope slice and summed over its CHUNK_D (fp32),
    so a program holds a few small tiles instead of a [16, 256] x [256, BLOCK_C] dot's
    operands (which spill at BLOCK_C 64)."""
    om = tl.arange(0, BLOCK_M)
    oc = ct * BLOCK_C + tl.arange(0, BLOCK_C)
    m_ok = om < M
    qk = NOPE + ROPE
    lat = tl.zeros((BLOCK_M, BLOCK_C), tl.float32)
    for d0 in tl.static_range(0, NOPE, CHUNK_D):
        od = d0 + tl.arange(0, CHUNK_D)
        d_ok = od < NOPE
        q = _q_load(q_ptr, SPLIT, M * NH * qk, (om[:, None] * NH + h) * qk + od[None, :],
                    m_ok[:, None] & d_ok[None, :], FIXED_Q).to(tl.bfloat16).to(tl.float32)
        w = tl.load(kvb_ptr + (h * (NOPE + V) + od[:, None]) * C + oc[None, :],
                    mask=d_ok[:, None] & (oc[None, :] < C), other=0.0).to(tl.float32)
        lat += tl.sum(q[:, :, None] * w[None, :, :], axis=1)
    out = qcat_ptr + (om[:, None] * NH + h) * (C + ROPE)
    tl.store(out + oc[None, :], lat.to(tl.bfloat16), mask=m_ok[:, None] & (oc[None, :] < C))
    if PE and ct == 0:
        _absorb_q_pe(h, q_ptr, SPLIT, qcat_ptr, pos_ptr, inv_freq_ptr, M, NH, C, NOPE, ROPE,
                     BLOCK_M, FIXED_Q)


@triton.jit
def _absorb_kernel(q_ptr, SPLIT: tl.constexpr, kvb_ptr, qcat_ptr, pos_ptr, inv_freq_ptr, M, NH, C,
                   NOPE: tl.constexpr, ROPE: tl.constexpr, V: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr,
                   INTERPRET: tl.constexpr, PDL: tl.constexpr, CHUNK_D: tl.constexpr,
                   PE_OWN: tl.constexpr, GEMV: tl.constexpr, PREFETCH: tl.constexpr,
                   W_EARLY: tl.constexpr = False, FIXED_Q: tl.constexpr = False,
                   EARLY_DEPENDENTS: tl.constexpr = False):
    """Programs (head, latent-column tile): ``_absorb_task`` (GEMV: ``_absorb_gemv_task``;
    W_EARLY: ``_absorb_with_w``, the w_kc tile loaded before the wait); with PE_OWN a last
    column index whose programs rope their head's q_pe only. EARLY_DEPENDENTS: the attention
    launches as these programs start (ABSORB_EARLY_DEPENDENTS_FROM_ROWS)."""
    h = tl.program_id(0)
    ct = tl.program_id(1)
    if EARLY_DEPENDENTS:
        launch_dependents(PDL)
    if PE_OWN and ct == tl.num_programs(1) - 1:
        stage_begin(PDL)
        _absorb_q_pe(h, q_ptr, SPLIT, qcat_ptr, pos_ptr, inv_freq_ptr, M, NH, C, NOPE, ROPE,
                     BLOCK_M, FIXED_Q)
    elif W_EARLY:
        w = _absorb_w_tile(h, ct, kvb_ptr, C, NOPE, V, BLOCK_D, BLOCK_C)
        stage_begin(PDL)
        _absorb_with_w(w, h, ct, q_ptr, SPLIT, qcat_ptr, pos_ptr, inv_freq_ptr, M, NH, C, NOPE,
                       ROPE, BLOCK_M, BLOCK_D, BLOCK_C, INTERPRET, GEMV, not PE_OWN, FIXED_Q)
    else:
        _absorb_prefetch(h, ct, kvb_ptr, NH, C, NOPE, V, BLOCK_D, BLOCK_C, PDL and PREFETCH)
        stage_begin(PDL)
        if GEMV:
            _absorb_gemv_task(h, ct, q_ptr, SPLIT, kvb_ptr, qcat_ptr, pos_ptr, inv_freq_ptr, M,
                              NH, C, NOPE, ROPE, V, BLOCK_M, BLOCK_C, CHUNK_D, not PE_OWN,
                              FIXED_Q)
        else:
            _absorb_task(h, ct, q_ptr, SPLIT, kvb_ptr, qcat_ptr, pos_ptr, inv_freq_ptr, M, NH,
                         C, NOPE, ROPE, V, BLOCK_M, BLOCK_D, BLOCK_C, INTERPRET, CHUNK_D,
                         not PE_OWN, FIXED_Q)


@triton.jit
def _chunk_range(sp, nsp, nblk, BLOCK_T: tl.constexpr):
    """[lo, hi): the top-k entries of chunk sp of nsp, a row's nblk blocks of BLOCK_T entries
    dealt out evenly (chunks differ by at most one block)."""
    return (sp * nblk // nsp) * BLOCK_T, ((sp + 1) * nblk // nsp) * BLOCK_T


@triton.jit
def _sparse_attn_prefetch(m, sp, nsp, nblk, kv_cache_ptr, topk_ptr, stride_topk, slots_ptr,
                          stride_slots, slot_rows_ptr, C: tl.constexpr, R: tl.constexpr,
                          BLOCK_T: tl.constexpr, PDL: tl.constexpr, ROWS: tl.constexpr):
    """The chunk's KV rows (the top-k and the cache rows must be complete already)."""
    if PDL:
        lo, hi = _chunk_range(sp, nsp, nblk, BLOCK_T)
        row_slots = slot_row(slots_ptr, stride_slots, slot_rows_ptr, m, ROWS)
        for t0 in range(lo, hi, BLOCK_T):
            pt = tl.load(topk_ptr + m * stride_topk + t0 + tl.arange(0, BLOCK_T))
            pt = tl.minimum(pt, stride_slots - 1)
            pslot = tl.load(row_slots + tl.maximum(pt, 0), mask=pt >= 0, other=0)
            prefetch_l2(kv_cache_ptr + pslot.to(tl.int64) * (C + R), (C + R) * 2, pt >= 0, PDL)


@triton.jit
def _attn_step_slots(m, ot, hi, topk_ptr, stride_topk, row_slots):
    """Cache slots of row m's top-k entries ot (those at or past hi, or -1, do not exist);
    row_slots: the row's slot table (``slot_row``)."""
    p_ctx = tl.load(topk_ptr + m * stride_topk + ot, mask=ot < hi, other=-1)
    t_ok = p_ctx >= 0
    slot = tl.load(row_slots + tl.maximum(p_ctx, 0), mask=t_ok, other=0)
    return slot, t_ok


@triton.jit
def _latent_rows(rows, ok, C: tl.constexpr, R: tl.constexpr, PARTS: tl.constexpr):
    """Rows of C latent and R rope columns at the pointers `rows` [n, 1] (zero where not
    `ok` [n]): a tuple of the latent's PARTS column tiles [n, C / PARTS], and the rope part
    [n, R]. Narrow tiles share each thread's rows, so a row's address is computed once for
    all of them (``ATTN_PARTS``)."""
    oc = tl.arange(0, C // PARTS)[None, :]
    tiles = ()
    for i in tl.static_range(PARTS):
        tiles = tiles + (tl.load(rows + i * (C // PARTS) + oc, mask=ok[:, None], other=0.0),)
    pe = tl.load(rows + C + tl.arange(0, R)[None, :], mask=ok[:, None], other=0.0)
    return tiles, pe


@triton.jit
def _attn_step_rows(kv_cache_ptr, slot, t_ok, C: tl.constexpr, R: tl.constexpr,
                    PARTS: tl.constexpr):
    """The KV rows of a step's entries (zero where not t_ok): the latent's PARTS column tiles
    [BLOCK_T, C / PARTS], and k_pe."""
    return _latent_rows(kv_cache_ptr + slot[:, None] * (C + R), t_ok, C, R, PARTS)


@triton.jit
def _attn_dot(q, k, INTERPRET: tl.constexpr):
    """q . k^T in fp32."""
    if INTERPRET:
        return tl.dot(q.to(tl.float32), tl.trans(k.to(tl.float32)))
    return tl.dot(q, tl.trans(k))


@triton.jit
def _attn_step_math(q, q_pe, kv, kpe, t_ok, m_i, l_i, acc, sm_scale, PARTS: tl.constexpr,
                    INTERPRET: tl.constexpr, CHAINS: tl.constexpr):
    """One step of the online softmax over BLOCK_T entries (t_ok: those that exist):
    (m_i, l_i, acc) updated, q, kv and acc tuples of the latent's PARTS tiles. CHAINS > 1: the
    score's products (each latent tile's, k_pe's) as independent MMA chains, each scaled
    before the sum (which the compiler would otherwise fold into one accumulator chain);
    1: one chain."""
    if CHAINS > 1:
        z = _attn_dot(q_pe, kpe, INTERPRET) * sm_scale
        for i in tl.static_range(PARTS):
            z += _attn_dot(q[i], kv[i], INTERPRET) * sm_scale
    else:
        z = _attn_dot(q[0], kv[0], INTERPRET)
        for i in tl.static_range(1, PARTS):
            z += _attn_dot(q[i], kv[i], INTERPRET)
        z += _attn_dot(q_pe, kpe, INTERPRET)
        z = z * sm_scale
    z = tl.where(t_ok[None, :], z, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(z, axis=1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_safe)
    p = tl.exp(z - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if not INTERPRET:
        p = p.to(tl.bfloat16)
    out = ()
    for i in tl.static_range(PARTS):
        if INTERPRET:
            out = out + (acc[i] * alpha[:, None] + tl.dot(p, kv[i].to(tl.float32)),)
        else:
            out = out + (acc[i] * alpha[:, None] + tl.dot(p, kv[i]),)
    return m_new, l_i, out


@triton.jit
def _attn_query(m, qcat_ptr, NH, C: tl.constexpr, R: tl.constexpr, BLOCK_H: tl.constexpr,
                PARTS: tl.constexpr):
    """Row m's absorbed query: a tuple of the latent's PARTS tiles [BLOCK_H, C / PARTS], and
    q_pe [BLOCK_H, R] (bf16)."""
    oh = tl.arange(0, BLOCK_H)
    return _latent_rows(qcat_ptr + (m * NH + oh[:, None]) * (C + R), oh < NH, C, R, PARTS)


@triton.jit
def _attn_state(BLOCK_H: tl.constexpr, C: tl.constexpr, PARTS: tl.constexpr):
    """The online softmax's empty state: (m_i, l_i, acc), acc a tuple of PARTS tiles."""
    acc = ()
    for i in tl.static_range(PARTS):
        acc = acc + (tl.zeros((BLOCK_H, C // PARTS), tl.float32),)
    return tl.full((BLOCK_H,), float("-inf"), tl.float32), tl.zeros((BLOCK_H,), tl.float32), acc


@triton.jit
def _attn_store(m, sp, nsp, m_i, l_i, acc, part_o_ptr, part_ml_ptr, NH, C: tl.constexpr,
                BLOCK_H: tl.constexpr, PARTS: tl.constexpr):
    """Row m's chunk sp: its unnormalized output and (max, sum) per head."""
    oh = tl.arange(0, BLOCK_H)
    h_ok = oh < NH
    base = (m * nsp + sp) * NH + oh
    out = part_o_ptr + base[:, None] * C + tl.arange(0, C // PARTS)[None, :]
    for i in tl.static_range(PARTS):
        tl.store(out + i * (C // PARTS), acc[i], mask=h_ok[:, None])
    tl.store(part_ml_ptr + base * 2, m_i, mask=h_ok)
    tl.store(part_ml_ptr + base * 2 + 1, l_i, mask=h_ok)


@triton.jit
def _attn_loop(m, q, q_pe, lo, hi, m_i, l_i, acc, kv_cache_ptr, topk_ptr, stride_topk,
               row_slots, sm_scale, C: tl.constexpr, R: tl.constexpr,
               BLOCK_T: tl.constexpr, PARTS: tl.constexpr, INTERPRET: tl.constexpr,
               AHEAD: tl.constexpr, CHAINS: tl.constexpr):
    """Row m's top-k entries [lo, hi) in BLOCK_T steps, from the softmax state (m_i, l_i,
    acc). AHEAD (``ATTN_AHEAD``): 1 issues the next step's top-k and slot loads before this
    step's math, 2 its KV rows too (carried in registers), so a step does not start with a
    chain of dependent loads."""
    if AHEAD >= 1:
        slot, t_ok = _attn_step_slots(m, lo + tl.arange(0, BLOCK_T), hi, topk_ptr, stride_topk,
                                      row_slots)
    if AHEAD >= 2:
        kv, kpe = _attn_step_rows(kv_cache_ptr, slot, t_ok, C, R, PARTS)
    for t0 in range(lo, hi, BLOCK_T):
        if AHEAD == 0:
            slot, t_ok = _attn_step_slots(m, t0 + tl.arange(0, BLOCK_T), hi, topk_ptr,
                                          stride_topk, row_slots)
        if AHEAD < 2:
            kv, kpe = _attn_step_rows(kv_cache_ptr, slot, t_ok, C, R, PARTS)
        if AHEAD >= 1:
            slot_next, ok_next = _attn_step_slots(m, t0 + BLOCK_T + tl.arange(0, BLOCK_T), hi,
                                                  topk_ptr, stride_topk, row_slots)
        if AHEAD >= 2:
            kv_next, kpe_next = _attn_step_rows(kv_cache_ptr, slot_next, ok_next, C, R, PARTS)
        m_i, l_i, acc = _attn_step_math(q, q_pe, kv, kpe, t_ok, m_i, l_i, acc, sm_scale, PARTS,
                                        INTERPRET, CHAINS)
        if AHEAD >= 1:
            slot = slot_next
            t_ok = ok_next
        if AHEAD >= 2:
            kv = kv_next
            kpe = kpe_next
    return m_i, l_i, acc


@triton.jit
def _sparse_attn_task(m, sp, nsp, qcat_ptr, kv_cache_ptr, topk_ptr, stride_topk, slots_ptr,
                      stride_slots, slot_rows_ptr, part_o_ptr, part_ml_ptr, NH, sm_scale, nblk,
                      C: tl.constexpr, R: tl.constexpr, BLOCK_H: tl.constexpr,
                      BLOCK_T: tl.constexpr, PARTS: tl.constexpr, INTERPRET: tl.constexpr,
                      AHEAD: tl.constexpr, CHAINS: tl.constexpr, ROWS: tl.constexpr):
    """Row m's chunk sp of nsp (``_chunk_range``, ``_attn_loop``)."""
    q, q_pe = _attn_query(m, qcat_ptr, NH, C, R, BLOCK_H, PARTS)
    lo, hi = _chunk_range(sp, nsp, nblk, BLOCK_T)
    m_i, l_i, acc = _attn_state(BLOCK_H, C, PARTS)
    m_i, l_i, acc = _attn_loop(m, q, q_pe, lo, hi, m_i, l_i, acc, kv_cache_ptr, topk_ptr,
                               stride_topk,
                               slot_row(slots_ptr, stride_slots, slot_rows_ptr, m, ROWS),
                               sm_scale, C, R, BLOCK_T,
                               PARTS, INTERPRET, AHEAD, CHAINS)
    _attn_store(m, sp, nsp, m_i, l_i, acc, part_o_ptr, part_ml_ptr, NH, C, BLOCK_H, PARTS)


@triton.jit
def _sparse_attn_kernel(qcat_ptr, kv_cache_ptr, topk_ptr, stride_topk, slots_ptr, stride_slots,
                        slot_rows_ptr, part_o_ptr, part_ml_ptr, NH, sm_scale, nblk,
                        C: tl.constexpr, R: tl.constexpr, BLOCK_H: tl.constexpr,
                        BLOCK_T: tl.constexpr, PARTS: tl.constexpr, INTERPRET: tl.constexpr,
                        PDL: tl.constexpr, AHEAD: tl.constexpr, PRELOAD: tl.constexpr,
                        CHAINS: tl.constexpr, ROWS: tl.constexpr):
    m = tl.program_id(0)
    sp = tl.program_id(1)
    if PRELOAD:
        # the chunk's first step: its top-k, slots and KV rows come from two or more kernels
        # back, so they are loaded into registers before the wait; after it the query (the
        # previous kernel's) is read, then the other steps run as the loop
        lo, hi = _chunk_range(sp, tl.num_programs(1), nblk, BLOCK_T)
        row_slots = slot_row(slots_ptr, stride_slots, slot_rows_ptr, m, ROWS)
        slot, t_ok = _attn_step_slots(m, lo + tl.arange(0, BLOCK_T), hi, topk_ptr,
                                      stride_topk, row_slots)
        kv, kpe = _attn_step_rows(kv_cache_ptr, slot, t_ok, C, R, PARTS)
        stage_begin(PDL)
        q, q_pe = _attn_query(m, qcat_ptr, NH, C, R, BLOCK_H, PARTS)
        m_i, l_i, acc = _attn_state(BLOCK_H, C, PARTS)
        m_i, l_i, acc = _attn_step_math(q, q_pe, kv, kpe, t_ok, m_i, l_i, acc, sm_scale, PARTS,
                                        INTERPRET, CHAINS)
        if hi - lo > BLOCK_T:
            m_i, l_i, acc = _attn_loop(m, q, q_pe, lo + BLOCK_T, hi, m_i, l_i, acc, kv_cache_ptr,
                                       topk_ptr, stride_topk, row_slots, sm_scale, C, R,
                                       BLOCK_T, PARTS, INTERPRET, AHEAD, CHAINS)
        _attn_store(m, sp, tl.num_programs(1), m_i, l_i, acc, part_o_ptr, part_ml_ptr, NH, C,
                    BLOCK_H, PARTS)
    else:
        # the top-k and the cache rows come from >= 2 kernels back
        _sparse_attn_prefetch(m, sp, tl.num_programs(1), nblk, kv_cache_ptr, topk_ptr,
                              stride_topk, slots_ptr, stride_slots, slot_rows_ptr, C, R, BLOCK_T,
                              PDL, ROWS)
        stage_begin(PDL)
        _sparse_attn_task(m, sp, tl.num_programs(1), qcat_ptr, kv_cache_ptr, topk_ptr,
                          stride_topk, slots_ptr, stride_slots, slot_rows_ptr, part_o_ptr,
                          part_ml_ptr, NH, sm_scale, nblk, C, R, BLOCK_H, BLOCK_T, PARTS,
                          INTERPRET, AHEAD, CHAINS, ROWS)


@triton.jit
def _merge_columns(m, h, part_o_ptr, part_ml_ptr, NH, NSP, oc, C: tl.constexpr,
                   BLOCK_S: tl.constexpr, row_ok=True):
    """Row m's head h merged over its NSP chunks at the latent columns oc (fp32): each
    column's merge is independent of the others (zero where not row_ok: nothing read)."""
    osp = tl.arange(0, BLOCK_S)
    s_ok = (osp < NSP) & row_ok
    base = (m * NSP + osp) * NH + h
    mi = tl.load(part_ml_ptr + base * 2, mask=s_ok, other=float("-inf"))
    li = tl.load(part_ml_ptr + base * 2 + 1, mask=s_ok, other=0.0)
    mx = tl.max(mi, axis=0)
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    scale = tl.where(s_ok, tl.exp(mi - mx), 0.0)
    o = tl.load(part_o_ptr + base[:, None] * C + oc[None, :], mask=s_ok[:, None], other=0.0)
    num = tl.sum(o * scale[:, None], axis=0)
    den = tl.sum(li * scale, axis=0)
    return tl.where(den > 0, num / den, 0.0)


@triton.jit
def _combine_task(m, h, part_o_ptr, part_ml_ptr, olat_ptr, NH, NSP, C: tl.constexpr,
                  BLOCK_S: tl.constexpr):
    oc = tl.arange(0, C)
    out = _merge_columns(m, h, part_o_ptr, part_ml_ptr, NH, NSP, oc, C, BLOCK_S)
    tl.store(olat_ptr + (m * NH + h) * C + oc, out.to(tl.bfloat16))


@triton.jit
def _combine_kernel(part_o_ptr, part_ml_ptr, olat_ptr, NH, NSP,
                    C: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr,
                    EARLY: tl.constexpr = False):
    if EARLY:
        launch_dependents(PDL)
    stage_begin(PDL)
    _combine_task(tl.program_id(0), tl.program_id(1), part_o_ptr, part_ml_ptr, olat_ptr, NH,
                  NSP, C, BLOCK_S)


@triton.jit
def _absorb_v_prefetch(h, vt, kvb_ptr, NH, C: tl.constexpr, NOPE: tl.constexpr,
                       V: tl.constexpr, PDL: tl.constexpr):
    prefetch_rows(kvb_ptr, h * (NOPE + V) + NOPE + vt * 128, 128, NH * (NOPE + V), C * 2, 0,
                  C * 2, PDL, 128, 1)


@triton.jit
def _absorb_v_task(h, vt, olat_ptr, kvb_ptr, oq_ptr, os_ptr, M, NH, C: tl.constexpr,
                   NOPE: tl.constexpr, V: tl.constexpr, BLOCK_M: tl.constexpr,
                   INTERPRET: tl.constexpr):
    """Program (head, 128 output columns): o = o_lat . w_vc in bf16, then quantized for
    o_proj (the program holds exactly one 128-column group of each row)."""
    om = tl.arange(0, BLOCK_M)
    ov = vt * 128 + tl.arange(0, 128)
    oc = tl.arange(0, C)
    m_ok = om < M
    a = tl.load(olat_ptr + (om[:, None] * NH + h) * C + oc[None, :], mask=m_ok[:, None], other=0.0)
    w = tl.load(kvb_ptr + (h * (NOPE + V) + NOPE + ov[:, None]) * C + oc[None, :])
    if INTERPRET:
        o = tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)))
    else:
        o = tl.dot(a, tl.trans(w))
    o = o.to(tl.bfloat16).to(tl.float32)
    so = tl.maximum(tl.max(tl.abs(o), axis=1), 1e-10) / 448.0
    oq = to_e4m3(tl.clamp(o * (1.0 / so)[:, None], -448.0, 448.0), INTERPRET)
    tl.store(oq_ptr + om[:, None] * (NH * V) + h * V + ov[None, :], oq, mask=m_ok[:, None])
    tl.store(os_ptr + om * (NH * V // 128) + (h * V) // 128 + vt, so, mask=m_ok)


@triton.jit
def _zero_sums(zero_ptr, ZERO_N):
    """This program's share of the ZERO_N int64 sums at zero_ptr, set to zero (absorb_v's
    ``zero``): programs numbered over the whole grid, 512 elements at a time."""
    pid = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) * tl.num_programs(2) \
        + tl.program_id(2)
    step = tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2) * 512
    for z in range(pid * 512, ZERO_N, step):
        oz = z + tl.arange(0, 512)
        tl.store(zero_ptr + oz, tl.zeros((512,), tl.int64), mask=oz < ZERO_N)


@triton.jit
def _absorb_v_split_kernel(olat_ptr, kvb_ptr, oq_ptr, os_ptr, parts_ptr, arrivals_ptr,
                           part_o_ptr, part_ml_ptr, NSP, M, NH, C: tl.constexpr,
                           NOPE: tl.constexpr, V: tl.constexpr, SPLIT_C: tl.constexpr,
                           BLOCK_M: tl.constexpr, MERGE: tl.constexpr, BLOCK_S: tl.constexpr,
                           INTERPRET: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr,
                           W_EARLY: tl.constexpr = False, zero_ptr=None, ZERO_N=0,
                           ZERO: tl.constexpr = False):
    """Program (head, 128 outputs, latent chunk): the chunk's fp32 partial of o_lat . w_vc
    into parts [SPLIT_C, M, NH * V]; the last of the head's SPLIT_C programs for those
    outputs sums them in chunk order, rounds to bf16 and quantizes for o_proj. With MERGE
    the program merges its o_lat columns from the attention's chunks itself (the first
    128 outputs' program also stores them in olat), so no merge kernel runs before. W_EARLY:
    the w_vc tile is loaded before the wait (a weight), not after the merge's loads. ZERO: the
    programs also zero the ZERO_N int64 sums at zero_ptr (q_b's, which absorb, two kernels
    back, has read) for their next use."""
    h = tl.program_id(0)
    vt = tl.program_id(1)
    cs = tl.program_id(2)
    CC: tl.constexpr = C // SPLIT_C
    rows = h * (NOPE + V) + NOPE + vt * 128
    om = tl.arange(0, BLOCK_M)
    ov = tl.arange(0, 128)
    oc = cs * CC + tl.arange(0, CC)
    m_ok = om < M
    if W_EARLY:
        w = tl.load(kvb_ptr + (rows + ov[:, None]) * C + oc[None, :])
    else:
        prefetch_rows(kvb_ptr, rows, 128, NH * (NOPE + V), C * 2, cs * CC * 2, CC * 2,
                      PDL and PREFETCH, 128, 1)
    stage_begin(PDL)
    if ZERO:
        _zero_sums(zero_ptr, ZERO_N)
    if MERGE:
        a = tl.zeros((BLOCK_M, CC), tl.float32)
        for m in range(M):
            row = _merge_columns(m, h, part_o_ptr, part_ml_ptr, NH, NSP, oc, C, BLOCK_S)
            a = tl.where(om[:, None] == m, row.to(tl.bfloat16).to(tl.float32)[None, :], a)
        a = a.to(tl.bfloat16)
        if vt == 0:
            tl.store(olat_ptr + (om[:, None] * NH + h) * C + oc[None, :], a, mask=m_ok[:, None])
    else:
        a = tl.load(olat_ptr + (om[:, None] * NH + h) * C + oc[None, :], mask=m_ok[:, None],
                    other=0.0)
    if not W_EARLY:
        w = tl.load(kvb_ptr + (rows + ov[:, None]) * C + oc[None, :])
    if INTERPRET:
        o = tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)))
    else:
        o = tl.dot(a, tl.trans(w))
    cols = h * V + vt * 128 + ov
    stride = M * NH * V
    tl.store(parts_ptr + cs * stride + om[:, None] * (NH * V) + cols[None, :], o,
             mask=m_ok[:, None])
    if arrive_last(arrivals_ptr + h * (V // 128) + vt, SPLIT_C):
        o = sum_parts(parts_ptr, SPLIT_C, stride, om[:, None] * (NH * V) + cols[None, :],
                      m_ok[:, None])
        o = o.to(tl.bfloat16).to(tl.float32)
        so = tl.maximum(tl.max(tl.abs(o), axis=1), 1e-10) / 448.0
        oq = to_e4m3(tl.clamp(o * (1.0 / so)[:, None], -448.0, 448.0), INTERPRET)
        tl.store(oq_ptr + om[:, None] * (NH * V) + cols[None, :], oq, mask=m_ok[:, None])
        tl.store(os_ptr + om * (NH * V // 128) + (h * V) // 128 + vt, so, mask=m_ok)


@triton.jit
def _absorb_v_kernel(olat_ptr, kvb_ptr, oq_ptr, os_ptr, M, NH, C: tl.constexpr,
                     NOPE: tl.constexpr, V: tl.constexpr, BLOCK_M: tl.constexpr,
                     INTERPRET: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr,
                     zero_ptr=None, ZERO_N=0, ZERO: tl.constexpr = False):
    h = tl.program_id(0)
    vt = tl.program_id(1)
    _absorb_v_prefetch(h, vt, kvb_ptr, NH, C, NOPE, V, PDL and PREFETCH)
    stage_begin(PDL)
    if ZERO:
        _zero_sums(zero_ptr, ZERO_N)
    _absorb_v_task(h, vt, olat_ptr, kvb_ptr, oq_ptr, os_ptr, M, NH, C, NOPE, V, BLOCK_M,
                   INTERPRET)


def latent(qa_parts, kva_parts, q_a_norm, kv_a_norm, eps, positions, token_slots, inv_freq,
           cq_q, cq_s, kv_cache, kv_lora: int, rope: int, kw=None, slot_rows=None) -> None:
    """From the split-K partials of q_a [S, M, Q] and kv_a [S, M, kv_lora + rope]: c_q normed
    and quantized for q_b (cq_q e4m3 [M, Q], cq_s [M, Q/128]); the KV-cache row written.
    kw = (x, w, parts): also parts = bf16_linear.bf16_linear_splitk(x, w)'s in the same
    launch (the indexer's [wk; weights_proj], KW_IN_LATENT), x written two kernels back.
    token_slots, slot_rows: ``slot_args``."""
    split, m, q = qa_parts.shape
    assert qa_parts.is_contiguous() and kva_parts.is_contiguous() and kva_parts.shape[0] == split
    assert kv_cache.is_contiguous() and kv_cache.shape[1] == kv_lora + rope
    # without kw: placeholders the kernel does not touch
    grid, kw_args = (m, 2), (qa_parts, 0, 0, qa_parts, qa_parts, 0, 0, 0)
    kw_meta = dict(KW_BLOCK_M=1, KW_BLOCK_N=1, KW_BLOCK_K=1, KW_GEMV=True)
    if kw is not None:
        x, w, parts = kw
        kw_split, pm, n = parts.shape
        k = x.shape[1]
        assert x.shape[0] == m == pm and x.stride(1) == 1 and w.is_contiguous()
        assert w.shape == (n, k) and parts.is_contiguous() and parts.dtype == torch.float32
        bm, bk, gemv = bf16_linear.launch_shape(m, k, kw_split)
        tiles = triton.cdiv(n, bf16_linear.BLOCK_N)
        grid = (max(m, tiles), 2 + kw_split)
        kw_args = (x, x.stride(0), k, w, parts, n, bf16_linear.chunk_cols(k, kw_split), tiles)
        kw_meta = dict(KW_BLOCK_M=bm, KW_BLOCK_N=bf16_linear.BLOCK_N, KW_BLOCK_K=bk,
                       KW_GEMV=gemv)
    slots, rows = slot_args(token_slots, slot_rows, positions, kv_cache)
    _latent_kernel[grid](qa_parts, kva_parts, split, m, q_a_norm, kv_a_norm, cq_q, cq_s,
                         kv_cache, positions, *slots, inv_freq, float(eps), q, kv_lora, rope,
                         *kw_args,
                         BLOCK_Q=triton.next_power_of_2(q),
                         BLOCK_C=triton.next_power_of_2(kv_lora), HALF_R=rope // 2,
                         INTERPRET=interpreting(), PDL=overlap.enabled(), KW=kw is not None,
                         **kw_meta, ROWS=rows, SLOT_EARLY=KV_SLOT_EARLY, num_warps=LATENT_WARPS,
                         W_EARLY=KV_SLOT_EARLY and m <= LATENT_W_EARLY_MAX_ROWS,
                         **overlap.launch_kw())


def q_b_normed(rows_q, ss_q, q_a_norm, rows_kv, ss_kv, kv_a_norm, eps, positions,
               token_slots, inv_freq, kv_cache, kv_lora: int, rope: int, wq, ws, parts,
               wq_b=None, ws_b=None, parts_b=None, block_n: int = 64, groups: int = 2,
               slot_rows=None) -> None:
    """``latent`` and q_b (| wq_b) in one launch, from q_a|kv_a's summed bf16 rows and their
    per-tile sums of squares (``fp8_linear.fp8_linear(tails=...)``): each q_b program norms
    and quantizes its own groups of c_q (``fp8_linear._normed_group_dot``) instead of reading
    them from the latent kernel, and one extra program writes the KV-cache rows. parts as
    ``fp8_linear.fp8_linear``'s; the same sums in the same order as latent's except c_q's and
    c_kv's sums of squares (by tile, then over the tiles). token_slots, slot_rows:
    ``slot_args``."""
    m, q = rows_q.shape
    split = parts.shape[0]
    kv_w = kv_lora + rope
    tiles_q = ss_q.shape[1]
    assert q == tiles_q * block_n and kv_lora % block_n == 0, "norm widths must be whole tiles"
    assert rows_kv.shape == (m, kv_w) and ss_kv.shape[0] == m
    assert all(t.is_contiguous() for t in (rows_q, ss_q, rows_kv, ss_kv, kv_cache))
    assert wq.shape[1] == q and parts.shape[1:] == (m, wq.shape[0]) and parts.is_contiguous()
    if wq_b is not None:
        assert parts_b.shape == (split, m, wq_b.shape[0])
    tiles_a, tiles, k_chunk = fp8_linear.grid_shape(
        wq.shape[0], wq_b.shape[0] if wq_b is not None else 0, q, split, block_n, groups)
    if wq_b is None:
        wq_b, ws_b, parts_b = wq, ws, parts
    _q_b_normed_kernel[(tiles + m, split)](
        rows_q, ss_q, q_a_norm, m, q, k_chunk, float(eps),
        wq, ws, parts, wq.shape[0], tiles_a, wq_b, ws_b, parts_b, wq_b.shape[0], tiles,
        rows_kv, ss_kv, ss_kv.shape[1], kv_a_norm, kv_cache, positions,
        *slot_args(token_slots, slot_rows, positions, kv_cache)[0], inv_freq, kv_lora, rope,
        Q_TILES=tiles_q, C_TILES=kv_lora // block_n, BLOCK_M=fp8_linear.block_m(m),
        BLOCK_N=block_n, GROUPS=groups, BLOCK_C=triton.next_power_of_2(kv_lora),
        HALF_R=rope // 2, INTERPRET=interpreting(), PDL=overlap.enabled(),
        SWAP=fp8_linear.swap(block_n), ROWS=slot_rows is not None, SLOT_EARLY=KV_SLOT_EARLY,
        PREFETCH=overlap.prefetches("q_b_normed"),
        num_warps=fp8_linear.NUM_WARPS, num_stages=3, **overlap.launch_kw())


def absorb(q_parts, kv_b, positions, inv_freq, qcat, nope: int, rope: int, v: int,
           block_c: int = 0, indexer: bool = True, w_early=None,
           early_dependents: bool = False) -> None:
    """q_b's split-K partials [S, M, heads * (nope + rope)] (fp32; or S = 1 and the summed
    bf16 rows, ABSORB_Q_ROWS_FROM; or S = 1 and int64, q_b's fixed-point sums,
    Q_FIXED_FROM_ROWS) -> qcat bf16 [M, heads, kv_lora + rope] (q_nope . w_kc, then the
    roped q_pe). indexer: whether the layer computes its top-k (absorb then follows the
    top-k's launch: ABSORB_W_EARLY_MAX_ROWS). w_early: whether its programs load their w_kc
    tile before the wait (None: ``absorb_w_early``). early_dependents: the attention after it
    launches as its programs start (the caller vouches for the attention's early reads:
    ``absorb_early_dependents``)."""
    split, m, _ = q_parts.shape
    _, nh, _ = qcat.shape
    c = kv_b.shape[1]
    assert q_parts.is_contiguous() and kv_b.is_contiguous() and qcat.is_contiguous()
    fixed = q_parts.dtype == torch.int64
    assert split == 1 or not fixed, "q_b's fixed-point sums come as one [1, M, N]"
    pe_own = int(m >= ABSORB_PE_OWN_FROM_ROWS)
    gemv = m <= ABSORB_GEMV_MAX_ROWS
    block_c = block_c or (ABSORB_GEMV_BLOCK_C if gemv else ABSORB_BLOCK_C)
    if gemv:
        shape = dict(BLOCK_M=triton.next_power_of_2(m), CHUNK_D=ABSORB_GEMV_CHUNK_D,
                     num_warps=ABSORB_GEMV_WARPS)
    else:
        shape = dict(BLOCK_M=max(16, triton.next_power_of_2(m)), num_warps=4,
                     CHUNK_D=ABSORB_CHUNK_D if m >= ABSORB_CHUNK_FROM_ROWS else 0)
    _absorb_kernel[(nh, triton.cdiv(c, block_c) + pe_own)](
        q_parts, split, kv_b, qcat, positions, inv_freq, m, nh, c, NOPE=nope, ROPE=rope, V=v,
        BLOCK_D=triton.next_power_of_2(nope), BLOCK_C=block_c, INTERPRET=interpreting(),
        PDL=overlap.enabled(), PE_OWN=pe_own, GEMV=gemv, PREFETCH=overlap.prefetches("absorb"),
        W_EARLY=absorb_w_early(m, indexer) if w_early is None else bool(w_early),
        FIXED_Q=fixed, EARLY_DEPENDENTS=bool(early_dependents),
        **shape, **overlap.launch_kw())


def absorb_early_dependents(m: int, indexer: bool, kv_row_before_q_b: bool) -> bool:
    """Whether the attention launches as absorb's programs start (ABSORB_EARLY_DEPENDENTS_
    FROM_ROWS). Its reads before its wait (the top-k entries, the slots, the KV rows) must then
    be complete when absorb starts, i.e. two kernels before absorb: so not with the indexer
    (its top-k is absorb's predecessor), and only where the step's KV rows were written before
    q_b's launch (kv_row_before_q_b: the latent kernel's, not q_b_normed's or attn_side's)."""
    return (0 < ABSORB_EARLY_DEPENDENTS_FROM_ROWS <= m and not indexer and kv_row_before_q_b)


def absorb_w_early(m: int, indexer: bool) -> bool:
    """Whether absorb's programs load their w_kc tile before the wait (ABSORB_W_EARLY_*)."""
    return m <= ABSORB_W_EARLY_MAX_ROWS and (indexer or ABSORB_W_EARLY_WITHOUT_INDEXER)


def attention_block(topk: int) -> int:
    """Top-k entries of the attention's smallest chunk (the chunks are a multiple of it)."""
    return min(64, triton.next_power_of_2(topk))


def attention_splits(rows: int, topk: int) -> int:
    """How many chunks a row's top-k is split into: rows x chunks within ATTN_PROGRAMS (one
    wave), as few loop steps a program as that allows (the longest chunk's blocks of
    ``attention_block``), and of those the fewest chunks (32 at 1-4 rows, 16 at 5-8, 11 at
    9-12, 8 at 13-16 of 2048 entries). Chunks need not divide the row (``_chunk_range``)."""
    blocks = max(1, topk // attention_block(topk))
    fit = max(1, ATTN_PROGRAMS // max(rows, 1))
    if ATTN_POW2_SPLITS:
        return min(blocks, 1 << (fit.bit_length() - 1))
    steps = triton.cdiv(blocks, min(blocks, fit))
    return triton.cdiv(blocks, steps)


def attention_parts(kv_lora: int, steps: int) -> int:
    """Column tiles of the latent KV rows for programs of `steps` loop steps (``ATTN_PARTS``,
    each at least 16 columns wide, from ``ATTN_PARTS_FROM_STEPS``; one below)."""
    if ATTN_PARTS < 1 or ATTN_PARTS & (ATTN_PARTS - 1):
        raise ValueError(f"mla.ATTN_PARTS must be a power of two, not {ATTN_PARTS}")
    if steps < ATTN_PARTS_FROM_STEPS:
        return 1
    return max(1, min(ATTN_PARTS, kv_lora // 16))


def attention_step(topk: int, splits: int) -> tuple:
    """(BLOCK_T, blocks): top-k entries a loop step and blocks of them a row, so that every
    one of `splits` chunks holds at least one block."""
    block_t = min(ATTN_BLOCK_T, attention_block(topk), 1 << ((topk // splits).bit_length() - 1))
    if topk % block_t:
        raise ValueError(f"top-k {topk} is not a whole number of {block_t}-entry blocks")
    return block_t, topk // block_t


def sparse_attention(qcat, kv_cache, topk, token_slots, sm_scale, part_o, part_ml, olat,
                     kv_lora: int, rope: int, merge: bool = True, slot_rows=None,
                     early_dependents: bool = False) -> None:
    """olat bf16 [M, heads, kv_lora] = softmax(scale * qcat . K) . c_kv over each row's top-k
    (context positions, -1 = none); part_o fp32 [M, S, heads, kv_lora], part_ml [M, S, heads, 2].
    merge=False leaves the chunks unmerged (``absorb_v_merges``). token_slots, slot_rows:
    ``slot_args``. early_dependents: the merge kernel's (``combine``)."""
    m, nh, _ = qcat.shape
    splits = part_o.shape[1]
    k = topk.shape[1]
    block_t, blocks = attention_step(k, splits)
    steps = triton.cdiv(blocks, splits)  # the longest chunk's
    stages = 3 if steps >= ATTN_DOUBLE_BUFFER_FROM_STEPS else ATTN_STAGES
    assert topk.stride(1) == 1
    slots, rows = slot_args(token_slots, slot_rows, topk, kv_cache)
    _sparse_attn_kernel[(m, splits)](
        qcat, kv_cache, topk, topk.stride(0), *slots, part_o, part_ml, nh, float(sm_scale),
        blocks, C=kv_lora, R=rope,
        BLOCK_H=max(16, triton.next_power_of_2(nh)), BLOCK_T=block_t, INTERPRET=interpreting(),
        PDL=overlap.enabled(), AHEAD=ATTN_AHEAD, PRELOAD=steps <= ATTN_PRELOAD_MAX_STEPS,
        PARTS=attention_parts(kv_lora, steps), CHAINS=ATTN_QK_CHAINS, ROWS=rows,
        num_warps=ATTN_WARPS, num_stages=stages,
        **({"maxnreg": ATTN_MAXNREG} if ATTN_MAXNREG else {}),
        **overlap.launch_kw())
    if merge:
        combine(part_o, part_ml, olat, early_dependents)


def combine(part_o, part_ml, olat, early_dependents: bool = False) -> None:
    """olat bf16 [M, heads, kv_lora]: each row's chunks (part_o fp32 [M, S, heads, kv_lora],
    part_ml [M, S, heads, 2]: unnormalized output, max and sum) merged. early_dependents: the
    next kernel launches as these programs start, not after their wait (only for a successor
    that reads nothing but weights before its own wait: ``attn_out``)."""
    m, splits, nh, kv_lora = part_o.shape
    _combine_kernel[(m, nh)](part_o, part_ml, olat, nh, splits, C=kv_lora,
                             BLOCK_S=triton.next_power_of_2(splits),
                             PDL=overlap.enabled(), EARLY=early_dependents, num_warps=4,
                             **overlap.launch_kw())


def absorb_v_chunks(parts, arrivals) -> int:
    """Latent chunks absorb_v runs in, given (or not) its partials and counters."""
    return ABSORB_V_SPLIT_C if parts is not None and arrivals is not None else 1


def absorb_v_merges(parts, arrivals, m: int) -> bool:
    """Whether absorb_v merges the attention's chunks itself at m rows (``sparse_attention``
    then runs with merge=False and absorb_v takes the chunks)."""
    return m <= ABSORB_V_MERGE_MAX_ROWS and absorb_v_chunks(parts, arrivals) > 1


# Tried: the chunks' merge and absorb_v as one launch (programs per head and 128 latent
# columns merge, the head's last to finish runs its w_vc): slower on an H200 at every row
# count, +5 us a MoE layer at 1 row and +22 at 16: the 16 tails each read a 128 KB w_vc tile
# (results/tiling_probe_20261130T170454Z, merge_kernel = today's form).
def absorb_v(olat, kv_b, oq, os, nope: int, v: int, parts=None, arrivals=None,
             attn_parts=None, zero=None) -> None:
    """o = o_lat . w_vc per head (bf16), quantized for o_proj: oq e4m3 [M, heads * v],
    os fp32 [M, heads * v / 128]. Given fp32 `parts` (>= ABSORB_V_SPLIT_C * M * heads * v)
    and int32 `arrivals` (>= heads * v / 128, zeroed), in ABSORB_V_SPLIT_C latent chunks;
    at most ABSORB_V_MERGE_MAX_ROWS rows, it also merges the attention's unmerged chunks
    `attn_parts` (part_o, part_ml) into olat itself. zero: int64 sums (q_b's, Q_FIXED_FROM_ROWS)
    its programs set to zero after their wait."""
    m, nh, c = olat.shape
    assert olat.is_contiguous() and oq.is_contiguous() and os.is_contiguous() and v % 128 == 0
    split = absorb_v_chunks(parts, arrivals)
    if split > 1:
        assert c % (16 * split) == 0 and parts.numel() >= split * m * nh * v
        assert arrivals.dtype == torch.int32 and arrivals.numel() >= nh * (v // 128)
        merge = absorb_v_merges(parts, arrivals, m)
        part_o, part_ml = attn_parts if merge else (parts, parts)
        nsp = part_o.shape[1] if merge else 1
        _absorb_v_split_kernel[(nh, v // 128, split)](
            olat, kv_b, oq, os, parts, arrivals, part_o, part_ml, nsp, m, nh, C=c, NOPE=nope,
            V=v, SPLIT_C=split, BLOCK_M=max(16, triton.next_power_of_2(m)), MERGE=merge,
            BLOCK_S=max(2, triton.next_power_of_2(nsp)), INTERPRET=interpreting(),
            PDL=overlap.enabled(), PREFETCH=overlap.prefetches("absorb_v"),
            W_EARLY=ABSORB_V_W_EARLY, zero_ptr=zero if zero is not None else parts,
            ZERO_N=zero.numel() if zero is not None else 0, ZERO=zero is not None,
            num_warps=ABSORB_V_WARPS, **overlap.launch_kw())
        return
    _absorb_v_kernel[(nh, v // 128)](
        olat, kv_b, oq, os, m, nh, C=c, NOPE=nope, V=v, BLOCK_M=max(16, triton.next_power_of_2(m)),
        INTERPRET=interpreting(), PDL=overlap.enabled(), PREFETCH=overlap.prefetches("absorb_v"),
        zero_ptr=zero if zero is not None else oq, ZERO_N=zero.numel() if zero is not None else 0,
        ZERO=zero is not None, num_warps=ABSORB_V_WARPS,
        **overlap.launch_kw())
