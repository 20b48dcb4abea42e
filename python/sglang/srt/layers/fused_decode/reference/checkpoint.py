"""Random-weight GLM-5.3 checkpoints in Hugging Face layout, as SGLang loads them.

`write_checkpoint(cfg, path, seed)` writes config.json (architecture `GlmMoeDsaForCausalLM`,
FP8 `quantization_config`) and safetensors shards with an index: FP8 e4m3 `*.weight` plus fp32
`*.weight_scale_inv` (one per 128x128 block) for the quantized linears; bf16 for kv_b, router,
norms, embedding, LM head, indexer weights_proj and k_norm, the MTP eh_proj; fp32 for the router's
`e_score_correction_bias`. Experts are stored one per name (`mlp.experts.{e}.gate_proj`), the MTP
layer as `model.layers.{num_hidden_layers}.*`. It is built one layer at a time (the tiny config
writes in well under a second; any small config works).

`expected_tensors(cfg)` is the name -> (shape, dtype) contract; `validate_checkpoint(path)`
refuses a checkpoint whose config lacks a field, or that misses a tensor, has an extra one, or
has a wrong shape or dtype, naming it; `read_checkpoint(path)` validates and returns the config
and TP1 `ModelWeights` equal to `generate_weights(cfg, seed)`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Dict, Iterator, List, Tuple

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from .config import Glm5Config
from .quant import FP8, Fp8Weight
from .weights import (
    AttentionWeights, DenseMlpWeights, IndexerWeights, LayerWeights, ModelWeights, MoeWeights,
    MtpWeights, gen_layer, gen_mtp, generate_weights,
)

BF16, F32 = torch.bfloat16, torch.float32
INDEX_FILE = "model.safetensors.index.json"


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def expected_tensors(cfg: Glm5Config) -> Dict[str, Tuple[Tuple[int, ...], torch.dtype]]:
    """Every tensor name the checkpoint holds, with its shape and dtype."""
    b = cfg.block
    out: Dict[str, Tuple[Tuple[int, ...], torch.dtype]] = {}

    def fp8(name, n, k):
        out[f"{name}.weight"] = ((n, k), FP8)
        out[f"{name}.weight_scale_inv"] = ((_cdiv(n, b), _cdiv(k, b)), F32)

    def vec(name, n, dtype=BF16):
        out[name] = ((n,), dtype)

    h, nh = cfg.hidden_size, cfg.num_attention_heads
    for i in range(cfg.num_hidden_layers + cfg.num_nextn_predict_layers):
        p = f"model.layers.{i}"
        vec(f"{p}.input_layernorm.weight", h)
        vec(f"{p}.post_attention_layernorm.weight", h)
        fp8(f"{p}.self_attn.q_a_proj", cfg.q_lora_rank, h)
        vec(f"{p}.self_attn.q_a_layernorm.weight", cfg.q_lora_rank)
        fp8(f"{p}.self_attn.kv_a_proj_with_mqa", cfg.kv_cache_dim, h)
        vec(f"{p}.self_attn.kv_a_layernorm.weight", cfg.kv_lora_rank)
        fp8(f"{p}.self_attn.q_b_proj", nh * cfg.qk_head_dim, cfg.q_lora_rank)
        out[f"{p}.self_attn.kv_b_proj.weight"] = (
            (nh * (cfg.qk_nope_head_dim + cfg.v_head_dim), cfg.kv_lora_rank), BF16)
        fp8(f"{p}.self_attn.o_proj", h, nh * cfg.v_head_dim)
        if cfg.runs_indexer(i):
            ni, di = cfg.index_n_heads, cfg.index_head_dim
            fp8(f"{p}.self_attn.indexer.wq_b", ni * di, cfg.q_lora_rank)
            fp8(f"{p}.self_attn.indexer.wk", di, h)
            vec(f"{p}.self_attn.indexer.k_norm.weight", di)
            vec(f"{p}.self_attn.indexer.k_norm.bias", di)
            out[f"{p}.self_attn.indexer.weights_proj.weight"] = ((ni, h), BF16)
        if cfg.is_moe(i):
            e, im = cfg.n_routed_experts, cfg.moe_intermediate_size
            out[f"{p}.mlp.gate.weight"] = ((e, h), BF16)
            vec(f"{p}.mlp.gate.e_score_correction_bias", e, F32)
            for j in range(e):
                fp8(f"{p}.mlp.experts.{j}.gate_proj", im, h)
                fp8(f"{p}.mlp.experts.{j}.up_proj", im, h)
                fp8(f"{p}.mlp.experts.{j}.down_proj", h, im)
            ims = im * cfg.n_shared_experts
            fp8(f"{p}.mlp.shared_experts.gate_proj", ims, h)
            fp8(f"{p}.mlp.shared_experts.up_proj", ims, h)
            fp8(f"{p}.mlp.shared_experts.down_proj", h, ims)
        else:
            fp8(f"{p}.mlp.gate_proj", cfg.intermediate_size, h)
            fp8(f"{p}.mlp.up_proj", cfg.intermediate_size, h)
            fp8(f"{p}.mlp.down_proj", h, cfg.intermediate_size)
        if i >= cfg.num_hidden_layers:
            vec(f"{p}.enorm.weight", h)
            vec(f"{p}.hnorm.weight", h)
            out[f"{p}.eh_proj.weight"] = ((h, 2 * h), BF16)
            vec(f"{p}.shared_head.norm.weight", h)
    out["model.embed_tokens.weight"] = ((cfg.vocab_size, h), BF16)
    vec("model.norm.weight", h)
    out["lm_head.weight"] = ((cfg.vocab_size, h), BF16)
    return out


# ----- ModelWeights <-> named tensors -----

def _fp8_items(name: str, w: Fp8Weight) -> Iterator[Tuple[str, torch.Tensor]]:
    yield f"{name}.weight", w.q
    yield f"{name}.weight_scale_inv", w.s


def _mlp_items(p: str, m: DenseMlpWeights):
    for part, w in (("gate_proj", m.gate), ("up_proj", m.up), ("down_proj", m.down)):
        yield from _fp8_items(f"{p}.{part}", w)


def layer_tensors(lw: LayerWeights) -> Iterator[Tuple[str, torch.Tensor]]:
    p = f"model.layers.{lw.layer_id}"
    a = lw.attn
    yield f"{p}.input_layernorm.weight", lw.input_norm
    yield f"{p}.post_attention_layernorm.weight", lw.post_attention_norm
    yield from _fp8_items(f"{p}.self_attn.q_a_proj", a.q_a)
    yield f"{p}.self_attn.q_a_layernorm.weight", a.q_a_norm
    yield from _fp8_items(f"{p}.self_attn.kv_a_proj_with_mqa", a.kv_a)
    yield f"{p}.self_attn.kv_a_layernorm.weight", a.kv_a_norm
    yield from _fp8_items(f"{p}.self_attn.q_b_proj", a.q_b)
    yield f"{p}.self_attn.kv_b_proj.weight", a.kv_b
    yield from _fp8_items(f"{p}.self_attn.o_proj", a.o_proj)
    if a.indexer is not None:
        ix = a.indexer
        yield from _fp8_items(f"{p}.self_attn.indexer.wq_b", ix.wq_b)
        yield from _fp8_items(f"{p}.self_attn.indexer.wk", ix.wk)
        yield f"{p}.self_attn.indexer.k_norm.weight", ix.k_norm_weight
        yield f"{p}.self_attn.indexer.k_norm.bias", ix.k_norm_bias
        yield f"{p}.self_attn.indexer.weights_proj.weight", ix.weights_proj
    if isinstance(lw.mlp, MoeWeights):
        m = lw.mlp
        yield f"{p}.mlp.gate.weight", m.router
        yield f"{p}.mlp.gate.e_score_correction_bias", m.bias
        for j in range(m.gate.q.shape[0]):
            for part, w in (("gate_proj", m.gate), ("up_proj", m.up), ("down_proj", m.down)):
                yield from _fp8_items(f"{p}.mlp.experts.{j}.{part}", w.select(j))
        yield from _mlp_items(f"{p}.mlp.shared_experts", m.shared)
    else:
        yield from _mlp_items(f"{p}.mlp", lw.mlp)


def mtp_tensors(m: MtpWeights) -> Iterator[Tuple[str, torch.Tensor]]:
    p = f"model.layers.{m.layer.layer_id}"
    yield f"{p}.enorm.weight", m.enorm
    yield f"{p}.hnorm.weight", m.hnorm
    yield f"{p}.eh_proj.weight", m.eh_proj
    yield f"{p}.shared_head.norm.weight", m.head_norm
    yield from layer_tensors(m.layer)


def _fp8_of(t: Dict[str, torch.Tensor], name: str, block: int) -> Fp8Weight:
    return Fp8Weight(t[f"{name}.weight"], t[f"{name}.weight_scale_inv"], block)


def _stack(ws: List[Fp8Weight]) -> Fp8Weight:
    return Fp8Weight(torch.stack([w.q for w in ws]), torch.stack([w.s for w in ws]), ws[0].block)


def _mlp_of(t, p, b) -> DenseMlpWeights:
    return DenseMlpWeights(_fp8_of(t, f"{p}.gate_proj", b), _fp8_of(t, f"{p}.up_proj", b),
                           _fp8_of(t, f"{p}.down_proj", b))


def layer_from_tensors(cfg: Glm5Config, t: Dict[str, torch.Tensor], i: int) -> LayerWeights:
    p, b = f"model.layers.{i}", cfg.block
    indexer = None
    if cfg.runs_indexer(i):
        q = f"{p}.self_attn.indexer"
        indexer = IndexerWeights(_fp8_of(t, f"{q}.wq_b", b), _fp8_of(t, f"{q}.wk", b),
                                 t[f"{q}.weights_proj.weight"], t[f"{q}.k_norm.weight"],
                                 t[f"{q}.k_norm.bias"])
    s = f"{p}.self_attn"
    attn = AttentionWeights(
        _fp8_of(t, f"{s}.q_a_proj", b), t[f"{s}.q_a_layernorm.weight"],
        _fp8_of(t, f"{s}.kv_a_proj_with_mqa", b), t[f"{s}.kv_a_layernorm.weight"],
        _fp8_of(t, f"{s}.q_b_proj", b), t[f"{s}.kv_b_proj.weight"], _fp8_of(t, f"{s}.o_proj", b),
        indexer,
    )
    if cfg.is_moe(i):
        e = cfg.n_routed_experts
        mlp = MoeWeights(
            t[f"{p}.mlp.gate.weight"], t[f"{p}.mlp.gate.e_score_correction_bias"],
            *[_stack([_fp8_of(t, f"{p}.mlp.experts.{j}.{part}", b) for j in range(e)])
              for part in ("gate_proj", "up_proj", "down_proj")],
            _mlp_of(t, f"{p}.mlp.shared_experts", b),
        )
    else:
        mlp = _mlp_of(t, f"{p}.mlp", b)
    return LayerWeights(i, t[f"{p}.input_layernorm.weight"], t[f"{p}.post_attention_layernorm.weight"],
                        attn, mlp)


# ----- files -----

def write_checkpoint(cfg: Glm5Config, path: str, seed: int = 0, mtp: bool = True,
                     shard_bytes: int = 2 << 30) -> Dict[str, str]:
    """Write config.json, safetensors shards and the index; returns the weight map."""
    os.makedirs(path, exist_ok=True)
    n_mtp = cfg.num_nextn_predict_layers if mtp else 0
    if mtp and n_mtp != 1:
        raise ValueError(f"num_nextn_predict_layers={n_mtp}: the writer builds exactly one MTP layer")
    cfg = dataclasses.replace(cfg, num_nextn_predict_layers=n_mtp)
    d = cfg.to_dict()
    shards: List[Dict[str, torch.Tensor]] = [{}]
    size = 0

    def put(name, tensor):
        nonlocal size
        nbytes = tensor.numel() * tensor.element_size()
        if size and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor.contiguous()
        size += nbytes

    head = generate_weights(cfg, seed, layers=[])
    put("model.embed_tokens.weight", head.embed)
    for i in range(cfg.num_hidden_layers):  # one layer in memory at a time, then written out
        for name, tensor in layer_tensors(gen_layer(cfg, seed, i)):
            put(name, tensor)
    if mtp:
        for name, tensor in mtp_tensors(gen_mtp(cfg, seed)):
            put(name, tensor)
    put("model.norm.weight", head.final_norm)
    put("lm_head.weight", head.lm_head)
    weight_map, total = {}, 0
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(path, fname), metadata={"format": "pt"})
        for name, tensor in shard.items():
            weight_map[name] = fname
            total += tensor.numel() * tensor.element_size()
    with open(os.path.join(path, INDEX_FILE), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(d, f, indent=2)
    return weight_map


def _weight_map(path: str) -> Dict[str, str]:
    idx = os.path.join(path, INDEX_FILE)
    if os.path.exists(idx):
        with open(idx) as f:
            return json.load(f)["weight_map"]
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    out = {}
    for fname in files:
        with safe_open(os.path.join(path, fname), "pt") as f:
            out.update({k: fname for k in f.keys()})
    return out


def read_config(path: str) -> Glm5Config:
    with open(os.path.join(path, "config.json")) as f:
        return Glm5Config.from_dict(json.load(f))


def validate_checkpoint(path: str) -> Glm5Config:
    """Refuse (ValueError naming the field or tensor) a checkpoint that breaks the contract."""
    cfg = read_config(path)
    want = expected_tensors(cfg)
    have = _weight_map(path)
    missing = sorted(set(want) - set(have))
    extra = sorted(set(have) - set(want))
    if missing:
        raise ValueError(f"checkpoint lacks tensor(s): {', '.join(missing[:5])}"
                         + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""))
    if extra:
        raise ValueError(f"checkpoint has unexpected tensor(s): {', '.join(extra[:5])}")
    by_file: Dict[str, List[str]] = {}
    for name, fname in have.items():
        by_file.setdefault(fname, []).append(name)
    for fname, names in by_file.items():
        with safe_open(os.path.join(path, fname), "pt") as f:
            for name in names:
                sl = f.get_slice(name)
                shape, dtype = tuple(sl.get_shape()), sl.get_dtype()
                want_shape, want_dtype = want[name]
                if shape != want_shape:
                    raise ValueError(f"{name}: shape {list(shape)}, expected {list(want_shape)}")
                if dtype != _ST_DTYPES[want_dtype]:
                    raise ValueError(f"{name}: dtype {dtype}, expected {_ST_DTYPES[want_dtype]}")
    return cfg


_ST_DTYPES = {FP8: "F8_E4M3", BF16: "BF16", F32: "F32"}


def read_checkpoint(path: str, device="cpu") -> Tuple[Glm5Config, ModelWeights]:
    """Validate, then load the whole checkpoint as TP1 weights (MTP layer included if present)."""
    cfg = validate_checkpoint(path)
    t: Dict[str, torch.Tensor] = {}
    for fname in sorted(set(_weight_map(path).values())):
        with safe_open(os.path.join(path, fname), "pt", device=str(device)) as f:
            for k in f.keys():
                t[k] = f.get_tensor(k)
    w = ModelWeights(cfg, 1, 0)
    for i in range(cfg.num_hidden_layers):
        w.layers[i] = layer_from_tensors(cfg, t, i)
    w.embed, w.final_norm = t["model.embed_tokens.weight"], t["model.norm.weight"]
    w.lm_head = t["lm_head.weight"]
    if cfg.num_nextn_predict_layers:
        i = cfg.num_hidden_layers
        p = f"model.layers.{i}"
        w.mtp = MtpWeights(t[f"{p}.enorm.weight"], t[f"{p}.hnorm.weight"], t[f"{p}.eh_proj.weight"],
                           layer_from_tensors(cfg, t, i), t[f"{p}.shared_head.norm.weight"])
    return cfg, w
