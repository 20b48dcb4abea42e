"""The CuTe DSL kernels (``sgl_kernel_ext.nvidia.sm90``) compile for sm_90a on a CPU machine:
CuTe DSL lowers to a cubin without a GPU, so a kernel that no longer compiles (an API change,
a shared-memory overflow) shows here rather than in a device call. Where Triton's cuobjdump is
installed (``.ci/run`` installs the GPU's Triton under .cache/) the cubin's SASS is checked
for the bulk tensor copy (TMA) the weight ring is built on and for the FP8 wgmma."""

import os
import re
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
from sgl_kernel_ext.nvidia.sm90 import fp8_mma as Q
for shape in {shapes!r}:
    mma, _ = Q._compiled(*shape)
    print("compiled", shape, mma.stages, mma.threads)
"""
# (rows, N, K, K chunks, ring slots, consumer warpgroups, pdl, row tails, second matrix's N):
# 8- and 16-column MMAs, the full ring and the programmatically dependent form with a
# 10-slot ring, q_a|kv_a as two matrices in one launch, whole 64-row tiles at 16 rows
# (benchmark/tile_owner_probe's)
SHAPES = [(1, 6144, 2048, 2, 0, 2, False, True, 0), (16, 2624, 6144, 6, 10, 2, True, False, 0),
          (9, 40, 384, 3, 0, 3, False, True, 0), (3, 2048, 6144, 6, 10, 2, True, False, 576),
          (16, 2624, 6144, 1, 0, 1, False, False, 0)]


MOE_SCRIPT = """
import sys
sys.path.insert(0, {ext!r})
from sgl_kernel_ext.nvidia.sm90 import fp8_moe as Q
for kind, m, inter, hidden, experts, slots, terms, stages, groups, pdl in {forms!r}:
    mma, _ = Q._compiled(kind, m, inter, hidden, experts, slots, terms, stages, groups, pdl)
    print("compiled", kind, m, mma.stages, mma.threads)
"""
# fp8_moe (kind, rows, I, H, experts, slot table, terms, ring slots, consumer warpgroups,
# pdl): one TP8 rank's GLM-5.3 experts at 1 and 16 rows, both in one launch (experts), and
# one launch whose down has more activation groups than a warpgroup's ring slots
MOE_FORMS = [("gate_up", 1, 256, 6144, 256, 9, 1, 0, 2, True),
             ("down", 16, 256, 6144, 256, 129, 9, 0, 2, True),
             ("experts", 1, 256, 6144, 256, 9, 9, 0, 2, True),
             ("experts", 4, 1024, 512, 8, 9, 3, 0, 2, False)]


ATTN_SIDE_SCRIPT = """
import sys
sys.path.insert(0, {ext!r})
from sgl_kernel_ext.nvidia.sm90 import attn_side as Q
for m, shape, kw in {forms!r}:
    side, _ = Q.compiled(m, Q.Shape(*shape), **kw)
    print("compiled", m, shape, kw, side.split1, side.split2, side.stages)
"""
# attn_side (rows, Shape, options): one TP8 rank at 1 and 16 rows (launched dependent, with
# the test's dump and the probe's trace), plainly launched with q_b's weights asked for
# beside q_a|kv_a's, a small shape whose sums of squares fill fewer lanes than a row's, and
# the fixed form (c_q's chunks added as 64-bit integers: ATOMG.E.ADD.64 in its SASS), also
# as the layer launches it (a pool's int64 table read through slot_rows), and with the input
# norm folded in (norm_in, its x made in the units)
ATTN_SIDE_FORMS = [(1, (2048, 576, 6144, 2048), {"dump": True}),
                   (16, (2048, 576, 6144, 2048), {"trace": True}),
                   (9, (2048, 576, 6144, 2048), {"pdl": False, "late_q_b": False}),
                   (3, (512, 192, 1024, 512), {}),
                   (2, (2048, 576, 6144, 2048), {"fixed": True, "dump": True}),
                   (1, (2048, 576, 6144, 2048), {"fixed": True, "by_rows": True,
                                                 "table_bits": 64}),
                   (2, (2048, 576, 6144, 2048), {"fixed": True, "by_rows": True,
                                                 "table_bits": 64, "norm_in": True})]


ATTN_SCRIPT = """
import sys
sys.path.insert(0, {ext!r})
from sgl_kernel_ext.nvidia.sm90 import sparse_mla as Q
for form in {forms!r}:
    Q._compiled(*form)
    print("compiled", form)
