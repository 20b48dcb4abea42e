#!/usr/bin/env bash
# Device call (repo root, $OUT set, carry .cache/upstream and .cache/triton.tgz): the A/B of
# the prefetch table spread over one program per SM, the attention chunks' merge in absorb_v
# (and its column blocks) and route's rank-count top-k, every kind at 1-16 rows; then the GPU
# tests; the Triton cache comes back as $OUT/triton.tgz for the next call's carry.
set -u
source benchmark/device_env.sh
export PYTHONUNBUFFERED=1
timeout 240 python3 -m benchmark.tiling_probe --kinds moe,moe_idx,dense --ms 1,2,4,16 --out "$OUT" \
  --variants baseline,layer_prefetch,next_layer_prefetch,both_prefetch,merge_kernel,merge_block_c_64,merge_block_c_256,route_rank_16,route_rank_32,route_rank_64,baseline \
  > "$L/tiling_probe.log" 2>&1
echo "tiling_probe rc=$?"; grep " us$" "$L/tiling_probe.log" | cut -c12-
timeout 330 python3 -m pytest test/srt/kernels -q -x -k "not sanitize" > "$L/pytest.log" 2>&1
echo "pytest rc=$?"; tail -3 "$L/pytest.log"
tar czf "$OUT/logs.tgz" -C .cache logs
tar czf "$OUT/triton.tgz" -C .cache triton && ls -la "$OUT"
