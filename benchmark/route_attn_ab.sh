#!/usr/bin/env bash
# One device call (repo root, $OUT set, carry .cache/upstream and .cache/triton.tgz): the GPU
# tests, then the A/B of route's one-program-per-row form and of the sparse attention's
# launch shape at 4-16 rows, and the layer table at 2K. About 5 minutes once the machine is up.
set -u
source benchmark/device_env.sh
timeout 150 python3 -m pytest test/srt/kernels -q -x -k "matches_reference or graph_replay" \
  > "$L/pytest.log" 2>&1
echo "pytest rc=$?"; tail -3 "$L/pytest.log"
timeout 150 python3 -m benchmark.tiling_probe --kinds moe,moe_idx --ms 4,16 --out "$OUT" \
  --variants baseline,route_one_program,attn_4_warps,baseline \
  > "$L/tiling_probe.log" 2>&1
echo "tiling_probe rc=$?"; grep " us$" "$L/tiling_probe.log" | cut -c12-
timeout 60 python3 -m benchmark.decode_layer --replays 10 --check --ls 2048 --ms 1,2,4,8,16 \
  --arms stock,fused --out "$OUT" > "$L/decode_layer.log" 2>&1
echo "decode_layer rc=$?"; grep -E "^\|" "$L/decode_layer.log"
tar czf "$OUT/logs.tgz" -C .cache logs
