"""Reference config: real GLM-5.3 values, the tiny config's structure, refusals naming a field."""

import pytest

from sglang.srt.layers.fused_decode.reference import config as C


def test_real_glm53_structure():
    cfg = C.glm53_config()
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == (6144, 78, 154880)
    assert cfg.kv_cache_dim == 576 and cfg.qk_head_dim == 256 and cfg.softmax_scale == 0.0625
    full = [i for i in range(78) if cfg.runs_indexer(i)]
    assert full == [0, 1, 2] + list(range(6, 78, 4)) and len(full) == 21
    assert [i for i in range(78) if not cfg.is_moe(i)] == [0, 1, 2]
    assert cfg.is_moe(78) and cfg.runs_indexer(78)  # the MTP layer
    assert cfg.rope_theta == 8e6 and cfg.index_topk == 2048 and cfg.routed_scaling_factor == 2.5
    for tp in (1, 2, 4, 8):
        cfg.check_tp(tp)
    assert C.per_rank(cfg, 8) == {"heads": 8, "intermediate": 1536, "moe_intermediate": 256,
                                  "vocab": 19360}


def test_tiny_keeps_every_structural_feature():
    cfg = C.tiny_config()
    kinds = {(cfg.is_moe(i), cfg.runs_indexer(i)) for i in range(cfg.num_hidden_layers)}
    assert kinds == {(False, True), (True, True), (True, False)}
    assert cfg.index_topk < 32  # test contexts are longer than the top-k
    assert cfg.kv_cache_dim % 128 and cfg.hidden_size % 128 == 0  # a partial FP8 block in kv_a
    assert cfg.n_routed_experts > cfg.num_experts_per_tok > 1
    cfg.check_tp(2)
    with pytest.raises(ValueError, match="moe_intermediate_size"):
        cfg.check_tp(4)


def test_round_trip_and_derived_indexer_types():
    cfg = C.tiny_config()
    assert C.Glm5Config.from_dict(cfg.to_dict()) == cfg
    d = cfg.to_dict()
    del d["indexer_types"]
    assert C.Glm5Config.from_dict(d).indexer_types == cfg.indexer_types  # from freq / offset
    assert C.derive_indexer_types(8, 4, 3) == ("full",) * 3 + ("shared",) * 3 + ("full", "shared")


@pytest.mark.parametrize(
    "change, field",
    [
        ({"hidden_size": None}, "hidden_size"),
        ({"index_topk": None}, "index_topk"),
        ({"rope_parameters": {"rope_type": "default"}}, "rope_theta"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"indexer_types": ["full"] * 3}, "indexer_types"),
        ({"quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic",
                                  "weight_block_size": [64, 64]}}, "weight_block_size"),
        ({"n_group": 8}, "n_group"),
        ({"hidden_size": 200}, "hidden_size=200"),
        ({"architectures": ["DeepseekV3ForCausalLM"]}, "architectures"),
    ],
)
def test_refusals_name_the_field(change, field):
    d = C.tiny_config_dict()
    d.update(change)
    with pytest.raises(ValueError, match=field):
        C.Glm5Config.from_dict(d)
