#!/usr/bin/env bash
# One device call (repo root, $OUT set, carry .cache/upstream and .cache/triton.tgz): the GPU
# tests, the A/B
# of the MoE's last-arrival tails and of the absorb steps at 2K, the split top-k's threshold at
# 4K and 8K, then the layer table and the step. About 8 minutes once the machine is up.
set -u
source benchmark/device_env.sh
timeout 240 python3 -m pytest test/srt/kernels -q -x -k "not sanitize and not split_topk" \
  > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; tail -3 "$OUT/pytest.log"
timeout 200 python3 -m benchmark.tiling_probe --kinds moe,moe_idx --ms 1,2,4,16 --out "$OUT" \
  --variants baseline,no_route_tail,no_swiglu_tail,no_sum_tail,absorb_no_chunk,baseline \
  > "$OUT/tiling_probe_tails.log" 2>&1
echo "tiling_probe tails rc=$?"; grep " us$" "$OUT/tiling_probe_tails.log"
for ctx in 4096 8192; do
  timeout 90 python3 -m benchmark.tiling_probe --kinds moe_idx --ms 1,16 --ctx $ctx --out "$OUT" \
    --variants baseline,split_topk_off,split_topk_above_2048 > "$OUT/tiling_probe_topk_$ctx.log" 2>&1
  echo "tiling_probe topk ctx=$ctx rc=$?"; grep " us$" "$OUT/tiling_probe_topk_$ctx.log"
done
timeout 150 python3 -m benchmark.decode_layer --replays 10 --check --ls 2048 --ms 1,2,4,8,16 \
  --arms stock,fused --out "$OUT" > "$OUT/decode_layer.log" 2>&1
echo "decode_layer rc=$?"; grep -E "^\|" "$OUT/decode_layer.log"
timeout 150 python3 -m benchmark.decode_step --out "$OUT" > "$OUT/decode_step.log" 2>&1
echo "decode_step rc=$?"; tail -12 "$OUT/decode_step.log"
