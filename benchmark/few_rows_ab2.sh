#!/usr/bin/env bash
# One device call (repo root, $OUT set, carry .cache/upstream and .cache/triton.tgz): the GPU
# tests of the few-row candidates and of o_proj's norm tail, the A/B of absorb's form without
# the tensor cores (latent columns, q_nope chunk, warps, up to how many rows) and of the norm
# tail in the whole layer, then the kernels' registers and spills. About 6 minutes.
set -u
source benchmark/device_env.sh
timeout 240 python3 -m pytest test/srt/kernels/test_fused_layer.py -q -x \
  -k "few_row_variants or o_proj_norm_tail" > "$OUT/pytest.log" 2>&1
echo "pytest rc=$?"; tail -3 "$OUT/pytest.log"
V=baseline
for c in 16 32; do for d in 64 128; do for w in 2 4 8; do
  V=$V,absorb_gemv_${c}_chunk_${d}_warps_${w}_to_2; done; done; done
timeout 240 python3 -m benchmark.tiling_probe --kinds moe,dense --ms 1,2 --out "$OUT" \
  --variants $V,norm_tail_2,baseline > "$OUT/tiling_probe_gemv.log" 2>&1
echo "tiling_probe gemv rc=$?"; grep " us$" "$OUT/tiling_probe_gemv.log"
V=baseline,absorb_gemv_16_chunk_64_warps_4_to_4,absorb_gemv_32_chunk_64_warps_4_to_4
V=$V,absorb_gemv_16_chunk_64_warps_4_to_8,absorb_gemv_32_chunk_64_warps_4_to_8
timeout 150 python3 -m benchmark.tiling_probe --kinds moe,dense --ms 4,8 --out "$OUT" \
  --variants $V,norm_tail_16,baseline > "$OUT/tiling_probe_rows.log" 2>&1
echo "tiling_probe rows rc=$?"; grep " us$" "$OUT/tiling_probe_rows.log"
timeout 90 python3 -m benchmark.tiling_probe --kinds moe,moe_idx --ms 16 --out "$OUT" \
  --variants baseline,norm_tail_16,baseline > "$OUT/tiling_probe_16.log" 2>&1
echo "tiling_probe 16 rc=$?"; grep " us$" "$OUT/tiling_probe_16.log"
tar czf "$OUT/triton.tgz" -C .cache triton 2>/dev/null; ls -la "$OUT/triton.tgz"
