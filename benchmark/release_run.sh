#!/usr/bin/env bash
# The device calls that close a change (repo root, $OUT set, carry .cache/upstream and
# .cache/triton.tgz), in two parts, or both in one call (`all`, about 9 minutes):
#   bash benchmark/release_run.sh tests   # the GPU suite (five pytest processes sharing the
#                                         # GPU: Triton's compiles dominate), compute-sanitizer
#                                         # memcheck and racecheck
#   bash benchmark/release_run.sh bench   # the layer table (stock and fused), the 78-layer
#                                         # step, each kernel's share of the layer's critical
#                                         # path (graph_timeline)
#   bash benchmark/release_run.sh table   # the layer table alone (~90 s on an H100: a short
#                                         # budget's or a late machine's one call)
#   AB="SGL_KERNEL_EXT_X=..." bash benchmark/release_run.sh bench_ab # bench, then bench
#                                         # again under AB's environment (a form on and off)
#   bash benchmark/release_run.sh long    # the layer table of the indexer layers at 8K and
#                                         # 32K contexts (stock and fused; the split top-k),
#                                         # their timelines and the step at 32K, 8K and 32K
#                                         # contexts in a 1M-wide slot table (about 5 minutes)
#   bash benchmark/release_run.sh pending_long # the same at a 32K context on the indexer
#                                         # layer (PENDING_LONG), then their GPU tests,
#                                         # about 8-9 minutes: a call of its own
#   bash benchmark/release_run.sh pending # what the opt-in forms wait for before they become
#                                         # defaults: tiling_probe's variants of them against
#                                         # the baseline (PENDING), then their GPU tests
#   bash benchmark/release_run.sh vo      # absorb_v and o_proj as one launch (attn_out): its
#                                         # GPU test, then its forms against the baseline (VO;
#                                         # about 8 minutes after the install, a call of its own)
#   bash benchmark/release_run.sh vo_bench VARIANT # the form the probe chose: its release
#                                         # table beside stock, its timeline, compute-sanitizer
#                                         # with it on (the part a short call loses)
#   bash benchmark/release_run.sh variant_bench VARIANT # a tiling_probe variant's release
#                                         # table beside stock and its timeline
#   bash benchmark/release_run.sh topk    # sm90 cluster_topk (CuTe DSL installed): its GPU
#                                         # tests and the layer's pool-table tests, topk_probe
#                                         # in a 1M-wide table (split, the default and the
#                                         # opt-in forms) and the MoE+indexer layer at 8K / 32K /
#                                         # 128K contexts in a 1M-wide table against those
#                                         # forms (~6 minutes;
#                                         # TOPK_POOL_TESTS=0, TOPK_ROWS, TOPK_WIDTHS and
#                                         # TOPK_CTXS="8192 131072" make it shorter;
#                                         # TOPK_FORMS, the probe's forms; TOPK_VARIANTS,
#                                         # the layer's variants beside baseline, a,b;
#                                         # TOPK_MS, the layer's row counts, 1,4,12,16;
#                                         # TOPK_WIDTH, the slot table's width, 1M;
#                                         # TOPK_TESTS, a -k filter of its tests)
#   bash benchmark/release_run.sh copies  # the MoE layer's time a layer against the layers
#                                         # a timed graph holds (COPIES, "4 8 16 4 8 16"; at
#                                         # COPIES_MS rows, 1,16; ~3 minutes)
#   bash benchmark/release_run.sh resweep # the knobs' alternatives at 16 rows of the MoE
#                                         # layer against today's defaults (RESWEEP; ~3-4 min)
#   bash benchmark/release_run.sh early   # loads moved before their wait (EARLY, the forms):
#                                         # GPU test, then the forms against the baseline at
#                                         # 1/2/4/16 rows of every kind (~2-4 minutes)
#   bash benchmark/release_run.sh nf      # a MoE layer's router on the un-normed row (no
#                                         # post-attention norm launch, norm_router): its GPU
#                                         # test, then its forms against the baseline at 1-16
#                                         # rows of both MoE kinds (~4 minutes)
#   bash benchmark/release_run.sh norm_in # attn_side taking the input norm: its kernel's and
#                                         # layer's GPU tests, then its forms against the
#                                         # baseline at 1-2 rows of the MoE layer (~4 minutes)
#   bash benchmark/release_run.sh peer_norm # on nvidia-h200-x2: the fused all-reduce + norm's
#                                         # two-GPU test, then its probe against torch's
#                                         # symmetric-memory one-shot and NCCL (each + the norm)
# PROBE_ONLY=1 makes vo and nf skip their GPU test and only time the forms (a short budget's
# one call, no CuTe DSL staged: the attention side then runs its Triton kernels; e.g.
# `PROBE_ONLY=1 NF_MS=1,2,16 NF_S=150 bash benchmark/release_run.sh nf`).
# Logs go into $OUT/logs.tgz; JSON results into $OUT. SANITIZE_S=0 skips compute-sanitizer in
# `tests` (default: 90 s a tool).
set -u
source benchmark/device_env.sh
run_tests() {
  local k=test/srt/kernels
  timeout 330 python3 -m pytest $k/test_fused_layer.py -q -k "test_matches_reference" \
    > "$L/pytest_reference.log" 2>&1 &
  local tp="sums_its_attention or shard_attention_rows"
  local slow="persistent or graph_replay or overlap"  # the persistent kernel's compiles
  # opt-in forms: pending_long, vo and norm_in run them
  local optin="scores_histogram or swapped_index_scores or absorb_v_and_o_proj or norm_free_router"
  optin="$optin or taking_the_input_norm"
  timeout 330 python3 -m pytest $k/test_fused_layer.py -q \
    -k "not test_matches_reference and not sanitize and not ($tp) and not ($slow) and not ($optin)" \
    > "$L/pytest_other.log" 2>&1 &
  # the slow group ran 257 s with warm compile caches (7c3d111) and past 330 s on a fresh
  # machine (2145256: 33 of its 34): 420 s still leaves the install and the rest in one call
  timeout 420 python3 -m pytest $k/test_fused_layer.py -q -k "$slow" > "$L/pytest_slow.log" 2>&1 &
  timeout 330 python3 -m pytest $k/test_fused_layer.py -q -k "$tp" > "$L/pytest_tp.log" 2>&1 &
  timeout 330 python3 -m pytest $k -q --ignore=$k/test_fused_layer.py -k "not sanitize" \
    > "$L/pytest_draft.log" 2>&1 &
  local rc=0
  for job in $(jobs -p); do wait "$job" || rc=$?; done
  echo "pytest rc=$rc"
  for f in "$L"/pytest_*.log; do echo "$(basename "$f"): $(tail -1 "$f")"; done
  if [ "${SANITIZE_S:-90}" -gt 0 ]; then sanitize_fused_layer "${SANITIZE_S:-90}"; fi
}
run_table() {  # $1: the logs' prefix (bench_ab's second arm)
  timeout 150 python3 -m benchmark.decode_layer --replays 10 --check --ls 2048 \
    --ms 1,2,4,8,12,16 --arms stock,fused --out "$OUT" > "$L/${1:-}decode_layer.log" 2>&1
  echo "decode_layer rc=$?"; grep -E "^\|" "$L/${1:-}decode_layer.log" | tail -20
}
run_bench() {  # $1: the logs' prefix (bench_ab's second arm)
  local t="${1:-}"
  run_table "$t"
  timeout 200 python3 -m benchmark.decode_step --out "$OUT" > "$L/${t}decode_step.log" 2>&1
  echo "decode_step rc=$?"; tail -14 "$L/${t}decode_step.log"
  timeout 90 python3 -m benchmark.graph_timeline --out "$OUT" --kinds moe dense --rows 1 16 \
    > "$L/${t}graph_timeline.log" 2>&1
  echo "graph_timeline rc=$?"; tail -50 "$L/${t}graph_timeline.log" | grep -v "^\s*$" | head -40
}
# the release bench at main's defaults, then again under AB (environment assignments, e.g.
# AB="SGL_KERNEL_EXT_NORM_ROUTER_ROWS="), its logs prefixed ab_: both arms' six JSONs and
# one logs.tgz, no triton.tgz (a call returns at most 8 files; about 4 minutes)
run_bench_ab() {
  if [ -z "${AB:-}" ]; then echo "bench_ab: set AB to the second arm's environment" >&2; exit 2; fi
  run_bench
  echo "== the second arm: $AB"
  (export $AB; run_bench ab_)
}
run_long() {
  timeout 150 python3 -m benchmark.decode_layer --replays 10 --ls 8192,32768 --kinds moe_idx,dense \
    --ms 1,2,4,8,12,16 --arms stock,fused --out "$OUT" > "$L/decode_layer_long.log" 2>&1
  echo "decode_layer rc=$?"; grep -E "^\|" "$L/decode_layer_long.log" | tail -26
  timeout 90 python3 -m benchmark.graph_timeline --out "$OUT" --kinds moe_idx --rows 1 16 \
    --context 32768 > "$L/graph_timeline_long.log" 2>&1
  echo "graph_timeline rc=$?"
  # 8K and 32K contexts in a slot table 1M wide (a server's, at GLM-5.3's default context
  # length) against the same contexts in tables as wide as they are
  local c w
  for c in 8192 32768; do
    for w in $c 1048576; do
      timeout 45 python3 -m benchmark.tiling_probe --kinds moe_idx --ms 1,2,4,8,12,16 --ctx $c \
        --width $w --variants baseline --out "$OUT" > "$L/tiling_probe_${c}_in_$w.log" 2>&1
      echo "tiling_probe ($c in $w) rc=$?: $(grep -o "baseline: [0-9.]*" \
        "$L/tiling_probe_${c}_in_$w.log" | cut -d' ' -f2 | tr '\n' ' ')"
    done
  done
  # the 78-layer step at 32K (1 and 4 rows: 16 would not fit the caches beside the weights)
  timeout 150 python3 -m benchmark.decode_step --ctx 32768 --ms 1,4 --arms stock,fused \
    --out "$OUT" > "$L/decode_step_long.log" 2>&1
  echo "decode_step rc=$?"; grep -E "^\|" "$L/decode_step_long.log" | tail -8
}
# the alternatives beside the newest defaults, re-timed (the attention's tiles and the MoE's
# dot form, tiling_probe_20261201T212315Z, T212843Z, T212922Z; the layer reading its slots
# from a server's pool table, pool_slots: tiling_probe_20261202T065828Z), and the GPU tests of
# those forms (the persistent layer on a pool table has not run on a GPU yet). Timed at
# dea2028 and dropped from here, none faster: gate_up_64_scales_ahead, moe_deep_at_1,
# linear_groups_1, moe_gemv_at_1 (tiling_probe_20261202T062521Z)
# Timed 2026-12-04 and removed (slower, or too little): the KV prefetch (kv_prefetch_*) and
# down's table flag (down_table_flag), tiling_probe_20261204T030728Z; route into expert bits
# (route_bits_*), tiling_probe_20261204T032805Z; 2026-12-06, gate/up prefetching down's
# weights into L2 (down_pf_*, code at 5e971e4), tiling_probe_20261206T124635Z
PENDING_TESTS="column_tiles or scales_loaded_ahead or pool_table"
PENDING="attn_one_tile,attn_parts_every_step,moe_dot,pool_slots"
# at a 32K context, beside the defaults (the index scores as keys x q^T since
# tiling_probe_20261202T020550Z): the scores as q x keys^T, and the opt-in top-k forms timed
# there before that change: its first pass in the index scores (topk.SCORES_HISTOGRAM), with
# no count pass and 32 chunks a load too (four launches), the one-launch top-k
# (topk.ONE_LAUNCH); then the GPU tests of those forms
PENDING_LONG="scores_q_keys,scores_histogram,topk_four_launches,topk_one_launch"
PENDING_LONG_TESTS="scores_histogram or one_launch_topk or swapped_index_scores or split_topk or wide_table"
run_pending_long() {
  local variants="baseline,${PENDING_LONG//,/,baseline,},baseline"
  timeout 400 python3 -m benchmark.tiling_probe --kinds moe_idx --ms 1,4,16 --ctx 32768 \
    --variants "$variants" --out "$OUT" > "$L/tiling_probe_long.log" 2>&1
  echo "tiling_probe rc=$?"
  local probe
  probe=$(ls -t "$OUT"/tiling_probe_*.json 2>/dev/null | head -1)
  if [ -n "$probe" ]; then python3 -m benchmark.tiling_probe --table "$probe"; fi
  timeout 130 python3 -m pytest test/srt/kernels/test_fused_layer.py -q \
    -k "$PENDING_LONG_TESTS" > "$L/pytest_pending_long.log" 2>&1
  echo "pytest rc=$?"; tail -3 "$L/pytest_pending_long.log"
}
run_pending() {  # the probe first: if the call runs out of time, the timings are what counts
  local variants="baseline,${PENDING//,/,baseline,},baseline"
  timeout 300 python3 -m benchmark.tiling_probe --kinds moe,dense --ms 1,4,8,12,16 \
    --variants "$variants" --out "$OUT" > "$L/tiling_probe.log" 2>&1
  echo "tiling_probe rc=$?"
  local probe
  probe=$(ls -t "$OUT"/tiling_probe_*.json 2>/dev/null | head -1)
  if [ -n "$probe" ]; then python3 -m benchmark.tiling_probe --table "$probe"; fi
  timeout 200 python3 -m pytest test/srt/kernels/test_fused_layer.py -q -k "$PENDING_TESTS" \
    > "$L/pytest_pending.log" 2>&1
  echo "pytest rc=$?"; tail -3 "$L/pytest_pending.log"
}
# absorb_v and o_proj as one launch (attn_out; the default at 1 row since 2b75064, its other
# forms opt-in): its GPU test first (a wait inside the launch: a wrong one gives up only
# after seconds a program), then its forms against the baseline at 1, 2, 4 and 16 rows. A
# form whose programs cannot all be resident is refused and stops the probe: at c01c8f7 the
# 256- and 128-column forms at 16 rows (tiling_probe_vo_c01c8f7.log)
VO_TESTS="absorb_v_and_o_proj"
VO="vo_one_launch_512,vo_one_launch_l2,vo_one_launch_combine"
# an opt-in form's GPU tests (-k $2), then only if they pass its variants ($3, each between
# baselines, the list $5 times) against the baseline on kinds $4 at rows $6 within $7 s; logs
# named $1
tested_probe() {
  local name=$1 tests=$2 forms=$3 kinds=$4 passes=$5 ms=$6 limit=$7 variants=baseline i
  if [ "${PROBE_ONLY:-0}" = 1 ]; then
    echo "PROBE_ONLY=1: $name's GPU test not run, timings only"
  else
    timeout 240 python3 -m pytest test/srt/kernels/test_fused_layer.py -q -k "$tests" \
      > "$L/pytest_$name.log" 2>&1
    local rc=$?
    echo "pytest rc=$rc"; tail -3 "$L/pytest_$name.log"
    [ "$rc" -eq 0 ] || return 1
  fi
  for i in $(seq "$passes"); do variants="$variants,${forms//,/,baseline,},baseline"; done
  timeout "$limit" python3 -m benchmark.tiling_probe --kinds "$kinds" --ms "$ms" \
    --variants "$variants" --out "$OUT" > "$L/tiling_probe_$name.log" 2>&1
  echo "tiling_probe rc=$?"
  local probe
  probe=$(ls -t "$OUT"/tiling_probe_*.json 2>/dev/null | head -1)
  if [ -n "$probe" ]; then python3 -m benchmark.tiling_probe --table "$probe"; fi
}
run_vo() { tested_probe vo "$VO_TESTS" "$VO" moe 1 1,2,4,16 240; }
# a tiling_probe variant ($1)'s release table beside the stock arm (decode_layer --variant)
# and its timeline at 1 and 16 rows
run_variant_bench() {
  local variant=${1:?"variant_bench needs a tiling_probe variant"}
  timeout 150 python3 -m benchmark.decode_layer --replays 10 --check --ls 2048 \
    --ms 1,2,4,8,12,16 --arms stock,fused --variant "$variant" --out "$OUT" \
    > "$L/decode_layer_$variant.log" 2>&1
  echo "decode_layer rc=$?"; grep -E "^\|" "$L/decode_layer_$variant.log" | tail -20
  timeout 90 python3 -m benchmark.graph_timeline --out "$OUT" --kinds moe --rows 1 16 \
    --variant "$variant" > "$L/graph_timeline_$variant.log" 2>&1
  echo "graph_timeline rc=$?"; tail -40 "$L/graph_timeline_$variant.log" | grep -v "^\s*$"
}
# the form the probe chose ($1, a tiling_probe variant): variant_bench, then compute-sanitizer
# with attn_out at every row count
run_vo_bench() {
  run_variant_bench "${1:?"vo_bench needs the variant the probe chose, e.g. vo_one_launch"}"
  sanitize_fused_layer 90 4 vo
}
# the TP all-reduce fused with the norm (triton.peer_norm; written 2026-12-05 without a GPU):
# its test first (a wrong protocol gives up after seconds a program, not a hang), then the probe
run_peer_norm() {
  timeout 240 python3 -m pytest test/srt/kernels/test_peer_norm.py -q > "$L/pytest_peer_norm.log" 2>&1
  local rc=$?
  echo "pytest rc=$rc"; tail -3 "$L/pytest_peer_norm.log"
  [ "$rc" -eq 0 ] || return 1
  timeout 240 python3 -m benchmark.peer_norm_probe --world 2 --out "$OUT" \
    > "$L/peer_norm_probe.log" 2>&1
  echo "peer_norm_probe rc=$?"; grep -E "M=" "$L/peer_norm_probe.log" | tail -20
}
run_topk() {
  timeout 300 python3 -m pytest test/srt/kernels/test_sm90_cluster_topk.py -q \
    ${TOPK_TESTS:+-k "$TOPK_TESTS"} > "$L/pytest_cluster_topk.log" 2>&1
  echo "cluster_topk tests rc=$?"; tail -3 "$L/pytest_cluster_topk.log"
  if [ "${TOPK_POOL_TESTS:-1}" = 1 ]; then
    timeout 150 python3 -m pytest test/srt/kernels/test_fused_layer.py -q \
      -k "pool_table and not persistent and not attn_side" > "$L/pytest_pool_table.log" 2>&1
    echo "pool table tests rc=$?"; tail -1 "$L/pytest_pool_table.log"
  fi
  timeout 150 python3 -m benchmark.topk_probe --table "${TOPK_WIDTH:-1048576}" \
    --rows "${TOPK_ROWS:-1,4,16}" \
    --forms "${TOPK_FORMS:-split,cluster,cluster_8,cluster_prefetch_8}" \
    --widths "${TOPK_WIDTHS:-8192,32768,65536,131072,262144}" --out "$OUT" \
    > "$L/topk_probe_table.log" 2>&1
  echo "topk_probe (${TOPK_WIDTH:-1048576}-wide table) rc=$?"
  grep -E " us |trace|clusters" "$L/topk_probe_table.log" | cut -c12-
  local ctx variant
  for ctx in ${TOPK_CTXS:-8192 32768 131072}; do
    variant=${TOPK_VARIANTS:-topk_prefetch_8,topk_cluster8}
    timeout 150 python3 -m benchmark.tiling_probe --kinds moe_idx --ms "${TOPK_MS:-1,4,12,16}" \
      --ctx $ctx --width "${TOPK_WIDTH:-1048576}" \
      --variants baseline,$variant,baseline,$variant --out "$OUT" \
      > "$L/tiling_topk_$ctx.log" 2>&1
    echo "tiling_probe ctx $ctx rc=$?"; grep "M=" "$L/tiling_topk_$ctx.log" | cut -c12-
  done
}
# the layer table's time a layer against the layers a graph holds (decode_layer times a stack
# of --copies layers, 4 by default, a replay at a time: a replay's own start is shared by
# them): the fused arm at 1 and 16 rows of the MoE layer with COPIES layers a stack, in turn
run_copies() {
  local c i=0
  for c in ${COPIES:-4 8 16 4 8 16}; do
    i=$((i + 1))
    timeout 120 python3 -m benchmark.decode_layer --replays 10 --ls 2048 --ms "${COPIES_MS:-1,16}" \
      --kinds moe --arms fused --copies "$c" --out "$OUT" > "$L/decode_layer_copies_${i}_$c.log" 2>&1
    echo "copies $c rc=$?"; grep -E "^\|" "$L/decode_layer_copies_${i}_$c.log" | tail -3
  done
}
# the knobs' alternatives that can move a MoE layer at 9-16 rows, re-timed against today's
# defaults (each was set against the baseline of its own day; a baseline every ~10 variants
# tracks drift): RESWEEP_MS rows (16), RESWEEP_KINDS (moe), RESWEEP_VARIANTS to replace the list
RESWEEP="o_proj_split_1 o_proj_split_4 q_b_split_2 q_b_split_4 qkv_a_split_3 qkv_a_split_4
 q_fixed_off q_b_rows_split_2 route_rows_tile_2 norm_8_warps baseline norm_16_warps
 latent_4_warps latent_8_warps latent_32_warps sum_block_256 sum_block_512 sum_block_2048
 absorb_block_c_32 absorb_block_c_128 absorb_no_chunk baseline absorb_v_8_warps attn_16_warps
 attn_3_stages attn_block_32 attn_ahead_2 route_per_row_8_warps fp8_linear_8_warps
 down_block_64 down_block_256 down_8_warps baseline absorb_v_split_8 absorb_v_split_1
 absorb_w_early_16 attn_parts_4 attn_chains_2 gate_up_n16 gate_up_n64 gate_up_split_2
 gate_up_groups_1 gate_up_groups_4 baseline down_3_stages down_1_stage down_maxnreg_128
 gate_up_stages_3 linear_block_128 linear_groups_1 linear_groups_4 linear_programs_396
 sm90_attn_2_gatherers sm90_attn_1_gatherer baseline absorb_late_dependents wide_gu_64_2_1
 wide_gu_32_2_2 gate_up_no_stack absorb_v_merge_16 vo_one_launch_combine attn_two_waves"
