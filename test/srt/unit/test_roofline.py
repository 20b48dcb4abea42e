"""CPU checks of benchmark/roofline.py against the floor calculator's tables.

The expected bytes below were produced by `shared/tools/glm5_arch_bytes.py` (functions
`glm53_layer(kind, 8, M, L, kv)` and `glm53_step(8, M, L, kv)`, GLM-5.3 FP8, one TP8 rank) and
match docs/glm5_arch_spec.md tables T5a/T6a. When that tool is present at ../shared/tools
relative to the repository root, the module is also compared with it live over every kind,
TP, M, L and KV dtype.
"""

import importlib.util
from pathlib import Path

import pytest

from benchmark import roofline as rl

REPO = Path(__file__).resolve().parents[3]
TOOL = REPO.parent / "shared" / "tools" / "glm5_arch_bytes.py"
MS = (1, 4, 8, 16)

# glm53_layer(kind, 8, M, L, "bf16") for M = 1, 4, 8, 16 (bytes)
LAYER_TP8_BF16 = {
    ("dense", 2048): (77912768.0, 85801664.0, 96320192.0, 117357248.0),
    ("dense", 8192): (78723776.0, 89045696.0, 102808256.0, 130333376.0),
    ("dense", 32768): (81967808.0, 102021824.0, 128760512.0, 182237888.0),
    ("moe_idx", 2048): (95218752.0, 209448227.7, 346879845.6, 578140583.8),
    ("moe_idx", 8192): (96029760.0, 212692259.7, 353367909.6, 591116711.8),
    ("moe_idx", 32768): (99273792.0, 225668387.7, 379320165.6, 643021223.8),
    ("moe", 2048): (84590656.0, 198009123.7, 334359397.6, 563457447.8),
    ("moe", 8192): (84590656.0, 198009123.7, 334359397.6, 563457447.8),
    ("moe", 32768): (84590656.0, 198009123.7, 334359397.6, 563457447.8),
}
# glm53_step(8, M, L, "bf16")
STEP_TP8_BF16 = {
    2048: (7007240448.0, 15551890358.9, 25829180674.3, 43113573996.3),
    8192: (7024271616.0, 15620015030.9, 25965430018.3, 43386072684.3),
    32768: (7092396288.0, 15892513718.9, 26510427394.3, 44476067436.3),
}
LAYER_MOE_IDX_8K_TP8_FP8 = (95013952.0, 208629027.7, 345241445.6, 574863783.8)
LAYER_MOE_IDX_8K_TP1_BF16 = (536532928.0, 1397579485.8, 2426646764.6, 4135961342.7)
STEP_2K_TP8_FP8 = (6928007424.0, 15234958262.9, 25195316482.3, 41845845612.3)
PARTS = {  # the tool's G53 constants (bytes, whole model, per layer)
    "attn_replicated": 16155584, "attn_split": 163610624, "indexer": 10357760,
    "dense_mlp": 226547712, "router": 3146752, "expert": 37757952, "lm_head": 1903177728,
}


def close(a, b):
    return abs(a - b) <= 0.051 + 1e-12 * abs(b)  # constants above are rounded to 0.1 byte


def test_parts():
    for name, value in PARTS.items():
        assert getattr(rl.GLM53, name) == value, name
    assert rl.GLM53.n_moe_shared == 57


@pytest.mark.parametrize("key", sorted(LAYER_TP8_BF16))
def test_layer_tp8_bf16(key):
    kind, ctx = key
    for m, want in zip(MS, LAYER_TP8_BF16[key]):
        assert close(rl.layer_bytes(kind, 8, m, ctx, "bf16"), want), (kind, ctx, m)


def test_step_and_variants():
    for ctx, row in STEP_TP8_BF16.items():
        for m, want in zip(MS, row):
            assert close(rl.step_bytes(8, m, ctx, "bf16"), want), (ctx, m)
    for m, a, b, c in zip(MS, LAYER_MOE_IDX_8K_TP8_FP8, LAYER_MOE_IDX_8K_TP1_BF16, STEP_2K_TP8_FP8):
        assert close(rl.layer_bytes("moe_idx", 8, m, 8192, "fp8"), a)
        assert close(rl.layer_bytes("moe_idx", 1, m, 8192, "bf16"), b)
        assert close(rl.step_bytes(8, m, 2048, "fp8"), c)


def test_floor_and_spec_examples():
    # DESIGN.md: MoE layer 19.7 us at M=1, 131 us at M=16; step 1.63 / 3.62 / 10.0 ms (4.3 TB/s)
    bw = 4.3e12
    assert round(rl.floor_us(rl.layer_bytes("moe", 8, 1, 2048), bw), 1) == 19.7
    assert round(rl.floor_us(rl.layer_bytes("moe", 8, 16, 2048), bw)) == 131
    assert round(rl.floor_us(rl.step_bytes(8, 1, 2048), bw) / 1e3, 2) == 1.63
    assert round(rl.floor_us(rl.step_bytes(8, 4, 2048), bw) / 1e3, 2) == 3.62
    assert round(rl.floor_us(rl.step_bytes(8, 16, 2048), bw) / 1e3, 1) == 10.0


def test_measured_experts_and_refusals():
    d = rl.distinct_experts(256, 8, 4)
    assert rl.layer_bytes("moe", 8, 4, 2048, experts=d) == pytest.approx(rl.layer_bytes("moe", 8, 4, 2048))
    more = rl.layer_bytes("moe", 8, 4, 2048, experts=32) - rl.layer_bytes("moe", 8, 4, 2048, experts=31)
    assert more == pytest.approx(rl.GLM53.expert / 8)
    assert set(rl.layer_bytes_parts("dense", 8, 1, 2048)) == {
        "attn_weights", "kv_cache", "indexer_weights", "index_cache", "dense_mlp"}
    with pytest.raises(ValueError):
        rl.layer_bytes("kda", 8, 1, 2048)
    with pytest.raises(ValueError):
        rl.layer_bytes("moe", 8, 1, 2048, kv_dtype="int4")


def test_geometry_from_reference_config():
    from sglang.srt.layers.fused_decode.reference.config import glm53_config

    assert rl.Geometry.from_config(glm53_config()) == rl.GLM53


@pytest.mark.skipif(not TOOL.exists(), reason="../shared/tools/glm5_arch_bytes.py not present")
def test_live_against_tool():
    spec = importlib.util.spec_from_file_location("glm5_arch_bytes", TOOL)
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    for kind in rl.LAYER_KINDS:
        for ctx in (2048, 8192, 32768):
            for m in (1, 2, 4, 8, 16):
                for tp in (1, 2, 4, 8):
                    for kv in ("bf16", "fp8"):
                        want = tool.glm53_layer(kind, tp, m, ctx, kv)
                        assert rl.layer_bytes(kind, tp, m, ctx, kv) == pytest.approx(want, rel=1e-12)
    for m in (1, 4, 8, 16):
        for tp in (1, 8):
            assert rl.step_bytes(tp, m, 2048, "bf16") == pytest.approx(
                tool.glm53_step(tp, m, 2048, "bf16"), rel=1e-12)
