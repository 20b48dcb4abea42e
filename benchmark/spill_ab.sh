#!/usr/bin/env bash
# One device call (repo root, $OUT set, carry .cache/upstream) for what this repo prepared but
# has not yet run on a GPU: the split top-k's GPU test, every compiled kernel's registers and
# spills as loaded, the A/B of the knobs that remove the spills ptxas reports on the CPU
# (benchmark/results/sm90_resources_cpu.txt), and the indexer layers at 32K with the split
# top-k off and on. About 6 minutes once the machine is up.
set -u
export PYTHONPATH=python:sgl-kernel-ext:.
timeout 120 python3 -m pytest test/srt/kernels -q -k split_topk > "$OUT/pytest_split.log" 2>&1
echo "split top-k test rc=$?"; tail -2 "$OUT/pytest_split.log"
timeout 120 python3 -m benchmark.kernel_resources --out "$OUT" > "$OUT/kernel_resources.log" 2>&1
echo "kernel_resources rc=$?"; grep '"spills": [1-9]' "$OUT/kernel_resources.log" | cut -c1-200
timeout 150 python3 -m benchmark.tiling_probe --kinds moe,moe_idx --ms 1,4,16 --out "$OUT" \
  --variants baseline,absorb_chunk_d_64,absorb_v_8_warps,fp8_linear_8_warps,down_block_64,baseline \
  > "$OUT/tiling_probe.log" 2>&1
echo "tiling_probe rc=$?"; grep " us$" "$OUT/tiling_probe.log"
for split in 0 1; do
  SGL_KERNEL_EXT_SPLIT_TOPK=$split timeout 120 python3 -m benchmark.decode_layer --kinds moe_idx,dense \
    --ls 32768 --ms 1,16 --replays 10 --arms stock,fused --out "$OUT" > "$OUT/decode_layer_32k_split$split.log" 2>&1
  echo "decode_layer 32K split=$split rc=$?"; grep -E "^\| (moe_idx|dense)" "$OUT/decode_layer_32k_split$split.log"
done
