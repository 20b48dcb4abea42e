#!/usr/bin/env bash
# Device call (repo root, $OUT set, carry .cache/upstream and .cache/triton.tgz): the indexer's
# prepare split over blocks of query heads. GPU tests of the indexer layers (bitwise against
# one program per row, the reference at every row count, graph replay), the layer and step
# tables with the default, then the heads-per-program A/B. About 5 minutes once up.
set -u
source benchmark/device_env.sh
export PYTHONUNBUFFERED=1
timeout 140 python3 -m pytest test/srt/kernels -q -x \
  -k "head_blocks or (matches_reference and indexer) or graph_replay" > "$L/pytest.log" 2>&1
echo "pytest rc=$?"; tail -3 "$L/pytest.log"
timeout 80 python3 -m benchmark.decode_layer --replays 10 --check --ls 2048 --ms 1,2,4,8,16 \
  --arms stock,fused --out "$OUT" > "$L/decode_layer.log" 2>&1
echo "decode_layer rc=$?"; grep -E "^\|" "$L/decode_layer.log"
timeout 60 python3 -m benchmark.decode_step --out "$OUT" > "$L/decode_step.log" 2>&1
echo "decode_step rc=$?"; grep -E "^\|" "$L/decode_step.log"
timeout 80 python3 -m benchmark.tiling_probe --kinds moe_idx,dense --ms 1,2,4,16 --out "$OUT" \
  --variants baseline,prepare_heads_2,prepare_heads_8,prepare_heads_32 > "$L/tiling_probe.log" 2>&1
echo "tiling_probe rc=$?"; grep " us$" "$L/tiling_probe.log" | cut -c12-
tar czf "$OUT/logs.tgz" -C .cache logs