"""
# sparse_mla (pdl, a pool's table through slot_rows, slot bits, top-k bits, stages, ablate:
# the probe's measurement-only forms; gathering warpgroups)
ATTN_FORMS = [(True, False, 32, 64, 2, ""),
              (False, True, 64, 32, 3, ""),
              (True, True, 32, 64, 2, "no_mma"),
              (True, False, 32, 64, 2, "no_load"),
              (True, True, 32, 64, 2, "", 2)]


def _compile(tmp_path, script: str, forms: list) -> list:
    """Run the compile script in a fresh process (CuTe DSL reads its environment once);
    the cubins it kept, one per form (the kernels' names differ by their argument types)."""
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="cubin",
               CUTE_DSL_DUMP_DIR=str(tmp_path))
    code = script.format(root=str(ROOT), ext=str(ROOT / "sgl-kernel-ext"), shapes=forms,
                         forms=forms)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    assert run.stdout.count("compiled") == len(forms)
    return sorted(tmp_path.glob("*.cubin"))


def _sass(cubin) -> str:
    return subprocess.run([str(CUOBJDUMP), "-sass", str(cubin)], capture_output=True,
                          text=True, timeout=120).stdout


def _registers(cubin) -> int:
    """Registers a thread of the cubin's (one) kernel takes."""
    usage = subprocess.run([str(CUOBJDUMP), "-res-usage", str(cubin)], capture_output=True,
                           text=True, timeout=120).stdout
    found = re.findall(r"REG:(\d+)", usage)
    assert len(found) == 1, usage[-2000:]
    return int(found[0])


def _check_sass(cubins, wgmma="QGMMA.64x", load="UTMALDG", mma=True) -> None:
    """Each cubin's SASS has the load, and the wgmma (or, mma False, none)."""
    if not CUOBJDUMP.exists():
        pytest.skip(f"no cuobjdump at {CUOBJDUMP.relative_to(ROOT)} to read the SASS")
    for cubin in cubins:
        sass = _sass(cubin)
        assert load in sass, f"{cubin.name}: no {load} in its SASS"
        assert (wgmma in sass) == mma, f"{cubin.name}: {wgmma} {'not ' * mma}in its SASS"


CHAIN_SCRIPT = """
import sys
sys.path[:0] = [{root!r}, {ext!r}]
from benchmark import stream_chain_probe as P
for arm in P.ARMS:
    chain, _ = P.compiled(arm, 2, 132)
    assert sum(chain.expected_counts()) == chain.total_units, arm
    print("compiled", arm, chain.stages)
print("arms", len(P.ARMS))
"""


def test_stream_chain_probe_compiles_for_sm90a(tmp_path):
    """Every arm of benchmark/stream_chain_probe's persistent chain (per-worker TMA rings,
    stage counters; with and without its dependencies): the bulk tensor copies and the FP8
    wgmma in its SASS."""
    env = dict(os.environ, CUTE_DSL_ARCH="sm_90a", CUTE_DSL_KEEP="cubin",
               CUTE_DSL_DUMP_DIR=str(tmp_path))
    code = CHAIN_SCRIPT.format(root=str(ROOT), ext=str(ROOT / "sgl-kernel-ext"))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    arms = int(run.stdout.split("arms")[-1])
    assert arms > 0 and run.stdout.count("compiled") == arms
    cubins = sorted(tmp_path.glob("*.cubin"))
    assert cubins, [p.name for p in tmp_path.iterdir()]
    _check_sass(cubins)


