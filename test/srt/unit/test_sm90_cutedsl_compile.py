"""The CuTe DSL kernels (``sgl_kernel_ext.nvidia.sm90``) compile for sm_90a on a CPU machine:
CuTe DSL lowers to a cubin without a GPU, so a kernel that no longer compiles (an API change,
a shared-memory overflow) shows here rather than in a device call. Where Triton's cuobjdump is
installed (``.ci/run`` installs the GPU's Triton under .cache/) the cubin's SASS is checked
for the bulk tensor copy (TMA) the weight ring is built on."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cutlass.cute", reason="CuTe DSL (nvidia-cutlass-dsl) is not installed")

ROOT = Path(__file__).resolve().parents[3]
CUOBJDUMP = ROOT / ".cache" / "triton-3.6.0" / "triton" / "backends" / "nvidia" / "bin" / "cuobjdump"

SCRIPT = """
import sys
sys.path.insert(0, {ext!r})
from sgl_kernel_ext.nvidia.sm90 import fp8_gemv as F, fp8_mma as Q
for m, n, k, groups, block_n in {shapes!r}:
    gemv, _ = F._compiled(m, n, k, 0, groups, block_n)
    print("compiled", m, n, k, groups, block_n, gemv.stages, gemv.threads)
for m, n, k, split, groups in {mma_shapes!r}:
    mma, _ = Q._compiled(m, n, k, split, 0, groups)
    print("compiled mma", m, n, k, split, groups, mma.stages, mma.threads)
"""
# (rows, N, K, consumer groups, tile rows): o_proj at 1 row, q_a|kv_a at 4 rows in 64-row
# tiles, a ragged small matrix with a 128-column K and three groups
SHAPES = [(1, 6144, 2048, 0, 0), (4, 2624, 6144, 2, 64), (2, 40, 384, 3, 32)]
# fp8_mma's (rows, N, K, K chunks, consumer warpgroups): 8-column and 16-column MMAs
MMA_SHAPES = [(1, 6144, 2048, 1, 2), (16, 2624, 6144, 4, 2), (9, 40, 384, 3, 3)]


def test_fp8_gemv_compiles_for_sm90a(tmp_path):
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="cubin",
               CUTE_DSL_DUMP_DIR=str(tmp_path))
    code = SCRIPT.format(ext=str(ROOT / "sgl-kernel-ext"), shapes=SHAPES, mma_shapes=MMA_SHAPES)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert run.stdout.count("compiled") == len(SHAPES) + len(MMA_SHAPES)
    cubins = sorted(tmp_path.glob("*.cubin"))
    assert len(cubins) == len(SHAPES) + len(MMA_SHAPES), [p.name for p in tmp_path.iterdir()]
    if not CUOBJDUMP.exists():
        pytest.skip(f"no cuobjdump at {CUOBJDUMP.relative_to(ROOT)} to read the SASS")
    for cubin in cubins:
        sass = subprocess.run([str(CUOBJDUMP), "-sass", str(cubin)], capture_output=True,
                              text=True, timeout=120).stdout
        assert "UTMALDG" in sass, f"{cubin.name}: no TMA load in its SASS"
        if "Fp8SkinnyMma" in cubin.name:
            assert "QGMMA.64x" in sass, f"{cubin.name}: no FP8 wgmma in its SASS"
        else:
            assert "LDS.128" in sass, f"{cubin.name}: the ring is not read 16 bytes at a time"
