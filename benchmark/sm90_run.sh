#!/usr/bin/env bash
# The device call for the CuTe DSL kernels (nvidia/sm90), run from the repo root with $OUT set.
# The lent GPU has no CuTe DSL and no network: stage its wheels with
# ../shared/tools/cutedsl_device_wheels.sh (here), then make two calls back to back, the
# machine still warm:
#   call 1, carry [".stage1"]:  bash benchmark/sm90_run.sh stage
#   call 2, carry [".stage2"]:  bash benchmark/sm90_run.sh [tests|bench|all|moe|fused|layer]
# (`all` is the default; extra arguments go to benchmark/sm90_gemv_probe.py). `moe`: fp8_moe's
# tests, then benchmark/sm90_moe_probe.py (extra arguments go to it). `layer`: the
# fused layer with o_proj and/or q_a|kv_a on fp8_mma (SGL_KERNEL_EXT_SM90_O_PROJ, _QKV_A)
# against the reference, then tiling_probe's sm90 variants against the baseline on every kind
# at 1-16 rows. `fused`: fp8_moe.experts (one launch): smokes, every fp8_moe GPU test, the
# layer's MoE opt-in test, sm90_moe_probe (extra arguments go to it, e.g. --stages 0,8,10)
# and the MoE layer A/B of one launch against two and against Triton. `attn`: sparse_mla's
# tests, the kernel alone for each of $ATTN_LAYOUTS (sm90_attn_probe --layout), the layer's
# attention opt-in test and the layer A/B (tiling_probe sm90_attn; ATTN_VARIANTS="": none);
# `attn_ncu`: sparse_mla and Triton's attention alone under Nsight Compute. `release`:
# sparse_mla's tests and release_run.sh bench (the layer table, step and timeline) with CuTe
# DSL installed (carry .stage2 and .cache/upstream). `check`: compute-sanitizer memcheck and
# racecheck on sparse_mla, then release_run.sh tests (the GPU suite) with CuTe DSL installed.
# `attn_side`: nvidia/sm90/attn_side's GPU tests, then benchmark/attn_side_probe.py (and with
# ATTN_SIDE_SANITIZE=1 compute-sanitizer memcheck and racecheck on its small-shape test).
set -u
mode=${1:-all}
shift || true
if [ "$mode" = stage ]; then
  mkdir -p /tmp/stage && cp .stage1/* /tmp/stage/ && ls -la /tmp/stage; exit
fi
if ! python3 -c "import cutlass" 2>/dev/null && [ ! -d /tmp/site/nvidia_cutlass_dsl ]; then
  test -f /tmp/stage/cu13part.aa || { echo "stage part 1 missing: run 'stage' first, warm"; exit 3; }
  whl=/tmp/nvidia_cutlass_dsl_libs_cu13-4.8.0-cp312-cp312-manylinux_2_28_x86_64.whl
  cat /tmp/stage/cu13part.aa .stage2/cu13part.ab > "$whl" && cp .stage2/*.whl /tmp/ &&
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site /tmp/*.whl ||
    { echo "CuTe DSL install failed"; exit 4; }
fi
source benchmark/device_env.sh
export PYTHONUNBUFFERED=1
python3 -c "import cutlass; print('cutlass', cutlass.__version__ if hasattr(cutlass, '__version__') else '?')"
if [ "$mode" = tests ] || [ "$mode" = all ]; then
  for c in "16 6144 2048" "1 6144 2048" "9 1000 512" "3 2624 6144 pdl"; do
    timeout 60 python3 test/srt/kernels/sm90_smoke.py $c 2>&1 | tail -1
  done
  timeout 300 python3 -m pytest test/srt/kernels/test_sm90_linear.py -q --maxfail=5 2>&1 | tee "$L/pytest_sm90.log" | tail -15
fi
if [ "$mode" = bench ] || [ "$mode" = all ]; then
  timeout 300 python3 -m benchmark.sm90_gemv_probe --out "$OUT" "$@" 2>&1 | tee "$L/sm90_probe.log"
fi
if [ "$mode" = moe ] || [ "$mode" = moe_debug ]; then
  if [ "$mode" = moe_debug ]; then
    for c in "16" "16 264" "16 0 12 4" "9 40" "4 40" "2 30"; do
      timeout 90 python3 test/srt/kernels/sm90_moe_smoke.py $c 2>&1 | grep -v Warn | tail -3
    done
    timeout 150 compute-sanitizer --tool memcheck python3 test/srt/kernels/sm90_moe_smoke.py 16 \
      > "$L/sanitizer_moe.log" 2>&1
    echo "compute-sanitizer memcheck rc=$?"
    grep -v cuGetProcAddress "$L/sanitizer_moe.log" | grep -m3 -B2 -A12 "Invalid\|Illegal\|Misaligned\|exception\|Error\|rror:"
    timeout 120 python3 -m benchmark.sm90_moe_probe --out "$OUT" --ms 4,8 2>&1 | tail -4
  else
  for m in 1 2 3 4 8 9 16; do
    timeout 90 python3 test/srt/kernels/sm90_moe_smoke.py $m 2>&1 | grep -v Warn | tail -3
  done
  timeout 420 python3 -m pytest test/srt/kernels/test_sm90_moe.py -q -x 2>&1 |
    tee "$L/pytest_sm90_moe.log" | tail -15
  timeout 240 python3 -m benchmark.sm90_moe_probe --out "$OUT" "$@" 2>&1 | tee "$L/sm90_moe_probe.log"
  fi
fi
if [ "$mode" = fused ]; then  # fp8_moe.experts (one launch): smokes, tests, probe, layer A/B
  for c in "1" "16" "16 30" "3 7"; do
    timeout 90 python3 test/srt/kernels/sm90_moe_smoke.py $c 2>&1 | grep -v Warn | tail -2
  done
  timeout 300 python3 -m pytest test/srt/kernels/test_sm90_moe.py -q -x 2>&1 |
    tee "$L/pytest_sm90_moe_all.log" | tail -5
  timeout 100 python3 -m pytest test/srt/kernels/test_fused_layer.py -q -k "sm90_linears and env_MOE" \
    2>&1 | tee "$L/pytest_sm90_layer_moe.log" | tail -3
  timeout 150 python3 -m benchmark.sm90_moe_probe --out "$OUT" "$@" 2>&1 | tee "$L/sm90_moe_probe.log"
  timeout 200 python3 -m benchmark.tiling_probe --kinds moe --ms 1,2,4,8,16 \
    --variants baseline,sm90_moe,sm90_moe_two_launches,baseline --out "$OUT" 2>&1 |
    tee "$L/sm90_layer_probe.log" | tail -20
fi
if [ "$mode" = attn ]; then  # sparse_mla: its tests, alone against Triton, the layer
  timeout 150 python3 -m pytest test/srt/kernels/test_sm90_sparse_mla.py -q -x --tb=short \
    -p no:warnings 2>&1 | tee "$L/pytest_sm90_attn.log" | tail -25
  grep -q " passed" "$L/pytest_sm90_attn.log" && ! grep -q "failed\|error" "$L/pytest_sm90_attn.log" ||
    { echo "sparse_mla tests did not pass: nothing else runs"; exit 5; }
  for layout in ${ATTN_LAYOUTS:-random layer}; do
    timeout 150 python3 -m benchmark.sm90_attn_probe --out "$OUT" --layout "$layout" 2>&1 |
      grep -v Warn | tail -8
  done
  if [ "${ATTN_VARIANTS-x}" != "" ]; then  # ATTN_VARIANTS="": the kernel alone only
    timeout 150 python3 -m pytest test/srt/kernels/test_fused_layer.py -q -p no:warnings \
      -k "sm90_linears and env_ATTN${ATTN_LAYER_K:-}" 2>&1 | tee "$L/pytest_sm90_layer_attn.log" | tail -3
    timeout 300 python3 -m benchmark.tiling_probe --kinds moe,dense --ms 1,4,8,12,16 \
      --variants "${ATTN_VARIANTS:-triton_attn,sm90_attn,sm90_attn_1_gatherer,sm90_attn_2_gatherers,triton_attn}" \
      --out "$OUT" 2>&1 | grep -v Warn | tee "$L/sm90_attn_probe.log" | grep "us$" | tail -60
  fi
fi
if [ "$mode" = release ]; then  # sparse_mla's tests, then the release bench with CuTe DSL
  # installed, as a Hopper server with nvidia-cutlass-dsl runs (sparse_mla by default; carry
  # .cache/upstream too for the stock arm)
  timeout 120 python3 -m pytest test/srt/kernels/test_sm90_sparse_mla.py -q -x --tb=short \
    -p no:warnings 2>&1 | tee "$L/pytest_sm90_attn.log" | tail -3
  bash benchmark/release_run.sh bench
fi
if [ "$mode" = check ]; then  # compute-sanitizer on sparse_mla, then (CHECK_SUITE=0: not) the
  # GPU suite with CuTe DSL installed (the layer's default). The driver bindings' symbol
  # lookups fail by design (cuGetProcAddress): API errors are not reported. memcheck: both
  # gatherer forms, a pool table, 1 / 3 / 16 rows; racecheck (slow): 1 and 3 rows
  san="compute-sanitizer --report-api-errors no --error-exitcode 9"
  sel="test_chunks_match_reference and (int32 or 2_gatherers_pool)"
  timeout 120 $san --tool memcheck python3 -m pytest -q -x -p no:warnings \
    test/srt/kernels/test_sm90_sparse_mla.py -k "$sel and not int32-9 and not pool-9" \
    > "$L/sanitizer_sparse_mla_memcheck.log" 2>&1
  echo "compute-sanitizer memcheck (sparse_mla) rc=$?"; grep -v "^$" "$L/sanitizer_sparse_mla_memcheck.log" | tail -2
  timeout "${RACECHECK_S:-240}" $san --tool racecheck python3 -m pytest -q -x -p no:warnings \
    test/srt/kernels/test_sm90_sparse_mla.py -k "$sel and (-1] or -3])" \
    > "$L/sanitizer_sparse_mla_racecheck.log" 2>&1
  echo "compute-sanitizer racecheck (sparse_mla) rc=$?"; grep -v "^$" "$L/sanitizer_sparse_mla_racecheck.log" | tail -2
  if [ "${CHECK_SUITE:-1}" = 1 ]; then bash benchmark/release_run.sh tests; fi
fi
if [ "$mode" = attn_ncu ]; then  # sparse_mla and Triton's attention under Nsight Compute
  timeout 300 ncu --clock-control none -k regex:'SparseMla|_sparse_attn' --section SpeedOfLight \
    --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
    python3 -m benchmark.sm90_attn_probe --ms "${ATTN_NCU_ROWS:-1,16}" --eager \
    > "$OUT/ncu_attn_${BENCH_COMMIT:-x}.txt" 2>&1
  echo "ncu rc=$?"; grep -E "SparseMla|_sparse_attn|Duration|DRAM Throughput|Memory Throughput|Issued Warp|No Eligible|Stall" \
    "$OUT/ncu_attn_${BENCH_COMMIT:-x}.txt" | head -60
fi
if [ "$mode" = attn_side ]; then  # attn_side's GPU tests (ATTN_SIDE_K: a -k), then its probe
  timeout "${ATTN_SIDE_TEST_S:-300}" python3 -m pytest test/srt/kernels/test_sm90_attn_side.py -q -s \
    -p no:warnings -k "${ATTN_SIDE_K:-}" 2>&1 | tee "$L/pytest_attn_side_${BENCH_COMMIT:-x}.log" | tail -15
  timeout 240 python3 -m benchmark.attn_side_probe --out "$OUT" "$@" 2>&1 | grep -v Warn |
    tee "$L/attn_side_probe_${BENCH_COMMIT:-x}.log"
  if [ "${ATTN_SIDE_SANITIZE:-0}" = 1 ]; then  # memcheck and racecheck on the small shape
    sanitize 150 "attn_side_${BENCH_COMMIT:-x}" -m pytest -q -x -p no:warnings \
      test/srt/kernels/test_sm90_attn_side.py -k small
  fi
fi
if [ "$mode" = verify ]; then  # the layer's opt-in tests and fp8_moe's cross-checks, quickly
  timeout 120 python3 -m pytest test/srt/kernels/test_sm90_moe.py -q -k "triton_moe or refuses" \
    2>&1 | tee "$L/pytest_sm90_moe_verify.log" | tail -3
  timeout 150 python3 -m pytest test/srt/kernels/test_fused_layer.py -q -k sm90_linears 2>&1 |
    tee "$L/pytest_sm90_layer.log" | tail -3
fi
if [ "$mode" = layer ]; then
  timeout 330 python3 -m pytest test/srt/kernels/test_fused_layer.py -q -k sm90_linears 2>&1 |
    tee "$L/pytest_sm90_layer.log" | tail -5
  timeout 240 python3 -m benchmark.tiling_probe --kinds moe,moe_idx,dense \
    --ms 1,2,4,8,16 --variants baseline,sm90_o_proj,sm90_qkv_a,sm90_linears,sm90_moe,baseline \
    --out "$OUT" 2>&1 |
    tee "$L/sm90_layer_probe.log" | tail -20
fi
tar czf "$OUT/logs.tgz" -C "$L" .
