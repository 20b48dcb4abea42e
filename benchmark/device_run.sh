#!/usr/bin/env bash
# One device call (repo root, $OUT set): GPU tests of the fused layer, then the layer and step
# benchmarks. Usage: bash benchmark/device_run.sh "<pytest -k expr or 'none'>" "<ms>" [step]
# A Triton cache carried in .cache/triton (from a previous call's $OUT/triton.tgz) is reused.
set -u
source benchmark/device_env.sh
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
K="${1:-none}"; MS="${2:-1,2,4,8,16}"; STEP="${3:-}"
if [ "$K" != "none" ]; then
  timeout 330 python3 -m pytest test/srt/kernels -q -x -k "$K" > "$OUT/pytest.log" 2>&1
  echo "pytest rc=$?"; tail -25 "$OUT/pytest.log"
fi
timeout 260 python3 -m benchmark.decode_layer --replays 10 --check --ls 2048 --ms "$MS" \
  --arms stock,fused,fused_stages --out "$OUT" > "$OUT/decode_layer.log" 2>&1
echo "decode_layer rc=$?"; grep -E "check|^\|" "$OUT/decode_layer.log" | tail -60
if [ -n "$STEP" ]; then
  timeout 200 python3 -m benchmark.decode_step --out "$OUT" > "$OUT/decode_step.log" 2>&1
  echo "decode_step rc=$?"; tail -25 "$OUT/decode_step.log"
fi
tar czf "$OUT/triton.tgz" -C .cache triton 2>/dev/null; ls -la "$OUT/triton.tgz"