HOP_SCRIPT = """
import sys
sys.path[:0] = [{root!r}, {ext!r}]
from benchmark import cluster_hop_probe as P
for mode, m, chunks, tiles in {forms!r}:
    probe, _ = P.compiled(mode, m, chunks, tiles)
    print("compiled", mode, m, chunks, probe.grid)
"""


def test_cluster_hop_probe_compiles_for_sm90a(tmp_path):
    """benchmark/cluster_hop_probe's two hops (global memory; a cluster's distributed shared
    memory: st.async into the leader's shared memory, STAS in the SASS)."""
    for i, form in enumerate([("global", 16, 6, 22), ("dsmem", 1, 3, 32)]):
        (tmp_path / str(i)).mkdir()  # one folder each: the cubins' names are alike
        cubins = _compile(tmp_path / str(i), HOP_SCRIPT, [form])
        assert len(cubins) == 1, [p.name for p in (tmp_path / str(i)).iterdir()]
        if CUOBJDUMP.exists():
            assert ("STAS" in _sass(cubins[0])) == (form[0] == "dsmem"), form


def test_fp8_moe_compiles_for_sm90a(tmp_path):
    cubins = _compile(tmp_path, MOE_SCRIPT, MOE_FORMS)
    assert cubins, [p.name for p in tmp_path.iterdir()]
    _check_sass(cubins)


def test_fp8_mma_compiles_for_sm90a(tmp_path):
    for i, shape in enumerate(SHAPES):  # one folder each: a cubin's name is cut short
        (tmp_path / str(i)).mkdir()
        cubins = _compile(tmp_path / str(i), SCRIPT, [shape])
        assert len(cubins) == 1, [p.name for p in (tmp_path / str(i)).iterdir()]
        _check_sass(cubins)


def test_attn_side_compiles_for_sm90a(tmp_path):
    """The attention side's one launch (q_a|kv_a, then q_b on c_q normed in its units): the
    TMA weight ring and the FP8 wgmma (64x8 and 64x16) in each form's SASS."""
    for i, form in enumerate(ATTN_SIDE_FORMS):  # one folder each: the cubins' names are alike
        (tmp_path / str(i)).mkdir()
        cubins = _compile(tmp_path / str(i), ATTN_SIDE_SCRIPT, [form])
        assert len(cubins) == 1, [p.name for p in (tmp_path / str(i)).iterdir()]
        _check_sass(cubins, wgmma="QGMMA.64x16x32" if form[0] > 8 else "QGMMA.64x8x32")
        if form[2].get("fixed"):
            _check_sass(cubins, wgmma="QGMMA.64x8x32", load="ATOMG.E.ADD.64")


def test_sparse_mla_compiles_for_sm90a(tmp_path):
    """The attention: bf16 wgmma with the heads as N (64x8), the KV rows gathered by cp.async
    (LDGSTS); its no_mma form without the MMAs."""
    for i, form in enumerate(ATTN_FORMS):  # one folder each: the cubins' names are alike
        (tmp_path / str(i)).mkdir()
        cubins = _compile(tmp_path / str(i), ATTN_SCRIPT, [form])
        assert len(cubins) == 1, [p.name for p in (tmp_path / str(i)).iterdir()]
        _check_sass(cubins, wgmma="HGMMA.64x8x16.F32.BF16", load="LDGSTS",
                    mma=form[5] != "no_mma")


TOPK_SCRIPT = """
import sys
sys.path.insert(0, {ext!r})
from sgl_kernel_ext.nvidia.sm90 import cluster_topk as Q
for k, kpt, pdl, pos_bits, wide, vec, push, prefetch, more in {forms!r}:
    kernel, _ = Q._compiled(k, kpt, pdl, pos_bits, wide, vec, push, False, prefetch, **more)
    print("compiled", k, kpt, kernel.width)
"""