run_resweep() {
  local v
  v=$(echo "baseline ${RESWEEP_VARIANTS:-$RESWEEP} baseline" | tr -s ' \n' ',' | sed 's/,$//')
  timeout "${RESWEEP_S:-300}" python3 -m benchmark.tiling_probe --kinds "${RESWEEP_KINDS:-moe}" \
    --ms "${RESWEEP_MS:-16}" --variants "$v" --out "$OUT" > "$L/tiling_resweep.log" 2>&1
  echo "tiling_probe rc=$?"; grep -E " us$|: failed: " "$L/tiling_resweep.log" | cut -c12- | tail -140
}
# the router on the un-normed row (norm_router.ROWS, 1-2 rows by default): its GPU test first (it
# checks the residual, caches and top-k bitwise against the norm's form), then its forms
# against the baseline, each twice, at NF_MS rows of both MoE kinds (NF, the forms; the
# other tiles, norm_router_mma_*, timed at 6a357b8)
NF="${NF:-norm_router_off,norm_router_own_quant_tile,norm_router_no_prefetch,norm_router_fixed}"
run_nf() {
  tested_probe nf norm_free_router "$NF" moe,moe_idx 2 "${NF_MS:-1,2,4,8,12,16}" "${NF_S:-240}"
}
# loads moved before their wait, and the norm's late launch of its dependents
# (norm.W_EARLY_MAX_ROWS, mla.LATENT_W_EARLY_MAX_ROWS, moe.ROUTE_CONSTS_EARLY,
# indexer.PREPARE_EARLY, attn_out.SCALES_EARLY, norm.LATE_DEPENDENTS_MAX_ROWS): their GPU test
# (bitwise the plain forms), then the forms against the baseline, each twice, at EARLY_MS rows
# of every kind (EARLY, the forms; ~2-4 minutes). The forms timed at 92e7739 (H100,
# tiling_probe_20261207T132839Z): norm_w_early, norm_late_deps and the three now the default
# (their variants today: latent_w_late, route_consts_late, prepare_late, loads_late); at
# 7135ed2, vo_scales_early (tiling_probe_20261207T140746Z);
# the release table with the four load forms on: AB="SGL_KERNEL_EXT_WEIGHTS_EARLY=1" bench_ab
EARLY="${EARLY:-vo_scales_early,norm_w_early}"
run_early() {
  tested_probe early norm_forms_are_bitwise "$EARLY" moe,moe_idx,dense 2 "${EARLY_MS:-1,2,4,16}" \
    "${EARLY_S:-200}"
}
# attn_side taking the layer's input norm (sm90.ATTN_SIDE_NORM_IN_MAX_ROWS; CuTe DSL staged):
# norm_in_check's diagnostic, the kernel's GPU tests (test_sm90_attn_side -k norm_in), the
# layer's (within NUMERICS, graph replays, a shared workspace's residual twin), then its forms
# against the baseline, each twice, at 1-2 rows of the MoE layer (~5 minutes after the install)
NORM_IN="${NORM_IN:-attn_side_norm_in,attn_side_norm_in_1}"
run_norm_in() {
  # NORM_IN_KERNEL=0: the layer's test and the timing alone (a short budget's call)
  [ "${NORM_IN_KERNEL:-1}" = 0 ] || run_norm_in_kernel || return 1
  tested_probe norm_in taking_the_input_norm "$NORM_IN" moe "${NORM_IN_PASSES:-2}" \
    "${NORM_IN_MS:-1,2}" "${NORM_IN_S:-200}"
}
run_norm_in_kernel() {
  # the diagnostic first (it asserts nothing): where the fold's c_q departs from the plain
  # form's on the emulated x, and its x read back through one-hot weights
  timeout 150 python3 benchmark/norm_in_check.py > "$L/norm_in_check.log" 2>&1
  echo "norm_in_check rc=$?"; cut -c1-600 "$L/norm_in_check.log" | tail -40
  # shared-memory hazards (racecheck) and bad accesses (memcheck) of the fold on its small
  # shape, where few CTAs give each worker many units in turn
  if [ "${SANITIZE_S:-90}" -gt 0 ]; then
    sanitize "${SANITIZE_S:-90}" norm_in -m pytest -q -p no:warnings \
      test/srt/kernels/test_sm90_attn_side.py -k "norm_in and small"
  fi
  timeout 200 python3 -m pytest test/srt/kernels/test_sm90_attn_side.py -q -k norm_in \
    > "$L/pytest_attn_side_norm_in.log" 2>&1
  local rc=$?
  echo "attn_side norm_in pytest rc=$rc"; tail -3 "$L/pytest_attn_side_norm_in.log"
  [ "$rc" -eq 0 ]
}
case "${1:-}" in
  norm_in) run_norm_in ;;
  nf) run_nf ;;
  early) run_early ;;
  tests) run_tests ;;
  bench) run_bench ;;
  table) run_table ;;
  bench_ab) run_bench_ab ;;
  all) run_tests; run_bench ;;
  long) run_long ;;
  pending) run_pending ;;
  pending_long) run_pending_long ;;
  vo) run_vo ;;
  vo_bench) run_vo_bench "${2:-}" ;;
  variant_bench) run_variant_bench "${2:-}" ;;
  peer_norm) run_peer_norm ;;
  topk) run_topk ;;
  copies) run_copies ;;
  resweep) run_resweep ;;
  *) echo "usage: release_run.sh tests|bench|table|bench_ab|all|long|pending|pending_long|vo|vo_bench VARIANT|variant_bench VARIANT|peer_norm|topk|copies|resweep|nf|early|norm_in" >&2
     exit 2 ;;
esac
tar czf "$OUT/logs.tgz" -C .cache logs
[ "${1:-}" = bench_ab ] || tar czf "$OUT/triton.tgz" -C .cache triton 2>/dev/null
