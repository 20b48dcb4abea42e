#!/usr/bin/env bash
# One device call (repo root, $OUT set, carry .cache/upstream and .cache/triton.tgz): the GPU
# test of the few-row candidates, then their A/B in the whole layer (absorb without the tensor
# cores, gate/up's K in 6 or 8 chunks, down's prefetch, tile and pipeline depths) at 1, 2 and
# 16 rows. About 5 minutes once the machine is up, most of it compiling.
set -u
source benchmark/device_env.sh
timeout 200 python3 -m pytest test/srt/kernels/test_fused_layer.py -q -x -k "few_row_variants" \
  > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; tail -3 "$OUT/pytest.log"
V=baseline,absorb_gemv_16,absorb_gemv_32,absorb_gemv_64,absorb_gemv_32_chunk_64
V=$V,gate_up_split_8,gate_up_split_6,gate_up_stages_4,gate_up_stages_2
V=$V,down_no_prefetch,down_block_128,down_stages_4,baseline
timeout 330 python3 -m benchmark.tiling_probe --kinds moe,dense --ms 1,2 --out "$OUT" \
  --variants $V > "$OUT/tiling_probe_few.log" 2>&1
echo "tiling_probe few rc=$?"; grep " us$" "$OUT/tiling_probe_few.log"
timeout 120 python3 -m benchmark.tiling_probe --kinds moe --ms 16 --out "$OUT" \
  --variants baseline,down_no_prefetch,gate_up_stages_4,down_stages_4,baseline \
  > "$OUT/tiling_probe_16.log" 2>&1
echo "tiling_probe 16 rc=$?"; grep " us$" "$OUT/tiling_probe_16.log"
tar czf "$OUT/triton.tgz" -C .cache triton 2>/dev/null; ls -la "$OUT/triton.tgz"