def _instructions(sass: str) -> int:
    return len(re.findall(r"^\s*/\*[0-9a-f]{4,}\*/", sass, re.M))


def test_cluster_topk_compiles_for_sm90a(tmp_path):
    """The long-row top-k as one cluster launch, at the widths a layer asks for (4K: four keys
    a thread; 64K: its most; a wider table's, which loads its keys again each pass past 64K,
    with and without the next tile prefetched;
    int64 positions, launched dependent; a row that is no multiple of four wide, its keys
    loaded one by one; the CTAs reading each other's histograms after cluster barriers instead
    of sending them; the skip in the tally and write, 16 CTAs a row, the passes rolled, with
    one CTA an SM or two): its histograms as shared-memory atomics, 16-byte loads of the keys, no
    spilled keys; the histograms sent by st.async onto mbarriers, with no GPU-wide memory
    barrier (or, pulled, cluster barriers)."""
    forms = [(2048, 4, False, 32, False, True, True, False, {}),
             (2048, 16, True, 64, False, True, True, False, {}),
             (2048, 32, True, 64, False, True, True, False, {}),
             (2048, 32, True, 64, True, True, True, True, {}),
             (2048, 32, True, 64, True, True, True, False, {}),
             (2048, 8, True, 64, False, False, True, False, {}),
             (2048, 16, True, 64, False, True, False, False, {}),
             (2048, 32, True, 64, True, True, True, True,
              {"skip_write": True, "skip_reloaded": False}),
             (2048, 32, True, 64, True, True, True, True, {"cluster": 16}),
             (2048, 32, True, 64, True, True, True, True, {"roll": True}),
             (2048, 32, True, 64, True, True, True, False, {"roll": True, "ctas_per_sm": 2})]
    instructions = {}
    for i, form in enumerate(forms):
        (tmp_path / str(i)).mkdir()  # one folder each: the cubins' names are alike
        cubins = _compile(tmp_path / str(i), TOPK_SCRIPT, [form])
        assert len(cubins) == 1, [p.name for p in (tmp_path / str(i)).iterdir()]
        if CUOBJDUMP.exists():
            sass = _sass(cubins[0])
            instructions[i] = _instructions(sass)
            assert "ATOMS" in sass and "UCGABAR_WAIT" in sass, form
            push = form[6]
            assert ("STAS.128" in sass and "SYNCS.PHASECHK" in sass) == push, form
            # pulled: a cluster barrier a pass, one for the counts, one at the end
            assert ("MEMBAR.ALL.GPU" in sass) == (not push), form
            if form[8].get("ctas_per_sm", 1) == 1:
                assert "STL" not in sass, f"{form}: keys spilled to local memory"
            else:  # two CTAs an SM: at most 128 registers, a word spilled, no keys
                assert _registers(cubins[0]) <= 128, form
                assert sass.count("STL") <= 1, f"{form}: {sass.count('STL')} spill stores"
            assert ("LDG.E.128" in sass) == form[5], f"{form}: vector loads of the keys"
            if form[1] == 32 and form[4] and not form[8]:
                # cluster_topk.PREFETCH_ROWS' premise: the wide form without the prefetch fits
                # two CTAs an SM (at most 128 registers a thread), with it one
                regs = _registers(cubins[0])
                assert (regs > 128) == form[7], f"{form}: {regs} registers a thread"
            if form[8].get("cluster") == 16:  # each warp sends to two CTAs
                assert sass.count("STAS.128") == 2 * _sass_of(tmp_path / "3").count("STAS.128")
    if instructions:
        # ROLL's point: the prefetching wide form in (well under) two thirds of the code
        assert instructions[9] < 0.66 * instructions[3], instructions


def _sass_of(folder) -> str:
    return _sass(sorted(folder.glob("*.cubin"))[0])
