#!/usr/bin/env bash
# A device call (repo root, $OUT set): GPU tests of the fused layer picked by a pytest -k
# expression, then tiling_probe's variants (baseline first and last) in the layer.
#   bash benchmark/variants_ab.sh "<pytest -k or none>" <kinds> <rows> <variant,...>
# e.g. bash benchmark/variants_ab.sh "attention_swapped" moe,moe_idx 1,4,16 attn_swap
set -u
source benchmark/device_env.sh
nvidia-smi --query-gpu=name --format=csv,noheader
K=$1; KINDS=$2; MS=$3; VARIANTS=$4
if [ "$K" != none ]; then
  timeout 300 python3 -m pytest test/srt/kernels/test_fused_layer.py -q -k "$K" \
    > "$L/pytest_variants.log" 2>&1
  echo "pytest rc=$?"; grep -E "passed|failed|Error" "$L/pytest_variants.log" | tail -8
fi
timeout 330 python3 -m benchmark.tiling_probe --kinds "$KINDS" --ms "$MS" --out "$OUT" \
  --variants "baseline,$VARIANTS,baseline" > "$L/tiling_probe.log" 2>&1
echo "tiling_probe rc=$?"; grep " us$" "$L/tiling_probe.log" | cut -c12-
tar czf "$OUT/logs.tgz" -C .cache logs
