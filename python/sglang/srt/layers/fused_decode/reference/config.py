"""GLM-5.3 model configuration for the reference, read from a Hugging Face config.json dict.

`Glm5Config.from_dict` takes the fields SGLang reads for `GlmMoeDsaForCausalLM` and refuses a
dict that lacks one or holds an inconsistent value, naming the field. `glm53_config()` gives
the real GLM-5.3 values; `tiny_config()` a CPU-sized model that keeps every structural feature
(dense and MoE layers, indexer and shared-top-k layers, an index top-k smaller than the test
contexts, partial FP8 blocks, block-128 shapes). `to_dict()` writes config.json back, with the
FP8 `quantization_config`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, Tuple

ARCHITECTURE = "GlmMoeDsaForCausalLM"
MODEL_TYPE = "glm_moe_dsa"
INDEX_PAGE_SIZE = 64  # tokens per page of the index cache and of the KV pool on CUDA


@dataclass(frozen=True)
class Glm5Config:
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    indexer_types: Tuple[str, ...]
    first_k_dense_replace: int
    intermediate_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    num_experts_per_tok: int
    n_shared_experts: int
    routed_scaling_factor: float
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    moe_layer_freq: int = 1
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    rope_interleave: bool = True
    indexer_rope_interleave: bool = True
    num_nextn_predict_layers: int = 1
    tie_word_embeddings: bool = False
    weight_block_size: Tuple[int, int] = (128, 128)
    pad_token_id: int = 0
    eos_token_id: Tuple[int, ...] = (0,)
    index_k_norm_eps: float = 1e-6
    extra: Dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    # ----- derived -----
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_cache_dim(self) -> int:
        """Width of one latent KV-cache row: normalized latent then rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        return self.qk_head_dim**-0.5

    def is_moe(self, layer_id: int) -> bool:
        if layer_id >= self.num_hidden_layers:  # the MTP layer is always MoE
            return True
        return layer_id >= self.first_k_dense_replace and layer_id % self.moe_layer_freq == 0

    def runs_indexer(self, layer_id: int) -> bool:
        """True for a 'full' layer (own indexer and index cache); False reuses the previous top-k."""
        if layer_id >= self.num_hidden_layers:
            return True
        return self.indexer_types[layer_id] == "full"

    @property
    def block(self) -> int:
        return self.weight_block_size[0]

    def check_tp(self, tp_size: int) -> None:
        """Refuse a TP size whose per-rank slices break heads or FP8 128-blocks."""
        b = self.block
        reasons = []
        if self.num_attention_heads % tp_size:
            reasons.append(f"num_attention_heads={self.num_attention_heads}")
        if (self.moe_intermediate_size // tp_size) % b or self.moe_intermediate_size % tp_size:
            reasons.append(f"moe_intermediate_size={self.moe_intermediate_size}")
        if (self.intermediate_size // tp_size) % b or self.intermediate_size % tp_size:
            reasons.append(f"intermediate_size={self.intermediate_size}")
        if self.vocab_size % tp_size:
            reasons.append(f"vocab_size={self.vocab_size}")
        if reasons:
            raise ValueError(f"tp_size={tp_size} does not split: {', '.join(reasons)}")

    # ----- config.json -----
    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Glm5Config":
        d = dict(d)
        if "text_config" in d:
            raise ValueError("config has text_config: that is GLM-5.3-Flash, not GLM-5.3")
        arch = d.get("architectures") or [ARCHITECTURE]
        if arch[0] not in (ARCHITECTURE, ARCHITECTURE + "NextN"):
            raise ValueError(f"architectures={arch}: expected {ARCHITECTURE}")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act={d['hidden_act']!r}: only silu is supported")
        if d.get("scoring_func", "sigmoid") != "sigmoid":
            raise ValueError(f"scoring_func={d['scoring_func']!r}: only sigmoid is supported")
        if d.get("topk_method", "noaux_tc") != "noaux_tc":
            raise ValueError(f"topk_method={d['topk_method']!r}: only noaux_tc is supported")
        if d.get("swiglu_limit") is not None:
            raise ValueError("swiglu_limit is set: GLM-5.3 has no SwiGLU clamp")
        required = [
            "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
            "v_head_dim", "index_n_heads", "index_head_dim", "index_topk",
            "first_k_dense_replace", "intermediate_size", "moe_intermediate_size",
            "n_routed_experts", "num_experts_per_tok", "n_shared_experts",
            "routed_scaling_factor", "rms_norm_eps", "max_position_embeddings",
        ]
        missing = [k for k in required if d.get(k) is None]
        if missing:
            raise ValueError(f"config.json lacks required field(s): {', '.join(missing)}")
        rope = d.get("rope_parameters") or d.get("rope_scaling") or {}
        theta = rope.get("rope_theta", d.get("rope_theta"))
        if theta is None:
            raise ValueError("config.json lacks required field: rope_parameters.rope_theta")
        if rope.get("rope_type", "default") not in ("default", None):
            raise ValueError(f"rope_type={rope.get('rope_type')!r}: only default rope is supported")
        n = int(d["num_hidden_layers"])
        types = d.get("indexer_types")
        if types is None:
            types = derive_indexer_types(
                n, d.get("index_topk_freq", 1), d.get("index_skip_topk_offset", 0)
            )
        types = tuple(types)
        if len(types) != n or any(t not in ("full", "shared") for t in types):
            raise ValueError(f"indexer_types={list(types)}: need {n} entries of 'full'/'shared'")
        if types and types[0] != "full":
            raise ValueError("indexer_types[0] must be 'full': layer 0 has no top-k to reuse")
        qc = d.get("quantization_config")
        block = (128, 128)
        if qc is not None:
            if qc.get("quant_method") != "fp8" or qc.get("activation_scheme") != "dynamic":
                raise ValueError(
                    f"quantization_config={qc}: expected quant_method fp8, activation_scheme dynamic"
                )
            block = tuple(qc.get("weight_block_size") or (128, 128))
            if block != (128, 128):
                raise ValueError(f"quantization_config.weight_block_size={list(block)}: need [128, 128]")
        eos = d.get("eos_token_id", 0)
        eos = tuple(eos) if isinstance(eos, (list, tuple)) else (eos,)
        known = {f.name for f in dataclasses.fields(cls)}
        cfg = cls(
            **{k: d[k] for k in required},
            indexer_types=types,
            rope_theta=float(theta),
            weight_block_size=block,
            eos_token_id=eos,
            **{
                k: d[k]
                for k in (
                    "moe_layer_freq", "n_group", "topk_group", "norm_topk_prob",
                    "rope_interleave", "indexer_rope_interleave",
                    "num_nextn_predict_layers", "tie_word_embeddings", "pad_token_id",
                )
                if d.get(k) is not None
            },
            extra={k: v for k, v in d.items() if k not in known},
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        b = self.block
        problems = []
        if self.n_group != 1 or self.topk_group != 1:
            problems.append(f"n_group={self.n_group}/topk_group={self.topk_group} (need 1/1)")
        if self.index_head_dim != 128:
            problems.append(f"index_head_dim={self.index_head_dim} (the index cache needs 128)")
        if self.qk_rope_head_dim % 2 or self.qk_rope_head_dim > self.index_head_dim:
            problems.append(f"qk_rope_head_dim={self.qk_rope_head_dim}")
        if not self.rope_interleave or not self.indexer_rope_interleave:
            problems.append("rope_interleave/indexer_rope_interleave must be true for GLM-5.3")
        for name in ("hidden_size", "q_lora_rank", "kv_lora_rank", "intermediate_size",
                     "moe_intermediate_size"):
            if getattr(self, name) % b:
                problems.append(f"{name}={getattr(self, name)} is not a multiple of {b}")
        if (self.num_attention_heads * self.v_head_dim) % b:
            problems.append("num_attention_heads * v_head_dim is not a multiple of the block")
        if self.num_experts_per_tok > self.n_routed_experts:
            problems.append("num_experts_per_tok > n_routed_experts")
        if self.tie_word_embeddings:
            problems.append("tie_word_embeddings=true (GLM-5.3 has an untied LM head)")
        if problems:
            raise ValueError("invalid GLM-5.3 config: " + "; ".join(problems))

    def to_dict(self, with_quantization: bool = True) -> Dict[str, Any]:
        freq, offset = self.extra.get("index_topk_freq"), self.extra.get("index_skip_topk_offset")
        d: Dict[str, Any] = {
            "architectures": [ARCHITECTURE],
            "model_type": MODEL_TYPE,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_attention_heads,
            "q_lora_rank": self.q_lora_rank,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim,
            "head_dim": self.qk_rope_head_dim,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "index_n_heads": self.index_n_heads,
            "index_head_dim": self.index_head_dim,
            "index_topk": self.index_topk,
            "indexer_types": list(self.indexer_types),
            "indexer_rope_interleave": self.indexer_rope_interleave,
            "index_share_for_mtp_iteration": True,
            "first_k_dense_replace": self.first_k_dense_replace,
            "mlp_layer_types": [
                "sparse" if self.is_moe(i) else "dense" for i in range(self.num_hidden_layers)
            ],
            "moe_layer_freq": self.moe_layer_freq,
            "intermediate_size": self.intermediate_size,
            "moe_intermediate_size": self.moe_intermediate_size,
            "n_routed_experts": self.n_routed_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "n_shared_experts": self.n_shared_experts,
            "n_group": self.n_group,
            "topk_group": self.topk_group,
            "norm_topk_prob": self.norm_topk_prob,
            "routed_scaling_factor": self.routed_scaling_factor,
            "scoring_func": "sigmoid",
            "topk_method": "noaux_tc",
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_interleave": self.rope_interleave,
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "max_position_embeddings": self.max_position_embeddings,
            "num_nextn_predict_layers": self.num_nextn_predict_layers,
            "tie_word_embeddings": self.tie_word_embeddings,
            "pad_token_id": self.pad_token_id,
            "eos_token_id": list(self.eos_token_id),
            "torch_dtype": "bfloat16",
            "dtype": "bfloat16",
        }
        if freq is not None:
            d["index_topk_freq"] = freq
            d["index_skip_topk_offset"] = offset
        if with_quantization:
            d["quantization_config"] = {
                "quant_method": "fp8",
                "fmt": "e4m3",
                "activation_scheme": "dynamic",
                "weight_block_size": list(self.weight_block_size),
                "modules_to_not_convert": bf16_modules(self),
            }
        return d


def derive_indexer_types(num_layers: int, freq: int, offset: int) -> Tuple[str, ...]:
    """'full' iff max(layer - offset + 1, 0) % freq == 0 (SGLang's rule without an explicit list)."""
    return tuple(
        "full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(num_layers)
    )


def bf16_modules(cfg: Glm5Config) -> list:
    """Linear modules the FP8 checkpoint keeps in bf16 (`modules_to_not_convert`)."""
    names = ["model.embed_tokens", "lm_head"]
    last = cfg.num_hidden_layers + cfg.num_nextn_predict_layers
    for i in range(last):
        p = f"model.layers.{i}"
        names.append(f"{p}.self_attn.kv_b_proj")
        if cfg.runs_indexer(i):
            names.append(f"{p}.self_attn.indexer.weights_proj")
        if cfg.is_moe(i):
            names.append(f"{p}.mlp.gate")
        if i >= cfg.num_hidden_layers:
            names.append(f"{p}.eh_proj")
    return names


def glm53_config() -> Glm5Config:
    """The real GLM-5.3 (zai-org/GLM-5.3) text config."""
    return Glm5Config.from_dict(glm53_config_dict())


def glm53_config_dict() -> Dict[str, Any]:
    n = 78
    d = {
        "architectures": [ARCHITECTURE], "model_type": MODEL_TYPE,
        "vocab_size": 154880, "hidden_size": 6144, "num_hidden_layers": n,
        "num_attention_heads": 64, "num_key_value_heads": 64,
        "q_lora_rank": 2048, "kv_lora_rank": 512,
        "qk_nope_head_dim": 192, "qk_rope_head_dim": 64, "v_head_dim": 256,
        "index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048,
        "index_topk_freq": 4, "index_skip_topk_offset": 3,
        "indexer_types": list(derive_indexer_types(n, 4, 3)),
        "first_k_dense_replace": 3, "intermediate_size": 12288,
        "moe_intermediate_size": 2048, "n_routed_experts": 256, "num_experts_per_tok": 8,
        "n_shared_experts": 1, "routed_scaling_factor": 2.5, "rms_norm_eps": 1e-5,
        "rope_parameters": {"rope_type": "default", "rope_theta": 8000000.0},
        "max_position_embeddings": 1048576, "num_nextn_predict_layers": 1,
        "pad_token_id": 154820, "eos_token_id": [154820, 154827, 154829],
        "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                                "activation_scheme": "dynamic", "weight_block_size": [128, 128]},
    }
    return d


def tiny_config_dict() -> Dict[str, Any]:
    n = 4
    d = glm53_config_dict()
    d.update({
        "vocab_size": 512, "hidden_size": 256, "num_hidden_layers": n,
        "num_attention_heads": 4, "num_key_value_heads": 4,
        "q_lora_rank": 256, "kv_lora_rank": 128,  # kv_a rows 192: a partial 128-block
        "index_n_heads": 4, "index_topk": 16,
        # layers: 0 dense+indexer, 1 MoE+indexer, 2 MoE reusing 1's top-k, 3 MoE+indexer
        "index_topk_freq": 2, "index_skip_topk_offset": 2,
        "indexer_types": list(derive_indexer_types(n, 2, 2)),
        "first_k_dense_replace": 1, "intermediate_size": 512, "moe_intermediate_size": 256,
        "n_routed_experts": 16, "num_experts_per_tok": 4,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "max_position_embeddings": 4096, "pad_token_id": 0, "eos_token_id": [1],
    })
    return d


def tiny_config() -> Glm5Config:
    return Glm5Config.from_dict(tiny_config_dict())


def config_with(cfg: Glm5Config, **changes: Any) -> Glm5Config:
    """A copy of `cfg` with fields changed (validated)."""
    out = dataclasses.replace(cfg, **changes)
    out.validate()
    return out


def per_rank(cfg: Glm5Config, tp_size: int) -> Dict[str, int]:
    """Sizes one TP rank holds (SGLang's default TP: heads, intermediates and vocab split)."""
    cfg.check_tp(tp_size)
    return {
        "heads": cfg.num_attention_heads // tp_size,
        "intermediate": cfg.intermediate_size // tp_size,
        "moe_intermediate": cfg.moe_intermediate_size // tp_size,
        "vocab": cfg.vocab_size // tp_size,
    }

