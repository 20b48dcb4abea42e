"""Random-weight checkpoints: upstream's ModelConfig accepts them, a write/read round trip gives
the generator's tensors, and a checkpoint with a wrong shape, dtype or missing field is refused
with its name."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from sglang.srt.layers.fused_decode.reference import checkpoint as CK, config as C, weights as W
from sglang.srt.layers.fused_decode.reference.quant import FP8, Fp8Weight

CFG = C.tiny_config()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tiny_ckpt"))
    CK.write_checkpoint(CFG, path, seed=3)
    return path


def _same(a, b):
    if isinstance(a, Fp8Weight):
        return _same(a.q, b.q) and _same(a.s, b.s)
    if isinstance(a, torch.Tensor):
        if a.dtype == FP8:
            a, b = a.view(torch.uint8), b.view(torch.uint8)
        return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if hasattr(a, "__dataclass_fields__"):
        return all(_same(getattr(a, f), getattr(b, f)) for f in a.__dataclass_fields__ if f != "cfg")
    return a == b


def test_round_trip_equals_generator(ckpt):
    cfg, w = CK.read_checkpoint(ckpt)
    assert cfg == CFG
    ref = W.generate_weights(CFG, 3, mtp=True)
    for i in range(CFG.num_hidden_layers):
        assert _same(w.layers[i], ref.layers[i]), i
    assert _same(w.mtp, ref.mtp)
    assert _same(w.embed, ref.embed) and _same(w.lm_head, ref.lm_head) and _same(w.final_norm, ref.final_norm)


def test_names_and_dtypes(ckpt):
    t = load_file(os.path.join(ckpt, "model-00001-of-00001.safetensors"))
    L = CFG.num_hidden_layers
    assert t["model.layers.1.mlp.experts.15.down_proj.weight"].dtype == FP8
    assert t["model.layers.1.mlp.experts.15.down_proj.weight_scale_inv"].shape == (2, 2)
    assert t["model.layers.1.self_attn.kv_b_proj.weight"].dtype == torch.bfloat16
    assert t["model.layers.1.mlp.gate.e_score_correction_bias"].dtype == torch.float32
    assert t["model.layers.0.self_attn.indexer.weights_proj.weight"].dtype == torch.bfloat16
    assert "model.layers.2.self_attn.indexer.wk.weight" not in t  # shared-top-k layer
    assert t[f"model.layers.{L}.eh_proj.weight"].shape == (256, 512)
    assert f"model.layers.{L}.self_attn.indexer.wq_b.weight" in t  # MTP layer has an indexer
    with open(os.path.join(ckpt, "config.json")) as f:
        d = json.load(f)
    q = d["quantization_config"]
    assert (q["quant_method"], q["fmt"], q["activation_scheme"], q["weight_block_size"]) == (
        "fp8", "e4m3", "dynamic", [128, 128])
    assert "model.layers.1.self_attn.kv_b_proj" in q["modules_to_not_convert"]


def test_upstream_model_config_accepts(ckpt):
    mc_mod = pytest.importorskip("sglang.srt.configs.model_config", reason="upstream sglang not installed")
    mc = mc_mod.ModelConfig(model_path=ckpt)
    assert mc.hf_config.architectures == ["GlmMoeDsaForCausalLM"]
    assert mc.quantization == "fp8"
    assert mc.attention_arch == mc_mod.AttentionArch.MLA
    assert (mc.head_dim, mc.kv_lora_rank, mc.qk_rope_head_dim, mc.v_head_dim) == (256, 128, 64, 256)
    assert mc.index_head_dim == 128 and mc.num_hidden_layers == CFG.num_hidden_layers
    assert list(mc.hf_config.indexer_types) == list(CFG.indexer_types)
    skips = [mc_mod.dsa_layer_skips_topk(mc.hf_config, i) for i in range(CFG.num_hidden_layers)]
    assert skips == [not CFG.runs_indexer(i) for i in range(CFG.num_hidden_layers)]
    draft = mc_mod.ModelConfig(model_path=ckpt, is_draft_model=True)
    assert draft.hf_config.architectures[0] == "GlmMoeDsaForCausalLMNextN"


def test_upstream_fp8_config_keeps_bf16_modules(ckpt):
    fp8 = pytest.importorskip("sglang.srt.layers.quantization.fp8", reason="upstream sglang not installed")
    qutils = pytest.importorskip("sglang.srt.layers.quantization.utils")
    with open(os.path.join(ckpt, "config.json")) as f:
        qc = fp8.Fp8Config.from_config(json.load(f)["quantization_config"])
    assert qc.weight_block_size == [128, 128] and qc.is_checkpoint_fp8_serialized
    assert qutils.is_layer_skipped("model.layers.1.self_attn.kv_b_proj", qc.ignored_layers)
    assert not qutils.is_layer_skipped("model.layers.1.self_attn.o_proj", qc.ignored_layers)


def _copy(src, dst):
    os.makedirs(dst)
    for f in os.listdir(src):
        with open(os.path.join(src, f), "rb") as a, open(os.path.join(dst, f), "wb") as b:
            b.write(a.read())


def _edit_tensors(path, fn):
    f = os.path.join(path, "model-00001-of-00001.safetensors")
    t = load_file(f)
    fn(t)
    save_file(t, f, metadata={"format": "pt"})
    idx = os.path.join(path, CK.INDEX_FILE)
    with open(idx) as fh:
        d = json.load(fh)
    d["weight_map"] = {k: "model-00001-of-00001.safetensors" for k in t}
    with open(idx, "w") as fh:
        json.dump(d, fh)


@pytest.mark.parametrize("case, match", [
    ("shape", r"model\.layers\.1\.self_attn\.o_proj\.weight: shape"),
    ("dtype", r"model\.layers\.1\.self_attn\.kv_b_proj\.weight: dtype F8_E4M3"),
    ("missing_tensor", r"lacks tensor\(s\): model\.layers\.3\.mlp\.experts\.7\.up_proj\.weight_scale_inv"),
    ("extra_tensor", r"unexpected tensor\(s\): model\.layers\.2\.self_attn\.indexer\.wk\.weight"),
    ("missing_field", r"lacks required field\(s\): kv_lora_rank"),
    ("scale_dtype", r"model\.layers\.0\.mlp\.down_proj\.weight_scale_inv: dtype BF16"),
])
def test_refusals_name_the_problem(ckpt, tmp_path, case, match):
    bad = str(tmp_path / case)
    _copy(ckpt, bad)
    if case == "shape":
        _edit_tensors(bad, lambda t: t.update({"model.layers.1.self_attn.o_proj.weight":
                                               t["model.layers.1.self_attn.o_proj.weight"][:, :512].clone()}))
    elif case == "dtype":
        k = "model.layers.1.self_attn.kv_b_proj.weight"
        _edit_tensors(bad, lambda t: t.update({k: t[k].to(FP8)}))
    elif case == "missing_tensor":
        _edit_tensors(bad, lambda t: t.pop("model.layers.3.mlp.experts.7.up_proj.weight_scale_inv"))
    elif case == "extra_tensor":
        _edit_tensors(bad, lambda t: t.update({"model.layers.2.self_attn.indexer.wk.weight":
                                               t["model.layers.1.self_attn.indexer.wk.weight"].clone()}))
    elif case == "scale_dtype":
        k = "model.layers.0.mlp.down_proj.weight_scale_inv"
        _edit_tensors(bad, lambda t: t.update({k: t[k].bfloat16()}))
    else:
        p = os.path.join(bad, "config.json")
        with open(p) as f:
            d = json.load(f)
        del d["kv_lora_rank"]
        with open(p, "w") as f:
            json.dump(d, f)
    with pytest.raises(ValueError, match=match):
        CK.read_checkpoint(bad)


def test_small_config_without_mtp_and_sharded(tmp_path):
    cfg = C.config_with(CFG, num_hidden_layers=2, indexer_types=("full", "shared"))
    path = str(tmp_path / "small")
    wm = CK.write_checkpoint(cfg, path, seed=1, mtp=False, shard_bytes=1 << 20)
    assert len(set(wm.values())) > 2  # several shards with an index
    got, w = CK.read_checkpoint(path)
    assert got.num_nextn_predict_layers == 0 and w.mtp is None and sorted(w.layers) == [0, 1]
    assert _same(w.layers[1], W.generate_weights(cfg, 1, layers=[1]).layers[1])
