#!/usr/bin/env bash
# One device call (run from the repo root with $OUT set): numerics sweep (JSON), stage timings (JSON), then the GPU pytest suite.
set -u
export PYTHONPATH=python:sgl-kernel-ext:.
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout 240 python3 test/srt/kernels/test_fused_layer.py "$OUT" > "$OUT/numerics.log" 2>&1; echo "numerics rc=$?"
tail -c 6000 "$OUT/numerics.log"
timeout 200 python3 benchmark/fused_stages.py --out "$OUT" > "$OUT/stages.log" 2>&1; echo "stages rc=$?"
tail -c 5000 "$OUT/stages.log"
if python3 -c "import pytest" 2>/dev/null; then
  timeout 150 python3 -m pytest test/srt/kernels -q 2>&1 | tail -15
else
  echo "pytest is not installed on the device"
fi
if command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 python3 test/srt/kernels/sanitize_fused_layer.py > "$OUT/sanitizer_$tool.log" 2>&1
    echo "compute-sanitizer $tool rc=$?"; tail -4 "$OUT/sanitizer_$tool.log"
  done
fi
